"""PyTorch definition of dtrain's ViT family (image classification), used by the parity oracle.

Not run directly. Imported by path from:
  tests/ref/gpt2_ref.py   (float64 oracle: /usr/bin/python3 tests/ref/gpt2_ref.py DIR | --self-test)

Written from the published Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16x16
Words"; timm's VisionTransformer names), with dtrain's stated choices where they differ from timm.
Parameter names and shapes (every matrix "out x in" like torch.nn.Linear.weight, so a dtrain state
dict loads with load_state_dict(strict=True)); C = d_model, F = d_ff, ps = patch_size,
G = image_size / ps, Np = G*G:
  patch_embed.proj.weight            (C, channels*ps*ps)   a Linear, not timm's 4-D Conv2d weight
  patch_embed.proj.bias              (C)
  cls_token                          (C)                    timm: (1, 1, C)
  pos_embed                          (Np+1, C)              timm: (1, Np+1, C); row 0 is the cls
  blocks.{l}.norm1.weight / .bias    (C)
  blocks.{l}.attn.qkv.weight         (3C, C)                rows [q of all heads | k | v]
  blocks.{l}.attn.qkv.bias           (3C)
  blocks.{l}.attn.proj.weight        (C, C)
  blocks.{l}.attn.proj.bias          (C)
  blocks.{l}.norm2.weight / .bias    (C)
  blocks.{l}.mlp.fc1.weight          (F, C)
  blocks.{l}.mlp.fc1.bias            (F)
  blocks.{l}.mlp.fc2.weight          (C, F)
  blocks.{l}.mlp.fc2.bias            (C)
  norm.weight / norm.bias            (C)
  head.weight                        (n_classes, C)
  head.bias                          (n_classes)

Model:
  input: integer pixels (B, P), P = channels*image_size^2, each image channel-planar (c, y, x)
         row-major; x = pixel / 255 (no mean/std normalisation)
  patchify: patch p = gy*G + gx (row-major over the grid), its vector index
         c*ps*ps + py*ps + px (a Conv2d weight's flattening order), pixel (c, gy*ps+py, gx*ps+px);
         patch embedding = proj(patch vector), i.e. Conv2d(channels, C, ps, stride=ps)
  tokens = [cls_token, emb_1 .. emb_Np] + pos_embed             (T = Np+1 tokens)
  per block (pre-norm):  x = x + attn.proj(attn(norm1(x)));  x = x + fc2(gelu(fc1(norm2(x))))
  logits = head(norm(x)[:, 0])                                    (the cls token only)
  loss = mean cross-entropy over the B images
LayerNorm eps 1e-5 (timm uses 1e-6). GELU is the tanh approximation (timm uses erf).
Attention is bidirectional (no mask), softmax(q k^T / sqrt(hs)) v, head h = columns
h*hs..(h+1)*hs of each of the q, k, v parts (as GPT-2 in gpt2_torch.py), hs = C / n_head.

Also here: a small-random initialisation for tests, the two AdamW parameter groups (weight decay on
2-D tensors except pos_embed, as timm's no_weight_decay(); cls_token is 1-D and so never decays)
and dtrain's learning-rate schedule (the same function as for GPT-2).

Torch >= 1.12 (F.gelu(approximate="tanh")); only torch and math are used.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch  # noqa: E402  attention (mixed_ref swaps it)
from gpt2_torch import count_params, lr_at  # noqa: E402,F401  dtrain's schedule (and rules) in one place

LN_EPS = 1e-5
GELU_APPROXIMATE = "tanh"         # F.gelu's approximate= ("none" is timm's erf GELU)
NO_DECAY_2D = ("pos_embed",)      # 2-D tensors that AdamW does not decay


def patchify(x, image_size, patch_size, channels):
    """x: (B, channels*image_size^2), each row an image (c, y, x) row-major. Returns
    (B, Np, channels*ps*ps): patch gy*G + gx, vector index c*ps*ps + py*ps + px."""
    B = x.shape[0]
    ps, G = patch_size, image_size // patch_size
    assert x.shape[1] == channels * image_size * image_size, \
        "input length %d != channels*image_size^2 = %d" % (x.shape[1],
                                                           channels * image_size * image_size)
    x = x.reshape(B, channels, G, ps, G, ps)          # (b, c, gy, py, gx, px)
    x = x.permute(0, 2, 4, 1, 3, 5)                    # (b, gy, gx, c, py, px)
    return x.reshape(B, G * G, channels * ps * ps)


class PatchEmbed(nn.Module):
    def __init__(self, image_size, patch_size, channels, d_model):
        super().__init__()
        assert image_size % patch_size == 0, "image_size must be a multiple of patch_size"
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.proj = nn.Linear(channels * patch_size * patch_size, d_model)

    def forward(self, x):
        """x: float (B, P) -> (B, Np, C)."""
        return self.proj(patchify(x, self.image_size, self.patch_size, self.channels))


class Attention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)     # weight (3C, C): rows q | k | v
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        nh = self.n_head
        hs = C // nh
        q, k, v = self.qkv(x).split(C, dim=2)
        # head h = columns h*hs..(h+1)*hs of the q, k and v parts
        q = q.view(B, T, nh, hs).transpose(1, 2)
        k = k.view(B, T, nh, hs).transpose(1, 2)
        v = v.view(B, T, nh, hs).transpose(1, 2)
        y = gpt2_torch.attend(q, k, v, False).transpose(1, 2).contiguous().view(B, T, C)  # no mask
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        return self.fc2(F.gelu(self.fc1(x), approximate=GELU_APPROXIMATE))


class Block(nn.Module):
    def __init__(self, d_model, n_head, d_ff, ln_eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=ln_eps)
        self.attn = Attention(d_model, n_head)
        self.norm2 = nn.LayerNorm(d_model, eps=ln_eps)
        self.mlp = Mlp(d_model, d_ff)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class ViT(nn.Module):
    """Parameters: patch_embed.proj.*, cls_token, pos_embed, blocks.{l}.*, norm.*, head.*."""

    def __init__(self, n_layer, d_model, n_head, d_ff, image_size, patch_size, channels,
                 n_classes, ln_eps=None):
        super().__init__()
        ln_eps = LN_EPS if ln_eps is None else ln_eps
        assert image_size % patch_size == 0, "image_size must be a multiple of patch_size"
        self.n_layer, self.d_model, self.n_head, self.d_ff = n_layer, d_model, n_head, d_ff
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        self.n_classes = n_classes
        self.n_patches = (image_size // patch_size) ** 2
        self.n_pixels = channels * image_size * image_size
        self.patch_embed = PatchEmbed(image_size, patch_size, channels, d_model)
        self.cls_token = nn.Parameter(torch.zeros(d_model))
        self.pos_embed = nn.Parameter(torch.zeros(self.n_patches + 1, d_model))
        self.blocks = nn.ModuleList([Block(d_model, n_head, d_ff, ln_eps)
                                     for _ in range(n_layer)])
        self.norm = nn.LayerNorm(d_model, eps=ln_eps)
        self.head = nn.Linear(d_model, n_classes)

    def features(self, pixels):
        """pixels: (B, P) integer 0..255 (or float). Returns the final-norm tokens (B, Np+1, C)."""
        B, P = pixels.shape
        assert P == self.n_pixels, "input length %d != channels*image_size^2 = %d" % (
            P, self.n_pixels)
        x = pixels.to(self.pos_embed.dtype) / 255.0
        x = self.patch_embed(x)                                       # (B, Np, C)
        cls = self.cls_token.view(1, 1, -1).expand(B, 1, self.d_model)
        x = torch.cat((cls, x), dim=1) + self.pos_embed[None, :, :]   # (B, Np+1, C)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, pixels, targets=None):
        """pixels: integer (B, P); targets: integer (B). Returns (logits (B, n_classes), loss
        or None)."""
        logits = self.head(self.features(pixels)[:, 0])
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits, targets.reshape(-1).long())
        return logits, loss


def vit_init_(model, std=0.02, generator=None):
    """Test initialisation: every matrix, cls_token and pos_embed ~ N(0, std), attn.proj and
    mlp.fc2 ~ N(0, std/sqrt(2L)); biases 0; LayerNorm weight 1, bias 0."""
    proj_std = std / math.sqrt(2 * model.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".norm" in name or name.startswith("norm."):
                p.fill_(1.0)
            elif name.endswith("attn.proj.weight") or name.endswith("fc2.weight"):
                p.normal_(0.0, proj_std, generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)
    return model


def param_groups(model, weight_decay):
    """Two AdamW groups: 2-D tensors (patch_embed.proj, the four matrices per layer, head) decay;
    pos_embed and every 1-D tensor (biases, LayerNorm, cls_token) do not."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.dim() >= 2 and n not in NO_DECAY_2D]
    no_decay = [p for n, p in named if not (p.dim() >= 2 and n not in NO_DECAY_2D)]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
