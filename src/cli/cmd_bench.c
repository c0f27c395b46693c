/* dtrain bench: repeated training benchmarks with statistics, JSON/CSV, cost, Chrome trace,
 * sweeps (one child process per point) and a micro-batch finder; dtrain bench peak: the fp32
 * matmul rate MFU is measured against; dtrain bench comm: collective bandwidth. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench/bench.h"
#include "bench/bench_json.h"
#include "bench/comm_bench.h"
#include "comm/comm_fit.h"
#include "bench/prices.h"
#include "bench/sweep.h"
#include "cli/cli.h"
#include "ops/ops.h"
#include "core/procinfo.h"
#include "train/trace_file.h"
#include "core/log.h"
#include "core/trace.h"

typedef struct bench_flags {
    int warmup, steps, repeats, help, find_batch;
    double peak;             /* GFLOP/s per rank given by the user; 0 = measure */
    const char *json, *csv, *trace, *prices, *instance;
    double train_tokens;
    size_t mem_budget;
    dt_sweep sweep;
    char *drop;              /* argv entries the sweep's children must not get */
} bench_flags;

/* "64K", "4M", "8G" or plain bytes. */
static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    else if (*end == 'T' || *end == 't') mul = 1099511627776.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (end == s || *end || !(v * mul >= 4) || v * mul > 1e15) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int need_value(dt_ctx *ctx, int argc, char **argv, int i) {
    if (i + 1 < argc) return 1;
    dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: %s needs a value", argv[i]);
    return 0;
}

static int parse_num(dt_ctx *ctx, int argc, char **argv, int *i, double lo, double hi, double *out) {
    if (!need_value(ctx, argc, argv, *i)) return -1;
    char *end;
    double v = strtod(argv[*i + 1], &end);
    if (end == argv[*i + 1] || *end || !(v >= lo && v <= hi)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: %s must be a number in [%g, %g] (got '%s')", argv[*i], lo, hi,
                argv[*i + 1]);
        return -1;
    }
    *out = v;
    ++*i;
    return 1;
}

/* A flag whose value is a string; `drop` marks it (and its value) as the sweeping parent's. */
static int str_flag(dt_ctx *ctx, bench_flags *f, int argc, char **argv, int *i, const char **out, int drop) {
    if (!need_value(ctx, argc, argv, *i)) return -1;
    if (drop && f->drop) f->drop[*i] = f->drop[*i + 1] = 1;
    *out = argv[++*i];
    return 1;
}

static int bench_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    bench_flags *f = ud;
    double v;
    int r;
    const char *a = argv[*i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return f->help = 1;
    if (!strcmp(a, "--warmup-steps")) {
        if ((r = parse_num(ctx, argc, argv, i, 0, 1000, &v)) > 0) f->warmup = (int)v;
        return r;
    }
    if (!strcmp(a, "--bench-steps")) {
        if ((r = parse_num(ctx, argc, argv, i, 1, 9000, &v)) > 0) f->steps = (int)v;
        return r;
    }
    if (!strcmp(a, "--repeats")) {
        if ((r = parse_num(ctx, argc, argv, i, 1, 1000, &v)) > 0) f->repeats = (int)v;
        return r;
    }
    if (!strcmp(a, "--peak")) {
        if ((r = parse_num(ctx, argc, argv, i, 1e-3, 1e9, &v)) > 0) f->peak = v;
        return r;
    }
    if (!strcmp(a, "--train-tokens")) {
        if ((r = parse_num(ctx, argc, argv, i, 1, 1e18, &v)) > 0) f->train_tokens = v;
        return r;
    }
    if (!strcmp(a, "--json")) return str_flag(ctx, f, argc, argv, i, &f->json, 1);
    if (!strcmp(a, "--csv")) return str_flag(ctx, f, argc, argv, i, &f->csv, 1);
    if (!strcmp(a, "--trace")) return str_flag(ctx, f, argc, argv, i, &f->trace, 1);
    if (!strcmp(a, "--prices")) return str_flag(ctx, f, argc, argv, i, &f->prices, 0);
    if (!strcmp(a, "--instance")) return str_flag(ctx, f, argc, argv, i, &f->instance, 0);
    if (!strcmp(a, "--find-batch")) return f->find_batch = 1;
    if (!strcmp(a, "--mem-budget")) {
        if (!need_value(ctx, argc, argv, *i)) return -1;
        if (parse_size(argv[*i + 1], &f->mem_budget) != 0) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: --mem-budget expects a size like 8G or 512M (got '%s')",
                    argv[*i + 1]);
            return -1;
        }
        ++*i;
        return 1;
    }
    if (!strcmp(a, "--sweep")) { /* then NAME=V1,V2 arguments (not flags) */
        if (f->drop) f->drop[*i] = 1;
        int n = 0;
        while (*i + 1 < argc && argv[*i + 1][0] != '-' && strchr(argv[*i + 1], '=')) {
            if (dt_sweep_add_axis(ctx, &f->sweep, argv[*i + 1]) != DT_OK) return -1;
            if (f->drop) f->drop[*i + 1] = 1;
            ++*i;
            n++;
        }
        if (n == 0) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: --sweep needs NAME=V1,V2,... (e.g. --sweep world=1,2 strategy=ddp,zero1)");
            return -1;
        }
        return 1;
    }
    return 0;
}

