/* model + trainer: config validation naming the key, the parameter tables and layouts, GPT-2
 * and LLaMA initialisation and published parameter counts, and for both families: bitwise
 * determinism of 20 training steps, overfitting one batch, gradient accumulation
 * equivalence, clean failure on an allocation fault. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt2/gpt2.h"
#include "model/llama/llama.h"
#include "model/vit/vit.h"
#include "model/model.h"
#include "ops/ops.h"
#include "train/keys.h"
#include "data/synthetic.h"
#include "train/trainer.h"
#include "testutil.h"

static void expect_config_error(dt_model_config c, const char *key) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_ERR_CONFIG);
    printf("  refused: %s\n", ctx.err);
    if (!strstr(ctx.err, key)) fail_msg("message '%s' does not name %s", ctx.err, key);
}

static void test_bad_shapes_are_refused_naming_the_key(void **state) {
    (void)state;
    dt_model_config ok = {.n_layer = 2, .d_model = 64, .n_head = 4, .vocab = 256, .context = 64};
    dt_model_config c = ok;
    c.n_head = 5;
    expect_config_error(c, "model.n_head");
    c = ok;
    c.n_layer = 0;
    expect_config_error(c, "model.n_layer");
    c = ok;
    c.d_model = 0;
    expect_config_error(c, "model.d_model");
    c = ok;
    c.vocab = 0;
    expect_config_error(c, "model.vocab_size");
    c = ok;
    c.context = 0;
    expect_config_error(c, "model.context");
    c = ok;
    c.n_head = 0;
    expect_config_error(c, "model.n_head");

    /* Through the key table, as the CLI uses it. */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_run_cfg r;
    dt_run_cfg_defaults(&r);
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.preset", "gpt2"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.context", "2048"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_ERR_CONFIG);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "model.context"));
    assert_non_null(strstr(ctx.err, "1024"));
    dt_run_cfg_defaults(&r);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.seq_len", "65"), DT_OK); /* tiny: 64 */
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "training.seq_len"));
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.n_layers", "3"), DT_ERR_CONFIG);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "model.n_layer'"));
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.n_layer", "three"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "model.n_layer"));
    assert_int_equal(dt_cfg_set(&ctx, &r, "optimizer.lr", "nan"), DT_ERR_CONFIG);
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.preset", "gpt5"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "model.preset"));
    assert_int_equal(dt_cfg_set(&ctx, &r, "data.shuffle", "maybe"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "data.shuffle"));
    /* A float key that also takes "auto" (the default of the collective watchdog). */
    assert_true(r.coll_timeout == -1.0f);
    assert_int_equal(dt_cfg_set(&ctx, &r, "fault.collective_timeout", "12.5"), DT_OK);
    assert_true(r.coll_timeout == 12.5f);
    assert_int_equal(dt_cfg_set(&ctx, &r, "fault.collective_timeout", "auto"), DT_OK);
    assert_true(r.coll_timeout == -1.0f);
    assert_int_equal(dt_cfg_set(&ctx, &r, "fault.collective_timeout", "soon"), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "fault.collective_timeout"));
    /* training.tokens derives the step count; it may not be combined with steps. */
    dt_run_cfg_defaults(&r);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.tokens", "1000"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_OK);
    assert_int_equal(r.train.steps, 4); /* ceil(1000 / (4 x 64)) */
    assert_int_equal(r.train.sched.total, 4);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.steps", "9"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "training.tokens"));
    /* training.batch derives grad_accum from the number of ranks (and tokens the steps). */
    dt_run_cfg_defaults(&r);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.batch", "16"), DT_OK);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.tokens", "10000"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_OK);
    assert_int_equal(r.train.accum, 4); /* 16 / (4 x 1) */
    assert_int_equal(r.train.steps, 10); /* ceil(10000 / (16 x 64)) */
    assert_int_equal(dt_cfg_apply_world(&ctx, &r, 2), DT_OK);
    assert_int_equal(r.train.accum, 2); /* 16 / (4 x 2) */
    assert_int_equal(r.train.steps, 10);
    assert_int_equal(dt_cfg_apply_world(&ctx, &r, 3), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "training.batch"));
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.grad_accum", "2"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "training.grad_accum"));
}

