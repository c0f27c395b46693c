/* Tensor parallelism inside the model (gpt2, llama with GQA tied and untied, vit) (model.h dt_model_opts.tp, family_impl.h; ARCHITECTURE
 * decision 62), without MPI: two threads are the two ranks of a TP group (a barrier-based
 * group whose sums add the ranks' values in rank order, as comm.h's ordered all-reduce does),
 * against one model in the blocks test mode (one process holding both shards, summing them in
 * shard order) and against the plain model.
 *   - each shard starts as the slice of the unsplit initialisation (bitwise);
 *   - tp = 2 ranks give bitwise the blocks mode's loss and every gradient, in fp32 and bf16,
 *     with and without activation checkpointing;
 *   - the blocks mode agrees with the plain model within rounding (loss 1e-6 relative, every
 *     gradient 1e-4 normwise): the same model, summed in another order;
 *   - LoRA and QLoRA (ARCHITECTURE decision 69): the adapters cut like their base, every one
 *     of them (gpt2: q, k, v, o, up, down; llama: also gate) with non-zero B, with dropout, in
 *     fp32 and bf16, with activation checkpointing and sequence parallelism: ranks == blocks
 *     bitwise (loss and every adapter gradient); blocks == plain within rounding (LoRA) or
 *     within the shards' own double quantization of the NF4 block scales (QLoRA);
 *   - a row-parallel layer without its all-reduce (a deliberately wrong split) fails the
 *     comparison;
 *   - what does not divide is refused naming the key, before any allocation. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "model/model.h"
#include "ops/ops.h"
#include "testutil.h"

enum { B = 2, K = 2 };
static const char *g_preset = "gpt2-tiny"; /* the family under test */
static int T = 32;                          /* its sequence: vit-tiny's is one image, 64 pixels */
static int g_tied = -1;                     /* llama: force a tied (1) or untied (0) head */
static int g_fused = 0;                     /* the fused loss (model.h) */
static int g_rows = 0;                      /* rows per block of the head and loss (0: 256) */
static int g_sp = 0;                        /* sequence parallelism (gpt2, llama, vit) */
static int g_lora = 0;                      /* LoRA rank (0: none) */
static int g_nf4 = 0;                       /* QLoRA: the base's layer matmuls in NF4 */
static float g_dropout = 0.0f;              /* lora.dropout (a training forward) */
static int g_width = 0;                     /* d_model (and llama's d_ff = 2 d_model) when set */

typedef struct group {
    pthread_barrier_t bar;
    float *buf[K];
    int broken; /* the deliberately wrong split: sums do nothing */
} group;

typedef struct rank_ud {
    group *g;
    int rank;
} rank_ud;

static int g_reduce(void *ud, float *x, size_t n, int max) {
    rank_ud *r = ud;
    group *g = r->g;
    if (g->broken) return 0;
    g->buf[r->rank] = x;
    pthread_barrier_wait(&g->bar);
    size_t lo = n * (size_t)r->rank / K, hi = n * (size_t)(r->rank + 1) / K;
    for (size_t i = lo; i < hi; i++) {
        float s = g->buf[0][i];
        for (int q = 1; q < K; q++) s = max ? (g->buf[q][i] > s ? g->buf[q][i] : s) : s + g->buf[q][i];
        for (int q = 0; q < K; q++) g->buf[q][i] = s;
    }
    pthread_barrier_wait(&g->bar);
    return 0;
}
static int g_sum(void *ud, float *x, size_t n) { return g_reduce(ud, x, n, 0); }
static int g_max(void *ud, float *x, size_t n) { return g_reduce(ud, x, n, 1); }
/* sequence parallelism: every rank's block of n (at rank n) to all; the sum of the ranks' in
 * blocks for mine, in rank order */