static int threads_now(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* What dt_bench_peak measures for a training precision. */
static const char *peak_engine(dt_dtype prec) {
    if (prec == DT_F32) return "oneDNN sgemm fp32";
    if (dt_lowp_gemm_native(prec)) return prec == DT_BF16 ? "oneDNN bf16 matmul (native)" : "oneDNN fp16 matmul (native)";
    return prec == DT_BF16 ? "bf16 GEMM widened to fp32 sgemm" : "fp16 GEMM widened to fp32 sgemm";
}

static int cmd_peak(dt_ctx *ctx, int argc, char **argv) {
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    bench_flags fl = {0};
    dt_status st = dt_cli_parse_run(ctx, "bench peak", argc, argv, &cfg, bench_flag, &fl);
    if (fl.help) {
        printf("usage: dtrain bench peak [--threads N] [--set training.precision=bf16|fp16]\n"
               "Measures the GEMM of the precision (oneDNN fp32 sgemm, or the 16-bit GEMM) on 2048^3\n"
               "(1 warm-up + 7 timed runs).\n");
        return DT_EXIT_OK;
    }
    if (st != DT_OK) return dt_cli_exit_code(st);
    dt_peak pk;
    dt_dtype prec = cfg.train.model_opts.compute;
    dt_bench_peak(&pk, prec, 2048, 7);
    printf("# matmul peak: %s, %dx%dx%d, %d threads, %d runs\n", peak_engine(prec), pk.n, pk.n, pk.n,
           threads_now(), pk.reps);
    printf("# %-14s %-14s\n", "median_GFLOP/s", "best_GFLOP/s");
    printf("  %-14.1f %-14.1f\n", pk.gflops, pk.best);
    return DT_EXIT_OK;
}

static int cmd_comm(dt_ctx *ctx, int argc, char **argv) {
    dt_comm_bench_opts o = {1024, 16u << 20, 3, 10, NULL};
    const char *json = NULL, *fit = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: [mpirun -n N] dtrain bench comm [--min-bytes 1K] [--max-bytes 16M] [--iters 10] [--warmup 3]\n"
                   "                                     [--json FILE] [--fit FILE]\n"
                   "All-reduce (MPI's and dtrain's rank-ordered), reduce-scatter, all-gather and broadcast of\n"
                   "float32 buffers doubling from --min-bytes to --max-bytes per rank; time, algbw and busbw as\n"
                   "nccl-tests define them; every row's data is checked (#wrong). --json writes the rows\n"
                   "(docs/FORMATS.md, kind \"comm\"). --fit fits time = alpha + beta x bytes per collective and\n"
                   "size range (< 256 KiB, < 8 MiB, beyond) and writes it (kind \"commfit\"): parallel.comm_model for\n"
                   "parallel.bucket_mb: auto and parallel.allreduce: auto. On several nodes it also measures the\n"
                   "flat all-reduce beside the hierarchical one, and each link level on its own: the node groups\n"
                   "(rows node:...) and the groups across the nodes (rows cross:...), fitted apart.\n");
            return DT_EXIT_OK;
        }
        if (i + 1 >= argc) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench comm: %s needs a value", a);
            return DT_EXIT_USAGE;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--min-bytes")) bad = parse_size(v, &o.min_bytes);
        else if (!strcmp(a, "--max-bytes")) bad = parse_size(v, &o.max_bytes);
        else if (!strcmp(a, "--iters")) bad = (o.iters = atoi(v)) < 1;
        else if (!strcmp(a, "--warmup")) bad = (o.warmup = atoi(v)) < 0;
        else if (!strcmp(a, "--json")) json = v;
        else if (!strcmp(a, "--fit")) fit = v;
        else {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench comm: unknown flag '%s' (see dtrain bench comm --help)", a);
            return DT_EXIT_USAGE;
        }
        if (bad) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench comm: bad value '%s' for %s", v, a);
            return DT_EXIT_USAGE;
        }
    }
    dt_comm *comm;
    dt_status st = dt_comm_init(ctx, &comm);
    if (st != DT_OK) return dt_cli_exit_code(st);
    int rank = dt_comm_rank(comm, DT_GROUP_WORLD), n = dt_comm_size(comm, DT_GROUP_WORLD);
    int nodes = dt_comm_num_nodes(comm);
    if (rank != 0) ctx->log_level = 0;
    if ((json || fit) && rank == 0) o.rows = cJSON_CreateArray();
    st = dt_bench_comm(ctx, comm, &o, stdout);
    dt_cli_finish_ranks(ctx, comm, st);
    if (st == DT_OK && fit && o.rows) {
        dt_comm_fit f;
        st = dt_comm_fit_rows(ctx, o.rows, n, nodes, &f);
        if (st == DT_OK) {
            printf("# cost model: time = alpha + bytes / bandwidth per collective and size range (weighted least squares)\n");
            printf("# %-26s %-6s %12s %12s %10s %14s %12s\n", "collective", "group", "min_bytes", "max_bytes", "alpha_us",
                   "bandwidth_GB/s", "max_rel_err");
            for (int k = 0; k < f.n; k++)
                printf("  %-26s %-6s %12.0f %12.0f %10.2f %14.3f %12.3f\n", f.line[k].op, f.line[k].group, f.line[k].lo, f.line[k].hi,
                       f.line[k].alpha_us, f.line[k].beta_us_per_b > 0 ? 1e-3 / f.line[k].beta_us_per_b : 0.0,
                       f.line[k].max_rel_err);
            const size_t bucket = dt_comm_fit_bucket_bytes(&f);
            printf("# parallel.bucket_mb: auto with this file: %.2f MiB (latency <= 10%% of a bucket's all-reduce)\n",
                   (double)bucket / 1048576.0);
            double h_us, f_us;
            if (dt_comm_fit_prefers_hier(&f, n, nodes, (double)bucket, &h_us, &f_us) >= 0)
                printf("# parallel.allreduce: auto with this file: %s (%.0f us hierarchical vs %.0f us flat per bucket)\n",
                       h_us <= f_us ? "hierarchical" : "flat", h_us, f_us);
            st = dt_comm_fit_save(ctx, fit, &f);
        }
        if (st != DT_OK) dt_log_error(ctx, "%s", ctx->err);
    }
    if (st == DT_OK && json && o.rows) {
        cJSON *obj = cJSON_CreateObject();
        char date[64];
        dt_bench_iso_date(date, sizeof date);
        cJSON_AddStringToObject(obj, "schema", DT_BENCH_SCHEMA);
        cJSON_AddStringToObject(obj, "kind", "comm");
        cJSON *av = cJSON_AddArrayToObject(obj, "argv");
        cJSON_AddItemToArray(av, cJSON_CreateString("dtrain"));
        cJSON_AddItemToArray(av, cJSON_CreateString("bench"));
        cJSON_AddItemToArray(av, cJSON_CreateString("comm"));
        for (int i = 0; i < argc; i++) cJSON_AddItemToArray(av, cJSON_CreateString(argv[i]));
        cJSON_AddStringToObject(obj, "date", date);
        cJSON_AddStringToObject(obj, "dtrain_version", DT_VERSION);
        cJSON_AddItemToObject(obj, "environment", dt_bench_json_env(n, nodes, threads_now()));
        cJSON_AddNumberToObject(obj, "ranks", n);
        cJSON_AddNumberToObject(obj, "warmup", o.warmup);
        cJSON_AddNumberToObject(obj, "iters", o.iters);
        cJSON_AddItemToObject(obj, "rows", o.rows);
        st = dt_bench_json_write(ctx, json, obj);
        cJSON_Delete(obj);
    } else {
        cJSON_Delete(o.rows);
    }
    return dt_cli_exit_code(st);
}

