/* Checkpoints of a tensor-, pipeline- or expert-parallel run in the canonical index space
 * (tp_ckpt.h). */
#include "train/tp_ckpt.h"

#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "parallel/mesh.h"

/* The layout (no slabs) of the store a process holding o's shards has: the family's tensors,
 * or under LoRA the adapters (decision 69: cut like their base). */
static dt_status store_layout(dt_ctx *ctx, dt_tp_ckpt *c, const dt_model *m, const dt_model_config *cfg,
                              const dt_model_opts *o, dt_params *ps) {
    if (m->lora) return dt_lora_adapters_init(ctx, ps, cfg, o, &c->alloc, 0);
    dt_tensor_info table[DT_MODEL_MAX_TENSORS];
    int nt = dt_model_tensors_tp(cfg, o, table);
    DT_CHECK(dt_model_stage_table(ctx, cfg, o, table, nt)); /* a pipeline stage's tensors */
    DT_CHECK(dt_params_init(ctx, ps, table, nt, dt_stage_chunks(o) * dt_stage_layers(cfg, o), &c->alloc, 0));
    ps->layer0 = dt_store_g0(o);
    if (dt_stage_chunks(o) > 1) ps->lchunk = dt_stage_layers(cfg, o), ps->lstride = o->pp_stride;
    return DT_OK;
}

/* The runs into canon of model-parallel rank i's store: TP rank i % tp (of tp ranks holding a
 * shard each; tp = 1: every shard, the blocks mode, or none split) on stage i / tp. */
static dt_status rank_runs(dt_ctx *ctx, dt_tp_ckpt *c, const dt_trainer *tr, int i, dt_canon_run **out, size_t *n,
                           size_t *len) {
    const dt_model *m = &tr->model;
    dt_model_opts o = m->opts;
    if (o.ep > 1) o.ep_rank = i / c->tp_ranks; /* expert parallelism: the EP group (pp = 1), each EP rank's TP group */
    if (c->tp_ranks > 1) o.tp_local = 1, o.tp_first = i % c->tp_ranks;
    if (tr->pp.n > 1) {
        const int p = i / c->tp_ranks;
        o.pp_l0 = tr->cfg.pp_first[p], o.pp_l1 = tr->cfg.pp_first[p + 1], o.pp_c = 0; /* its chunk 0 */
    }
    dt_params ps;
    DT_CHECK(store_layout(ctx, c, m, &m->cfg, &o, &ps));
    *len = ps.n_params;
    dt_status st = dt_params_canon_runs(ctx, &ps, &c->canon, out, n);
    dt_params_free(&ps);
    return st;
}

dt_status dt_tp_ckpt_init(dt_ctx *ctx, dt_tp_ckpt *c, const dt_trainer *tr) {
    memset(c, 0, sizeof *c);
    const dt_model *m = &tr->model;
    c->on = dt_tp_size(&m->opts) > 1 || tr->pp.n > 1 || m->opts.ep > 1;
    c->live = 1;
    dt_alloc_init(&c->alloc);
    dt_model_config cc = tr->cfg.model; /* the unsplit model: its own vocabulary padding */
    DT_CHECK(dt_model_config_validate(ctx, &cc));
    dt_model_opts o1 = m->opts; /* no tensor parallelism, no pipeline */
    o1.tp = o1.tp_local = o1.tp_first = o1.sp = 0;
    o1.pp_l0 = o1.pp_l1 = 0;
    o1.ep = o1.ep_rank = 0; /* every expert */
    DT_CHECK(store_layout(ctx, c, m, &cc, &o1, &c->canon));
    c->view.fam = m->fam;
    c->view.cfg = cc;
    c->view.ps = c->canon;
    c->view.B = m->B, c->view.T = m->T;
    c->view.opts.compute = m->opts.compute;
    c->n_local = m->ps.n_params;
    dt_status st = dt_params_canon_runs(ctx, &m->ps, &c->canon, &c->runs, &c->nruns);
    /* the model-parallel group: the TP ranks of every stage (one model between them) */
    c->tp_ranks = c->on && tr->cfg.parallel.tp > 1 ? tr->cfg.parallel.tp : 1;
    c->ranks = c->on && tr->mp_ranks > 1 ? tr->mp_ranks : 1;
    c->comm = tr->comm;
    c->group = tr->mp_group;
    c->me = c->ranks > 1 ? dt_comm_rank(tr->comm, c->group) : 0;
    c->tp_me = c->me % c->tp_ranks;
    if (st == DT_OK && c->ranks > 1) {
        c->peer = calloc((size_t)c->ranks, sizeof *c->peer);
        c->npeer = calloc((size_t)c->ranks, sizeof *c->npeer);
        c->nlen = calloc((size_t)c->ranks, sizeof *c->nlen);
        if (!c->peer || !c->npeer || !c->nlen) st = dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
        for (int t = 0; t < c->ranks && st == DT_OK; t++)
            st = rank_runs(ctx, c, tr, t, &c->peer[t], &c->npeer[t], &c->nlen[t]);
    }
    if (st != DT_OK) dt_tp_ckpt_free(c);
    return st;
}