static void test_presets_and_parameter_counts(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    /* Published GPT-2 sizes (tied embeddings, 1024 positions). */
    const char *names[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
    size_t counts[] = {124439808, 354823168, 774030080, 1557611200};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dt_model_preset(&ctx, names[i], &c), DT_OK);
        assert_int_equal(dt_model_num_params(&c), counts[i]);
    }
    assert_int_equal(c.vocab_padded, 50304);
    /* FLOPs per token for gpt2 at T=1024, by hand: N = 124439808 - 50257*768 - 1024*768 +
     * 50257*768 = 123653376; 6N + 12*12*1024*768. */
    assert_int_equal(dt_model_preset(&ctx, "gpt2", &c), DT_OK);
    double want = 6.0 * 123653376.0 + 12.0 * 12 * 1024 * 768;
    assert_true(fabs(dt_model_flops_per_token(&c, 1024) - want) < 1.0);
    assert_int_equal(dt_model_preset(&ctx, "nope", &c), DT_ERR_CONFIG);
}

static void test_layout_tiles_the_slab_and_init_follows_gpt2(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    dt_model_config c = {.n_layer = 3, .d_model = 48, .n_head = 4, .vocab = 300, .context = 32};
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &c, &a, 2, 16, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    assert_int_equal(m.cfg.vocab_padded, 384);
    /* Every float of the slab belongs to exactly one tensor copy. */
    unsigned char *owner = tu_malloc(m.ps.n_params);
    for (int id = 0; id < DT_GPT2_NPARAMS; id++) {
        int copies = m.ps.tensors[id].group == DT_PG_LAYER ? c.n_layer : 1;
        for (int l = 0; l < copies; l++) {
            size_t off = (size_t)(dt_params_tensor(&(&m)->ps, m.ps.params, id, l) - m.ps.params);
            for (size_t i = 0; i < m.ps.tensors[id].rows * m.ps.tensors[id].cols; i++) owner[off + i]++;
        }
    }
    for (size_t i = 0; i < m.ps.n_params; i++) assert_int_equal(owner[i], 1);
    free(owner);
    /* Layer blocks are contiguous, in layer order. */
    assert_true(dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_LN1W, 1) ==
                dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_LN1W, 0) + m.ps.layer_floats);
    char name[64];
    dt_params_name(&(&m)->ps, DT_GPT2_P_FCPROJW, 2, name, sizeof name);
    assert_string_equal(name, "h.2.mlp.c_proj.weight");

    dt_model_init_weights(&m, 5);
    const float *wte = dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_WTE, 0);
    double s2 = 0;
    for (size_t i = 0; i < (size_t)300 * 48; i++) s2 += (double)wte[i] * wte[i];
    double std = sqrt(s2 / (300.0 * 48));
    assert_true(fabs(std - 0.02) < 0.001);
    for (size_t i = (size_t)300 * 48; i < (size_t)384 * 48; i++) assert_true(wte[i] == 0.0f);
    const float *pw = dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_ATTPROJW, 1);
    s2 = 0;
    for (size_t i = 0; i < 48 * 48; i++) s2 += (double)pw[i] * pw[i];
    std = sqrt(s2 / (48.0 * 48));
    printf("  wte std %.5f, attn.c_proj std %.5f (want %.5f)\n", 0.02, std, 0.02 / sqrt(6.0));
    assert_true(fabs(std - 0.02 / sqrt(6.0)) < 0.0006);
    assert_true(dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_LN2W, 2)[5] == 1.0f);
    assert_true(dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_QKVB, 0)[7] == 0.0f);
    /* A token outside the vocabulary is refused, not read out of bounds. */
    int32_t in[32], tg[32];
    for (int i = 0; i < 32; i++) in[i] = tg[i] = i;
    in[5] = 300;
    assert_int_equal(dt_model_forward(&ctx, &m, in, tg, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "300"));
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
}

/* Units (params.h): a vocabulary larger than a layer is cut into row chunks of at most a
 * layer, each its own unit; units tile the index space in order; no unit exceeds a layer. */
