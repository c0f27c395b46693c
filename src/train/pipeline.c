/* Pipeline parallelism's step on one stage (ARCHITECTURE decision 74).
 *
 * Each rank of a PP group is a stage holding consecutive layers (model.h dt_model_opts.pp_l0 /
 * pp_l1; the first stage embeds, the last runs the head and the loss). A step runs this
 * stage's action list (parallel/pp_schedule.h: gpipe or 1f1b) over the step's accum
 * micro-batches:
 *   F(k)  take a free activation set, point the model at it (dt_model_use_acts), fetch
 *         micro-batch k (every stage reads the same batches: the first needs the tokens, the
 *         last the targets), receive the previous stage's output into DT_STAGE_IN, run the
 *         forward, start sending DT_STAGE_OUT to the next stage;
 *   B(k)  point the model at k's set, receive the next stage's gradient into DT_STAGE_DOUT,
 *         run the backward between the strategy's begin/end of micro-step k, start sending
 *         DT_STAGE_DIN to the previous stage, free the set.
 * The schedules run every stage's backwards in micro-batch order 0..accum-1 (checked here with
 * dt_pp_schedule_valid), so the gradients accumulate in one rank's order: with the same
 * micro-batches a pipeline gives bitwise one rank's losses, gradients and weights.
 *
 * Transfers: activations and their gradients travel in fp32 (the residual stream's dtype),
 * from the model's own buffers, over the PP group's point-to-point (MPI; inside a node its
 * shared-memory transport), on the compute thread - never queued behind the data-parallel
 * lane's gradient buckets, which run on their own thread and group (decision 61). Sends are
 * non-blocking and overlap the next passes; a set's sends complete before the set is reused.
 * Receives block: the time spent in them is the stage's idle time (the bubble), and every
 * receive is a watched operation of the collective watchdog (comm.h), so a stage that stops
 * leaves its neighbour named in the records, waiting on it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"
#include "train/trainer_impl.h"

enum { TAG_ACT = 1, TAG_GRAD = 2, TAG_TIED_HEAD = 3, TAG_TIED_GRAD = 4 };

dt_status dt_pp_cfg_stages(dt_ctx *ctx, dt_train_cfg *cfg) {
    const int pp = cfg->pp, L = cfg->model.n_layer;
    if (pp > DT_PP_MAX)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d: at most %d pipeline stages", pp, DT_PP_MAX);
    if (pp > L)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d exceeds model.n_layer=%d (every stage holds a layer)", pp, L);
    const dt_model_family *f = dt_model_family_of(&cfg->model);
    if (cfg->model_opts.lora.rank > 0 || cfg->model_opts.lora.nf4)
        return dt_fail(ctx, DT_ERR_CONFIG, "lora.rank with parallel.pp=%d: LoRA under a pipeline is not built yet "
                       "(issue 32)", pp);
    if (cfg->pp_blocks) { /* the test mode: one process, the stages' boundaries only */
        if (cfg->pp_first[pp] == 0) dt_pp_split(&cfg->model, cfg->seq_len, pp, cfg->pp_first);
        return DT_OK;
    }
    if (!f || !f->stage_buf)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d: pipeline stages are not built for the %s family yet "
                       "(issue 32)", pp, f ? f->name : cfg->model.family);
    if (cfg->pp_kind != DT_PP_GPIPE && cfg->pp_kind != DT_PP_1F1B)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_schedule=%s is not built yet (gpipe and 1f1b run; issue 32)",
                       dt_pp_kind_name((dt_pp_kind)cfg->pp_kind));
    DT_CHECK(dt_pp_schedule_check(ctx, (dt_pp_kind)cfg->pp_kind, pp, cfg->pp_virtual > 0 ? cfg->pp_virtual : 1,
                                  cfg->accum));
    if (cfg->parallel.compression)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression with parallel.pp=%d: not built yet (issue 32)", pp);
    dt_tensor_info table[DT_MODEL_MAX_TENSORS];
    int nt = dt_model_tensors(&cfg->model, table);
    if (dt_model_tied_head(table, nt) >= 0 && cfg->parallel.strategy >= DT_STRAT_ZERO2)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.strategy=%s with parallel.pp=%d: a head tied to the embedding "
                       "over stages needs the full gradients of ddp or zero1 (ZeRO-2/3 with a tied head under a "
                       "pipeline is not built yet; model.untied_embeddings=1 runs every stage)",
                       dt_strategy_name(cfg->parallel.strategy), pp);
    if (cfg->pp_first[pp] == 0) { /* no parallel.pp_layers: the cost rule */
        dt_pp_split(&cfg->model, cfg->seq_len, pp, cfg->pp_first);
        return DT_OK;
    }
    if (cfg->pp_first[0] != 0 || cfg->pp_first[pp] != L)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers: the stages must cover layers 0..%d", L);
    for (int s = 0; s < pp; s++)
        if (cfg->pp_first[s + 1] <= cfg->pp_first[s])
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers: stage %d holds no layer", s);
    return DT_OK;
}

