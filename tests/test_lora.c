/* LoRA (model/lora.h; ARCHITECTURE decision 49), unit level:
 *  - the adapter arithmetic bitwise equal on 1 and 3 threads;
 *  - the adapted linear layer (the families' matmul helper) of a fused call (LLaMA's
 *    q|k|v, GPT-2's c_attn with its bias) against a naive double reference written from the
 *    paper, y = x W0^T + s (x A^T) B^T: output, dinp, dA, dB, in fp32 and bf16 (the base GEMM
 *    on bf16 operands; the reference rounds x and W0 alike), and the adapters of other
 *    projections untouched; the same with lora.dropout 0.3 in a training forward, the
 *    reference's drop(x) = x mask / (1 - p) built from the public mask (dt_lora_drop_keep);
 *  - dropout masks: kept fraction within 0.005 of 1 - p (p = 0.1, 0.5); an evaluation
 *    forward has no dropout (bitwise the p = 0 model's loss), a training forward has, and
 *    repeats bitwise from the same counters;
 *  - bad configs refused naming the key: rank < 0, unknown or empty target, a target the
 *    family lacks (gpt2's gate), nf4 without LoRA, dropout < 0, >= 1 or NaN, vit;
 *  - training: the frozen base is bitwise unchanged after steps (fp32 and NF4 base), the
 *    adapters moved, the trainable store is exactly the adapters (count by formula);
 *  - the memory plan equals the allocator's high-water, kind by kind (fp32/bf16, fp32/NF4
 *    base, DDP/ZeRO-2/ZeRO-3, both families);
 *  - QLoRA: an NF4 base computes what the fp32 base holding the dequantized weights computes
 *    (loss within 1e-5, adapter gradients within 1e-5; bf16, also with the fused loss's
 *    16-bit head copy: 1e-4), and keeps the fp32 base's vocabulary chunks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "model/family_impl.h"
#include "model/gpt2/gpt2.h"
#include "model/llama/llama.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "testutil.h"
#include "train/trainer.h"

static const unsigned ALL = (1u << DT_LORA_NDENSE) - 1; /* the dense targets */

static dt_model_config llama_cfg(void) {
    return (dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4, .n_kv_head = 2,
                             .d_ff = 72, .vocab = 300, .context = 16, .untied = 1, .rope_theta = 500.0f,
                             .norm_eps = 1e-5f};
}
static dt_model_config gpt2_cfg(void) {
    return (dt_model_config){.family = "gpt2", .n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 300, .context = 16};
}

static double bf(double v, int lowp) {
    if (!lowp) return v;
    float f = (float)v, w;
    uint16_t h;
    dt_to_lowp(DT_BF16, &h, &f, 1);
    dt_from_lowp(DT_BF16, &w, &h, 1);
    return w;
}

/* One fused call (id, OC) of layer l with every adapter random; p > 0: a training forward
 * and its backward with lora.dropout p. */
