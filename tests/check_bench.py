#!/usr/bin/env python3
"""Checks of `dtrain bench` output for tests/test_bench.sh.

  keys  FILE FORMATS.md [group]   the JSON's key paths equal those documented in FORMATS.md,
                                  section "Bench results (JSON)" (group: train | comm)
  run   FILE WORLD REPEATS STEPS  values: shapes, statistics recomputed, breakdown sums to the
                                  step, FLOP/token and MFU recomputed, equal loss hashes
  trace FILE NRANKS [comm]        Chrome trace: valid JSON, X events per (pid, tid) well nested
  sweep FILE FORMATS.md           a sweep point: documented sweep keys, efficiency vs world 1
  pp    FILE FORMATS.md PP M SCHEDULE MB SEQ D   a pipeline bench: per-rank columns, exact bytes,
                                  the replay recomputed (tests/test_pp_bench.sh)
  pptrace FILE PP M SCHEDULE STEPS  a pipeline trace: rows by stage, F/B slots in schedule order
"""
import json
import math
import re
import statistics
import sys


def documented(formats, group):
    """Key paths of the FORMATS.md tables, by '### ' heading group (train, sweep, comm, cost)."""
    text = open(formats).read()
    sec = text.split("## Bench results (JSON)", 1)[1].split("\n## ", 1)[0]
    keys, cur = {}, None
    for line in sec.splitlines():
        if line.startswith("### "):
            h = line.lower()
            cur = ("commfit" if "commfit" in h else "comm" if "comm" in h else "sweep" if "sweep" in h
                   else "cost" if "cost" in h else "train")
        cells = line.split("|")
        if len(cells) > 2 and cur and cells[1].strip().startswith("`"):
            for path in re.findall(r"`([^`]+)`", cells[1]):
                for k in expand(path):
                    parts = k.split(".")  # a documented path documents its parents
                    for i in range(1, len(parts) + 1):
                        keys.setdefault(cur, set()).add(".".join(parts[:i]).removesuffix("[]"))
    return keys.get(group, set())


def expand(path):
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in expand(path[: m.start()] + alt.strip() + path[m.end():])]


def paths(o, pre=""):
    out = set()
    if isinstance(o, dict):
        for k, v in o.items():
            p = f"{pre}.{k}" if pre else k
            if pre in ("config", "sweep.point"):  # open-ended: configuration keys, swept axes
                continue
            out.add(p)
            out |= paths(v, p)
    elif isinstance(o, list) and o and isinstance(o[0], dict):
        for v in o:
            out |= paths(v, pre + "[]")
    return out


