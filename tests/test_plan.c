/* The planner (src/plan): each term of the time model against a hand computation (ring
 * all-reduce, reduce-scatter / all-gather, all-to-all, group spans, the 1F1B bubble, the
 * recompute cost), the memory formulas (ZeRO stages by hand, Korthikanti's activation count,
 * the 1F1B in-flight micro-batches), dtrain's own plan reused exactly for the layouts dtrain
 * runs (1-4 ranks, every strategy, plan == dt_trainer_mem_plan), the model arithmetic against
 * dtrain's families, the hardware catalog (fixture values, every refusal naming file:line and
 * key, did-you-mean), and the CSV reader of --validate. The pipeline replay and the overlap
 * phases: test_plan_pipe.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "plan_fixture.h"
#include "parallel/pp_schedule.h"
#include "plan/plan.h"
#include "plan/plan_impl.h"
#include "plan/validate.h"


/* ---- collectives */

static const dt_plan_net NET = {100e9, 2e-6, 10e9, 10e-6};

static void test_ring_allreduce(void **state) {
    (void)state;
    double S = 1e9, ti, te;
    /* one node of 8: 2 (n-1)/n S / B + 2 (n-1) alpha */
    double t = dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 8, 1, &NET, &ti, &te);
    near(t, 2.0 * 7 / 8 * S / 100e9 + 14 * 2e-6, 1e-12, "all-reduce, 8 ranks in a node");
    assert_true(te == 0);
    /* 4 nodes of one rank: the same ring over the network */
    t = dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 1, 4, &NET, &ti, &te);
    near(t, 2.0 * 3 / 4 * S / 10e9 + 6 * 10e-6, 1e-12, "all-reduce, 4 nodes x 1");
    assert_true(ti == 0);
    /* 4 nodes x 8: reduce-scatter + all-gather inside, all-reduce of S/8 across */
    t = dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 8, 4, &NET, &ti, &te);
    near(ti, 2.0 * 7 / 8 * S / 100e9 + 14 * 2e-6, 1e-12, "hierarchical all-reduce, node part");
    near(te, 2.0 * 3 / 4 * (S / 8) / 10e9 + 6 * 10e-6, 1e-12, "hierarchical all-reduce, network part");
    near(t, ti + te, 1e-15, "parts add up");
    /* one rank: nothing */
    assert_true(dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 1, 1, &NET, NULL, NULL) == 0);
}

static void test_reduce_scatter_allgather_alltoall(void **state) {
    (void)state;
    double S = 4e8, ti, te;
    for (int op = DT_COLL_REDUCE_SCATTER; op <= DT_COLL_ALLGATHER; op++) {
        near(dt_plan_coll_time((dt_plan_coll)op, S, 4, 1, &NET, NULL, NULL), 3.0 / 4 * S / 100e9 + 3 * 2e-6, 1e-12,
             "(n-1)/n in a node");
        dt_plan_coll_time((dt_plan_coll)op, S, 8, 2, &NET, &ti, &te);
        near(ti, 7.0 / 8 * S / 100e9 + 7 * 2e-6, 1e-12, "(k-1)/k inside");
        near(te, 1.0 / 2 * (S / 8) / 10e9 + 1 * 10e-6, 1e-12, "(nn-1)/nn of S/k across");
    }
    /* all-to-all over 2 nodes x 4: 3/8 of S inside, 4/8 across */
    dt_plan_coll_time(DT_COLL_ALLTOALL, S, 4, 2, &NET, &ti, &te);
    near(ti, 3.0 / 8 * S / 100e9 + 3 * 2e-6, 1e-12, "all-to-all inside");
    near(te, 4.0 / 8 * S / 10e9 + 1 * 10e-6, 1e-12, "all-to-all across");
    near(dt_plan_coll_time(DT_COLL_P2P, S, 1, 2, &NET, NULL, NULL), S / 10e9 + 10e-6, 1e-12, "p2p across");
    near(dt_plan_coll_time(DT_COLL_P2P, S, 2, 1, &NET, NULL, NULL), S / 100e9 + 2e-6, 1e-12, "p2p inside");
}

static void test_group_span(void **state) {
    (void)state;
    int k, nn;
    dt_plan_group_span(8, 1, 8, &k, &nn); /* tp 8 */
    assert_true(k == 8 && nn == 1);
    dt_plan_group_span(16, 1, 8, &k, &nn); /* dp 16 of consecutive ranks */
    assert_true(k == 8 && nn == 2);
    dt_plan_group_span(4, 2, 8, &k, &nn); /* dp 4 at stride tp 2 */
    assert_true(k == 4 && nn == 1);
    dt_plan_group_span(8, 4, 8, &k, &nn); /* dp 8 at stride 4: 2 per node */
    assert_true(k == 2 && nn == 4);
    dt_plan_group_span(4, 8, 8, &k, &nn); /* pp 4 at stride 8: one per node */
    assert_true(k == 1 && nn == 4);
}

static void test_bubble(void **state) {
    (void)state;
    near(dt_plan_bubble_fraction(4, 8), 3.0 / 11, 1e-15, "(p-1)/(m+p-1), p 4 m 8");
    near(dt_plan_bubble_fraction(8, 1), 7.0 / 8, 1e-15, "p 8 m 1");
    assert_true(dt_plan_bubble_fraction(1, 16) == 0);
}

/* ---- models */

