/* The calibrated CPU-node catalog entry (calibrate.h). */
#include "plan/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"

/* B and a of the ring formula from the ordered all-reduce lines of `group` over n ranks. beta is
 * the slope of the line that covers `bytes`; where the measurement's noise left that line flat
 * or falling (a small comm fit, sizes whose times barely differ), its time per byte there,
 * (alpha + beta bytes) / bytes: the bandwidth the measured times imply at that size, rather than
 * no link at all. */
static dt_status ring_link(dt_ctx *ctx, const dt_comm_fit *fit, const char *group, int n, double bytes, double *bw_gbs,
                           double *lat_us) {
    const dt_comm_fit_line *l = dt_comm_fit_find_in(fit, group, "allreduce_ordered", bytes);
    if (!l)
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit has no %s%sallreduce_ordered line", group,
                       strcmp(group, "world") ? " group " : " ");
    double beta = l->beta_us_per_b;
    if (!(beta > 0) && bytes > 0) beta = (l->alpha_us + l->beta_us_per_b * bytes) / bytes;
    if (n < 2 || !(beta > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit's %s group needs 2+ ranks and a positive time "
                       "per byte", group);
    *bw_gbs = 2.0 * (n - 1) / n / (beta * 1e-6) / 1e9;
    /* the latency from the smallest messages' line (large ones fit through the origin) */
    *lat_us = dt_comm_fit_find_in(fit, group, "allreduce_ordered", 1024)->alpha_us / (2.0 * (n - 1));
    return DT_OK;
}

static int per_node(const dt_plan_cal *c) { return c->nodes > 1 ? c->ranks / c->nodes : c->ranks; }

dt_status dt_plan_cal_link(dt_ctx *ctx, const dt_plan_cal *c, int level, double *bw_gbs, double *lat_us,
                           const char **name) {
    double bytes = c->link_bytes > 0 ? c->link_bytes : 64.0 * 1048576;
    if (c->nodes <= 1) {
        *name = "shm-fit";
        return ring_link(ctx, c->fit, "world", c->comm_ranks ? c->comm_ranks : c->ranks, bytes, bw_gbs, lat_us);
    }
    int k = per_node(c);
    if (c->ranks % c->nodes)
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: %d ranks do not split evenly over %d nodes", c->ranks,
                       c->nodes);
    if (c->fit->ranks != c->ranks || c->fit->nodes != c->nodes)
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit ran on %d ranks of %d node(s), not %d of %d",
                       c->fit->ranks, c->fit->nodes, c->ranks, c->nodes);
    if (level == 0 && k > 1) {
        *name = "shm-fit";
        return ring_link(ctx, c->fit, "node", k, bytes, bw_gbs, lat_us);
    }
    *name = "net-fit"; /* one rank per node: nothing moves inside a node, the level names the network */
    return ring_link(ctx, c->fit, "cross", c->nodes, bytes, bw_gbs, lat_us);
}

dt_status dt_plan_cal_tp_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us) {
    const int k = per_node(c);
    if (!(c->tp_bytes > 0) || (c->nodes > 1 && k < 2))
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no TP link (%s)",
                       !(c->tp_bytes > 0) ? "no activation size" : "one rank per node: no group inside a node");
    if (c->nodes > 1) return ring_link(ctx, c->fit, "node", k, c->tp_bytes, bw_gbs, lat_us);
    return ring_link(ctx, c->fit, "world", c->comm_ranks ? c->comm_ranks : c->ranks, c->tp_bytes, bw_gbs, lat_us);
}

/* A point-to-point (pingpong: B = 1 / beta, a = alpha) or all-to-all (alltoall over n ranks:
 * B = (n-1)/n / beta, a = alpha / (n-1)) link from `group`'s lines of op, read at the
 * calibration job's activation size: beta from the line covering it, alpha from the 1 KiB one.
 * A line without a positive beta (noise, a loaded host) gives no link rather than a wrong one. */
