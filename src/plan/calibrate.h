/* calibrate.h - a hardware catalog entry for the machine dtrain runs on, from its own
 * measurements (`dtrain plan --calibrate FILE`): the matmul peak and the GEMM efficiency a
 * training step reached (`dtrain bench --json`), and the node-local link from the alpha-beta
 * fit of the ordered all-reduce (`dtrain bench comm --fit`, decision 42). The file is a whole
 * catalog (accelerators, links, efficiency) that `dtrain plan --catalog FILE --hardware
 * cpu-calibrated` reads.
 *
 * The link: the fit says t = alpha + beta x S for an all-reduce of S bytes per rank over n
 * ranks of one node; the planner's ring model says t = 2 (n-1)/n S / B + 2 (n-1) a, so
 * B = 2 (n-1)/n / beta (the line at 64 MiB) and a = alpha / (2 (n-1)) (the line at 1 KiB). */
#ifndef DT_PLAN_CALIBRATE_H
#define DT_PLAN_CALIBRATE_H

#include "comm/comm_fit.h"
#include "core/status.h"

typedef struct dt_plan_cal {
    double peak_gflops;     /* dtrain's fp32 matmul peak of one rank (bench: peak_gflops) */
    double achieved_gflops; /* model FLOP/s one rank reached in training (bench: tflops_rank x 1e3) */
    double memory_bytes;    /* the node's memory */
    int ranks;              /* ranks that ran the benchmark: the devices of the node */
    const dt_comm_fit *fit; /* the ordered all-reduce lines of the comm fit (one node) */
    const char *source;     /* what was run, for the file's comments */
    int comm_ranks;         /* ranks of the comm fit (0: = ranks; a 1-rank calibration fits the
                               link on 2, which its 1-device plans never use) */
} dt_plan_cal;

/* The link bandwidth (GB/s) the fit implies at `bytes` per rank, and its latency (us). */
dt_status dt_plan_cal_link(dt_ctx *ctx, const dt_plan_cal *c, double bytes, double *bw_gbs, double *lat_us);
/* Writes the catalog file. */
dt_status dt_plan_cal_write(dt_ctx *ctx, const char *path, const dt_plan_cal *c);

#endif