static void test_recompute_flops(void **state) {
    (void)state;
    dt_plan_model m = dense(12, 768, 12, 50257);
    double L = 12, d = 768, T = 1024;
    assert_true(dt_plan_recompute_flops(&m, DT_RECOMPUTE_NONE, 1024) == 0);
    near(dt_plan_recompute_flops(&m, DT_RECOMPUTE_SELECTIVE, 1024), 4 * L * T * d, 1e-12, "selective: attention forward");
    /* full: the layers' forward again = 2 x (12 d^2 + 13 d per layer + 2 d final norm) + attention */
    near(dt_plan_recompute_flops(&m, DT_RECOMPUTE_FULL, 1024), 2 * (L * (12 * d * d + 13 * d) + 2 * d) + 4 * L * T * d,
         1e-12, "full: forward of the layers");
    /* as a factor of the model FLOPs: where the layers dominate, full recompute costs about a
     * third more (8N vs 6N; less the lm_head, which is not recomputed) */
    dt_plan_model big = dense(32, 4096, 32, 32000);
    double q = dt_plan_recompute_flops(&big, DT_RECOMPUTE_FULL, 1024) / dt_plan_flops_per_token(&big, 1024);
    if (!(q > 0.32 && q < 1.0 / 3)) fail_msg("full recompute / model FLOPs = %.4f, want just under 1/3", q);
}

static void test_params_and_flops_match_dtrain(void **state) {
    (void)state;
    int n = 0;
    for (int f = 0; dt_model_families[f]; f++) {
        if (dt_model_families[f]->images) continue;
        for (const char *const *p = dt_model_families[f]->presets; *p; p++) {
            dt_model_config mc;
            dt_plan_model m;
            preset_model(*p, &mc, &m);
            near(dt_plan_params(&m), (double)dt_model_num_params(&mc), 1e-12, *p);
            near(dt_plan_flops_per_token(&m, 256), dt_model_flops_per_token(&mc, 256), 1e-12, *p);
            n++;
        }
    }
    assert_true(n >= 8);
}

static void test_activation_formula(void **state) {
    (void)state;
    /* Korthikanti et al.: 34 s b h bytes per layer in 16 bits without the s^2 term, of which 2
     * s b h are dropout masks (none here): 32 s b h; with flash attention no score matrix,
     * but its log-sum-exp (4 bytes per head and token). */
    dt_plan_model m = dense(24, 1024, 16, 50304);
    double s = 2048, b = 4, h = 1024, a = 16;
    near(dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_NONE, b, s, 1, 2), 32 * s * b * h + 4 * a * s * b, 1e-12, "none");
    near(dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_NONE, b, s, 4, 2), (32 * s * b * h + 4 * a * s * b) / 4, 1e-12,
         "tensor + sequence parallel: / t");
    /* selective keeps the layer input, qkv, the attention residual and the MLP up-projection: 9 h */
    near(dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_SELECTIVE, b, s, 1, 2), 2 * 9 * s * b * h + 4 * a * s * b, 1e-12,
         "selective");
    near(dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_FULL, b, s, 2, 4), 4 * s * b * h / 2, 1e-12, "full: the input only");
    /* SwiGLU with grouped kv: x ln1 q k v att r ln2 + gate up act */
    m.swiglu = 1, m.n_kv_head = 4, m.d_ff = 2816;
    double kv = 4 * 64.0, F = 2816;
    near(dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_NONE, b, s, 1, 2),
         2 * s * b * (6 * h + 2 * kv + 3 * F) + 4 * a * s * b, 1e-12, "swiglu, gqa");
}

/* A job on the fixture's gpu-a with the analytic model. */
static void test_zero_memory_by_hand(void **state) {
    (void)state;
    dt_plan_model m = dense(8, 512, 8, 32000);
    m.is_dtrain = 0; /* the analytic formulas */
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 4);
    double P = dt_plan_params(&m), U = 32000.0 * 512; /* the vocabulary matrix is the largest unit */
    const double want[4][3] = {{4 * P, 4 * P, 8 * P},
                               {4 * P, 4 * P, 8 * P / 4},
                               {4 * P, 4 * P / 4 + 8 * U, 8 * P / 4},
                               {4 * P / 4 + 8 * U, 4 * P / 4 + 8 * U, 8 * P / 4}};
    for (int z = 0; z < 4; z++) {
        dt_plan_layout l = {4, 1, 1, 1, 1, (dt_strategy)z, 0};
        dt_plan_result r;
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
        assert_int_equal(r.dtrain_sizing, 0);
        near(r.mem[DT_MEM_PARAMS], want[z][0], 1e-12, "params");
        near(r.mem[DT_MEM_GRADS], want[z][1], 1e-12, "grads");
        near(r.mem[DT_MEM_OPTIM], want[z][2], 1e-12, "optimizer");
        /* activations: L layers + the embedding output + fp32 logits, fp32 elements */
        double b = 2, s = 1024;
        near(r.mem[DT_MEM_ACTS], 8 * dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_NONE, b, s, 1, 4) + 4 * b * s * 512 +
                                     4 * b * s * 32000, 1e-12, "activations");
        /* the step adds up and the rates follow from it */
        near(r.step_s, r.compute_s + r.recompute_s + r.bubble_s + r.comm_s + r.overhead_s + r.optimizer_s, 1e-12,
             "step = sum of terms");
        near(r.mfu, r.flops_step / 4 / r.step_s / 100e12, 1e-12, "MFU = model FLOP/s / peak (fp32 100)");
    }
    /* 16-bit compute adds a 2-byte working copy of the weights */
    j.train.model_opts.compute = DT_BF16;
    dt_plan_layout l = {4, 1, 1, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    near(r.mem[DT_MEM_PARAMS], 2 * P, 1e-12, "bf16: 16-bit weights");
    near(r.mem[DT_MEM_OPTIM], 12 * P, 1e-12, "bf16: fp32 master + m + v (ZeRO's K = 12)");
    near(r.mem_total - r.mem[DT_MEM_ACTS] - r.mem[DT_MEM_COMM], 18 * P, 1e-12, "bf16: 18 bytes per parameter");
    l.zero = DT_STRAT_ZERO1;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    near(r.mem[DT_MEM_OPTIM], 12 * P / 4, 1e-12, "bf16 ZeRO-1: the master weights are sharded too");
    dt_hw_free(&cat);
}

