/* Expert parallelism in the trainer (trainer_impl.h; ARCHITECTURE decision 85): the EP group's
 * all-to-all for the model (model/llama/moe_ep.c), the experts' weight-gradient segments and
 * their reduction over the expert-data-parallel group, the gradient norm.
 *
 * Without expert parallelism, data-parallel rank r forms each expert's gradient g_r from its
 * own rows and DDP's ordered all-reduce sums ((g_0 + g_1) + g_2) + ... (comm.h). Under it the
 * expert's owner forms every g_r of its EP group's source ranks, each in its own segment and
 * bitwise what rank r forms alone (the same GEMM on the same rows), so the sum is rebuilt in
 * the same order: data-parallel rank d is EP rank d % ep of EDP rank d / ep (parallel/mesh.h:
 * an EP group is ep consecutive data-parallel ranks), and the EDP group's ranks add their
 * segments in turn down a chain - EDP rank 0 folds its segments, each next one adds its own
 * onto the partial sum it receives - and the last broadcasts the total.
 *
 * With 16-bit gradients (parallel.grad_dtype bf16/fp16; decision 87) DDP's all-reduce gives
 * t( ((w(t(g_0)) + w(t(g_1))) + w(t(g_2))) + ... ) (comm.h: each rank's contribution rounded to
 * t, the widened values summed in fp32 in rank order, the sum rounded once), so the chain does
 * the same: each segment is rounded to t before it is added, the fp32 partial sums travel down
 * the chain unrounded (they are DDP's fp32 accumulator), and the last rank rounds the total
 * once before it broadcasts.
 *
 * With tensor
 * parallelism (decision 91) all of this runs among the ranks at one TP rank, over the shards
 * they hold; only the gradient norm's parts cross TP ranks. */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "core/trace.h"
#include "model/llama/moe.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "train/trainer_impl.h"

static int ep_a2a(void *ud, const void *send, const size_t *sc, const size_t *sd, void *recv, const size_t *rc,
                  const size_t *rd, size_t esize) {
    dt_ep_link *e = ud;
    const double t0 = dt_now(), tr = dt_trace_begin();
    const dt_status st = dt_comm_alltoallv(&e->ctx, e->comm, e->group, send, sc, sd, recv, rc, rd, esize);
    e->seconds += dt_now() - t0; /* the compute thread waits for it: exposed */
    dt_trace_end(tr, "ep", "all-to-all of expert rows");
    if (st != DT_OK) return 1;
    for (int q = 0; q < e->n; q++)
        if (q != e->rank) e->bytes += (double)(sc[q] * esize);
    return 0;
}

/* Floats of the step's segments and of the two scratch buffers. */
static void sizes(const dt_train_cfg *cfg, const dt_model_opts *o, int dp, int store_layers, size_t *seg,
                  size_t *micro, size_t *fold) {
    const size_t one = dt_moe_ep_segment(&cfg->model, o, store_layers);
    *seg = (size_t)o->ep * one;
    *micro = cfg->accum > 1 ? *seg : 0;
    *fold = dp / o->ep > 1 ? one : 0;
}

void dt_ep_parallel_cfg(const dt_params *ps, const dt_model_config *c, const dt_model_opts *o, int dp, int dp_rank,
                        dt_parallel_cfg *pc) {
    if (!o || o->ep <= 1) return;
    pc->skip_off = dt_params_flat(ps, DT_LLAMA_MOE_W1(dt_moe_first(c, o)), 0) - ps->layers_offset;
    pc->skip_len = dt_moe_ep_segment(c, o, 1);
    pc->skip_ranks = dp / o->ep, pc->skip_rank = dp_rank / o->ep; /* the EDP group (parallel/mesh.h) */
}

void dt_ep_plan(const dt_train_cfg *cfg, const dt_model_opts *o, int dp, int store_layers, size_t bytes[DT_MEM_NKINDS]) {
    if (!o || o->ep <= 1) return;
    size_t seg, micro, fold;
    sizes(cfg, o, dp, store_layers, &seg, &micro, &fold);
    bytes[DT_MEM_GRADS] += (seg + micro) * sizeof(float);
    bytes[DT_MEM_COMM] += fold * sizeof(float);
}

dt_status dt_ep_init(dt_ctx *ctx, dt_trainer *tr) {
    dt_ep_link *e = &tr->ep;
    dt_model *m = &tr->model;
    if (e->n <= 1) return DT_OK;
    const dt_params *ps = &m->ps;
    e->seg_n = dt_moe_ep_segment(&m->cfg, &m->opts, ps->n_layer);
    e->off = dt_moe_ep_offset(m); /* the experts' weights, or under LoRA their adapters (decision 90) */
    e->len = e->seg_n / (size_t)ps->n_layer;
    size_t seg, micro, fold;
    sizes(&tr->cfg, &m->opts, dt_comm_size(tr->comm, tr->dp_group), ps->n_layer, &seg, &micro, &fold);
    /* LoRA without expert targets: the experts are frozen, nothing of theirs to reduce */
    if (seg) DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_GRADS, seg * sizeof(float), (void **)&e->seg));
    if (micro) DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_GRADS, micro * sizeof(float), (void **)&e->micro));
    if (fold) DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_COMM, fold * sizeof(float), (void **)&e->fold));
    e->comm = tr->comm;
    dt_ctx_init(&e->ctx);
    e->ctx.rank = ctx->rank, e->ctx.world = ctx->world;
    m->ep_ops = (dt_model_ep_ops){e, ep_a2a};
    m->ep_grads = e->seg;
    return DT_OK;
}

