"""Machinery shared by the PyTorch peer benchmarks (bench/pytorch_{gpt2,llama,vit}.py).

Each peer script keeps what is its model's own (presets, model construction and init, batches,
parameter groups, the unit of throughput) and hands the rest to this module: the common command
line flags and their checks, the per-rank timed training loop, the --ddp N launch
(torch.multiprocessing spawn, gloo on 127.0.0.1 at a free port, DistributedDataParallel), the
median step time and the output (a '#' header line and one result row, or one JSON object).

The loop, the same for every peer: torch.set_num_threads(--threads); the same init on every rank
(torch.manual_seed(SEED) before the model is built); AdamW(lr 3e-4, betas (0.9, 0.95), weight
decay 0.1 on the script's parameter groups); each rank draws its own batches from a generator
seeded SEED + 1 + rank; each step is zero_grad(set_to_none=True), forward, loss.backward(),
clip_grad_norm_(1.0), optimizer.step(), timed with time.perf_counter(); the first --warmup steps
are not counted; a non-finite loss stops the run.

The scripts load this file by path (as they load tests/ref/*.py) and register it in sys.modules
as 'peer_common', so --ddp's spawned ranks can unpickle run_rank's entry point.
"""
import importlib.util
import json
import math
import os
import socket
import statistics
import sys
import time

sys.dont_write_bytecode = True

import torch                                    # noqa: E402

LR, BETAS, WEIGHT_DECAY, CLIP, SEED = 3e-4, (0.9, 0.95), 0.1, 1.0, 1337

_REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref")


def load_ref(name):
    """Imports tests/ref/<name>.py by path (the model code shared with the parity oracle)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(_REF, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- command line -------------------------------------------------------------------------------

def add_run_args(ap, batch=4, unit="", seq=True):
    """--batch [--seq] --threads --warmup --steps --ddp (unit: what B counts, for the help)."""
    ap.add_argument("--batch", type=int, default=batch,
                    help="micro-batch B%s per rank (default %d)" % (unit, batch))
    if seq:
        ap.add_argument("--seq", type=int, default=256, help="sequence length T (default 256)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per rank (default 2)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--ddp", type=int, default=1, metavar="N", help="ranks (default 1)")


def add_json_arg(ap):
    ap.add_argument("--json", action="store_true", help="print one JSON object")


def flags(keys, sep=", "):
    """'n_layer', 'd_model' -> '--n-layer, --d-model'."""
    return sep.join("--" + k.replace("_", "-") for k in keys)


def preset_cfg(args, presets, defaults, keys):
    """The --model preset (or defaults without one) with the explicit size flags in keys over it."""
    cfg = dict(presets[args.model]) if args.model else dict(defaults)
    for k in keys:
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    return cfg


def require(ap, cfg, keys, listed=None):
    """Errors out unless cfg has every key (listed: the flags the message names, default keys)."""
    missing = [k for k in keys if k not in cfg]
    if missing:
        ap.error("give --model or all of %s (missing: %s)"
                 % (flags(listed or keys, " "), flags(missing)))


def require_positive(ap, cfg, keys=None):
    for k in (cfg if keys is None else keys):
        if cfg[k] < 1:
            ap.error("%s must be >= 1" % k)


def require_divisible(ap, cfg, a, b):
    if cfg[a] % cfg[b]:
        ap.error("%s %d not divisible by %s %d" % (a, cfg[a], b, cfg[b]))


def check_run_args(ap, args, cfg, seq=True):
    """--seq within the context (with seq), and the run flags' ranges."""
    if seq and args.seq > cfg["context"]:
        ap.error("--seq %d exceeds context %d" % (args.seq, cfg["context"]))
    sizes = [args.batch] + ([args.seq] if seq else []) + [args.threads, args.steps, args.ddp]
    if min(sizes) < 1 or args.warmup < 0:
        ap.error("--batch, %s--threads, --steps, --ddp must be >= 1, --warmup >= 0"
                 % ("--seq, " if seq else ""))