static void usage(void) {
    printf("usage: dtrain bench [CONFIG] [--set KEY=VALUE ...] [--warmup-steps 10] [--bench-steps 50]\n"
           "                    [--repeats 3] [--peak GFLOPS] [--json FILE] [--csv FILE] [--trace FILE]\n"
           "                    [--prices FILE [--instance NAME|all] [--train-tokens N]]\n"
           "       dtrain bench [CONFIG] --sweep NAME=V1,V2 [NAME=...] [same flags]\n"
           "       dtrain bench [CONFIG] --find-batch --mem-budget 8G\n"
           "       dtrain bench peak [--threads N]\n"
           "       [mpirun -n N] dtrain bench comm [--min-bytes B] [--max-bytes B] [--json FILE] (see --help)\n\n"
           "Each repeat is a fresh trainer with the same seed: the loss hashes must agree (checked).\n"
           "Statistics pool every timed step of every repeat. Without --peak (or logging.peak_gflops)\n"
           "every rank measures the matmul peak first, all at once (as by 'dtrain bench peak').\n"
           "  --json FILE     one JSON object (docs/FORMATS.md); in a sweep FILE.<point>.json per point\n"
           "  --csv FILE      one row per run or sweep point\n"
           "  --trace FILE    Chrome trace of the first repeat's timed steps, all ranks (Perfetto)\n"
           "  --prices FILE   price table (configs/prices.yaml): cost per 1K samples and 1B tokens\n"
           "  --train-tokens N  add time and cost to train N tokens\n"
           "  --sweep AXES    world, strategy, micro_batch, bucket_mb, batch (global: strong scaling),\n"
           "                  accum, overlap, or any section.key; one child process per point\n"
           "                  (dtrain launch -n W -- bench ...); efficiency vs the world=1 point\n"
           "  --find-batch    double the micro-batch while the planned memory per rank fits\n"
           "                  --mem-budget SIZE; prints the largest that fits and why\n\n");
    dt_cli_print_config_help();
}

