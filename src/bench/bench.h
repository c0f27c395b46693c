/* bench.h - measuring dtrain: the matmul peak the MFU is relative to, and a training
 * benchmark (warm-up steps, timed steps, median step time, tokens/s, MFU, per-kernel
 * time breakdown).
 *
 *   dt_peak pk; dt_bench_peak(&pk, 2048, 5);
 *   dt_bench_result r; DT_CHECK(dt_bench_train(ctx, &cfg, warmup, steps, &r));
 */
#ifndef DT_BENCH_H
#define DT_BENCH_H

#include <stdio.h>

#include "comm/comm.h"
#include "model/gpt2.h"
#include "train/trainer.h"

typedef struct dt_peak {
    int n;          /* square matrix size */
    int reps;
    double gflops;  /* median over reps */
    double best;    /* best rep */
} dt_peak;

/* fp32 GEMM rate of oneDNN sgemm on n x n x n with the current OpenMP threads. */
void dt_bench_peak(dt_peak *out, int n, int reps);

#define DT_BENCH_MAX_STEPS 10000

typedef struct dt_bench_result {
    int warmup, steps;
    double step_s[DT_BENCH_MAX_STEPS]; /* timed steps */
    float loss[DT_BENCH_MAX_STEPS];
    double median_s, min_s, max_s, mean_s, std_s;
    double tokens_per_s;
    double flops_per_token;
    double achieved_gflops;
    dt_gpt2_prof prof;          /* summed over the timed steps */
    double optim_s;             /* clip + AdamW, summed over timed steps */
    double sync_s;              /* waiting for gradient reduction, summed over timed steps */
    size_t mem_peak[DT_MEM_NKINDS];
    size_t n_params;            /* without padding */
    unsigned long long loss_hash; /* FNV-1a of the timed losses' bits: a verification column */
    int world;                  /* ranks */
    double tokens_per_s_rank;   /* per rank */
    double comm_exposed_s, comm_total_s; /* per timed step (mean): waited for / spent in collectives */
    double comm_bytes_step;     /* bytes this rank sent into collectives per step */
} dt_bench_result;

/* Runs warmup + steps optimizer steps of cfg on the ranks of comm (NULL: one process) and
 * fills r; tokens/s counts all ranks. */
dt_status dt_bench_train(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, int warmup,
                         int steps, dt_bench_result *r);

/* Median of x[0..n) (sorts a copy). */
double dt_median(const double *x, int n);

#endif