static void test_pipeline_and_tensor_memory(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    pipe_job(&cat, &j); /* m = 8 micro-batches */
    const dt_plan_model m = j.model;
    dt_plan_layout l = {1, 2, 4, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    assert_int_equal(r.micro_steps, 8);
    /* stage 0 holds p = 4 micro-batches of its L/p = 2 layers: L layers' worth, and the embedding */
    double b = 2, s = 1024, la = dt_plan_layer_act_bytes(&m, DT_RECOMPUTE_NONE, b, s, 2, 4);
    double st0 = 2 * 4 * la + 4 * 4 * b * s * 512 / 2, last = 2 * la + 4 * b * s * 32000 / 2;
    assert_true(st0 > last);
    near(r.mem[DT_MEM_ACTS], st0, 1e-12, "1F1B stage 0 activations");
    /* params of stage 0: 2 layers / tp + embedding / tp */
    near(r.mem[DT_MEM_PARAMS], 4 * dt_plan_stage_params(&m, &l, 1024, 0), 1e-12, "stage params");
    double layer = 12.0 * 512 * 512 + 13 * 512;
    near(dt_plan_stage_params(&m, &l, 1024, 0), (2 * layer + 32000.0 * 512 + 1024.0 * 512) / 2, 1e-12, "stage 0 by hand");
    /* bubble: the 1F1B schedule replayed (decision 95); with the heaviest stage last (the head),
     * its m micro-batches back to back plus one micro-batch of every other stage (the fill's
     * forwards and the drain's backwards): sum over s != last of t_s, t_s = t_micro c_s / c_last
     * ((p-1) t_micro when the stages are equal) */
    {
        dt_plan_stages sts;
        dt_plan_stages_of(&m, 1024, 4, &sts);
        assert_int_equal(sts.heavy, 3);
        dt_pp_costs k;
        dt_plan_pp_costs(&m, 1024, &k);
        double others = 0, ch = dt_pp_costs_stage(&k, 4, sts.first, 3);
        for (int s2 = 0; s2 < 3; s2++) others += dt_pp_costs_stage(&k, 4, sts.first, s2) / ch;
        near(r.bubble_s, r.compute_s / 8 * others, 1e-9, "bubble = the other stages' micro-batch, heaviest last");
        assert_true(r.bubble_s < 3 * r.compute_s / 8); /* below (p-1) t_micro of the heaviest stage */
        assert_true(r.sliced_s == 0);                  /* dedicated devices */
    }
    /* an uneven split: 8 layers on 3 stages -> the slowest stage has 3, paced at 3 x 3 / 8 of the even time */
    dt_plan_job j3 = j;
    j3.gpus = 6;
    dt_plan_layout l3 = {1, 2, 3, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r3;
    assert_int_equal(dt_plan_predict(&ctx, &j3, &l3, &r3), DT_OK);
    /* the rule (parallel/pp_split.h) by hand: a layer costs 6 (12 d^2 + 13 d) + 12 T d per token,
     * the head 6 (V d + 2 d) + 5 V (about 3.9 layers), the embedding 2 x 3 d: the last stage takes
     * 1 layer + the head, the smallest bound any split reaches, and the other 7 go 3, 4 (most
     * even, earlier fewer); its cost paces the step: u = 3 x (layer + head) / all */
    int first3[4];
    dt_plan_pp_split(&m, 1024, 3, first3);
    assert_int_equal(first3[1], 3);
    assert_int_equal(first3[2], 7);
    assert_int_equal(first3[3], 8);
    const double lc = 6 * layer + 12.0 * 1024 * 512, hc = 6 * (32000.0 * 512 + 2 * 512) + 5 * 32000.0, ec = 6.0 * 512;
    near(r3.compute_s, r3.flops_step / 6 / (100e12 * 0.5) * 3 * (lc + hc) / (8 * lc + hc + ec), 1e-12,
         "uneven stages: pp x the heaviest stage's cost / all stages'");
    near(r3.mem[DT_MEM_PARAMS], 4 * (3 * layer + 32000.0 * 512 + 1024.0 * 512) / 2, 1e-12, "stage 0 holds 3 layers");
    near(r3.bubble_s, r3.compute_s / 8 * (3 * lc + ec + 4 * lc) / (lc + hc), 1e-9,
         "uneven stages: the bubble is stages 0 and 1's micro-batch (the heaviest, the last, paces)");
    /* tensor-parallel communication is exposed, unless tp_overlap lets it hide behind the GEMMs */
    int t = -1;
    for (int i = 0; i < r.n_comm; i++)
        if (!strcmp(r.comm[i].what, "tp all-reduce acts")) t = i;
    assert_true(t >= 0);
    near(r.comm[t].exposed, r.comm[t].t_intra + r.comm[t].t_inter, 1e-12, "tp: all exposed");
    j.tp_overlap = 1;
    dt_plan_result ro;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &ro), DT_OK);
    double T = ro.comm[t].t_intra + ro.comm[t].t_inter, t1 = T / ro.comm[t].count;
    double tm = (ro.compute_s + ro.recompute_s) / ro.micro_steps;
    near(ro.comm[t].exposed, 8 * fmax(t1, T / 8 - tm), 1e-12, "tp overlapped: max(t, pieces t - t_micro) a micro-step");
    assert_true(ro.step_s < r.step_s);
    dt_hw_free(&cat);
}

