/* The trainer on each model family (gpt2, llama, vit): bitwise determinism of 20 training
 * steps, overfitting one batch, gradient accumulation equivalence, clean failure on an
 * allocation fault, activation checkpointing and the fused loss bitwise, mixed precision
 * against fp32, exact static loss scales. The models' structure: test_model.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/llama/llama.h"
#include "model/model.h"
#include "ops/ops.h"
#include "data/synthetic.h"
#include "train/trainer.h"
#include "testutil.h"

/* The trainer tests run once per family: state is "gpt2", "llama" or "vit". */
static const char *g_family = "gpt2";

static int use_family(void **state) {
    g_family = *state;
    return 0;
}

static dt_train_cfg small_cfg(void) {
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    if (!strcmp(g_family, "llama"))
        c.model = (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4,
                                    .n_kv_head = 2, .d_ff = 80, .vocab = 300, .context = 32,
                                    .untied = 1};
    else if (!strcmp(g_family, "vit"))
        c.model = (dt_model_config){.family = "vit", .n_layer = 2, .d_model = 48, .n_head = 4, .d_ff = 80,
                                    .image_size = 8, .patch_size = 4, .n_classes = 5};
    else
        c.model = (dt_model_config){.n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 300, .context = 32};
    c.micro_batch = 4;
    c.seq_len = !strcmp(g_family, "vit") ? 64 : 32; /* vit: one 8 x 8 image */
    c.steps = 20;
    c.sched = (dt_lr_schedule){DT_SCHED_COSINE, 2e-3f, 2e-4f, 3, 20};
    c.clip = 1.0f;
    c.seed = 99;
    return c;
}

static void train(dt_train_cfg c, float *losses, float **params, size_t *n) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_trainer tr;
    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
    for (long s = 0; s < c.steps; s++) {
        dt_step_stats st;
        assert_int_equal(dt_trainer_step(&ctx, &tr, &st), DT_OK);
        losses[s] = st.loss;
    }
    *n = tr.model.ps.n_params;
    *params = tu_malloc(*n * sizeof(float));
    memcpy(*params, tr.model.ps.params, *n * sizeof(float));
    dt_trainer_free(&tr);
}

/* train() with the memory plan checked against the allocator and no step skipped; returns the
 * planned activation bytes; *loss_scale (if non-NULL) gets the last step's loss scale. */
static size_t train_planned(dt_train_cfg c, float *losses, float **params, size_t *n, float *loss_scale) {
    size_t plan[DT_MEM_NKINDS];
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_trainer_mem_plan(&ctx, &c, 1, 1, 0, plan), DT_OK);
    dt_trainer tr;
    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
    for (int j = 0; j < DT_MEM_NKINDS; j++) assert_int_equal(tr.alloc.peak[j], plan[j]);
    for (long s = 0; s < c.steps; s++) {
        dt_step_stats st;
        assert_int_equal(dt_trainer_step(&ctx, &tr, &st), DT_OK);
        assert_int_equal(st.skipped, 0);
        losses[s] = st.loss;
        if (loss_scale) *loss_scale = st.loss_scale;
    }
    *n = tr.model.ps.n_params;
    *params = tu_malloc(*n * sizeof(float));
    memcpy(*params, tr.model.ps.params, *n * sizeof(float));
    dt_trainer_free(&tr);
    return plan[DT_MEM_ACTS];
}

static void test_two_runs_are_bitwise_identical(void **state) {
    printf("  family %s\n", (const char *)*state);
    float l1[20], l2[20], *p1, *p2;
    size_t n1, n2;
    train(small_cfg(), l1, &p1, &n1);
    train(small_cfg(), l2, &p2, &n2);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_int_equal(n1, n2);
    assert_memory_equal(p1, p2, n1 * sizeof(float));
    /* A different seed gives a different run: the comparison above can fail. */
    dt_train_cfg c = small_cfg();
    c.seed = 100;
    float l3[20], *p3;
    size_t n3;
    train(c, l3, &p3, &n3);
    assert_true(memcmp(l1, l3, sizeof l1) != 0);
    free(p1);
    free(p2);
    free(p3);
}

