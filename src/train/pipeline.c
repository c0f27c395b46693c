/* Pipeline parallelism's step on one stage (ARCHITECTURE decision 74).
 *
 * Each rank of a PP group is a stage holding consecutive layers (model.h dt_model_opts.pp_l0 /
 * pp_l1; the first stage embeds, the last runs the head and the loss; under the interleaved
 * schedule v chunks of them, chunk c of stage s being virtual stage c pp + s, the neighbours a
 * ring). A step runs this stage's action list (parallel/pp_schedule.h: gpipe, 1f1b,
 * interleaved or zb-h1, whose W passes replay a backward's deferred weight GEMMs: decision 79)
 * over the step's accum micro-batches:
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
 * non-blocking and overlap the next passes; a set's sends complete before the set is reused
 * (interleaved: every message leaves from its own copy, completed at the step's end). A head
 * tied to the embedding: the last stage's head gradients of the step go to the first stage
 * before its last backward, the reduced gradient back to the last stage's copy after the
 * data-parallel reduction (model.h tied_h; decision 74).
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

/* Message tags: activations and gradients for chunk c of the receiving stage (interleaved
 * stages exchange several chunks' messages in one direction: each chunk's arrive in
 * micro-batch order), a tied head's. */
enum { TAG_ACT = 1000, TAG_GRAD = 2000, TAG_TIED_HEAD = 3, TAG_TIED_GRAD = 4, TAG_XACT = 4000, TAG_XGRAD = 5000 };

