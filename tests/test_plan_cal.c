/* The calibrated catalog entry (src/plan/calibrate.c, decisions 45, 53, 55, 56, 71): the links from
 * the comm fit's all-reduce lines give back the fit's times (one node; several nodes: the node
 * and cross groups), and the time per FLOP and the fixed costs per micro-batch and per
 * collective call are solved back from runs made of known values, with every fallback, and
 * the optimizer's time per parameter from the runs' breakdowns; the TP link at the activation's
 * size, which the planner's TP term then uses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "plan/calibrate.h"
#include "plan/plan.h"

static void near(double got, double want, double tol, const char *what) {
    double e = fabs(got - want) / fmax(fabs(want), 1e-300);
    if (!(e <= tol)) fail_msg("%s: got %.10g, want %.10g (rel err %.3g)", what, got, want, e);
}

/* The calibrated catalog entry: the link from the all-reduce fit gives back the fit's times. */
static void cal_line(dt_comm_fit *f, const char *group, double lo, double hi, double alpha, double beta) {
    dt_comm_fit_line *l = &f->line[f->n++];
    snprintf(l->op, sizeof l->op, "allreduce_ordered");
    snprintf(l->group, sizeof l->group, "%s", group);
    l->lo = lo, l->hi = hi, l->alpha_us = alpha, l->beta_us_per_b = beta;
}

/* A scratch directory with dir/cal.yaml as path, and an empty fit of ranks x nodes. */
static void cal_fixture(const char *name, char *dir, char *path, dt_comm_fit *fit, int ranks, int nodes) {
    assert_int_equal(tu_mkdtemp(dir, 256, name), 0);
    snprintf(path, 300, "%s/cal.yaml", dir);
    memset(fit, 0, sizeof *fit);
    fit->ranks = ranks, fit->nodes = nodes;
}

/* Writes the entry of c to path (fit_out: what was solved, may be NULL), reads the file back
 * into cat and returns its cpu-calibrated accelerator (dt_hw_free(cat) after). */
static const dt_hw_accel *written_entry(const char *path, const dt_plan_cal *c, dt_plan_cal_fit *fit_out,
                                        dt_hw_catalog *cat) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    const dt_hw_accel *a = NULL;
    if (dt_plan_cal_write(&ctx, path, c, fit_out) != DT_OK || dt_hw_load(&ctx, path, cat) != DT_OK)
        fail_msg("%s", ctx.err);
    if (dt_hw_find(&ctx, cat, "cpu-calibrated", &a) != DT_OK) fail_msg("%s", ctx.err);
    return a;
}

static void test_calibrate_roundtrip(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancal", dir, path, &fit, 2, 1);
    cal_line(&fit, "", 1 << 20, 64 << 20, 100, 1e-4);
    dt_plan_cal c = {.peak_gflops = 200, .achieved_gflops = 120, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2,
                     .fit = &fit, .source = "test", .nodes = 1};
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, NULL, &cat);
    near(dt_hw_peak(a, DT_F32), 0.2, 1e-12, "peak from bench");
    near(a->gemm_eff, 0.6, 1e-3, "gemm efficiency = achieved / peak");
    const dt_hw_link *l = dt_hw_link_find(&cat, a->intra);
    near(l->bw_gbs, 10, 1e-5, "B = 2(n-1)/n / beta");
    near(l->latency_us, 50, 1e-5, "a = alpha / 2(n-1)");
    dt_plan_net net = {l->bw_gbs * 1e9 * l->eff, l->latency_us * 1e-6, 0, 0};
    double S = 8e6;
    near(dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 2, 1, &net, NULL, NULL), (100 + 1e-4 * S) * 1e-6, 1e-5,
         "the planner's all-reduce = the fit");
    dt_hw_free(&cat);
    /* one rank: one device per node, the link still from the 2-rank fit */
    c.ranks = 1, c.comm_ranks = 2;
    a = written_entry(path, &c, NULL, &cat);
    assert_int_equal(a->devices_per_node, 1);
    near(dt_hw_link_find(&cat, a->intra)->bw_gbs, 10, 1e-5, "1 rank: the 2-rank fit's link");
    dt_hw_free(&cat);
    c.comm_ranks = 1;
    assert_int_equal(dt_plan_cal_write(&ctx, path, &c, NULL), DT_ERR_FORMAT);
    c.ranks = 2, c.comm_ranks = 0;
    /* time-sliced devices (decision 95): no keys while ranks x threads fit the cores */
    c.machine_ranks = 2, c.cores = 2, c.threads = 1;
    a = written_entry(path, &c, NULL, &cat);
    assert_true(a->idle_speedup == 0 && a->machine_ranks == 0);
    dt_hw_free(&cat);
    c.machine_ranks = 4, c.cores = 2, c.threads = 1; /* 4 ranks on 2 cores: each 2x faster alone */
    a = written_entry(path, &c, NULL, &cat);
    near(a->idle_speedup, 2, 1e-12, "idle_speedup = ranks x threads / cores");
    assert_int_equal(a->machine_ranks, 4);
    dt_hw_free(&cat);
    c.machine_ranks = 3, c.cores = 4, c.threads = 2; /* 6 threads on 4 cores */
    a = written_entry(path, &c, NULL, &cat);
    near(a->idle_speedup, 1.5, 1e-12, "3 ranks x 2 threads on 4 cores");
    assert_int_equal(a->machine_ranks, 3);
    dt_hw_free(&cat);
    c.machine_ranks = 0, c.cores = 0, c.threads = 0;
    /* a flat line at the link's size (noise): its time per byte there, 100 us over 64 MiB */
    fit.line[0].beta_us_per_b = 0;
    a = written_entry(path, &c, NULL, &cat);
    near(dt_hw_link_find(&cat, a->intra)->bw_gbs, 67108864.0 / 100e-6 / 1e9, 1e-5, "flat line: B = bytes / t");
    dt_hw_free(&cat);
    fit.line[0].alpha_us = 0; /* no time at all: no link */
    assert_int_equal(dt_plan_cal_write(&ctx, path, &c, NULL), DT_ERR_FORMAT);
    tu_rmtree(dir);
}


/* Several nodes: the node group's lines give the intra-node link, the cross group's the
 * inter-node one (n = nodes), and the planner's collectives over them give back the fits. */
