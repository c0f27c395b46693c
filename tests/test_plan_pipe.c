/* The planner's pipeline and the phases a step's communication hides in (decisions 94-97):
 * the schedule's replay against parallel/pp_schedule.h's, time-sliced devices sharing cores,
 * context parallelism's gradients over dp x cp, the backward window of dtrain's models, ZeRO-3
 * per phase, and the interleaved schedule's stage-0 memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "plan_fixture.h"
#include "parallel/pp_schedule.h"
#include "plan/plan_impl.h"

/* The pipeline replay of the planner (decision 95): with dedicated devices it is the schedule's
 * own replay (parallel/pp_schedule.h dt_pp_replay) for every kind; sharing cores by hand, and
 * bounded by the work and the critical path. */
static void test_pipeline_replay(void **state) {
    (void)state;
    double f[8], b[8], w[8], mine, ref, idle[8];
    const int kinds[] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZBH1};
    for (int ki = 0; ki < 4; ki++)
        for (int pp = 2; pp <= 5; pp++)
            for (int mb = 1; mb <= 9; mb++) {
                int v = kinds[ki] == DT_PP_INTERLEAVED ? 2 : 1;
                dt_ctx c;
                dt_ctx_init(&c);
                if (dt_pp_schedule_check(&c, (dt_pp_kind)kinds[ki], pp, v, mb) != DT_OK) continue;
                for (int s = 0; s < pp; s++) f[s] = 1 + 0.37 * s, b[s] = 2.1 + 0.5 * (s % 3), w[s] = 0.7 + 0.1 * s;
                const double *wp = kinds[ki] == DT_PP_ZBH1 ? w : NULL;
                assert_int_equal(dt_plan_pp_makespan(kinds[ki], pp, v, mb, f, b, wp, 1.0, pp, &mine), 0);
                assert_int_equal(dt_pp_replay((dt_pp_kind)kinds[ki], pp, v, mb, f, b, wp, 0.0, &ref, idle), 0);
                near(mine, ref, 1e-12, "dedicated devices: the schedule's replay");
                /* sharing cores: never slower, never faster than the work or the critical path allow */
                double work = 0;
                for (int s = 0; s < pp; s++) work += mb * v * (f[s] + b[s] + (wp ? w[s] : 0));
                double sh;
                assert_int_equal(dt_plan_pp_makespan(kinds[ki], pp, v, mb, f, b, wp, 2.0, pp, &sh), 0);
                assert_true(sh <= mine * (1 + 1e-12));
                assert_true(sh >= fmax(work / pp, mine / 2) * (1 - 1e-12));
                /* one stage a machine: no core to share */
                assert_int_equal(dt_plan_pp_makespan(kinds[ki], pp, v, mb, f, b, wp, 2.0, 1, &sh), 0);
                near(sh, mine, 1e-12, "group of one stage: dedicated");
            }
    /* pp 2, one micro-batch: F0, F1, B1, B0 each alone, at min(speedup, 2 / 1) x the rate */
    f[0] = 1, f[1] = 2, b[0] = 2, b[1] = 4;
    assert_int_equal(dt_plan_pp_makespan(DT_PP_1F1B, 2, 1, 1, f, b, NULL, 1.0, 2, &mine), 0);
    near(mine, 9, 1e-12, "dedicated: 1 + 2 + 4 + 2");
    assert_int_equal(dt_plan_pp_makespan(DT_PP_1F1B, 2, 1, 1, f, b, NULL, 2.0, 2, &mine), 0);
    near(mine, 4.5, 1e-12, "speedup 2: each pass alone runs twice as fast");
    assert_int_equal(dt_plan_pp_makespan(DT_PP_1F1B, 2, 1, 1, f, b, NULL, 1.5, 2, &mine), 0);
    near(mine, 6, 1e-12, "speedup 1.5");
    assert_int_equal(dt_plan_pp_makespan(DT_PP_1F1B, 2, 1, 1, f, b, NULL, 4.0, 2, &mine), 0);
    near(mine, 4.5, 1e-12, "speedup above the group's size: a group of 2 gives at most 2x");
}

/* Time-sliced devices (decision 95): an entry whose devices share cores (idle_speedup > 1) gives
 * a pipeline's stages their idle peers' share - a negative sliced term in the step, none without
 * a pipeline or with one stage per machine. Context parallelism (decision 94): the gradients are
 * all-reduced, and ZeRO shards, over dp x cp. */
