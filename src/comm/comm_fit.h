/* comm_fit.h - the alpha-beta cost model of dtrain's collectives: time = alpha + beta x bytes,
 * fitted per collective and per message-size range from `dtrain bench comm` rows, saved as
 * JSON (`dtrain bench comm --fit FILE`, docs/FORMATS.md kind "commfit") and read back to size
 * the gradient buckets (parallel.bucket_mb: auto with parallel.comm_model: FILE).
 *
 * The fit minimises the squared relative error (weights 1 / t^2), so microsecond rows count as
 * much as millisecond ones; alpha is kept >= 0 (a negative intercept is refitted through the
 * origin). Ranges: below DT_COMM_FIT_SPLIT (latency-bound), up to DT_COMM_FIT_SPLIT2 (the
 * buffers fit the caches), and beyond, each fitted on its own (one size: through the origin). `bytes` is the
 * row's nccl-tests size: the per-rank buffer of an all-reduce or broadcast, the whole of a
 * reduce-scatter or all-gather.
 *
 *   dt_comm_fit f; DT_CHECK(dt_comm_fit_rows(ctx, rows, ranks, nodes, &f));
 *   double us = dt_comm_fit_predict_us(dt_comm_fit_find(&f, "allreduce_ordered"), 4 << 20);
 */
#ifndef DT_COMM_FIT_H
#define DT_COMM_FIT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "core/status.h"

#define DT_COMM_FIT_SCHEMA "dtrain-commfit/1"
#define DT_COMM_FIT_SPLIT (256.0 * 1024.0)   /* below: latency-bound */
#define DT_COMM_FIT_SPLIT2 (8.0 * 1048576.0) /* from here: past the caches */
#define DT_COMM_FIT_MAX 96 /* 12 world ops, 5 node and 5 cross ops (bench comm), 3 size ranges each: 66 */

typedef struct dt_comm_fit_line {
    char op[32];
    char group[8];        /* the group it ran on: "world", "node" (inside one node) or "cross"
                             (one rank of each node): the link levels, fitted apart */
    double lo, hi;        /* the byte range [lo, hi] it was fitted on (the rows' sizes) */
    double alpha_us;      /* latency, microseconds */
    double beta_us_per_b; /* microseconds per byte */
    double max_rel_err;   /* worst |predicted - measured| / measured over its rows */
    int n;                /* rows fitted */
} dt_comm_fit_line;

typedef struct dt_comm_fit {
    int ranks, nodes;
    int n;
    dt_comm_fit_line line[DT_COMM_FIT_MAX];
} dt_comm_fit;

/* Fits every (group, op) of a bench comm rows array (objects with op, bytes, time_us and an
 * optional group, "world" when absent). */
dt_status dt_comm_fit_rows(dt_ctx *ctx, const cJSON *rows, int ranks, int nodes, dt_comm_fit *out);
/* The world line of op whose range holds `bytes` (the nearest range otherwise); NULL if op is
 * absent. dt_comm_fit_find_in: the same in a group ("world", "node", "cross"). */
const dt_comm_fit_line *dt_comm_fit_find(const dt_comm_fit *f, const char *op, double bytes);
const dt_comm_fit_line *dt_comm_fit_find_in(const dt_comm_fit *f, const char *group, const char *op, double bytes);
double dt_comm_fit_predict_us(const dt_comm_fit_line *l, double bytes);
/* Writes / reads the JSON file, refusing a bad one naming the file and key. */
dt_status dt_comm_fit_save(dt_ctx *ctx, const char *path, const dt_comm_fit *f);
dt_status dt_comm_fit_load(dt_ctx *ctx, const char *path, dt_comm_fit *f);
/* Gradient bucket bytes from the ordered all-reduce's fit: the smallest bucket whose latency
 * is at most 10% of its time (9 alpha / beta), within [1, 64] MiB. */
size_t dt_comm_fit_bucket_bytes(const dt_comm_fit *f);
/* parallel.allreduce: auto with a cost model: whether the hierarchical all-reduce is predicted
 * faster than the flat one for buckets of `bytes` (1), slower (0), or the model cannot tell
 * (-1: it lacks the allreduce_ordered_flat line, or it was fitted on another layout than
 * ranks x nodes). *hier_us and *flat_us get the predictions when it can. */
int dt_comm_fit_prefers_hier(const dt_comm_fit *f, int ranks, int nodes, double bytes, double *hier_us, double *flat_us);

#endif
