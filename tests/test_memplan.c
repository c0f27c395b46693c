/* The memory plan (dt_trainer_mem_plan) of every preset, for 2, 3 and 4 ranks:
 *  - per-rank total strictly decreases DDP > ZeRO-1 > ZeRO-2 > ZeRO-3 for every preset, the
 *    2-layer ones (gpt2-tiny, llama-tiny, vit-tiny, one layer ~40% of the model) included:
 *    the windows of ZeRO-2/3 hold sub-layer units (params.h), not whole layers;
 *  - ZeRO-3 model state (params + grads + optimizer) <= 1.1 x (16 Psi / N + 4 windows of the
 *    largest unit: two for parameters, two for gradients, 4 bytes a float);
 *  - every layer is 3 units, the largest at most 60% of a layer (LLaMA's gate|up, read by one
 *    GEMM, is about half of one), and no unit is larger than the largest layer unit (the
 *    vocabulary is cut into chunks of at most that);
 *  - with bf16 gradients on the wire (parallel.grad_dtype) only the communication buffers
 *    differ, and they are no larger than fp32's.
 * The plan equals the allocator's high-water of real runs (tests/test_memory.sh checks that
 * on the presets that fit this machine, and asserts the same order from the allocator); this
 * test extends the order and the bound to the presets that do not fit (up to 7B).
 * Shapes: micro-batch 1 x 64 tokens (ViT: one image), the default 25 MB buckets.
 * Activation checkpointing at the benchmark's shapes (docs/benchmarks.md: gpt2 and llama-100m
 * 4 x 256, vit-b16 8 images; one rank, the fused loss, the default): against `none` in the
 * same precision, selective saves >= 40% of the activation bytes and full >= 60%, in fp32,
 * bf16 and fp16 (whose layout is bf16's); 16-bit selective holds fewer bytes than fp32's and
 * 16-bit none fewer than fp32's none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "model/model.h"
#include "ops/ops.h"
#include "parallel/parallel.h"
#include "train/trainer.h"

static void plan_dtype(const char *preset, dt_strategy s, int N, dt_dtype grad, size_t bytes[DT_MEM_NKINDS],
                       double *total) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    assert_int_equal(dt_model_preset(&ctx, preset, &c.model), DT_OK);
    assert_int_equal(dt_model_config_validate(&ctx, &c.model), DT_OK);
    c.micro_batch = 1;
    c.seq_len = dt_model_family_of(&c.model)->images ? c.model.context : (c.model.context < 64 ? c.model.context : 64);
    c.parallel.strategy = s;
    c.parallel.grad_dtype = grad;
    assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, bytes), DT_OK);
    *total = 0;
    for (int k = 0; k < DT_MEM_NKINDS; k++) *total += (double)bytes[k];
}

static void plan(const char *preset, dt_strategy s, int N, size_t bytes[DT_MEM_NKINDS], double *total) {
    plan_dtype(preset, s, N, DT_F32, bytes, total);
}

/* The parameter layout (units, no slabs) of a validated copy of *mc into *ps. */
static void layout_of(dt_model_config *mc, dt_alloc *a, dt_params *ps) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_config_validate(&ctx, mc), DT_OK);
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(mc, t);
    dt_alloc_init(a);
    assert_int_equal(dt_params_init(&ctx, ps, t, n, mc->n_layer, a, 0), DT_OK);
}

