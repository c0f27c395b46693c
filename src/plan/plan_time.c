/* The planner's time model (plan.h): collectives (alpha-beta, ring, per link level), compute
 * at an efficiency of peak, the 1F1B bubble, recomputation, the optimizer step at its
 * calibrated bandwidth, calibrated fixed costs per micro-batch and per collective call, then
 * rates and cost. Formulas: docs/planner.md, "Time". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pp_schedule.h"

#include "plan/plan.h"
#include "plan/plan_impl.h"

void dt_plan_group_span(int n, int stride, int d, int *k, int *nn) {
    /* consecutive members are `stride` ranks apart; a node holds d consecutive ranks */
    int per = stride >= d ? 1 : d / stride;
    *k = per < n ? per : n;
    *nn = (n + *k - 1) / *k;
}

double dt_plan_coll_time(dt_plan_coll op, double bytes, int k, int nn, const dt_plan_net *net, double *t_intra,
                         double *t_inter) {
    double ti = 0, te = 0, n = (double)k * nn;
    switch (op) {
    case DT_COLL_ALLREDUCE: /* reduce-scatter + all-gather inside the node, all-reduce of 1/k across */
        if (k > 1) ti = 2.0 * (k - 1) / k * bytes / net->bw_intra + 2.0 * (k - 1) * net->a_intra;
        if (nn > 1) te = 2.0 * (nn - 1) / nn * (bytes / k) / net->bw_inter + 2.0 * (nn - 1) * net->a_inter;
        break;
    case DT_COLL_REDUCE_SCATTER:
    case DT_COLL_ALLGATHER:
        if (k > 1) ti = (double)(k - 1) / k * bytes / net->bw_intra + (k - 1) * net->a_intra;
        if (nn > 1) te = (double)(nn - 1) / nn * (bytes / k) / net->bw_inter + (nn - 1) * net->a_inter;
        break;
    case DT_COLL_ALLTOALL: /* each rank keeps 1/n, sends (k-1)/n inside and (n-k)/n outside its node */
        if (k > 1) ti = (k - 1) / n * bytes / net->bw_intra + (k - 1) * net->a_intra;
        if (nn > 1) te = (n - k) / n * bytes / net->bw_inter + (nn - 1) * net->a_inter;
        break;
    case DT_COLL_P2P:
        if (nn > 1) te = bytes / net->bw_inter + net->a_inter;
        else ti = bytes / net->bw_intra + net->a_intra;
        break;
    }
    if (t_intra) *t_intra = ti;
    if (t_inter) *t_inter = te;
    return ti + te;
}

double dt_plan_opt_bytes(const dt_train_cfg *tc) {
    /* AdamW reads the fp32 weight (the master copy under 16-bit compute), the gradient, m and v,
     * and writes the weight, m and v back, and under 16-bit compute the weight's 16-bit copy */
    dt_dtype cd = tc->model_opts.compute;
    double g = tc->parallel.grad_dtype == DT_BF16 ? 2 : 4, lowp = (cd == DT_BF16 || cd == DT_F16) ? 2 : 0;
    return 12 + g + 12 + lowp;
}

double dt_plan_bubble_fraction(int p, int m) { return p <= 1 ? 0.0 : (double)(p - 1) / (m + p - 1); }

double dt_plan_recompute_flops(const dt_plan_model *m, dt_recompute r, int T) {
    double attn_fwd = dt_plan_attn_flops(m, T) / 3; /* QK^T and PV of every layer */
    if (r == DT_RECOMPUTE_SELECTIVE) return attn_fwd;
    if (r == DT_RECOMPUTE_FULL) /* the layers' forward: 2 x their matmul parameters + attention */
        return 2.0 * (dt_plan_active_params(m) - (double)m->vocab * m->d_model) + attn_fwd;
    return 0.0;
}