static int g_allgather(void *ud, float *buf, size_t n) {
    rank_ud *r = ud;
    group *g = r->g;
    if (g->broken) return 0;
    g->buf[r->rank] = buf;
    pthread_barrier_wait(&g->bar);
    for (int q = 0; q < K; q++)
        if (q != r->rank) memcpy(buf + (size_t)q * n, g->buf[q] + (size_t)q * n, n * sizeof(float));
    pthread_barrier_wait(&g->bar);
    return 0;
}
static int g_reduce_scatter(void *ud, const float *in, float *out, size_t n) {
    rank_ud *r = ud;
    group *g = r->g;
    if (g->broken) return 0;
    g->buf[r->rank] = (float *)in;
    pthread_barrier_wait(&g->bar);
    for (size_t i = 0; i < n; i++) {
        float s = g->buf[0][(size_t)r->rank * n + i];
        for (int q = 1; q < K; q++) s += g->buf[q][(size_t)r->rank * n + i];
        out[i] = s;
    }
    pthread_barrier_wait(&g->bar);
    return 0;
}

static dt_model_config tiny(void) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, g_preset, &c), DT_OK);
    if (strcmp(g_preset, "vit-tiny")) c.vocab = 250; /* padding in the last shard: 250 of 256 */
    if (g_tied >= 0) c.untied = !g_tied;
    if (g_width) c.d_model = g_width, c.d_ff = strcmp(g_preset, "llama-tiny") ? 0 : 2 * g_width;
    return c;
}

static void make(dt_model *m, dt_alloc *al, int tp, int local, int first, dt_dtype compute, dt_recompute rc) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c = tiny();
    dt_model_opts o = {rc, 1, compute, g_fused, g_rows, {0}, tp, local, first, tp > 1 ? g_sp : 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (g_lora) {
        unsigned t;
        assert_int_equal(dt_lora_parse_targets(&ctx, strcmp(g_preset, "llama-tiny") ? "q,k,v,o,up,down"
                                                                                     : "q,k,v,o,gate,up,down", &t), DT_OK);
        o.lora = (dt_lora_cfg){g_lora, 2.0f * (float)g_lora, g_dropout, t, g_nf4, 0};
    }
    dt_alloc_init(al);
    dt_status st = dt_model_init_opts(&ctx, m, &c, &o, al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS);
    if (st != DT_OK) fail_msg("init: %s", ctx.err);
    dt_model_init_weights(m, 1234);
    if (g_lora) /* B starts at zero, so dA would be zero: every adapter element a function of its
                 * canonical index, the same in every layout */
        for (int id = 0; id < m->ps.n_tensors; id++)
            for (int l = 0; l < dt_params_copies(&m->ps, id); l++) {
                const dt_tensor_info *t = &m->ps.tensors[id];
                float *w = dt_params_tensor(&m->ps, m->ps.params, id, l);
                for (size_t i = 0; i < t->rows * t->cols; i++) {
                    int sh;
                    size_t gi = dt_params_global_index(t, i, &sh);
                    if (id % 2) w[i] = 0.05f * sinf(0.37f * (float)gi + (float)(id + 3 * l));
                }
            }
    dt_params_zero_grad(&m->ps);
    m->lora_drop_seed = 99, m->lora_drop_seq0 = 5;
}

static void batch(int32_t *in, int32_t *tg) {
    if (!strcmp(g_preset, "vit-tiny")) { /* pixels, a label per image */
        for (int i = 0; i < B * T; i++) in[i] = (int32_t)((i * 37 + 11) % 256), tg[i] = (int32_t)((i / T) * 3 + 1);
        return;
    }
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 37 + 11) % 250);
        tg[i] = i % 29 == 3 ? -1 : (int32_t)((i * 53 + 7) % 250); /* some masked, some in each shard */
    }
}

static float step(dt_model *m) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    int32_t in[B * 64], tg[B * 64];
    batch(in, tg);
    float loss;
    if (g_dropout > 0.0f) assert_int_equal(dt_model_forward_train(&ctx, m, in, tg, 1.0f, &loss), DT_OK);
    else assert_int_equal(dt_model_forward(&ctx, m, in, tg, &loss), DT_OK);
    dt_model_backward(m, 1.0f);
    assert_int_equal(m->tp_failed, 0);
    return loss;
}