/* ---- --find-batch */

/* The memory plan for micro-batch B by kind (dt_trainer_mem_plan, max over ranks). */
static dt_status plan_batch(dt_ctx *ctx, const dt_train_cfg *base, dt_comm *comm, long B, double *kinds) {
    dt_train_cfg c = *base;
    c.micro_batch = (int)B;
    size_t bytes[DT_MEM_NKINDS];
    DT_CHECK(dt_trainer_mem_plan_here(ctx, &c, comm, bytes));
    for (int k = 0; k < DT_MEM_NKINDS; k++) kinds[k] = (double)bytes[k];
    return dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, kinds, DT_MEM_NKINDS, DT_F64, DT_MAX);
}

/* The memory plan (dt_trainer_mem_plan: the allocator's high-water, by formula) for doubling
 * micro-batches; the pick is then built and stepped once to check the plan against the
 * allocator and the process's VmHWM. */
static dt_status find_batch(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, size_t budget, int print) {
    double base = (double)dt_proc_bytes("/proc/self/status", "VmRSS"); /* code, libraries, MPI: what the process holds before any trainer */
    DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, &base, 1, DT_F64, DT_MAX));
    if (print) {
        printf("# find-batch: largest micro-batch whose planned memory per rank fits %.1f MiB "
               "(seq %d, %s, grad_accum %d)\n",
               budget / 1048576.0, cfg->seq_len, dt_strategy_name(cfg->parallel.strategy), cfg->accum);
        printf("# plan = process baseline (VmRSS before training, %.1f MiB) + the memory plan by kind "
               "(docs/ARCHITECTURE.md, decision 36)\n", base / 1048576.0);
        printf("# %-11s %-10s %-10s %-10s %-12s %-10s %-10s %-12s %s\n", "micro_batch", "params", "grads", "optimizer",
               "activations", "comm", "other", "planned_MiB", "fits");
    }
    int best = 0;
    double best_plan = 0, next_plan = 0;
    for (long B = 1; B <= 65536; B *= 2) {
        double kind[DT_MEM_NKINDS], total = base;
        DT_CHECK(plan_batch(ctx, cfg, comm, B, kind));
        for (int k = 0; k < DT_MEM_NKINDS; k++) total += kind[k];
        int fits = total <= (double)budget;
        if (print)
            printf("  %-11ld %-10.1f %-10.1f %-10.1f %-12.1f %-10.1f %-10.1f %-12.1f %s\n", B, kind[DT_MEM_PARAMS] / 1048576.0,
                   kind[DT_MEM_GRADS] / 1048576.0, kind[DT_MEM_OPTIM] / 1048576.0, kind[DT_MEM_ACTS] / 1048576.0,
                   kind[DT_MEM_COMM] / 1048576.0, kind[DT_MEM_OTHER] / 1048576.0,
                   total / 1048576.0, fits ? "yes" : "no");
        if (!fits) {
            next_plan = total;
            break;
        }
        best = (int)B;
        best_plan = total;
    }
    if (best == 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "find-batch: even micro_batch 1 needs %.1f MiB per rank, over the budget of %.1f MiB",
                       next_plan / 1048576.0, budget / 1048576.0);
    /* Check the pick: one real step. */
    dt_train_cfg c = *cfg;
    c.micro_batch = best;
    c.steps = 1;
    if (c.sched.total < 1) c.sched.total = 1;
    dt_trainer tr;
    DT_CHECK(dt_trainer_init(ctx, &tr, &c, comm));
    dt_step_stats ss;
    dt_status st = dt_trainer_step(ctx, &tr, &ss);
    double got[2] = {(double)tr.alloc.total_peak, (double)dt_bench_rss_hwm()};
    dt_trainer_free(&tr);
    DT_CHECK(st);
    DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, got, 2, DT_F64, DT_MAX));
    if (got[0] != best_plan - base) /* the plan is the allocator's formula: any difference is a bug */
        return dt_fail(ctx, DT_ERR_INTERNAL, "find-batch: the memory plan (%.0f bytes) differs from the allocator's "
                       "high-water (%.0f bytes) at micro_batch %d", best_plan - base, got[0], best);
    if (print) {
        printf("# picked micro_batch %d: planned %.1f MiB <= budget %.1f MiB", best, best_plan / 1048576.0,
               budget / 1048576.0);
        if (next_plan > 0) printf("; micro_batch %d would need %.1f MiB > budget", 2 * best, next_plan / 1048576.0);
        printf("\n# checked by one step at micro_batch %d: allocator high-water %.1f MiB (= the plan), process VmHWM "
               "%.1f MiB (max over ranks)\n", best, got[0] / 1048576.0, got[1] / 1048576.0);
        printf("micro_batch=%d\n", best);
    }
    return DT_OK;
}