def cmd_keys(f, formats, group="train"):
    d = json.load(open(f))
    doc = documented(formats, group)
    got = paths(d)
    if group == "train":
        if d.get("cost"):
            doc |= {"cost[]." + k for k in documented(formats, "cost")}
        if "sweep" in d:
            doc |= documented(formats, "sweep")
        assert len(d["config"]) > 20 and "model.n_layer" in d["config"], "config holds every key"
        if "mfu_unknown" not in d.get("summary", {}):  # only when a step beat the peak
            doc.discard("summary.mfu_unknown")
        if d.get("summary", {}).get("mfu", 0) is None:  # no peak, or a step beat it
            doc -= {k for k in doc if k.startswith("summary.mfu.")}
        if "comm_predicted_s" not in d.get("summary", {}):  # only with parallel.comm_model
            doc.discard("summary.comm_predicted_s")
        if "pipeline" not in d:  # only under a pipeline (parallel.pp > 1)
            doc -= {k for k in doc if k == "pipeline" or k.startswith("pipeline.")} | {"parallel.pp"}
        if "moe" not in d:  # only for a mixture of experts (model.n_experts > 0)
            doc -= {k for k in doc if k == "moe" or k.startswith("moe.")}
        if "lora" not in d["model"]:  # only under LoRA (lora.rank > 0)
            doc -= {k for k in doc if k.startswith("model.lora")}
    elif group == "commfit":
        pass
    else:  # "environment: as for train"
        doc |= {k for k in documented(formats, "train") if k.startswith("environment.")}
        doc.discard("environment.machine_ranks")  # training runs only (FORMATS.md says so)
    missing, extra = sorted(doc - got), sorted(got - doc)
    assert not missing, f"documented but missing from {f}: {missing}"
    assert not extra, f"in {f} but not documented in FORMATS.md: {extra}"
    print(f"{len(doc)} keys")


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def cmd_run(f, world, repeats, steps):
    d = json.load(open(f))
    world, repeats, steps = int(world), int(repeats), int(steps)
    assert d["schema"] == "dtrain-bench/1" and d["kind"] == "train"
    assert d["parallel"]["world"] == world and d["environment"]["ranks"] == world
    assert len(d["runs"]) == repeats and d["repeats"] == repeats and d["steps"] == steps
    allsteps = [t for r in d["runs"] for t in r["step_s"]]
    assert len(allsteps) == repeats * steps and all(len(r["loss"]) == steps for r in d["runs"])
    s = d["summary"]
    st = s["step_s"]
    assert close(st["mean"], statistics.mean(allsteps)) and close(st["median"], statistics.median(allsteps))
    assert close(st["std"], statistics.stdev(allsteps)) and st["min"] == min(allsteps) and st["max"] == max(allsteps)
    for r in d["runs"]:
        assert close(r["mean_step_s"], statistics.mean(r["step_s"]))
    hashes = {r["loss_hash"] for r in d["runs"]}
    assert hashes == {s["loss_hash"]} and s["loss_hash_match"] is True, f"loss hashes differ: {hashes}"
    assert re.fullmatch(r"[0-9a-f]{16}", s["loss_hash"])
    assert s["loss_final"] == d["runs"][0]["loss"][-1]
    bd = s["breakdown_s"]
    assert close(sum(bd.values()), st["mean"], 1e-9), f"breakdown {bd} does not add up to {st['mean']}"
    assert all(bd[k] >= 0 for k in ("forward", "backward", "optimizer", "communication", "data"))
    m, p = d["model"], d["parallel"]
    L, C, V, T = m["n_layer"], m["d_model"], m["vocab"], m["seq_len"]
    cfg = d["config"]
    if cfg.get("model.family", "gpt2") == "vit":
        # FLOPs per image / pixels: 6 (patch K C Np + blocks N_l (Np+1) + head C classes) + 12 L T^2 C
        F, S, P, Ch, NC = (cfg["model.d_ff"], cfg["model.image_size"], cfg["model.patch_size"],
                           cfg["model.channels"], cfg["model.n_classes"])
        Np, K = (S // P) ** 2, Ch * P * P
        nl = 4 * C * C + 2 * C * F + 9 * C + F
        img = 6 * (K * C * Np + L * nl * (Np + 1) + C * NC) + 12 * L * (Np + 1) ** 2 * C
        assert T == Ch * S * S and close(d["flops_per_token"], img / T, 1e-12), "FLOP/image / pixels"
    else:
        n = L * (12 * C * C + 13 * C) + 2 * C + V * C
        assert d["flops_per_token"] == 6 * n + 12 * L * T * C, "6N + 12 L T d"
    tok_rank = p["micro_batch"] * T * p["accum"]
    assert p["global_batch"] == p["micro_batch"] * p["accum"] * world
    assert close(s["tokens_per_s_rank"]["mean"], statistics.mean(tok_rank / t for t in allsteps))
    assert close(s["tokens_per_s"]["mean"], world * s["tokens_per_s_rank"]["mean"])
    mfu = d["flops_per_token"] * s["tokens_per_s_rank"]["mean"] / (d["peak_gflops"] * 1e9)
    fastest = s["tflops_rank"]["max"] * 1e3
    if fastest > d["peak_gflops"]:  # a step beat the peak: MFU unknown (null), never above 100%
        assert s["mfu"] is None and "above the peak" in s["mfu_unknown"], s
    else:
        assert "mfu_unknown" not in s and close(s["mfu"]["mean"], mfu), (s["mfu"]["mean"], mfu)
    assert close(s["tflops_rank"]["mean"], d["flops_per_token"] * s["tokens_per_s_rank"]["mean"] / 1e12)
    assert [r["rank"] for r in d["memory"]] == list(range(world))
    for r in d["memory"]:
        assert r["params"] > 0 and r["activations"] > 0 and r["rss"] > r["total"] / 2
        assert r["total"] == sum(r[k] for k in ("params", "grads", "optimizer", "activations", "comm", "other"))
        assert r["plan"] == r["total"], f"memory plan {r['plan']} != allocator high-water {r['total']}"
    if world > 1:
        assert s["comm_total_s"] > 0 and s["comm_bytes_step"] > 0
    assert close(s["comm_overhead"], s["comm_exposed_s"] / st["mean"])
    # Every rank's exposed communication; the least of them is the collectives' own cost, and
    # rank 0's is the summary's.
    ex = [r["exposed_ms"] for r in d["ranks"]]
    assert [r["rank"] for r in d["ranks"]] == list(range(world)) and all(x >= 0 for x in ex)
    assert close(s["comm_exposed_min_s"], min(ex) / 1e3, 1e-12) and close(ex[0] / 1e3, s["comm_exposed_s"], 1e-12)
    print(f"{repeats}x{steps} steps, hash {s['loss_hash']}, breakdown sums to the step")


def cmd_trace(f, nranks, need_comm=None):
    t = json.load(open(f))
    ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in ev} == set(range(int(nranks))), "one pid per rank"
    groups = {}
    for e in ev:
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["name"]
        groups.setdefault((e["pid"], e["tid"]), []).append(e)
    eps = 1e-6
    for key, g in groups.items():
        g.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in g:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack:
                top = stack[-1]
                assert e["ts"] + e["dur"] <= top["ts"] + top["dur"] + eps, f"{key}: {e} overlaps {top}"
            stack.append(e)
    names = " ".join(e["name"] for e in ev)
    for want in ("fwd layer 1", "bwd layer 0", "step", "sync + optimizer", "data 0", "forward 0", "backward 0"):
        assert want in names, f"no '{want}' event"
    ncomm = sum(1 for e in ev if e["tid"] == 1)
    if need_comm:
        assert ncomm > 0 and all(e["cat"] == "comm" for e in ev if e["tid"] == 1), "comm thread events"
    print(f"{len(ev)} events, {len(groups)} (pid, tid) timelines well nested, {ncomm} on comm threads")