typedef struct job {
    dt_model m;
    dt_alloc al;
    rank_ud ud;
    dt_dtype compute;
    dt_recompute rc;
    float loss;
} job;

static void *rank_main(void *p) {
    job *j = p;
    make(&j->m, &j->al, K, 1, j->ud.rank, j->compute, j->rc);
    j->m.tp_ops = (dt_model_tp_ops){&j->ud, g_sum, g_max, g_allgather, g_reduce_scatter};
    j->loss = step(&j->m);
    return NULL;
}

/* The ranks' models after one forward and backward (threads; the group broken or not). */
static void run_ranks(job *jobs, group *g, dt_dtype compute, dt_recompute rc, int broken) {
    pthread_barrier_init(&g->bar, NULL, K);
    g->broken = broken;
    pthread_t th[K];
    for (int r = 0; r < K; r++) {
        jobs[r] = (job){.ud = {g, r}, .compute = compute, .rc = rc};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < K; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g->bar);
}

/* Rank r's store (slab `which`: 0 params, 1 grads) against shard r of the blocks model's:
 * the number of elements that differ in bits. */
static size_t diff_rank(const dt_model *blk, const dt_model *rk, int r, int which) {
    size_t bad = 0;
    const dt_params *pb = &blk->ps, *pr = &rk->ps;
    for (int id = 0; id < pb->n_tensors; id++)
        for (int l = 0; l < dt_params_copies(pb, id); l++) {
            const dt_tensor_info *t = &pr->tensors[id];
            size_t len = t->rows * t->cols, off = t->split ? (size_t)r * len : 0;
            const float *a = dt_params_tensor(pb, which ? pb->grads : pb->params, id, l) + off;
            const float *b = dt_params_tensor(pr, which ? pr->grads : pr->params, id, l);
            for (size_t i = 0; i < len; i++) bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
        }
    return bad;
}

/* The blocks model's slab in canonical order, tensor by tensor, against the plain model's. */
static int close_plain(const dt_model *blk, const dt_model *pl, int which, double rtol, double atol, int require) {
    const dt_params *pb = &blk->ps, *pp = &pl->ps;
    int ok = 1;
    for (int id = 0; id < pb->n_tensors; id++)
        for (int l = 0; l < dt_params_copies(pb, id); l++) {
            const dt_tensor_info *t = &pb->tensors[id], *tp = &pp->tensors[id];
            size_t n = tp->file_rows * tp->cols; /* the real rows */
            const float *a = dt_params_tensor(pb, which ? pb->grads : pb->params, id, l);
            const float *b = dt_params_tensor(pp, which ? pp->grads : pp->params, id, l);
            float *canon = tu_malloc(n * sizeof(float));
            double *want = tu_malloc(n * sizeof(double));
            for (size_t i = 0; i < t->rows * t->cols; i++) {
                int sh;
                size_t gi = dt_params_global_index(t, i, &sh);
                if (gi < n) canon[gi] = a[i];
            }
            tu_to_double(want, b, n);
            char name[96];
            dt_params_name(pb, id, l, name, sizeof name);
            tu_cmp c = tu_compare(canon, want, n, rtol, atol);
            if (!c.ok) {
                ok = 0;
                if (require) tu_assert_close(name, canon, want, n, rtol, atol);
            }
            free(canon);
            free(want);
        }
    return ok;
}