static void test_every_preset_orders_and_bounds(void **state) {
    (void)state;
    int checked = 0;
    for (int f = 0; dt_model_families[f]; f++)
        for (const char *const *pp = dt_model_families[f]->presets; *pp; pp++) {
            dt_ctx ctx;
            dt_ctx_init(&ctx);
            dt_model_config mc;
            assert_int_equal(dt_model_preset(&ctx, *pp, &mc), DT_OK);
            dt_alloc a;
            dt_params ps;
            layout_of(&mc, &a, &ps);
            size_t U = 0;
            assert_int_equal(ps.layer_units, mc.n_experts ? 2 + mc.n_experts : 3); /* MoE: a unit per expert */
            printf("  %s: largest layer unit %.3f of a layer\n", *pp, (double)ps.layer_unit_max / (double)ps.layer_floats);
            assert_true(5 * ps.layer_unit_max <= 3 * ps.layer_floats);
            for (int u = 0; u < ps.n_units; u++) {
                assert_true(ps.unit_len[u] <= ps.layer_unit_max);
                if (ps.unit_len[u] > U) U = ps.unit_len[u];
            }
            double psi = (double)ps.n_params;
            dt_params_free(&ps);
            for (int N = 2; N <= 4; N++) {
                double tot[4];
                size_t b[4][DT_MEM_NKINDS];
                for (int s = 0; s < 4; s++) plan(*pp, (dt_strategy)s, N, b[s], &tot[s]);
                /* bf16 gradients on the wire: only the communication buffers change, and
                 * they do not grow (bf16 staging replaces f32 scratch). */
                for (int s = 0; s < 4; s++) {
                    size_t h[DT_MEM_NKINDS];
                    double th;
                    plan_dtype(*pp, (dt_strategy)s, N, DT_BF16, h, &th);
                    for (int k = 0; k < DT_MEM_NKINDS; k++)
                        if (k != DT_MEM_COMM) assert_true(h[k] == b[s][k]);
                    assert_true(h[DT_MEM_COMM] > 0 && h[DT_MEM_COMM] <= b[s][DT_MEM_COMM]);
                }
                double state3 = (double)(b[3][DT_MEM_PARAMS] + b[3][DT_MEM_GRADS] + b[3][DT_MEM_OPTIM]);
                double bound = 16.0 * psi / N + 4.0 * 4.0 * (double)U;
                printf("  %-15s N=%d  MiB per rank: ddp %10.3f  zero1 %10.3f  zero2 %10.3f  zero3 %10.3f"
                       "  (zero3 state %.3f, bound %.3f)\n", *pp, N, tot[0] / 1048576, tot[1] / 1048576,
                       tot[2] / 1048576, tot[3] / 1048576, state3 / 1048576, bound / 1048576);
                assert_true(state3 <= 1.1 * bound);
                assert_true(tot[0] > tot[1] && tot[1] > tot[2] && tot[2] > tot[3]);
                checked++;
            }
        }
    assert_true(checked >= 3 * 14);
}

/* Activation bytes planned for preset at micro-batch B x T (T 0: one image) on one rank. */
static double plan_acts(const char *preset, int B, int T, dt_dtype prec, dt_recompute r) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    assert_int_equal(dt_model_preset(&ctx, preset, &c.model), DT_OK);
    assert_int_equal(dt_model_config_validate(&ctx, &c.model), DT_OK);
    c.micro_batch = B;
    c.seq_len = T ? T : c.model.context;
    c.model_opts.compute = prec;
    c.model_opts.recompute = r;
    size_t bytes[DT_MEM_NKINDS];
    assert_int_equal(dt_trainer_mem_plan(&ctx, &c, 1, 1, 0, bytes), DT_OK);
    return (double)bytes[DT_MEM_ACTS];
}

static void test_checkpointing_savings(void **state) {
    (void)state;
    static const struct { const char *preset; int B, T; } w[] = {
        {"gpt2", 4, 256}, {"llama-100m", 4, 256}, {"vit-b16", 8, 0}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        static const dt_dtype precs[] = {DT_F32, DT_BF16, DT_F16};
        double a32[3] = {0, 0, 0}, a16[3] = {0, 0, 0};
        for (int pi = 0; pi < 3; pi++) {
            dt_dtype prec = precs[pi];
            double a[3];
            for (int r = 0; r < 3; r++) a[r] = plan_acts(w[i].preset, w[i].B, w[i].T, prec, (dt_recompute)r);
            if (!pi) memcpy(a32, a, sizeof a);
            if (pi == 1) memcpy(a16, a, sizeof a);
            double sel = 1 - a[DT_RECOMPUTE_SELECTIVE] / a[0], full = 1 - a[DT_RECOMPUTE_FULL] / a[0];
            printf("  %-10s %s: activations none %.1f, selective %.1f (-%.1f%%), full %.1f (-%.1f%%) MiB\n",
                   w[i].preset, dt_dtype_name(prec), a[0] / 1048576, a[1] / 1048576, 100 * sel, a[2] / 1048576,
                   100 * full);
            assert_true(sel >= 0.40 && full >= 0.60);
            if (pi) {
                assert_true(a[DT_RECOMPUTE_NONE] < a32[DT_RECOMPUTE_NONE]);
                assert_true(a[DT_RECOMPUTE_SELECTIVE] < a32[DT_RECOMPUTE_SELECTIVE]);
            }
            if (pi == 2) assert_memory_equal(a, a16, sizeof a); /* fp16 lays out as bf16 */
        }
    }
}