static void term(dt_plan_result *r, const char *what, double bytes, double count, double ti, double te, double exposed) {
    if (r->n_comm == DT_PLAN_MAX_COMM) return;
    dt_plan_comm_term *c = &r->comm[r->n_comm++];
    snprintf(c->what, sizeof c->what, "%s", what);
    c->bytes = bytes, c->count = count, c->t_intra = ti * count, c->t_inter = te * count, c->exposed = exposed;
    r->comm_s += exposed;
}

/* A collective cut into `pieces` (buckets, units, layers) of `bytes` each, issued in `rounds`
 * per step (micro-steps). In a round the pieces can hide behind `window` seconds of compute,
 * except the last piece, which is always waited for: exposed = max(t, pieces t - window) per
 * round; window < 0: not overlapped (everything exposed). */
static void coll(dt_plan_result *r, const char *what, dt_plan_coll op, double bytes, int n, int stride, int d,
                 const dt_plan_net *net, double pieces, double rounds, double window) {
    int k, nn;
    dt_plan_group_span(n, stride, d, &k, &nn);
    double ti, te, t = dt_plan_coll_time(op, bytes, k, nn, net, &ti, &te);
    double ex = window < 0 ? pieces * t : fmax(t, pieces * t - window);
    term(r, what, bytes, pieces * rounds, ti, te, rounds * ex);
}

/* The share of stage st's compute whose backward runs in the backward pass: 1, but on dtrain's
 * models (whose fused loss computes the head's gradients within the forward: decision 97) the
 * stage's layers' share of its cost. */
static double layer_share(const dt_plan_job *job, const dt_pp_costs *k, const dt_plan_stages *sts, int st) {
    if (!job->model.is_dtrain) return 1.0;
    double c = dt_pp_costs_stage(k, sts->pp, sts->first, st);
    return c > 0 ? dt_plan_stage_n(sts, st) * k->layer / c : 1.0;
}

/* The pipeline's idle time (decision 95): the step's schedule replayed with each stage's passes
 * (its share of the heaviest stage's compute by the stage costs; a forward a third of its
 * compute, the backward two thirds - on dtrain's models of its layers' share, the head's in the
 * forward (decision 97) - split in half under zb-h1, recomputation in the backward;
 * chunks of 1/v under the interleaved schedule): bubble = the dedicated makespan - the heaviest
 * stage's busy time, which is (pp - 1) t_micro for equal stages under 1F1B. Devices that share
 * cores (the catalog's idle_speedup > 1: more ranks than cores on a machine) replay again with
 * the stages of a machine sharing its cores; sliced = that makespan - the dedicated one (<= 0).
 * A schedule dtrain's check refuses for this pp, v, m is priced as 1F1B. */
static void pipeline(const dt_plan_job *job, const dt_plan_layout *l, const dt_pp_costs *k, const dt_plan_stages *sts,
                     int m, double rho, dt_plan_result *r) {
    r->bubble_s = r->sliced_s = 0;
    const int pp = l->pp;
    if (pp <= 1 || m < 1) return;
    int v;
    const int kind = dt_plan_pp_kind(job, pp, m, &v);
    const double c_h = dt_pp_costs_stage(k, sts->pp, sts->first, sts->heavy);
    const int n_h = dt_plan_stage_n(sts, sts->heavy);
    double *f = malloc(3 * (size_t)pp * sizeof *f), *b = f ? f + pp : NULL, *w = f ? f + 2 * pp : NULL;
    /* durations in units of the heaviest stage's micro-batch compute (compute_s / m): they do not
       depend on the GEMM rate, so the replay's memo serves every efficiency (rho = recompute / compute) */
    const double unit = r->compute_s / m, heavy = r->compute_s + r->recompute_s;
    double dedicated = 0, sliced = 0;
    if (f && sts->pp == pp && c_h > 0 && n_h > 0 && unit > 0) {
        for (int s = 0; s < pp; s++) {
            double c = dt_pp_costs_stage(k, pp, sts->first, s) / c_h, ls = layer_share(job, k, sts, s);
            double rc = rho * dt_plan_stage_n(sts, s) / n_h;
            f[s] = c * (1 - 2 * ls / 3) / v;
            b[s] = (kind == DT_PP_ZBH1 ? c * ls / 3 : 2 * c * ls / 3) / v + rc / v;
            w[s] = kind == DT_PP_ZBH1 ? c * ls / 3 / v : 0;
        }
        const double sp = job->hw->idle_speedup;
        int machine = job->hw->machine_ranks > 0 ? job->hw->machine_ranks : job->dpn;
        int group = machine >= job->gpus ? pp : (int)((double)pp * machine / job->gpus);
        if (dt_plan_pp_makespan(kind, pp, v, m, f, b, w, 1.0, pp, &dedicated) == 0) {
            r->bubble_s = fmax(0.0, dedicated * unit - heavy);
            if (sp > 1 && group > 1 && dt_plan_pp_makespan(kind, pp, v, m, f, b, w, sp, group, &sliced) == 0)
                r->sliced_s = fmin(0.0, (sliced - dedicated) * unit);
            free(f);
            return;
        }
    }
    free(f);
    r->bubble_s = (pp - 1) * heavy / m; /* equal stages, 1F1B */
}