/* For the layouts dtrain runs, the plan is dtrain's plan: every strategy, 1-4 ranks, fp32 and
 * bf16 with selective checkpointing, and hybrid sharding on 2 nodes of 2. */
static void test_dtrain_layouts_use_dtrain_plan(void **state) {
    (void)state;
    const char *presets[] = {"gpt2-tiny", "llama-tiny", "bench-small"};
    for (size_t p = 0; p < 3; p++)
        for (int N = 1; N <= 4; N++)
            for (int z = 0; z < 4; z++)
                for (int v = 0; v < 3; v++) { /* fp32; bf16 + selective; hybrid (N = 4, ZeRO) */
                    if (v == 2 && (N != 4 || z == 0)) continue;
                    dt_ctx ctx;
                    dt_ctx_init(&ctx);
                    dt_model_config mc;
                    dt_plan_model m;
                    preset_model(presets[p], &mc, &m);
                    dt_hw_catalog cat;
                    dt_plan_job j;
                    job_of(&cat, &j, &m, N);
                    j.train.seq_len = 64, j.train.micro_batch = 2, j.global_batch = 4L * N; /* 2 micro-steps */
                    if (v == 1) j.train.model_opts.compute = DT_BF16, j.train.model_opts.recompute = DT_RECOMPUTE_SELECTIVE;
                    if (v == 2) j.dpn = 2;
                    dt_plan_layout l = {N, 1, 1, 1, 1, (dt_strategy)z, v == 2};
                    dt_plan_result r;
                    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
                    assert_int_equal(r.dtrain_sizing, 1);
                    dt_train_cfg c = j.train;
                    c.model = mc, c.parallel.strategy = (dt_strategy)z, c.parallel.hybrid = v == 2, c.accum = 2;
                    double worst = -1;
                    size_t wb[DT_MEM_NKINDS];
                    for (int rank = 0; rank < N; rank++) {
                        size_t b[DT_MEM_NKINDS];
                        assert_int_equal(dt_trainer_mem_plan(&ctx, &c, N, j.dpn, rank, b), DT_OK);
                        double t = 0;
                        for (int k = 0; k < DT_MEM_NKINDS; k++) t += (double)b[k];
                        if (t > worst) worst = t, memcpy(wb, b, sizeof wb);
                    }
                    for (int k = 0; k < DT_MEM_NKINDS; k++)
                        if (r.mem[k] != (double)wb[k])
                            fail_msg("%s %s N=%d variant %d %s: plan %.0f bytes, dtrain's fullest rank %.0f", presets[p],
                                     dt_strategy_name((dt_strategy)z), N, v, dt_mem_kind_name((dt_mem_kind)k), r.mem[k],
                                     (double)wb[k]);
                    dt_hw_free(&cat);
                }
}

/* Mixture of experts: all experts held (split over ep), top-k computed, tokens all-to-all'd. */
static void test_moe(void **state) {
    (void)state;
    dt_plan_model m = dense(4, 256, 4, 1000);
    m.bias = 0, m.tied = 0, m.swiglu = 1, m.d_ff = 512, m.experts = 8, m.topk = 2;
    double attn = 256.0 * 3 * 256 + 256.0 * 256 + 2 * 256 + 256.0 * 8, mlp = 3.0 * 256 * 512;
    near(dt_plan_params(&m), 2 * 1000.0 * 256 + 4 * (attn + 8 * mlp) + 256, 1e-12, "MoE parameters: every expert");
    near(dt_plan_active_params(&m), 4 * (attn + 2 * mlp) + 256 + 1000.0 * 256, 1e-12, "active: top-2 experts");
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 8);
    dt_plan_layout l = {8, 1, 1, 1, 4, DT_STRAT_DDP, 0};
    dt_plan_result r;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    near(r.mem[DT_MEM_PARAMS], 4 * (4 * (attn + 8 * mlp / 4) + 2 * 1000.0 * 256 + 256), 1e-12, "experts split over ep");
    int t = -1;
    for (int i = 0; i < r.n_comm; i++)
        if (!strcmp(r.comm[i].what, "ep all-to-all tokens")) t = i;
    assert_true(t >= 0);
    near(r.comm[t].bytes, 4.0 * 2 * 1024 * 256 * 2, 1e-12, "e b s d x topk");
    near(r.comm[t].count, 4 * 4, 1e-12, "4 per layer and micro-step");
    dt_hw_free(&cat);
}

static const dt_plan_comm_term *term_of(const dt_plan_result *r, const char *what) {
    for (int i = 0; i < r->n_comm; i++)
        if (!strcmp(r->comm[i].what, what)) return &r->comm[i];
    return NULL;
}

/* ZeRO-1 communicates as dtrain does on dtrain's layouts (all-reduce, fp32 gather), and as
 * ZeRO / Megatron's distributed optimizer elsewhere (reduce-scatter, gather in bf16). */
static void test_zero1_algorithms(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    dt_plan_model m;
    preset_model("gpt2", &mc, &m);
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 8);
    j.train.model_opts.compute = DT_BF16;
    dt_plan_layout l = {8, 1, 1, 1, 1, DT_STRAT_ZERO1, 0};
    dt_plan_result r;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    double P = dt_plan_stage_params(&m, &l, 1024, 0);
    assert_non_null(term_of(&r, "dp all-reduce grads"));
    /* dtrain's layers are 3 units each (params.h), gathered one a piece */
    near(term_of(&r, "dp all-gather params")->bytes * 12 * 3, 4 * P, 1e-12, "dtrain: fp32 gather, a unit a piece");
    near(term_of(&r, "dp all-gather params")->count, 12 * 3, 1e-12, "dtrain: 3 units per layer");
    j.model.is_dtrain = 0;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    assert_null(term_of(&r, "dp all-reduce grads"));
    assert_non_null(term_of(&r, "dp reduce-scatter grads"));
    near(term_of(&r, "dp all-gather params")->bytes * 12, 2 * P, 1e-12, "ZeRO: bf16 gather, a layer a piece");
    dt_hw_free(&cat);
}