/* Top-K compression (parallel.compression: topk, DDP and ZeRO-1): the residual adds exactly
 * Psi floats of gradient state per rank; the ordered-reduction scratch is replaced by every
 * rank's message of one bucket (at 1%: 6 bytes a pair, far below the fp32 scratch); the rest
 * of the plan is unchanged, but for AdamW by age (parallel.compression_adam: age, the
 * default, ratio < 1): one age per element of the optimizer shard, half as much again as the
 * two moments; plain, or ratio 1, keeps none. One rank keeps no residual, no ages, and sends
 * nothing. */
static void test_topk_plan(void **state) {
    (void)state;
    const char *const presets[] = {"gpt2-tiny", "gpt2", "llama-tiny"};
    for (int i = 0; i < 3; i++)
        for (int s = DT_STRAT_DDP; s <= DT_STRAT_ZERO1; s++)
            for (int N = 1; N <= 4; N++) {
                dt_ctx ctx;
                dt_ctx_init(&ctx);
                dt_train_cfg c;
                dt_train_cfg_defaults(&c);
                assert_int_equal(dt_model_preset(&ctx, presets[i], &c.model), DT_OK);
                c.micro_batch = 1;
                c.seq_len = c.model.context < 64 ? c.model.context : 64;
                c.parallel.strategy = (dt_strategy)s;
                size_t d[DT_MEM_NKINDS] = {0}, t[DT_MEM_NKINDS] = {0}, pl[DT_MEM_NKINDS] = {0},
                       r1[DT_MEM_NKINDS] = {0};
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, d), DT_OK);
                c.parallel.compression = DT_COMPRESS_TOPK;
                c.parallel.topk_ratio = 0.01;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, t), DT_OK);
                c.parallel.topk_age = 0;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, pl), DT_OK);
                c.parallel.topk_age = 1;
                c.parallel.topk_ratio = 1.0;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, r1), DT_OK);
                assert_true(pl[DT_MEM_OPTIM] == d[DT_MEM_OPTIM] && r1[DT_MEM_OPTIM] == d[DT_MEM_OPTIM]);
                dt_model_config mc = c.model;
                dt_alloc a;
                dt_params ps;
                layout_of(&mc, &a, &ps);
                size_t psi = ps.n_params;
                dt_params_free(&ps);
                for (int k = 0; k < DT_MEM_NKINDS; k++) {
                    if (k == DT_MEM_GRADS) assert_true(t[k] == d[k] + (N > 1 ? psi * sizeof(float) : 0));
                    else if (k == DT_MEM_COMM) assert_true(N == 1 ? t[k] == d[k] : t[k] < d[k]);
                    else if (k == DT_MEM_OPTIM) assert_true(2 * t[k] == (N > 1 ? 3 : 2) * d[k]);
                    else assert_true(t[k] == d[k]);
                }
            }
}

/* parallel.zero_reduce and parallel.zero3_gather (decision 80) in the plan: gradients once per
 * step add exactly the step's full gradient (Psi floats) and nothing else; ZeRO-3's resident
 * parameters replace the two unit windows by Psi floats (no vocabulary row lookup: no larger
 * communication); auto is micro / use without a pipeline, and under pp 2 step / step when the
 * plan fits the host's physical memory per rank (DTRAIN_MEM_PHYSICAL), else step / use. */