static void test_calibrate_nodes(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancaln", dir, path, &fit, 4, 2);
    cal_line(&fit, "world", 1024, 64 << 20, 30, 5e-4); /* not used for the links */
    cal_line(&fit, "node", 1024, 128 << 10, 8, 1e-3);
    cal_line(&fit, "node", 8 << 20, 64 << 20, 0, 1e-4);
    cal_line(&fit, "cross", 1024, 128 << 10, 40, 2e-3);
    cal_line(&fit, "cross", 8 << 20, 64 << 20, 0, 4e-4);
    dt_plan_cal c = {.peak_gflops = 200, .achieved_gflops = 120, .memory_bytes = 16.0 * 1073741824.0, .ranks = 4,
                     .fit = &fit, .source = "test", .nodes = 2};
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, NULL, &cat);
    assert_int_equal(a->devices_per_node, 2);
    assert_int_equal(a->nics_per_node, 2);
    assert_string_equal(a->intra, "shm-fit");
    assert_string_equal(a->inter, "net-fit");
    const dt_hw_link *li = dt_hw_link_find(&cat, a->intra), *le = dt_hw_link_find(&cat, a->inter);
    near(li->bw_gbs, 2.0 * 1 / 2 / (1e-4 * 1e-6) / 1e9, 1e-5, "intra: the node group, n = 2 ranks per node");
    near(li->latency_us, 8 / 2.0, 1e-6, "intra latency: alpha / 2(k-1) at 1 KiB");
    near(le->bw_gbs, 2.0 * 1 / 2 / (4e-4 * 1e-6) / 1e9, 1e-5, "inter: the cross group, n = 2 nodes");
    near(le->latency_us, 40 / 2.0, 1e-6, "inter latency: alpha / 2(nodes-1) at 1 KiB");
    /* the planner's per-device share of the network (bw x nics / devices per node) is the
     * cross group's bandwidth: its network part of a world all-reduce of S bytes is the cross
     * fit at S / k, its node part the node fit at S */
    dt_plan_net net = {li->bw_gbs * 1e9 * li->eff, li->latency_us * 1e-6,
                       le->bw_gbs * 1e9 * a->nics_per_node / a->devices_per_node * le->eff, le->latency_us * 1e-6};
    double S = 32e6, ti, te;
    dt_plan_coll_time(DT_COLL_ALLREDUCE, S, 2, 2, &net, &ti, &te);
    /* (the latency from the small messages' line, the bandwidth from the large ones') */
    near(ti, (8 + 1e-4 * S) * 1e-6, 1e-9, "node part = the node group's fit");
    near(te, (40 + 4e-4 * (S / 2)) * 1e-6, 1e-9, "network part = the cross group's fit at S / k");
    dt_hw_free(&cat);
    /* one rank per node: no intra-node link is measured; both levels name net-fit */
    fit.ranks = 2, c.ranks = 2;
    a = written_entry(path, &c, NULL, &cat);
    assert_int_equal(a->devices_per_node, 1);
    assert_string_equal(a->intra, "net-fit");
    assert_string_equal(a->inter, "net-fit");
    assert_null(dt_hw_link_find(&cat, "shm-fit"));
    dt_hw_free(&cat);
    /* a fit of another layout, a missing cross group, an uneven split: refused */
    fit.ranks = 4;
    assert_int_equal(dt_plan_cal_write(&ctx, path, &c, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "ran on 4 ranks of 2 node(s), not 2 of 2"));
    c.ranks = 4, fit.n = 3;
    assert_int_equal(dt_plan_cal_write(&ctx, path, &c, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "no cross group allreduce_ordered line"));
    c.ranks = 3;
    assert_int_equal(dt_plan_cal_write(&ctx, path, &c, NULL), DT_ERR_CONFIG);
    tu_rmtree(dir);
}

/* The fixed costs (decision 55): a calibration run, a DDP probe and a ZeRO-3 probe made of a
 * known time per FLOP x, fixed costs o (per micro-batch) and d (per collective call) and the
 * planner's collectives are solved back to x, o and d, and the written entry carries them. */
