/* sweep.h - `dtrain bench --sweep`: the cartesian product of a few configuration axes, each
 * point benchmarked by a child process (`dtrain launch -n W -- bench ... --json FILE`, or
 * `dtrain bench` itself for W = 1), its JSON read back, then scaling efficiency against the
 * one-rank point with the same other values (DESIGN.md section 8).
 *
 *   dt_sweep sw = {0};
 *   DT_CHECK(dt_sweep_add_axis(ctx, &sw, "world=1,2"));
 *   DT_CHECK(dt_sweep_add_axis(ctx, &sw, "strategy=ddp,zero1"));
 *   for (int i = 0; i < dt_sweep_count(&sw); i++) { ... dt_sweep_point_args(&sw, i, ...) ... }
 */
#ifndef DT_SWEEP_H
#define DT_SWEEP_H

#include <cjson/cJSON.h>

#include "core/status.h"

#define DT_SWEEP_MAX_AXES 8
#define DT_SWEEP_MAX_VALUES 16

typedef struct dt_sweep_axis {
    char name[48];  /* as given: world, strategy, micro_batch, bucket_mb, batch, accum or section.key */
    char key[48];   /* configuration key ("" for world) */
    char values[DT_SWEEP_MAX_VALUES][48];
    int n;
} dt_sweep_axis;

typedef struct dt_sweep {
    dt_sweep_axis ax[DT_SWEEP_MAX_AXES];
    int nax;
} dt_sweep;

/* Adds "name=v1,v2,...". Short names: world (ranks), strategy (parallel.strategy),
 * micro_batch (training.micro_batch), bucket_mb (parallel.bucket_mb), batch (training.batch,
 * the global batch: strong scaling), accum (training.grad_accum); any "section.key" too. */
dt_status dt_sweep_add_axis(dt_ctx *ctx, dt_sweep *sw, const char *spec);
/* Number of points (product of the axes' value counts). */
int dt_sweep_count(const dt_sweep *sw);
/* Point i: its ranks (1 without a world axis), its id ("world2-strategyzero1") and, as a JSON
 * object, the value of each axis. */
int dt_sweep_world(const dt_sweep *sw, int i);
void dt_sweep_point_id(const dt_sweep *sw, int i, char *buf, size_t n);
cJSON *dt_sweep_point_json(const dt_sweep *sw, int i);
/* Appends "--set key=value" for each configuration axis of point i to argv (n in/out). */
void dt_sweep_point_args(const dt_sweep *sw, int i, char **argv, int *n, char (*store)[128]);

/* Runs argv (NULL-terminated; argv[0] a path) with stdout and stderr to log; *code = exit code
 * (128 + signal). */
dt_status dt_sweep_spawn(dt_ctx *ctx, char *const *argv, const char *log, int *code);

/* Fills each point's "sweep" object: weak_efficiency (per-rank batch fixed) or
 * strong_efficiency (parallel.fixed_global_batch) = tokens/s(W) / (W x tokens/s(1)) against the
 * point with world 1 and the same other axis values; null where there is none. */
void dt_sweep_efficiency(const dt_sweep *sw, cJSON **points, int n);

#endif