static void test_overfits_one_batch(void **state) {
    printf("  family %s\n", (const char *)*state);
    /* Training signal end to end: 30 steps on one fixed batch must drive its loss down. */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_train_cfg c = small_cfg();
    c.steps = 30;
    c.sched = (dt_lr_schedule){DT_SCHED_CONSTANT, 3e-3f, 0.0f, 0, 30};
    dt_trainer tr;
    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
    size_t bt = (size_t)c.micro_batch * c.seq_len;
    int32_t *in = tu_malloc(bt * 4), *tg = tu_malloc(bt * 4);
    dt_synthetic_batch(c.seed, c.model.vocab, 0, c.micro_batch, c.seq_len, in, tg);
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        dt_step_stats st;
        assert_int_equal(dt_trainer_step_on(&ctx, &tr, in, tg, &st), DT_OK);
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    printf("  one batch: loss %.4f -> %.4f\n", (double)first, (double)last);
    assert_true(last < 0.5f * first);
    dt_trainer_free(&tr);
    free(in);
    free(tg);
}

static void test_accumulation_equals_a_larger_batch(void **state) {
    printf("  family %s\n", (const char *)*state);
    /* B=4 x 1 micro-step vs B=2 x 2 micro-steps read the same rows of the same batches. */
    dt_train_cfg a = small_cfg(), b = small_cfg();
    a.steps = b.steps = 8;
    a.sched.total = b.sched.total = 8;
    b.micro_batch = 2;
    b.accum = 2;
    float la[8], lb[8], *pa, *pb;
    size_t na, nb;
    train(a, la, &pa, &na);
    train(b, lb, &pb, &nb);
    double worst = 0;
    for (int s = 0; s < 8; s++) worst = tu_worse(worst, fabs(la[s] - lb[s]) / fabs(la[s]));
    double *pad = tu_malloc(na * sizeof(double));
    tu_to_double(pad, pa, na);
    double pe = tu_rel_err(pb, pad, na);
    printf("  accumulation: losses rel err %.3e, weights rel err %.3e\n", worst, pe);
    assert_true(worst < 1e-5);
    /* vit: a mean over 4 images, not 128 tokens, and 8 Adam steps: weights whose gradient is
     * rounding-sized move by lr-sized steps of either sign (measured 1.3e-5; losses 7e-8). */
    assert_true(pe < (strcmp(g_family, "vit") ? 1e-5 : 1e-4));
    free(pa);
    free(pb);
    free(pad);
}

static void test_allocation_failure_is_clean(void **state) {
    printf("  family %s\n", (const char *)*state);
    /* A clean init counts its allocations: each of them is made to fail in turn. */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_trainer tr;
    dt_train_cfg c = small_cfg();
    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
    long n = tr.alloc.n_allocs;
    assert_int_equal(tr.alloc.failed, 0);
    dt_trainer_free(&tr);
    assert_int_equal(tr.alloc.total_cur, 0);
    assert_true(n >= 3);
    for (long k = 1; k <= n; k++) {
        dt_ctx_init(&ctx);
        c = small_cfg();
        /* dt_trainer_init resets its allocator: inject through a tiny hook on the config. */
        c.fail_alloc_at = k;
        dt_status st = dt_trainer_init(&ctx, &tr, &c, NULL);
        /* The fault fired, and an init that went on without the allocation is an error. */
        if (tr.alloc.failed != 1) fail_msg("allocation %ld of %ld: the injected failure did not fire", k, n);
        if (st != DT_ERR_NOMEM) fail_msg("allocation %ld of %ld failed, yet init returned %d", k, n, (int)st);
        assert_non_null(strstr(ctx.err, "injected"));
        assert_int_equal(tr.alloc.total_cur, 0); /* everything taken was given back */
    }
    printf("each of the %ld allocations of an init failed in turn: NOMEM, nothing leaked\n", n);
}

/* One training forward + backward of a model built directly (slabs: params and grads) on
 * fixed data; the gradient slab after it. `train_fwd`: dt_model_forward_train (the fused loss
 * forms the head's gradients in the forward), else dt_model_forward (the backward does). */