static void test_calibrate_overhead(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancalo", dir, path, &fit, 2, 1);
    cal_line(&fit, "", 1 << 20, 64 << 20, 100, 1e-4); /* all-reduce of S bytes: (100 + 1e-4 S) us */
    const double peak = 200, x = 1 / (0.5 * peak * 1e9), o = 1.5e-3, d = 80e-6;
    /* run: 10 buckets of 4 MB, all but the last hidden behind the backward; probe: one bucket;
       each bucket's call costs d */
    dt_plan_cal c = {.peak_gflops = peak, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2, .fit = &fit,
                     .source = "test", .nodes = 1,
                     .run = {.flops = 50e9, .grad_bytes = 40e6, .bucket_bytes = 4194304, .overlap = 1},
                     .probe = {.flops = 0.1e9, .grad_bytes = 0.5e6, .bucket_bytes = 4194304, .overlap = 1}};
    c.run.step_s = c.run.flops * x + o + (100 + 1e-4 * 4e6) * 1e-6 + 10 * d;
    c.probe.step_s = c.probe.flops * x + o + (100 + 1e-4 * 0.5e6) * 1e-6 + d;
    c.achieved_gflops = c.run.flops / c.run.step_s / 1e9;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    /* the ZeRO-3 probe: the planner's step of its job with the true values */
    double zstep, zcalls;
    assert_int_equal(dt_plan_cal_zero3_probe(&ctx, &c, 0.5, o * 1e6, d * 1e6, 0, &zstep, &zcalls), DT_OK);
    near(zcalls, 18, 0, "gpt2-tiny ZeRO-3: 6 units, each gathered twice and reduce-scattered");
    c.zprobe.step_s = zstep;
    dt_plan_cal_fit f;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    assert_int_equal(dt_plan_cal_probed(&c), 1);
    near(f.eff, 0.5, 1e-7, "gemm efficiency = 1 / (x peak)");
    near(f.overhead_us, 1500, 1e-3, "fixed cost per micro-batch o");
    near(f.call_us, 80, 1e-4, "fixed cost per collective call");
    near(f.ct, 150e-6 + d, 1e-9, "the probe's all-reduce, one bucket and its call");
    near(f.zcalls, zcalls, 0, "the ZeRO-3 probe's calls");
    dt_plan_cal_fit written;
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, &written, &cat);
    assert_true(written.eff == f.eff && written.overhead_us == f.overhead_us && written.call_us == f.call_us);
    near(a->gemm_eff, 0.5, 1e-6, "the entry's gemm efficiency");
    near(a->step_overhead_us, 1500, 1e-2, "the entry's step_overhead_us");
    near(a->collective_call_us, 80, 1e-3, "the entry's collective_call_us");
    dt_hw_free(&cat);
    /* without the ZeRO-3 probe: no call cost, the DDP runs' calls land in x and o */
    c.zprobe.step_s = 0;
    c.run.step_s -= 10 * d, c.probe.step_s -= d;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.call_us, 0, 0, "no ZeRO-3 probe: no call cost");
    near(f.eff, 0.5, 1e-9, "efficiency");
    near(f.overhead_us, 1500, 1e-6, "fixed cost");
    near(f.ct, 150e-6, 1e-12, "the probe's all-reduce, one bucket");
    /* a ZeRO-3 probe faster than its plan: no call cost */
    c.zprobe.step_s = 1e-6;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.call_us, 0, 0, "ZeRO-3 probe under its plan: 0");
    c.zprobe.step_s = 0;
    /* not overlapped: every bucket is waited for */
    c.run.overlap = 0, c.run.step_s = c.run.flops * x + o + 10 * (100 + 1e-4 * 4e6) * 1e-6;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.eff, 0.5, 1e-9, "no overlap: efficiency");
    near(f.overhead_us, 1500, 1e-6, "no overlap: fixed cost");
    /* the probe faster than its FLOPs allow: no fixed cost, x from the run alone (comm out) */
    c.probe.step_s = 0.1e-3;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.overhead_us, 0, 0, "no fixed cost shown");
    near(f.eff, 1 / ((c.run.step_s - 10 * 500e-6) / c.run.flops * peak * 1e9), 1e-9, "x = the run's (t - c) / F");
    /* a probe as large as the run: one equation */
    c.probe.step_s = 1, c.probe.flops = c.run.flops;
    assert_int_equal(dt_plan_cal_probed(&c), 0);
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.overhead_us, 0, 0, "probe not smaller: no fixed cost");
    a = written_entry(path, &c, NULL, &cat);
    near(a->step_overhead_us, 0, 0, "written as 0");
    near(a->collective_call_us, 0, 0, "written as 0");
    dt_hw_free(&cat);
    tu_rmtree(dir);
}

/* A peak below what the runs reach (a low --peak, a busy machine while bench measured it): the
 * entry's peak is raised to the runs' rate 1 / x with efficiency 1, said so in its comment, and
 * the planner gives the calibration's step back; a peak over 100x the runs' rate is refused. */
static void test_calibrate_low_peak(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancalp", dir, path, &fit, 2, 1);
    cal_line(&fit, "", 1 << 20, 64 << 20, 100, 1e-4);
    const double rate = 113e9, x = 1 / rate, o = 1.5e-3;
    dt_plan_cal c = {.peak_gflops = 100 * 0.25, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2, .fit = &fit,
                     .source = "test", .nodes = 1,
                     .run = {.flops = 50e9, .grad_bytes = 40e6, .bucket_bytes = 4194304, .overlap = 1},
                     .probe = {.flops = 0.1e9, .grad_bytes = 0.5e6, .bucket_bytes = 4194304, .overlap = 1}};
    c.run.step_s = c.run.flops * x + o + (100 + 1e-4 * 4e6) * 1e-6;
    c.probe.step_s = c.probe.flops * x + o + (100 + 1e-4 * 0.5e6) * 1e-6;
    c.achieved_gflops = c.run.flops / c.run.step_s / 1e9;
    dt_plan_cal_fit f;
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, &f, &cat);
    assert_int_equal(f.peak_raised, 1);
    near(f.eff, 1, 0, "efficiency 1 at the raised peak");
    near(f.peak_gflops, rate / 1e9, 1e-7, "the peak raised to the runs' rate 1 / x");
    near(f.overhead_us, 1500, 1e-3, "the fixed cost is still solved");
    near(dt_hw_peak(a, DT_F32) * 1e3, rate / 1e9, 1e-5, "the entry's peak");
    near(a->gemm_eff, 1, 0, "the entry's efficiency");
    dt_hw_free(&cat);
    char text[4096] = "";
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    size_t n = fread(text, 1, sizeof text - 1, fp);
    text[n] = 0;
    fclose(fp);
    assert_non_null(strstr(text, "raised from dtrain bench's peak_gflops 25 of one rank to the rate the runs reached"));
    /* a peak given far above the runs' rate: one line naming both, never a clamped efficiency */
    c.peak_gflops = 1e6;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "under 1% of the peak 1e+06 GFLOP/s: the peak is wrong"));
    /* a run shorter than its predicted all-reduce (an over-predicting fit, a loaded machine):
       the time per FLOP is its whole step, no fixed costs, and the entry says why */
    c.peak_gflops = 100, c.probe.step_s = 0, c.run.step_s = (100 + 1e-4 * 4e6) * 1e-6 * 0.5;
    c.achieved_gflops = c.run.flops / c.run.step_s / 1e9;
    a = written_entry(path, &c, &f, &cat);
    /* 10 buckets of 500 us, all but what the backward (2/3 of the step) hides */
    near(f.comm_over_s, 10 * 500e-6 - c.run.step_s * 2 / 3, 1e-9, "the predicted all-reduce that exceeded the step");
    near(f.peak_gflops, c.run.flops / c.run.step_s / 1e9, 1e-9, "x = the whole step per FLOP (peak raised to it)");
    near(f.overhead_us + f.call_us, 0, 0, "no fixed costs");
    dt_hw_free(&cat);
    fp = fopen(path, "r");
    assert_non_null(fp);
    n = fread(text, 1, sizeof text - 1, fp);
    text[n] = 0;
    fclose(fp);
    assert_non_null(strstr(text, "its predicted all-reduce and calls, 4.833 ms, exceed its step 0.25 ms"));
    tu_rmtree(dir);
}

