#!/usr/bin/python3
"""RoPE frequencies of Hugging Face's rope_scaling rules in float64, written from the published
formulas (not from dtrain's code), and the check of dtrain's against them.

Usage:
  /usr/bin/python3 tests/ref/rope_scaling_ref.py check ROPE_DUMP WORKDIR

The rules, for a head of size hs, base theta, i < hs/2:
  plain   f_i = theta^(-2i/hs)
  linear  f_i / factor (Chen et al., position interpolation: positions divided by factor)
  llama3  Meta's Llama 3.1 rule (apply_scaling in its reference code, transformers'
          _compute_llama3_parameters): wavelength w = 2 pi / f;
          w < orig / high_freq_factor: f;  w > orig / low_freq_factor: f / factor;
          otherwise (1 - s) f / factor + s f with s = (orig / w - low_freq_factor) /
          (high_freq_factor - low_freq_factor)
  yarn    Peng et al., YaRN ("NTK-by-parts" + attention scaling), as its reference code and
          transformers' _compute_yarn_parameters: the dimension at which a frequency turns
          r times over the original context, d(r) = hs ln(orig / (2 pi r)) / (2 ln theta);
          low = max(floor(d(beta_fast)), 0), high = min(ceil(d(beta_slow)), hs - 1)
          (high += 0.001 when equal); ramp_i = clamp((i - low) / (high - low), 0, 1);
          f_i (1 - ramp_i) + (f_i / factor) ramp_i: dimensions below `low` keep their
          frequency (extrapolation), those above `high` are interpolated; cos and sin are
          multiplied by attention_factor, default 0.1 ln(factor) + 1 (1 for factor <= 1).
          beta_fast, beta_slow default to 32 and 1.
  (orig: original_max_position_embeddings.)

check: runs ROPE_DUMP (tests/rope_dump.c) on configurations given as dtrain keys and as
Hugging Face config.json files written to WORKDIR (Llama 3.1 8B's and Llama 3.2 1B's
rope settings as published, yarn with the older key `type`, linear, `default`), and requires
  - every frequency and the cos/sin scale within 1e-12 relative of the reference;
  - the float values the kernel takes: for plain RoPE bitwise Hugging Face's float32
    fl(1 / fl(theta ^ fl(2i / hs))), for the scaled rules the double value rounded to float;
  - power: each case's rule must matter (a deliberately wrong rule - plain instead of linear,
    llama3 without its smooth band, yarn without its ramp or with scale 1 - is more than
    1e-6 away from dtrain's values), and the llama3 cases have frequencies in all three
    bands, the yarn cases in the ramp.
Prints one line per case; exit 0 when every check passes, else 1.

Also imported by tests/ref/llama_torch.py (inv_freq, hf_rule) for the float64 forward.
"""
import math
import os
import struct
import subprocess
import sys
import json

sys.dont_write_bytecode = True

TOL = 1e-12