static void check_branch(dt_model_config mc, int id, int OC, int with_bias, int lowp, float p) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc al;
    dt_alloc_init(&al);
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, lowp ? DT_BF16 : DT_F32, 0, 0, {3, 6.0f, p, ALL, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (!strcmp(mc.family, "gpt2")) o.lora.targets &= ~(1u << DT_LORA_GATE);
    dt_model m;
    const int B = 2, T = 5, N = B * T, l = 1;
    assert_int_equal(dt_model_init_opts(&ctx, &m, &mc, &o, &al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    assert_true(m.lora && m.base.grads == NULL && m.base.params != NULL);
    dt_model_init_weights(&m, 11);
    tu_fill_uniform(m.ps.params, m.ps.n_params, 0.3f, 5); /* B random too: every gradient non-zero */
    dt_params_zero_grad(&m.ps);
    const int C = mc.d_model, r = 3;
    const double s = 2.0;
    float *x = tu_malloc((size_t)N * C * sizeof(float)), *out = tu_malloc((size_t)N * OC * sizeof(float));
    float *dout = tu_malloc((size_t)N * OC * sizeof(float)), *dinp = tu_malloc((size_t)N * C * sizeof(float));
    uint16_t *xh = tu_malloc((size_t)N * C * sizeof(uint16_t));
    tu_fill_uniform(x, (size_t)N * C, 1.0f, 7);
    tu_fill_uniform(dout, (size_t)N * OC, 1.0f, 8);
    dt_to_lowp(DT_BF16, xh, x, (size_t)N * C);
    const float *bias = with_bias ? dt_fam_param(&m, id + 1, l) : NULL;
    dt_mmin xin = {lowp ? NULL : x, lowp ? xh : NULL};
    dt_unit_need(&m, DT_UNIT_LAYER(&m.base, l), -1);
    const uint64_t seed = 77, seq0 = 1000003;
    m.lora_drop_on = p > 0.0f, m.lora_drop_seed = seed, m.lora_drop_seq0 = seq0;
    dt_fam_mm_forward(&m, out, xin, id, l, bias, N, C, OC);
    dt_fam_mm_backward(&m, dinp, id, l, NULL, dout, xin, N, C, OC);
    /* the reference */
    const float *W = dt_fam_param(&m, id, l);
    double *ro = calloc((size_t)N * OC, sizeof(double)), *rd = calloc((size_t)N * C, sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OC; j++) {
            double acc = bias ? bias[j] : 0.0;
            for (int c = 0; c < C; c++) acc += bf(x[n * C + c], lowp) * bf(W[(size_t)j * C + c], lowp);
            ro[n * OC + j] = acc;
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < OC; j++) acc += bf(dout[n * OC + j], lowp) * bf(W[(size_t)j * C + c], lowp);
            rd[n * C + c] = acc;
        }
    int used = 0;
    double worst_ab = 0;
    for (int i = 0; i < m.n_sites; i++) {
        const dt_lora_site *st = &m.sites[i];
        /* the site's column in the call: rows of the base tensors before it, from id */
        size_t col = st->row0;
        for (int t = id; t < st->id; t++) col += m.base.tensors[t].rows;
        const float *A = dt_params_unit_tensor(&m.ps, m.ps.unit_params, m.site_a[i], l);
        const float *Bm = dt_params_unit_tensor(&m.ps, m.ps.unit_params, m.site_a[i] + 1, l);
        const float *dA = dt_params_unit_tensor(&m.ps, m.ps.unit_grads, m.site_a[i], l);
        const float *dB = dt_params_unit_tensor(&m.ps, m.ps.unit_grads, m.site_a[i] + 1, l);
        const int rows = (int)st->rows;
        if (st->id < id || col + rows > (size_t)OC) {
            for (size_t e = 0; e < (size_t)r * C; e++) assert_true(dA[e] == 0.0f); /* not this call's */
            for (size_t e = 0; e < (size_t)rows * r; e++) assert_true(dB[e] == 0.0f);
            continue;
        }
        used++;
        /* drop(x) of this site (x itself at p = 0) and the mask's factor mask / (1 - p) */
        double *xd = calloc((size_t)N * C, sizeof(double)), *fm = calloc((size_t)N * C, sizeof(double));
        for (int n = 0; n < N; n++) {
            uint64_t key = dt_lora_drop_key(seed, seq0 + (uint64_t)(n / T), n % T, l, i);
            for (int c = 0; c < C; c++) {
                fm[n * C + c] = p > 0.0f ? dt_lora_drop_keep(key, c, p) / (1.0 - p) : 1.0;
                xd[n * C + c] = bf(x[n * C + c], lowp) * fm[n * C + c];
            }
        }
        double *u = calloc((size_t)N * r, sizeof(double)), *du = calloc((size_t)N * r, sizeof(double));
        for (int n = 0; n < N; n++)
            for (int k = 0; k < r; k++)
                for (int c = 0; c < C; c++) u[n * r + k] += xd[n * C + c] * A[k * C + c];
        for (int n = 0; n < N; n++)
            for (int j = 0; j < rows; j++) {
                double acc = 0;
                for (int k = 0; k < r; k++) acc += u[n * r + k] * Bm[j * r + k];
                ro[n * OC + col + j] += s * acc;
            }
        for (int n = 0; n < N; n++)
            for (int k = 0; k < r; k++) {
                for (int j = 0; j < rows; j++) du[n * r + k] += dout[n * OC + col + j] * Bm[j * r + k];
                du[n * r + k] *= s;
            }
        double *rA = calloc((size_t)r * C, sizeof(double)), *rB = calloc((size_t)rows * r, sizeof(double));
        for (int k = 0; k < r; k++)
            for (int c = 0; c < C; c++)
                for (int n = 0; n < N; n++) rA[k * C + c] += du[n * r + k] * xd[n * C + c];
        for (int j = 0; j < rows; j++)
            for (int k = 0; k < r; k++) {
                for (int n = 0; n < N; n++) rB[j * r + k] += s * dout[n * OC + col + j] * u[n * r + k];
            }
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                for (int k = 0; k < r; k++) rd[n * C + c] += fm[n * C + c] * du[n * r + k] * A[k * C + c];
        worst_ab = tu_worse(worst_ab, tu_rel_err(dA, rA, (size_t)r * C));
        worst_ab = tu_worse(worst_ab, tu_rel_err(dB, rB, (size_t)rows * r));
        free(u), free(du), free(rA), free(rB), free(xd), free(fm);
    }
    assert_true(used >= 1);
    char what[128];
    const char *prec = lowp ? "bf16" : "fp32";
    snprintf(what, sizeof what, "%s call %d (%d adapters) %s dropout %g: out", mc.family, id, used, prec, (double)p);
    tu_report(what, tu_rel_err(out, ro, (size_t)N * OC), lowp ? 1e-4 : 1e-5);
    snprintf(what, sizeof what, "%s call %d %s dropout %g: dinp", mc.family, id, prec, (double)p);
    tu_report(what, tu_rel_err(dinp, rd, (size_t)N * C), lowp ? 1e-4 : 1e-5);
    snprintf(what, sizeof what, "%s call %d %s dropout %g: dA, dB", mc.family, id, prec, (double)p);
    tu_report(what, worst_ab, 1e-5);
    free(ro), free(rd), free(x), free(out), free(dout), free(dinp), free(xh);
    dt_model_free(&m);
}

static void test_adapter_branch(void **state) {
    (void)state;
    dt_model_config lc = llama_cfg(), gc = gpt2_cfg();
    const int QW = (4 + 2 * 2) * 12;
    for (int lowp = 0; lowp <= 1; lowp++)
        for (int d = 0; d <= 1; d++) {
            const float p = d ? 0.3f : 0.0f;
            check_branch(lc, DT_LLAMA_P_WQ, QW, 0, lowp, p);        /* q|k|v fused: three adapters */
            check_branch(lc, DT_LLAMA_P_WGATE, 2 * 72, 0, lowp, p); /* gate|up */
            check_branch(lc, DT_LLAMA_P_WDOWN, 48, 0, lowp, p);
            check_branch(gc, DT_GPT2_P_QKVW, 3 * 48, 1, lowp, p); /* thirds of one tensor, with bias */
            check_branch(gc, DT_GPT2_P_FCPROJW, 48, 1, lowp, p);
        }
}

/* The adapter arithmetic gives the same bits on 1 and 3 threads (each output element is one
 * sum in a fixed order), fp32 and bf16 inputs. */
static void test_thread_bits(void **state) {
    (void)state;
    for (int lowp = 0; lowp <= 1; lowp++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        dt_alloc al;
        dt_alloc_init(&al);
        dt_model_config mc = llama_cfg();
        dt_model_opts o = {DT_RECOMPUTE_NONE, 1, lowp ? DT_BF16 : DT_F32, 0, 0, {20, 6.0f, 0.0f, ALL, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        dt_model m;
        const int B = 3, T = 16, N = B * T, C = 48, OC = 96;
        assert_int_equal(dt_model_init_opts(&ctx, &m, &mc, &o, &al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
        tu_fill_uniform(m.ps.params, m.ps.n_params, 0.3f, 5);
        float *x = tu_malloc((size_t)N * C * sizeof(float)), *dout = tu_malloc((size_t)N * OC * sizeof(float));
        uint16_t *xh = tu_malloc((size_t)N * C * sizeof(uint16_t));
        tu_fill_uniform(x, (size_t)N * C, 1.0f, 7);
        tu_fill_uniform(dout, (size_t)N * OC, 1.0f, 8);
        dt_to_lowp(DT_BF16, xh, x, (size_t)N * C);
        float *res[2];
        for (int t = 0; t < 2; t++) {
            omp_set_num_threads(t ? 3 : 1);
            float *out = tu_malloc((size_t)N * OC * sizeof(float)), *dinp = tu_malloc((size_t)N * C * sizeof(float));
            dt_params_zero_grad(&m.ps);
            dt_lora_mm_forward(&m, out, lowp ? NULL : x, lowp ? xh : NULL, DT_LLAMA_P_WQ, 1, N, C, OC);
            dt_lora_mm_backward(&m, dinp, dout, lowp ? NULL : x, lowp ? xh : NULL, DT_LLAMA_P_WQ, 1, N, C, OC);
            res[t] = tu_malloc(((size_t)N * (OC + C) + m.ps.n_params) * sizeof(float));
            memcpy(res[t], out, (size_t)N * OC * sizeof(float));
            memcpy(res[t] + (size_t)N * OC, dinp, (size_t)N * C * sizeof(float));
            memcpy(res[t] + (size_t)N * (OC + C), m.ps.grads, m.ps.n_params * sizeof(float));
            free(out), free(dinp);
        }
        omp_set_num_threads(2);
        assert_memory_equal(res[0], res[1], ((size_t)N * (OC + C) + m.ps.n_params) * sizeof(float));
        printf("  adapters (rank 20, q|k|v) %s: out, dinp, dA, dB bitwise equal on 1 and 3 threads\n",
               lowp ? "bf16" : "fp32");
        free(res[0]), free(res[1]), free(x), free(dout), free(xh);
        dt_model_free(&m);
    }
}

static void expect_refused(dt_model_config mc, dt_lora_cfg lora, const char *key) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_config_validate(&ctx, &mc), DT_OK);
    assert_int_not_equal(dt_lora_validate(&ctx, &mc, &lora), DT_OK);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, key));
}

static void test_bad_config(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    unsigned t;
    assert_int_equal(dt_lora_parse_targets(&ctx, "q, v,down", &t), DT_OK);
    assert_int_equal(t, (1u << DT_LORA_Q) | (1u << DT_LORA_V) | (1u << DT_LORA_DOWN));
    assert_int_not_equal(dt_lora_parse_targets(&ctx, "q,qk", &t), DT_OK);
    assert_non_null(strstr(ctx.err, "lora.targets")), assert_non_null(strstr(ctx.err, "'qk'"));
    assert_int_not_equal(dt_lora_parse_targets(&ctx, "", &t), DT_OK);
    assert_non_null(strstr(ctx.err, "lora.targets"));
    const dt_lora_cfg ok = {4, 8.0f, 0.0f, 1u << DT_LORA_Q, 0, 0};
    dt_lora_cfg b = ok;
    b.rank = -1;
    expect_refused(llama_cfg(), b, "lora.rank");
    b = ok, b.dropout = -0.1f;
    expect_refused(llama_cfg(), b, "lora.dropout");
    b = ok, b.dropout = 1.0f;
    expect_refused(llama_cfg(), b, "lora.dropout");
    b = ok, b.dropout = NAN;
    expect_refused(llama_cfg(), b, "lora.dropout");
    b = ok, b.dropout = 0.5f;
    {
        dt_model_config lc = llama_cfg();
        assert_int_equal(dt_model_config_validate(&ctx, &lc), DT_OK);
        assert_int_equal(dt_lora_validate(&ctx, &lc, &b), DT_OK);
    }
    b = ok, b.alpha = -1.0f;
    expect_refused(llama_cfg(), b, "lora.alpha");
    b = ok, b.targets = 1u << DT_LORA_GATE;
    expect_refused(gpt2_cfg(), b, "lora.targets");
    b = ok, b.rank = 0, b.nf4 = 1;
    expect_refused(llama_cfg(), b, "lora.base_dtype");
    dt_model_config vit;
    assert_int_equal(dt_model_preset(&ctx, "vit-tiny", &vit), DT_OK);
    expect_refused(vit, ok, "lora.rank");
    /* FLOPs per token: 4 N for the frozen base (forward and dinp), 6 per adapter parameter,
     * the attention's 12 L T C as before (llama_flops_per_token's N) */
    {
        dt_model_config lc = llama_cfg();
        assert_int_equal(dt_model_config_validate(&ctx, &lc), DT_OK);
        const double C = 48, L = 2, T = 16, F = 72, q = 48, kv = 24, V = 300;
        double n = L * (C * (q + 2 * kv) + q * C + 3 * C * F + 2 * C) + C + V * C;
        double want = 4 * n + 12 * L * T * C + 6.0 * (double)dt_lora_num_params(&lc, &ok);
        assert_true(fabs(dt_lora_flops_per_token(&lc, &ok, 16) - want) <= 1e-9 * want);
        dt_lora_cfg off = ok;
        off.rank = 0;
        assert_true(dt_lora_flops_per_token(&lc, &off, 16) == dt_model_flops_per_token(&lc, 16));
    }
    /* the trainer refuses the same before allocating */
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    c.model = llama_cfg();
    c.model_opts.lora = ok;
    c.model_opts.lora.rank = -3;
    assert_int_not_equal(dt_train_cfg_validate(&ctx, &c), DT_OK);
    assert_non_null(strstr(ctx.err, "lora.rank"));
}

static dt_train_cfg lora_train(dt_model_config mc, int nf4, dt_dtype prec, dt_strategy strat) {
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    c.preset[0] = 0;
    c.model = mc;
    c.micro_batch = 2;
    c.seq_len = 16;
    c.steps = 4;
    c.sched.lr = 1e-2f;
    c.model_opts.compute = prec;
    c.model_opts.lora = (dt_lora_cfg){4, 8.0f, 0.0f, (1u << DT_LORA_Q) | (1u << DT_LORA_V) | (1u << DT_LORA_DOWN), nf4, 0};
    c.parallel.strategy = strat;
    return c;
}

static void test_frozen_base(void **state) {
    (void)state;
    for (int nf4 = 0; nf4 <= 1; nf4++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        dt_train_cfg c = lora_train(llama_cfg(), nf4, DT_F32, DT_STRAT_DDP);
        dt_trainer tr;
        assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
        dt_model *m = &tr.model;
        assert_int_equal(m->ps.n_params, dt_lora_num_params(&c.model, &c.model_opts.lora));
        /* per layer: q (4x48 + 48x4), v (4x48 + 24x4), down (4x72 + 48x4) */
        assert_int_equal(m->ps.n_params, 2 * (384 + 288 + 480));
        assert_true(m->ps.n_units == 2 && m->ps.n_pre_units == 0);
        /* initial adapters: lora_B zeros, lora_A of standard deviation 1/sqrt(in) */
        for (int id = 0; id < m->ps.n_tensors; id++) {
            const dt_tensor_info *t = &m->ps.tensors[id];
            double ss = 0;
            size_t n = t->rows * t->cols;
            for (int l = 0; l < 2; l++)
                for (size_t i = 0; i < n; i++) {
                    double v = dt_params_tensor(&m->ps, m->ps.params, id, l)[i];
                    ss += v * v;
                }
            double sd = sqrt(ss / (2.0 * (double)n));
            if (id % 2) assert_true(ss == 0.0);
            else assert_true(fabs(sd * sqrt((double)t->cols) - 1.0) < 0.1);
        }
        /* AdamW: every adapter value decays (optimizer.weight_decay; both are matrices) */
        dt_param_segment *seg;
        int nseg;
        assert_int_equal(dt_params_segments(&ctx, &m->ps, &seg, &nseg), DT_OK);
        size_t covered = 0;
        for (int i = 0; i < nseg; i++) assert_true(seg[i].decay == 1), covered += seg[i].len;
        assert_int_equal(covered, m->ps.n_params);
        free(seg);
        float *before = tu_malloc(m->base.n_params * sizeof(float));
        memcpy(before, m->base.params, m->base.n_params * sizeof(float));
        uint64_t h0 = dt_lora_base_hash(m);
        float *a0 = tu_malloc(m->ps.n_params * sizeof(float));
        memcpy(a0, m->ps.params, m->ps.n_params * sizeof(float));
        float first = 0, last = 0;
        for (int s = 0; s < 4; s++) {
            dt_step_stats st;
            assert_int_equal(dt_trainer_step(&ctx, &tr, &st), DT_OK);
            if (s == 0) first = st.loss;
            last = st.loss;
        }
        assert_memory_equal(before, m->base.params, m->base.n_params * sizeof(float));
        assert_true(dt_lora_base_hash(m) == h0);
        size_t moved = 0;
        for (size_t i = 0; i < m->ps.n_params; i++) moved += m->ps.params[i] != a0[i];
        printf("  %s base: bitwise unchanged after 4 steps; %zu of %zu adapter values moved; loss %.5f -> %.5f\n",
               nf4 ? "nf4" : "fp32", moved, m->ps.n_params, first, last);
        assert_true(moved > m->ps.n_params / 2);
        free(before), free(a0);
        dt_trainer_free(&tr);
    }
}

static void test_plan_equals_allocator(void **state) {
    (void)state;
    int checked = 0;
    for (int fam = 0; fam < 2; fam++)
        for (int nf4 = 0; nf4 <= 1; nf4++)
            for (int pi = 0; pi < 2; pi++)
                for (int z = 0; z < 3; z++) {
                    dt_ctx ctx;
                    dt_ctx_init(&ctx);
                    dt_train_cfg c = lora_train(fam ? gpt2_cfg() : llama_cfg(), nf4, pi ? DT_BF16 : DT_F32,
                                                z == 2 ? DT_STRAT_ZERO3 : z ? DT_STRAT_ZERO2 : DT_STRAT_DDP);
                    c.model_opts.fused_loss = 1;
                    size_t plan[DT_MEM_NKINDS];
                    assert_int_equal(dt_trainer_mem_plan(&ctx, &c, 1, 1, 0, plan), DT_OK);
                    dt_trainer tr;
                    assert_int_equal(dt_trainer_init(&ctx, &tr, &c, NULL), DT_OK);
                    dt_step_stats st;
                    assert_int_equal(dt_trainer_step(&ctx, &tr, &st), DT_OK);
                    for (int k = 0; k < DT_MEM_NKINDS; k++) {
                        if (plan[k] != tr.alloc.peak[k])
                            printf("  %s nf4=%d %s %s kind %d: plan %zu, allocator %zu\n", c.model.family, nf4,
                                   pi ? "bf16" : "fp32", z == 2 ? "zero3" : z ? "zero2" : "ddp", k, plan[k], tr.alloc.peak[k]);
                        assert_int_equal(plan[k], tr.alloc.peak[k]);
                    }
                    checked++;
                    dt_trainer_free(&tr);
                }
    printf("  plan == allocator high-water, every kind, in %d LoRA configurations\n", checked);
}

/* QLoRA: the NF4 base against an fp32 base holding its dequantized weights. */
static void nf4_vs_dequantized(dt_dtype prec, int fused) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc = llama_cfg();
    const int B = 2, T = 8, N = B * T;
    dt_model q, f;
    dt_alloc aq, af;
    dt_alloc_init(&aq), dt_alloc_init(&af);
    /* fused: the fused loss in blocks of 5 rows (bf16: a 16-bit copy of the whole head) */
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, prec, fused, 5, {4, 8.0f, 0.0f, ALL, 1, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(dt_model_init_opts(&ctx, &q, &mc, &o, &aq, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    o.lora.nf4 = 0;
    assert_int_equal(dt_model_init_opts(&ctx, &f, &mc, &o, &af, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&q, 3);
    dt_model_init_weights(&f, 3);
    size_t nq = 0;
    for (int id = 0; id < f.base.n_tensors; id++)
        for (int l = 0; l < dt_params_copies(&f.base, id); l++) {
            const dt_nf4 *t = dt_lora_nf4(&q, id, l);
            if (t) dt_nf4_dequantize(dt_fam_param(&f, id, l), t, 0, t->n), nq += t->n;
        }
    /* NF4 memory: the quantized tensors (every layer matmul) take no fp32 room */
    assert_int_equal(nq, 2 * (48 * 96 + 48 * 48 + 3 * 48 * 72));
    assert_int_equal(q.base.n_params, f.base.n_params - nq);
    /* the NF4 base keeps the fp32 base's vocabulary chunks (not ones of its tiny layer blocks) */
    for (int id = 0; id < f.base.n_tensors; id++)
        if (!dt_lora_nf4(&q, id, 0)) assert_int_equal(dt_params_chunks(&q.base, id), dt_params_chunks(&f.base, id));
    assert_true(dt_params_chunks(&f.base, DT_LLAMA_P_EMBED) > 1);
    tu_fill_uniform(q.ps.params, q.ps.n_params, 0.2f, 9);
    memcpy(f.ps.params, q.ps.params, q.ps.n_params * sizeof(float));
    int32_t in[16], tg[16];
    for (int i = 0; i < N; i++) in[i] = (i * 37 + 5) % mc.vocab, tg[i] = (i * 11 + 3) % mc.vocab;
    float lq, lf;
    dt_params_zero_grad(&q.ps), dt_params_zero_grad(&f.ps);
    assert_int_equal(dt_model_forward(&ctx, &q, in, tg, &lq), DT_OK);
    assert_int_equal(dt_model_forward(&ctx, &f, in, tg, &lf), DT_OK);
    dt_model_backward(&q, 1.0f), dt_model_backward(&f, 1.0f);
    double *gf = tu_malloc(f.ps.n_params * sizeof(double));
    tu_to_double(gf, f.ps.grads, f.ps.n_params);
    printf("  %s%s: nf4 loss %.7f, dequantized fp32 base loss %.7f\n", dt_dtype_name(prec), fused ? " fused loss" : "",
           lq, lf);
    assert_true(fabs(lq - lf) <= 1e-5 * fabs(lf));
    tu_report("nf4 base vs its dequantized base: adapter gradients", tu_rel_err(q.ps.grads, gf, q.ps.n_params),
              prec == DT_F32 ? 1e-5 : 1e-4);
    free(gf);
    dt_model_free(&q), dt_model_free(&f);
}

static void test_nf4_equals_dequantized(void **state) {
    (void)state;
    nf4_vs_dequantized(DT_F32, 0);
    nf4_vs_dequantized(DT_BF16, 0);
    nf4_vs_dequantized(DT_BF16, 1);
}

/* The masks keep 1 - p of the elements (over sequences, positions, layers, sites, features)
 * and differ between sites and between neighbouring sequences. */
static void test_dropout_masks(void **state) {
    (void)state;
    const float ps[2] = {0.1f, 0.5f};
    for (int i = 0; i < 2; i++) {
        long kept = 0, n = 0, same_site = 0, same_seq = 0;
        for (uint64_t seq = 0; seq < 20; seq++)
            for (int t = 0; t < 10; t++)
                for (int l = 0; l < 2; l++)
                    for (int site = 0; site < 5; site++) {
                        uint64_t k = dt_lora_drop_key(3, seq, t, l, site), k2 = dt_lora_drop_key(3, seq, t, l, site + 1);
                        uint64_t k3 = dt_lora_drop_key(3, seq + 1, t, l, site);
                        for (int c = 0; c < 100; c++, n++) {
                            int a = dt_lora_drop_keep(k, c, ps[i]);
                            kept += a;
                            same_site += a == dt_lora_drop_keep(k2, c, ps[i]);
                            same_seq += a == dt_lora_drop_keep(k3, c, ps[i]);
                        }
                    }
        double f = (double)kept / n, q = ps[i], agree = q * q + (1 - q) * (1 - q);
        printf("  dropout %g: kept %.4f of %ld (want %.4f); agreement with the next site %.4f, the next sequence "
               "%.4f (independent: %.4f)\n", q, f, n, 1 - q, (double)same_site / n, (double)same_seq / n, agree);
        assert_true(fabs(f - (1 - q)) < 0.005);
        assert_true(fabs((double)same_site / n - agree) < 0.01);
        assert_true(fabs((double)same_seq / n - agree) < 0.01);
    }
}

/* An evaluation forward (dt_model_forward) has no dropout: the loss of a p = 0.5 model is
 * bitwise the p = 0 model's; a training forward's differs and repeats from the same counters. */
static void test_dropout_eval(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc = llama_cfg();
    const int B = 2, T = 8, N = B * T;
    int32_t in[16], tg[16];
    for (int i = 0; i < N; i++) in[i] = (i * 37 + 5) % 300, tg[i] = (i * 53 + 11) % 300;
    float loss[2][3];
    for (int d = 0; d < 2; d++) {
        dt_alloc al;
        dt_alloc_init(&al);
        dt_model_opts o = {DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {4, 8.0f, d ? 0.5f : 0.0f, ALL, 0, 0}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        dt_model m;
        assert_int_equal(dt_model_init_opts(&ctx, &m, &mc, &o, &al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
        dt_model_init_weights(&m, 11);
        tu_fill_uniform(m.ps.params, m.ps.n_params, 0.3f, 5); /* B non-zero: the adapters act */
        m.lora_drop_seed = 9, m.lora_drop_seq0 = 40;
        assert_int_equal(dt_model_forward(&ctx, &m, in, tg, &loss[d][0]), DT_OK);
        assert_int_equal(m.lora_drop_on, 0);
        dt_params_zero_grad(&m.ps);
        assert_int_equal(dt_model_forward_train(&ctx, &m, in, tg, 1.0f, &loss[d][1]), DT_OK);
        assert_int_equal(m.lora_drop_on, d);
        dt_model_backward(&m, 1.0f);
        assert_int_equal(dt_model_forward_train(&ctx, &m, in, tg, 1.0f, &loss[d][2]), DT_OK);
        dt_model_free(&m);
    }
    printf("  eval loss %.7f (p 0.5) == %.7f (p 0); training forward %.7f (p 0.5, twice: %.7f) vs %.7f (p 0)\n",
           (double)loss[1][0], (double)loss[0][0], (double)loss[1][1], (double)loss[1][2], (double)loss[0][1]);
    assert_memory_equal(&loss[1][0], &loss[0][0], sizeof(float));
    assert_memory_equal(&loss[0][1], &loss[0][0], sizeof(float));
    assert_memory_equal(&loss[1][2], &loss[1][1], sizeof(float));
    assert_true(fabsf(loss[1][1] - loss[0][1]) > 1e-4f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapter_branch), cmocka_unit_test(test_thread_bits), cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_frozen_base),    cmocka_unit_test(test_plan_equals_allocator),
        cmocka_unit_test(test_nf4_equals_dequantized), cmocka_unit_test(test_dropout_masks),
        cmocka_unit_test(test_dropout_eval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