static void check_equivalence(dt_dtype compute, dt_recompute rc) {
    dt_model plain, blk;
    dt_alloc a1, a2;
    make(&plain, &a1, 1, 1, 0, compute, rc);
    make(&blk, &a2, K, K, 0, compute, rc);
    /* the shards start as slices of the unsplit initialisation */
    assert_true(close_plain(&blk, &plain, 0, 0.0, 0.0, 1));
    float lp = step(&plain), lb = step(&blk);
    job jobs[K];
    group g;
    run_ranks(jobs, &g, compute, rc, 0);
    if (g_lora) printf("  LoRA rank %d%s%s:", g_lora, g_nf4 ? ", NF4 base" : "", g_dropout > 0 ? ", dropout" : "");
    printf("  %s%s%s %s, recompute %s: loss plain %.9g, blocks %.9g, ranks %.9g %.9g\n", g_preset,
           g_tied == 1 ? " (tied)" : "", g_fused ? (g_sp ? " sequence-parallel, fused loss" : " fused loss") : g_sp ? " sequence-parallel" : "",
           dt_dtype_name(compute),
           dt_recompute_name(rc), (double)lp, (double)lb, (double)jobs[0].loss, (double)jobs[1].loss);
    (void)0;
    for (int r = 0; r < K; r++) {
        assert_true(memcmp(&jobs[r].loss, &lb, sizeof lb) == 0);
        assert_int_equal(diff_rank(&blk, &jobs[r].m, r, 0), 0);
        size_t bad = diff_rank(&blk, &jobs[r].m, r, 1);
        if (bad) fail_msg("rank %d: %zu gradient elements differ from the blocks mode", r, bad);
    }
    /* 16-bit operands: the partial sums are rounded to 16 bits at other points (normwise 2e-2;
     * elementwise atol 1e-4, gradients being ~1e-2) */
    double tol = compute == DT_F32 ? 1e-4 : 2e-2, atol = compute == DT_F32 ? 1e-7 : 1e-4;
    double ltol = compute == DT_F32 ? 1e-6 : 1e-3;
    /* QLoRA: each shard is its own NF4 tensor, its block scales double-quantized apart from the
     * unsplit tensor's (the same blocks and absmaxes; int8 steps of another range): the same
     * model to that quantization, not to rounding */
    if (g_nf4) tol = 2e-2, atol = 1e-3, ltol = 1e-4;
    if (!(fabs((double)lb - (double)lp) <= ltol * fabs((double)lp)))
        fail_msg("loss blocks %.9g vs plain %.9g", (double)lb, (double)lp);
    assert_true(close_plain(&blk, &plain, 1, tol, atol, 1));
    for (int r = 0; r < K; r++) dt_model_free(&jobs[r].m);
    dt_model_free(&plain);
    dt_model_free(&blk);
}

static void test_fp32(void **s) {
    (void)s;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
}
static void test_bf16(void **s) {
    (void)s;
    check_equivalence(DT_BF16, DT_RECOMPUTE_NONE);
}
static void test_recompute(void **s) {
    (void)s;
    check_equivalence(DT_F32, DT_RECOMPUTE_FULL);
    check_equivalence(DT_BF16, DT_RECOMPUTE_SELECTIVE);
}
/* LLaMA: grouped-query heads split by key/value groups, RoPE on the shard's heads, q|k|v and
 * gate|up each three and two tensors, untied and tied heads. */
static void test_llama(void **s) {
    (void)s;
    g_preset = "llama-tiny";
    g_tied = 0;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_FULL);
    g_tied = 1;
    check_equivalence(DT_F32, DT_RECOMPUTE_SELECTIVE);
    g_tied = -1, g_preset = "gpt2-tiny";
}
/* ViT: the same blocks, bidirectional, with a replicated patch embedding and head. */
static void test_vit(void **s) {
    (void)s;
    g_preset = "vit-tiny", T = 64;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_SELECTIVE);
    g_preset = "gpt2-tiny", T = 32;
}

/* A row-parallel layer without its all-reduce (the group's sums do nothing): the comparison
 * must fail, or it proves nothing. */
