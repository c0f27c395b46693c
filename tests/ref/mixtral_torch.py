"""PyTorch definition of dtrain's mixture-of-experts LLaMA (Mixtral), used by the parity oracle.

Not run directly. Imported by path from:
  tests/ref/gpt2_ref.py      (float64 parity oracle, metadata with n_experts)
  tests/ref/hf_mixtral_check.py (an imported Hugging Face Mixtral directory against dtrain's eval)

Written from the published architecture (Mixtral of Experts, Jiang et al. 2024, and the
MixtralForCausalLM parameter layout); the attention, norms and RoPE are tests/ref/llama_torch.py's.
Parameter names are Hugging Face MixtralForCausalLM state-dict names:
  model.embed_tokens.weight                                     (V, C)
  model.layers.{l}.input_layernorm.weight                       (C)
  model.layers.{l}.self_attn.{q,k,v,o}_proj.weight              as LLaMA
  model.layers.{l}.post_attention_layernorm.weight              (C)
  model.layers.{l}.block_sparse_moe.gate.weight                 (E, C)   the router, no bias
  model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight       (Fe, C)  gate projection
  model.layers.{l}.block_sparse_moe.experts.{e}.w3.weight       (Fe, C)  up projection
  model.layers.{l}.block_sparse_moe.experts.{e}.w2.weight       (C, Fe)  down projection
  model.norm.weight, lm_head.weight (untied only)

The sparse MoE block, per token x (C): logits = gate(x) (E); p = softmax(logits); the k experts of
largest p (ties: the lower expert index, by a stable descending sort); w_j = p_j / sum of the k;
out = sum_j w_j * w2(silu(w1 x) * w3 x) of expert j.
With a capacity factor f > 0 (dtrain's parallel.moe_capacity_factor) each expert keeps at most
ceil(f * N * k / E) of the N tokens' choices: those of the largest w, ties by the lower token
index; a dropped choice adds nothing.

Loss = cross-entropy + aux_coef * aux + z_coef * z over the N = n_layer * B * T router rows of
every layer concatenated:
  aux = E * sum over slots j and experts e of (fraction of the N rows whose j-th choice is e)
        * (mean over the N rows of p_e)       (transformers' load_balancing_loss_func, no mask)
  z   = mean over the N rows of logsumexp(logits)^2   (the router z-loss of ST-MoE).
With aux_type "layer" (dtrain's training.moe_aux_loss_type=layer) aux is Megatron-Core's
switch_load_balancing_loss_func instead, per layer over its T = B * T router rows, summed over
the layers:
  aux = sum over layers of E / (k T^2) * sum over experts e of (the layer's choices of e, a
        count: no gradient) * (the sum over its rows of p_e).

Only torch and math are used.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_torch  # noqa: E402  RMSNorm, attention, RoPE


def route(logits, k):
    """logits (N, E) -> probabilities p (N, E), chosen experts (N, k) by decreasing p (ties:
    lower index first), renormalised weights (N, k)."""
    p = F.softmax(logits, dim=-1)
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    sel = order[:, :k]
    top = torch.gather(p, 1, sel)
    return p, sel, top / top.sum(dim=-1, keepdim=True)


class Expert(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(nn.Module):
    def __init__(self, d_model, n_experts, topk, d_ff):
        super().__init__()
        self.k = topk
        self.capacity_factor = 0.0   # > 0: each expert takes ceil(f * N * k / E) choices at most
        self.dropped = 0
        self.gate = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(d_model, d_ff) for _ in range(n_experts)])
        self.last_logits = None

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(B * T, C)
        logits = self.gate(h)
        self.last_logits = logits
        _, sel, w = route(logits, self.k)
        out = torch.zeros_like(h)
        E, N = len(self.experts), B * T
        cap = math.ceil(self.capacity_factor * N * self.k / E) if self.capacity_factor > 0 else None
        self.dropped = 0
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(sel == e, as_tuple=True)     # rows ascending
            if cap is not None and rows.numel() > cap:
                # keep the cap largest weights, ties by the lower token index
                keep = sorted(range(rows.numel()), key=lambda i: (-float(w[rows[i], slot[i]]), int(rows[i])))[:cap]
                keep = torch.tensor(sorted(keep), dtype=torch.long)
                self.dropped += rows.numel() - cap
                rows, slot = rows[keep], slot[keep]
            if rows.numel() == 0:
                continue
            y = expert(h[rows]) * w[rows, slot].unsqueeze(-1)
            out = out.index_add(0, rows, y)
        return out.reshape(B, T, C)


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, n_experts, topk, d_ff, rope_theta, norm_eps):
        super().__init__()
        self.input_layernorm = llama_torch.RMSNorm(d_model, norm_eps)
        self.self_attn = llama_torch.LlamaAttention(d_model, n_head, n_kv_head, rope_theta)
        self.post_attention_layernorm = llama_torch.RMSNorm(d_model, norm_eps)
        self.block_sparse_moe = SparseMoeBlock(d_model, n_experts, topk, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class MixtralModel(nn.Module):
    def __init__(self, n_layer, d_model, n_head, n_kv_head, n_experts, topk, d_ff, vocab, rope_theta,
                 norm_eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList([
            DecoderLayer(d_model, n_head, n_kv_head, n_experts, topk, d_ff, rope_theta, norm_eps)
            for _ in range(n_layer)])
        self.norm = llama_torch.RMSNorm(d_model, norm_eps)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def router_losses(logits_list, n_experts, k, aux_type="global"):
    """aux (load balancing) and z over the concatenated router logits of every layer (aux_type
    "layer": aux per layer, summed)."""
    logits = torch.cat(logits_list, dim=0)
    if aux_type == "layer":
        aux = 0.0
        for lg in logits_list:
            p, sel, _ = route(lg, k)
            count = F.one_hot(sel, n_experts).to(p.dtype).sum(dim=(0, 1))    # (E,)
            aux = aux + n_experts / (k * lg.shape[0] ** 2) * torch.sum(count * p.sum(dim=0))
        return aux, torch.logsumexp(logits, dim=-1).pow(2).mean()
    p, sel, _ = route(logits, k)
    mask = F.one_hot(sel, n_experts).to(p.dtype)            # (N, k, E)
    aux = n_experts * torch.sum(mask.mean(dim=0) * p.mean(dim=0).unsqueeze(0))
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return aux, z


class Mixtral(nn.Module):
    """MixtralForCausalLM; forward returns (logits, loss) like llama_torch.Llama, the loss with
    the router losses (their last values in .aux, .z)."""

    def __init__(self, n_layer, d_model, n_head, n_kv_head, n_experts, topk, d_ff, vocab, context,
                 untied, rope_theta=llama_torch.DEFAULT_ROPE_THETA,
                 norm_eps=llama_torch.DEFAULT_NORM_EPS, aux_coef=0.0, z_coef=0.0,
                 capacity_factor=0.0, aux_type="global"):
        super().__init__()
        self.n_layer, self.d_model, self.vocab, self.context = n_layer, d_model, vocab, context
        self.n_experts, self.topk, self.untied = n_experts, topk, bool(untied)
        self.aux_coef, self.z_coef = float(aux_coef), float(z_coef)
        assert aux_type in ("global", "layer"), aux_type
        self.aux_type = aux_type
        self.model = MixtralModel(n_layer, d_model, n_head, n_kv_head, n_experts, topk, d_ff, vocab,
                                  float(rope_theta), float(norm_eps))
        if self.untied:
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
        for layer in self.model.layers:
            layer.block_sparse_moe.capacity_factor = float(capacity_factor)
        self.aux = self.z = None

    def head_weight(self):
        return self.lm_head.weight if self.untied else self.model.embed_tokens.weight

    def router_logits(self):
        return [layer.block_sparse_moe.last_logits for layer in self.model.layers]

    def forward(self, idx, targets=None):
        B, T = idx.shape
        assert T <= self.context, "sequence length %d > context %d" % (T, self.context)
        x = self.model(idx)
        logits = F.linear(x, self.head_weight())
        loss = None
        if targets is not None:
            ce = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long())
            self.aux, self.z = router_losses(self.router_logits(), self.n_experts, self.topk, self.aux_type)
            loss = ce + self.aux_coef * self.aux + self.z_coef * self.z
        return logits, loss
