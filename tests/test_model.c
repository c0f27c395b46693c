/* The model's structure: config validation naming the key, presets and published parameter
 * counts (GPT-2, LLaMA, ViT), the parameter tables, layouts and units, initialisation
 * statistics. The trainer on these models: test_model_train.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt2/gpt2.h"
#include "model/llama/llama.h"
#include "model/vit/vit.h"
#include "model/model.h"
#include "train/keys.h"
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

/* Mixture of experts (model/llama/moe.h): Mixtral-8x7B-v0.1's published count, FLOPs by the
 * active parameters, the table (router, one unit per expert: w1 | w3 adjacent, then w2, HF
 * names) and the rules naming their key. */
static void test_mixtral_presets_count_and_layout(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, "mixtral-8x7b", &c), DT_OK);
    printf("  mixtral-8x7b: %zu parameters\n", dt_model_num_params(&c));
    assert_int_equal(dt_model_num_params(&c), 46702792704ull); /* the published 46.7 B */
    assert_int_equal(c.d_ff, 0);
    assert_int_equal(c.expert_d_ff, 14336);
    /* 6 N per token with N the active parameters (2 of 8 experts), + attention 12 L T C */
    double C = 4096, layer = C * (4096 + 2 * 1024) + 4096 * C + 8 * C + 2 * 3 * C * 14336 + 2 * C;
    double want = 6.0 * (32 * layer + C + 32000 * C) + 12.0 * 32 * 1024 * C;
    assert_true(fabs(dt_model_flops_per_token(&c, 1024) - want) < want * 1e-12);
    assert_int_equal(dt_model_preset(&ctx, "mixtral-tiny", &c), DT_OK);
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &c, &alloc, 2, 16, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    assert_int_equal(m.ps.layer_units, 2 + 4); /* [ln1, attention] [ln2, router] 4 x [expert] */
    assert_int_equal(dt_params_file_count(&m.ps), dt_model_num_params(&c));
    char name[128];
    dt_params_ext_name(&m.ps, 7, 1, name, sizeof name);
    assert_string_equal(name, "model.layers.1.block_sparse_moe.gate.weight");
    dt_params_ext_name(&m.ps, 8 + 3 * 2, 1, name, sizeof name);
    assert_string_equal(name, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
    dt_params_ext_name(&m.ps, 9 + 3 * 2, 1, name, sizeof name);
    assert_string_equal(name, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
    dt_params_ext_name(&m.ps, 10 + 3 * 2, 1, name, sizeof name);
    assert_string_equal(name, "model.layers.1.block_sparse_moe.experts.2.w2.weight");
    const float *p = m.ps.params;
    assert_true(dt_params_tensor(&m.ps, (float *)p, 9, 1) == dt_params_tensor(&m.ps, (float *)p, 8, 1) + 128 * 64);
    size_t o1, o2;
    int u1 = dt_params_unit_of(&m.ps, 8, 1, &o1), u2 = dt_params_unit_of(&m.ps, 10, 1, &o2);
    assert_int_equal(u1, u2);
    assert_int_equal(o1, 0);
    assert_int_equal(dt_params_unit_of(&m.ps, 8 + 3, 1, &o1), u1 + 1);
    dt_model_free(&m);
    /* the rules name their key */
    dt_model_config bad = c;
    bad.experts_topk = 5;
    expect_config_error(bad, "model.experts_topk");
    bad = c;
    bad.n_experts = 17;
    expect_config_error(bad, "model.n_experts");
    bad = c;
    bad.d_ff = 100;
    expect_config_error(bad, "model.d_ff");
    bad = (dt_model_config){.n_layer = 2, .d_model = 64, .n_head = 4, .vocab = 256, .context = 64, .expert_d_ff = 8};
    expect_config_error(bad, "model.expert_d_ff");
}

/* Routing ties (moe.h): with a zero router every probability is 1/E, so every token takes
 * experts 0 and 1 (ties: the lower expert index). With capacity factor 1.0 (B T k / E = B T / 2
 * choices per expert) experts 0 and 1 keep the lower half of the token indices (ties: the
 * lower token index): sequence 0 of a 2-sequence batch is untouched (its logits bitwise those
 * of the dropless run: causal attention reads only earlier tokens of its own sequence), the
 * other's MLP is dropped in every layer, and 2 layers x 2 experts x B T / 2 choices are
 * dropped. Also: the forward's loss = cross-entropy + the coefficients x the router losses, and
 * the router losses' values by hand. */
static void test_mixtral_routing_ties_and_capacity(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, "mixtral-tiny", &c), DT_OK);
    const int B = 2, T = 16, BT = B * T, V = c.vocab, Vp = c.vocab_padded;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &c, &alloc, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&m, 3);
    for (int l = 0; l < c.n_layer; l++)
        memset(dt_params_tensor(&m.ps, m.ps.params, 7, l), 0, (size_t)c.n_experts * c.d_model * sizeof(float));
    int32_t in[32], tg[32];
    for (int i = 0; i < BT; i++) in[i] = (i * 37 + 5) % V, tg[i] = (i * 11 + 3) % V;
    float loss0, loss1;
    m.moe_aux_coef = 0.5f, m.moe_z_coef = 0.25f;
    assert_int_equal(dt_model_forward(&ctx, &m, in, tg, &loss0), DT_OK);
    assert_int_equal(m.moe_dropped, 0);
    for (int l = 0; l < c.n_layer; l++)
        for (int t = 0; t < BT; t++) {
            assert_int_equal(dt_llama_moe_choices(&m, l)[2 * t], 0);
            assert_int_equal(dt_llama_moe_choices(&m, l)[2 * t + 1], 1);
        }
    /* N = L B T rows, each choosing experts 0 and 1 (fractions c_e / N = 1, 1, 0, 0), every
     * mean probability 1/4: aux = 4 (1/4 + 1/4) = 2 (= k whenever the probabilities are
     * uniform); z = log(4)^2 */
    assert_true(fabs(m.moe_aux - 2.0f) < 1e-6f);
    assert_true(fabs(m.moe_z - (float)(log(4.0) * log(4.0))) < 1e-5f);
    assert_true(fabs(loss0 - (m.moe_ce + 0.5f * m.moe_aux + 0.25f * m.moe_z)) < 1e-5f);
    float *dropless = malloc((size_t)BT * Vp * sizeof(float));
    memcpy(dropless, dt_model_logits(&m), (size_t)BT * Vp * sizeof(float));
    m.moe_capacity = 1.0f;
    assert_int_equal(dt_model_forward(&ctx, &m, in, tg, &loss1), DT_OK);
    assert_int_equal(m.moe_dropped, 2 * 2 * BT / 2);
    const float *lg = dt_model_logits(&m);
    assert_memory_equal(lg, dropless, (size_t)T * Vp * sizeof(float)); /* sequence 0 kept */
    int differ = 0;
    for (size_t i = (size_t)T * Vp; i < (size_t)BT * Vp; i++) differ += lg[i] != dropless[i];
    assert_true(differ > T * V / 2); /* sequence 1 lost its MLPs */
    assert_true(loss1 != loss0);
    free(dropless);
    dt_model_free(&m);
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
    c.d_model = 4096, c.n_head = 1, c.n_kv_head = 1; /* heads of 4096: beyond the frequency table */
    expect_config_error(c, "model.n_head");
    c = ok; /* RoPE scaling: model/rope.h (the frequencies: tests/test_rope.sh) */
    c.rope_scaling = 2, c.rope_factor = 8.0f, c.rope_original_context = 32;
    c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 1.0f;
    expect_config_error(c, "model.rope_high_freq_factor");
    c.rope_high_freq_factor = 4.0f;
    c.rope_beta_fast = 32.0f;
    expect_config_error(c, "model.rope_beta_fast");
    c.rope_beta_fast = 0.0f;
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_OK);
    c = ok;
    c.rope_scaling = 3, c.rope_factor = 4.0f, c.rope_original_context = 32;
    assert_int_equal(dt_model_config_validate(&ctx, &c), DT_OK);
    assert_true(c.rope_beta_fast == 32.0f && c.rope_beta_slow == 1.0f); /* the YaRN paper's */
    assert_true(c.rope_attention_factor == 0.0f);                      /* derived, not stored */
    c.rope_scaling = 4;
    expect_config_error(c, "model.rope_scaling");
    c = ok;
    c.rope_original_context = 32;
    expect_config_error(c, "model.rope_original_context");
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
    g.rope_theta = 0.0f, g.rope_scaling = 1, g.rope_factor = 2.0f;
    expect_config_error(g, "model.rope_scaling");
    g.rope_scaling = 0;
    expect_config_error(g, "model.rope_factor");
    g.rope_factor = 0.0f;
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
    c = ok;
    c.rope_original_context = 64;
    expect_config_error(c, "model.rope_original_context");
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
        cmocka_unit_test(test_mixtral_presets_count_and_layout),
        cmocka_unit_test(test_mixtral_routing_ties_and_capacity),
        cmocka_unit_test(test_llama_layout_names_and_init),
        cmocka_unit_test(test_vit_presets_layout_and_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