static void test_wrong_split_fails(void **s) {
    (void)s;
    dt_model blk;
    dt_alloc a;
    make(&blk, &a, K, K, 0, DT_F32, DT_RECOMPUTE_NONE);
    float lb = step(&blk);
    job jobs[K];
    group g;
    run_ranks(jobs, &g, DT_F32, DT_RECOMPUTE_NONE, 1);
    size_t bad = diff_rank(&blk, &jobs[0].m, 0, 1);
    printf("  without the all-reduce: loss %.9g vs %.9g, %zu gradient elements of rank 0 differ\n",
           (double)jobs[0].loss, (double)lb, bad);
    assert_true(bad > 0);
    assert_true(memcmp(&jobs[0].loss, &lb, sizeof lb) != 0);
    for (int r = 0; r < K; r++) dt_model_free(&jobs[r].m);
    dt_model_free(&blk);
    /* sequence parallelism in bf16 without its gathers and reduce-scatters */
    g_sp = 1;
    make(&blk, &a, K, K, 0, DT_BF16, DT_RECOMPUTE_NONE);
    lb = step(&blk);
    run_ranks(jobs, &g, DT_BF16, DT_RECOMPUTE_NONE, 1);
    bad = diff_rank(&blk, &jobs[0].m, 0, 1);
    printf("  sequence parallel without its collectives: loss %.9g vs %.9g, %zu gradient elements of rank 0 differ\n",
           (double)jobs[0].loss, (double)lb, bad);
    assert_true(bad > 0);
    for (int r = 0; r < K; r++) dt_model_free(&jobs[r].m);
    dt_model_free(&blk);
    g_sp = 0;
}

static void expect_refused(const char *preset, int tp, int fused, const char *want) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, preset, &c), DT_OK);
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, DT_F32, fused, 0, {0}, tp, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (g_lora) o.lora = (dt_lora_cfg){g_lora, 0.0f, 0.0f, 1u << DT_LORA_Q, g_nf4, 0};
    dt_model m;
    dt_alloc al;
    dt_alloc_init(&al);
    assert_int_equal(dt_model_init_opts(&ctx, &m, &c, &o, &al, 1, 8, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_ERR_CONFIG);
    printf("  refused: %s\n", ctx.err);
    if (!strstr(ctx.err, want)) fail_msg("'%s' does not say '%s'", ctx.err, want);
    assert_int_equal(al.n_allocs, 0); /* before any allocation */
}

/* Sequence parallelism (gpt2, llama, vit): the residual stream and norms on each rank's token
 * rows, gathered (in 16 bits under bf16) and reduce-scattered around the TP regions; the
 * norms' and positions' weight gradients summed per rank's rows, then over the group. Ranks ==
 * blocks mode bitwise, and the same model as tp = 1 within rounding; with the fused loss,
 * bf16 and activation checkpointing (the recomputed layers gather and reduce-scatter again). */
static void test_sp(void **s) {
    (void)s;
    g_sp = 1;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_NONE);
    check_equivalence(DT_F32, DT_RECOMPUTE_FULL);
    check_equivalence(DT_BF16, DT_RECOMPUTE_SELECTIVE);
    check_equivalence(DT_F16, DT_RECOMPUTE_NONE);
    g_fused = 1, g_rows = 24;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_FULL);
    g_fused = 0, g_rows = 0;
    g_preset = "llama-tiny"; /* RMSNorm, RoPE on every row of the shard's heads, untied head */
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_FULL);
    g_tied = 1;
    check_equivalence(DT_F32, DT_RECOMPUTE_SELECTIVE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_NONE);
    g_tied = -1, g_preset = "vit-tiny", T = 64; /* class tokens among the rows, replicated embedding and head */
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_SELECTIVE);
    check_equivalence(DT_F32, DT_RECOMPUTE_FULL);
    g_preset = "gpt2-tiny", T = 32, g_sp = 0;
}

/* The fused loss under tensor parallelism (row blocks of 24 of the 64 rows): ranks == blocks
 * mode bitwise as above, and the same bits as the stored logits in the same row blocks. */