static void test_layout_checks(void **state) {
    (void)state;
    dt_plan_model m = dense(12, 768, 12, 50257);
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 8);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_layout bad_product = {3, 2, 1, 1, 1, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_check_layout(&ctx, &j, &bad_product), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "tp x pp x cp x dp = 6 != --gpus 8"));
    dt_plan_layout bad_tp = {1, 8, 1, 1, 1, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_check_layout(&ctx, &j, &bad_tp), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "--tp 8 must divide the attention heads"));
    dt_plan_layout bad_pp = {1, 1, 8, 1, 1, DT_STRAT_DDP, 0};
    j.model.n_layer = 4;
    assert_int_equal(dt_plan_check_layout(&ctx, &j, &bad_pp), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "--pp 8: more stages than layers"));
    j.model.n_layer = 12;
    dt_plan_layout bad_ep = {4, 2, 1, 1, 2, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_check_layout(&ctx, &j, &bad_ep), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "--ep 2 must divide the experts (0: a dense model)"));
    j.global_batch = 12;
    dt_plan_layout bad_batch = {8, 1, 1, 1, 1, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_check_layout(&ctx, &j, &bad_batch), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "--global-batch 12 must be a multiple"));
    dt_hw_free(&cat);
}

static void test_search_ranks_and_recommends(void **state) {
    (void)state;
    dt_plan_model m = dense(12, 768, 12, 50257);
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 16);
    j.global_batch = 64;
    j.price_hour = 8, j.spot_hour = 2;
    dt_plan_fix fix = {0, 0, 0, 0, -1, -1};
    dt_plan_result *r;
    int n, fast, cheap;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_search(&ctx, &j, &fix, &r, &n), DT_OK);
    assert_true(n > 8);
    for (int i = 1; i < n; i++) assert_true(!r[i].fits || (r[i - 1].fits && r[i - 1].step_s <= r[i].step_s));
    dt_plan_recommend(r, n, &fast, &cheap);
    assert_int_equal(fast, 0);
    assert_true(cheap >= 0 && r[cheap].usd_1b_tokens <= r[fast].usd_1b_tokens);
    /* cost by hand: 2 nodes x $8/h */
    near(r[0].usd_1b_tokens, 16.0 / 3600 * 1e9 / r[0].tokens_s, 1e-12, "$ per 1B tokens");
    near(r[0].usd_1k_samples, 16.0 / 3600 * 1000 / r[0].samples_s, 1e-12, "$ per 1K samples");
    /* two nodes: the network slows the step, so per-device throughput is below one node's */
    assert_true(r[0].scaling_eff > 0 && r[0].scaling_eff <= 1.0);
    free(r);
    dt_hw_free(&cat);
}

/* ---- catalog */

static void test_catalog_fixture(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_hw_catalog c;
    assert_int_equal(dt_hw_load(&ctx, FIXTURE, &c), DT_OK);
    assert_int_equal(c.n_acc, 3);
    const dt_hw_accel *a;
    assert_int_equal(dt_hw_find(&ctx, &c, "GPU-A", &a), DT_OK);
    near(a->memory_bytes, 80.0 * 1073741824.0, 1e-15, "memory_gib");
    near(dt_hw_peak(a, DT_BF16), 400, 0, "bf16 peak");
    near(dt_hw_peak(a, DT_F32), 100, 0, "fp32 peak");
    near(a->gemm_eff, 0.5, 0, "gemm default");
    assert_int_equal(dt_hw_find(&ctx, &c, "gpu-small", &a), DT_OK);
    near(a->memory_bytes, 1e9, 1e-15, "memory_gb is decimal");
    assert_int_equal(a->nics_per_node, 1);
    assert_int_equal(dt_hw_find(&ctx, &c, "cpu-node", &a), DT_OK);
    near(a->gemm_eff, 0.8, 0, "per-accelerator gemm efficiency");
    near(dt_hw_link_find(&c, "net")->eff, 0.5, 0, "per-link efficiency");
    near(dt_hw_link_find(&c, "fast")->eff, 1.0, 0, "link default");
    assert_int_equal(dt_hw_find(&ctx, &c, "gpu-b", &a), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "--hardware gpu-b: not in"));
    assert_non_null(strstr(ctx.err, "did you mean gpu-a?"));
    assert_int_equal(dt_hw_find(&ctx, &c, "quantum-annealer", &a), DT_ERR_CONFIG);
    assert_null(strstr(ctx.err, "did you mean"));
    dt_hw_free(&c);
    /* the real catalog loads too */
    assert_int_equal(dt_hw_load(&ctx, DT_SOURCE_DIR "/configs/hardware.yaml", &c), DT_OK);
    assert_int_equal(dt_hw_find(&ctx, &c, "h100-sxm", &a), DT_OK);
    dt_hw_free(&c);
}