static dt_status fit_link(dt_ctx *ctx, const dt_plan_cal *c, const char *group, const char *op, int n,
                          const char *what, double *bw_gbs, double *lat_us) {
    const int a2a = !strcmp(op, "alltoall");
    const dt_comm_fit_line *l = dt_comm_fit_find_in(c->fit, group, op, c->tp_bytes),
                           *s = dt_comm_fit_find_in(c->fit, group, op, 1024);
    if (!l || !s)
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no %s (the comm fit has no %s %s line)", what, group, op);
    if (!(l->beta_us_per_b > 0) || !(s->alpha_us >= 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no %s (the comm fit's %s %s line at %g bytes has no "
                       "positive beta)", what, group, op, c->tp_bytes);
    *bw_gbs = (a2a ? (double)(n - 1) / n : 1.0) / (l->beta_us_per_b * 1e-6) / 1e9;
    *lat_us = s->alpha_us / (a2a ? n - 1 : 1);
    return DT_OK;
}

dt_status dt_plan_cal_pp_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us) {
    const int k = per_node(c);
    if (!(c->tp_bytes > 0) || (c->nodes > 1 && k < 2))
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no PP link (%s)",
                       !(c->tp_bytes > 0) ? "no activation size" : "one rank per node: no pair inside a node");
    return fit_link(ctx, c, c->nodes > 1 ? "node" : "world", "pingpong", 2, "PP link", bw_gbs, lat_us);
}

dt_status dt_plan_cal_ep_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us) {
    const int k = per_node(c), n = c->nodes > 1 ? k : c->comm_ranks ? c->comm_ranks : c->ranks;
    if (!(c->tp_bytes > 0) || n < 2)
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no EP link (%s)",
                       !(c->tp_bytes > 0) ? "no activation size" : "one rank per node: no group inside a node");
    return fit_link(ctx, c, c->nodes > 1 ? "node" : "world", "alltoall", n, "EP link", bw_gbs, lat_us);
}

/* The cross group's links: one rank of each node, every such group at once, so per rank with
 * the node's ranks sending, as net-fit. */
static dt_status cross_link(dt_ctx *ctx, const dt_plan_cal *c, const char *op, const char *what, double *bw_gbs,
                            double *lat_us) {
    if (c->nodes < 2 || !(c->tp_bytes > 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: no %s link across nodes (%s)", what,
                       c->nodes < 2 ? "one node" : "no activation size");
    char w[32];
    snprintf(w, sizeof w, "%s link across nodes", what);
    return fit_link(ctx, c, "cross", op, c->nodes, w, bw_gbs, lat_us);
}

dt_status dt_plan_cal_pp_inter_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us) {
    return cross_link(ctx, c, "pingpong", "PP", bw_gbs, lat_us);
}

dt_status dt_plan_cal_ep_inter_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us) {
    return cross_link(ctx, c, "alltoall", "EP", bw_gbs, lat_us);
}

/* The exposed time of a DDP run's all-reduce as the planner predicts it (plan_time.c): its
 * buckets over k ranks a node on nn nodes, all but the last hidden behind the backward (2/3
 * of the layers' compute F x s, s = layer_share: decision 97) when overlapped, and call_s for
 * each bucket's call. */
static double run_comm(const dt_plan_cal_run *r, int k, int nn, const dt_plan_net *net, double x, double call_s) {
    if (k * nn < 2 || !(r->grad_bytes > 0)) return 0;
    double buckets = ceil(r->grad_bytes / fmax(r->bucket_bytes, 1.0));
    double t = dt_plan_coll_time(DT_COLL_ALLREDUCE, r->grad_bytes / buckets, k, nn, net, NULL, NULL);
    const double share = r->layer_share > 0 ? r->layer_share : 1.0;
    return (r->overlap ? fmax(t, buckets * t - r->flops * x * 2.0 / 3.0 * share) : buckets * t) + buckets * call_s;
}