/* ---- sweeps */

/* The sweep file of a point: FILE.json -> FILE.<id>.json. */
static void point_path(char *buf, size_t n, const char *json, const char *dir, const char *id) {
    if (!json) {
        snprintf(buf, n, "%s/%s.json", dir, id);
        return;
    }
    size_t len = strlen(json);
    if (len > 5 && !strcmp(json + len - 5, ".json")) len -= 5;
    snprintf(buf, n, "%.*s.%s.json", (int)len, json, id);
}

static int run_sweep(dt_ctx *ctx, bench_flags *fl, int argc, char **argv) {
    int np = dt_sweep_count(&fl->sweep);
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        dt_fail(ctx, DT_ERR_IO, "bench --sweep: cannot find this executable (/proc/self/exe)");
        return DT_EXIT_FAIL;
    }
    self[sl] = 0;
    const char *tmpdir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/dtrain-sweep-XXXXXX", tmpdir);
    if (!mkdtemp(dir)) {
        dt_fail(ctx, DT_ERR_IO, "bench --sweep: cannot create a directory under %s: %s", tmpdir, strerror(errno));
        return DT_EXIT_FAIL;
    }
    char sweep_id[64] = "sweep-", date[64];
    dt_bench_iso_date(date, sizeof date);
    for (char *p = date; *p; p++)
        if (*p != '-' && *p != ':') sweep_id[strlen(sweep_id) + 1] = 0, sweep_id[strlen(sweep_id)] = *p;
    cJSON **pts = calloc((size_t)np, sizeof *pts);
    char **child = calloc((size_t)argc + 64, sizeof *child);
    char (*store)[128] = calloc(DT_SWEEP_MAX_AXES, sizeof *store);
    if (!pts || !child || !store) {
        free(pts), free(child), free(store);
        dt_fail(ctx, DT_ERR_NOMEM, "bench --sweep: out of memory");
        return DT_EXIT_FAIL;
    }
    int failed = 0;
    printf("# dtrain bench sweep %s: %d point(s), one child process each (dtrain launch -n W -- bench ...)\n", sweep_id, np);
    printf("# efficiency = tokens/s(W) / (W x tokens/s(1)) vs the world=1 point with the same other values: weak "
           "(per-rank batch fixed) or strong (training.batch fixed)\n");
    printf("# %-32s %5s %-7s %6s %6s %7s %8s %8s %12s %12s %6s %7s %6s %6s %s\n", "point", "world", "strat", "mbatch",
           "accum", "gbatch", "step_ms", "std_ms", "tokens/s", "tok/s/rank", "MFU_%", "comm_%", "weak", "strong",
           "loss_hash");
    for (int i = 0; i < np; i++) {
        char id[256], path[4600], log[4600], wbuf[16];
        dt_sweep_point_id(&fl->sweep, i, id, sizeof id);
        point_path(path, sizeof path, fl->json, dir, id);
        snprintf(log, sizeof log, "%s/%s.log", dir, id);
        int W = dt_sweep_world(&fl->sweep, i), n = 0;
        snprintf(wbuf, sizeof wbuf, "%d", W);
        child[n++] = self;
        if (W > 1) {
            child[n++] = "launch";
            child[n++] = "-n";
            child[n++] = wbuf;
            child[n++] = "--";
        }
        child[n++] = "bench";
        for (int a = 0; a < argc; a++)
            if (!fl->drop[a]) child[n++] = argv[a];
        dt_sweep_point_args(&fl->sweep, i, child, &n, store);
        child[n++] = "--json";
        child[n++] = path;
        child[n] = NULL;
        int code = 0;
        dt_status st = dt_sweep_spawn(ctx, child, log, &code);
        if (st == DT_OK && code == 0) st = dt_bench_json_read(ctx, path, &pts[i]);
        if (st != DT_OK || code != 0) {
            failed++;
            fprintf(stderr, "%s:%d error: sweep point %s failed (exit %d)%s%s; its output:\n", ctx->host, ctx->rank, id,
                    code, st != DT_OK ? ": " : "", st != DT_OK ? ctx->err : "");
            FILE *lf = fopen(log, "r");
            char line[1024];
            while (lf && fgets(line, sizeof line, lf)) fprintf(stderr, "  | %s", line);
            if (lf) fclose(lf);
            continue;
        }
        cJSON *so = cJSON_AddObjectToObject(pts[i], "sweep");
        cJSON_AddStringToObject(so, "id", sweep_id);
        cJSON_AddStringToObject(so, "point_id", id);
        cJSON_AddItemToObject(so, "point", dt_sweep_point_json(&fl->sweep, i));
        cJSON_AddNumberToObject(so, "index", i);
        cJSON_AddNumberToObject(so, "points", np);
    }
    dt_sweep_efficiency(&fl->sweep, pts, np);
    FILE *csv = NULL;
    if (fl->csv && !(csv = fopen(fl->csv, "w")))
        fprintf(stderr, "%s:%d error: %s: cannot write: %s\n", ctx->host, ctx->rank, fl->csv, strerror(errno)), failed++;
    if (csv) dt_bench_csv_header(csv);
    for (int i = 0; i < np; i++) {
        if (!pts[i]) continue;
        char id[256], path[4600];
        dt_sweep_point_id(&fl->sweep, i, id, sizeof id);
        const cJSON *so = cJSON_GetObjectItemCaseSensitive(pts[i], "sweep");
        const cJSON *we = cJSON_GetObjectItemCaseSensitive(so, "weak_efficiency");
        const cJSON *se = cJSON_GetObjectItemCaseSensitive(so, "strong_efficiency");
        char wes[16] = "-", ses[16] = "-";
        if (cJSON_IsNumber(we)) snprintf(wes, sizeof wes, "%.3f", we->valuedouble);
        if (cJSON_IsNumber(se)) snprintf(ses, sizeof ses, "%.3f", se->valuedouble);
        const cJSON *su = cJSON_GetObjectItemCaseSensitive(pts[i], "summary");
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(pts[i], "parallel");
        const cJSON *stt = cJSON_GetObjectItemCaseSensitive(su, "step_s"), *tk = cJSON_GetObjectItemCaseSensitive(su, "tokens_per_s");
        const cJSON *mfu = cJSON_GetObjectItemCaseSensitive(su, "mfu"), *h = cJSON_GetObjectItemCaseSensitive(su, "loss_hash");
#define NUM(obj, k) (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(obj, k)) ? cJSON_GetObjectItemCaseSensitive(obj, k)->valuedouble : NAN)
        double world = NUM(pa, "world");
        printf("  %-32s %5.0f %-7s %6.0f %6.0f %7.0f %8.2f %8.2f %12.1f %12.1f %6.1f %7.1f %6s %6s %s\n", id, world,
               cJSON_GetObjectItemCaseSensitive(pa, "strategy")->valuestring, NUM(pa, "micro_batch"), NUM(pa, "accum"),
               NUM(pa, "global_batch"), NUM(stt, "mean") * 1e3, NUM(stt, "std") * 1e3, NUM(tk, "mean"),
               NUM(tk, "mean") / world, cJSON_IsObject(mfu) ? 100 * NUM(mfu, "mean") : NAN,
               100 * NUM(su, "comm_overhead"), wes, ses, cJSON_IsString(h) ? h->valuestring : "-");
#undef NUM
        if (csv) dt_bench_csv_row(csv, pts[i]);
        if (fl->json) {
            point_path(path, sizeof path, fl->json, dir, id);
            if (dt_bench_json_write(ctx, path, pts[i]) != DT_OK) {
                dt_log_error(ctx, "%s", ctx->err);
                failed++;
            }
        }
        cJSON_Delete(pts[i]);
    }
    if (csv && fclose(csv) != 0) failed++;
    if (fl->json && failed < np) printf("# results: %.*s.<point>.json\n", (int)(strlen(fl->json) - (strlen(fl->json) > 5 && !strcmp(fl->json + strlen(fl->json) - 5, ".json") ? 5 : 0)), fl->json);
    /* The scratch directory: logs (and the points' JSON without --json). */
    for (int i = 0; i < np; i++) {
        char id[256], p[4600];
        dt_sweep_point_id(&fl->sweep, i, id, sizeof id);
        snprintf(p, sizeof p, "%s/%s.log", dir, id);
        remove(p);
        snprintf(p, sizeof p, "%s/%s.json", dir, id);
        remove(p);
    }
    rmdir(dir);
    free(pts);
    free(child);
    free(store);
    if (failed) {
        dt_fail(ctx, DT_ERR_IO, "bench --sweep: %d of %d point(s) failed", failed, np);
        return DT_EXIT_FAIL;
    }
    return DT_EXIT_OK;
}