static void test_did_you_mean(void **state) {
    (void)state;
    assert_int_equal(dt_hw_edit_distance("h100-sxn", "h100-sxm"), 1);
    assert_int_equal(dt_hw_edit_distance("", "abc"), 3);
    assert_int_equal(dt_hw_edit_distance("A100", "a100-80gb"), 5);
    assert_int_equal(dt_hw_edit_distance("kitten", "sitting"), 3);
    const char *c[] = {"a100-40gb", "a100-80gb", "h100-sxm", "h200"};
    assert_string_equal(dt_hw_closest("h100-smx", c, 4), "h100-sxm");
    assert_string_equal(dt_hw_closest("a100-80g", c, 4), "a100-80gb");
    assert_null(dt_hw_closest("tpu-v5p", c, 4));
}

static void test_catalog_refusals(void **state) {
    (void)state;
    char dir[256];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "plan"), 0);
    static const struct {
        const char *yaml, *want;
    } cases[] = {
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l, colour: red}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         ":2: accelerators.g.colour: unknown key"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: -1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         ":2: accelerators.g.peak_tflops.bf16 must be a number"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf17: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         "accelerators.g.peak_tflops.bf17: unknown dtype"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, devices_per_node: 1, intra_node: l, inter_node: l}\n"
         "links:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         "accelerators.g.memory_gib is missing"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: ib}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         "accelerators.g: link 'ib' is not under links"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l, tp_link: tp-fit}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         "accelerators.g: link 'tp-fit' is not under links"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1.5, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         "accelerators.g.devices_per_node must be a whole number"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {latency_us: 1}\n",
         "links.l.bw_gbs is missing"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\nefficiency:\n  gemm: {default: 1.5}\n",
         ":6: efficiency.gemm.default must be a number in [0.01, 1]"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\nefficiency:\n  link: {nvlink9: 0.5}\n",
         "efficiency.link.nvlink9: no such link"},
        {"accelerators: {}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\nprices: 3\n", ":4: prices: unknown key"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l, step_overhead_us: -5}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         ":2: accelerators.g.step_overhead_us must be a number in [0, 1e+07]"},
        {"accelerators:\n  g: {name: x, peak_tflops: {bf16: 1}, memory_gib: 1, devices_per_node: 1, intra_node: l, "
         "inter_node: l, optimizer_bw_gbs: fast}\nlinks:\n  l: {bw_gbs: 1, latency_us: 1}\n",
         ":2: accelerators.g.optimizer_bw_gbs must be a number in [0, 1e+07]"},
        {"links:\n  l: {bw_gbs: 1, latency_us: 1}\n", "accelerators is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = tu_write_file(dir, "hw.yaml", cases[i].yaml);
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        dt_hw_catalog c;
        assert_int_equal(dt_hw_load(&ctx, path, &c), DT_ERR_CONFIG);
        if (!strstr(ctx.err, cases[i].want) || !strstr(ctx.err, "hw.yaml"))
            fail_msg("case %zu: got '%s', want '%s' and the file name", i, ctx.err, cases[i].want);
    }
    tu_rmtree(dir);
}

static void test_csv_and_median(void **state) {
    (void)state;
    char line[] = "a,\"b, with comma\",,\"say \"\"hi\"\"\",e";
    char *f[8];
    assert_int_equal(dt_csv_split(line, f, 8), 5);
    assert_string_equal(f[0], "a");
    assert_string_equal(f[1], "b, with comma");
    assert_string_equal(f[2], "");
    assert_string_equal(f[3], "say \"hi\"");
    assert_string_equal(f[4], "e");
    double x[] = {-0.3, 0.1, 0.2, -0.05};
    near(dt_median_abs(x, 4), 0.15, 1e-15, "median of |x|, even n");
    double y[] = {5, -1, 2};
    near(dt_median_abs(y, 3), 2, 0, "median of |x|, odd n");
}

/* A job of an 8-layer model outside dtrain (analytic sizing) on `gpus` of the fixture's gpu-a. */
static void plain_job(dt_hw_catalog *cat, dt_plan_job *j, int gpus) {
    dt_plan_model m = dense(8, 512, 8, 32000);
    m.is_dtrain = 0;
    job_of(cat, j, &m, gpus);
}

/* The plan charges the fixed costs once per micro-batch and once per collective call, and the
 * step is the sum of its terms. */
static void test_step_overhead_term(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    plain_job(&cat, &j, 4);
    j.global_batch = 3 * 2 * 4; /* 3 micro-steps */
    dt_plan_layout l = {4, 1, 1, 1, 1, DT_STRAT_ZERO2, 0};
    dt_plan_result r0, r1;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r0), DT_OK);
    near(r0.overhead_s, 0, 0, "no step_overhead_us: no term");
    for (int i = 0; i < cat.n_acc; i++) cat.acc[i].step_overhead_us = 250, cat.acc[i].collective_call_us = 7;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r1), DT_OK);
    assert_int_equal(r1.micro_steps, 3);
    double calls = 0;
    for (int i = 0; i < r1.n_comm; i++) calls += r1.comm[i].count;
    assert_true(calls > 3);
    near(r1.calls, calls, 0, "calls = the comm terms' counts");
    near(r1.overhead_s, 3 * 250e-6 + 7e-6 * calls, 1e-15, "overhead = step_overhead_us x m + collective_call_us x calls");
    near(r1.step_s, r1.compute_s + r1.recompute_s + r1.bubble_s + r1.comm_s + r1.overhead_s + r1.optimizer_s, 1e-12,
         "step = sum");
    near(r1.step_s - r0.step_s, 3 * 250e-6 + 7e-6 * calls, 1e-12, "the other terms unchanged");
    near(r1.tokens_s, (double)j.global_batch * j.train.seq_len / r1.step_s, 1e-12, "rates from the step");
    dt_hw_free(&cat);
}

/* The optimizer step (decision 56): the parameters a device updates (all under DDP, a shard
 * under ZeRO, hybrid: the node's shard) x its bytes per parameter / optimizer_bw_gbs, none
 * without the key; the step is the sum of its terms. */