dt_status dt_pp_cfg_stages(dt_ctx *ctx, dt_train_cfg *cfg) {
    const int pp = cfg->pp, L = cfg->model.n_layer;
    DT_CHECK(dt_pp_check_degree(ctx, pp, L)); /* a library caller's configuration too */
    const dt_model_family *f = dt_model_family_of(&cfg->model);
    if (!f || !f->stage_buf)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d: pipeline stages are not built for the %s family yet "
                       "(issue 32)", pp, f ? f->name : cfg->model.family);
    const int v = cfg->pp_virtual > 0 ? cfg->pp_virtual : 1;
    DT_CHECK(dt_pp_schedule_check(ctx, (dt_pp_kind)cfg->pp_kind, pp, v, cfg->accum));
    if (cfg->pp_kind == DT_PP_INTERLEAVED) {
        /* v chunks per stage of equal size (Megatron's rule), chunk c of stage s holding virtual
         * stage c pp + s; the first layers of the stages' chunk 0 in pp_first */
        if (v > 16)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_virtual=%d: at most 16 chunks per stage", v);
        if (L % (pp * v))
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_schedule=interleaved: parallel.pp x parallel.pp_virtual = "
                           "%d x %d must divide model.n_layer=%d (equal chunks)", pp, v, L);
        if (cfg->pp_first[pp] != 0 && cfg->pp_first[pp] != L / v) /* not these boundaries set before */
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers with parallel.pp_schedule=interleaved: the chunks are "
                           "equal (model.n_layer / (pp x pp_virtual) layers each); leave parallel.pp_layers unset");
        if (cfg->model_opts.recompute != DT_RECOMPUTE_NONE && cfg->model_opts.recompute_every > 1)
            return dt_fail(ctx, DT_ERR_CONFIG, "memory.activation_checkpointing_every=%d with parallel.pp_schedule="
                           "interleaved: every layer or none (1)", cfg->model_opts.recompute_every);
        for (int st = 0; st <= pp; st++) cfg->pp_first[st] = st * (L / (pp * v));
    }
    if (cfg->pp_blocks) { /* the test mode: one process, the stages' boundaries only */
        if (cfg->pp_first[pp] == 0) dt_pp_split(&cfg->model, cfg->seq_len, pp, cfg->pp_first);
        return DT_OK;
    }
    if (cfg->parallel.compression)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.compression with parallel.pp=%d: not built yet (issue 32)", pp);
    if (cfg->pp_kind == DT_PP_INTERLEAVED) return DT_OK; /* its chunks' boundaries, above */
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
    p->passes = dt_pp_passes(cfg);
    const dt_pp_kind k = (dt_pp_kind)cfg->pp_kind;
    const int v = k == DT_PP_INTERLEAVED ? cfg->pp_virtual : 1, m = cfg->accum;
    p->v = v;
    p->n_acts = dt_pp_schedule_len(k, p->n, v, m);
    p->acts = malloc((size_t)p->n_acts * sizeof *p->acts);
    p->slots = dt_pp_inflight(k, p->n, v, m, p->stage);
    if (p->slots < 1) p->slots = 1;
    p->slab = calloc((size_t)p->slots, sizeof *p->slab);
    p->busy = malloc((size_t)p->slots * sizeof *p->busy);
    p->out_req = calloc((size_t)p->slots, sizeof *p->out_req);
    p->in_req = calloc((size_t)p->slots, sizeof *p->in_req);
    p->out_xreq = calloc((size_t)p->slots, sizeof *p->out_xreq);
    p->in_xreq = calloc((size_t)p->slots, sizeof *p->in_xreq);
    p->nx = dt_model_stage_extra_floats(&tr->model.cfg);
    p->slot_of = malloc((size_t)m * v * sizeof *p->slot_of);
    p->bscale = calloc((size_t)m, sizeof *p->bscale);
    if (!p->acts || !p->slab || !p->busy || !p->out_req || !p->in_req || !p->out_xreq || !p->in_xreq || !p->slot_of ||
        !p->bscale)
        return dt_fail(ctx, DT_ERR_NOMEM, "pipeline: out of memory");
    if (v > 1) { /* the chunks after the first read micro-batch k after the data source moved on */
        DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, dt_pp_tokens_bytes(cfg), (void **)&p->tok));
        /* Interleaved stages send around a ring, and a stage can reuse an activation set while
         * its last message has not been received (its receiver waits on another stage): every
         * message of a step leaves from its own copy, so no send ever waits for a receive
         * before the step's end (the schedules are deadlock-free with such sends: decision 75). */
        p->pool_n = 2 * m * v * (p->nx ? 2 : 1); /* and the side values' */
        p->pool_req = calloc((size_t)p->pool_n, sizeof *p->pool_req);
        if (!p->pool_req) return dt_fail(ctx, DT_ERR_NOMEM, "pipeline: out of memory");
        DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_COMM, dt_pp_pool_bytes(cfg, dt_model_stage_floats(&tr->model)),
                              (void **)&p->pool));
    }
    if (dt_pp_schedule(k, p->n, v, m, p->stage, p->acts) != p->n_acts ||
        !dt_pp_schedule_valid(k, p->n, v, m, p->stage, p->acts, p->n_acts))
        return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: the %s schedule of stage %d is not valid", dt_pp_kind_name(k),
                       p->stage);
    /* an activation set per micro-batch in flight: the model's own, and slots - 1 more */
    p->slab[0] = tr->model.acts;
    for (int s = 1; s < p->slots; s++)
        DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_ACTS, tr->model.n_acts * sizeof(float), (void **)&p->slab[s]));
    for (int s = 0; s < p->slots; s++) p->busy[s] = -1;
    if (k == DT_PP_ZBH1) { /* each set's deferred weight GEMMs (model.h dt_wdefer) */
        p->defer = calloc((size_t)p->slots, sizeof *p->defer);
        if (!p->defer) return dt_fail(ctx, DT_ERR_NOMEM, "pipeline: out of memory");
        /* the douts go into activations the backward made dead, the rest into each set's
         * fallback (decision 81): one plan for every set */
        p->defer_floats = dt_model_defer_plan(&tr->model, NULL, &p->defer_items);
        DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, (size_t)p->defer_items * sizeof(dt_wdefer_place),
                              (void **)&p->defer_place));
        dt_model_defer_plan(&tr->model, p->defer_place, &p->defer_items);
        p->defer_gemms = dt_model_defer_gemms(&tr->model, p->defer_items);
        for (int s = 0; s < p->slots; s++) {
            p->defer[s].place = p->defer_place, p->defer[s].cap_douts = p->defer_items;
            p->defer[s].cap_items = p->defer_gemms;
            if (p->defer_floats)
                DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_ACTS, p->defer_floats * sizeof(float), (void **)&p->defer[s].buf));
            DT_CHECK(dt_alloc_get(ctx, &tr->alloc, DT_MEM_OTHER, (size_t)p->defer_gemms * sizeof(dt_wdefer_item),
                                  (void **)&p->defer[s].items));
        }
    }
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
    for (int s = 0; p->defer && s < p->slots; s++) {
        if (p->defer[s].buf) dt_alloc_put(&tr->alloc, DT_MEM_ACTS, p->defer[s].buf, p->defer_floats * sizeof(float));
        if (p->defer[s].items)
            dt_alloc_put(&tr->alloc, DT_MEM_OTHER, p->defer[s].items, (size_t)p->defer_gemms * sizeof(dt_wdefer_item));
    }
    if (p->defer_place)
        dt_alloc_put(&tr->alloc, DT_MEM_OTHER, p->defer_place, (size_t)p->defer_items * sizeof(dt_wdefer_place));
    p->defer_place = NULL;
    free(p->defer);
    p->defer = NULL;
    if (p->tok) dt_alloc_put(&tr->alloc, DT_MEM_OTHER, p->tok, dt_pp_tokens_bytes(&tr->cfg));
    if (p->pool) dt_alloc_put(&tr->alloc, DT_MEM_COMM, p->pool, dt_pp_pool_bytes(&tr->cfg, dt_model_stage_floats(&tr->model)));
    free(p->pool_req);
    p->tok = NULL, p->pool = NULL, p->pool_req = NULL;
    free(p->acts), free(p->slab), free(p->busy), free(p->out_req), free(p->in_req), free(p->slot_of), free(p->bscale);
    free(p->out_xreq), free(p->in_xreq);
    p->acts = NULL, p->slab = NULL, p->busy = NULL, p->out_req = p->in_req = NULL, p->slot_of = NULL, p->bscale = NULL;
    p->out_xreq = p->in_xreq = NULL;
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
    dt_trace_end(t0, "pp", "recv %s from stage %d",
                 tag >= TAG_GRAD ? "gradients" : tag >= TAG_ACT ? "activations" : "head gradients", peer);
    return st;
}

