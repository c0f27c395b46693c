#!/usr/bin/python3
"""A Hugging Face LLaMA directory, written by hand, and its loss computed independently of dtrain.

Usage:
  /usr/bin/python3 tests/ref/hf_llama_check.py make DIR DTYPE SHARDS VALFILE T [--variant V] [--seed S]
  /usr/bin/python3 tests/ref/hf_llama_check.py compare LOSS_REF DTRAIN_OUTPUT_FILE TOL [TOKENS]
  /usr/bin/python3 tests/ref/hf_llama_check.py keys DIR

make: writes DIR as Hugging Face's LlamaForCausalLM save_pretrained would: config.json
  (model_type "llama", architectures ["LlamaForCausalLM"], the HF keys) and the weights in DTYPE
  (F32, F16 or BF16) under HF names, either in one model.safetensors (SHARDS = 1) or in SHARDS
  files model-0000k-of-0000n.safetensors with model.safetensors.index.json
  {"metadata": {"total_size": bytes}, "weight_map": {name: file}}. VALFILE gets T+1 random tokens as
  little-endian uint16 (dtrain's data.format=raw16: one sample, inputs tokens[0:T], targets
  tokens[1:T+1]). Variants:
    gqa   2 layers, hidden 48, 4 heads, 2 kv heads, intermediate 80, vocab 300, untied lm_head
    mqa   the same with 1 kv head and tie_word_embeddings true (no lm_head.weight)
  both with max_position_embeddings 64, rope_theta 500, rms_norm_eps 1e-5;
    llama3  gqa's shapes with max_position_embeddings 128 and rope_scaling {"rope_type": "llama3",
          "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32} (head size 12, theta 500: one frequency kept,
          one smoothed, four divided by 8), for T beyond 32
    yarn    the same with rope_scaling {"type": "yarn", "factor": 4.0,
          "original_max_position_embeddings": 32} (the older key; cos and sin x 1.139).
  The weights are drawn large enough (embeddings std 1 (0.5 when tied), attention matrices
  2/sqrt(fan_in), the others 1/sqrt(fan_in), lm_head 0.5/sqrt(fan_in), RMSNorm weights
  1 + N(0, 0.2)) that the loss depends on every part of the model, then rounded to DTYPE
  (F16: numpy round-to-nearest-even; BF16: the top 16 bits of the float32, round-to-nearest-even,
  computed twice, by torch and by integer arithmetic, and required to agree). The reference loss
  is the mean cross-entropy of tests/ref/llama_torch.py (written from the published architecture,
  not from dtrain) in float64 on the stored values widened exactly. It prints, one per line:
    loss <reference>
    loss_kv_mod <the same with query head h reading kv head h % NKV instead of h // (NH/NKV)>
    loss_rope_interleaved <the same with RoPE pairs (2i, 2i+1) instead of (i, i + hs/2)>
  loss_no_scaling <with rope_scaling: the same with plain RoPE (the scaling ignored)>
  The last ones are deliberately wrong models: the shell test requires that they are NOT within
  the tolerance of dtrain's loss (for the mqa variant, NKV = 1, the kv-head map cannot differ,
  so loss_kv_mod equals loss and is printed only for completeness).

compare: DTRAIN_OUTPUT_FILE holds `dtrain eval`'s output (its val_loss column; with TOKENS, the
  tokens column must equal it) or `dtrain train`'s (the loss of "step 1/N", computed before the
  first update, i.e. on the imported weights). Exit 0 when |X - LOSS_REF| / |LOSS_REF| <= TOL,
  else 1; prints dtrain's loss, the reference and the relative error either way.

keys: prints the dtrain arguments "--set model.KEY=VALUE" matching DIR's config.json, one word a
  line (for bash mapfile).
"""
import json
import math
import os
import re
import struct
import sys

sys.dont_write_bytecode = True      # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np                  # noqa: E402

# torch and llama_torch are imported by `make` only: `compare` and `keys` stay fast.