dt_status dt_plan_cal_zero3_probe(dt_ctx *ctx, const dt_plan_cal *c, double eff, double overhead_us, double call_us,
                                  double opt_bw_gbs, double *step_s, double *calls) {
    double bw[2], lat[2];
    const char *name;
    for (int lv = 0; lv < 2; lv++) DT_CHECK(dt_plan_cal_link(ctx, c, lv, &bw[lv], &lat[lv], &name));
    const int k = per_node(c);
    dt_hw_accel hw = {.kind = "cpu", .memory_bytes = c->memory_bytes > 0 ? c->memory_bytes : 1e12,
                      .devices_per_node = k, .nics_per_node = k, .gemm_eff = eff,
                      .step_overhead_us = overhead_us, .collective_call_us = call_us, .optimizer_bw_gbs = opt_bw_gbs};
    hw.peak_tflops[DT_HW_FP32] = c->peak_gflops / 1e3;
    const dt_hw_link intra = {.bw_gbs = bw[0], .latency_us = lat[0], .eff = 1},
                     inter = {.bw_gbs = bw[1], .latency_us = lat[1], .eff = 1};
    dt_model_config mc;
    DT_CHECK(dt_model_preset(ctx, DT_PLAN_CAL_PROBE_MODEL, &mc));
    DT_CHECK(dt_model_config_validate(ctx, &mc));
    dt_plan_job *job = calloc(1, sizeof *job);
    dt_plan_result *r = calloc(1, sizeof *r);
    dt_status st = job && r ? DT_OK : dt_fail(ctx, DT_ERR_NOMEM, "plan --calibrate: out of memory");
    if (st == DT_OK) {
        dt_plan_model_from_dtrain(&mc, DT_PLAN_CAL_PROBE_MODEL, &job->model);
        dt_train_cfg_defaults(&job->train);
        job->train.micro_batch = DT_PLAN_CAL_PROBE_BATCH, job->train.seq_len = DT_PLAN_CAL_PROBE_SEQ;
        job->gpus = c->ranks, job->dpn = k, job->global_batch = (long)DT_PLAN_CAL_PROBE_BATCH * c->ranks;
        job->hw = &hw, job->intra = &intra, job->inter = &inter;
        job->gemm_eff = eff, job->intra_eff = job->inter_eff = 1, job->price_hour = job->spot_hour = -1;
        dt_plan_layout l = {c->ranks, 1, 1, 1, 1, DT_STRAT_ZERO3, 0};
        st = dt_plan_predict(ctx, job, &l, r);
        *step_s = r->step_s, *calls = r->calls;
    }
    free(job);
    free(r);
    return st;
}

