"""LoRA oracle: dtrain's LoRA loss and adapter gradients against PyTorch in float64.

Usage: /usr/bin/python3 tests/ref/lora_ref.py DIR [DIR ...]   (each written by tests/lora_dump)
       /usr/bin/python3 tests/ref/lora_ref.py --self-test DIR  (a wrong adapter gradient must fail)

The model is the family's PyTorch definition (llama_torch.py, gpt2_torch.py: the same modules the
parity oracle uses) with its base weights loaded and frozen (requires_grad False), and LoRA added
as the paper defines it (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
eq. 3 and section 4.1): for an adapted projection with frozen W0 (out x in),
    h = W0 x + (alpha / r) B A x,   A: (r x in), B: (out x r),
applied to the projection's output rows. LLaMA's q_proj, k_proj, v_proj, o_proj, gate_proj,
up_proj, down_proj are separate nn.Linear modules, so each target adapts one whole module. GPT-2's
c_attn computes q | k | v as one (3C x C) matrix; the targets q, k, v adapt its row blocks
[0, C), [C, 2C), [2C, 3C) (an adapter per block, added to that block of c_attn's output); o is
attn.c_proj, up mlp.c_fc, down mlp.c_proj. Dropout: none (the oracle runs
lora.dropout 0; the dropout path is checked against a float64 reference in tests/test_lora.c).

Checked in float64 against dtrain's float32: the loss to 1e-5 relative, and every adapter
gradient (lora_A and lora_B of every layer and target) to 1e-4 relative error (max |diff| /
max |reference| over the tensor) - the tolerance the fp32 parity oracle uses for gradients -
and element by element, |g_i - ref_i| <= 1e-4 |ref_i| + 1e-5 max |ref| (the normwise measure
alone passes one small element wholly wrong). A NaN or Inf anywhere fails (compare(), with
tests/ref/tensor_check.py; tests/test_helpers.sh checks it on NaN, Inf and a bad element).
Also checked: the base weights get no gradient in PyTorch either (requires_grad False), and the
adapter set dtrain wrote is exactly the targets' (names and shapes).
"""
import math
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import gpt2_torch  # noqa: E402
import llama_torch  # noqa: E402
from gpt2_ref import read_safetensors  # noqa: E402
from tensor_check import errors, scalar_rel  # noqa: E402