size_t dt_pp_pool_bytes(const dt_train_cfg *cfg, size_t stage_floats) {
    const size_t per = stage_floats + dt_model_stage_extra_floats(&cfg->model); /* and the side values */
    return 2 * (size_t)cfg->accum * (size_t)dt_pp_chunks(cfg) * per * sizeof(float);
}

size_t dt_pp_tokens_bytes(const dt_train_cfg *cfg) {
    return 2 * (size_t)cfg->accum * (size_t)cfg->micro_batch * (size_t)cfg->seq_len * sizeof(int32_t);
}

static dt_status send_to(dt_ctx *ctx, dt_trainer *tr, const float *buf, size_t n, int peer, int tag,
                         dt_comm_req **req) {
    dt_pp_link *p = &tr->pp;
    if (p->pool && req != &p->tied_req) { /* interleaved: from the message's own copy */
        if (p->pool_used >= p->pool_n) return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: more messages than a step sends");
        float *copy = p->pool + p->pool_off;
        dt_copy(copy, buf, n * sizeof(float));
        buf = copy, req = &p->pool_req[p->pool_used++], p->pool_off += n;
    }
    double t0 = dt_now();
    dt_status st = dt_comm_isend(ctx, tr->comm, tr->pp.group, buf, n * sizeof(float), peer, tag, req);
    tr->pp.seconds += dt_now() - t0;
    tr->pp.bytes += (double)n * sizeof(float);
    return st;
}