static void test_time_sliced_and_cp(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    pipe_job(&cat, &j);
    const dt_plan_model m = j.model;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_layout l = {1, 2, 4, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r0, r;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r0), DT_OK);
    dt_hw_accel sliced = *j.hw;
    sliced.idle_speedup = 2, sliced.machine_ranks = 8;
    j.hw = &sliced;
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    near(r.bubble_s, r0.bubble_s, 1e-12, "the bubble is the dedicated replay's");
    assert_true(r.sliced_s < 0);
    near(r.step_s, r0.step_s + r.sliced_s, 1e-12, "step = the dedicated one + the sliced gain");
    near(r.step_s, r.compute_s + r.recompute_s + r.bubble_s + r.sliced_s + r.comm_s + r.overhead_s + r.optimizer_s,
         1e-12, "step = its parts");
    /* the heaviest stage's work is a floor: its busy time at 2x */
    assert_true(r.compute_s + r.bubble_s + r.sliced_s >= r.compute_s / 2 * (1 - 1e-12));
    sliced.machine_ranks = 2; /* 4 machines of 2 ranks: a machine holds one stage (tp 2) */
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    assert_true(r.sliced_s == 0);
    sliced.machine_ranks = 8;
    dt_plan_layout dp8 = {4, 2, 1, 1, 1, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_predict(&ctx, &j, &dp8, &r), DT_OK);
    assert_true(r.sliced_s == 0 && r.bubble_s == 0);
    /* context parallelism: cp 2 at dp 1 all-reduces the gradients over its 2 ranks */
    dt_plan_job jc = j;
    jc.gpus = 2, jc.dpn = 2, jc.global_batch = 2;
    dt_plan_layout cp2 = {1, 1, 1, 2, 1, DT_STRAT_DDP, 0};
    assert_int_equal(dt_plan_predict(&ctx, &jc, &cp2, &r), DT_OK);
    int g = -1;
    for (int i = 0; i < r.n_comm; i++)
        if (!strcmp(r.comm[i].what, "dp all-reduce grads")) g = i;
    assert_true(g >= 0);
    near(r.comm[g].t_intra, r.comm[g].count * dt_plan_coll_time(DT_COLL_ALLREDUCE, r.comm[g].bytes, 2, 1,
         &(dt_plan_net){jc.intra->bw_gbs * 1e9 * jc.intra_eff, jc.intra->latency_us * 1e-6, 0, 0}, NULL, NULL),
         1e-12, "cp 2: the gradient all-reduce over the 2 CP ranks");
    /* ZeRO-3 with cp 2 x dp 2: the optimizer updates a quarter */
    jc.gpus = 4, jc.dpn = 4, jc.global_batch = 4;
    dt_plan_layout z3 = {2, 1, 1, 2, 1, DT_STRAT_ZERO3, 0};
    assert_int_equal(dt_plan_predict(&ctx, &jc, &z3, &r), DT_OK);
    near(r.opt_params, dt_plan_stage_params(&m, &z3, 1024, 0) / 4, 1e-12, "ZeRO-3 shards over dp x cp = 4");
    dt_hw_free(&cat);
}

/* The backward that hides the gradient reduction (decision 97): two thirds of the compute,
 * on dtrain's models (fused loss: the head's gradients in the forward) of the layers' share. */
static void test_backward_window(void **state) {
    (void)state;
    dt_model_config mc;
    dt_plan_model m;
    preset_model("gpt2", &mc, &m);
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 2);
    j.intra_eff = 2e-3; /* a slow link: the all-reduce outlasts the window */
    j.train.parallel.overlap = 1;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_layout l = {2, 1, 1, 1, 1, DT_STRAT_DDP, 0};
    for (int dtrain = 1; dtrain >= 0; dtrain--) {
        j.model.is_dtrain = dtrain;
        dt_plan_result r;
        if (dt_plan_predict(&ctx, &j, &l, &r) != DT_OK) fail_msg("%s", ctx.err);
        assert_true(r.n_comm == 1 && !strcmp(r.comm[0].what, "dp all-reduce grads"));
        dt_pp_costs k;
        dt_plan_pp_costs(&j.model, 1024, &k);
        double share = dtrain ? 12 * k.layer / (12 * k.layer + k.embed + k.head) : 1.0;
        double all = r.comm[0].t_intra + r.comm[0].t_inter, t1 = all / r.comm[0].count;
        near(r.comm[0].exposed, fmax(t1, all - r.compute_s * 2.0 / 3.0 * share), 1e-12,
             dtrain ? "dtrain: hidden behind the layers' backward" : "others: behind 2/3 of the compute");
        assert_true(share < 1 || !dtrain);
    }
    dt_hw_free(&cat);
}