/* The optimizer step (decision 56): runs whose optimizer takes a + P q (a fixed part, q per
 * parameter) and whose steps hold P q beside x F, o and the calls give back q (written as
 * optimizer_bw_gbs = 28 / q), x, o + a and d; the planner's ZeRO-3 probe charges P / R q. */
static void test_calibrate_optimizer(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancalq", dir, path, &fit, 2, 1);
    cal_line(&fit, "", 1 << 20, 64 << 20, 100, 1e-4);
    const double peak = 200, x = 1 / (0.5 * peak * 1e9), o = 1.5e-3, d = 80e-6, q = 2e-9, a = 0.1e-3;
    const double Pr = 30e6, Pp = 120576; /* gpt2-tiny's parameters: the ZeRO-3 probe's plan */
    dt_plan_cal c = {.peak_gflops = peak, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2, .fit = &fit,
                     .source = "test", .nodes = 1,
                     .run = {.flops = 50e9, .grad_bytes = 4 * Pr, .bucket_bytes = 4194304, .overlap = 1, .params = Pr,
                             .opt_s = a + Pr * q},
                     .probe = {.flops = 0.1e9, .grad_bytes = 4 * Pp, .bucket_bytes = 4194304, .overlap = 1,
                               .params = Pp, .opt_s = a + Pp * q}};
    const double nb = ceil(4 * Pr / 4194304.0), tb = (100 + 1e-4 * 4 * Pr / nb) * 1e-6; /* the run's buckets */
    c.run.step_s = c.run.flops * x + o + a + tb + nb * d + Pr * q;
    c.probe.step_s = c.probe.flops * x + o + a + (100 + 1e-4 * 4 * Pp) * 1e-6 + d + Pp * q;
    c.achieved_gflops = c.run.flops / c.run.step_s / 1e9;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    double zstep, zcalls, zstep0;
    assert_int_equal(dt_plan_cal_zero3_probe(&ctx, &c, 0.5, (o + a) * 1e6, d * 1e6, 28 / q / 1e9, &zstep, &zcalls),
                     DT_OK);
    assert_int_equal(dt_plan_cal_zero3_probe(&ctx, &c, 0.5, (o + a) * 1e6, d * 1e6, 0, &zstep0, &zcalls), DT_OK);
    near(zstep - zstep0, Pp / 2 * q, 1e-6, "the ZeRO-3 probe's plan: the optimizer over its half of the parameters");
    c.zprobe.step_s = zstep;
    dt_plan_cal_fit f;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.opt_s_param, q, 1e-9, "time per parameter: (opt_run - opt_probe) / (P_run - P_probe)");
    near(f.opt_bw_gbs, 14, 1e-9, "optimizer_bw_gbs = 28 / q");
    assert_int_equal(f.opt_runs, 2);
    near(f.eff, 0.5, 1e-7, "gemm efficiency with the optimizer taken out");
    near(f.overhead_us, (o + a) * 1e6, 1e-5, "the optimizer's fixed part stays in o");
    near(f.call_us, 80, 1e-4, "fixed cost per collective call");
    dt_hw_catalog cat;
    const dt_hw_accel *e = written_entry(path, &c, NULL, &cat);
    near(e->optimizer_bw_gbs, 14, 1e-6, "the entry's optimizer_bw_gbs");
    dt_hw_free(&cat);
    /* one run's breakdown only: q = its optimizer / its parameters */
    c.probe.opt_s = 0;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.opt_s_param, (a + Pr * q) / Pr, 1e-12, "one breakdown: opt_run / P_run");
    assert_int_equal(f.opt_runs, 1);
    /* no breakdown: no optimizer term, none written */
    c.run.opt_s = 0;
    assert_int_equal(dt_plan_cal_solve(&ctx, &c, &f), DT_OK);
    near(f.opt_bw_gbs, 0, 0, "no breakdown: no optimizer bandwidth");
    assert_int_equal(f.opt_runs, 0);
    e = written_entry(path, &c, NULL, &cat);
    near(e->optimizer_bw_gbs, 0, 0, "not written: 0");
    dt_hw_free(&cat);
    tu_rmtree(dir);
}

/* The planner's "tp all-reduce acts" term of a tp 2 layout of gpt2-tiny (micro-batch b x seq T)
 * on entry a of cat, with the job's TP link `tp` (NULL: the intra-node link): its intra-node
 * seconds per collective; *act gets the activation's bytes. */
static double tp_term(const dt_hw_catalog *cat, const dt_hw_accel *a, const dt_hw_link *tp, int b, int T, double *act) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    if (dt_model_preset(&ctx, "gpt2-tiny", &mc) != DT_OK || dt_model_config_validate(&ctx, &mc) != DT_OK)
        fail_msg("%s", ctx.err);
    dt_plan_job *job = tu_malloc(sizeof *job);
    memset(job, 0, sizeof *job);
    dt_plan_result *r = tu_malloc(sizeof *r);
    memset(r, 0, sizeof *r);
    dt_plan_model_from_dtrain(&mc, "gpt2-tiny", &job->model);
    dt_train_cfg_defaults(&job->train);
    job->train.micro_batch = b, job->train.seq_len = T;
    job->gpus = 2, job->dpn = 2, job->global_batch = b;
    job->hw = a, job->intra = dt_hw_link_find(cat, a->intra), job->inter = dt_hw_link_find(cat, a->inter);
    job->gemm_eff = a->gemm_eff, job->intra_eff = job->inter_eff = 1, job->price_hour = job->spot_hour = -1;
    job->tp = tp, job->tp_eff = tp ? tp->eff : 0;
    dt_plan_layout l = {1, 2, 1, 1, 1, DT_STRAT_DDP, 0};
    if (dt_plan_predict(&ctx, job, &l, r) != DT_OK) fail_msg("%s", ctx.err);
    double t = -1;
    for (int i = 0; i < r->n_comm; i++)
        if (!strcmp(r->comm[i].what, "tp all-reduce acts")) t = r->comm[i].t_intra / r->comm[i].count, *act = r->comm[i].bytes;
    free(job);
    free(r);
    if (!(t > 0)) fail_msg("no tp all-reduce term");
    return t;
}