static void test_optimizer_term(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    plain_job(&cat, &j, 16); /* 2 nodes of 8 */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_layout ddp = {16, 1, 1, 1, 1, DT_STRAT_DDP, 0}, z1 = {16, 1, 1, 1, 1, DT_STRAT_ZERO1, 0},
                   hz1 = {16, 1, 1, 1, 1, DT_STRAT_ZERO1, 1};
    dt_plan_result r0, r1, r2;
    assert_int_equal(dt_plan_predict(&ctx, &j, &ddp, &r0), DT_OK);
    near(r0.optimizer_s, 0, 0, "no optimizer_bw_gbs: no term");
    for (int i = 0; i < cat.n_acc; i++) cat.acc[i].optimizer_bw_gbs = 50;
    assert_int_equal(dt_plan_predict(&ctx, &j, &ddp, &r1), DT_OK);
    const double P = dt_plan_stage_params(&j.model, &ddp, j.train.seq_len, 0);
    near(r1.opt_params, P, 0, "DDP: every parameter");
    near(r1.opt_bytes, 28, 0, "fp32 AdamW: 28 bytes a parameter");
    near(r1.optimizer_s, P * 28 / 50e9, 1e-12, "optimizer = P x 28 / bw");
    near(r1.step_s - r0.step_s, r1.optimizer_s, 1e-9, "the other terms unchanged");
    near(r1.step_s, r1.compute_s + r1.recompute_s + r1.bubble_s + r1.comm_s + r1.overhead_s + r1.optimizer_s, 1e-12,
         "step = sum");
    assert_int_equal(dt_plan_predict(&ctx, &j, &z1, &r2), DT_OK);
    near(r2.optimizer_s, P / 16 * 28 / 50e9, 1e-12, "ZeRO-1: the shard P / dp");
    assert_int_equal(dt_plan_predict(&ctx, &j, &hz1, &r2), DT_OK);
    near(r2.opt_params, P / 8, 1e-12, "hybrid ZeRO-1: sharded over the node's 8 ranks");
    j.train.model_opts.compute = DT_BF16, j.train.parallel.grad_dtype = DT_BF16;
    near(dt_plan_opt_bytes(&j.train), 12 + 2 + 12 + 2, 0, "bf16: 16-bit gradient read, 16-bit weight copy written");
    dt_hw_free(&cat);
}

/* A run whose attention core runs at another peak (fp8 runs: their linear layers at the fp8
 * peak, QK^T and PV at the 16-bit one, attn_peak 0.5; decision 99): the compute takes
 * 1 / 0.5 - 1 = 1 more time on the attention's share 12 L T d / F of the FLOPs, the full
 * recompute on 4 L T d of its FLOPs a token; the FLOPs and the rates' definitions stay. */
static void test_attention_peak(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    plain_job(&cat, &j, 1);
    j.train.model_opts.recompute = DT_RECOMPUTE_FULL;
    dt_plan_layout l = {1, 1, 1, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r0, r1;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r0), DT_OK);
    j.attn_peak = 0.5;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r1), DT_OK);
    const dt_plan_model *m = &j.model;
    const double T = j.train.seq_len, att = 12.0 * m->n_layer * T * m->d_model;
    const double F = dt_plan_flops_per_token(m, j.train.seq_len);
    const double rc = dt_plan_recompute_flops(m, DT_RECOMPUTE_FULL, j.train.seq_len);
    assert_true(att / F > 0.05 && att / F < 0.5);
    near(r1.flops_step, r0.flops_step, 0, "the FLOPs do not change");
    near(r1.compute_s, r0.compute_s * (1 + att / F), 1e-12, "compute x (1 + 12 L T d / F)");
    near(r1.recompute_s, r0.recompute_s * (1 + att / 3 / rc), 1e-12, "recompute x (1 + 4 L T d / its FLOPs)");
    near(r1.tflops_gpu, r1.flops_step / r1.step_s / 1e12, 1e-12, "TFLOP/s of model FLOPs over the longer step");
    j.attn_peak = 1;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r1), DT_OK);
    near(r1.step_s, r0.step_s, 0, "attn_peak 1 = 0: the same peak");
    dt_hw_free(&cat);
}

/* What dtrain cannot train, named (dt_plan_dtrain_refusal): each combination the trainer
 * refuses gives its own line, and every layout it runs gives none. */