dt_status dt_pp_micro_steps(dt_ctx *ctx, dt_trainer *tr, const dt_micro *mi, double *loss_sum, double moe_sum[4],
                            dt_step_stats *out) {
    dt_pp_link *p = &tr->pp;
    dt_model *m = &tr->model;
    const int P = p->n, r = p->stage, M = tr->cfg.accum, v = p->v, V = P * v;
    const size_t nf = dt_model_stage_floats(m), bt = (size_t)m->B * m->T;
    const int prev = (r + P - 1) % P, next = (r + 1) % P; /* the neighbours (a ring when interleaved) */
    int next_b[16] = {0}, next_w = 0, pass = 0; /* backwards run in micro-batch order per chunk (the schedules' rule) */
    int bpass = 0; /* the B passes so far: expert parallelism's segments (train/ep.c) accumulate over them */
    for (int k = 0; k < M * v; k++) p->slot_of[k] = -1;
    *loss_sum = 0.0;
    out->pp_wgrad = 0.0;
    if (m->tied_h) dt_fill(m->tied_h, 0, p->tied_n * sizeof(float)); /* the step's head gradients */
    for (int i = 0; i < p->n_acts; i++) {
        const dt_pp_action a = p->acts[i];
        const int k = a.mb, c = a.chunk, vs = c * P + r; /* virtual stage vs = chunk c of stage r */
        const int first = vs == 0, last = vs == V - 1;
        if (a.op == DT_PP_F) {
            int s = 0;
            while (s < p->slots && p->busy[s] >= 0) s++;
            if (s == p->slots) return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: stage %d has no free activation set", r);
            DT_CHECK(wait_send(ctx, tr, &p->in_req[s])); /* the set's last gradient has left */
            DT_CHECK(wait_send(ctx, tr, &p->out_req[s]));
            DT_CHECK(wait_send(ctx, tr, &p->in_xreq[s]));
            DT_CHECK(wait_send(ctx, tr, &p->out_xreq[s]));
            p->busy[s] = k * v + c, p->slot_of[k * v + c] = s;
            if (v > 1) dt_model_set_chunk(m, c);
            dt_model_use_acts(m, p->slab[s]);
            double t0 = dt_now(), td = dt_trace_begin();
            int32_t *in, *tg;
            if (c == 0) { /* a chunk's forwards run in micro-batch order: chunk 0's fetch */
                DT_CHECK(dt_trainer_micro_batch(ctx, tr, mi, k, &in, &tg));
                if (v > 1) {
                    dt_copy(p->tok + 2 * (size_t)k * bt, in, bt * sizeof(int32_t));
                    dt_copy(p->tok + (2 * (size_t)k + 1) * bt, tg, bt * sizeof(int32_t));
                }
            } else {
                in = p->tok + 2 * (size_t)k * bt, tg = p->tok + (2 * (size_t)k + 1) * bt;
            }
            dt_trace_end(td, "data", "data %d", k);
            out->data_seconds += dt_now() - t0;
            if (!first) DT_CHECK(recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_IN), nf, prev, TAG_ACT + c));
            if (!first && p->nx) DT_CHECK(recv_from(ctx, tr, dt_model_stage_extra(m), p->nx, prev, TAG_XACT + c));
            t0 = dt_now(), td = dt_trace_begin();
            if (c == 0 && tr->slow_rank >= 0 && tr->slow_rank == dt_comm_rank(tr->comm, DT_GROUP_WORLD))
                usleep((useconds_t)tr->slow_ms * 1000);
            p->bscale[k] = dt_trainer_micro_scale(tr, mi, k);
            dt_trainer_micro_drop(tr, mi, k);
            float loss = 0.0f;
            DT_CHECK(dt_model_forward_train(ctx, m, in, tg, p->bscale[k], &loss));
            DT_CHECK(dt_trainer_tp_check(ctx, tr));
            if (v > 1) dt_trace_end(td, "fwd", "forward %d chunk %d", k, c);
            else dt_trace_end(td, "fwd", "forward %d", k);
            out->fwd_seconds += dt_now() - t0;
            moe_sum[3] += (double)m->moe_dropped; /* this stage's layers' */
            if (last) {
                *loss_sum += mi->masked ? (double)loss * dt_count_targets(tg, (int)bt) : (double)loss;
                moe_sum[0] += m->moe_ce, moe_sum[1] += m->moe_aux, moe_sum[2] += m->moe_z;
            } else {
                DT_CHECK(send_to(ctx, tr, dt_model_stage_buf(m, DT_STAGE_OUT), nf, next, TAG_ACT + (vs + 1) / P, &p->out_req[s]));
                if (p->nx) /* the router totals so far (moe.h) */
                    DT_CHECK(send_to(ctx, tr, dt_model_stage_extra(m), p->nx, next, TAG_XACT + (vs + 1) / P, &p->out_xreq[s]));
            }
        } else if (a.op == DT_PP_B) {
            const int s = p->slot_of[k * v + c];
            if (s < 0 || c >= 16 || k != next_b[c])
                return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: stage %d runs micro-batch %d's backward out of order", r, k);
            next_b[c]++;
            if (v > 1) dt_model_set_chunk(m, c);
            dt_model_use_acts(m, p->slab[s]);
            if (!last) DT_CHECK(recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_DOUT), nf, next, TAG_GRAD + c));
            /* zb-h1: the output sent is a dead span of the backward (decision 81); received by
             * now (the gradient answering it came), its request is completed before reuse */
            if (p->defer) DT_CHECK(wait_send(ctx, tr, &p->out_req[s]));
            if (!last && p->nx) { /* every layer's router totals, over this set's own (sent on) */
                DT_CHECK(wait_send(ctx, tr, &p->out_xreq[s]));
                DT_CHECK(recv_from(ctx, tr, dt_model_stage_extra(m), p->nx, next, TAG_XGRAD + c));
            }
            /* a tied head: the first stage adds the last stage's head gradients of the whole step
             * to the embedding's in the last backward (model.h tied_h) */
            if (m->tied_h && first && k == M - 1)
                DT_CHECK(recv_from(ctx, tr, m->tied_h, p->tied_n, P - 1, TAG_TIED_HEAD));
            double t0 = dt_now(), td = dt_trace_begin();
            m->has_targets = 1; /* the forward of this set kept its state */
            dt_trainer_micro_drop(tr, mi, k);
            /* the strategy's micro-steps are the backward passes (an interleaved stage's chunks
             * write disjoint gradients: the others' add zeros; so do zb-h1's B and W passes) */
            dt_parallel_begin_micro(tr->par, pass, pass == M * p->passes - 1);
            pass++;
            /* expert parallelism: the local experts' weight gradients of every source rank are
             * formed in B (never deferred to W: moe.c), into the step's segments by B pass, as
             * DDP's rule adds the passes (decision 89) */
            dt_ep_begin_micro(tr, bpass);
            m->tied_add = m->tied_h && first && k == M - 1;
            m->wdefer = p->defer ? &p->defer[s] : NULL; /* zb-h1: the weight GEMMs wait for W */
            dt_model_backward(m, p->bscale[k]);
            m->wdefer = NULL;
            m->tied_add = 0;
            DT_CHECK(dt_trainer_tp_check(ctx, tr));
            dt_parallel_end_micro(tr->par);
            dt_ep_end_micro(tr, bpass++);
            if (v > 1) dt_trace_end(td, "bwd", "backward %d chunk %d", k, c);
            else dt_trace_end(td, "bwd", "backward %d", k);
            out->bwd_seconds += dt_now() - t0;
            if (!first) DT_CHECK(send_to(ctx, tr, dt_model_stage_buf(m, DT_STAGE_DIN), nf, prev, TAG_GRAD + (vs - 1) / P, &p->in_req[s]));
            if (!first && p->nx)
                DT_CHECK(send_to(ctx, tr, dt_model_stage_extra(m), p->nx, prev, TAG_XGRAD + (vs - 1) / P, &p->in_xreq[s]));
            if (m->tied_h && last && k == M - 1) DT_CHECK(send_to(ctx, tr, m->tied_h, p->tied_n, 0, TAG_TIED_HEAD, &p->tied_req));
            if (!p->defer) p->busy[s] = -1; /* zb-h1: the set is held until its W */
        } else if (a.op == DT_PP_W && p->defer) {
            const int s = p->slot_of[k * v + c];
            if (s < 0 || k != next_w)
                return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: stage %d runs micro-batch %d's weight pass out of order", r, k);
            next_w++;
            dt_model_use_acts(m, p->slab[s]);
            double t0 = dt_now(), td = dt_trace_begin();
            dt_parallel_begin_micro(tr->par, pass, pass == M * p->passes - 1);
            pass++;
            dt_model_weight_pass(m, &p->defer[s]);
            DT_CHECK(dt_trainer_tp_check(ctx, tr)); /* sequence parallelism gathers inputs again */
            dt_parallel_end_micro(tr->par);
            dt_trace_end(td, "bwd", "weights %d", k);
            out->bwd_seconds += dt_now() - t0;
            out->pp_wgrad += dt_now() - t0;
            p->busy[s] = -1;
        } else {
            return dt_fail(ctx, DT_ERR_INTERNAL, "pipeline: a weight-gradient pass without zb-h1");
        }
    }
    for (int s = 0; s < p->slots; s++) {
        DT_CHECK(wait_send(ctx, tr, &p->out_req[s]));
        DT_CHECK(wait_send(ctx, tr, &p->in_req[s]));
        DT_CHECK(wait_send(ctx, tr, &p->out_xreq[s]));
        DT_CHECK(wait_send(ctx, tr, &p->in_xreq[s]));
    }
    for (int q = 0; q < p->pool_used; q++) DT_CHECK(wait_send(ctx, tr, &p->pool_req[q]));
    p->pool_used = 0, p->pool_off = 0;
    DT_CHECK(wait_send(ctx, tr, &p->tied_req));
    if (v > 1) dt_model_set_chunk(m, 0);
    dt_model_use_acts(m, p->slab[0]);
    return DT_OK;
}