/* The TP link (decision 71): the node-level all-reduce fit read at the calibration job's
 * activation (tp_bytes) instead of the bucket size; the entry names it tp_link, and the
 * planner's TP term uses it: the term gives back the fit's time at that size, and changes to
 * the intra-node link's when the entry's tp_link is taken away. None without an activation size
 * or with one rank per node. */
static void test_calibrate_tp_link(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancaltp", dir, path, &fit, 2, 1);
    cal_line(&fit, "world", 1024, 128 << 10, 20, 2e-3);    /* activations: (20 + 2e-3 S) us */
    cal_line(&fit, "world", 8 << 20, 64 << 20, 0, 1e-4);   /* gradient buckets */
    const int b = 2, T = 64; /* gpt2-tiny's activation: 2 x 64 x d_model x 4 bytes */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    assert_int_equal(dt_model_preset(&ctx, "gpt2-tiny", &mc), DT_OK);
    dt_plan_cal c = {.peak_gflops = 200, .achieved_gflops = 120, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2,
                     .fit = &fit, .source = "test", .nodes = 1, .tp_bytes = 4.0 * b * T * mc.d_model};
    assert_true(c.tp_bytes >= 1024 && c.tp_bytes <= (128 << 10)); /* in the activations' line */
    double bw, lat;
    assert_int_equal(dt_plan_cal_tp_link(&ctx, &c, &bw, &lat), DT_OK);
    near(bw, 2.0 * 1 / 2 / (2e-3 * 1e-6) / 1e9, 1e-9, "TP bandwidth: 2(n-1)/n / beta of the activation's line");
    near(lat, 20 / 2.0, 1e-12, "TP latency: alpha / 2(n-1) at 1 KiB");
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->tp_link, "tp-fit");
    const dt_hw_link *tl = dt_hw_tp_link(&cat, a), *il = dt_hw_link_find(&cat, a->intra);
    assert_non_null(tl);
    assert_string_equal(tl->key, "tp-fit");
    assert_true(isfinite(tl->bw_gbs) && tl->bw_gbs > 0 && isfinite(tl->latency_us) && tl->latency_us > 0);
    near(tl->bw_gbs, bw, 1e-5, "the entry's tp-fit bandwidth");
    near(tl->latency_us, lat, 1e-5, "the entry's tp-fit latency");
    near(tl->eff, 1, 0, "measured: efficiency 1");
    near(il->bw_gbs, 10, 1e-5, "shm-fit still read at 64 MiB");
    /* the planner's TP term on the entry: the fit's time at the job's activation */
    double act, t = tp_term(&cat, a, tl, b, T, &act);
    near(act, c.tp_bytes, 0, "the term's message is the calibration's activation");
    near(t, (20 + 2e-3 * act) * 1e-6, 1e-5, "tp all-reduce = the fit at the activation");
    /* the field changed (the entry without tp_link: the intra-node link): another time, the
       bucket-sized link's */
    double t0 = tp_term(&cat, a, NULL, b, T, &act);
    near(t0, (2.0 * 0.5 * act / (il->bw_gbs * 1e9) + 2 * il->latency_us * 1e-6), 1e-9, "without tp_link: shm-fit");
    assert_true(fabs(t0 - t) > 0.5 * t); /* 10 GB/s vs 0.5 GB/s */
    dt_hw_accel plain = *a;
    plain.tp_link[0] = 0;
    assert_ptr_equal(dt_hw_tp_link(&cat, &plain), il);
    dt_hw_free(&cat);
    /* no activation size: no TP link in the entry, the planner uses the intra-node link */
    c.tp_bytes = 0;
    assert_int_equal(dt_plan_cal_tp_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->tp_link, "");
    assert_null(dt_hw_link_find(&cat, "tp-fit"));
    assert_ptr_equal(dt_hw_tp_link(&cat, a), dt_hw_link_find(&cat, a->intra));
    dt_hw_free(&cat);
    /* several nodes: the node group's lines, n = the ranks of a node */
    fit.ranks = 4, fit.nodes = 2, fit.n = 0;
    cal_line(&fit, "node", 1024, 128 << 10, 8, 1e-3);
    cal_line(&fit, "node", 8 << 20, 64 << 20, 0, 1e-4);
    cal_line(&fit, "cross", 1024, 64 << 20, 40, 2e-3);
    c.ranks = 4, c.nodes = 2, c.tp_bytes = 65536;
    a = written_entry(path, &c, NULL, &cat);
    tl = dt_hw_tp_link(&cat, a);
    assert_string_equal(tl->key, "tp-fit");
    near(tl->bw_gbs, 2.0 * 1 / 2 / (1e-3 * 1e-6) / 1e9, 1e-5, "2 nodes: the node group's activation line");
    near(tl->latency_us, 8 / 2.0, 1e-6, "2 nodes: the node group's latency");
    dt_hw_free(&cat);
    /* one rank per node: no group inside a node, no TP link */
    fit.ranks = 2, c.ranks = 2;
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->tp_link, "");
    assert_int_equal(dt_plan_cal_tp_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    dt_hw_free(&cat);
    tu_rmtree(dir);
}

/* The planner's "pp send/recv acts" term of a pp 2 layout of gpt2-tiny (micro-batch b x seq T)
 * on entry a of cat, with the job's PP link `pp` (NULL: the intra-node link): its intra-node
 * seconds per send; *act gets the message's bytes. */
