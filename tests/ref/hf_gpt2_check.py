#!/usr/bin/python3
"""Checks a Hugging Face GPT-2 export of dtrain (dtrain ckpt export --hf) without transformers.

Usage: /usr/bin/python3 tests/ref/hf_gpt2_check.py HF_DIR REF.safetensors [--tol 1e-4]

HF_DIR holds model.safetensors and config.json as written by the export; REF.safetensors is
tests/interop_dump's "inputs" (B,T) and dtrain's "logits" (B,T,V) of the same model.

The script checks what transformers' GPT2LMHeadModel relies on when it loads the directory:
  - config.json: model_type gpt2, architectures [GPT2LMHeadModel], the shape keys, gelu_new,
    layer_norm_epsilon 1e-5, tied embeddings, float32;
  - model.safetensors: metadata format "pt"; exactly HF's tensor names (no "transformer."
    prefix, no lm_head: it is tied), all F32, Conv1D weights stored (in, out);
then runs GPT-2 forward in float64 the way HF's modeling_gpt2 does (Conv1D: y = x @ W + b,
tanh GELU, causal attention, logits = ln_f(x) @ wte^T) and requires
max|logits - dtrain| / max|dtrain| <= tol. To show that the comparison can fail, it also
runs the forward with one square Conv1D weight transposed and requires that to miss by far.
Exit status 0 when everything passes, 1 otherwise (the failing check is printed).
"""
import json
import math
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np                       # noqa: E402
import torch                             # noqa: E402
import torch.nn.functional as F          # noqa: E402

from gpt2_ref import read_safetensors    # noqa: E402


class CheckError(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckError(msg)


def hf_names_shapes(L, C, V, T):
    """HF GPT-2's parameter names (GPT2Model state dict, as in the gpt2 repository's
    model.safetensors) and shapes; Conv1D weights are (in, out)."""
    out = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(L):
        p = "h.%d." % l
        out.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        })
    return out


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def hf_forward(W, cfg, ids):
    """GPT-2 forward in HF's convention, float64. ids: (B, T) int64 -> logits (B, T, V)."""
    C, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    B, T = ids.shape
    hs = C // nh

    def conv1d(x, name):
        return x @ W[name + ".weight"] + W[name + ".bias"]

    def ln(x, name):
        return F.layer_norm(x, (C,), W[name + ".weight"], W[name + ".bias"], eps)

    x = W["wte.weight"][ids] + W["wpe.weight"][torch.arange(T)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["n_layer"]):
        p = "h.%d." % l
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, p + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(x, "ln_f") @ W["wte.weight"].T


def rel_error(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def check(hf_dir, ref_path, tol):
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": True, "torch_dtype": "float32"}
    for k, v in want.items():
        expect(cfg.get(k) == v, "config.json: %s = %r, expected %r" % (k, cfg.get(k), v))
    for k in ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head"):
        expect(isinstance(cfg.get(k), int) and cfg[k] > 0, "config.json: %s missing" % k)
    expect(cfg["n_ctx"] == cfg["n_positions"], "config.json: n_ctx != n_positions")
    expect("bos_token_id" in cfg and "eos_token_id" in cfg, "config.json: no bos/eos token ids")

    meta, W = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    expect(meta.get("format") == "pt", "model.safetensors: metadata format = %r, transformers "
           "needs 'pt'" % meta.get("format"))
    L, C, V, T = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    shapes = hf_names_shapes(L, C, V, T)
    missing = sorted(set(shapes) - set(W))
    extra = sorted(set(W) - set(shapes))
    expect(not missing, "model.safetensors: missing %s" % missing)
    expect(not extra, "model.safetensors: unexpected %s" % extra)
    for n, s in shapes.items():
        expect(W[n].dtype == np.float32, "%s: dtype %s, expected float32" % (n, W[n].dtype))
        expect(tuple(W[n].shape) == s, "%s: shape %s, expected %s" % (n, W[n].shape, s))
    print("ok   config.json and %d tensors with HF names, shapes and dtype" % len(shapes))

    _, ref = read_safetensors(ref_path)
    ids = torch.from_numpy(ref["inputs"].astype(np.int64))
    Wt = {n: torch.from_numpy(a.astype(np.float64)) for n, a in W.items()}
    logits = hf_forward(Wt, cfg, ids).numpy()
    err = rel_error(logits, ref["logits"].astype(np.float64))
    print("%s logits vs dtrain: rel error %.3e (tol %.0e)" % ("ok  " if err <= tol else "FAIL",
                                                               err, tol))
    expect(err <= tol, "logits differ from dtrain's")

    Wt["h.0.attn.c_proj.weight"] = Wt["h.0.attn.c_proj.weight"].T.contiguous()
    bad = rel_error(hf_forward(Wt, cfg, ids).numpy(), ref["logits"].astype(np.float64))
    print("ok   sensitivity: one Conv1D weight left untransposed gives rel error %.3e" % bad)
    expect(bad > 100 * tol, "a transposed weight was not detected (rel error %.3e)" % bad)


def main():
    args = sys.argv[1:]
    tol = 1e-4
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        check(args[0], args[1], tol)
    except CheckError as e:
        print("FAIL %s" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