dt_status dt_pp_share(dt_ctx *ctx, dt_trainer *tr, double *x, int n) {
    return dt_comm_broadcast(ctx, tr->comm, tr->pp.group, x, (size_t)n * sizeof *x, tr->pp.n - 1);
}

dt_status dt_pp_share_loss(dt_ctx *ctx, dt_trainer *tr, double *x) { return dt_pp_share(ctx, tr, x, 1); }

dt_status dt_pp_eval_xfer(dt_ctx *ctx, void *ud, int before, int c) {
    dt_trainer *tr = ud;
    dt_model *m = &tr->model;
    const size_t nf = dt_model_stage_floats(m);
    const int P = tr->pp.n, r = tr->pp.stage, vs = c * P + r;
    if (before) {
        if (tr->pp.v > 1) dt_model_set_chunk(m, c);
        if (vs > 0) DT_CHECK(recv_from(ctx, tr, dt_model_stage_buf(m, DT_STAGE_IN), nf, (r + P - 1) % P, TAG_ACT + c));
        if (vs > 0 && tr->pp.nx)
            DT_CHECK(recv_from(ctx, tr, dt_model_stage_extra(m), tr->pp.nx, (r + P - 1) % P, TAG_XACT + c));
        DT_CHECK(wait_send(ctx, tr, &tr->pp.out_xreq[0]));
        return wait_send(ctx, tr, &tr->pp.out_req[0]); /* the forward overwrites the last output sent */
    }
    if (vs == P * tr->pp.v - 1) return DT_OK;
    /* posted, and completed before this stage's next forward (after its next receive: so no
     * ring of stages can wait on each other's sends) */
    DT_CHECK(send_to(ctx, tr, dt_model_stage_buf(m, DT_STAGE_OUT), nf, (r + 1) % P, TAG_ACT + (vs + 1) / P,
                     &tr->pp.out_req[0]));
    if (!tr->pp.nx) return DT_OK;
    return send_to(ctx, tr, dt_model_stage_extra(m), tr->pp.nx, (r + 1) % P, TAG_XACT + (vs + 1) / P, &tr->pp.out_xreq[0]);
}

