#include "train/replicas.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_io.h"
#include "core/log.h"
#include "ops/cpu/isa.h"

/* Every rank's word (8 bytes) into a new array of world words. */
static dt_status gather_in(dt_ctx *ctx, dt_comm *comm, dt_group g, uint64_t mine, uint64_t **out) {
    uint64_t *v = malloc((size_t)dt_comm_size(comm, g) * sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "replicas: out of memory");
    dt_status st = dt_comm_allgather_words(ctx, comm, g, &mine, 1, v);
    if (st != DT_OK) {
        free(v);
        return st;
    }
    *out = v;
    return DT_OK;
}
static dt_status gather(dt_ctx *ctx, dt_comm *comm, uint64_t mine, uint64_t **out) {
    return gather_in(ctx, comm, DT_GROUP_WORLD, mine, out);
}

dt_status dt_replicas_log_isa(dt_ctx *ctx, dt_comm *comm) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD);
    if (world == 1) return DT_OK;
    uint64_t *v;
    DT_CHECK(gather(ctx, comm, (uint64_t)dt_isa_active(), &v));
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
    /* the replicas are the data-parallel ranks (a tensor-parallel rank's shard differs from
     * its TP group's others by design); rank numbers below are the group's */
    dt_group g = dt_parallel_dp_group(par);
    int world = dt_comm_size(comm, g);
    if (world == 1) return DT_OK;
    uint64_t *v;
    DT_CHECK(gather_in(ctx, comm, g, h, &v));
    char bad[512];
    size_t n = 0;
    int nbad = 0;
    bad[0] = 0;
    for (int r = 1; r < world; r++) {
        if (v[r] == v[0]) continue;
        if (nbad++ < 16 && n + 16 < sizeof bad) n += (size_t)snprintf(bad + n, sizeof bad - n, "%s%d", n ? ", " : "", r);
    }
    uint64_t h0 = v[0];
    free(v);
    if (nbad > 0)
        return dt_fail(ctx, DT_ERR_NUMERIC, "parallel.check_replicas: at step %ld the parameters of rank(s) %s%s "
                       "differ from rank 0's (xxh3 %016llx): the replicas diverged", step, bad,
                       nbad > 16 ? ", ..." : "", (unsigned long long)h0);
    return DT_OK;
}