dt_status dt_plan_cal_solve(dt_ctx *ctx, const dt_plan_cal *c, dt_plan_cal_fit *f) {
    const dt_plan_cal_run *b = &c->run, *p = &c->probe;
    memset(f, 0, sizeof *f);
    if (!(b->step_s > 0) || !(b->flops > 0)) {
        f->eff = c->achieved_gflops / c->peak_gflops; /* no run to solve with: its achieved rate */
    } else {
        double bw[2], lat[2];
        const char *name;
        for (int lv = 0; lv < 2; lv++) DT_CHECK(dt_plan_cal_link(ctx, c, lv, &bw[lv], &lat[lv], &name));
        /* every run ran on the entry's layout: k ranks a node (nics_per_node = k = devices) */
        const int k = per_node(c), nn = c->nodes > 1 ? c->nodes : 1;
        const dt_plan_net net = {bw[0] * 1e9, lat[0] * 1e-6, bw[1] * 1e9, lat[1] * 1e-6};
        const int zero3 = c->zprobe.step_s > 0 && k * nn > 1;
        /* the optimizer's time per parameter, from the breakdowns (two runs: its fixed part apart) */
        double q = 0;
        if (b->opt_s > 0 && b->params > 0) {
            q = b->opt_s / b->params, f->opt_runs = 1;
            if (p->opt_s > 0 && p->params > 0 && b->params > p->params && b->opt_s > p->opt_s)
                q = (b->opt_s - p->opt_s) / (b->params - p->params), f->opt_runs = 2;
        }
        f->opt_s_param = q, f->opt_bw_gbs = q > 0 ? DT_PLAN_CAL_OPT_BYTES / q / 1e9 : 0;
        double x = b->step_s / b->flops, o = 0, d = 0;
        for (int round = 0; round < (zero3 ? 30 : 1); round++) { /* the DDP runs hold few calls: fast */
            int two = dt_plan_cal_probed(c);
            for (int it = 0; it < 8; it++) { /* c(x) hardly depends on x: a few rounds settle it */
                double yb = b->step_s - run_comm(b, k, nn, &net, x, d) - b->params * q,
                       yt = p->step_s - run_comm(p, k, nn, &net, x, d) - p->params * q;
                if (two) x = (yb - yt) / (b->flops - p->flops), o = yt - p->flops * x;
                if (!two || !(o > 0) || !(x > 0)) /* one equation, or the runs show no fixed cost: none */
                    two = 0, x = yb / b->flops, o = 0;
            }
            if (zero3) { /* the ZeRO-3 probe's step beyond its plan without call costs, per call */
                DT_CHECK(dt_plan_cal_zero3_probe(ctx, c, 1.0 / (x * c->peak_gflops * 1e9), o * 1e6, 0, f->opt_bw_gbs,
                                                 &f->zplan_s, &f->zcalls));
                double d1 = f->zcalls > 0 ? fmax(0.0, (c->zprobe.step_s - f->zplan_s) / f->zcalls) : 0;
                if (fabs(d1 - d) <= 1e-9 * fmax(d1, 1e-9) && round > 0) break;
                d = d1;
            }
        }
        if (!(x > 0)) { /* the predicted communication alone exceeds the step: nothing to take out */
            f->comm_over_s = run_comm(b, k, nn, &net, b->step_s / b->flops, d);
            x = b->step_s / b->flops, o = 0, d = 0;
        }
        f->eff = 1.0 / (x * c->peak_gflops * 1e9), f->overhead_us = o * 1e6, f->call_us = d * 1e6;
        if (o > 0) f->ct = run_comm(p, k, nn, &net, x, d);
    }
    f->peak_gflops = c->peak_gflops;
    if (!isfinite(f->eff) || !(f->eff > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the runs give no positive time per FLOP (GEMM "
                       "efficiency %g): the calibration's step is all fixed cost or communication", f->eff);
    if (f->eff > 1) { /* the runs beat the benchmark's peak (a low --peak, a busy machine while it was measured):
                         the peak is raised to the rate they reached, so the entry gives their step back */
        f->peak_gflops = c->peak_gflops * f->eff, f->eff = 1, f->peak_raised = 1;
    } else if (f->eff < 0.01) {
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the runs reached %.4g GFLOP/s per rank, under 1%% of the "
                       "peak %.4g GFLOP/s: the peak is wrong (a --peak or logging.peak_gflops too high?)",
                       c->peak_gflops * f->eff, c->peak_gflops);
    }
    return DT_OK;
}

int dt_plan_cal_probed(const dt_plan_cal *c) {
    return c->run.step_s > 0 && c->probe.step_s > 0 && c->probe.flops > 0 && c->run.flops > c->probe.flops;
}

dt_status dt_plan_cal_write(dt_ctx *ctx, const char *path, const dt_plan_cal *c, dt_plan_cal_fit *fit_out) {
    double bw[2], lat[2];
    const char *name[2];
    for (int lv = 0; lv < 2; lv++) DT_CHECK(dt_plan_cal_link(ctx, c, lv, &bw[lv], &lat[lv], &name[lv]));
    if (!(c->peak_gflops > 0) || !(c->achieved_gflops > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the benchmark gave no peak or throughput");
    dt_plan_cal_fit fit;
    DT_CHECK(dt_plan_cal_solve(ctx, c, &fit));
    if (fit_out) *fit_out = fit;
    const double eff = fit.eff, o_us = fit.overhead_us, ct = fit.ct;
    const int multi = c->nodes > 1, k = per_node(c);
    const double mib = (c->link_bytes > 0 ? c->link_bytes : 64.0 * 1048576) / 1048576;
    char over[320], gemm[400], call[320], optim[400] = "";
    if (fit.opt_bw_gbs > 0)
        snprintf(optim, sizeof optim,
                 "    optimizer_bw_gbs: %.6g       # the optimizer step: %g bytes (fp32 AdamW) per parameter in %.4g ns, "
                 "from the calibration's %.6g ms over %.6g parameters%s\n",
                 fit.opt_bw_gbs, DT_PLAN_CAL_OPT_BYTES, fit.opt_s_param * 1e9, c->run.opt_s * 1e3, c->run.params,
                 fit.opt_runs == 2 ? " less the probe's (its fixed part, in step_overhead_us)" : "");
    if (fit.call_us > 0)
        snprintf(call, sizeof call, "fixed cost per collective call: the ZeRO-3 probe's step %.6g ms = its plan %.6g ms "
                 "without it + this x %.4g calls", c->zprobe.step_s * 1e3, fit.zplan_s * 1e3, fit.zcalls);
    else
        snprintf(call, sizeof call, "not measured: %s",
                 !(c->zprobe.step_s > 0) ? "no ZeRO-3 probe (it needs 2+ ranks)"
                                         : "the ZeRO-3 probe was no slower than its plan");
    if (o_us > 0)
        snprintf(over, sizeof over,
                 "fixed cost per micro-batch: the probe's step %.6g ms = %.6g GFLOP / rate + this + comm %.4g ms, "
                 "with the calibration's %.6g ms = %.6g GFLOP / rate + this + comm",
                 c->probe.step_s * 1e3, c->probe.flops / 1e9, ct * 1e3, c->run.step_s * 1e3, c->run.flops / 1e9);
    else
        snprintf(over, sizeof over, "not measured: %s",
                 !(c->probe.step_s > 0)   ? "no probe run"
                 : !dt_plan_cal_probed(c) ? "the calibration's step has no more FLOPs than the probe's"
                                          : "the two runs show no fixed cost");
    if (fit.comm_over_s > 0)
        snprintf(gemm, sizeof gemm, "rate / peak %.6g GFLOP/s per rank, the time per FLOP of the calibration run's "
                 "whole step: its predicted all-reduce and calls, %.4g ms, exceed its step %.4g ms (the links' fit or "
                 "the ZeRO-3 probe over-predicts; a loaded machine?), so nothing is taken out", fit.peak_gflops,
                 fit.comm_over_s * 1e3, c->run.step_s * 1e3);
    else if (c->run.step_s > 0)
        snprintf(gemm, sizeof gemm, "rate / peak %.6g GFLOP/s per rank, the time per FLOP of %s with the predicted "
                 "all-reduce taken out (the calibration's step reached %.6g GFLOP/s)", fit.peak_gflops,
                 o_us > 0 ? "the two runs" : "the calibration run", c->achieved_gflops);
    else
        snprintf(gemm, sizeof gemm, "achieved %.6g / peak %.6g GFLOP/s per rank in dtrain bench", c->achieved_gflops,
                 fit.peak_gflops);
    char peak[320];
    if (fit.peak_raised)
        snprintf(peak, sizeof peak, "raised from dtrain bench's peak_gflops %.6g of one rank to the rate the runs "
                 "reached (the time per FLOP below): a peak is at least what a run reaches", c->peak_gflops);
    else
        snprintf(peak, sizeof peak, "dtrain bench: peak_gflops of one rank (oneDNN sgemm)");
    double tbw = 0, tlat = 0; /* the TP link (decision 71), where a node holds a group */
    const int tp = c->tp_bytes > 0 && (!multi || k > 1);
    if (tp) DT_CHECK(dt_plan_cal_tp_link(ctx, c, &tbw, &tlat));
    char tpl[800] = "";
    if (tp)
        snprintf(tpl, sizeof tpl, "    tp_link: tp-fit             # tensor parallelism's all-reduces of activations "
                 "(%g KiB) inside a node\n", c->tp_bytes / 1024);
    double pbw = 0, plat = 0; /* the PP link (decision 77), where the fit has the ping-pong */
    dt_ctx pctx; /* none to read (e.g. a fit made before the ping-pong): none written, the planner uses intra */
    dt_ctx_init(&pctx);
    const int pp = dt_plan_cal_pp_link(&pctx, c, &pbw, &plat) == DT_OK;
    if (pp)
        snprintf(tpl + strlen(tpl), sizeof tpl - strlen(tpl), "    pp_link: pp-fit             # pipeline stages' "
                 "sends of activations (%g KiB) and context parallelism's ring inside a node\n", c->tp_bytes / 1024);
    double ebw = 0, elat = 0; /* the EP link (decision 92), where the fit has the all-to-all */
    const int ep = dt_plan_cal_ep_link(&pctx, c, &ebw, &elat) == DT_OK;
    if (ep)
        snprintf(tpl + strlen(tpl), sizeof tpl - strlen(tpl), "    ep_link: ep-fit             # expert parallelism's "
                 "all-to-alls of token rows (%g KiB a rank) inside a node\n", c->tp_bytes / 1024);
    double pibw = 0, pilat = 0, eibw = 0, eilat = 0; /* the same across nodes (decision 92) */
    const int ppi = dt_plan_cal_pp_inter_link(&pctx, c, &pibw, &pilat) == DT_OK;
    const int epi = dt_plan_cal_ep_inter_link(&pctx, c, &eibw, &eilat) == DT_OK;
    if (ppi)
        snprintf(tpl + strlen(tpl), sizeof tpl - strlen(tpl), "    pp_inter_link: pp-net-fit   # the same sends and ring "
                 "across nodes\n");
    if (epi)
        snprintf(tpl + strlen(tpl), sizeof tpl - strlen(tpl), "    ep_inter_link: ep-net-fit   # the same all-to-alls "
                 "across nodes\n");
    char sliced[400] = ""; /* more ranks x threads than cores: the devices take turns (decision 95) */
    const double busy = (double)c->machine_ranks * (c->threads > 0 ? c->threads : 1);
    if (c->machine_ranks > 0 && c->cores > 0 && busy > c->cores)
        snprintf(sliced, sizeof sliced,
                 "    idle_speedup: %.6g            # time-sliced: %d ranks x %d thread(s) on this machine's %d cores; a "
                 "rank runs up to this x its calibrated rate while the others idle\n"
                 "    machine_ranks: %d             # the ranks sharing those cores (simulated nodes share the machine)\n",
                 busy / c->cores, c->machine_ranks, c->threads > 0 ? c->threads : 1, c->cores, c->machine_ranks);
    FILE *f = fopen(path, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    fprintf(f,
            "# Calibrated by `dtrain plan --calibrate` on this machine (%s), %d rank(s) on %d node(s).\n"
            "# Use: dtrain plan --catalog %s --hardware cpu-calibrated --gpus N%s ...\n"
            "accelerators:\n"
            "  cpu-calibrated:\n"
            "    name: \"this machine, one dtrain rank per device\"\n"
            "    kind: cpu\n"
            "    peak_tflops: {fp32: %.6g}   # %s\n"
            "    memory_gib: %.6g            # the node's memory\n"
            "    devices_per_node: %d        # the ranks of a node\n"
            "    intra_node: %s\n"
            "    inter_node: %s%s\n"
            "%s"
            "    nics_per_node: %d           # %s\n"
            "    step_overhead_us: %.6g       # %s\n"
            "    collective_call_us: %.6g     # %s\n"
            "%s%s"
            "links:\n",
            c->source ? c->source : "dtrain bench, dtrain bench comm --fit", c->ranks, multi ? c->nodes : 1, path,
            multi ? " --nodes M" : "", fit.peak_gflops / 1e3, peak, c->memory_bytes / 1073741824.0, k, name[0], name[1],
            multi ? "" : "         # simulated nodes share the machine: the same link", tpl, k,
            multi ? "net-fit is per rank with every rank of a node sending: a device's share is its bw"
                  : "the ranks of the benchmark",
            o_us, over, fit.call_us, call, optim, sliced);
    if (!multi || k > 1)
        fprintf(f,
                "  shm-fit: {name: \"ordered all-reduce inside a node, fitted\", bw_gbs: %.6g, latency_us: %.6g}   "
                "# dtrain bench comm --fit, %s group of %d ranks: B = 2(n-1)/n / beta at %g MiB, a = alpha / 2(n-1) "
                "at 1 KiB (beta: the line's slope; if not positive, its time per byte there)\n",
                bw[0], lat[0], multi ? "node" : "world", multi ? k : c->comm_ranks ? c->comm_ranks : c->ranks, mib);
    if (tp)
        fprintf(f,
                "  tp-fit: {name: \"ordered all-reduce of activations inside a node (a TP group), fitted\", bw_gbs: %.6g, "
                "latency_us: %.6g}   # dtrain bench comm --fit, %s group of %d ranks: B = 2(n-1)/n / beta at %g KiB "
                "(micro-batch x seq x d_model x 4 bytes of the calibration's job), a = alpha / 2(n-1) at 1 KiB\n",
                tbw, tlat, multi ? "node" : "world", multi ? k : c->comm_ranks ? c->comm_ranks : c->ranks,
                c->tp_bytes / 1024);
    if (pp)
        fprintf(f,
                "  pp-fit: {name: \"point-to-point sends inside a node (pipeline stages), fitted\", bw_gbs: %.6g, "
                "latency_us: %.6g}   # dtrain bench comm --fit, %s group's pingpong (one message, half a round trip "
                "of ranks 0 and 1): B = 1 / beta at %g KiB (micro-batch x seq x d_model x 4 bytes of the calibration's "
                "job), a = alpha at 1 KiB\n",
                pbw, plat, multi ? "node" : "world", c->tp_bytes / 1024);
    if (ep)
        fprintf(f,
                "  ep-fit: {name: \"all-to-all inside a node (expert parallelism), fitted\", bw_gbs: %.6g, "
                "latency_us: %.6g}   # dtrain bench comm --fit, %s group's alltoall of %d ranks (size: a rank's whole send "
                "buffer S): B = (n-1)/n / beta at %g KiB (micro-batch x seq x d_model x 4 bytes of the calibration's "
                "job), a = alpha / (n-1) at 1 KiB\n",
                ebw, elat, multi ? "node" : "world", multi ? k : c->comm_ranks ? c->comm_ranks : c->ranks,
                c->tp_bytes / 1024);
    if (ppi)
        fprintf(f,
                "  pp-net-fit: {name: \"point-to-point sends across nodes (pipeline stages), fitted\", bw_gbs: %.6g, "
                "latency_us: %.6g}   # dtrain bench comm --fit, cross group's pingpong (%d groups at once, per rank as "
                "net-fit): B = 1 / beta at %g KiB, a = alpha at 1 KiB\n",
                pibw, pilat, k, c->tp_bytes / 1024);
    if (epi)
        fprintf(f,
                "  ep-net-fit: {name: \"all-to-all across nodes (expert parallelism), fitted\", bw_gbs: %.6g, "
                "latency_us: %.6g}   # dtrain bench comm --fit, cross group's alltoall of %d ranks (%d groups at once, per "
                "rank as net-fit): B = (n-1)/n / beta at %g KiB, a = alpha / (n-1) at 1 KiB\n",
                eibw, eilat, c->nodes, k, c->tp_bytes / 1024);
    if (multi)
        fprintf(f,
                "  net-fit: {name: \"ordered all-reduce across nodes, fitted\", bw_gbs: %.6g, latency_us: %.6g}   "
                "# dtrain bench comm --fit on %d ranks of %d nodes, cross group (one rank per node, %d groups at "
                "once) of %d ranks: B = 2(n-1)/n / beta at %g MiB, a = alpha / 2(n-1) at 1 KiB (beta: the line's "
                "slope; if not positive, its time per byte there)\n",
                bw[1], lat[1], c->ranks, c->nodes, k, c->nodes, mib);
    fprintf(f,
            "efficiency:\n"
            "  gemm: {cpu-calibrated: %.6g}   # %s\n"
            "  link: {%s: 1.0%s%s%s%s%s%s}           # the fits are measured: nothing to discount\n",
            eff, gemm, !multi || k > 1 ? "shm-fit" : "net-fit",
            multi && k > 1 ? ", net-fit: 1.0" : "", tp ? ", tp-fit: 1.0" : "", pp ? ", pp-fit: 1.0" : "",
            ep ? ", ep-fit: 1.0" : "", ppi ? ", pp-net-fit: 1.0" : "", epi ? ", ep-net-fit: 1.0" : "");
    if (fclose(f) != 0) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    return DT_OK;
}