/* A head tied to the embedding held by this process (a pipeline's first and last stage, or
 * the blocks mode): its two gradients apart, in tied_h (model.h). */
static dt_status tied_init(dt_ctx *ctx, dt_trainer *tr) {
    dt_pp_link *p = &tr->pp;
    dt_model *m = &tr->model;
    const int id = dt_model_tied_head(m->ps.tensors, m->ps.n_tensors);
    if (m->lora || id < 0 || dt_tensor_absent(&m->ps.tensors[id])) return DT_OK;
    p->tied = 1;
    p->tied_n = m->ps.tensors[id].rows * m->ps.tensors[id].cols;
    p->tied_off = m->ps.tensors[id].offset;
    return dt_alloc_get(ctx, &tr->alloc, DT_MEM_GRADS, p->tied_n * sizeof(float), (void **)&m->tied_h);
}

size_t dt_pp_tied_floats(const dt_params *ps) {
    const int id = dt_model_tied_head(ps->tensors, ps->n_tensors);
    return id < 0 || dt_tensor_absent(&ps->tensors[id]) ? 0 : ps->tensors[id].rows * ps->tensors[id].cols;
}

dt_status dt_pp_init(dt_ctx *ctx, dt_trainer *tr) {
    dt_pp_link *p = &tr->pp;
    const dt_train_cfg *cfg = &tr->cfg;
    DT_CHECK(tied_init(ctx, tr));
    if (p->n <= 1) return DT_OK; /* the blocks mode */
    const dt_pp_kind k = (dt_pp_kind)cfg->pp_kind;
    const int v = cfg->pp_virtual > 0 ? cfg->pp_virtual : 1, m = cfg->accum;
    p->n_acts = dt_pp_schedule_len(k, p->n, v, m);
    p->acts = malloc((size_t)p->n_acts * sizeof *p->acts);
    p->slots = dt_pp_inflight(k, p->n, v, m, p->stage);
    if (p->slots < 1) p->slots = 1;
    p->slab = calloc((size_t)p->slots, sizeof *p->slab);
    p->busy = malloc((size_t)p->slots * sizeof *p->busy);
    p->out_req = calloc((size_t)p->slots, sizeof *p->out_req);
    p->in_req = calloc((size_t)p->slots, sizeof *p->in_req);
    p->slot_of = malloc((size_t)m * sizeof *p->slot_of);
    p->bscale = calloc((size_t)m, sizeof *p->bscale);
    if (!p->acts || !p->slab || !p->busy || !p->out_req || !p->in_req || !p->slot_of || !p->bscale)
        return dt_fail(ctx, DT_ERR_NOMEM, "pipeline: out of memory");
    if (dt_pp_schedule(k, p->n, v, m, p->stage, p->acts) != p->n_acts ||
        !dt_pp_schedule_valid(k, p->n, v, m, p->stage, p->acts, p->n_acts))
        return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: the %s schedule of stage %d is not valid", dt_pp_kind_name(k),
                       p->stage);
    /* an activation set per micro-batch in flight: the model's own, and slots - 1 more */
    p->slab[0] = tr->model.acts;
    for (int s = 1; s < p->slots; s++)
        DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_ACTS, tr->model.n_acts * sizeof(float), (void **)&p->slab[s]));
    for (int s = 0; s < p->slots; s++) p->busy[s] = -1;
    dt_trace_set_label("pp stage %d of %d", p->stage, p->n); /* the trace's row (decision 77) */
    return DT_OK;
}