/* The interleaved schedule (train.pp_kind, pp_virtual; decision 96) in the analytic memory:
 * stage 0 holds dt_pp_inflight's chunk sets, 1/v of its layers each. pp 4, v 2, m 8: warm-up
 * 2 (4-1) + (2-1) 4 = 10 forwards, so 11 chunk sets = 5.5 stages' activations (1F1B: 4). */
static void test_interleaved_memory(void **state) {
    (void)state;
    dt_hw_catalog cat;
    dt_plan_job j;
    pipe_job(&cat, &j); /* m = 8 micro-batches */
    j.train.pp_kind = DT_PP_INTERLEAVED, j.train.pp_virtual = 2;
    dt_plan_layout l = {1, 2, 4, 1, 1, DT_STRAT_DDP, 0};
    dt_plan_result r;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
    assert_int_equal(dt_pp_inflight(DT_PP_INTERLEAVED, 4, 2, 8, 0), 11);
    double b = 2, s = 1024, la = dt_plan_layer_act_bytes(&j.model, DT_RECOMPUTE_NONE, b, s, 2, 4);
    near(r.mem[DT_MEM_ACTS], 5.5 * (2 * la + 4 * b * s * 512 / 2), 1e-12, "interleaved stage 0: 11 chunks of 1 layer");
    dt_hw_free(&cat);
}

/* ZeRO-3 per phase (decision 97): the forward's gathers hide behind the forward alone, the
 * backward's gathers and reduce-scatters together behind the backward; without overlap all of
 * it is exposed. */
static void test_zero3_phases(void **state) {
    (void)state;
    dt_plan_model m = dense(8, 512, 8, 32000); /* another framework's model: s = 1 */
    dt_hw_catalog cat;
    dt_plan_job j;
    job_of(&cat, &j, &m, 4);
    j.global_batch = 16;       /* micro 2 x dp 4: 2 micro-steps */
    j.intra_eff = 2e-3;        /* a slow link: the gathers outlast the forward */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_layout l = {4, 1, 1, 1, 1, DT_STRAT_ZERO3, 0};
    for (int overlap = 1; overlap >= 0; overlap--) {
        j.train.parallel.overlap = overlap;
        dt_plan_result r;
        assert_int_equal(dt_plan_predict(&ctx, &j, &l, &r), DT_OK);
        assert_int_equal(r.n_comm, 2);
        const dt_plan_comm_term *rs = &r.comm[0], *ag = &r.comm[1];
        assert_string_equal(rs->what, "dp reduce-scatter grads");
        assert_string_equal(ag->what, "dp all-gather params x2");
        const double M = r.micro_steps, U = 8; /* a unit per layer */
        near(rs->count, U * M, 1e-15, "a reduce-scatter per unit and micro-step");
        near(ag->count, 2 * U * M, 1e-15, "two gathers per unit and micro-step");
        double s1 = (rs->t_intra + rs->t_inter) / rs->count, g1 = (ag->t_intra + ag->t_inter) / ag->count;
        double fwd = r.compute_s / M / 3, bwd = r.compute_s / M * 2 / 3;
        if (overlap) {
            assert_true(U * g1 > fwd); /* the case that matters: a gather-bound forward */
            double ef = fmax(g1, U * g1 - fwd), eb = fmax(s1, U * (g1 + s1) - bwd);
            near(ag->exposed, M * (ef + eb * g1 / (g1 + s1)), 1e-12, "gathers: the forward's excess + their share");
            near(rs->exposed, M * eb * s1 / (g1 + s1), 1e-12, "reduce-scatters: their share of the backward's");
        } else {
            near(ag->exposed, 2 * U * M * g1, 1e-12, "not overlapped: every gather exposed");
            near(rs->exposed, U * M * s1, 1e-12, "not overlapped: every reduce-scatter exposed");
        }
        near(r.comm_s, ag->exposed + rs->exposed, 1e-12, "comm = the terms' exposed time");
    }
    dt_hw_free(&cat);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_replay),
        cmocka_unit_test(test_time_sliced_and_cp),
        cmocka_unit_test(test_backward_window),
        cmocka_unit_test(test_interleaved_memory),
        cmocka_unit_test(test_zero3_phases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