static double pp_term_at(const dt_hw_catalog *cat, const dt_hw_accel *a, const dt_hw_link *pp, const dt_hw_link *ppi,
                         int dpn, int b, int T, double *act, double *t_inter) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    if (dt_model_preset(&ctx, "gpt2-tiny", &mc) != DT_OK || dt_model_config_validate(&ctx, &mc) != DT_OK)
        fail_msg("%s", ctx.err);
    dt_plan_job *job = tu_malloc(sizeof *job);
    memset(job, 0, sizeof *job);
    dt_plan_result *r = tu_malloc(sizeof *r);
    memset(r, 0, sizeof *r);
    dt_plan_model_from_dtrain(&mc, "gpt2-tiny", &job->model);
    dt_train_cfg_defaults(&job->train);
    job->train.micro_batch = b, job->train.seq_len = T;
    job->gpus = 2, job->dpn = dpn, job->global_batch = 4L * b;
    job->hw = a, job->intra = dt_hw_link_find(cat, a->intra), job->inter = dt_hw_link_find(cat, a->inter);
    job->gemm_eff = a->gemm_eff, job->intra_eff = job->inter_eff = 1, job->price_hour = job->spot_hour = -1;
    job->pp = pp, job->pp_eff = pp ? pp->eff : 0;
    job->pp_inter = ppi, job->pp_inter_eff = ppi ? ppi->eff : 0;
    dt_plan_layout l = {1, 1, 2, 1, 1, DT_STRAT_DDP, 0};
    if (dt_plan_predict(&ctx, job, &l, r) != DT_OK) fail_msg("%s", ctx.err);
    double t = -1;
    for (int i = 0; i < r->n_comm; i++)
        if (!strcmp(r->comm[i].what, "pp send/recv acts"))
            t = r->comm[i].t_intra / r->comm[i].count, *t_inter = r->comm[i].t_inter / r->comm[i].count,
            *act = r->comm[i].bytes;
    free(job);
    free(r);
    if (!(t >= 0)) fail_msg("no pp send/recv term");
    return t;
}

static double pp_term(const dt_hw_catalog *cat, const dt_hw_accel *a, const dt_hw_link *pp, int b, int T, double *act) {
    double ti;
    const double t = pp_term_at(cat, a, pp, NULL, 2, b, T, act, &ti);
    if (!(t > 0)) fail_msg("no pp send/recv term inside the node");
    return t;
}

static void pp_line(dt_comm_fit *f, const char *group, double lo, double hi, double alpha, double beta) {
    cal_line(f, group, lo, hi, alpha, beta);
    snprintf(f->line[f->n - 1].op, sizeof f->line[0].op, "pingpong");
}

/* The PP link (decision 77): bench comm's ping-pong line (one message) read at the calibration
 * job's activation gives pp-fit (B = 1 / beta, a = alpha at 1 KiB); the entry names it pp_link
 * and the planner's pipeline term uses it: the fit's time at the activation, and the intra-node
 * link's once pp_link is taken away. A fit without ping-pong lines (made before them), no
 * activation size or one rank per node: no PP link, the entry still written. */