void dt_pp_free(dt_trainer *tr) {
    dt_pp_link *p = &tr->pp;
    if (tr->model.tied_h) dt_alloc_put(&tr->alloc, DT_MEM_GRADS, tr->model.tied_h, p->tied_n * sizeof(float));
    tr->model.tied_h = NULL;
    for (int s = 1; p->slab && s < p->slots; s++)
        if (p->slab[s]) dt_alloc_put(&tr->alloc, DT_MEM_ACTS, p->slab[s], tr->model.n_acts * sizeof(float));
    if (p->slab && p->slab[0] && tr->model.acts != p->slab[0]) dt_model_use_acts(&tr->model, p->slab[0]);
    free(p->acts), free(p->slab), free(p->busy), free(p->out_req), free(p->in_req), free(p->slot_of), free(p->bscale);
    p->acts = NULL, p->slab = NULL, p->busy = NULL, p->out_req = p->in_req = NULL, p->slot_of = NULL, p->bscale = NULL;
}

/* Completes a send in flight (NULL: none). */
static dt_status wait_send(dt_ctx *ctx, dt_trainer *tr, dt_comm_req **req) {
    if (!*req) return DT_OK;
    double t0 = dt_now();
    dt_status st = dt_comm_wait(ctx, tr->comm, *req);
    *req = NULL;
    tr->pp.seconds += dt_now() - t0;
    return st;
}

/* Receives n floats from stage `peer` (blocking: the stage's idle time). */
static dt_status recv_from(dt_ctx *ctx, dt_trainer *tr, float *buf, size_t n, int peer, int tag) {
    double t0 = dt_trace_begin(), w0 = dt_now();
    dt_status st = dt_comm_recv(ctx, tr->comm, tr->pp.group, buf, n * sizeof(float), peer, tag);
    double dt = dt_now() - w0;
    tr->pp.seconds += dt, tr->pp.idle += dt;
    dt_trace_end(t0, "pp", "recv %s from stage %d", tag == TAG_ACT ? "activations" : "gradients", peer);
    return st;
}

static dt_status send_to(dt_ctx *ctx, dt_trainer *tr, const float *buf, size_t n, int peer, int tag,
                         dt_comm_req **req) {
    double t0 = dt_now();
    dt_status st = dt_comm_isend(ctx, tr->comm, tr->pp.group, buf, n * sizeof(float), peer, tag, req);
    tr->pp.seconds += dt_now() - t0;
    tr->pp.bytes += (double)n * sizeof(float);
    return st;
}