void dt_tp_ckpt_free(dt_tp_ckpt *c) {
    if (!c->live) return;
    for (int t = 0; c->peer && t < c->ranks; t++) free(c->peer[t]);
    free(c->peer);
    free(c->npeer);
    free(c->nlen);
    free(c->runs);
    dt_params_free(&c->canon);
    memset(c, 0, sizeof *c);
}

/* The first run that ends after flat index g. */
static size_t first_run(const dt_canon_run *r, size_t n, size_t g) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid].local + r[mid].n <= g) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

dt_status dt_tp_ckpt_pieces(dt_ctx *ctx, const dt_tp_ckpt *c, const dt_shard_piece *in, int n, int save,
                            dt_shard_piece **out, int *nout) {
    size_t cnt = 0, cap = 64;
    dt_shard_piece *p = malloc(cap * sizeof *p);
    if (!p) return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < n; i++)
        for (size_t k = first_run(c->runs, c->nruns, in[i].global); k < c->nruns; k++) {
            const dt_canon_run *r = &c->runs[k];
            size_t a = r->local > in[i].global ? r->local : in[i].global;
            size_t z = r->local + r->n < in[i].global + in[i].n ? r->local + r->n : in[i].global + in[i].n;
            if (r->local >= in[i].global + in[i].n) break;
            if (a >= z || (save && r->replicated && c->tp_me != 0)) continue;
            if (cnt == cap) {
                dt_shard_piece *g = realloc(p, 2 * cap * sizeof *p);
                if (!g) {
                    free(p);
                    return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
                }
                p = g, cap *= 2;
            }
            p[cnt++] = (dt_shard_piece){r->canon + (a - r->local), in[i].local + (a - in[i].global), z - a};
        }
    if (cnt > 0x7fffffff) {
        free(p);
        return dt_fail(ctx, DT_ERR_INTERNAL, "checkpoint: too many pieces");
    }
    *out = p;
    *nout = (int)cnt;
    return DT_OK;
}

static void place(float *canon, const float *local, const dt_canon_run *r, size_t n) {
    for (size_t k = 0; k < n; k++) memcpy(canon + r[k].canon, local + r[k].local, r[k].n * sizeof(float));
}

dt_status dt_tp_ckpt_gather(dt_ctx *ctx, const dt_tp_ckpt *c, const float *local, float **canon) {
    float *out = calloc(c->canon.n_params, sizeof *out);
    if (!out) return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory for the canonical parameters");
    if (c->ranks <= 1) { /* one process holds every shard */
        place(out, local, c->runs, c->nruns);
        *canon = out;
        return DT_OK;
    }
    size_t total = 0;
    for (int t = 0; t < c->ranks; t++) total += c->nlen[t];
    float *all = malloc(total * sizeof *all);
    size_t *cnt = malloc(2 * (size_t)c->ranks * sizeof *cnt);
    if (!all || !cnt) {
        free(out), free(all), free(cnt);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory for the model-parallel group's parameters");
    }
    for (int t = 0; t < c->ranks; t++)
        cnt[t] = c->nlen[t], cnt[c->ranks + t] = t ? cnt[c->ranks + t - 1] + c->nlen[t - 1] : 0;
    memcpy(all + cnt[c->ranks + c->me], local, c->n_local * sizeof *all);
    dt_status st = dt_comm_allgatherv(ctx, c->comm, c->group, all, cnt, cnt + c->ranks);
    for (int t = 0; t < c->ranks && st == DT_OK; t++) place(out, all + cnt[c->ranks + t], c->peer[t], c->npeer[t]);
    free(all), free(cnt);
    if (st != DT_OK) {
        free(out);
        return st;
    }
    *canon = out;
    return DT_OK;
}

void dt_tp_ckpt_scatter(const dt_tp_ckpt *c, const float *canon, float *local) {
    memset(local, 0, c->n_local * sizeof *local);
    for (size_t k = 0; k < c->nruns; k++)
        memcpy(local + c->runs[k].local, canon + c->runs[k].canon, c->runs[k].n * sizeof(float));
}
