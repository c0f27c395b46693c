/* LoRA and QLoRA on a mixture of experts (model/lora.h targets w1, w2, w3; ARCHITECTURE
 * decision 90), unit level:
 *  - the adapters' gradients through the whole MoE model (routing, top-k weights, the aux and
 *    z losses on, every expert its own adapters, attention adapters too) against the identity
 *    LoRA rests on: with W = W0 + s B A, dL/dA = s B^T dL/dW and dL/dB = s dL/dW A^T, where
 *    dL/dW is the full-training model's weight gradient (the MoE layer's own gradients, which
 *    tests/test_moe.sh checks against PyTorch) of the model holding the merged weights - formed
 *    in double from it; the loss alike (1e-5); fp32 and NF4 bases (the merged model holds the
 *    dequantized base);
 *  - every expert's adapters are distinct tensors with PEFT's Mixtral names;
 *  - refusals naming the key: gate/up/down on a MoE model, w1 on a dense one, lora.dropout with
 *    expert targets;
 *  - the trainable store is exactly the adapters (count by formula), each expert's adapters a
 *    unit of their own, and 2 training steps run with the memory plan equal to the allocator's
 *    high-water (fp32 and NF4 bases, DDP and ZeRO-3). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/family_impl.h"
#include "model/llama/llama.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "testutil.h"
#include "train/trainer.h"

static const unsigned TARGETS = (1u << DT_LORA_Q) | (1u << DT_LORA_V) | (1u << DT_LORA_W1) | (1u << DT_LORA_W2) |
                                (1u << DT_LORA_W3);

static dt_model_config moe_cfg(void) {
    return (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4, .n_kv_head = 2,
                             .d_ff = 0, .vocab = 300, .context = 16, .untied = 1, .rope_theta = 500.0f,
                             .norm_eps = 1e-5f, .n_experts = 4, .experts_topk = 2, .expert_d_ff = 64};
}

static void merged_gradients(int nf4) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc = moe_cfg();
    const int B = 2, T = 8, N = B * T, r = 3;
    const double s = 2.0; /* alpha 6 / rank 3 */
    dt_model q, f;
    dt_alloc aq, af;
    dt_alloc_init(&aq), dt_alloc_init(&af);
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {r, 6.0f, 0.0f, TARGETS, nf4, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(dt_model_init_opts(&ctx, &q, &mc, &o, &aq, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    o.lora = (dt_lora_cfg){0};
    assert_int_equal(dt_model_init_opts(&ctx, &f, &mc, &o, &af, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&q, 5);
    tu_fill_uniform(q.ps.params, q.ps.n_params, 0.3f, 9); /* B random too: every gradient non-zero */
    /* 4 attention sites... every expert's w1, w3, w2, each its own tensors */
    assert_int_equal(q.n_sites, 2 + 3 * mc.n_experts);
    char name[200];
    dt_params_ext_name(&q.ps, q.site_a[2 + 3 * 3 + 2] + 1, 1, name, sizeof name);
    assert_string_equal(name, "base_model.model.model.layers.1.block_sparse_moe.experts.3.w2.lora_B.weight");
    dt_params_name(&q.ps, q.site_a[2 + 3 * 1 + 1], 0, name, sizeof name);
    assert_string_equal(name, "model.layers.0.block_sparse_moe.experts.1.w3.lora_A.weight");
    /* the merged model: the base (NF4: dequantized), each adapted tensor + s B A */
    for (int id = 0; id < f.ps.n_tensors; id++)
        for (int l = 0; l < dt_params_copies(&f.ps, id); l++) {
            float *w = dt_params_tensor(&f.ps, f.ps.params, id, l);
            const dt_nf4 *t = dt_lora_nf4(&q, id, l);
            if (t) dt_nf4_dequantize(w, t, 0, t->n);
            else memcpy(w, dt_params_tensor(&q.base, q.base.params, id, l), f.ps.tensors[id].rows * f.ps.tensors[id].cols * sizeof(float));
        }
    for (int i = 0; i < q.n_sites; i++) {
        const dt_lora_site *st = &q.sites[i];
        const size_t C = f.ps.tensors[st->id].cols;
        for (int l = 0; l < mc.n_layer; l++) {
            const float *A = dt_params_tensor(&q.ps, q.ps.params, q.site_a[i], l);
            const float *Bm = dt_params_tensor(&q.ps, q.ps.params, q.site_a[i] + 1, l);
            float *w = dt_params_tensor(&f.ps, f.ps.params, st->id, l);
            for (size_t j = 0; j < st->rows; j++)
                for (size_t c = 0; c < C; c++) {
                    double acc = 0;
                    for (int k = 0; k < r; k++) acc += (double)Bm[j * r + k] * A[(size_t)k * C + c];
                    w[(st->row0 + j) * C + c] = (float)(w[(st->row0 + j) * C + c] + s * acc);
                }
        }
    }
    int32_t in[16], tg[16];
    for (int i = 0; i < N; i++) in[i] = (i * 37 + 5) % mc.vocab, tg[i] = (i * 11 + 3) % mc.vocab;
    q.moe_aux_coef = f.moe_aux_coef = 0.05f, q.moe_z_coef = f.moe_z_coef = 0.01f;
    float lq, lf;
    dt_params_zero_grad(&q.ps), dt_params_zero_grad(&f.ps);
    assert_int_equal(dt_model_forward(&ctx, &q, in, tg, &lq), DT_OK);
    assert_int_equal(dt_model_forward(&ctx, &f, in, tg, &lf), DT_OK);
    dt_model_backward(&q, 1.0f), dt_model_backward(&f, 1.0f);
    printf("  %s base: LoRA loss %.7f (aux %.5f, z %.5f), merged model %.7f\n", nf4 ? "nf4" : "fp32", lq, q.moe_aux,
           q.moe_z, lf);
    assert_true(isfinite(lq) && fabs(lq - lf) <= 1e-5 * fabs(lf));
    double worst = 0;
    int nonzero = 0;
    for (int i = 0; i < q.n_sites; i++) {
        const dt_lora_site *st = &q.sites[i];
        const size_t C = f.ps.tensors[st->id].cols, R = st->rows;
        for (int l = 0; l < mc.n_layer; l++) {
            const float *A = dt_params_tensor(&q.ps, q.ps.params, q.site_a[i], l);
            const float *Bm = dt_params_tensor(&q.ps, q.ps.params, q.site_a[i] + 1, l);
            const float *dA = dt_params_tensor(&q.ps, q.ps.grads, q.site_a[i], l);
            const float *dB = dt_params_tensor(&q.ps, q.ps.grads, q.site_a[i] + 1, l);
            const float *G = dt_params_tensor(&f.ps, f.ps.grads, st->id, l) + st->row0 * C;
            double *rA = calloc((size_t)r * C, sizeof(double)), *rB = calloc(R * r, sizeof(double));
            for (int k = 0; k < r; k++)
                for (size_t c = 0; c < C; c++)
                    for (size_t j = 0; j < R; j++) rA[k * C + c] += s * Bm[j * r + k] * G[j * C + c];
            for (size_t j = 0; j < R; j++)
                for (int k = 0; k < r; k++)
                    for (size_t c = 0; c < C; c++) rB[j * r + k] += s * G[j * C + c] * A[(size_t)k * C + c];
            worst = tu_worse(worst, tu_rel_err(dA, rA, (size_t)r * C));
            worst = tu_worse(worst, tu_rel_err(dB, rB, R * r));
            for (size_t e = 0; e < R * r; e++) nonzero += dB[e] != 0.0f;
            free(rA), free(rB);
        }
    }
    assert_true(nonzero > 0);
    char what[128];
    snprintf(what, sizeof what, "%s base: every adapter's dA, dB (%d sites x %d layers) vs s B^T dW, s dW A^T",
             nf4 ? "nf4" : "fp32", q.n_sites, mc.n_layer);
    tu_report(what, worst, 1e-4);
    dt_model_free(&q), dt_model_free(&f);
}

static void test_merged_gradients(void **state) {
    (void)state;
    merged_gradients(0);
    merged_gradients(1);
}

static void expect_refused(dt_model_config mc, unsigned targets, float dropout, const char *key, const char *also) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_config_validate(&ctx, &mc), DT_OK);
    dt_lora_cfg lora = {4, 8.0f, dropout, targets, 0, 0};
    assert_int_not_equal(dt_lora_validate(&ctx, &mc, &lora), DT_OK);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, key));
    assert_non_null(strstr(ctx.err, also));
}