static void test_calibrate_pp_link(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancalpp", dir, path, &fit, 2, 1);
    cal_line(&fit, "world", 1024, 128 << 10, 20, 2e-3);
    cal_line(&fit, "world", 8 << 20, 64 << 20, 0, 1e-4);
    pp_line(&fit, "world", 1024, 128 << 10, 3, 4e-4);   /* one message: (3 + 4e-4 S) us */
    pp_line(&fit, "world", 256 << 10, 64 << 20, 6, 1e-4);
    const int b = 2, T = 64;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    assert_int_equal(dt_model_preset(&ctx, "gpt2-tiny", &mc), DT_OK);
    dt_plan_cal c = {.peak_gflops = 200, .achieved_gflops = 120, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2,
                     .fit = &fit, .source = "test", .nodes = 1, .tp_bytes = 4.0 * b * T * mc.d_model};
    assert_true(c.tp_bytes >= 1024 && c.tp_bytes <= (128 << 10));
    double bw, lat;
    assert_int_equal(dt_plan_cal_pp_link(&ctx, &c, &bw, &lat), DT_OK);
    near(bw, 1 / (4e-4 * 1e-6) / 1e9, 1e-9, "PP bandwidth: 1 / beta of the activation's ping-pong line");
    near(lat, 3, 1e-12, "PP latency: alpha at 1 KiB");
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->pp_link, "pp-fit");
    assert_string_equal(a->tp_link, "tp-fit"); /* beside the TP link */
    const dt_hw_link *pl = dt_hw_pp_link(&cat, a), *il = dt_hw_link_find(&cat, a->intra);
    assert_non_null(pl);
    assert_string_equal(pl->key, "pp-fit");
    assert_true(isfinite(pl->bw_gbs) && pl->bw_gbs > 0 && isfinite(pl->latency_us) && pl->latency_us > 0);
    near(pl->bw_gbs, bw, 1e-5, "the entry's pp-fit bandwidth");
    near(pl->latency_us, lat, 1e-5, "the entry's pp-fit latency");
    near(pl->eff, 1, 0, "measured: efficiency 1");
    double act, t = pp_term(&cat, a, pl, b, T, &act);
    near(act, c.tp_bytes, 0, "the term's message is the calibration's activation");
    near(t, (3 + 4e-4 * act) * 1e-6, 1e-5, "pp send = the ping-pong fit at the activation");
    double t0 = pp_term(&cat, a, NULL, b, T, &act);
    near(t0, act / (il->bw_gbs * 1e9) + il->latency_us * 1e-6, 1e-9, "without pp_link: shm-fit");
    assert_true(fabs(t0 - t) > 0.1 * t);
    dt_hw_accel plain = *a;
    plain.pp_link[0] = 0;
    assert_ptr_equal(dt_hw_pp_link(&cat, &plain), il);
    dt_hw_free(&cat);
    /* a fit without ping-pong lines: no PP link, the rest written */
    fit.n = 2;
    assert_int_equal(dt_plan_cal_pp_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->pp_link, "");
    assert_string_equal(a->tp_link, "tp-fit");
    assert_null(dt_hw_link_find(&cat, "pp-fit"));
    assert_ptr_equal(dt_hw_pp_link(&cat, a), dt_hw_link_find(&cat, a->intra));
    dt_hw_free(&cat);
    /* no activation size: none */
    pp_line(&fit, "world", 1024, 64 << 20, 3, 4e-4);
    c.tp_bytes = 0;
    assert_int_equal(dt_plan_cal_pp_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    /* several nodes: the node group's ping-pong, a pair inside a node */
    fit.ranks = 4, fit.nodes = 2, fit.n = 0;
    cal_line(&fit, "node", 1024, 128 << 10, 8, 1e-3);
    cal_line(&fit, "node", 8 << 20, 64 << 20, 0, 1e-4);
    cal_line(&fit, "cross", 1024, 64 << 20, 40, 2e-3);
    pp_line(&fit, "node", 1024, 64 << 20, 2, 2e-4);
    pp_line(&fit, "cross", 1024, 64 << 20, 30, 1e-3);
    c.ranks = 4, c.nodes = 2, c.tp_bytes = 65536;
    a = written_entry(path, &c, NULL, &cat);
    pl = dt_hw_pp_link(&cat, a);
    assert_string_equal(pl->key, "pp-fit");
    near(pl->bw_gbs, 1 / (2e-4 * 1e-6) / 1e9, 1e-5, "2 nodes: the node group's ping-pong");
    near(pl->latency_us, 2, 1e-6, "2 nodes: its latency");
    dt_hw_free(&cat);
    /* one rank per node: no pair inside a node, no PP link; across the nodes pp-net-fit from
       the cross group's ping-pong (B = 1 / beta, a = alpha: decision 92), which a pp 2 plan's
       sends across the 2 nodes give back, and the inter-node link's once it is taken away */
    fit.ranks = 2, c.ranks = 2;
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->pp_link, "");
    assert_int_equal(dt_plan_cal_pp_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    assert_string_equal(a->pp_inter_link, "pp-net-fit");
    const dt_hw_link *pil = dt_hw_pp_inter_link(&cat, a), *nl = dt_hw_link_find(&cat, a->inter);
    assert_string_equal(pil->key, "pp-net-fit");
    near(pil->bw_gbs, 1 / (1e-3 * 1e-6) / 1e9, 1e-5, "pp-net-fit: 1 / beta of the cross ping-pong");
    near(pil->latency_us, 30, 1e-6, "pp-net-fit: its alpha");
    double ti, ti0;
    assert_true(pp_term_at(&cat, a, NULL, pil, 1, b, T, &act, &ti) == 0);
    near(ti, (30 + 1e-3 * act) * 1e-6, 1e-5, "a stage send across nodes = the cross ping-pong at the activation");
    pp_term_at(&cat, a, NULL, NULL, 1, b, T, &act, &ti0);
    near(ti0, act / (nl->bw_gbs * 1e9) + nl->latency_us * 1e-6, 1e-9, "without pp_inter_link: net-fit");
    assert_true(fabs(ti0 - ti) > 0.1 * ti);
    dt_hw_free(&cat);
    /* one node: none across */
    c.nodes = 1;
    assert_int_equal(dt_plan_cal_pp_inter_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    tu_rmtree(dir);
}

/* The planner's "ep all-to-all tokens" term of mixtral-tiny (micro-batch b x seq T) at dp 2 ep 2
 * on entry a of cat, with the job's EP link `ep` (NULL: the intra-node link): its intra-node
 * seconds per all-to-all; *bytes gets a rank's buffer (e b T d K). */
static double ep_term_at(const dt_hw_catalog *cat, const dt_hw_accel *a, const dt_hw_link *ep, const dt_hw_link *epi,
                         int dpn, int b, int T, double *bytes, double *t_inter) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config mc;
    if (dt_model_preset(&ctx, "mixtral-tiny", &mc) != DT_OK || dt_model_config_validate(&ctx, &mc) != DT_OK)
        fail_msg("%s", ctx.err);
    dt_plan_job *job = tu_malloc(sizeof *job);
    memset(job, 0, sizeof *job);
    dt_plan_result *r = tu_malloc(sizeof *r);
    memset(r, 0, sizeof *r);
    dt_plan_model_from_dtrain(&mc, "mixtral-tiny", &job->model);
    dt_train_cfg_defaults(&job->train);
    job->train.micro_batch = b, job->train.seq_len = T;
    job->gpus = 2, job->dpn = dpn, job->global_batch = 2L * b;
    job->hw = a, job->intra = dt_hw_link_find(cat, a->intra), job->inter = dt_hw_link_find(cat, a->inter);
    job->gemm_eff = a->gemm_eff, job->intra_eff = job->inter_eff = 1, job->price_hour = job->spot_hour = -1;
    job->ep = ep, job->ep_eff = ep ? ep->eff : 0;
    job->ep_inter = epi, job->ep_inter_eff = epi ? epi->eff : 0;
    dt_plan_layout l = {2, 1, 1, 1, 2, DT_STRAT_DDP, 0};
    if (dt_plan_predict(&ctx, job, &l, r) != DT_OK) fail_msg("%s", ctx.err);
    double t = -1;
    for (int i = 0; i < r->n_comm; i++)
        if (!strcmp(r->comm[i].what, "ep all-to-all tokens"))
            t = r->comm[i].t_intra / r->comm[i].count, *t_inter = r->comm[i].t_inter / r->comm[i].count,
            *bytes = r->comm[i].bytes;
    free(job);
    free(r);
    if (!(t >= 0)) fail_msg("no ep all-to-all term");
    return t;
}

static double ep_term(const dt_hw_catalog *cat, const dt_hw_accel *a, const dt_hw_link *ep, int b, int T, double *bytes) {
    double ti;
    const double t = ep_term_at(cat, a, ep, NULL, 2, b, T, bytes, &ti);
    if (!(t > 0)) fail_msg("no ep all-to-all term inside the node");
    return t;
}

static void a2a_line(dt_comm_fit *f, const char *group, double lo, double hi, double alpha, double beta) {
    cal_line(f, group, lo, hi, alpha, beta);
    snprintf(f->line[f->n - 1].op, sizeof f->line[0].op, "alltoall");
}

/* The EP link (decision 92): bench comm's alltoall line (S: a rank's whole send buffer) read at
 * the calibration job's activation gives ep-fit (B = (n-1)/n / beta, a = alpha / (n-1) at 1 KiB);
 * the entry names it ep_link and the planner's expert all-to-all term on 2 ranks of a node gives
 * back the fit's time at its buffer, and the intra-node link's once ep_link is taken away. A fit
 * without alltoall lines (made before them), or one rank per node: no EP link, the entry still
 * written. */
