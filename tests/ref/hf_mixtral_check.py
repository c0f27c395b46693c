#!/usr/bin/python3
"""Hugging Face Mixtral directories written by hand, and dtrain's results on them against a float64
PyTorch Mixtral (tests/ref/mixtral_torch.py, written from the published architecture).

Usage:
  /usr/bin/python3 tests/ref/hf_mixtral_check.py make DIR SHARDS VALFILE T [--seed S]
  /usr/bin/python3 tests/ref/hf_mixtral_check.py check DIR VALFILE DUMP TOL
  /usr/bin/python3 tests/ref/hf_mixtral_check.py loss DIR VALFILE

make: writes DIR as MixtralForCausalLM's save_pretrained would: config.json (model_type "mixtral",
  architectures ["MixtralForCausalLM"], num_local_experts 4, num_experts_per_tok 2, hidden 48,
  4 heads, 2 kv heads, intermediate 40, 2 layers, vocab 300, untied) and F32 weights under HF
  names (model.layers.N.block_sparse_moe.gate.weight, ...experts.E.w1/w2/w3.weight), in one
  model.safetensors (SHARDS = 1) or SHARDS files with model.safetensors.index.json. The weights
  are drawn large enough (router rows 3/sqrt(fan_in): routing decided by clear margins on most
  tokens, not all) that the loss depends on every part. VALFILE gets T+1 random uint16 tokens.
  Prints "loss <the float64 reference>".
check: DUMP is tests/moe_dump's output on DIR and VALFILE. With capacity factor 1.0 its loss must be
  within TOL of the reference's with that capacity, and its dropped count equal (and > 0). Passes when dtrain's loss and every
  logit are within TOL (relative; the logits: max |diff| / max |ref|) of the reference, and every
  layer's expert choices equal the reference's on each token whose top-k margin (the k-th largest
  router probability minus the (k+1)-th, in the reference) is at least 1e-6; tokens below that
  margin are counted, reported and excluded. Non-finite values fail.
loss: the reference loss of DIR (any Mixtral directory, e.g. dtrain's export) on VALFILE.
"""
import json
import math
import os
import struct
import sys

sys.dont_write_bytecode = True      # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np                  # noqa: E402
import torch                        # noqa: E402

import mixtral_torch                # noqa: E402
from hf_llama_check import write_st  # noqa: E402

MARGIN = 1e-6
HP = dict(n_layer=2, d_model=48, n_head=4, n_kv_head=2, n_experts=4, topk=2, d_ff=40, vocab=300,
          context=64, untied=True, rope_theta=500.0, norm_eps=1e-5)


def die(msg):
    print("hf_mixtral_check: " + msg, file=sys.stderr)
    sys.exit(1)


def names_shapes(hp):
    C, F, V, E = hp["d_model"], hp["d_ff"], hp["vocab"], hp["n_experts"]
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
                (p + "block_sparse_moe.gate.weight", (E, C))]
        for e in range(E):
            q = p + "block_sparse_moe.experts.%d." % e
            out += [(q + "w1.weight", (F, C)), (q + "w2.weight", (C, F)), (q + "w3.weight", (F, C))]
    out.append(("model.norm.weight", (C,)))
    if hp["untied"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def config(hp):
    return {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": hp["d_model"], "intermediate_size": hp["d_ff"],
        "num_hidden_layers": hp["n_layer"], "num_attention_heads": hp["n_head"],
        "num_key_value_heads": hp["n_kv_head"], "num_local_experts": hp["n_experts"],
        "num_experts_per_tok": hp["topk"], "vocab_size": hp["vocab"],
        "max_position_embeddings": hp["context"], "rms_norm_eps": hp["norm_eps"],
        "rope_theta": hp["rope_theta"], "sliding_window": None,
        "tie_word_embeddings": not hp["untied"], "hidden_act": "silu",
        "router_aux_loss_coef": 0.02, "output_router_logits": False, "router_jitter_noise": 0.0,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
        "transformers_version": "4.40.0",
    }


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": "<f4", "I32": "<i4"}[h["dtype"]]
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=dt).reshape(h["shape"])
    return out