static void test_bad_targets(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    unsigned t;
    assert_int_equal(dt_lora_parse_targets(&ctx, "q,k,v,o,w1,w2,w3", &t), DT_OK);
    assert_int_equal(t, (1u << DT_LORA_Q) | (1u << DT_LORA_K) | (1u << DT_LORA_V) | (1u << DT_LORA_O) |
                            (1u << DT_LORA_W1) | (1u << DT_LORA_W2) | (1u << DT_LORA_W3));
    char buf[64];
    dt_lora_targets_str(t, buf, sizeof buf);
    assert_string_equal(buf, "q,k,v,o,w1,w2,w3");
    dt_model_config moe = moe_cfg(), dense = moe_cfg();
    dense.n_experts = dense.experts_topk = dense.expert_d_ff = 0, dense.d_ff = 64;
    for (int g = DT_LORA_GATE; g <= DT_LORA_DOWN; g++) expect_refused(moe, 1u << g, 0.0f, "lora.targets", "w1");
    expect_refused(dense, 1u << DT_LORA_W2, 0.0f, "lora.targets", "n_experts");
    expect_refused(moe, TARGETS, 0.1f, "lora.dropout", "w1");
    dt_lora_cfg ok = {4, 8.0f, 0.1f, 1u << DT_LORA_Q, 0, 0}; /* dropout on the attention's adapters alone */
    assert_int_equal(dt_lora_validate(&ctx, &moe, &ok), DT_OK);
}