static void test_calibrate_ep_link(void **state) {
    (void)state;
    char dir[256], path[300];
    dt_comm_fit fit;
    cal_fixture("plancalep", dir, path, &fit, 2, 1);
    cal_line(&fit, "world", 1024, 128 << 10, 20, 2e-3);
    cal_line(&fit, "world", 8 << 20, 64 << 20, 0, 1e-4);
    a2a_line(&fit, "world", 1024, 64 << 10, 5, 8e-4); /* (5 + 8e-4 S) us */
    a2a_line(&fit, "world", 128 << 10, 64 << 20, 9, 2e-4);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_plan_cal c = {.peak_gflops = 200, .achieved_gflops = 120, .memory_bytes = 16.0 * 1073741824.0, .ranks = 2,
                     .fit = &fit, .source = "test", .nodes = 1, .tp_bytes = 32768};
    double bw, lat;
    assert_int_equal(dt_plan_cal_ep_link(&ctx, &c, &bw, &lat), DT_OK);
    near(bw, 0.5 / (8e-4 * 1e-6) / 1e9, 1e-9, "EP bandwidth: (n-1)/n / beta of the activation's alltoall line");
    near(lat, 5, 1e-12, "EP latency: alpha / (n-1) at 1 KiB");
    dt_hw_catalog cat;
    const dt_hw_accel *a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->ep_link, "ep-fit");
    assert_string_equal(a->tp_link, "tp-fit"); /* beside the TP link */
    const dt_hw_link *el = dt_hw_ep_link(&cat, a), *il = dt_hw_link_find(&cat, a->intra);
    assert_non_null(el);
    assert_string_equal(el->key, "ep-fit");
    assert_true(isfinite(el->bw_gbs) && el->bw_gbs > 0 && isfinite(el->latency_us) && el->latency_us > 0);
    near(el->bw_gbs, bw, 1e-5, "the entry's ep-fit bandwidth");
    near(el->latency_us, lat, 1e-5, "the entry's ep-fit latency");
    near(el->eff, 1, 0, "measured: efficiency 1");
    /* mixtral-tiny, 1 x 64 tokens, top-2: a rank's buffer 4 x 64 x 64 x 2 = 32 KiB, on the fit's first line */
    double S, t = ep_term(&cat, a, el, 1, 64, &S);
    near(S, 32768, 0, "the all-to-all's buffer");
    near(t, (5 + 8e-4 * S) * 1e-6, 1e-5, "ep all-to-all = the alltoall fit at its buffer");
    double t0 = ep_term(&cat, a, NULL, 1, 64, &S);
    near(t0, 0.5 * S / (il->bw_gbs * 1e9) + il->latency_us * 1e-6, 1e-9, "without ep_link: shm-fit");
    assert_true(fabs(t0 - t) > 0.1 * t);
    dt_hw_accel plain = *a;
    plain.ep_link[0] = 0;
    assert_ptr_equal(dt_hw_ep_link(&cat, &plain), il);
    dt_hw_free(&cat);
    /* a fit without alltoall lines: no EP link, the rest written */
    fit.n = 2;
    assert_int_equal(dt_plan_cal_ep_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->ep_link, "");
    assert_string_equal(a->tp_link, "tp-fit");
    assert_null(dt_hw_link_find(&cat, "ep-fit"));
    assert_ptr_equal(dt_hw_ep_link(&cat, a), dt_hw_link_find(&cat, a->intra));
    dt_hw_free(&cat);
    /* several nodes: the node group's all-to-all, n = its 2 ranks */
    fit.ranks = 4, fit.nodes = 2, fit.n = 0;
    cal_line(&fit, "node", 1024, 128 << 10, 8, 1e-3);
    cal_line(&fit, "node", 8 << 20, 64 << 20, 0, 1e-4);
    cal_line(&fit, "cross", 1024, 64 << 20, 40, 2e-3);
    a2a_line(&fit, "node", 1024, 64 << 20, 4, 4e-4);
    a2a_line(&fit, "cross", 1024, 64 << 20, 30, 1e-3);
    c.ranks = 4, c.nodes = 2;
    a = written_entry(path, &c, NULL, &cat);
    el = dt_hw_ep_link(&cat, a);
    assert_string_equal(el->key, "ep-fit");
    near(el->bw_gbs, 0.5 / (4e-4 * 1e-6) / 1e9, 1e-5, "2 nodes: the node group's all-to-all");
    near(el->latency_us, 4, 1e-6, "2 nodes: its latency");
    dt_hw_free(&cat);
    /* one rank per node: no group inside a node, no EP link; across the nodes ep-net-fit from
       the cross group's all-to-all (n = 2 nodes: B = (n-1)/n / beta, a = alpha / (n-1)), which an
       ep 2 plan's all-to-alls across the 2 nodes give back */
    fit.ranks = 2, c.ranks = 2;
    a = written_entry(path, &c, NULL, &cat);
    assert_string_equal(a->ep_link, "");
    assert_int_equal(dt_plan_cal_ep_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    assert_string_equal(a->ep_inter_link, "ep-net-fit");
    const dt_hw_link *eil = dt_hw_ep_inter_link(&cat, a), *nl = dt_hw_link_find(&cat, a->inter);
    assert_string_equal(eil->key, "ep-net-fit");
    near(eil->bw_gbs, 0.5 / (1e-3 * 1e-6) / 1e9, 1e-5, "ep-net-fit: (n-1)/n / beta of the cross all-to-all");
    near(eil->latency_us, 30, 1e-6, "ep-net-fit: alpha / (n-1)");
    double ti, ti0;
    assert_true(ep_term_at(&cat, a, NULL, eil, 1, 1, 64, &S, &ti) == 0);
    near(ti, (30 + 1e-3 * S) * 1e-6, 1e-5, "an all-to-all across nodes = the cross all-to-all at its buffer");
    ep_term_at(&cat, a, NULL, NULL, 1, 1, 64, &S, &ti0);
    near(ti0, 0.5 * S / (nl->bw_gbs * 1e9) + nl->latency_us * 1e-6, 1e-9, "without ep_inter_link: net-fit");
    assert_true(fabs(ti0 - ti) > 0.1 * ti);
    dt_hw_free(&cat);
    c.nodes = 1;
    assert_int_equal(dt_plan_cal_ep_inter_link(&ctx, &c, &bw, &lat), DT_ERR_CONFIG);
    tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calibrate_roundtrip),
        cmocka_unit_test(test_calibrate_nodes),
        cmocka_unit_test(test_calibrate_overhead),
        cmocka_unit_test(test_calibrate_low_peak),
        cmocka_unit_test(test_calibrate_optimizer),
        cmocka_unit_test(test_calibrate_tp_link),
        cmocka_unit_test(test_calibrate_pp_link),
        cmocka_unit_test(test_calibrate_ep_link),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
