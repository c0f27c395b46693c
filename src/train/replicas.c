#include "train/replicas.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_io.h"
#include "core/log.h"
#include "ops/cpu/isa.h"

/* One int64 slot per rank (0 elsewhere), combined with MAX: an all-gather over the
 * all-reduce the communicator has. Values must be >= 0. */
static dt_status gather_i64(dt_ctx *ctx, dt_comm *comm, int64_t mine, int per, int64_t **out) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    int64_t *v = calloc((size_t)world * (size_t)per, sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "replicas: out of memory");
    if (per == 1) {
        v[rank] = mine;
    } else { /* a 64-bit hash as two non-negative 32-bit halves */
        v[2 * rank] = (int64_t)((uint64_t)mine >> 32);
        v[2 * rank + 1] = (int64_t)((uint64_t)mine & 0xffffffffu);
    }
    dt_status st = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, v, (size_t)world * (size_t)per, DT_I64, DT_MAX);
    if (st != DT_OK) {
        free(v);
        return st;
    }
    *out = v;
    return DT_OK;
}

dt_status dt_replicas_log_isa(dt_ctx *ctx, dt_comm *comm) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD);
    if (world == 1) return DT_OK;
    int64_t *v;
    DT_CHECK(gather_i64(ctx, comm, (int64_t)dt_isa_active(), 1, &v));
    int same = 1;
    for (int r = 1; r < world; r++) same &= v[r] == v[0];
    if (!same && dt_comm_rank(comm, DT_GROUP_WORLD) == 0) {
        char line[1024];
        size_t n = 0;
        for (int r = 0; r < world && n + 48 < sizeof line; r++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%d %s", r ? ", " : "", r, dt_isa_name((dt_isa)v[r]));
        if (world > 0 && n + 48 >= sizeof line) snprintf(line + n, sizeof line - n, ", ...");
        dt_log_info(ctx, "kernel paths differ across ranks (rank %s): each rank's forward and backward round "
                    "differently, the all-reduced gradients and AdamW (same bits on every path) keep the "
                    "weights identical", line);
    }
    free(v);
    return DT_OK;
}

dt_status dt_replicas_check(dt_ctx *ctx, dt_comm *comm, dt_parallel *par, size_t n_params, long step,
                            uint64_t *hash) {
    float *full;
    DT_CHECK(dt_parallel_full_params(ctx, par, &full));
    uint64_t h = dt_xxh3(full, n_params * sizeof *full);
    dt_parallel_release_full_params(par, full);
    *hash = h;
    int world = dt_comm_size(comm, DT_GROUP_WORLD);
    if (world == 1) return DT_OK;
    int64_t *v;
    DT_CHECK(gather_i64(ctx, comm, (int64_t)h, 2, &v));
    char bad[512];
    size_t n = 0;
    int nbad = 0;
    bad[0] = 0;
    for (int r = 1; r < world; r++) {
        if (v[2 * r] == v[0] && v[2 * r + 1] == v[1]) continue;
        if (nbad++ < 16 && n + 16 < sizeof bad) n += (size_t)snprintf(bad + n, sizeof bad - n, "%s%d", n ? ", " : "", r);
    }
    uint64_t h0 = ((uint64_t)v[0] << 32) | (uint64_t)v[1];
    free(v);
    if (nbad > 0)
        return dt_fail(ctx, DT_ERR_NUMERIC, "parallel.check_replicas: at step %ld the parameters of rank(s) %s%s "
                       "differ from rank 0's (xxh3 %016llx): the replicas diverged", step, bad,
                       nbad > 16 ? ", ..." : "", (unsigned long long)h0);
    return DT_OK;
}