/* ZeRO-3 (decision 97): each of the `units` pieces reduce-scattered (rs bytes over n_rs ranks)
 * as its backward ends and gathered (ag bytes over n_ag ranks, the compute dtype) for the
 * forward and again for the backward, every micro-step, prefetched. Overlapped per phase: the
 * forward's gathers behind the forward (fwd), the backward's gathers and reduce-scatters,
 * sharing the links, behind the backward (bwd), the last piece of each waited for; the
 * backward's exposure split between the two terms by their times. fwd < 0: not overlapped. */
static void zero3(dt_plan_result *r, double rs, double ag, int n_rs, int n_ag, int stride, int d, const dt_plan_net *net,
                  double units, double mstep, double fwd, double bwd) {
    int k, nn;
    double rti, rte, gti, gte;
    dt_plan_group_span(n_rs, stride, d, &k, &nn);
    const double s1 = dt_plan_coll_time(DT_COLL_REDUCE_SCATTER, rs, k, nn, net, &rti, &rte);
    dt_plan_group_span(n_ag, stride, d, &k, &nn);
    const double g1 = dt_plan_coll_time(DT_COLL_ALLGATHER, ag, k, nn, net, &gti, &gte);
    double ex_rs = units * s1, ex_ag = 2 * units * g1; /* per micro-step */
    if (fwd >= 0 && g1 + s1 > 0) {
        double ef = fmax(g1, units * g1 - fwd), eb = fmax(s1, units * (g1 + s1) - bwd);
        ex_ag = ef + eb * g1 / (g1 + s1), ex_rs = eb * s1 / (g1 + s1);
    }
    term(r, "dp reduce-scatter grads", rs, units * mstep, rti, rte, mstep * ex_rs);
    term(r, "dp all-gather params x2", ag, 2 * units * mstep, gti, gte, mstep * ex_ag);
}

/* Units per layer: dtrain's layers are several (params.h), other frameworks' one. */
static double layer_units(const dt_plan_model *m, int dtrain_algo) {
    if (!dtrain_algo) return 1;
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    return dt_params_table_layer_units(t, dt_model_tensors(&m->mc, t));
}

