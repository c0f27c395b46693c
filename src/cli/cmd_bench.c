/* dtrain bench: training throughput and MFU with a per-kernel breakdown; dtrain bench peak:
 * the fp32 matmul rate MFU is measured against. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench/bench.h"
#include "bench/comm_bench.h"
#include "cli/cli.h"

typedef struct bench_flags {
    int warmup, steps, help;
    double peak; /* GFLOP/s given by the user; 0 = measure */
} bench_flags;

static int parse_num(dt_ctx *ctx, int argc, char **argv, int *i, double lo, double hi, double *out) {
    if (*i + 1 >= argc) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: %s needs a value", argv[*i]);
        return -1;
    }
    char *end;
    double v = strtod(argv[*i + 1], &end);
    if (end == argv[*i + 1] || *end || !(v >= lo && v <= hi)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench: %s must be a number in [%g, %g] (got '%s')",
                argv[*i], lo, hi, argv[*i + 1]);
        return -1;
    }
    *out = v;
    ++*i;
    return 1;
}

static int bench_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    bench_flags *f = ud;
    double v;
    int r;
    if (strcmp(argv[*i], "--help") == 0 || strcmp(argv[*i], "-h") == 0) return f->help = 1;
    if (strcmp(argv[*i], "--warmup-steps") == 0) {
        if ((r = parse_num(ctx, argc, argv, i, 0, 1000, &v)) > 0) f->warmup = (int)v;
        return r;
    }
    if (strcmp(argv[*i], "--bench-steps") == 0) {
        if ((r = parse_num(ctx, argc, argv, i, 1, 9000, &v)) > 0) f->steps = (int)v;
        return r;
    }
    if (strcmp(argv[*i], "--peak") == 0) {
        if ((r = parse_num(ctx, argc, argv, i, 1e-3, 1e9, &v)) > 0) f->peak = v;
        return r;
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

static int cmd_peak(dt_ctx *ctx, int argc, char **argv) {
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    bench_flags fl = {0};
    dt_status st = dt_cli_parse_run(ctx, "bench peak", argc, argv, &cfg, bench_flag, &fl);
    if (fl.help) {
        printf("usage: dtrain bench peak [--threads N]\n"
               "Measures oneDNN fp32 sgemm on 2048^3 (1 warm-up + 7 timed runs).\n");
        return DT_EXIT_OK;
    }
    if (st != DT_OK) return dt_cli_exit_code(st);
    dt_peak pk;
    dt_bench_peak(&pk, 2048, 7);
    printf("# matmul peak: oneDNN sgemm fp32, %dx%dx%d, %d threads, %d runs\n", pk.n, pk.n, pk.n,
           threads_now(), pk.reps);
    printf("# %-14s %-14s\n", "median_GFLOP/s", "best_GFLOP/s");
    printf("  %-14.1f %-14.1f\n", pk.gflops, pk.best);
    return DT_EXIT_OK;
}

/* "64K", "4M", "1G" or plain bytes. */
static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (end == s || *end || !(v * mul >= 4) || v * mul > 1e12) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int cmd_comm(dt_ctx *ctx, int argc, char **argv) {
    dt_comm_bench_opts o = {1024, 16u << 20, 3, 10};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: [mpirun -n N] dtrain bench comm [--min-bytes 1K] [--max-bytes 16M] [--iters 10] [--warmup 3]\n"
                   "All-reduce (MPI's and dtrain's rank-ordered), reduce-scatter, all-gather and broadcast of\n"
                   "float32 buffers doubling from --min-bytes to --max-bytes per rank; time, algbw and busbw as\n"
                   "nccl-tests define them; every row's data is checked (#wrong).\n");
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
    if (dt_comm_rank(comm, DT_GROUP_WORLD) != 0) ctx->log_level = 0;
    st = dt_bench_comm(ctx, comm, &o, stdout);
    dt_cli_finish_ranks(ctx, comm, st);
    return dt_cli_exit_code(st);
}