dt_status dt_pp_eval_done(dt_ctx *ctx, dt_trainer *tr) {
    DT_CHECK(wait_send(ctx, tr, &tr->pp.out_req[0]));
    DT_CHECK(wait_send(ctx, tr, &tr->pp.out_xreq[0]));
    if (tr->pp.v > 1) dt_model_set_chunk(&tr->model, 0);
    return DT_OK;
}

/* The sum of squares of grads [lo, hi) of the slab: the chunked sum (optim.h dt_sumsq) from lo. */
static double region_sumsq(const float *g, size_t lo, size_t hi) { return hi > lo ? dt_sumsq(g + lo, hi - lo) : 0.0; }

/* The norm's part of stage r (of P, v chunks each of the global ranges in cfg): the chunked
 * sums over each chunk's region, in chunk order, a region being the chunk's layers with the
 * PRE tensors before the model's first and the POST tensors after its last. `full`: regions of
 * the one (unsplit) slab of the blocks mode, else of the stage's own slab. */
static double stage_part(const dt_trainer *tr, const dt_params *ps, int r, int full) {
    const dt_train_cfg *cfg = &tr->cfg;
    const int inter = cfg->pp_kind == DT_PP_INTERLEAVED && cfg->pp_virtual > 1;
    const int P = cfg->pp, v = inter ? cfg->pp_virtual : 1, V = P * v;
    const size_t n = (size_t)(cfg->pp_first[r + 1] - cfg->pp_first[r]); /* layers per chunk */
    double part = 0.0;
    for (int c = 0; c < v; c++) {
        const int vs = c * P + r;
        size_t g0, g1; /* the chunk's layers, in the slab's layer blocks */
        if (full) g0 = (size_t)cfg->pp_first[r] + (size_t)c * (size_t)cfg->pp_first[P], g1 = g0 + n;
        else g0 = (size_t)c * n, g1 = g0 + n;
        const size_t lo = vs == 0 ? 0 : ps->layers_offset + g0 * ps->layer_floats;
        const size_t hi = vs == V - 1 ? ps->n_params : ps->layers_offset + g1 * ps->layer_floats;
        part += region_sumsq(ps->grads, lo, hi);
    }
    return part;
}