void dt_plan_time(const dt_plan_job *job, const dt_plan_layout *l, dt_plan_result *r) {
    const dt_plan_model *m = &job->model;
    const dt_train_cfg *tc = &job->train;
    dt_dtype cd = tc->model_opts.compute;
    int e = (cd == DT_BF16 || cd == DT_F16) ? 2 : 4, T = tc->seq_len, d = job->dpn;
    double b = tc->micro_batch, mstep = r->micro_steps;
    double peak = dt_hw_peak(job->hw, cd) * 1e12, rate = peak * job->gemm_eff;
    double tokens = (double)job->global_batch * T;
    r->flops_token = m->is_dtrain ? dt_model_flops_per_token(&m->mc, T) : dt_plan_flops_per_token(m, T);
    r->flops_step = r->flops_token * tokens;
    /* the pipeline's stages by the trainer's rule (parallel/pp_split.h): the most expensive one
     * (its layers, plus the embedding on the first and the head and loss on the last) sets the
     * pace, u = pp x its cost / all stages' cost; recomputation is the layers' alone, paced by
     * that stage's layers */
    dt_plan_stages sts;
    dt_plan_stages_of(m, T, l->pp, &sts);
    const int heavy_layers = dt_plan_stage_n(&sts, sts.heavy);
    double uneven = sts.u, uneven_rc = l->pp == 1 ? 1.0 : (double)heavy_layers * l->pp / m->n_layer;
    /* a run whose attention core (QK^T and PV: 12 L T d FLOPs a token, 4 L T d of them in a
       recomputed forward) runs at another peak than its linear layers (fp8 runs: decision 99)
       spends 1 / attn_peak - 1 more time on that share */
    const double slow = job->attn_peak > 0 ? 1.0 / job->attn_peak - 1.0 : 0.0;
    const double attn_tok = dt_plan_attn_flops(m, T);
    r->compute_s = r->flops_step / job->gpus / rate * uneven;
    if (r->flops_token > 0) r->compute_s *= 1.0 + slow * attn_tok / r->flops_token;
    const double rc_flops = dt_plan_recompute_flops(m, tc->model_opts.recompute, T) * tokens;
    r->recompute_s = rc_flops / job->gpus / rate * uneven_rc;
    if (rc_flops > 0) r->recompute_s *= 1.0 + slow * (attn_tok / 3) * tokens / rc_flops;
    double t_micro = (r->compute_s + r->recompute_s) / mstep; /* one micro-batch on one stage */
    /* the backward that follows the forward: two thirds of the compute and the recompute; dtrain's
       fused loss computes the head's gradients inside the forward, so on its models only the
       layers' share of the stage follows (decision 97) - the window the gradient reductions hide in */
    dt_pp_costs costs;
    dt_plan_pp_costs(m, T, &costs);
    const double lshare = layer_share(job, &costs, &sts, sts.heavy);
    double fwd_micro = r->compute_s / mstep * (1.0 - 2.0 / 3.0 * lshare);
    double bwd_micro = r->compute_s / mstep * 2.0 / 3.0 * lshare + r->recompute_s / mstep;
    pipeline(job, l, &costs, &sts, (int)mstep, r->compute_s > 0 ? r->recompute_s / r->compute_s : 0, r);

    dt_plan_net net = {job->intra->bw_gbs * 1e9 * job->intra_eff, job->intra->latency_us * 1e-6,
                       job->inter->bw_gbs * 1e9 * job->hw->nics_per_node / d * job->inter_eff,
                       job->inter->latency_us * 1e-6};
    /* the point-to-point and all-to-all links across nodes (the catalog's pp_inter_link and
       ep_inter_link, calibrated from the cross group's ping-pong and all-to-all: decision 92),
       per device as the inter-node link's share; else that link */
    dt_plan_net pnet = net, enet = net;
    if (job->pp_inter)
        pnet.bw_inter = job->pp_inter->bw_gbs * 1e9 * job->hw->nics_per_node / d * job->pp_inter_eff,
        pnet.a_inter = job->pp_inter->latency_us * 1e-6;
    if (job->ep_inter)
        enet.bw_inter = job->ep_inter->bw_gbs * 1e9 * job->hw->nics_per_node / d * job->ep_inter_eff,
        enet.a_inter = job->ep_inter->latency_us * 1e-6;
    if (job->pp) pnet.bw_intra = job->pp->bw_gbs * 1e9 * job->pp_eff, pnet.a_intra = job->pp->latency_us * 1e-6;
    if (job->ep) enet.bw_intra = job->ep->bw_gbs * 1e9 * job->ep_eff, enet.a_intra = job->ep->latency_us * 1e-6;
    r->n_comm = 0, r->comm_s = 0;
    double P = 0; /* the fullest stage's parameters */
    for (int st = 0; st < l->pp; st++) P = fmax(P, dt_plan_stages_params(m, l, &sts, st));
    double layers = heavy_layers, gb = tc->parallel.grad_dtype == DT_BF16 ? 2 : 4;
    /* the gradients are summed, and ZeRO shards, over the data- and context-parallel ranks (the
       trainer's dp x cp group, Megatron's data-parallel group with context parallelism: decision 94),
       cp consecutive groups of tp ranks per data-parallel index */
    int dp_stride = l->tp * l->cp, gdp = l->dp * l->cp, shard = dt_plan_shard_ranks(job, l);
    double buckets = ceil(P * gb / fmax((double)tc->parallel.bucket_bytes, 1.0));
    double win = tc->parallel.overlap ? bwd_micro : -1;
    /* dtrain's own layouts communicate as dtrain does (ZeRO-1: DDP's all-reduce, then an fp32
     * gather); other layouts as ZeRO's paper, DeepSpeed and Megatron's distributed optimizer
     * (ZeRO-1/2: reduce-scatter the gradients, gather the weights in the compute dtype) */
    int dtrain_algo = m->is_dtrain && l->tp == 1 && l->pp == 1 && l->cp == 1 && l->ep == 1;
    const double units = layers * layer_units(m, dtrain_algo); /* ZeRO's pieces */
    if (gdp > 1) {
        if (l->zero == DT_STRAT_DDP || (l->zero == DT_STRAT_ZERO1 && dtrain_algo))
            /* buckets all-reduced during the last micro-step's backward */
            coll(r, "dp all-reduce grads", DT_COLL_ALLREDUCE, P * gb / buckets, gdp, l->tp, d, &net, buckets, 1, win);
        else if (l->zero == DT_STRAT_ZERO1) /* buckets reduce-scattered during the last backward */
            coll(r, "dp reduce-scatter grads", DT_COLL_REDUCE_SCATTER, P * gb / buckets, gdp, l->tp, d, &net,
                 buckets, 1, win);
        else if (l->zero == DT_STRAT_ZERO2) /* each unit reduce-scattered as its backward ends, every micro-step */
            coll(r, "dp reduce-scatter grads", DT_COLL_REDUCE_SCATTER, P * gb / units, gdp, l->tp, d, &net, units,
                 mstep, win);
        if (l->zero == DT_STRAT_ZERO1 || l->zero == DT_STRAT_ZERO2) /* after the optimizer step */
            coll(r, "dp all-gather params", DT_COLL_ALLGATHER, P * (dtrain_algo ? 4 : e) / units, shard, l->tp, d,
                 &net, units, 1, -1);
        if (l->zero == DT_STRAT_ZERO3)
            zero3(r, P * gb / units, P * e / units, gdp, shard, l->tp, d, &net, units, mstep,
                  tc->parallel.overlap ? fwd_micro : -1, bwd_micro);
    }
    double act = e * b * ((double)T / l->cp) * m->d_model; /* one layer's input (full sequence shard) */
    if (l->tp > 1) { /* Megatron + sequence parallel: 2 all-gather/reduce-scatter pairs per layer each way;
                        exposed unless overlapped with the GEMMs (a fraction tp_overlap of it). Inside a
                        node on the TP link (the catalog's tp_link, e.g. calibrated at the activation's
                        size: decision 71), else the intra-node one */
        dt_plan_net tnet = net;
        if (job->tp) tnet.bw_intra = job->tp->bw_gbs * 1e9 * job->tp_eff, tnet.a_intra = job->tp->latency_us * 1e-6;
        double pieces = layers * (tc->model_opts.recompute == DT_RECOMPUTE_FULL ? 6 : 4);
        coll(r, "tp all-reduce acts", DT_COLL_ALLREDUCE, act, l->tp, 1, d, &tnet, pieces, mstep, -1);
        dt_plan_comm_term *c = &r->comm[r->n_comm - 1];
        double all = c->exposed, t1 = all / (pieces * mstep);
        double hidden = mstep * fmax(t1, pieces * t1 - t_micro);
        c->exposed = (1 - job->tp_overlap) * all + job->tp_overlap * hidden;
        r->comm_s += c->exposed - all;
    }
    if (l->cp > 1) { /* ring attention: K and V gathered (forward, backward), dK dV reduce-scattered,
                        each behind its layer's attention; the ring's cp - 1 point-to-point steps move
                        an all-gather's bytes, so inside a node on the point-to-point link (the
                        catalog's pp_link, calibrated by plan --calibrate's ping-pong: decision 83),
                        else the intra-node one; across nodes on pp_inter_link (decision 92) */
        double kv = 2.0 * e * b * T * m->n_kv_head * (double)(m->d_model / m->n_head) / l->tp;
        double attn = 12.0 * (double)T * m->d_model * b * T / (l->tp * l->cp) / rate; /* one layer, one micro-batch */
        coll(r, "cp all-gather kv", DT_COLL_ALLGATHER, kv, l->cp, l->tp, d, &pnet, 3, layers * mstep, attn);
    }
    if (l->ep > 1 && m->experts > 0) { /* dispatch and combine, forward and backward; inside a node on the
                                          all-to-all link (the catalog's ep_link, calibrated by plan
                                          --calibrate's all-to-all fit: decision 92), else the intra-node one;
                                          across nodes on ep_inter_link, else the inter-node one */
        coll(r, "ep all-to-all tokens", DT_COLL_ALLTOALL, act * m->topk / l->tp, l->ep, dp_stride, d, &enet,
             4 * layers, mstep, -1);
    }
    if (l->pp > 1) { /* activations to the next stage; only the fill and drain are on the critical path */
        int k, nn;
        dt_plan_group_span(l->pp, dp_stride * l->dp, d, &k, &nn);
        /* inside a node on the pipeline link (the catalog's pp_link, e.g. the calibrated ping-pong
           at the activation's size: decision 77), else the intra-node one; across nodes on
           pp_inter_link (the cross group's ping-pong: decision 92), else the inter-node one */
        double ti, te, t = dt_plan_coll_time(DT_COLL_P2P, act / l->tp, k, nn, &pnet, &ti, &te);
        term(r, "pp send/recv acts", act / l->tp, 2 * mstep, ti, te, 2.0 * (l->pp - 1) * t);
    }
    /* the fixed costs no FLOP or byte term carries, of each micro-batch and of each collective
       call (calibrated, decision 55) */
    r->calls = 0;
    for (int i = 0; i < r->n_comm; i++) r->calls += r->comm[i].count;
    r->overhead_s = (job->hw->step_overhead_us * mstep + job->hw->collective_call_us * r->calls) * 1e-6;
    /* the optimizer step (decision 56): once a step, over the parameters this device updates (ZeRO
       shards them), streaming their state; 0 where the catalog gives no optimizer bandwidth */
    r->opt_params = l->zero >= DT_STRAT_ZERO1 && gdp > 1 ? P / shard : P;
    r->opt_bytes = dt_plan_opt_bytes(tc);
    double obw = job->hw->optimizer_bw_gbs;
    r->optimizer_s = obw > 0 ? r->opt_params * r->opt_bytes / (obw * 1e9) : 0;
    r->step_s = r->compute_s + r->recompute_s + r->bubble_s + r->sliced_s + r->comm_s + r->overhead_s + r->optimizer_s;
    r->samples_s = job->global_batch / r->step_s;
    r->tokens_s = tokens / r->step_s;
    r->tflops_gpu = r->flops_step / job->gpus / r->step_s / 1e12;
    r->mfu = r->tflops_gpu * 1e12 / peak;
    int nodes = (job->gpus + d - 1) / d;
    double usd_s = job->price_hour >= 0 ? job->price_hour * nodes / 3600 : NAN;
    double spot_s = job->spot_hour >= 0 ? job->spot_hour * nodes / 3600 : NAN;
    r->usd_1k_samples = usd_s * 1000 / r->samples_s;
    r->usd_1b_tokens = usd_s * 1e9 / r->tokens_s;
    r->run_hours = job->train_tokens > 0 ? job->train_tokens / r->tokens_s / 3600 : NAN;
    r->usd_run = r->run_hours * 3600 * usd_s;
    r->spot_usd_run = r->run_hours * 3600 * spot_s;
}