static void test_fused(void **s) {
    (void)s;
    g_fused = 1, g_rows = 24;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_NONE);
    dt_model fu, st;
    dt_alloc a1, a2;
    make(&fu, &a1, K, K, 0, DT_F32, DT_RECOMPUTE_NONE);
    g_fused = 0;
    make(&st, &a2, K, K, 0, DT_F32, DT_RECOMPUTE_NONE);
    float lf = step(&fu), ls = step(&st);
    size_t bad = 0;
    for (size_t i = 0; i < fu.ps.n_params; i++) bad += memcmp(&fu.ps.grads[i], &st.ps.grads[i], sizeof(float)) != 0;
    printf("  fused vs stored logits (blocks mode): loss %.9g vs %.9g, %zu gradient elements differ\n", (double)lf,
           (double)ls, bad);
    assert_true(memcmp(&lf, &ls, sizeof lf) == 0);
    assert_int_equal(bad, 0);
    dt_model_free(&fu);
    dt_model_free(&st);
    g_rows = 0;
}

/* LoRA and QLoRA under tensor parallelism (decision 69): gpt2 (q|k|v row blocks of one fused
 * column-parallel tensor, row-parallel o and down) and llama (q, k, v and gate, up: adjacent
 * column-parallel tensors read as one), bf16, recomputation, dropout, sequence parallelism. */
static void test_lora(void **s) {
    (void)s;
    g_lora = 4;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_SELECTIVE);
    g_dropout = 0.25f;
    check_equivalence(DT_F32, DT_RECOMPUTE_FULL);
    g_preset = "llama-tiny";
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    g_dropout = 0.0f;
    check_equivalence(DT_BF16, DT_RECOMPUTE_FULL);
    g_sp = 1;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    g_preset = "gpt2-tiny";
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    g_sp = 0, g_lora = 0;
}

/* QLoRA: widths whose shards are whole NF4 blocks (d_model 128: row-parallel shards of 64
 * columns). */
static void test_qlora(void **s) {
    (void)s;
    g_lora = 4, g_nf4 = 1, g_width = 128;
    check_equivalence(DT_F32, DT_RECOMPUTE_NONE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_FULL);
    g_preset = "llama-tiny";
    check_equivalence(DT_F32, DT_RECOMPUTE_SELECTIVE);
    check_equivalence(DT_BF16, DT_RECOMPUTE_NONE);
    g_preset = "gpt2-tiny", g_lora = 0, g_nf4 = 0, g_width = 0;
}

/* The adapters' TP reductions (dA of a column-parallel layer, dB of a row-parallel one) are
 * part of the group's sums: without them the adapter gradients differ. */
static void test_lora_wrong_split_fails(void **s) {
    (void)s;
    g_lora = 4;
    dt_model blk;
    dt_alloc a;
    make(&blk, &a, K, K, 0, DT_F32, DT_RECOMPUTE_NONE);
    step(&blk);
    job jobs[K];
    group g;
    run_ranks(jobs, &g, DT_F32, DT_RECOMPUTE_NONE, 1);
    size_t bad = diff_rank(&blk, &jobs[0].m, 0, 1);
    printf("  LoRA without the group's sums: %zu adapter gradient elements of rank 0 differ\n", bad);
    assert_true(bad > 0);
    for (int r = 0; r < K; r++) dt_model_free(&jobs[r].m);
    dt_model_free(&blk);
    g_lora = 0;
}

static void test_refusals(void **s) {
    (void)s;
    g_lora = 4, g_nf4 = 1;
    expect_refused("gpt2-tiny", 2, 0, "lora.base_dtype=nf4 with parallel.tp=2: a shard of h.0.attn.c_proj.weight");
    g_lora = 0, g_nf4 = 0;
    expect_refused("gpt2-tiny", 3, 0, "parallel.tp=3 does not divide model.n_head=4");
    expect_refused("llama-tiny", 4, 0, "parallel.tp=4 does not divide model.n_kv_head=2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32),           cmocka_unit_test(test_bf16),    cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_vit),            cmocka_unit_test(test_llama),   cmocka_unit_test(test_fused),
        cmocka_unit_test(test_sp),             cmocka_unit_test(test_lora),    cmocka_unit_test(test_qlora),
        cmocka_unit_test(test_wrong_split_fails), cmocka_unit_test(test_lora_wrong_split_fails),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