def f32(x):
    """x rounded to float32 (dtrain stores its float keys in float32)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ----------------------------------------------------------------------------- the reference
def plain(theta, hs):
    return [theta ** (-(2.0 * i) / hs) for i in range(hs // 2)]


def inv_freq(rule, theta, hs, factor=0.0, low=0.0, high=0.0, orig=0, beta_fast=0.0,
             beta_slow=0.0, attention_factor=0.0):
    """(frequencies, cos/sin scale) of `rule` in float64."""
    base = plain(theta, hs)
    if rule in ("none", "default"):
        return base, 1.0
    if rule == "linear":
        return [f / factor for f in base], 1.0
    if rule == "llama3":
        long_wave, short_wave = orig / low, orig / high
        out = []
        for f in base:
            w = 2.0 * math.pi / f
            if w < short_wave:
                out.append(f)
            elif w > long_wave:
                out.append(f / factor)
            else:
                s = (orig / w - low) / (high - low)
                out.append((1.0 - s) * f / factor + s * f)
        return out, 1.0
    if rule == "yarn":
        bf = beta_fast or 32.0
        bs = beta_slow or 1.0
        lo, hi = yarn_range(theta, hs, orig, bf, bs)
        out = []
        for i, f in enumerate(base):
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            out.append(f * (1.0 - ramp) + (f / factor) * ramp)
        if attention_factor:
            scale = attention_factor
        else:
            scale = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
        return out, scale
    raise ValueError("unknown rule %r" % rule)


def yarn_dim(theta, hs, orig, rotations):
    return hs * math.log(orig / (rotations * 2.0 * math.pi)) / (2.0 * math.log(theta))


def yarn_range(theta, hs, orig, bf, bs):
    lo = max(math.floor(yarn_dim(theta, hs, orig, bf)), 0)
    hi = min(math.ceil(yarn_dim(theta, hs, orig, bs)), hs - 1)
    if lo == hi:
        hi += 0.001
    return lo, hi


def hf_rule(cfg):
    """A Hugging Face config.json dict -> (rule, keyword arguments of inv_freq)."""
    rs = cfg.get("rope_scaling")
    if rs is None:
        return "none", {}
    rule = rs.get("rope_type", rs.get("type"))
    kw = {}
    if rule in ("linear", "llama3", "yarn"):
        kw["factor"] = f32(rs["factor"])
    if rule == "llama3":
        kw.update(low=f32(rs["low_freq_factor"]), high=f32(rs["high_freq_factor"]),
                  orig=rs["original_max_position_embeddings"])
    if rule == "yarn":
        kw.update(orig=rs.get("original_max_position_embeddings", cfg["max_position_embeddings"]),
                  beta_fast=f32(rs.get("beta_fast") or 32.0), beta_slow=f32(rs.get("beta_slow") or 1.0),
                  attention_factor=f32(rs.get("attention_factor") or 0.0))
    return rule, kw


# ----------------------------------------------------------------------------- deliberately wrong rules
def wrong_rules(rule, theta, hs, kw):
    """(name, frequencies, scale) of rules a buggy implementation might compute instead."""
    base = plain(theta, hs)
    out = []
    if rule == "linear":
        out.append(("plain instead of linear", base, 1.0))
    if rule == "llama3":
        w_short = kw["orig"] / kw["high"]
        no_smooth = [f if 2 * math.pi / f <= kw["orig"] / kw["low"] else f / kw["factor"] for f in base]
        out.append(("llama3 without the smooth band", no_smooth, 1.0))
        out.append(("llama3 with the bands swapped",
                    [f / kw["factor"] if 2 * math.pi / f < w_short else f for f in base], 1.0))
    if rule == "yarn":
        ref, scale = inv_freq(rule, theta, hs, **kw)
        out.append(("yarn without its ramp (linear)", [f / kw["factor"] for f in base], scale))
        if not kw.get("attention_factor"):
            out.append(("yarn with cos/sin scale 1", ref, 1.0))
    return out


def rel(a, b):
    return abs(a - b) / abs(b)


# ----------------------------------------------------------------------------- the check
def run_dump(binary, args):
    p = subprocess.run([binary] + args, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()
    d = {"inv": {}, "kernel": {}}
    for line in p.stdout.splitlines():
        w = line.split()
        if w[0] in ("inv", "kernel"):   # kernel values: float32 printed with 9 digits
            d[w[0]][int(w[1])] = f32(float(w[2])) if w[0] == "kernel" else float(w[2])
        elif w[0] == "rule":
            d["rule"] = w[1]
        else:
            d[w[0]] = f32(float(w[1])) if w[0] == "kernel_scale" else float(w[1])
    return d, None


def float32_hf_plain(theta, hs):
    """Hugging Face's float32 plain frequencies: fl(1 / fl(theta ^ fl(2i / hs)))."""
    out = []
    for i in range(hs // 2):
        e = f32(f32(2.0 * i) / f32(hs))
        out.append(f32_div(1.0, f32(theta ** e)))
    return out


def f32_div(a, b):
    return f32(a / b)   # a, b floats exact in float32: the double quotient rounds once to float32


def check_case(name, d, rule, theta, hs, kw):
    fails = []
    ref, scale = inv_freq(rule, theta, hs, **kw)
    if d.get("rule") != ("none" if rule == "default" else rule):
        fails.append("rule %s, wanted %s" % (d.get("rule"), rule))
    if int(d["hs"]) != hs:
        fails.append("hs %d, wanted %d" % (d["hs"], hs))
        return fails, ""
    got = [d["inv"][i] for i in range(hs // 2)]
    worst = max(rel(g, r) for g, r in zip(got, ref))
    serr = rel(d["scale"], scale)
    if worst > TOL:
        i = max(range(len(ref)), key=lambda k: rel(got[k], ref[k]))
        fails.append("frequency %d: %.17g vs reference %.17g (rel %.2e > %.0e)" % (i, got[i], ref[i], worst, TOL))
    if serr > TOL:
        fails.append("scale %.17g vs reference %.17g" % (d["scale"], scale))
    kern = [d["kernel"][i] for i in range(hs // 2)]
    if rule in ("none", "default"):
        want = float32_hf_plain(theta, hs)
        if kern != want:
            i = next(k for k in range(len(want)) if kern[k] != want[k])
            fails.append("kernel frequency %d %.9g is not HF's float32 %.9g" % (i, kern[i], want[i]))
    else:
        if kern != [f32(g) for g in got]:
            fails.append("kernel frequencies are not the double table rounded to float")
        if f32(d["scale"]) != d["kernel_scale"]:
            fails.append("kernel scale %.9g is not the scale rounded" % d["kernel_scale"])
    # power
    for wname, wf, ws in wrong_rules(rule, theta, hs, kw):
        dist = max(max(rel(g, r) for g, r in zip(got, wf)), rel(d["scale"], ws))
        if dist <= 1e-6:
            fails.append("the wrong rule '%s' is within 1e-6 (%.1e): the case does not tell it apart"
                         % (wname, dist))
    bands = ""
    if rule == "llama3":
        w = [2 * math.pi / f for f in plain(theta, hs)]
        n_hi = sum(x < kw["orig"] / kw["high"] for x in w)
        n_lo = sum(x > kw["orig"] / kw["low"] for x in w)
        n_mid = len(w) - n_hi - n_lo
        bands = ", bands %d kept / %d smoothed / %d divided" % (n_hi, n_mid, n_lo)
        if min(n_hi, n_mid, n_lo) < 1:
            fails.append("a band is empty" + bands)
    if rule == "yarn":
        bf, bs = kw.get("beta_fast") or 32.0, kw.get("beta_slow") or 1.0
        dims = (yarn_dim(theta, hs, kw["orig"], bf), yarn_dim(theta, hs, kw["orig"], bs))
        if any(abs(x - round(x)) < 1e-9 for x in dims):
            fails.append("a correction dimension is an integer to 1e-9: floor/ceil would be fragile")
        lo, hi = yarn_range(theta, hs, kw["orig"], bf, bs)
        n_ramp = sum(0.0 < (i - lo) / (hi - lo) < 1.0 for i in range(hs // 2))
        bands = ", ramp [%g, %g] (%d frequencies strictly inside)" % (lo, hi, n_ramp)
    return fails, "max rel err %.2e <= %.0e, scale %.6f%s" % (worst, TOL, d["scale"], bands)


def key_args(keys):
    out = []
    for k, v in keys:
        out += ["--set", "%s=%s" % (k, v)]
    return out


def custom(hs, theta, n_head=2):
    return [("model.preset", ""), ("model.family", "llama"), ("model.d_model", hs * n_head),
            ("model.n_head", n_head), ("model.rope_theta", theta)]


# (name, dtrain keys, rule, theta, hs, inv_freq keywords)
KEY_CASES = [
    ("plain hs 128 theta 5e5", custom(128, 500000) + [("model.rope_scaling", "none")], "none", 500000.0, 128, {}),
    ("linear x4 hs 64", custom(64, 10000) + [("model.rope_scaling", "linear"), ("model.rope_factor", 4)],
     "linear", 10000.0, 64, dict(factor=4.0)),
    ("llama3 as Llama 3.1 (8, 1, 4, 8192) hs 128",
     custom(128, 500000) + [("model.context", 131072), ("model.rope_scaling", "llama3"), ("model.rope_factor", 8),
                            ("model.rope_low_freq_factor", 1), ("model.rope_high_freq_factor", 4),
                            ("model.rope_original_context", 8192)],
     "llama3", 500000.0, 128, dict(factor=8.0, low=1.0, high=4.0, orig=8192)),
    ("llama3 (2.5, 0.5, 3, 100) hs 48 theta 1e4",
     custom(48, 10000) + [("model.rope_scaling", "llama3"), ("model.rope_factor", 2.5),
                          ("model.rope_low_freq_factor", 0.5), ("model.rope_high_freq_factor", 3),
                          ("model.rope_original_context", 100)],
     "llama3", 10000.0, 48, dict(factor=2.5, low=0.5, high=3.0, orig=100)),
    ("preset llama-3.2-1b (llama3 32, 1, 4, 8192)", [("model.preset", "llama-3.2-1b"), ("training.seq_len", 64)],
     "llama3", 500000.0, 64, dict(factor=32.0, low=1.0, high=4.0, orig=8192)),
    ("yarn x4 orig 4096 defaults hs 128 theta 1e6",
     custom(128, 1000000) + [("model.rope_scaling", "yarn"), ("model.rope_factor", 4),
                             ("model.rope_original_context", 4096)],
     "yarn", 1000000.0, 128, dict(factor=4.0, orig=4096)),
    ("yarn x16 orig 2048 betas 16/2 attention 1.25 hs 96",
     custom(96, 10000) + [("model.rope_scaling", "yarn"), ("model.rope_factor", 16),
                          ("model.rope_original_context", 2048), ("model.rope_beta_fast", 16),
                          ("model.rope_beta_slow", 2), ("model.rope_attention_factor", 1.25)],
     "yarn", 10000.0, 96, dict(factor=16.0, orig=2048, beta_fast=16.0, beta_slow=2.0, attention_factor=1.25)),
    ("yarn x2 orig 6 (empty ramp: low == high) hs 64",
     custom(64, 10000) + [("model.rope_scaling", "yarn"), ("model.rope_factor", 2),
                          ("model.rope_original_context", 6)],
     "yarn", 10000.0, 64, dict(factor=2.0, orig=6)),
]

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def small(rope_scaling, theta=10000.0, hidden=128, heads=2, max_pos=4096):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": heads,
            "num_key_value_heads": heads, "vocab_size": 300, "max_position_embeddings": max_pos,
            "rms_norm_eps": 1e-5, "rope_theta": theta, "rope_scaling": rope_scaling,
            "hidden_act": "silu", "tie_word_embeddings": False}


HF_CASES = [
    ("HF Llama-3.1-8B config.json", LLAMA31_8B),
    ("HF Llama-3.2-1B config.json", LLAMA32_1B),
    ("HF yarn with the older key type, original 2048, default betas",
     small({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, max_pos=8192)),
    ("HF yarn without original (max_position_embeddings), betas 24/2",
     small({"rope_type": "yarn", "factor": 8.0, "beta_fast": 24, "beta_slow": 2}, theta=500000.0, max_pos=1024)),
    ("HF linear (type)", small({"type": "linear", "factor": 2.0})),
    ("HF rope_type default", small({"rope_type": "default"})),
]


def main_check(binary, work):
    os.makedirs(work, exist_ok=True)
    nfail = 0

    def report(name, fails, summary):
        nonlocal nfail
        if fails:
            nfail += 1
            for f in fails:
                print("FAIL %s: %s" % (name, f))
        else:
            print("ok   %s: %s" % (name, summary))

    for name, keys, rule, theta, hs, kw in KEY_CASES:
        d, err = run_dump(binary, key_args(keys))
        if d is None:
            report(name, ["rope_dump refused: " + err], "")
            continue
        report(name, *check_case(name, d, rule, theta, hs, kw))
    for k, (name, cfg) in enumerate(HF_CASES):
        d = os.path.join(work, "hf%d" % k)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        out, err = run_dump(binary, ["--hf", d])
        if out is None:
            report(name, ["rope_dump --hf refused: " + err], "")
            continue
        rule, kw = hf_rule(cfg)
        hs = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        report(name, *check_case(name, out, rule, float(cfg["rope_theta"]), hs, kw))
    print("rope_scaling_ref: %d case(s) failed" % nfail)
    return 1 if nfail else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(main_check(sys.argv[2], sys.argv[3]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