dt_status dt_plan_check_layout(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *l) {
    const dt_plan_model *m = &job->model;
    int mp = l->tp * l->pp * l->cp;
    if (l->tp < 1 || l->pp < 1 || l->cp < 1 || l->ep < 1 || l->dp < 1 || (long)l->dp * mp != job->gpus)
        return dt_fail(ctx, DT_ERR_CONFIG, "--tp %d --pp %d --cp %d --dp %d: tp x pp x cp x dp = %ld != --gpus %d", l->tp,
                       l->pp, l->cp, l->dp, (long)l->dp * mp, job->gpus);
    if (m->n_head % l->tp || m->n_kv_head % l->tp)
        return dt_fail(ctx, DT_ERR_CONFIG, "--tp %d must divide the attention heads (n_head %d, n_kv_head %d)", l->tp,
                       m->n_head, m->n_kv_head);
    if (l->pp > m->n_layer)
        return dt_fail(ctx, DT_ERR_CONFIG, "--pp %d: more stages than layers (n_layer %d)", l->pp, m->n_layer);
    if (l->pp > DT_PP_RULE_MAX)
        return dt_fail(ctx, DT_ERR_CONFIG, "--pp %d: at most %d pipeline stages", l->pp, DT_PP_RULE_MAX);
    if (job->train.seq_len % l->cp)
        return dt_fail(ctx, DT_ERR_CONFIG, "--cp %d must divide the sequence length %d", l->cp, job->train.seq_len);
    if (l->ep > 1 && (!m->experts || m->experts % l->ep || l->dp % l->ep))
        return dt_fail(ctx, DT_ERR_CONFIG, "--ep %d must divide the experts (%d%s) and dp (%d)", l->ep, m->experts,
                       m->experts ? "" : ": a dense model", l->dp);
    long per = (long)job->train.micro_batch * l->dp;
    if (job->global_batch % per)
        return dt_fail(ctx, DT_ERR_CONFIG, "--global-batch %ld must be a multiple of micro-batch x dp = %d x %d",
                       job->global_batch, job->train.micro_batch, l->dp);
    if (l->hybrid && l->zero == DT_STRAT_DDP)
        return dt_fail(ctx, DT_ERR_CONFIG, "--strategy hybrid needs ZeRO sharding (it shards inside a node)");
    return DT_OK;
}

