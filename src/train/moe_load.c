/* The expert load of a mixture of experts (trainer_impl.h; ARCHITECTURE decision 86): each
 * layer's router choices per expert in a step, counted by the model (model.h moe_load) over
 * the step's forwards and summed over the ranks. And the router's totals summed over the CP
 * group (decision 89). */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

#include "train/trainer_impl.h"

size_t dt_moe_load_bytes(const dt_train_cfg *cfg) {
    return cfg->model.n_experts ? (size_t)cfg->model.n_layer * (size_t)cfg->model.n_experts * sizeof(int64_t) : 0;
}

dt_status dt_moe_load_init(dt_ctx *ctx, dt_trainer *tr) {
    const size_t n = dt_moe_load_bytes(&tr->cfg);
    if (!n) return DT_OK;
    DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, n, (void **)&tr->model.moe_load));
    return DT_OK;
}

void dt_moe_load_free(dt_trainer *tr) {
    if (tr->model.moe_load) dt_alloc_put(&tr->alloc, DT_MEM_OTHER, tr->model.moe_load, dt_moe_load_bytes(&tr->cfg));
    tr->model.moe_load = NULL;
}

void dt_moe_load_begin(dt_trainer *tr) {
    if (tr->model.moe_load) memset(tr->model.moe_load, 0, dt_moe_load_bytes(&tr->cfg));
}

double dt_moe_load_max_mean(const int64_t *load, int L, int E) {
    double worst = 0.0;
    for (int l = 0; l < L; l++) {
        const int64_t *x = load + (size_t)l * E;
        int64_t mx = 0, sum = 0;
        for (int e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx, sum += x[e];
        if (sum > 0 && (double)mx * E / (double)sum > worst) worst = (double)mx * E / (double)sum;
    }
    return worst;
}

dt_status dt_moe_load_finish(dt_ctx *ctx, dt_trainer *tr, dt_step_stats *out) {
    dt_model *m = &tr->model;
    out->moe_load = NULL, out->moe_layers = out->moe_experts = 0, out->moe_load_max_mean = 0.0;
    if (!m->moe_load) return DT_OK;
    const int L = m->cfg.n_layer, E = m->cfg.n_experts;
    /* Every rank of the world holds a data- (or context-) parallel rank's tokens of the layers
     * of its pipeline stage (expert parallelism routes on the source rank; a TP group's ranks
     * route alike and only shard 0's holder counts: decision 91), zero elsewhere: one sum over
     * the world is the step's load. */
    if (dt_comm_size(tr->comm, DT_GROUP_WORLD) > 1)
        DT_CHECK(dt_comm_allreduce(ctx, tr->comm, DT_GROUP_WORLD, m->moe_load, (size_t)L * E, DT_I64, DT_SUM));
    out->moe_load = m->moe_load, out->moe_layers = L, out->moe_experts = E;
    out->moe_load_max_mean = dt_moe_load_max_mean(m->moe_load, L, E);
    return DT_OK;
}

/* Each rank's values in its own slot, the others zero, so the all-reduce adds exact zeros; then
 * the slots are added in rank order (the same bits on every CP rank). */
int dt_moe_cp_sum(void *ud, double *x, size_t n) {
    dt_cp_link *c = ud;
    double *all = calloc((size_t)c->n * n, sizeof *all);
    if (!all) {
        dt_fail(&c->ctx, DT_ERR_NOMEM, "context parallelism: out of memory for the router totals");
        return 1;
    }
    memcpy(all + (size_t)c->rank * n, x, n * sizeof *x);
    double t0 = dt_now();
    dt_status st = dt_comm_allreduce(&c->ctx, c->comm, c->group, all, (size_t)c->n * n, DT_F64, DT_SUM);
    c->seconds += dt_now() - t0;
    c->bytes += (double)(c->n * n * sizeof *x);
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        double s = all[i];
        for (int q = 1; q < c->n; q++) s += all[(size_t)q * n + i];
        x[i] = s;
    }
    free(all);
    return st != DT_OK;
}
