#!/usr/bin/env python3
"""Writes the report test fixtures (schema dtrain-bench/1, as dtrain bench --json emits it).
Numbers are made up but shaped like bench-small on 2 cores. Rerun to regenerate:
    python3 tests/data/report/make_fixtures.py tests/data/report"""
import json, math, os, random, sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20240520)
MiB = 1 << 20
ENV = {"host": "bench-host", "cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "cores": 2,
       "threads": 1, "ranks": 1, "nodes": 1, "mpi": "Open MPI 4.1.4", "onednn": "3.0.0", "compiler": "gcc 12.2.0"}
MODEL = {"preset": "bench-small", "n_layer": 6, "d_model": 384, "n_head": 6, "vocab": 50304, "seq_len": 256,
         "params": 29_940_480}
P = MODEL["params"] * 4  # fp32 bytes of the full model
STEPS, WARMUP, REPEATS = 20, 5, 3


def stat(xs):
    xs = sorted(xs)
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return {"mean": mean, "std": std, "min": xs[0], "median": med, "max": xs[-1]}


def fnv(losses):
    h = 0xcbf29ce484222325
    for x in losses:
        for b in repr(x).encode():
            h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return "%016x" % h


BASE_LOSS = [10.9 - 2.5 * (1 - math.exp(-s / 8)) + 0.02 * math.sin(s) for s in range(STEPS)]


def train(name, world, strategy, micro, accum, step_s, bucket_mb=25, overlap=True, comm=(0.0, 0.0),
          loss=BASE_LOSS, mem=None, cost=False, sweep=None, threads=1):
    gb = micro * accum * world
    tokens = gb * MODEL["seq_len"]
    runs = []
    for r in range(REPEATS):
        steps = [step_s * (1 + 0.03 * rng.uniform(-1, 1)) for _ in range(STEPS)]
        runs.append({"step_s": steps, "loss": loss, "loss_hash": fnv(loss), "mean_step_s": sum(steps) / STEPS})
    per_run = [x["mean_step_s"] for x in runs]
    all_steps = [s for x in runs for s in x["step_s"]]
    fpt = 6 * 21_000_000 + 12 * 6 * 256 * 384
    tps = [tokens / s for s in per_run]
    comm_total, comm_exposed = comm
    compute = step_s - comm_exposed - 0.01 * step_s
    bd = {"forward": compute / 3, "backward": 2 * compute / 3 * 0.9, "optimizer": 2 * compute / 3 * 0.1,
          "communication": comm_exposed, "data": 0.002 * step_s, "idle": 0.008 * step_s}
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, world), "zero2": (1, world, world), "zero3": (world, world, world)}[strategy]
    act = 24 * MiB * micro
    memory = []
    for rank in range(world):
        pb, gbs, ob = P / shard[0] + (8 * MiB if shard[0] > 1 else 0), P / shard[1], 2 * P / shard[2]
        m = {"rank": rank, "params": int(pb), "grads": int(gbs), "optimizer": int(ob), "activations": act,
             "other": 12 * MiB + rank * MiB}
        m["rss"] = sum(v for k, v in m.items() if k != "rank") + 90 * MiB
        memory.append(m)
    obj = {
        "schema": "dtrain-bench/1", "kind": "train",
        "argv": ["dtrain", "bench", "--model", "bench-small", "--set", "parallel.strategy=" + strategy,
                 "--batch", str(micro), "--json", name],
        "date": "2025-01-15T10:00:00Z", "dtrain_version": "0.1.0",
        "environment": dict(ENV, ranks=world, threads=threads),
        "config": {"model.preset": "bench-small", "training.micro_batch": micro, "training.grad_accum": accum,
                   "training.seq_len": 256, "training.seed": 1337, "optimizer.lr": 0.0003,
                   "parallel.strategy": strategy, "parallel.bucket_mb": bucket_mb, "parallel.overlap": overlap,
                   "runtime.threads": threads},
        "model": MODEL,
        "parallel": {"world": world, "strategy": strategy, "hybrid": False, "bucket_bytes": bucket_mb * MiB,
                     "overlap": overlap, "micro_batch": micro, "accum": accum, "global_batch": gb},
        "peak_gflops": 105.0, "peak_source": "dtrain bench peak (1 thread)", "flops_per_token": fpt,
        "mfu_formula": "tokens/s/rank * flops_per_token / peak",
        "warmup": WARMUP, "steps": STEPS, "repeats": REPEATS,
        "runs": runs,
        "summary": {
            "step_s": stat(all_steps), "samples_per_s": stat([gb / s for s in per_run]),
            "tokens_per_s": stat(tps), "tokens_per_s_rank": stat([t / world for t in tps]),
            "tflops_rank": stat([t / world * fpt / 1e12 for t in tps]),
            "mfu": stat([t / world * fpt / 105e9 for t in tps]),
            "comm_total_s": comm_total, "comm_exposed_s": comm_exposed,
            "comm_overhead": comm_exposed / step_s, "comm_bytes_step": 2 * (world - 1) / world * P if world > 1 else 0,
            "breakdown_s": bd, "loss_avg": sum(loss) / len(loss) if loss else 0.0,
            "loss_final": loss[-1] if loss else 0.0, "loss_hash": fnv(loss)},
        "memory": memory if mem is None else mem,
    }
    if cost:
        t = sum(tps) / len(tps)
        obj["cost"] = [
            {"instance": "c7i.4xlarge", "price_hour": 0.714, "spot_hour": 0.31,
             "usd_per_1k_samples": 0.714 / 3600 / (t / 256) * 1000, "usd_per_1b_tokens": 0.714 / 3600 / t * 1e9,
             "hours_to_train": 1e9 / t / 3600, "usd_to_train": 1e9 / t / 3600 * 0.714,
             "spot_usd_to_train": 1e9 / t / 3600 * 0.31},
            {"instance": "c7i.metal-48xl", "price_hour": 8.568, "spot_hour": None,
             "usd_per_1k_samples": 8.568 / 3600 / (t / 256) * 1000, "usd_per_1b_tokens": 8.568 / 3600 / t * 1e9,
             "hours_to_train": 1e9 / t / 3600, "usd_to_train": 1e9 / t / 3600 * 8.568, "spot_usd_to_train": None}]
    if sweep is not None:
        obj["sweep"] = sweep
    return obj