static void test_store_and_plan(void **state) {
    (void)state;
    int checked = 0;
    for (int nf4 = 0; nf4 <= 1; nf4++)
        for (int z = 0; z < 2; z++) {
            dt_ctx ctx;
            dt_ctx_init(&ctx);
            dt_train_cfg c;
            dt_train_cfg_defaults(&c);
            c.preset[0] = 0;
            c.model = moe_cfg();
            c.micro_batch = 2, c.seq_len = 16, c.steps = 2;
            c.model_opts.lora = (dt_lora_cfg){4, 8.0f, 0.0f, TARGETS, nf4, 0};
            c.parallel.strategy = z ? DT_STRAT_ZERO3 : DT_STRAT_DDP;
            size_t plan[DT_MEM_NKINDS];
            assert_int_equal(dt_trainer_mem_plan(&ctx, &c, 1, 1, 0, plan), DT_OK);
            dt_trainer tr;
            assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
            /* per layer: q (4x48 + 48x4), v (4x48 + 24x4), 4 experts x (w1, w3: 4x48 + 64x4; w2: 4x64 + 48x4) */
            const size_t per_expert = 2 * (192 + 256) + (256 + 192);
            assert_int_equal(dt_lora_expert_floats(&c.model, &c.model_opts.lora), per_expert);
            assert_int_equal(tr.model.ps.n_params, 2 * (384 + 288 + 4 * per_expert));
            assert_int_equal(tr.model.ps.n_params, dt_lora_num_params(&c.model, &c.model_opts.lora));
            /* units: a layer's dense adapters, then each expert's own (as its weights are) */
            assert_int_equal(tr.model.ps.layer_units, 1 + 4);
            assert_int_equal(tr.model.ps.n_units, 2 * (1 + 4));
            dt_step_stats st;
            for (int s = 0; s < 2; s++) assert_int_equal(dt_trainer_step(&ctx, &tr, &st), DT_OK);
            assert_true(isfinite(st.loss));
            for (int k = 0; k < DT_MEM_NKINDS; k++) {
                if (plan[k] != tr.alloc.peak[k])
                    printf("  nf4=%d %s kind %d: plan %zu, allocator %zu\n", nf4, z ? "zero3" : "ddp", k, plan[k],
                           tr.alloc.peak[k]);
                assert_int_equal(plan[k], tr.alloc.peak[k]);
            }
            checked++;
            dt_trainer_free(&tr);
        }
    printf("  MoE LoRA store = the adapters by formula; plan == allocator high-water in %d configurations\n", checked);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merged_gradients),
        cmocka_unit_test(test_bad_targets),
        cmocka_unit_test(test_store_and_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
