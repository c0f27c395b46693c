"""PyTorch definition of dtrain's GPT-2, shared by the parity oracle and the peer benchmark.

Not run directly. Imported by path from:
  tests/ref/gpt2_ref.py   (float64 oracle: /usr/bin/python3 tests/ref/gpt2_ref.py DIR | --self-test)
  bench/pytorch_gpt2.py   (float32 peer benchmark)

Parameter names match dtrain's checkpoint names exactly ("wte.weight", "h.{l}.attn.c_attn.weight",
...), and every matrix is stored "out x in" like torch.nn.Linear.weight, so a dtrain state dict
loads with load_state_dict(strict=True).

Model: x = wte[tok] + wpe[pos]; L blocks of x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)); then
logits = ln_f(x) @ wte^T (tied). LayerNorm eps 1e-5. GELU is the tanh approximation. Attention is
causal softmax(q k^T / sqrt(hs)) v; c_attn rows are [q of all heads | k | v] and head h uses
columns h*hs..(h+1)*hs of each. Loss is the mean cross-entropy over all B*T positions.

Also here: GPT-2 initialisation, the two AdamW parameter groups (weight decay on 2-D tensors
only) and dtrain's learning-rate schedule (linear warmup, cosine decay, then min_lr).

Torch >= 1.12 (F.gelu(approximate="tanh")); only torch and math are used.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5


def attend(q, k, v, causal):
    """softmax(q k^T / sqrt(hs)) v over (B, NH, T, hs), future keys masked when causal. Every
    family calls it as gpt2_torch.attend, so tests/ref/mixed_ref.py can swap in dtrain's 16-bit
    products (mixed precision)."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        T = q.shape[-2]
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return F.softmax(att, dim=-1) @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)   # weight (3C, C): rows q | k | v
        self.c_proj = nn.Linear(d_model, d_model)       # weight (C, C)

    def forward(self, x):
        B, T, C = x.shape
        nh = self.n_head
        hs = C // nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        # head h = columns h*hs..(h+1)*hs of the q, k and v parts
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        y = attend(q, k, v, True).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)     # weight (4C, C)
        self.c_proj = nn.Linear(4 * d_model, d_model)   # weight (C, 4C)

    def forward(self, x):
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """Parameters: wte.weight (V,C), wpe.weight (context,C), h.{l}.*, ln_f.{weight,bias}."""

    def __init__(self, n_layer, d_model, n_head, vocab, context):
        super().__init__()
        self.n_layer, self.d_model, self.n_head = n_layer, d_model, n_head
        self.vocab, self.context = vocab, context
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.h = nn.ModuleList([Block(d_model, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, eps=LN_EPS)

    def forward(self, idx, targets=None):
        """idx, targets: integer (B, T). Returns (logits (B,T,V), loss or None)."""
        B, T = idx.shape
        assert T <= self.context, "sequence length %d > context %d" % (T, self.context)
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)[None, :, :]
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)          # tied head: ln_f(x) @ wte^T
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long())
        return logits, loss


def gpt2_init_(model, std=0.02, generator=None):
    """GPT-2 init: every weight matrix and both embeddings ~ N(0, std); the two c_proj weights
    per layer ~ N(0, std/sqrt(2L)); biases 0; LayerNorm weight 1, bias 0."""
    proj_std = std / math.sqrt(2 * model.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("ln_f."):
                p.fill_(1.0)
            elif name.endswith("c_proj.weight"):
                p.normal_(0.0, proj_std, generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)
    return model


def param_groups(model, weight_decay):
    """Two AdamW groups: 2-D tensors (wte, wpe, the four matrices per layer) decay; the rest not."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def lr_at(step, max_lr, min_lr, warmup, total_steps):
    """dtrain's schedule for 0-based step: linear warmup, cosine to min_lr, then min_lr."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total_steps:
        return min_lr
    ratio = (step - warmup) / (total_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def count_params(model):
    return sum(p.numel() for p in model.parameters())