void dt_ep_free(dt_trainer *tr) {
    dt_ep_link *e = &tr->ep;
    if (e->n <= 1 || !e->seg_n) return;
    size_t seg, micro, fold;
    sizes(&tr->cfg, &tr->model.opts, e->edp_n * e->n, tr->model.ps.n_layer, &seg, &micro, &fold);
    dt_alloc_put(&tr->alloc, DT_MEM_GRADS, e->seg, seg * sizeof(float));
    dt_alloc_put(&tr->alloc, DT_MEM_GRADS, e->micro, micro * sizeof(float));
    dt_alloc_put(&tr->alloc, DT_MEM_COMM, e->fold, fold * sizeof(float));
    e->seg = e->micro = e->fold = NULL;
    e->seg_n = 0;
}

void dt_ep_begin_micro(dt_trainer *tr, int k) {
    dt_ep_link *e = &tr->ep;
    if (e->n <= 1 || !e->seg_n) return;
    /* micro-step 0 forms the step's segments directly, a later one a zeroed buffer added
     * afterwards (parallel.c dt_parallel_begin_micro's rule: the same bits as DDP's) */
    float *g = k == 0 ? e->seg : e->micro;
    dt_fill(g, 0, (size_t)e->n * e->seg_n * sizeof(float));
    tr->model.ep_grads = g;
}

void dt_ep_end_micro(dt_trainer *tr, int k) {
    dt_ep_link *e = &tr->ep;
    if (e->n <= 1 || k == 0 || !e->seg_n) return;
    dt_add_f32(e->seg, e->micro, (size_t)e->n * e->seg_n);
    tr->model.ep_grads = e->seg;
}

/* x <- w(t(x)) in place: comm.h's rounding of a contribution (t DT_BF16 or DT_F16; fp32: none). */
static void round_lp(dt_dtype t, float *x, size_t n) {
    if (t == DT_F32) return;
    enum { BLOCK = 512 };
    uint16_t h[BLOCK];
    for (size_t i = 0; i < n; i += BLOCK) {
        const size_t m = n - i < BLOCK ? n - i : BLOCK;
        dt_to_lowp(t, h, x + i, m);
        dt_from_lowp(t, x + i, h, m);
    }
}

dt_status dt_ep_reduce(dt_ctx *ctx, dt_trainer *tr) {
    dt_ep_link *e = &tr->ep;
    if (e->n <= 1 || !e->seg_n) return DT_OK;
    const size_t n = e->seg_n;
    const dt_dtype t = tr->cfg.parallel.grad_dtype; /* DT_F32, or the 16-bit type DDP rounds to */
    for (int s = 0; s < e->n; s++) round_lp(t, e->seg + (size_t)s * n, n); /* each data-parallel rank's g_d */
    float *acc = e->seg; /* EDP rank 0: its segments folded into segment 0 */
    if (e->edp_rank > 0) {
        acc = e->fold;
        DT_CHECK(dt_comm_recv(ctx, e->comm, e->edp, acc, n * sizeof(float), e->edp_rank - 1, 0));
        dt_add_f32(acc, e->seg, n);
    }
    for (int s = 1; s < e->n; s++) dt_add_f32(acc, e->seg + (size_t)s * n, n);
    if (e->edp_rank + 1 == e->edp_n) round_lp(t, acc, n); /* the total, rounded once */
    const int last = e->edp_n - 1;
    if (tr->cfg.parallel.strategy == DT_STRAT_DDP) { /* every EDP rank holds the whole experts */
        if (last > 0) {
            if (e->edp_rank < last) DT_CHECK(dt_comm_send(ctx, e->comm, e->edp, acc, n * sizeof(float), e->edp_rank + 1, 0));
            DT_CHECK(dt_comm_broadcast(ctx, e->comm, e->edp, acc, n * sizeof(float), last));
            e->bytes += (double)(n * sizeof(float));
        }
        dt_params *ps = &tr->model.ps;
        for (int l = 0; l < ps->n_layer; l++)
            dt_copy(ps->grads + ps->layers_offset + (size_t)l * ps->layer_floats + e->off, acc + (size_t)l * e->len,
                    e->len * sizeof(float));
        return DT_OK;
    }
    /* ZeRO (decision 88; fp32 gradients, no tp, pp or LoRA): down the chain, then each EDP rank its pieces */
    if (e->edp_rank < last) {
        DT_CHECK(dt_comm_send(ctx, e->comm, e->edp, acc, n * sizeof(float), e->edp_rank + 1, 0));
        e->bytes += (double)(n * sizeof(float));
    }
    if (last > 0 && e->edp_rank == last) {
        for (int q = 0; q < last; q++) {
            const size_t k = dt_parallel_expert_pack(tr->par, q, acc, e->seg); /* the segments are folded: free */
            DT_CHECK(dt_comm_send(ctx, e->comm, e->edp, e->seg, k * sizeof(float), q, 1));
            e->bytes += (double)(k * sizeof(float));
        }
    } else if (last > 0) {
        const size_t k = dt_parallel_expert_pack(tr->par, e->edp_rank, NULL, NULL);
        DT_CHECK(dt_comm_recv(ctx, e->comm, e->edp, e->fold, k * sizeof(float), last, 1)); /* sent: free */
        dt_parallel_expert_unpack(tr->par, e->fold);
        return DT_OK;
    }
    dt_parallel_expert_grads(tr->par, acc); /* my EDP pieces */
    return DT_OK;
}