def read_dir(d):
    """(hp, {name: float64 array}) of a Mixtral directory (F32 tensors)."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    hp = dict(n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"],
              n_head=cfg["num_attention_heads"], n_kv_head=cfg["num_key_value_heads"],
              n_experts=cfg["num_local_experts"], topk=cfg["num_experts_per_tok"],
              d_ff=cfg["intermediate_size"], vocab=cfg["vocab_size"],
              context=cfg["max_position_embeddings"], untied=not cfg["tie_word_embeddings"],
              rope_theta=cfg["rope_theta"], norm_eps=cfg["rms_norm_eps"])
    files = ["model.safetensors"]
    if not os.path.exists(os.path.join(d, files[0])):
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        files = sorted(set(idx["weight_map"].values()))
    W = {}
    for fn in files:
        W.update(read_st(os.path.join(d, fn)))
    return hp, {k: v.astype(np.float64) for k, v in W.items()}


def model_of(hp, W):
    m = mixtral_torch.Mixtral(hp["n_layer"], hp["d_model"], hp["n_head"], hp["n_kv_head"],
                              hp["n_experts"], hp["topk"], hp["d_ff"], hp["vocab"], hp["context"],
                              hp["untied"], hp["rope_theta"], hp["norm_eps"]).double()
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in W.items()}, strict=True)
    return m


def reference(hp, W, tokens):
    """logits (T, V), loss, and per layer the router probabilities (T, E)."""
    m = model_of(hp, W)
    idx = torch.from_numpy(tokens[:-1].astype(np.int64))[None]
    tgt = torch.from_numpy(tokens[1:].astype(np.int64))[None]
    with torch.no_grad():
        logits, loss = m(idx, tgt)
        probs = [torch.softmax(x, dim=-1).numpy() for x in m.router_logits()]
    return logits[0].numpy(), float(loss), probs


def tokens_of(valfile):
    return np.fromfile(valfile, dtype="<u2").astype(np.int64)


def cmd_make(args):
    seed = 1
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        args = args[:i] + args[i + 2:]
    if len(args) != 4:
        die("usage: make DIR SHARDS VALFILE T [--seed S]")
    d, shards, valfile, T = args[0], int(args[1]), args[2], int(args[3])
    hp = HP
    g = np.random.default_rng(seed)
    os.makedirs(d, exist_ok=True)
    W, entries = {}, []
    for name, shape in names_shapes(hp):
        if len(shape) == 1:
            a = 1.0 + 0.2 * g.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            a = g.standard_normal(shape)
        elif name == "lm_head.weight":
            a = 0.5 * g.standard_normal(shape) / math.sqrt(shape[1])
        elif "gate.weight" in name:
            a = 3.0 * g.standard_normal(shape) / math.sqrt(shape[1])
        else:
            a = g.standard_normal(shape) / math.sqrt(shape[1])
        a = a.astype(np.float32)
        W[name] = a.astype(np.float64)
        entries.append((name, "F32", shape, a.astype("<f4").tobytes()))
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), entries, {"format": "pt"})
    else:
        per = -(-len(entries) // shards)
        weight_map, total = {}, 0
        for k in range(shards):
            fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
            part = entries[k * per:(k + 1) * per]
            total += write_st(os.path.join(d, fn), part, {"format": "pt"})
            for e in part:
                weight_map[e[0]] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config(hp), f, indent=2)
    tokens = np.random.default_rng(seed + 1000).integers(0, hp["vocab"], T + 1).astype("<u2")
    tokens.tofile(valfile)
    print("loss %.10f" % reference(hp, W, tokens.astype(np.int64))[1])


def cmd_check(args):
    if len(args) != 4:
        die("usage: check DIR VALFILE DUMP TOL")
    hp, W = read_dir(args[0])
    tokens = tokens_of(args[1])
    got = read_st(args[2])
    tol = float(args[3])
    logits, loss, probs = reference(hp, W, tokens)
    T, k = len(tokens) - 1, hp["topk"]
    bad = []
    gl, gloss, gch = got["logits"].astype(np.float64), float(got["loss"][0]), got["choices"]
    if gl.shape != logits.shape or gch.shape != (hp["n_layer"], T, k):
        die("dump shapes %s %s, expected %s %s" % (gl.shape, gch.shape, logits.shape,
                                                   (hp["n_layer"], T, k)))
    if not (np.all(np.isfinite(gl)) and math.isfinite(gloss)):
        bad.append("non-finite logits or loss")
    lrel = float(np.max(np.abs(gl - logits)) / np.max(np.abs(logits)))
    rel = abs(gloss - loss) / abs(loss)
    if not lrel <= tol:
        bad.append("logits rel %.2e > %g" % (lrel, tol))
    if not rel <= tol:
        bad.append("loss %.9g vs %.10f rel %.2e > %g" % (gloss, loss, rel, tol))
    excluded = compared = 0
    for li, p in enumerate(probs):
        order = np.argsort(-p, axis=-1, kind="stable")
        srt = np.take_along_axis(p, order, axis=-1)
        for t in range(T):
            if srt[t, k - 1] - srt[t, k] < MARGIN:
                excluded += 1
                continue
            compared += 1
            if list(gch[li, t]) != list(order[t, :k]):
                bad.append("layer %d token %d: experts %s, reference %s" % (li, t, list(gch[li, t]),
                                                                           list(order[t, :k])))
    # capacity factor 1.0: the loss and the dropped count
    m = model_of(hp, W)
    for layer in m.model.layers:
        layer.block_sparse_moe.capacity_factor = 1.0
    with torch.no_grad():
        _, closs = m(torch.from_numpy(tokens[:-1])[None], torch.from_numpy(tokens[1:])[None])
    cdrop = sum(layer.block_sparse_moe.dropped for layer in m.model.layers)
    gcl, gcd = float(got["cap1_loss"][0]), int(got["cap1_dropped"][0])
    crel = abs(gcl - float(closs)) / abs(float(closs))
    if not crel <= tol:
        bad.append("capacity 1.0: loss %.9g vs %.10f rel %.2e" % (gcl, float(closs), crel))
    if gcd != cdrop or cdrop == 0:
        bad.append("capacity 1.0: %d choices dropped, reference %d (must be > 0)" % (gcd, cdrop))
    print("loss %.9g ref %.10f rel %.2e, logits rel %.2e, expert choices equal on %d (layer, token)s, "
          "%d with a top-%d margin < %g excluded; capacity 1.0: loss rel %.2e, %d dropped = reference"
          % (gloss, loss, rel, lrel, compared, excluded, k, MARGIN, crel, gcd))
    if compared == 0:
        bad.append("no expert choice compared")
    if bad:
        print("FAIL " + "; ".join(bad[:5]))
        sys.exit(1)


def cmd_loss(args):
    if len(args) != 2:
        die("usage: loss DIR VALFILE")
    hp, W = read_dir(args[0])
    print("loss %.10f" % reference(hp, W, tokens_of(args[1]))[1])


def main():
    cmd = {"make": cmd_make, "check": cmd_check, "loss": cmd_loss}.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if not cmd:
        die("usage: make | check | loss (see the docstring)")
    cmd(sys.argv[2:])


if __name__ == "__main__":
    main()