dt_status dt_plan_predict(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *l, dt_plan_result *r) {
    memset(r, 0, sizeof *r);
    DT_CHECK(dt_plan_check_layout(ctx, job, l));
    r->lay = *l;
    r->micro_steps = (int)(job->global_batch / ((long)job->train.micro_batch * l->dp));
    DT_CHECK(dt_plan_memory(ctx, job, l, r));
    dt_plan_time(job, l, r);
    /* weak scaling vs one node: the same layout with dp / nodes, the same per-GPU batch */
    int nodes = (job->gpus + job->dpn - 1) / job->dpn;
    r->scaling_eff = NAN;
    if (nodes <= 1) r->scaling_eff = 1.0;
    else if (l->dp % nodes == 0 && (l->hybrid ? l->dp / nodes >= 1 : 1)) {
        dt_plan_job one = *job;
        dt_plan_layout l1 = *l;
        one.gpus = job->gpus / nodes, l1.dp = l->dp / nodes, one.global_batch = job->global_batch / nodes;
        dt_plan_result r1 = {0};
        r1.lay = l1, r1.micro_steps = r->micro_steps;
        dt_plan_time(&one, &l1, &r1);
        r->scaling_eff = (r->tokens_s / job->gpus) / (r1.tokens_s / one.gpus);
    }
    return DT_OK;
}
