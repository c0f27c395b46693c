/* comm_bench.h - `dtrain bench comm`: collective bandwidth over a range of sizes, reported as
 * nccl-tests does (time, algbw, busbw), with the received data checked on every row.
 *
 *   DT_CHECK(dt_bench_comm(ctx, comm, &opts, stdout));   // every rank calls; rank 0 prints
 */
#ifndef DT_COMM_BENCH_H
#define DT_COMM_BENCH_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "comm/comm.h"

typedef struct dt_comm_bench_opts {
    size_t min_bytes, max_bytes; /* per-rank buffer sizes, doubled from min to max */
    int warmup, iters;
    cJSON *rows; /* (optional, rank 0) a JSON array: one {op, bytes, count, time_us, algbw_gbs,
                    busbw_gbs, wrong} object is appended per row */
} dt_comm_bench_opts;

/* busbw factors (nccl-tests): all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n,
 * broadcast 1; algbw = bytes / time with bytes = the all-reduce/broadcast buffer, or the
 * total (n x per-rank part) for reduce-scatter and all-gather. */
double dt_comm_busbw_factor(const char *op, int nranks);

/* Runs all-reduce (MPI's and dtrain's rank-ordered one), reduce-scatter, all-gather,
 * broadcast and a point-to-point ping-pong (ranks 0 and 1; row time = one message) at each size; rows go to `out` on rank 0. Fails if any row's data is wrong. */
dt_status dt_bench_comm(dt_ctx *ctx, dt_comm *c, const dt_comm_bench_opts *o, FILE *out);

#endif