def pp_lists(kind, pp, m):
    """Each rank's (op, micro-batch) list under gpipe, 1f1b or zb-h1 (parallel/pp_schedule.h's
    rules; zb-h1: 1f1b's F/B order, W of j after B of j + rank, the rest at the end)."""
    out = []
    for r in range(pp):
        if kind == "gpipe":
            out.append([("F", k) for k in range(m)] + [("B", k) for k in range(m)])
            continue
        w = min(m, pp - r - 1)
        a, nw = [("F", k) for k in range(w)], 0
        for i in range(m):
            if i < m - w:
                a.append(("F", w + i))
            a.append(("B", i))
            if kind == "zb-h1" and i - r >= nw:
                a.append(("W", nw))
                nw += 1
        out.append(a + ([("W", k) for k in range(nw, m)] if kind == "zb-h1" else []))
    return out


def replay(lists, f, b, w=None):
    """Discrete-event replay of the lists (transfers free): F of stage s after F of s-1, B of s
    after B of s+1 (the last stage's after its own F), W after its own B; returns (span, idle
    per stage)."""
    pp = len(lists)
    end, t, pos, busy = {}, [0.0] * pp, [0] * pp, [0.0] * pp
    while any(pos[r] < len(lists[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while pos[r] < len(lists[r]):
                op, k = lists[r][pos[r]]
                dep = (("F", k, r - 1) if r > 0 else None) if op == "F" else ("B", k, r) if op == "W" else \
                      (("B", k, r + 1) if r < pp - 1 else ("F", k, r))
                if dep and dep not in end:
                    break
                start = max(t[r], end[dep] if dep else 0.0)
                d = f[r] if op == "F" else w[r] if op == "W" else b[r]
                t[r] = end[(op, k, r)] = start + d
                busy[r] += d
                pos[r] += 1
                moved = True
        assert moved, "deadlock"
    span = max(t)
    return span, [span - x for x in busy]


def cmd_pp(f, formats, pp, m, kind, mb, seq, d_model):
    """A pipeline bench: the documented keys, every rank's columns consistent with its step,
    the exact bytes between stages, and the replay recomputed from its own durations."""
    cmd_keys(f, formats, "train")
    d = json.load(open(f))
    pp, m, mb, seq, d_model = int(pp), int(m), int(mb), int(seq), int(d_model)
    p = d["pipeline"]
    assert (p["pp"], p["schedule"], p["micro_batches"]) == (pp, kind, m), p
    world = d["parallel"]["world"]
    assert d["parallel"]["pp"] == pp and d["parallel"]["dp"] * pp == world, d["parallel"]
    assert d["parallel"]["global_batch"] == mb * m * d["parallel"]["dp"], d["parallel"]
    rows = p["ranks"]
    assert [r["rank"] for r in rows] == list(range(world)) and sorted({r["stage"] for r in rows}) == list(range(pp))
    act = mb * seq * d_model * 4  # one micro-batch's fp32 activation (or its gradient)
    for r in rows:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in r.values()), r
        assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["span_s"] > 0, r
        assert r["busy_s"] >= r["forward_s"] + r["backward_s"], r
        assert r["busy_s"] + r["idle_s"] <= r["step_s"] * (1 + 1e-9), f"busy + idle > step: {r}"
        assert r["forward_s"] + r["backward_s"] + r["idle_s"] <= r["span_s"] * (1 + 1e-9), r
        assert r["span_s"] <= r["step_s"] * (1 + 1e-9) and r["idle_s"] <= r["p2p_s"] * (1 + 1e-9), r
        assert close(r["idle_fraction"], r["idle_s"] / r["span_s"]), r
        # a middle stage sends both ways; the ends one way: m messages of act bytes each way (an
        # interleaved stage, v chunks around a ring: every chunk but the model's first receives
        # activations and every chunk but its last gradients, 2 v - 1 of them at the ends)
        v = p.get("virtual", 1)
        ways = 2 * v - (r["stage"] == 0) - (r["stage"] == pp - 1) if v > 1 else (r["stage"] > 0) + (r["stage"] < pp - 1)
        assert r["p2p_bytes"] == ways * m * act, (r["p2p_bytes"], ways * m * act)
    # per stage boundary: m activations forward and m gradients back (v times, less the ring's
    # wrap-around ends, interleaved)
    assert sum(r["p2p_bytes"] for r in rows) == 2 * (pp * p.get("virtual", 1) - 1) * m * act * (world // pp)
    rp = p["replay"]
    for s in range(pp):
        st = [r for r in rows if r["stage"] == s]
        per = m * p.get("virtual", 1)  # one action: a micro-batch through one chunk
        assert close(rp["forward_s"][s], statistics.mean(r["forward_s"] for r in st) / per, 1e-9)
        assert close(rp["backward_s"][s], statistics.mean(r["backward_s"] - r["wgrad_s"] for r in st) / per, 1e-9)
        # zb-h1's weight-gradient passes measured apart (a share of the backward), none elsewhere
        assert all(0 < r["wgrad_s"] < r["backward_s"] if kind == "zb-h1" else r["wgrad_s"] == 0 for r in st), st
        assert close(rp["wgrad_s"][s], statistics.mean(r["wgrad_s"] for r in st) / per, 1e-9)
    span, idle = replay(pp_lists(kind, pp, m), rp["forward_s"], rp["backward_s"], rp["wgrad_s"])
    assert close(rp["span_s"], span, 1e-9), (rp["span_s"], span)
    assert all(close(a, b / span, 1e-6) or abs(a - b / span) < 1e-12 for a, b in zip(rp["stage_idle_fraction"], idle))
    assert close(rp["idle_fraction"], statistics.mean(rp["stage_idle_fraction"]), 1e-9)
    assert 0 < rp["idle_fraction"] < 1, rp
    assert rp["textbook_idle_fraction"] == (pp - 1) / (m + pp - 1), rp
    longest = max(r["span_s"] for r in rows)
    assert close(rp["measured_idle_fraction"],
                 statistics.mean(1 - (r["forward_s"] + r["backward_s"]) / longest for r in rows), 1e-9)
    print(f"{world} ranks: busy + idle <= step, {act * m} bytes each way per boundary; replay idle "
          f"{rp['idle_fraction']:.3f} (recomputed), textbook {rp['textbook_idle_fraction']:.3f}, "
          f"measured {rp['measured_idle_fraction']:.3f}")


def cmd_pptrace(f, pp, m, kind, steps):
    """A pipeline's merged trace: one row per rank named with its stage, every micro-batch's
    forward and backward slot on every rank in the schedule's order each step, and the receive
    waits of each stage."""
    pp, m, steps = int(pp), int(m), int(steps)
    t = json.load(open(f))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in t if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} (pp stage {r} of {pp})" for r in range(pp)}, names
    ev = [e for e in t if e["ph"] == "X"]
    lists = pp_lists(kind, pp, m)
    for r in range(pp):
        slots = sorted((e for e in ev if e["pid"] == r and e["tid"] == 0 and e["cat"] in ("fwd", "bwd")
                        and re.fullmatch(r"(forward|backward) \d+", e["name"])), key=lambda e: e["ts"])
        got = [("F" if e["name"][0] == "f" else "B", int(e["name"].split()[1])) for e in slots]
        assert got == lists[r] * steps, f"rank {r}: slots {got} != schedule {lists[r]} x {steps}"
        recv = [e for e in ev if e["pid"] == r and e["cat"] == "pp" and e["name"].startswith("recv ")]
        want = m * ((r > 0) + (r < pp - 1)) * steps
        assert len(recv) == want, f"rank {r}: {len(recv)} receive waits, want {want}"
    print(f"{pp} rows named by stage; F/B slots of all {m} micro-batches in {kind} order on every rank, "
          f"{steps} step(s); receive waits shown")


def cmd_sweep(f, formats):
    cmd_keys(f, formats, "train")
    s = json.load(open(f))["sweep"]
    assert s["point"] == {"world": 2, "strategy": "zero1"} and s["reference"] == "world1-strategyzero1"
    assert s["weak_efficiency"] > 0 and s["strong_efficiency"] is None
    print(f"weak efficiency {s['weak_efficiency']:.3f}")


if __name__ == "__main__":
    {"keys": cmd_keys, "run": cmd_run, "trace": cmd_trace, "sweep": cmd_sweep, "pp": cmd_pp,
     "pptrace": cmd_pptrace}[sys.argv[1]](*sys.argv[2:])