def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


full = os.path.join(out, "full")
perturbed = [x * (1 + 3e-8 * (-1) ** i) for i, x in enumerate(BASE_LOSS)]
runs = {
    "ddp-w1.json": train("ddp-w1", 1, "ddp", 8, 1, 0.340, cost=True),
    "ddp-w1-acc2.json": train("ddp-w1-acc2", 1, "ddp", 8, 2, 0.680),
    "ddp-w2.json": train("ddp-w2", 2, "ddp", 8, 1, 0.358, comm=(0.060, 0.006), cost=True),
    "zero1-w2.json": train("zero1-w2", 2, "zero1", 8, 1, 0.362, comm=(0.062, 0.008)),
    "zero3-w2.json": train("zero3-w2", 2, "zero3", 8, 1, 0.400, comm=(0.110, 0.040)),
    "ddp-w2-bk4.json": train("ddp-w2-bk4", 2, "ddp", 8, 1, 0.372, bucket_mb=4, comm=(0.070, 0.020)),
    "ddp-w2-mb4.json": train("ddp-w2-mb4", 2, "ddp", 4, 2, 0.385, comm=(0.060, 0.006), loss=perturbed),
}
for name, obj in runs.items():
    write(os.path.join(full, name), obj)
sizes = [1 << k for k in range(10, 27, 2)]
rows = []
for op, factor, peak in (("allreduce", 2 * 1 / 2, 9.5), ("reduce_scatter", 1 / 2, 8.0), ("allgather", 1 / 2, 8.4),
                         ("broadcast", 1.0, 6.0)):
    for b in sizes:
        t_us = 12 + b / (peak * 1e3) * (1 + 0.05 * rng.uniform(-1, 1))
        alg = b / t_us / 1e3
        rows.append({"op": op, "bytes": b, "time_us": t_us, "algbw_gbs": alg, "busbw_gbs": alg * factor, "wrong": 0})
write(os.path.join(full, "comm-w2.json"),
      {"schema": "dtrain-bench/1", "kind": "comm", "argv": ["dtrain", "bench", "comm", "--json"],
       "date": "2025-01-15T10:30:00Z", "dtrain_version": "0.1.0", "environment": dict(ENV, ranks=2), "ranks": 2,
       "rows": rows})

# partial data: one rank, no losses, no memory, zero breakdown, no comm file
p = train("partial", 1, "ddp", 8, 1, 0.34, loss=[], mem=[])
p["summary"]["breakdown_s"] = {k: 0.0 for k in p["summary"]["breakdown_s"]}
p["summary"]["mfu"] = {k: None for k in p["summary"]["mfu"]}
write(os.path.join(out, "partial", "only-w1.json"), p)

# bad inputs
bad = os.path.join(out, "bad")
os.makedirs(bad, exist_ok=True)
with open(os.path.join(bad, "not-json.json"), "w") as f:
    f.write('{"schema": "dtrain-bench/1", "kind": "train",\n')
b = train("x", 1, "ddp", 8, 1, 0.34)
b["schema"] = "dtrain-bench/0"
write(os.path.join(bad, "wrong-schema.json"), b)
b = train("x", 1, "ddp", 8, 1, 0.34)
del b["summary"]["tokens_per_s"]["mean"]
write(os.path.join(bad, "missing-key.json"), b)
b = train("x", 1, "ddp", 8, 1, 0.34)
b["parallel"]["world"] = "two"
write(os.path.join(bad, "wrong-type.json"), b)