int dt_cmd_bench(dt_ctx *ctx, int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "peak") == 0) return cmd_peak(ctx, argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "comm") == 0) return cmd_comm(ctx, argc - 1, argv + 1);
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    bench_flags fl = {3, 10, 0, 0.0};
    dt_status st = dt_cli_parse_run(ctx, "bench", argc, argv, &cfg, bench_flag, &fl);
    if (fl.help) {
        printf("usage: dtrain bench [--warmup-steps N] [--bench-steps N] [--peak GFLOPS] "
               "[--set KEY=VALUE ...]\n"
               "       dtrain bench peak [--threads N]\n"
               "       [mpirun -n N] dtrain bench comm [--min-bytes B] [--max-bytes B] (see --help)\n\n"
               "Without --peak the matmul peak is measured first (as by 'dtrain bench peak').\n\n");
        dt_cli_print_config_help();
        return DT_EXIT_OK;
    }
    if (st != DT_OK) return dt_cli_exit_code(st);
    double peak = fl.peak;
    const char *peak_src = "given by --peak";
    if (peak <= 0) {
        dt_peak pk;
        dt_bench_peak(&pk, 2048, 7);
        peak = pk.gflops;
        peak_src = "measured: oneDNN sgemm 2048^3 median";
    }
    dt_bench_result *r = malloc(sizeof *r);
    if (!r) return DT_EXIT_FAIL;
    dt_comm *comm;
    st = dt_comm_init(ctx, &comm);
    if (st != DT_OK) {
        free(r);
        return dt_cli_exit_code(st);
    }
    dt_cli_rank_setup(ctx, comm, &cfg);
    st = dt_cfg_apply_world(ctx, &cfg, dt_comm_size(comm, DT_GROUP_WORLD));
    if (st != DT_OK) {
        dt_cli_finish_ranks(ctx, comm, st);
        free(r);
        return dt_cli_exit_code(st);
    }
    st = dt_bench_train(ctx, &cfg.train, comm, fl.warmup, fl.steps, r);
    int rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    dt_cli_finish_ranks(ctx, comm, st);
    if (st != DT_OK || rank != 0) { /* only rank 0 prints tables */
        free(r);
        return dt_cli_exit_code(st);
    }
    const dt_train_cfg *c = &cfg.train;
    const dt_gpt2_config *m = &c->model;
    double tokens = (double)c->micro_batch * c->seq_len * c->accum;
    printf("# dtrain bench: %s (L=%d d=%d heads=%d vocab=%d, %.2fM params), batch %d x %d x %d "
           "accum per rank, fp32, %d rank(s) x %d threads, %s%s\n",
           c->preset[0] ? c->preset : "custom", m->n_layer, m->d_model, m->n_head, m->vocab,
           (double)r->n_params / 1e6, c->micro_batch, c->seq_len, c->accum, r->world, threads_now(),
           dt_strategy_name(c->parallel.strategy), c->parallel.overlap ? "" : " (no overlap)");
    printf("# peak %.1f GFLOP/s (%s)\n", peak, peak_src);
    printf("# MFU = (6 N + 12 L T d) * tokens/s / peak; N = non-embedding params + lm_head "
           "(V d); %.4g FLOP/token\n", r->flops_per_token);
    printf("# %-6s %-10s %-10s %-10s\n", "step", "time_ms", "tokens/s", "loss");
    for (int i = 0; i < r->steps; i++)
        printf("  %-6d %-10.1f %-10.1f %-10.6f\n", r->warmup + i + 1, r->step_s[i] * 1e3,
               tokens * r->world / r->step_s[i], (double)r->loss[i]);
    printf("# %-12s %-12s %-12s %-12s %-10s %-10s %-8s %-16s\n", "median_ms", "mean_ms",
           "min_ms", "max_ms", "tokens/s", "GFLOP/s", "MFU_%", "loss_hash");
    printf("  %-12.1f %-12.1f %-12.1f %-12.1f %-10.1f %-10.1f %-8.1f %016llx\n", r->median_s * 1e3,
           r->mean_s * 1e3, r->min_s * 1e3, r->max_s * 1e3, r->tokens_per_s, r->achieved_gflops,
           100.0 * r->achieved_gflops / peak, r->loss_hash);
    /* Breakdown per step, averaged over the timed steps. */
    double total = r->mean_s, accounted = 0;
    printf("# time breakdown per step (mean over %d steps)\n", r->steps);
    printf("# %-14s %-10s %-10s %-10s %-8s\n", "kernel", "fwd_ms", "bwd_ms", "total_ms", "%step");
    for (int k = 0; k < DT_OP_NKINDS; k++) {
        double f = r->prof.fwd[k] / r->steps, b = r->prof.bwd[k] / r->steps;
        accounted += f + b;
        printf("  %-14s %-10.1f %-10.1f %-10.1f %-8.1f\n", dt_op_kind_names[k], f * 1e3, b * 1e3,
               (f + b) * 1e3, 100 * (f + b) / total);
    }
    double opt = r->optim_s / r->steps, sync = r->sync_s / r->steps;
    accounted += opt + sync;
    printf("  %-14s %-10s %-10s %-10.1f %-8.1f\n", "optimizer", "-", "-", opt * 1e3, 100 * opt / total);
    printf("  %-14s %-10s %-10s %-10.1f %-8.1f\n", "grad_sync_wait", "-", "-", sync * 1e3, 100 * sync / total);
    printf("  %-14s %-10s %-10s %-10.1f %-8.1f\n", "other", "-", "-", (total - accounted) * 1e3,
           100 * (total - accounted) / total);
    if (r->world > 1)
        printf("# communication per step: %.1f ms in collectives, %.1f ms exposed (%.1f%% of the step), "
               "%.2f MB sent by rank 0\n",
               r->comm_total_s * 1e3, r->comm_exposed_s * 1e3, 100 * r->comm_exposed_s / r->mean_s,
               r->comm_bytes_step / 1e6);
    printf("# memory high-water (MiB):");
    for (int k = 0; k < DT_MEM_NKINDS; k++)
        printf(" %s %.1f%s", dt_mem_kind_name((dt_mem_kind)k), (double)r->mem_peak[k] / 1048576.0,
               k + 1 < DT_MEM_NKINDS ? "," : "\n");
    free(r);
    return DT_EXIT_OK;
}