static float *fused_grads(const dt_model_opts *o, int train_fwd, size_t *n) {
    dt_train_cfg c = small_cfg();
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    dt_model m;
    assert_int_equal(dt_model_init_opts(&ctx, &m, &c.model, o, &a, c.micro_batch, c.seq_len,
                                        DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&m, 5);
    dt_params_zero_grad(&m.ps);
    size_t bt = (size_t)c.micro_batch * c.seq_len;
    int32_t *in = tu_malloc(bt * sizeof(int32_t)), *tg = tu_malloc(bt * sizeof(int32_t));
    for (size_t i = 0; i < bt; i++) in[i] = (int32_t)((i * 7 + 3) % 300), tg[i] = (int32_t)((i * 11 + 1) % 300);
    float loss;
    if (train_fwd) assert_int_equal(dt_model_forward_train(&ctx, &m, in, tg, 0.5f, &loss), DT_OK);
    else assert_int_equal(dt_model_forward(&ctx, &m, in, tg, &loss), DT_OK);
    assert_int_equal(m.head_grads, train_fwd && o->fused_loss);
    assert_true((dt_model_logits(&m) == NULL) == (o->fused_loss != 0)); /* never all stored when fused */
    dt_model_backward(&m, 0.5f);
    *n = m.ps.n_params;
    float *g = tu_malloc(*n * sizeof(float));
    memcpy(g, m.ps.grads, *n * sizeof(float));
    free(in);
    free(tg);
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
    return g;
}

/* DT_TEST_QUICK (set by scripts/test-aarch64.sh, whose qemu-user runs the model ~100x
 * slower): the bitwise matrices below run fp32 only; the 16-bit kernels are still checked
 * there by test_ops_lowp, and the full matrices run natively in make test. */
static int quick(void) {
    const char *q = getenv("DT_TEST_QUICK");
    return q && *q && strcmp(q, "0");
}

static void test_fused_loss_is_bitwise_the_stored_one(void **state) {
    const char *fam = *state;
    printf("  family %s\n", fam);
    /* The fused loss (5 token rows at a time of 128, a ragged last block, gradients formed in
     * the forward) trains to the bits of the stored logits with the same blocks, in fp32 and
     * bf16 (a 16-bit copy of the whole head), with accumulation, storing 5 rows of logits
     * instead of 128 (plan == allocator); one block (the default 256 rows) too. Block size
     * changes the head's weight-gradient sum order: different blocks are not compared. */
    static const dt_dtype precs[] = {DT_F32, DT_BF16};
    for (int pi = 0; pi < (quick() ? 1 : 2); pi++)
        for (int rows = 5; rows >= 0; rows -= 5) {
            float l[2][6];
            float *p[2];
            size_t n[2], acts[2];
            for (int fused = 0; fused < 2; fused++) {
                dt_train_cfg c = small_cfg();
                c.steps = 6;
                c.sched.total = 6;
                c.accum = 2;
                c.model_opts = (dt_model_opts){DT_RECOMPUTE_NONE, 1, precs[pi], fused, rows, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
                acts[fused] = train_planned(c, l[fused], &p[fused], &n[fused], NULL);
            }
            printf("  %s rows %d: activations %zu (stored) vs %zu (fused) bytes, loss %.6f\n",
                   dt_dtype_name(precs[pi]), rows, acts[0], acts[1], (double)l[1][5]);
            assert_memory_equal(l[0], l[1], sizeof l[0]);
            assert_int_equal(n[0], n[1]);
            assert_memory_equal(p[0], p[1], n[0] * sizeof(float));
            free(p[0]);
            free(p[1]);
            if (!strcmp(fam, "vit")) assert_int_equal(acts[0], acts[1]); /* no vocabulary head */
            else if (rows) assert_true(acts[1] + 4 * (128 - 5) * 384 <= acts[0]); /* vocabulary 300 -> 384 */
            else assert_int_equal(acts[0], acts[1]);
        }
    /* The model API: after a plain forward the backward forms the head's gradients itself, to
     * the bits of a training forward's; and the fused and stored losses agree there too. */
    for (int pi = 0; pi < 2 && strcmp(fam, "vit"); pi++) {
        dt_model_opts fo = {DT_RECOMPUTE_NONE, 1, precs[pi], 1, 5, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, so = fo;
        so.fused_loss = 0;
        size_t n1, n2, n3;
        float *g1 = fused_grads(&fo, 1, &n1), *g2 = fused_grads(&fo, 0, &n2), *g3 = fused_grads(&so, 1, &n3);
        assert_true(n1 == n2 && n1 == n3);
        assert_memory_equal(g1, g2, n1 * sizeof(float));
        assert_memory_equal(g1, g3, n1 * sizeof(float));
        double sq = 0;
        for (size_t i = 0; i < n1; i++) sq += (double)g1[i] * g1[i];
        assert_true(sq > 0 && isfinite(sq)); /* gradients, not zeros */
        free(g1);
        free(g2);
        free(g3);
    }
}

static void test_activation_checkpointing_is_bitwise(void **state) {
    printf("  family %s\n", (const char *)*state);
    /* 3 layers, 2 micro-steps, in each precision: every mode and interval gives the losses and
     * weights of no checkpointing bit for bit. A recompute that is skipped or wrong leaves
     * another layer's values in the shared working slots, which changes the gradients. The
     * activation bytes shrink as documented, and the plan equals the allocator. */
    static const struct { dt_recompute r; int every; } modes[] = {
        {DT_RECOMPUTE_NONE, 1},      {DT_RECOMPUTE_SELECTIVE, 1}, {DT_RECOMPUTE_SELECTIVE, 2},
        {DT_RECOMPUTE_FULL, 1},      {DT_RECOMPUTE_FULL, 2},      {DT_RECOMPUTE_FULL, 3},
    };
    static const dt_dtype precs[] = {DT_F32, DT_BF16, DT_F16};
    const int nm = (int)(sizeof modes / sizeof modes[0]);
    for (int pi = 0; pi < (quick() ? 1 : 3); pi++) {
        float base_l[6];
        float *base_p = NULL;
        size_t base_n = 0, acts[6];
        for (int k = 0; k < nm; k++) {
            dt_train_cfg c = small_cfg();
            c.model.n_layer = 3;
            c.steps = 6;
            c.sched.total = 6;
            c.micro_batch = 2;
            c.accum = 2;
            c.model_opts = (dt_model_opts){modes[k].r, modes[k].every, precs[pi], 1, 0, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
            float l[6], *p;
            size_t n;
            acts[k] = train_planned(c, l, &p, &n, NULL);
            printf("  %s %-9s every %d: activations %zu bytes, loss %.6f\n", dt_dtype_name(precs[pi]),
                   dt_recompute_name(modes[k].r), modes[k].every, acts[k], (double)l[5]);
            if (k == 0) {
                memcpy(base_l, l, sizeof l);
                base_n = n, base_p = p;
                continue;
            }
            assert_memory_equal(l, base_l, sizeof l);
            assert_int_equal(n, base_n);
            assert_memory_equal(p, base_p, base_n * sizeof(float));
            free(p);
        }
        /* none > selective > full at every layer; every 2nd layer saves less than every layer. */
        assert_true(acts[1] < acts[0] && acts[3] < acts[1]);
        assert_true(acts[2] > acts[1] && acts[2] < acts[0] && acts[4] > acts[3] && acts[5] > acts[4]);
        free(base_p);
    }
    /* A bad interval is refused naming the key. */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_train_cfg c = small_cfg();
    c.model_opts = (dt_model_opts){DT_RECOMPUTE_FULL, 0, DT_F32, 1, 0, {0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    dt_trainer tr;
    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "memory.activation_checkpointing_every"));
}

static void test_mixed_precision_tracks_fp32(void **state) {
    printf("  family %s\n", (const char *)*state);
    /* 8 steps in bf16 and fp16 against fp32 from the same weights and batches: the losses
     * stay within MP_LOSS_TOL relative, the weights within MP_WEIGHT_TOL (norm-wise), yet are
     * not the fp32 bits (the 16-bit path ran). Activations shrink; the plan equals the
     * allocator. */
    const double MP_LOSS_TOL = 1e-3, MP_WEIGHT_TOL = 5e-3; /* measured <= 2.2e-4, 1.3e-3 */
    static const dt_dtype precs[] = {DT_F32, DT_BF16, DT_F16};
    float l[3][8], *p[3];
    size_t n = 0, acts[3];
    for (int pi = 0; pi < 3; pi++) {
        dt_train_cfg c = small_cfg();
        c.steps = 8;
        c.sched.total = 8;
        c.model_opts.compute = precs[pi];
        float scale;
        acts[pi] = train_planned(c, l[pi], &p[pi], &n, &scale);
        assert_true(scale == (precs[pi] == DT_F16 ? 65536.0f : 1.0f)); /* fp16: no overflow backed it off */
    }
    double *ref = tu_malloc(n * sizeof(double));
    tu_to_double(ref, p[0], n);
    for (int pi = 1; pi < 3; pi++) {
        double worst = 0, num = 0, den = 0;
        for (int s = 0; s < 8; s++) worst = tu_worse(worst, fabs(l[pi][s] - l[0][s]) / fabs(l[0][s]));
        for (size_t i = 0; i < n; i++) {
            num += (p[pi][i] - ref[i]) * (p[pi][i] - ref[i]);
            den += ref[i] * ref[i];
        }
        double werr = sqrt(num / den);
        printf("  %s vs fp32: losses rel err %.3e (tol %.0e), weights %.3e (tol %.0e), activations %zu vs %zu bytes\n",
               dt_dtype_name(precs[pi]), worst, MP_LOSS_TOL, werr, MP_WEIGHT_TOL, acts[pi], acts[0]);
        assert_true(worst < MP_LOSS_TOL && werr < MP_WEIGHT_TOL);
        assert_true(memcmp(p[pi], p[0], n * sizeof(float)) != 0);
        assert_true(acts[pi] < acts[0]);
    }
    for (int pi = 0; pi < 3; pi++) free(p[pi]);
    free(ref);
}

static void test_static_loss_scale_is_exact(void **state) {
    (void)state;
    /* A power-of-two loss scale multiplies the gradients and divides them back exactly, so in
     * fp32 a static scale of 1/2 or 1024 trains bit for bit as no scale (scales below 1 must
     * not be clamped away with the clipping coefficient). */
    float l0[20], l1[20], *p0, *p1;
    size_t n0, n1;
    train(small_cfg(), l0, &p0, &n0);
    static const float scales[] = {0.5f, 1024.0f};
    for (int i = 0; i < 2; i++) {
        dt_train_cfg c = small_cfg();
        c.loss_scale = scales[i];
        train(c, l1, &p1, &n1);
        assert_memory_equal(l0, l1, sizeof l0);
        assert_memory_equal(p0, p1, n0 * sizeof(float));
        free(p1);
    }
    free(p0);
}

/* A mixture of experts' expert load (dt_step_stats moe_load; ARCHITECTURE decision 86): each
 * step's counts equal a tally of the router's choices (dt_llama_moe_choices) of forwards of the
 * step's micro-batches on the weights the step starts from, made apart before it; each layer's
 * counts add up to B T k x accumulation; max/mean is recomputed. With full activation
 * checkpointing (the routing formed again in the backward) the counts are the same. */
static void test_moe_load_counts(void **state) {
    (void)state;
    for (int ck = 0; ck < 2; ck++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        g_family = "llama";
        dt_train_cfg c = small_cfg();
        c.model.n_experts = 4, c.model.experts_topk = 2, c.model.expert_d_ff = 32, c.model.d_ff = 0;
        c.micro_batch = 2, c.accum = 2, c.steps = 3, c.sched.total = 3, c.sched.warmup = 1;
        c.model_opts.recompute = ck ? DT_RECOMPUTE_FULL : DT_RECOMPUTE_NONE;
        dt_trainer tr;
        dt_status ist = dt_trainer_init(&ctx, &tr, &c, NULL);
        if (ist != DT_OK) printf("  %s\n", ctx.err);
        assert_int_equal(ist, DT_OK);
        const int B = c.micro_batch, T = c.seq_len, L = c.model.n_layer, E = 4, K = 2;
        const size_t bt = (size_t)B * T;
        int32_t *in = tu_malloc(bt * c.accum * 4), *tg = tu_malloc(bt * c.accum * 4);
        /* a model of its own, on the trainer's weights before each step, counts apart */
        dt_alloc alloc;
        dt_alloc_init(&alloc);
        dt_model m2;
        assert_int_equal(dt_model_init(&ctx, &m2, &tr.model.cfg, &alloc, B, T, DT_SLAB_PARAMS), DT_OK);
        assert_int_equal(m2.ps.n_params, tr.model.ps.n_params);
        for (long s = 0; s < c.steps; s++) {
            for (int k = 0; k < c.accum; k++)
                dt_synthetic_batch(c.seed, c.model.vocab, s * c.accum + k, B, T, in + k * bt, tg + k * bt);
            int64_t tally[4 * 4] = {0};
            memcpy(m2.ps.params, tr.model.ps.params, m2.ps.n_params * sizeof(float));
            for (int k = 0; k < c.accum; k++) {
                float loss;
                assert_int_equal(dt_model_forward(&ctx, &m2, in + k * bt, tg + k * bt, &loss), DT_OK);
                for (int l = 0; l < L; l++) {
                    const int32_t *ch = dt_llama_moe_choices(&m2, l);
                    for (size_t i = 0; i < bt * K; i++) tally[l * E + ch[i]]++;
                }
            }
            dt_step_stats st;
            assert_int_equal(dt_trainer_step_on(&ctx, &tr, in, tg, &st), DT_OK);
            assert_non_null(st.moe_load);
            assert_int_equal(st.moe_layers, L);
            assert_int_equal(st.moe_experts, E);
            double worst = 0;
            for (int l = 0; l < L; l++) {
                int64_t sum = 0, mx = 0;
                for (int e = 0; e < E; e++) {
                    assert_int_equal(st.moe_load[l * E + e], tally[l * E + e]);
                    sum += st.moe_load[l * E + e];
                    mx = st.moe_load[l * E + e] > mx ? st.moe_load[l * E + e] : mx;
                }
                assert_int_equal(sum, (int64_t)bt * K * c.accum);
                worst = (double)mx * E / (double)sum > worst ? (double)mx * E / (double)sum : worst;
            }
            assert_true(isfinite(st.moe_load_max_mean) && st.moe_load_max_mean >= 1.0);
            assert_true(st.moe_load_max_mean == worst);
            printf("  %s step %ld: layer 0 load %lld %lld %lld %lld, max/mean %.4f\n", ck ? "full ckpt" : "no ckpt", s + 1,
                   (long long)st.moe_load[0], (long long)st.moe_load[1], (long long)st.moe_load[2],
                   (long long)st.moe_load[3], st.moe_load_max_mean);
        }
        free(in);
        free(tg);
        dt_model_free(&m2);
        dt_trainer_free(&tr);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_static_loss_scale_is_exact),
        cmocka_unit_test(test_moe_load_counts),
#define BOTH(t)                                                                              \
    cmocka_unit_test_prestate_setup_teardown(t, use_family, NULL, (void *)"gpt2"),           \
        cmocka_unit_test_prestate_setup_teardown(t, use_family, NULL, (void *)"llama"),          \
        cmocka_unit_test_prestate_setup_teardown(t, use_family, NULL, (void *)"vit")
        BOTH(test_two_runs_are_bitwise_identical),
        BOTH(test_overfits_one_batch),
        BOTH(test_accumulation_equals_a_larger_batch),
        BOTH(test_allocation_failure_is_clean),
        BOTH(test_activation_checkpointing_is_bitwise),
        BOTH(test_fused_loss_is_bitwise_the_stored_one),
        BOTH(test_mixed_precision_tracks_fp32),
#undef BOTH
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