/* ---- one benchmark (all ranks) */

static int fail_ranks(dt_ctx *ctx, dt_comm *comm, dt_status st) {
    dt_cli_finish_ranks(ctx, comm, st);
    return dt_cli_exit_code(st);
}

int dt_cmd_bench(dt_ctx *ctx, int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "peak") == 0) return cmd_peak(ctx, argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "comm") == 0) return cmd_comm(ctx, argc - 1, argv + 1);
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    bench_flags fl;
    memset(&fl, 0, sizeof fl);
    fl.warmup = 10, fl.steps = 50, fl.repeats = 3;
    fl.drop = calloc((size_t)argc + 1, 1);
    dt_status st = dt_cli_parse_run(ctx, "bench", argc, argv, &cfg, bench_flag, &fl);
    if (fl.help) {
        usage();
        free(fl.drop);
        return DT_EXIT_OK;
    }
    if (st == DT_OK && fl.instance && !fl.prices)
        st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: --instance needs --prices FILE (e.g. configs/prices.yaml)");
    if (st == DT_OK && fl.find_batch && fl.mem_budget == 0)
        st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: --find-batch needs --mem-budget SIZE (e.g. 8G)");
    dt_price_table prices = {0};
    if (st == DT_OK && fl.prices) st = dt_prices_load(ctx, fl.prices, &prices);
    if (st == DT_OK && fl.prices && fl.instance && strcmp(fl.instance, "all")) {
        dt_cost_input probe = {1, 1, 1, 0}; /* an unknown instance fails now, not after the run */
        cJSON *rows;
        st = dt_prices_cost(ctx, &prices, fl.instance, &probe, &rows);
        cJSON_Delete(rows);
    }
    if (st == DT_OK && fl.sweep.nax > 0) {
        dt_prices_free(&prices);
        if (fl.find_batch || fl.trace)
            st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: --sweep runs one child per point; --%s is not for sweeps",
                         fl.find_batch ? "find-batch" : "trace");
        else if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
            st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: run it as one process; it launches its points itself");
        int code = st == DT_OK ? run_sweep(ctx, &fl, argc, argv) : dt_cli_exit_code(st);
        free(fl.drop);
        return code;
    }
    free(fl.drop);
    fl.drop = NULL;
    /* Under mpirun a configuration error is agreed on (dt_cli_comm_init): printed by one rank. */
    if (st != DT_OK && !dt_comm_launched_by_mpi()) {
        dt_prices_free(&prices);
        return dt_cli_exit_code(st);
    }

    dt_comm *comm;
    /* tensor-parallel ranks run their TP collectives beside the gradient buckets' thread */
    st = dt_cli_comm_init_mesh(ctx, &comm, st, st == DT_OK && ((cfg.tp > 1 && !cfg.tp_blocks) || cfg.ep > 1 || !strcmp(cfg.layout, "auto")));
    if (st != DT_OK) {
        dt_prices_free(&prices);
        return dt_cli_exit_code(st);
    }
    dt_cli_rank_setup(ctx, comm, &cfg);
    int rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    st = dt_cli_layout_auto(ctx, &cfg, comm);
    if (st == DT_OK) st = dt_cfg_apply_world(ctx, &cfg, dt_comm_size(comm, DT_GROUP_WORLD));
    if (st == DT_OK && fl.find_batch) {
        st = find_batch(ctx, &cfg.train, comm, fl.mem_budget, rank == 0);
        dt_prices_free(&prices);
        return fail_ranks(ctx, comm, st);
    }
    /* The peak each rank can reach with its threads, measured by all ranks at once (they
     * share the machine's cores and memory bandwidth as they will in training). */
    double peak = fl.peak;
    char peak_src[160] = "given by --peak";
    if (peak <= 0 && cfg.peak_gflops > 0) {
        peak = cfg.peak_gflops;
        snprintf(peak_src, sizeof peak_src, "given by logging.peak_gflops");
    }
    if (st == DT_OK && peak <= 0) {
        st = dt_comm_barrier(ctx, comm, DT_GROUP_WORLD);
        dt_peak pk;
        dt_dtype prec = cfg.train.model_opts.compute;
        dt_bench_peak(&pk, prec, 2048, 7);
        peak = pk.gflops / dt_comm_size(comm, DT_GROUP_WORLD);
        if (st == DT_OK) st = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, &peak, 1, DT_F64, DT_SUM);
        snprintf(peak_src, sizeof peak_src,
                 "measured: %s 2048^3, median of 7, %d thread(s) per rank, all ranks at once, mean over ranks",
                 peak_engine(prec), threads_now());
    }
    dt_bench_opts bo = {fl.warmup, fl.steps, fl.repeats, peak, fl.trace != NULL, cfg.straggler_factor};
    dt_bench_suite s;
    memset(&s, 0, sizeof s);
    if (st == DT_OK) st = dt_bench_suite_run(ctx, &cfg.train, comm, &bo, &s);
    if (st == DT_OK && fl.trace) st = dt_trace_write_merged(ctx, comm, fl.trace);
    dt_trace_reset();
    dt_cli_finish_ranks(ctx, comm, st);
    if (st != DT_OK || rank != 0) { /* only rank 0 prints tables */
        dt_bench_suite_free(&s);
        dt_prices_free(&prices);
        return dt_cli_exit_code(st);
    }
    int threads = threads_now();
    dt_bench_suite_print(stdout, &s, &cfg.train, peak_src, threads);
    if (s.hash_mismatch)
        dt_log_warn(ctx, "bench: the loss hash differs between repeats (%d of %d): the runs are not "
                         "deterministic; see the repeat table", s.hash_mismatch, s.opts.repeats);
    cJSON *obj = dt_bench_json_train(&s, &cfg, argc, argv, peak_src, threads);
    if (fl.prices) {
        dt_cost_input in = {s.samples_per_s.mean, s.tokens_per_s.mean, s.nodes, fl.train_tokens};
        cJSON *rows = NULL;
        st = dt_prices_cost(ctx, &prices, fl.instance, &in, &rows);
        if (st == DT_OK) {
            dt_prices_print(stdout, &prices, rows, fl.train_tokens);
            cJSON_ReplaceItemInObjectCaseSensitive(obj, "cost", rows);
        }
    }
    if (st == DT_OK && fl.json) st = dt_bench_json_write(ctx, fl.json, obj);
    if (st == DT_OK && fl.csv) {
        FILE *f = fopen(fl.csv, "w");
        if (!f) st = dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", fl.csv, strerror(errno));
        else {
            dt_bench_csv_header(f);
            dt_bench_csv_row(f, obj);
            if (fclose(f) != 0) st = dt_fail(ctx, DT_ERR_IO, "%s: write failed", fl.csv);
        }
    }
    if (st == DT_OK && fl.trace) printf("# trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", fl.trace);
    cJSON_Delete(obj);
    dt_bench_suite_free(&s);
    dt_prices_free(&prices);
    return dt_cli_exit_code(st);
}