def model_name(args, presets, cfg, custom):
    """The preset's name ('-custom' appended when a flag changed it), else custom."""
    if not args.model:
        return custom
    if any(cfg[k] != presets[args.model][k] for k in cfg):
        return args.model + "-custom"
    return args.model


# --- the timed run ------------------------------------------------------------------------------

def run_rank(rank, world, args, port, queue, build, groups, batch, check=None):
    """Runs the benchmark on one rank; rank 0 puts its result into queue (or returns it).

    build(args) -> (model, n_params), called after torch.manual_seed(SEED); groups(model) -> the
    AdamW parameter groups; batch(args, gen) -> (x, y) for one step; check(args), if given, runs
    on rank 0 before the model is built. The forward net(x, y) returns (logits, loss).
    """
    torch.set_num_threads(args.threads)
    ddp = world > 1
    if ddp:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank == 0 and check is not None:
        check(args)
    torch.manual_seed(SEED)                         # same init on every rank
    model, n_params = build(args)
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(groups(model), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(SEED + 1 + rank)   # each rank its own data
    times = []
    for step in range(args.warmup + args.steps):
        x, y = batch(args, gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        dt = time.perf_counter() - t0
        if not math.isfinite(loss.item()):
            raise RuntimeError("non-finite loss at step %d" % step)
        if step >= args.warmup:
            times.append(dt)
    result = dict(times=times, n_params=n_params, final_loss=loss.item())
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        if queue is not None:
            queue.put(result)
        return result
    return None


def _ddp_entry(rank, *a):
    run_rank(rank, *a)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args, build, groups, batch, check=None):
    """Runs --ddp ranks (spawned when more than one); rank 0's result, with its median step time.

    The callables are run_rank's; with --ddp > 1 they are pickled by name, so they must be the
    peer script's module-level functions.
    """
    world = args.ddp
    hooks = (build, groups, batch, check)
    if world > 1:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.spawn(_ddp_entry, args=(world, args, free_port(), queue) + hooks, nprocs=world,
                 join=True)
        result = queue.get()
    else:
        result = run_rank(0, 1, args, None, None, *hooks)
    result["median"] = statistics.median(result["times"])
    return result


# --- output -------------------------------------------------------------------------------------

def report(args, result, column, sizes, rates, family=None):
    """Prints the result: one JSON object with --json, else a '#' header line and one row.

    column: (label, value) of the table's size column after batch (seq, pixels); sizes: the JSON
    items after batch; rates: (JSON key, table label, value) of each throughput, in order.
    """
    times, median = result["times"], result["median"]
    if args.json:
        out = {"peer": "pytorch", "torch_version": torch.__version__, "model": args.model_name}
        caps = [l.split(":", 1)[1].strip() for l in torch.__config__.show().splitlines()
                if "CPU capability usage" in l]
        out["cpu_capability"] = caps[0] if caps else "unknown"  # the ATen kernels that ran (AVX2, AVX512)
        if family:
            out["family"] = family
        out.update(config=args.cfg, n_params=result["n_params"], batch=args.batch)
        out.update(sizes)
        out.update(threads=args.threads, ranks=args.ddp, median_step_s=median)
        out.update((key, value) for key, _, value in rates)
        out.update(step_times_s=times, final_loss=result["final_loss"])
        print(json.dumps(out))
    else:
        print("# peer     torch      model                ranks threads batch %-6s "
              "params       median_step_s  %s" % (column[0], " ".join(r[1] for r in rates)))
        cells = ["%-*.1f" % (len(label), value) for _, label, value in rates[:-1]]
        cells.append("%.1f" % rates[-1][2])
        print("pytorch  %-10s %-20s %5d %7d %5d %-6d %-12d %-14.6f %s" % (
            torch.__version__, args.model_name, args.ddp, args.threads, args.batch, column[1],
            result["n_params"], median, " ".join(cells)))