LOSS_TOL = 1e-5
GRAD_TOL = 1e-4
# The elementwise floor, a fraction of the tensor's largest: fp32 gradient elements carry the
# rounding of sums whose terms are the size of the tensor's largest, not of the element, so
# elements near zero keep errors of that size (normwise measured up to 3e-6 over the four
# cases; the worst element then reached 0.14 of this bound).
GRAD_ATOL = 1e-5


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus adapters, each on output rows [row0, row0 + rows)."""

    def __init__(self, base, scale):
        super().__init__()
        self.base = base
        self.scale = scale
        self.blocks = []  # (row0, rows, A, B)

    def add(self, row0, rows, A, B):
        self.blocks.append((row0, rows, A, B))

    def forward(self, x):
        y = self.base(x)
        parts = []
        col = 0
        for row0, rows, A, B in sorted(self.blocks, key=lambda b: b[0]):
            if row0 > col:
                parts.append(y[..., col:row0])
            parts.append(y[..., row0:row0 + rows] + self.scale * ((x @ A.t()) @ B.t()))
            col = row0 + rows
        if col < y.shape[-1]:
            parts.append(y[..., col:])
        return torch.cat(parts, dim=-1)


def sites(family, C, n_layer):
    """target -> (module path of layer l, row0, rows or None for all rows, dtrain name stem)."""
    if family == "llama":
        return {
            "q": ("model.layers.%d.self_attn.q_proj", 0, None, "model.layers.%d.self_attn.q_proj"),
            "k": ("model.layers.%d.self_attn.k_proj", 0, None, "model.layers.%d.self_attn.k_proj"),
            "v": ("model.layers.%d.self_attn.v_proj", 0, None, "model.layers.%d.self_attn.v_proj"),
            "o": ("model.layers.%d.self_attn.o_proj", 0, None, "model.layers.%d.self_attn.o_proj"),
            "gate": ("model.layers.%d.mlp.gate_proj", 0, None, "model.layers.%d.mlp.gate_proj"),
            "up": ("model.layers.%d.mlp.up_proj", 0, None, "model.layers.%d.mlp.up_proj"),
            "down": ("model.layers.%d.mlp.down_proj", 0, None, "model.layers.%d.mlp.down_proj"),
        }
    return {
        "q": ("h.%d.attn.c_attn", 0, C, "h.%d.attn.c_attn.q"),
        "k": ("h.%d.attn.c_attn", C, C, "h.%d.attn.c_attn.k"),
        "v": ("h.%d.attn.c_attn", 2 * C, C, "h.%d.attn.c_attn.v"),
        "o": ("h.%d.attn.c_proj", 0, None, "h.%d.attn.c_proj"),
        "up": ("h.%d.mlp.c_fc", 0, None, "h.%d.mlp.c_fc"),
        "down": ("h.%d.mlp.c_proj", 0, None, "h.%d.mlp.c_proj"),
    }


def get_module(root, path):
    m = root
    for part in path.split("."):
        m = m[int(part)] if part.isdigit() else getattr(m, part)
    return m


def set_module(root, path, new):
    parent, _, last = path.rpartition(".")
    p = get_module(root, parent)
    if last.isdigit():
        p[int(last)] = new
    else:
        setattr(p, last, new)


def check(d, corrupt=False):
    meta, t = read_safetensors(os.path.join(d, "lora.safetensors"))
    fam = meta["family"]
    L, C, NH = int(meta["n_layer"]), int(meta["d_model"]), int(meta["n_head"])
    V, ctx = int(meta["vocab"]), int(meta["context"])
    r, alpha = int(meta["rank"]), float(meta["alpha"])
    targets = meta["targets"].split(",")
    dt = torch.float64
    if fam == "llama":
        model = llama_torch.Llama(L, C, NH, int(meta["n_kv_head"]), int(meta["d_ff"]), V, ctx,
                                  int(meta["untied"]), float(meta["rope_theta"]), float(meta["norm_eps"]))
    else:
        model = gpt2_torch.GPT2(L, C, NH, V, ctx)
    model = model.to(dt)
    state = {k: torch.tensor(np.asarray(v, dtype=np.float64)) for k, v in t.items()
             if not k.startswith("grad.") and ".lora_" not in k and k not in ("inputs", "targets", "loss")}
    model.load_state_dict(state, strict=True)
    for p in model.parameters():
        p.requires_grad_(False)
    scale = alpha / r
    adapters = {}
    wrapped = {}
    site = sites(fam, C, L)
    for l in range(L):
        for tg in targets:
            path, row0, rows, stem = site[tg]
            path = path % l
            if path not in wrapped:
                wrapped[path] = LoRALinear(get_module(model, path), scale)
                set_module(model, path, wrapped[path])
            base_rows = wrapped[path].base.weight.shape[0]
            rows = base_rows if rows is None else rows
            na, nb = (stem % l) + ".lora_A.weight", (stem % l) + ".lora_B.weight"
            A = torch.tensor(np.asarray(t[na], dtype=np.float64), requires_grad=True)
            B = torch.tensor(np.asarray(t[nb], dtype=np.float64), requires_grad=True)
            assert tuple(A.shape) == (r, wrapped[path].base.weight.shape[1]), (na, A.shape)
            assert tuple(B.shape) == (rows, r), (nb, B.shape)
            wrapped[path].add(row0, rows, A, B)
            adapters[na], adapters[nb] = A, B
    written = {k for k in t if ".lora_" in k and not k.startswith("grad.")}
    assert written == set(adapters), "dtrain's adapters %s differ from the targets' %s" % (
        sorted(written ^ set(adapters)), targets)
    inputs = torch.tensor(np.asarray(t["inputs"], dtype=np.int64))
    tgts = torch.tensor(np.asarray(t["targets"], dtype=np.int64))
    _, loss = model(inputs, tgts)
    loss.backward()
    assert all(p.grad is None for p in model.parameters() if not any(p is a for a in adapters.values()))
    want = float(loss)
    got = float(np.asarray(t["loss"])[0])
    grads = {name: np.asarray(t["grad." + name], dtype=np.float64) for name in adapters}
    if corrupt:  # the self-test: one element of the first lora_A gradient off by 1e-3 of its largest
        name = next(n for n in adapters if n.endswith("lora_A.weight"))
        grads[name] = grads[name].copy()
        grads[name].flat[0] += 1e-3 * np.abs(grads[name]).max()
    refs = {}
    for name, p in adapters.items():
        refs[name] = p.grad.numpy()
        assert np.abs(refs[name]).max() > 0, "%s: the reference gradient is zero (nothing checked)" % name
    failed, le, worst = compare(got, want, grads, refs)
    print("%s (%s; rank %d, alpha %g; %s): loss %.7f vs torch %.7f (rel %.1e), %d adapter gradients, worst rel "
          "err %.2e (%s), elementwise %.3g of the bound (%s)" % (
              os.path.basename(d), fam, r, alpha, ",".join(targets), got, want, le, len(adapters), worst[0], worst[1],
              worst[2], worst[3]))
    return failed


def compare(got_loss, want_loss, grads, refs):
    """dtrain's loss and adapter gradients against the oracle's (name -> array, float64):
    (failures, loss rel err, (worst normwise err, its tensor, worst elementwise, its element)).
    The loss to LOSS_TOL relative; each gradient normwise to GRAD_TOL (max |g - ref| /
    max |ref|) and elementwise, |g_i - ref_i| <= GRAD_TOL |ref_i| + GRAD_ATOL max |ref|.
    NaN-aware (tests/ref/tensor_check.py): a NaN or Inf fails, and no NaN error passes as small."""
    failed = []
    le = scalar_rel(got_loss, want_loss)
    if not le <= LOSS_TOL:
        failed.append("loss %.9g vs %.9g (rel %.2e)" % (got_loss, want_loss, le))
    worst = (0.0, "", 0.0, "")
    for name in sorted(refs):
        if name not in grads:
            failed.append("grad %s missing" % name)
            continue
        g, ref = np.asarray(grads[name], dtype=np.float64), np.asarray(refs[name], dtype=np.float64)
        if g.shape != ref.shape:
            failed.append("grad %s: shape %s, the reference's %s" % (name, g.shape, ref.shape))
            continue
        scale = float(np.abs(ref).max()) if ref.size and np.all(np.isfinite(ref)) else 0.0
        n, e, i = errors(g, ref, GRAD_TOL, GRAD_ATOL * scale)
        if not n <= worst[0]:
            worst = (n, name, worst[2], worst[3])
        if not e <= worst[2]:
            worst = (worst[0], worst[1], e, "%s[%d]" % (name, i))
        if math.isinf(n):
            failed.append("grad %s[%d]: %r vs %r (non-finite)" % (name, i, g.flat[i], ref.flat[i]))
        elif not n <= GRAD_TOL:
            failed.append("grad %s rel err %.2e" % (name, n))
        elif not e <= 1.0:
            failed.append("grad %s[%d]: %.9g vs %.9g, beyond %g |ref| + %g max|ref| (%.3gx)" % (
                name, i, g.flat[i], ref.flat[i], GRAD_TOL, GRAD_ATOL, e))
    return failed, le, worst


def main():
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        bad = check(args[1], corrupt=True)
        if not bad:
            print("FAIL self-test: a corrupted lora_A gradient passed")
            sys.exit(1)
        print("ok   self-test: a corrupted gradient is caught (%s)" % bad[0])
        return
    failed = 0
    for d in args:
        f = check(d)
        for msg in f:
            print("FAIL %s: %s" % (d, msg))
        failed += bool(f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