/* With tensor parallelism (decision 91): the parts of parallel.c's tp_sumsq - each shard's,
 * tensor by tensor in store order, a replicated tensor in shard 0's - each split further by EP
 * rank (the dense tensors in EP rank 0's slot, each rank's experts in its own), every slot
 * alone in one all-reduce over the ranks holding one model (the EP group's TP groups), then
 * added shard by shard, EP rank by EP rank. */
static dt_status tp_sumsq(dt_ctx *ctx, dt_trainer *tr, double *out) {
    dt_ep_link *e = &tr->ep;
    const dt_model *m = &tr->model;
    const dt_params *ps = &m->ps;
    const int k = dt_tp_size(&m->opts), nb = dt_tp_local(&m->opts), first = dt_tp_first(&m->opts), P = e->n;
    double part[64 * DT_MOE_MAX_EXPERTS] = {0};
    if (k > 64) return dt_fail(ctx, DT_ERR_CONFIG, "parallel.tp: more than 64 shards");
    for (int j = 0; j < nb; j++)
        for (int id = 0; id < ps->n_tensors; id++) {
            const dt_tensor_info *t = &ps->tensors[id];
            if (dt_tensor_absent(t) || (!t->expert && e->rank != 0) || (!t->split && first + j != 0)) continue;
            const size_t len = t->split ? dt_tensor_shard_len(t) : t->rows * t->cols;
            for (int l = 0; l < dt_params_copies(ps, id); l++)
                part[(size_t)(first + j) * P + e->rank] +=
                    dt_sumsq(dt_params_tensor(ps, ps->grads, id, l) + (t->split ? (size_t)j * len : 0), len);
        }
    if (tr->mp_ranks > 1) DT_CHECK(dt_comm_allreduce(ctx, e->comm, tr->mp_group, part, (size_t)k * P, DT_F64, DT_SUM));
    double s = 0.0;
    for (int i = 0; i < k * P; i++) s += part[i];
    *out = s;
    return DT_OK;
}

dt_status dt_ep_sumsq(dt_ctx *ctx, dt_trainer *tr, int pre, int post, double *out) {
    dt_ep_link *e = &tr->ep;
    const dt_params *ps = &tr->model.ps;
    if (dt_tp_size(&tr->model.opts) > 1) return tp_sumsq(ctx, tr, out);
    const float *g = ps->grads;
    double part[DT_MOE_MAX_EXPERTS] = {0}, s = 0.0;
    /* the dense regions: before the layers, each layer's tensors around its experts, after */
    if (e->rank == 0) {
        if (pre) s += dt_sumsq(g, ps->layers_offset);
        for (int l = 0; l < ps->n_layer; l++) {
            const size_t b = ps->layers_offset + (size_t)l * ps->layer_floats;
            s += dt_sumsq(g + b, e->off);
            if (e->off + e->len < ps->layer_floats) s += dt_sumsq(g + b + e->off + e->len, ps->layer_floats - e->off - e->len);
        }
        const size_t end = ps->layers_offset + (size_t)ps->n_layer * ps->layer_floats;
        if (post && ps->n_params > end) s += dt_sumsq(g + end, ps->n_params - end);
    }
    for (int l = 0; l < ps->n_layer; l++)
        s += dt_sumsq(g + ps->layers_offset + (size_t)l * ps->layer_floats + e->off, e->len);
    part[e->rank] = s; /* one non-zero per slot: the sum is exact, then added in order */
    DT_CHECK(dt_comm_allreduce(ctx, e->comm, e->group, part, (size_t)e->n, DT_F64, DT_SUM));
    double t = 0.0;
    for (int r = 0; r < e->n; r++) t += part[r];
    *out = t;
    return DT_OK;
}