dt_status dt_pp_micro_steps(dt_ctx *ctx, dt_trainer *tr, const dt_micro *mi, double *loss_sum, dt_step_stats *out) {
    dt_pp_link *p = &tr->pp;
    dt_model *m = &tr->model;
    const int first = p->stage == 0, last = p->stage == p->n - 1, M = tr->cfg.accum;
    const size_t nf = dt_model_stage_floats(m), bt = (size_t)m->B * m->T;
    int next_b = 0; /* backwards run in micro-batch order (the schedules' rule) */
    for (int k = 0; k < M; k++) p->slot_of[k] = -1;
    *loss_sum = 0.0;
    if (m->tied_h) dt_fill(m->tied_h, 0, p->tied_n * sizeof(float)); /* the step's head gradients */
    for (int i = 0; i < p->n_acts; i++) {
        const dt_pp_action a = p->acts[i];
        const int k = a.mb;
        if (a.op == DT_PP_F) {
            int s = 0;
            while (s < p->slots && p->busy[s] >= 0) s++;
            if (s == p->slots) return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: stage %d has no free activation set", p->stage);
            DT_CHECK(wait_send(ctx, tr, &p->in_req[s])); /* the set's last gradient has left */
            DT_CHECK(wait_send(ctx, tr, &p->out_req[s]));
            p->busy[s] = k, p->slot_of[k] = s;
            dt_model_use_acts(m, p->slab[s]);
            double t0 = dt_now(), td = dt_trace_begin();
            int32_t *in, *tg;
            DT_CHECK(dt_trainer_micro_batch(ctx, tr, mi, k, &in, &tg));
            dt_trace_end(td, "data", "data %d", k);
            out->data_seconds += dt_now() - t0;
            if (!first) DT_CHECK(recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_IN), nf, p->stage - 1, TAG_ACT));
            t0 = dt_now(), td = dt_trace_begin();
            if (tr->slow_rank >= 0 && tr->slow_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD))
                usleep((useconds_t)tr->slow_ms * 1000);
            p->bscale[k] = dt_trainer_micro_scale(tr, mi, k);
            dt_trainer_micro_drop(tr, mi, k);
            float loss = 0.0f;
            DT_CHECK(dt_model_forward_train(ctx, m, in, tg, p->bscale[k], &loss));
            if (m->tp_failed) return dt_fail(ctx, DT_ERR_BACKEND, "tensor parallelism: a collective of the TP group failed: %s", tr->tp.ctx.err);
            dt_trace_end(td, "fwd", "forward %d", k);
            out->fwd_seconds += dt_now() - t0;
            if (last) *loss_sum += mi->masked ? (double)loss * dt_count_targets(tg, (int)bt) : (double)loss;
            else DT_CHECK(send_to(ctx, tr, dt_model_stage_buf(m, DT_STAGE_OUT), nf, p->stage + 1, TAG_ACT, &p->out_req[s]));
        } else if (a.op == DT_PP_B) {
            const int s = p->slot_of[k];
            if (s < 0 || k != next_b)
                return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: stage %d runs micro-batch %d's backward out of order", p->stage, k);
            next_b++;
            dt_model_use_acts(m, p->slab[s]);
            if (!last) DT_CHECK(recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_DOUT), nf, p->stage + 1, TAG_GRAD));
            /* a tied head: the first stage adds the last stage's head gradients of the whole step
             * to the embedding's in the last backward (model.h tied_h) */
            if (m->tied_h && first && k == M - 1)
                DT_CHECK(recv_from(ctx, tr, m->tied_h, p->tied_n, p->n - 1, TAG_TIED_HEAD));
            double t0 = dt_now(), td = dt_trace_begin();
            m->has_targets = 1; /* the forward of this set kept its state */
            dt_trainer_micro_drop(tr, mi, k);
            dt_parallel_begin_micro(tr->par, k, k == M - 1);
            m->tied_add = m->tied_h && first && k == M - 1;
            dt_model_backward(m, p->bscale[k]);
            m->tied_add = 0;
            if (m->tp_failed) return dt_fail(ctx, DT_ERR_BACKEND, "tensor parallelism: a collective of the TP group failed: %s", tr->tp.ctx.err);
            dt_parallel_end_micro(tr->par);
            dt_trace_end(td, "bwd", "backward %d", k);
            out->bwd_seconds += dt_now() - t0;
            if (!first) DT_CHECK(send_to(ctx, tr, dt_model_stage_buf(m, DT_STAGE_DIN), nf, p->stage - 1, TAG_GRAD, &p->in_req[s]));
            if (m->tied_h && last && k == M - 1) DT_CHECK(send_to(ctx, tr, m->tied_h, p->tied_n, 0, TAG_TIED_HEAD, &p->tied_req));
            p->busy[s] = -1;
        } else {
            return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: a weight-gradient pass without zb-h1");
        }
    }
    for (int s = 0; s < p->slots; s++) {
        DT_CHECK(wait_send(ctx, tr, &p->out_req[s]));
        DT_CHECK(wait_send(ctx, tr, &p->in_req[s]));
    }
    DT_CHECK(wait_send(ctx, tr, &p->tied_req));
    dt_model_use_acts(m, p->slab[0]);
    return DT_OK;
}

dt_status dt_pp_share(dt_ctx *ctx, dt_trainer *tr, double *x, int n) {
    return dt_comm_broadcast(ctx, tr->comm, tr->pp.group, x, (size_t)n * sizeof *x, tr->pp.n - 1);
}

dt_status dt_pp_share_loss(dt_ctx *ctx, dt_trainer *tr, double *x) { return dt_pp_share(ctx, tr, x, 1); }