VARIANTS = {
    "gqa": dict(n_layer=2, d_model=48, n_head=4, n_kv_head=2, d_ff=80, vocab=300, context=64,
                untied=True, rope_theta=500.0, norm_eps=1e-5),
    "mqa": dict(n_layer=2, d_model=48, n_head=4, n_kv_head=1, d_ff=80, vocab=300, context=64,
                untied=False, rope_theta=500.0, norm_eps=1e-5),
    "llama3": dict(n_layer=2, d_model=48, n_head=4, n_kv_head=2, d_ff=80, vocab=300, context=128,
                   untied=True, rope_theta=500.0, norm_eps=1e-5,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "yarn": dict(n_layer=2, d_model=48, n_head=4, n_kv_head=2, d_ff=80, vocab=300, context=128,
                 untied=True, rope_theta=500.0, norm_eps=1e-5,
                 rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
}
ST_DTYPES = ("F32", "F16", "BF16")
TORCH_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def die(msg):
    print("hf_llama_check: " + msg, file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------- weights
def hf_names_shapes(hp):
    C, F, V = hp["d_model"], hp["d_ff"], hp["vocab"]
    hs = C // hp["n_head"]
    kvd = hp["n_kv_head"] * hs
    out = [("model.embed_tokens.weight", (V, C))]
    for li in range(hp["n_layer"]):
        p = "model.layers.%d." % li
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (hp["n_head"] * hs, C)),
                (p + "self_attn.k_proj.weight", (kvd, C)),
                (p + "self_attn.v_proj.weight", (kvd, C)),
                (p + "self_attn.o_proj.weight", (C, hp["n_head"] * hs)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F, C)),
                (p + "mlp.up_proj.weight", (F, C)),
                (p + "mlp.down_proj.weight", (C, F))]
    out.append(("model.norm.weight", (C,)))
    if hp["untied"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def random_weights(hp, seed):
    g = np.random.default_rng(seed)
    W = {}
    for name, shape in hf_names_shapes(hp):
        if len(shape) == 1:
            W[name] = 1.0 + 0.2 * g.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            W[name] = g.standard_normal(shape)
        elif "self_attn" in name:
            # sharp attention that moves the residual stream: the kv-head map and the RoPE
            # pairing change the loss by ~1e-2 (see the module docstring)
            W[name] = 2.0 * g.standard_normal(shape) / math.sqrt(shape[1])
        else:
            W[name] = g.standard_normal(shape) / math.sqrt(shape[1])
        if name == "lm_head.weight" or (not hp["untied"] and name == "model.embed_tokens.weight"):
            W[name] = W[name] * 0.5      # logits of a few units: a loss that is not log(V)
        W[name] = W[name].astype(np.float32)
    return W


def bf16_bits(a32):
    """float32 array -> uint16 bfloat16 bits, round-to-nearest-even, by torch and by integer
    arithmetic (the two must agree; the values are finite)."""
    import torch
    t = torch.from_numpy(np.ascontiguousarray(a32)).to(torch.bfloat16).view(torch.int16)
    via_torch = t.numpy().view(np.uint16)
    u = np.ascontiguousarray(a32).view(np.uint32).astype(np.uint64)
    via_int = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    if not np.array_equal(via_torch, via_int):
        die("bfloat16 rounding: torch and integer RNE disagree")
    return via_int


def encode(a32, dtype):
    """float32 array -> (raw little-endian bytes in DTYPE, the stored values widened to float64)."""
    if dtype == "F32":
        s = a32.astype("<f4")
        return s.tobytes(), s.astype(np.float64)
    if dtype == "F16":
        s = a32.astype("<f2")
        if not np.all(np.isfinite(s)):
            die("a weight overflows float16")
        return s.tobytes(), s.astype(np.float64)
    bits = bf16_bits(a32).astype("<u2")
    wide = (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.tobytes(), wide.astype(np.float64)


def write_st(path, entries, metadata=None):
    """entries: list of (name, dtype string, shape, raw bytes)."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for e in entries:
            f.write(e[3])
    return off


def hf_config(hp, dtype):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hp["d_model"],
        "intermediate_size": hp["d_ff"],
        "num_hidden_layers": hp["n_layer"],
        "num_attention_heads": hp["n_head"],
        "num_key_value_heads": hp["n_kv_head"],
        "vocab_size": hp["vocab"],
        "max_position_embeddings": hp["context"],
        "rms_norm_eps": hp["norm_eps"],
        "rope_theta": hp["rope_theta"],
        "tie_word_embeddings": hp["untied"] is False,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "rope_scaling": hp.get("rope_scaling"),
        "use_cache": True,
        "torch_dtype": TORCH_DTYPE[dtype],
        "transformers_version": "4.40.0",
    }


def write_dir(d, hp, W, dtype, shards):
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(d, f))
    stored, entries = {}, []
    for name, shape in hf_names_shapes(hp):
        raw, wide = encode(W[name], dtype)
        stored[name] = wide.reshape(shape)
        entries.append((name, dtype, shape, raw))
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), entries, {"format": "pt"})
    else:
        # contiguous runs in HF's order, as save_pretrained's size-based splitting does
        per = -(-len(entries) // shards)
        weight_map, total = {}, 0
        for k in range(shards):
            fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
            part = entries[k * per:(k + 1) * per]
            if not part:
                die("%d shards for %d tensors" % (shards, len(entries)))
            total += write_st(os.path.join(d, fn), part, {"format": "pt"})
            for e in part:
                weight_map[e[0]] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(hf_config(hp, dtype), f, indent=2)
    return stored


# ----------------------------------------------------------------------------- reference loss
def ref_loss(hp, stored, tokens, wrong=None):
    """Mean cross-entropy in float64 of llama_torch.Llama on tokens[0:T] -> tokens[1:T+1].
    wrong: None, "kv_mod" (query head h reads kv head h % NKV) or "rope_interleaved" (pairs
    (2i, 2i+1)), each swapped into llama_torch for this call only, or "no_scaling" (plain RoPE
    although the config has rope_scaling)."""
    import torch
    import llama_torch
    model = llama_torch.Llama(hp["n_layer"], hp["d_model"], hp["n_head"], hp["n_kv_head"],
                              hp["d_ff"], hp["vocab"], hp["context"], hp["untied"],
                              hp["rope_theta"], hp["norm_eps"],
                              None if wrong == "no_scaling" else hp.get("rope_scaling")).double()
    sd = {k: torch.from_numpy(v) for k, v in stored.items()}
    model.load_state_dict(sd, strict=True)
    saved = (llama_torch.repeat_kv, llama_torch.rope_cos_sin, llama_torch.rotate_half)
    if wrong == "kv_mod":
        # output head h = input head h % nkv (torch.repeat tiles the kv heads)
        llama_torch.repeat_kv = lambda x, n_rep: x.repeat(1, n_rep, 1, 1)
    elif wrong == "rope_interleaved":
        def cos_sin(T, hs, theta, dtype, device=None, scaling=None):
            c, s = saved[1](T, hs, theta, dtype, device, scaling)      # halves duplicated
            h = hs // 2
            return (c[:, :h].repeat_interleave(2, dim=-1), s[:, :h].repeat_interleave(2, dim=-1))

        def rot(x):                                             # (x0, x1) -> (-x1, x0) per pair
            p = x.reshape(*x.shape[:-1], -1, 2)
            return torch.stack((-p[..., 1], p[..., 0]), dim=-1).reshape(x.shape)
        llama_torch.rope_cos_sin, llama_torch.rotate_half = cos_sin, rot
    elif wrong not in (None, "no_scaling"):
        die("unknown wrong model %r" % wrong)
    try:
        idx = torch.from_numpy(tokens[:-1].astype(np.int64))[None]
        tgt = torch.from_numpy(tokens[1:].astype(np.int64))[None]
        with torch.no_grad():
            _, loss = model(idx, tgt)
    finally:
        llama_torch.repeat_kv, llama_torch.rope_cos_sin, llama_torch.rotate_half = saved
    return float(loss)


def cmd_make(args):
    variant, seed = "gqa", 1
    rest = []
    i = 0
    while i < len(args):
        if args[i] == "--variant":
            variant = args[i + 1]
            i += 2
        elif args[i] == "--seed":
            seed = int(args[i + 1])
            i += 2
        else:
            rest.append(args[i])
            i += 1
    if len(rest) != 5:
        die("usage: make DIR DTYPE SHARDS VALFILE T [--variant gqa|mqa|llama3|yarn] [--seed S]")
    d, dtype, shards, valfile, T = rest[0], rest[1], int(rest[2]), rest[3], int(rest[4])
    if dtype not in ST_DTYPES:
        die("DTYPE must be one of %s" % ", ".join(ST_DTYPES))
    if variant not in VARIANTS:
        die("variant must be one of %s" % ", ".join(VARIANTS))
    hp = VARIANTS[variant]
    if not 1 <= T <= hp["context"]:
        die("T must be in 1..%d" % hp["context"])
    W = random_weights(hp, seed)
    stored = write_dir(d, hp, W, dtype, shards)
    tokens = np.random.default_rng(seed + 1000).integers(0, hp["vocab"], T + 1).astype("<u2")
    with open(valfile, "wb") as f:
        f.write(tokens.tobytes())
    print("loss %.10f" % ref_loss(hp, stored, tokens))
    print("loss_kv_mod %.10f" % ref_loss(hp, stored, tokens, "kv_mod"))
    print("loss_rope_interleaved %.10f" % ref_loss(hp, stored, tokens, "rope_interleaved"))
    if hp.get("rope_scaling"):
        print("loss_no_scaling %.10f" % ref_loss(hp, stored, tokens, "no_scaling"))


def dtrain_loss(path):
    """(loss, tokens) from dtrain's output in PATH: `dtrain eval`'s table (a "#" header line with
    the columns tokens and val_loss, then one row), else the first training line
    "step 1/N | loss X" (tokens None): the loss of step 1 is computed on the initial weights."""
    lines = open(path).read().splitlines()
    for i, line in enumerate(lines):
        cols = line.lstrip("#").split()
        if line.startswith("#") and "val_loss" in cols and "tokens" in cols and i + 1 < len(lines):
            row = lines[i + 1].split()
            if len(row) == len(cols):
                return float(row[cols.index("val_loss")]), int(float(row[cols.index("tokens")]))
    for line in lines:
        m = re.search(r"\bstep 1/\d+ \| loss ([-+0-9.eE]+)", line)
        if m:
            return float(m.group(1)), None
    die("%s: neither an eval table nor a 'step 1/N | loss X' line in dtrain's output:\n%s"
        % (path, "\n".join(lines[-5:])))


def cmd_compare(args):
    if len(args) not in (3, 4):
        die("usage: compare LOSS_REF DTRAIN_OUTPUT_FILE TOL [TOKENS]")
    ref, tol = float(args[0]), float(args[2])
    got, tokens = dtrain_loss(args[1])
    if len(args) == 4 and tokens is not None and tokens != int(args[3]):
        print("dtrain evaluated %d tokens, wanted %s" % (tokens, args[3]))
        sys.exit(1)
    rel = abs(got - ref) / abs(ref)
    print("dtrain %.9g ref %.10f rel %.2e %s %.0e" % (got, ref, rel, "<=" if rel <= tol else ">",
                                                      tol))
    sys.exit(0 if rel <= tol else 1)


def cmd_keys(args):
    cfg = json.load(open(os.path.join(args[0], "config.json")))
    for k, v in (("n_layer", cfg["num_hidden_layers"]), ("d_model", cfg["hidden_size"]),
                 ("n_head", cfg["num_attention_heads"]),
                 ("n_kv_head", cfg["num_key_value_heads"]), ("d_ff", cfg["intermediate_size"]),
                 ("vocab_size", cfg["vocab_size"]),
                 ("context", cfg["max_position_embeddings"]),
                 ("untied_embeddings", "false" if cfg["tie_word_embeddings"] else "true"),
                 ("rope_theta", cfg["rope_theta"]), ("norm_eps", cfg["rms_norm_eps"])):
        print("--set\nmodel.%s=%s" % (k, v))
    rs = cfg.get("rope_scaling")
    if rs:
        rule = rs.get("rope_type", rs.get("type"))
        print("--set\nmodel.rope_scaling=%s" % rule)
        for hf, key in (("factor", "rope_factor"), ("low_freq_factor", "rope_low_freq_factor"),
                        ("high_freq_factor", "rope_high_freq_factor"),
                        ("original_max_position_embeddings", "rope_original_context"),
                        ("beta_fast", "rope_beta_fast"), ("beta_slow", "rope_beta_slow"),
                        ("attention_factor", "rope_attention_factor")):
            if rs.get(hf) is not None:
                print("--set\nmodel.%s=%s" % (key, rs[hf]))
        if rule == "yarn" and "original_max_position_embeddings" not in rs:
            print("--set\nmodel.rope_original_context=%s" % cfg["max_position_embeddings"])


def main():
    if len(sys.argv) < 2:
        die("usage: make ... | compare ... | keys DIR (see the docstring)")
    cmd = {"make": cmd_make, "compare": cmd_compare, "keys": cmd_keys}.get(sys.argv[1])
    if cmd is None:
        die("unknown subcommand %r" % sys.argv[1])
    cmd(sys.argv[2:])


if __name__ == "__main__":
    main()