static void test_zero_modes_plan(void **state) {
    (void)state;
    const char *const presets[] = {"gpt2-tiny", "llama-tiny"};
    for (int i = 0; i < 2; i++)
        for (int s = DT_STRAT_ZERO2; s <= DT_STRAT_ZERO3; s++)
            for (int N = 1; N <= 4; N++) {
                dt_ctx ctx;
                dt_ctx_init(&ctx);
                dt_train_cfg c;
                dt_train_cfg_defaults(&c);
                assert_int_equal(dt_model_preset(&ctx, presets[i], &c.model), DT_OK);
                c.micro_batch = 1;
                c.seq_len = c.model.context < 64 ? c.model.context : 64;
                c.accum = 4;
                c.parallel.strategy = (dt_strategy)s;
                size_t a[DT_MEM_NKINDS], m[DT_MEM_NKINDS], st[DT_MEM_NKINDS], g[DT_MEM_NKINDS];
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, a), DT_OK);
                c.parallel.zero_reduce = DT_ZR_MICRO, c.parallel.zero3_gather = DT_ZG_USE;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, m), DT_OK);
                c.parallel.zero_reduce = DT_ZR_STEP;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, st), DT_OK);
                c.parallel.zero3_gather = DT_ZG_STEP;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, g), DT_OK);
                dt_model_config mc = c.model;
                dt_alloc al;
                dt_params ps;
                layout_of(&mc, &al, &ps);
                size_t psi = ps.n_params, mu = 0;
                for (int u = 0; u < ps.n_units; u++) mu = ps.unit_len[u] > mu ? ps.unit_len[u] : mu;
                dt_params_free(&ps);
                for (int k = 0; k < DT_MEM_NKINDS; k++) {
                    assert_true(a[k] == m[k]); /* no pipeline: today's modes */
                    assert_true(st[k] == m[k] + (k == DT_MEM_GRADS ? psi * sizeof(float) : 0));
                    if (s == DT_STRAT_ZERO2 || k == DT_MEM_OTHER || k == DT_MEM_ACTS || k == DT_MEM_GRADS || k == DT_MEM_OPTIM)
                        assert_true(g[k] == st[k]);
                    else if (k == DT_MEM_PARAMS)
                        assert_true(g[k] + 2 * mu * sizeof(float) == st[k] + psi * sizeof(float));
                    else
                        assert_true(g[k] <= st[k]);
                }
                if (s != DT_STRAT_ZERO3 || N != 2) continue;
                /* auto under a pipeline of 2 stages (N = 2: one rank each) */
                size_t big[DT_MEM_NKINDS], small[DT_MEM_NKINDS], ss[DT_MEM_NKINDS], su[DT_MEM_NKINDS];
                c.model.n_layer = 4, c.pp = 2;
                c.parallel.zero_reduce = DT_ZR_STEP, c.parallel.zero3_gather = DT_ZG_STEP;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, ss), DT_OK);
                c.parallel.zero3_gather = DT_ZG_USE;
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, su), DT_OK);
                c.parallel.zero_reduce = DT_ZR_AUTO, c.parallel.zero3_gather = DT_ZG_AUTO;
                setenv("DTRAIN_MEM_PHYSICAL", "1e15", 1);
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, big), DT_OK);
                setenv("DTRAIN_MEM_PHYSICAL", "1e6", 1);
                assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, N, 0, small), DT_OK);
                unsetenv("DTRAIN_MEM_PHYSICAL");
                assert_memory_equal(big, ss, sizeof big);
                assert_memory_equal(small, su, sizeof small);
                assert_true(ss[DT_MEM_PARAMS] != su[DT_MEM_PARAMS]);
            }
}

int main(void) {
    const struct CMUnitTest t[] = {cmocka_unit_test(test_every_preset_orders_and_bounds),
                                   cmocka_unit_test(test_checkpointing_savings),
                                   cmocka_unit_test(test_topk_plan), cmocka_unit_test(test_zero_modes_plan)};
    return cmocka_run_group_tests(t, NULL, NULL);
}