static void test_dtrain_refusal(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    plain_job(&cat, &j, 16); /* 8 layers, 8 heads, d_ff 2048, seq 1024 */
    struct {
        dt_plan_layout l;
        int experts;
        const char *why; /* NULL: runs */
    } c[] = {
        {{16, 1, 1, 1, 1, DT_STRAT_ZERO3, 0}, 0, NULL},
        {{4, 2, 2, 1, 1, DT_STRAT_ZERO1, 0}, 0, NULL},
        {{8, 1, 1, 2, 1, DT_STRAT_DDP, 0}, 0, NULL},
        {{8, 1, 1, 1, 2, DT_STRAT_ZERO1, 0}, 8, NULL},
        {{8, 1, 2, 1, 2, DT_STRAT_DDP, 0}, 8, NULL},
        {{8, 1, 1, 1, 2, DT_STRAT_DDP, 0}, 0, "expert parallelism needs a mixture of experts"},
        {{8, 1, 1, 1, 3, DT_STRAT_DDP, 0}, 8, "expert parallelism: ep must divide the experts and dp"},
        {{8, 1, 1, 1, 2, DT_STRAT_ZERO1, 1}, 8, "expert parallelism with hybrid sharding"},
        {{4, 2, 1, 1, 2, DT_STRAT_ZERO1, 0}, 8, "expert parallelism with ZeRO and tensor or pipeline parallelism"},
        {{4, 2, 2, 1, 2, DT_STRAT_DDP, 0}, 8, "expert parallelism with both tensor and pipeline parallelism"},
        {{4, 1, 1, 2, 2, DT_STRAT_DDP, 0}, 8, "expert parallelism with context parallelism"},
        {{8, 1, 1, 2, 1, DT_STRAT_ZERO1, 1}, 0, "context parallelism with hybrid sharding"},
        {{1, 1, 1, 16, 1, DT_STRAT_DDP, 0}, 0, NULL},
        {{1, 1, 16, 1, 1, DT_STRAT_DDP, 0}, 0, "a pipeline of more stages than layers"},
        {{1, 16, 1, 1, 1, DT_STRAT_DDP, 0}, 0, "tensor parallelism not dividing the heads, the kv heads and the MLP"},
        {{8, 2, 1, 1, 1, DT_STRAT_DDP, 0}, 8, NULL},
        {{4, 2, 2, 1, 1, DT_STRAT_DDP, 0}, 8, "tensor parallelism of experts under a pipeline, in 16 bits or with LoRA"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        j.model.experts = c[i].experts, j.model.topk = c[i].experts ? 2 : 0;
        const char *why = dt_plan_dtrain_refusal(&j, &c[i].l);
        if (c[i].why == NULL && why != NULL) fail_msg("case %zu: refused (%s), dtrain runs it", i, why);
        if (c[i].why != NULL && (why == NULL || strcmp(why, c[i].why)))
            fail_msg("case %zu: %s, want %s", i, why ? why : "runs", c[i].why);
        assert_int_equal(dt_plan_dtrain_runs(&j, &c[i].l), c[i].why == NULL);
    }
    /* the job's own settings: ZeRO-2 reducing every micro-step, 16-bit gradients, LoRA,
       compression, capacity-limited experts, a sequence cp does not split in 2 cp chunks */
    j.model.experts = 8, j.model.topk = 2;
    dt_plan_layout ep2z2 = {8, 1, 1, 1, 2, DT_STRAT_ZERO2, 0}, ep2 = {8, 1, 1, 1, 2, DT_STRAT_ZERO1, 0},
                   cp2 = {8, 1, 1, 2, 1, DT_STRAT_DDP, 0}, cp8 = {2, 1, 1, 8, 1, DT_STRAT_DDP, 0};
    j.train.parallel.zero_reduce = DT_ZR_MICRO;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &ep2z2),
                        "expert parallelism with ZeRO-2/3 reducing every micro-step (parallel.zero_reduce: step runs)");
    j.train.parallel.zero_reduce = DT_ZR_STEP;
    assert_null(dt_plan_dtrain_refusal(&j, &ep2z2));
    j.train.parallel.grad_dtype = DT_BF16;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &ep2), "expert parallelism with ZeRO and 16-bit gradients");
    j.train.parallel.grad_dtype = DT_F32, j.train.model_opts.lora.rank = 8;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &ep2), "expert parallelism with LoRA or QLoRA");
    j.train.model_opts.lora.rank = 0, j.train.parallel.compression = DT_COMPRESS_TOPK;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &ep2), "expert parallelism with gradient compression");
    j.train.parallel.compression = DT_COMPRESS_NONE, j.train.moe_capacity = 1.25f;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &cp2), "context parallelism with capacity-limited experts");
    j.train.moe_capacity = 0, j.model.experts = 0, j.train.seq_len = 1000;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &cp8), "context parallelism: the sequence is not a multiple of 2 cp");
    /* more stages than dtrain's limit (a model deep enough for them), and a vit under cp */
    j.train.seq_len = 1024, j.model.n_layer = 2 * DT_PP_MAX;
    dt_plan_layout deep = {1, 1, DT_PP_MAX + 1, 1, 1, DT_STRAT_DDP, 0}, edge = {1, 1, DT_PP_MAX, 1, 1, DT_STRAT_DDP, 0};
    assert_string_equal(dt_plan_dtrain_refusal(&j, &deep), "a pipeline of more stages than dtrain's limit");
    assert_null(dt_plan_dtrain_refusal(&j, &edge));
    dt_model_config mc;
    preset_model("vit-tiny", &mc, &j.model);
    j.train.seq_len = 64;
    assert_string_equal(dt_plan_dtrain_refusal(&j, &cp2), "context parallelism of a model that is not causal (vit)");
    cp2.cp = 1, cp2.dp = 16;
    assert_null(dt_plan_dtrain_refusal(&j, &cp2));
    dt_hw_free(&cat);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_term),
        cmocka_unit_test(test_attention_peak),
        cmocka_unit_test(test_dtrain_refusal),
        cmocka_unit_test(test_ring_allreduce),
        cmocka_unit_test(test_reduce_scatter_allgather_alltoall),
        cmocka_unit_test(test_group_span),
        cmocka_unit_test(test_bubble),
        cmocka_unit_test(test_recompute_flops),
        cmocka_unit_test(test_params_and_flops_match_dtrain),
        cmocka_unit_test(test_activation_formula),
        cmocka_unit_test(test_zero_memory_by_hand),
        cmocka_unit_test(test_pipeline_and_tensor_memory),
        cmocka_unit_test(test_dtrain_layouts_use_dtrain_plan),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_zero1_algorithms),
        cmocka_unit_test(test_layout_checks),
        cmocka_unit_test(test_search_ranks_and_recommends),
        cmocka_unit_test(test_catalog_fixture),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_catalog_refusals),
        cmocka_unit_test(test_csv_and_median),
        cmocka_unit_test(test_step_overhead_term),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