dt_status dt_pp_sumsq(dt_ctx *ctx, dt_trainer *tr, double *sumsq) {
    const dt_pp_link *p = &tr->pp;
    const dt_params *ps = &tr->model.ps;
    /* ddp without tensor parallelism: each stage's chunked sums over its chunks' regions of its
     * slab (a tied copy, before the layers of a stage that is not the first, left out: the
     * first stage counts the tensor); the blocks mode sums the same regions of its one slab.
     * Otherwise the strategy's sum of the stage's part. */
    const int plain = tr->cfg.parallel.strategy == DT_STRAT_DDP && dt_tp_size(&tr->model.opts) <= 1 && ps->grads;
    if (tr->cfg.pp_blocks) {
        if (!plain) return dt_parallel_grad_sumsq(ctx, tr->par, sumsq);
        double s = 0.0;
        for (int r = 0; r < tr->cfg.pp; r++) s += stage_part(tr, ps, r, 1);
        *sumsq = s;
        return DT_OK;
    }
    double mine;
    /* expert parallelism: the stage's dense regions and its EP ranks' experts, in EP rank
     * order (ep.c), the embedding before the first stage's layers, the tail after the last's */
    if (plain && tr->ep.n > 1) DT_CHECK(dt_ep_sumsq(ctx, tr, p->stage == 0, p->stage == p->n - 1, &mine));
    else if (plain) mine = stage_part(tr, ps, p->stage, 0);
    else DT_CHECK(dt_parallel_grad_sumsq(ctx, tr->par, &mine)); /* a tied copy's gradient is 0 here */
    double part[DT_PP_MAX] = {0};
    part[p->stage] = mine; /* one non-zero per slot: the sum is exact, then added in order */
    DT_CHECK(dt_comm_allreduce(ctx, tr->comm, p->group, part, (size_t)p->n, DT_F64, DT_SUM));
    double s = 0.0;
    for (int i = 0; i < p->n; i++) s += part[i];
    *sumsq = s;
    return DT_OK;
}

dt_status dt_pp_base_ids(dt_ctx *ctx, dt_trainer *tr, uint64_t *hash, uint64_t *fp) {
    const int P = tr->pp.n;
    uint64_t mine[2] = {*hash, *fp}, all[2 * DT_PP_MAX];
    DT_CHECK(dt_comm_allgather_words(ctx, tr->comm, tr->pp.group, mine, 2, all));
    uint64_t h = 1469598103934665603ULL, f = 0; /* FNV-1a over the stages' hashes, in stage order */
    int fp_none = 0;
    for (int s = 0; s < P; s++) {
        for (int b = 0; b < 8; b++) h = (h ^ ((all[2 * s] >> (8 * b)) & 0xff)) * 1099511628211ULL;
        f += all[2 * s + 1];
        fp_none |= all[2 * s + 1] == 0; /* an NF4 base: tp-bound, no fingerprint */
    }
    *hash = h;
    *fp = fp_none ? 0 : f ? f : 1;
    return DT_OK;
}

dt_status dt_pp_tied_grads(dt_ctx *ctx, dt_trainer *tr) {
    const dt_pp_link *p = &tr->pp;
    if (!p->tied || p->n <= 1) return DT_OK;
    /* the tensor's units (its vocabulary chunks) lie alike in both stores, so every strategy
     * holds the same piece of each on both stages (the whole unit, or the same ZeRO shard) */
    const dt_params *ps = &tr->model.ps;
    const int id = dt_model_tied_head(ps->tensors, ps->n_tensors), u0 = ps->tensors[id].unit;
    double t0 = dt_now();
    dt_status st = DT_OK;
    for (int u = u0; u < u0 + dt_params_chunks(ps, id) && st == DT_OK; u++) {
        size_t n;
        float *g = dt_parallel_unit_grad(tr->par, u, &n);
        if (!n) continue;
        st = p->stage == 0 ? dt_comm_send(ctx, tr->comm, p->group, g, n * sizeof(float), p->n - 1, TAG_TIED_GRAD)
                           : dt_comm_recv(ctx, tr->comm, p->group, g, n * sizeof(float), 0, TAG_TIED_GRAD);
        if (p->stage == 0) tr->pp.bytes += (double)n * sizeof(float);
    }
    tr->pp.seconds += dt_now() - t0;
    return st;
}