static void test_vocabulary_chunks_are_units(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    /* gpt2: a layer 12*48*48 + 13*48 = 28272 floats in three units: [ln_1, attention]
     * 2*48 + 4*48*48 + 4*48 = 9504, [ln_2, fc] 2*48 + 4*48*48 + 4*48 = 9504, [fc_proj]
     * 4*48*48 + 48 = 9264; wte 2048 x 48 = 98304 floats: 11 chunks of at most 9504 floats,
     * 187 rows each, the last 178. */
    dt_model_config c = {.n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 2000, .context = 32};
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &c, &a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    const dt_params *ps = &m.ps;
    assert_int_equal(ps->layer_floats, 28272);
    assert_int_equal(ps->layer_units, 3);
    assert_int_equal(ps->layer_unit_max, 9504);
    assert_int_equal(dt_params_chunks(ps, DT_GPT2_P_WTE), 11);
    assert_int_equal(ps->n_units, 11 + 1 + 2 * 3 + 1); /* wte chunks, wpe, layer units, ln_f */
    assert_int_equal(ps->n_pre_units, 12);
    assert_int_equal(ps->tensors[DT_GPT2_P_WPE].unit, 11);
    assert_int_equal(ps->tensors[DT_GPT2_P_LNFW].unit, DT_UNIT_POST0(ps));
    assert_int_equal(DT_UNIT_POST0(ps), 18);
    for (int k = 0; k < 11; k++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, DT_GPT2_P_WTE, k, &u, &r0, &rows);
        assert_int_equal(u, k);
        assert_int_equal(r0, (size_t)k * 187);
        assert_int_equal(rows, k < 10 ? 187 : 178);
        assert_int_equal(ps->unit_lo[u], r0 * 48);
        assert_int_equal(ps->unit_len[u], rows * 48);
    }
    /* layer 1's units, each tensor in the unit the marks give, at its offset there */
    static const size_t sub_len[3] = {9504, 9504, 9264};
    static const struct { int id, k; size_t off; } in[] = {
        {DT_GPT2_P_LN1W, 0, 0}, {DT_GPT2_P_QKVW, 0, 96}, {DT_GPT2_P_ATTPROJB, 0, 9456},
        {DT_GPT2_P_LN2W, 1, 0}, {DT_GPT2_P_FCW, 1, 96}, {DT_GPT2_P_FCB, 1, 9312},
        {DT_GPT2_P_FCPROJW, 2, 0}, {DT_GPT2_P_FCPROJB, 2, 9216}};
    for (int k = 0; k < 3; k++) {
        int u = DT_UNIT_SUB(ps, 1, k);
        assert_int_equal(u, 12 + 3 + k);
        assert_int_equal(ps->unit_len[u], sub_len[k]);
        /* one matmul run per unit: qkv and attn proj are not adjacent (the qkv bias between) */
        size_t off[DT_MODEL_MAX_TENSORS], len[DT_MODEL_MAX_TENSORS];
        int nr = dt_params_matmul_runs(ps, u, off, len, DT_MODEL_MAX_TENSORS);
        assert_int_equal(nr, k == 0 ? 2 : 1);
        assert_int_equal(off[0], k == 2 ? 0 : 96);
    }
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        size_t off;
        assert_int_equal(dt_params_unit_of(ps, in[i].id, 1, &off), DT_UNIT_SUB(ps, 1, in[i].k));
        assert_int_equal(off, in[i].off);
        assert_true(dt_params_unit_tensor(ps, ps->unit_params, in[i].id, 1) ==
                    dt_params_tensor(ps, ps->params, in[i].id, 1));
    }
    size_t at = 0;
    for (int u = 0; u < ps->n_units; u++) {
        assert_int_equal(ps->unit_lo[u], at);
        assert_true(ps->unit_len[u] > 0 && ps->unit_len[u] <= ps->layer_unit_max);
        at += ps->unit_len[u];
    }
    assert_int_equal(at, ps->n_params);
    dt_model_free(&m);
    /* llama, untied, vocabulary 3000 (padded 3072): the embedding and the head are chunked,
     * the last chunk shorter; the final norm is a unit of its own between the layers and the head. */
    dt_model_config l = {.family = "llama", .n_layer = 1, .d_model = 32, .n_head = 4, .n_kv_head = 2,
                         .d_ff = 64, .vocab = 3000, .context = 16, .untied = 1};
    assert_int_equal(dt_model_init(&ctx, &m, &l, &a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    /* layer: norms 2*32, q 32x32, k and v 16x32 each, o 32x32, gate/up 2x64x32, down 32x64 =
     * 9280, in units [norm, q|k|v, o] 3104, [norm, gate|up] 4128, [down] 2048 */
    assert_int_equal(m.ps.layer_floats, 9280);
    assert_int_equal(m.ps.layer_units, 3);
    static const size_t llama_len[3] = {3104, 4128, 2048};
    for (int k = 0; k < 3; k++) assert_int_equal(m.ps.unit_len[DT_UNIT_SUB(&m.ps, 0, k)], llama_len[k]);
    int K = dt_params_chunks(&m.ps, DT_LLAMA_P_EMBED);
    assert_int_equal(K, 24); /* 98304 / 4128 -> 24 chunks of 128 rows */
    int u;
    size_t r0, rows;
    dt_params_chunk(&m.ps, DT_LLAMA_P_LM_HEAD, K - 1, &u, &r0, &rows);
    assert_int_equal(u, m.ps.n_units - 1);
    assert_int_equal(r0, 2944);
    assert_int_equal(rows, 128);
    assert_int_equal(m.ps.tensors[DT_LLAMA_P_NORM].unit, DT_UNIT_POST0(&m.ps));
    assert_int_equal(m.ps.tensors[DT_LLAMA_P_LM_HEAD].unit, DT_UNIT_POST0(&m.ps) + 1);
    assert_int_equal(m.ps.n_units, 24 + 3 + 1 + 24);
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
}

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
                c.model_opts = (dt_model_opts){DT_RECOMPUTE_NONE, 1, precs[pi], fused, rows, {0}};
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
        dt_model_opts fo = {DT_RECOMPUTE_NONE, 1, precs[pi], 1, 5, {0}}, so = fo;
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
            c.model_opts = (dt_model_opts){modes[k].r, modes[k].every, precs[pi], 1, 0, {0}};
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
    c.model_opts = (dt_model_opts){DT_RECOMPUTE_FULL, 0, DT_F32, 1, 0, {0}};
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

static void test_llama_presets_and_published_parameter_counts(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    /* Counts of the published checkpoints (safetensors of TinyLlama-1.1B, Llama-3.2-1B,
     * Mistral-7B-v0.1: untied, tied, untied). */
    const char *names[] = {"tinyllama-1.1b", "llama-3.2-1b", "mistral-7b"};
    size_t counts[] = {1100048384, 1235814400, 7241732096};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dt_model_preset(&ctx, names[i], &c), DT_OK);
        assert_string_equal(c.family, "llama");
        printf("  %s: %zu parameters\n", names[i], dt_model_num_params(&c));
        assert_int_equal(dt_model_num_params(&c), counts[i]);
    }
    /* llama-100m: about 100M; FLOPs per token by hand: per layer C (q + 2 kv) + q C + 3 C F
     * + 2 C, plus the final norm and the lm_head matmul; attention 12 L T C. */
    assert_int_equal(dt_model_preset(&ctx, "llama-100m", &c), DT_OK);
    size_t n = dt_model_num_params(&c);
    assert_true(n > 95000000 && n < 105000000);
    double layer = 768.0 * (768 + 2 * 256) + 768.0 * 768 + 3.0 * 768 * 2048 + 2 * 768;
    double want = 6.0 * (12 * layer + 768 + 32000.0 * 768) + 12.0 * 12 * 256 * 768;
    assert_true(fabs(dt_model_flops_per_token(&c, 256) - want) < 1.0);
    /* Family rules name the key. */
    dt_model_config ok = {.family = "llama", .n_layer = 2, .d_model = 64, .n_head = 4,
                          .n_kv_head = 2, .vocab = 256, .context = 64};
    c = ok;
    c.n_kv_head = 3;
    expect_config_error(c, "model.n_kv_head");
    c = ok;
    c.d_model = 60, c.n_head = 4; /* head size 15: odd, rotary pairs impossible */
    expect_config_error(c, "model.n_head");
    c = ok;
    c.rope_theta = -1.0f;
    expect_config_error(c, "model.rope_theta");
    c = ok;
    c.norm_eps = 2.0f;
    expect_config_error(c, "model.norm_eps");
    c = ok;
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_OK);
    assert_int_equal(c.d_ff, 192); /* 8/3 * 64 rounded up to 64 */
    assert_true(c.rope_theta == 10000.0f && c.norm_eps == 1e-5f);
    /* gpt2 refuses what it does not have. */
    dt_model_config g = {.n_layer = 2, .d_model = 64, .n_head = 4, .n_kv_head = 2, .vocab = 256, .context = 64};
    expect_config_error(g, "model.n_kv_head");
    g.n_kv_head = 0, g.untied = 1;
    expect_config_error(g, "model.untied_embeddings");
    g.untied = 0, g.rope_theta = 500.0f;
    expect_config_error(g, "model.rope_theta");
    g.rope_theta = 0.0f;
    memcpy(g.family, "bert", 5);
    expect_config_error(g, "model.family");
}