dt_status dt_pp_eval_xfer(dt_ctx *ctx, void *ud, int before) {
    dt_trainer *tr = ud;
    dt_model *m = &tr->model;
    const size_t nf = dt_model_stage_floats(m);
    const int s = tr->pp.stage;
    if (before) return s > 0 ? recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_IN), nf, s - 1, TAG_ACT) : DT_OK;
    if (s == tr->pp.n - 1) return DT_OK;
    double t0 = dt_now(); /* blocking: the next stage receives in the same order */
    dt_status st = dt_comm_send(ctx, tr->comm, tr->pp.group, dt_model_stage_buf(m, DT_STAGE_OUT), nf * sizeof(float),
                                s + 1, TAG_ACT);
    tr->pp.seconds += dt_now() - t0;
    tr->pp.bytes += (double)nf * sizeof(float);
    return st;
}

/* The sum of squares of grads [lo, hi) of the slab: the chunked sum (optim.h dt_sumsq) from lo. */
static double region_sumsq(const float *g, size_t lo, size_t hi) { return hi > lo ? dt_sumsq(g + lo, hi - lo) : 0.0; }

dt_status dt_pp_sumsq(dt_ctx *ctx, dt_trainer *tr, double *sumsq) {
    const dt_pp_link *p = &tr->pp;
    const dt_params *ps = &tr->model.ps;
    /* ddp without tensor parallelism: each stage's chunked sum over its own slab (a tied copy,
     * at the slab's start, left out: the first stage counts the tensor); the blocks mode sums
     * the same regions of its one slab. Otherwise the strategy's sum of the stage's part. */
    const int plain = tr->cfg.parallel.strategy == DT_STRAT_DDP && dt_tp_size(&tr->model.opts) <= 1 && ps->grads;
    if (tr->cfg.pp_blocks) {
        if (!plain) return dt_parallel_grad_sumsq(ctx, tr->par, sumsq);
        const int P = tr->cfg.pp;
        double s = 0.0;
        for (int st = 0; st < P; st++) {
            size_t lo = st == 0 ? 0 : ps->layers_offset + (size_t)tr->cfg.pp_first[st] * ps->layer_floats;
            size_t hi = st == P - 1 ? ps->n_params : ps->layers_offset + (size_t)tr->cfg.pp_first[st + 1] * ps->layer_floats;
            s += region_sumsq(ps->grads, lo, hi);
        }
        *sumsq = s;
        return DT_OK;
    }
    double mine;
    if (plain) {
        const size_t skip = p->tied && p->stage > 0 ? p->tied_off + p->tied_n : 0; /* the copy: PRE, first */
        mine = region_sumsq(ps->grads, skip, ps->n_params);
    } else {
        DT_CHECK(dt_parallel_grad_sumsq(ctx, tr->par, &mine)); /* a tied copy's gradient is 0 here */
    }
    double part[DT_PP_MAX] = {0};
    part[p->stage] = mine; /* one non-zero per slot: the sum is exact, then added in order */
    DT_CHECK(dt_comm_allreduce(ctx, tr->comm, p->group, part, (size_t)p->n, DT_F64, DT_SUM));
    double s = 0.0;
    for (int i = 0; i < p->n; i++) s += part[i];
    *sumsq = s;
    return DT_OK;
}

dt_status dt_pp_tied_grads(dt_ctx *ctx, dt_trainer *tr) {
    const dt_pp_link *p = &tr->pp;
    if (!p->tied || p->n <= 1) return DT_OK;
    float *g = tr->model.ps.grads + p->tied_off; /* ddp, zero1: the reduced gradients in full */
    double t0 = dt_now();
    dt_status st = p->stage == 0 ? dt_comm_send(ctx, tr->comm, p->group, g, p->tied_n * sizeof(float), p->n - 1, TAG_TIED_GRAD)
                                 : dt_comm_recv(ctx, tr->comm, p->group, g, p->tied_n * sizeof(float), 0, TAG_TIED_GRAD);
    tr->pp.seconds += dt_now() - t0;
    if (p->stage == 0) tr->pp.bytes += (double)p->tied_n * sizeof(float);
    return st;
}