static void test_llama_layout_names_and_init(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    for (int untied = 0; untied <= 1; untied++) {
        dt_model_config c = {.family = "llama", .n_layer = 3, .d_model = 48, .n_head = 4,
                             .n_kv_head = 2, .d_ff = 80, .vocab = 300, .context = 32,
                             .untied = untied};
        dt_model m;
        assert_int_equal(dt_model_init(&ctx, &m, &c, &a, 2, 16, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
        assert_int_equal(m.ps.n_tensors, untied ? DT_LLAMA_NPARAMS : DT_LLAMA_NPARAMS - 1);
        /* Every float of the slab belongs to exactly one tensor copy. */
        unsigned char *owner = tu_malloc(m.ps.n_params);
        memset(owner, 0, m.ps.n_params);
        for (int id = 0; id < m.ps.n_tensors; id++)
            for (int l = 0; l < dt_params_copies(&m.ps, id); l++) {
                size_t off = dt_params_flat(&m.ps, id, l);
                for (size_t i = 0; i < m.ps.tensors[id].rows * m.ps.tensors[id].cols; i++) owner[off + i]++;
            }
        for (size_t i = 0; i < m.ps.n_params; i++) assert_int_equal(owner[i], 1);
        free(owner);
        /* The fused projections rely on adjacency: k right after q, v after k, up after gate. */
        float *p = m.ps.params;
        assert_true(dt_params_tensor(&m.ps, p, DT_LLAMA_P_WK, 1) == dt_params_tensor(&m.ps, p, DT_LLAMA_P_WQ, 1) + 48 * 48);
        assert_true(dt_params_tensor(&m.ps, p, DT_LLAMA_P_WV, 1) == dt_params_tensor(&m.ps, p, DT_LLAMA_P_WK, 1) + 24 * 48);
        assert_true(dt_params_tensor(&m.ps, p, DT_LLAMA_P_WUP, 2) == dt_params_tensor(&m.ps, p, DT_LLAMA_P_WGATE, 2) + 80 * 48);
        char name[96];
        dt_params_name(&m.ps, DT_LLAMA_P_WK, 2, name, sizeof name);
        assert_string_equal(name, "model.layers.2.self_attn.k_proj.weight");
        dt_params_ext_name(&m.ps, DT_LLAMA_P_NORM, 0, name, sizeof name);
        assert_string_equal(name, "model.norm.weight");
        /* Files hold the unpadded vocabulary. */
        size_t per_layer = 48 + 48 * 48 + 2 * 24 * 48 + 48 * 48 + 48 + 3 * 80 * 48;
        assert_int_equal(dt_params_file_count(&m.ps), (1 + untied) * 300 * 48 + 3 * per_layer + 48);
        assert_int_equal(dt_params_file_count(&m.ps), dt_model_num_params(&m.cfg));
        dt_model_init_weights(&m, 5);
        const float *wq = dt_params_tensor(&m.ps, p, DT_LLAMA_P_WQ, 1);
        double s2 = 0;
        for (size_t i = 0; i < 48 * 48; i++) s2 += (double)wq[i] * wq[i];
        assert_true(fabs(sqrt(s2 / (48.0 * 48)) - 0.02) < 0.001);
        assert_true(dt_params_tensor(&m.ps, p, DT_LLAMA_P_LN2, 2)[7] == 1.0f);
        assert_true(dt_params_tensor(&m.ps, p, DT_LLAMA_P_NORM, 0)[47] == 1.0f);
        const float *emb = dt_params_tensor(&m.ps, p, DT_LLAMA_P_EMBED, 0);
        for (size_t i = (size_t)300 * 48; i < (size_t)384 * 48; i++) assert_true(emb[i] == 0.0f);
        dt_model_free(&m);
        assert_int_equal(a.total_cur, 0);
    }
}

static void test_vit_presets_layout_and_rules(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    /* ViT-Base/16, 224 x 224 x 3, 1000 classes: 86,567,656 parameters (the published count). */
    assert_int_equal(dt_model_preset(&ctx, "vit-b16", &c), DT_OK);
    assert_string_equal(c.family, "vit");
    assert_int_equal(dt_model_num_params(&c), 86567656);
    assert_int_equal(c.context, 3 * 224 * 224);
    assert_int_equal(c.vocab, 256);
    dt_model_config ok = {.family = "vit", .n_layer = 1, .d_model = 32, .n_head = 4, .image_size = 28,
                          .patch_size = 4, .n_classes = 10};
    c = ok;
    c.patch_size = 5;
    expect_config_error(c, "model.patch_size");
    c = ok;
    c.n_classes = 1;
    expect_config_error(c, "model.n_classes");
    c = ok;
    c.context = 100;
    expect_config_error(c, "model.context");
    c = ok;
    c.rope_theta = 10000.0f;
    expect_config_error(c, "model.rope_theta");
    dt_model_config g = {.n_layer = 2, .d_model = 64, .n_head = 4, .vocab = 256, .context = 64, .n_classes = 10};
    expect_config_error(g, "model.n_classes");
    /* Layout: every float owned once; the file count is the parameter count. */
    dt_alloc a;
    dt_alloc_init(&a);
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &ok, &a, 2, 784, DT_SLAB_PARAMS), DT_OK);
    assert_int_equal(m.ps.n_tensors, DT_VIT_NPARAMS);
    assert_int_equal(dt_params_file_count(&m.ps), dt_model_num_params(&m.cfg));
    assert_int_equal(m.ps.tensors[DT_VIT_P_POS].rows, 50); /* 49 patches + the class token */
    assert_int_equal(m.ps.tensors[DT_VIT_P_PATCHW].cols, 16);
    assert_int_equal(m.ps.tensors[DT_VIT_P_POS].decay, 0);
    /* A pixel or a label out of range is refused, not read. */
    int32_t *px = tu_malloc(2 * 784 * sizeof(int32_t)), *lab = tu_malloc(2 * 784 * sizeof(int32_t));
    px[100] = 256;
    assert_int_equal(dt_model_forward(&ctx, &m, px, lab, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "pixel"));
    px[100] = 3;
    lab[784] = 10;
    assert_int_equal(dt_model_forward(&ctx, &m, px, lab, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "label 10"));
    free(px), free(lab);
    dt_model_free(&m);
    /* A sample is one image: training.seq_len follows the model and may not be set apart. */
    dt_run_cfg r;
    dt_run_cfg_defaults(&r);
    assert_int_equal(dt_cfg_set(&ctx, &r, "model.preset", "vit-tiny"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_OK);
    assert_int_equal(r.train.seq_len, 64);
    assert_int_equal(dt_cfg_set(&ctx, &r, "training.seq_len", "32"), DT_OK);
    assert_int_equal(dt_cfg_finish(&ctx, &r), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "training.seq_len"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_shapes_are_refused_naming_the_key),
        cmocka_unit_test(test_presets_and_parameter_counts),
        cmocka_unit_test(test_layout_tiles_the_slab_and_init_follows_gpt2),
        cmocka_unit_test(test_vocabulary_chunks_are_units),
        cmocka_unit_test(test_llama_presets_and_published_parameter_counts),
        cmocka_unit_test(test_llama_layout_names_and_init),
        cmocka_unit_test(test_vit_presets_layout_and_rules),
        cmocka_unit_test(test_static_loss_scale_is_exact),
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
