/* The planner's output: fixed-width tables (header lines start with '#') and JSON (plan.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "plan/plan.h"

#define GIB 1073741824.0

static const char *prec_name(dt_dtype d) { return d == DT_BF16 ? "bf16" : d == DT_F16 ? "fp16" : "fp32"; }

void dt_plan_print_header(FILE *f, const dt_plan_job *job) {
    const dt_plan_model *m = &job->model;
    const dt_train_cfg *t = &job->train;
    fprintf(f, "# model %s: %d layers, d_model %d, %d heads (%d kv), d_ff %d (%s), vocab %d%s; %.4g B parameters\n",
            m->name, m->n_layer, m->d_model, m->n_head, m->n_kv_head, m->d_ff, m->swiglu ? "swiglu" : "gelu", m->vocab,
            m->tied ? ", tied head" : "", dt_plan_params(m) / 1e9);
    if (m->experts) fprintf(f, "# experts %d, top-%d per token\n", m->experts, m->topk);
    fprintf(f, "# batch: micro %d x seq %d, global %ld sequences (%.4g tokens/step); precision %s; checkpointing %s\n",
            t->micro_batch, t->seq_len, job->global_batch, (double)job->global_batch * t->seq_len,
            prec_name(t->model_opts.compute), dt_recompute_name(t->model_opts.recompute));
    fprintf(f, "# hardware %s (%s): %d devices, %d per node, %.4g GiB each, peak %.4g TFLOP/s %s\n", job->hw->key,
            job->hw->name, job->gpus, job->dpn, job->hw->memory_bytes / GIB, dt_hw_peak(job->hw, t->model_opts.compute),
            prec_name(t->model_opts.compute));
    fprintf(f, "# links: intra-node %s %.4g GB/s %.3g us, inter-node %s %.4g GB/s x %d NICs %.3g us\n", job->intra->key,
            job->intra->bw_gbs, job->intra->latency_us, job->inter->key, job->inter->bw_gbs, job->hw->nics_per_node,
            job->inter->latency_us);
    if (job->tp && job->tp != job->intra) /* the catalog's tp_link (a calibrated entry: decision 71) */
        fprintf(f, "# tensor-parallel link (the TP group's collectives inside a node): %s %.4g GB/s %.3g us, "
                   "efficiency %.3g\n", job->tp->key, job->tp->bw_gbs, job->tp->latency_us, job->tp_eff);
    if (job->pp && job->pp != job->intra) /* the catalog's pp_link (a calibrated entry: decision 77) */
        fprintf(f, "# pipeline link (the stages' sends inside a node): %s %.4g GB/s %.3g us, efficiency %.3g\n",
                job->pp->key, job->pp->bw_gbs, job->pp->latency_us, job->pp_eff);
    if (job->ep && job->ep != job->intra) /* the catalog's ep_link (a calibrated entry: decision 92) */
        fprintf(f, "# expert-parallel link (the EP group's all-to-alls inside a node): %s %.4g GB/s %.3g us, "
                   "efficiency %.3g\n", job->ep->key, job->ep->bw_gbs, job->ep->latency_us, job->ep_eff);
    if (job->pp_inter && job->pp_inter != job->inter) /* the catalog's pp_inter_link, ep_inter_link (decision 92) */
        fprintf(f, "# pipeline link across nodes (the stages' sends, context parallelism's ring): %s %.4g GB/s %.3g us, "
                   "efficiency %.3g\n", job->pp_inter->key, job->pp_inter->bw_gbs, job->pp_inter->latency_us,
                job->pp_inter_eff);
    if (job->ep_inter && job->ep_inter != job->inter)
        fprintf(f, "# expert-parallel link across nodes (the EP group's all-to-alls): %s %.4g GB/s %.3g us, "
                   "efficiency %.3g\n", job->ep_inter->key, job->ep_inter->bw_gbs, job->ep_inter->latency_us,
                job->ep_inter_eff);
    fprintf(f, "# efficiency factors: gemm %.3g of peak, intra-node link %.3g, inter-node link %.3g; tp overlap %.3g; "
               "fixed costs %.4g us per micro-batch, %.4g us per collective call; optimizer %.4g GB/s%s\n",
            job->gemm_eff, job->intra_eff, job->inter_eff, job->tp_overlap, job->hw->step_overhead_us,
            job->hw->collective_call_us, job->hw->optimizer_bw_gbs,
            job->hw->optimizer_bw_gbs > 0 ? "" : " (not given: in the GEMM efficiency)");
    fprintf(f, "# model FLOPs/token = 6 N_active + 12 L T d = %.4g (docs/planner.md)\n",
            m->is_dtrain ? dt_model_flops_per_token(&m->mc, t->seq_len) : dt_plan_flops_per_token(m, t->seq_len));
}

static void cost_cell(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, " %10.4g", v);
    else fprintf(f, " %10s", "-");
}

void dt_plan_print_table(FILE *f, const dt_plan_job *job, const dt_plan_result *r, int n, int limit) {
    fprintf(f, "# %-34s %7s %7s %7s %7s %6s %8s %4s %9s %8s %8s %8s %8s %10s %8s %5s %6s %10s\n", "layout", "params",
            "grads", "optim", "acts", "comm", "total", "fit", "step_s", "compute", "recomp", "bubble", "comm_s",
            "tokens/s", "TFLOP/s", "MFU", "eff1n", "$/1Btok");
    fprintf(f, "# %-34s %7s %7s %7s %7s %6s %8s %4s %9s %8s %8s %8s %8s %10s %8s %5s %6s %10s\n", "", "GiB", "GiB",
            "GiB", "GiB", "GiB", "GiB/dev", "", "s", "s", "s", "s", "exposed", "", "/GPU", "", "", "");
    for (int i = 0; i < n && (limit <= 0 || i < limit); i++) {
        const dt_plan_result *x = &r[i];
        char name[72];
        dt_plan_layout_name(&x->lay, name, sizeof name);
        if (!dt_plan_dtrain_runs(job, &x->lay)) strcat(name, " *"); /* dtrain cannot run it yet */
        fprintf(f, "  %-34s %7.2f %7.2f %7.2f %7.2f %6.2f %8.2f %4s %9.4g %8.4g %8.4g %8.4g %8.4g %10.4g %8.4g %5.3f",
                name, x->mem[DT_MEM_PARAMS] / GIB, x->mem[DT_MEM_GRADS] / GIB, x->mem[DT_MEM_OPTIM] / GIB,
                x->mem[DT_MEM_ACTS] / GIB, x->mem[DT_MEM_COMM] / GIB, x->mem_total / GIB, x->fits ? "yes" : "NO",
                x->step_s, x->compute_s, x->recompute_s, x->bubble_s, x->comm_s, x->tokens_s, x->tflops_gpu, x->mfu);
        if (isfinite(x->scaling_eff)) fprintf(f, " %6.3f", x->scaling_eff);
        else fprintf(f, " %6s", "-");
        cost_cell(f, x->usd_1b_tokens);
        fputc('\n', f);
    }
    if (limit > 0 && n > limit) fprintf(f, "# ... %d more layouts (--all prints every one)\n", n - limit);
    /* the layouts marked *: why dtrain cannot run them, each reason once with its first layout */
    const char *seen[32];
    int n_seen = 0;
    for (int i = 0; i < n && (limit <= 0 || i < limit); i++) {
        const char *why = dt_plan_dtrain_refusal(job, &r[i].lay);
        int k = 0;
        while (why && k < n_seen && seen[k] != why) k++;
        if (!why || k < n_seen || n_seen == 32) continue;
        seen[n_seen++] = why;
        char name[72];
        dt_plan_layout_name(&r[i].lay, name, sizeof name);
        fprintf(f, "# * dtrain cannot run it yet: %s (e.g. %s)\n", why, name);
    }
}

void dt_plan_print_run(FILE *f, const dt_plan_job *job, const dt_plan_result *r, int n, int fastest) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (r[i].fits && dt_plan_dtrain_runs(job, &r[i].lay) && (best < 0 || r[i].step_s < r[best].step_s)) best = i;
    char name[64];
    if (best < 0) {
        fprintf(f, "\ndtrain runs none of the fitting layouts yet\n");
        return;
    }
    if (best != fastest) {
        dt_plan_layout_name(&r[best].lay, name, sizeof name);
        fprintf(f, "\ndtrain cannot run the fastest layout yet; the fastest it runs: %s (step %.4g s)\n", name,
                r[best].step_s);
    }
    const dt_plan_layout *l = &r[best].lay;
    int per = job->dpn, nodes = job->gpus / per;
    long accum = job->global_batch / ((long)job->train.micro_batch * l->dp);
    char launch[96];
    if (nodes > 1) snprintf(launch, sizeof launch, "dtrain launch -n %d --ranks-per-node %d --", job->gpus, per);
    else snprintf(launch, sizeof launch, "mpirun -n %d", job->gpus);
    char cpk[96] = "";
    if (l->cp > 1) snprintf(cpk, sizeof cpk, " --set parallel.cp=%d", l->cp);
    if (l->ep > 1) snprintf(cpk + strlen(cpk), sizeof cpk - strlen(cpk), " --set parallel.ep=%d", l->ep);
    fprintf(f, "run it: %s dtrain train CONFIG --set parallel.strategy=%s --set parallel.hybrid=%s --set parallel.tp=%d "
               "--set parallel.pp=%d%s --set training.batch=%ld   (%ld %s per rank; or --set parallel.layout=auto)\n",
            launch, dt_strategy_name(l->zero), l->hybrid ? "true" : "false", l->tp, l->pp, cpk, job->global_batch,
            accum > 0 ? accum : 1, l->pp > 1 ? "micro-batch(es) through the 1f1b pipeline" : "accumulation step(s)");
}

void dt_plan_print_detail(FILE *f, const dt_plan_job *job, const dt_plan_result *r, const char *title) {
    char name[64];
    dt_plan_layout_name(&r->lay, name, sizeof name);
    fprintf(f, "\n%s: %s\n", title, name);
    fprintf(f, "  memory per device (%s): params %.3f GiB, grads %.3f, optimizer %.3f, activations %.3f (%s), comm "
               "buffers %.3f, other %.3f = %.3f GiB of %.4g (%s)\n",
            r->dtrain_sizing ? "dtrain's own plan, dt_trainer_mem_plan" : "analytic formulas",
            r->mem[DT_MEM_PARAMS] / GIB, r->mem[DT_MEM_GRADS] / GIB, r->mem[DT_MEM_OPTIM] / GIB,
            r->mem[DT_MEM_ACTS] / GIB, dt_recompute_name(job->train.model_opts.recompute), r->mem[DT_MEM_COMM] / GIB,
            r->mem[DT_MEM_OTHER] / GIB, r->mem_total / GIB, job->hw->memory_bytes / GIB, r->fits ? "fits" : "DOES NOT FIT");
    fprintf(f, "  FLOPs per step %.4g (%.4g per token x %ld x %d tokens); micro-steps m = %d\n", r->flops_step,
            r->flops_token, job->global_batch, job->train.seq_len, r->micro_steps);
    char sliced[160] = "";
    if (r->sliced_s < 0)
        snprintf(sliced, sizeof sliced, " + time-sliced %.4g (stages sharing cores run up to %.3gx faster while others "
                 "idle)", r->sliced_s, job->hw->idle_speedup);
    fprintf(f, "  step %.4g s = compute %.4g + recompute %.4g + bubble %.4g (pp %d, the schedule replayed; 1F1B with "
               "equal stages: (p-1)/(m+p-1) = %.3f)%s + exposed "
               "comm %.4g + overhead %.4g (%.4g us x m + %.4g us x %.4g collective calls) + optimizer %.4g (%.4g "
               "parameters x %g bytes / %.4g GB/s)\n",
            r->step_s, r->compute_s, r->recompute_s, r->bubble_s, r->lay.pp, dt_plan_bubble_fraction(r->lay.pp, r->micro_steps),
            sliced, r->comm_s, r->overhead_s, job->hw->step_overhead_us, job->hw->collective_call_us, r->calls, r->optimizer_s,
            r->opt_params, r->opt_bytes, job->hw->optimizer_bw_gbs);
    for (int i = 0; i < r->n_comm; i++) {
        const dt_plan_comm_term *c = &r->comm[i];
        fprintf(f, "    %-26s %10.4g bytes x %-6.4g intra-node %9.4g s, inter-node %9.4g s, exposed %9.4g s\n", c->what,
                c->bytes, c->count, c->t_intra, c->t_inter, c->exposed);
    }
    fprintf(f, "  %.4g tokens/s, %.4g samples/s, %.4g TFLOP/s per device, MFU %.3f", r->tokens_s, r->samples_s,
            r->tflops_gpu, r->mfu);
    if (isfinite(r->scaling_eff)) fprintf(f, ", scaling efficiency vs 1 node %.3f", r->scaling_eff);
    fputc('\n', f);
    if (isfinite(r->usd_1b_tokens)) {
        fprintf(f, "  cost: $%.4g per 1K samples, $%.4g per 1B tokens", r->usd_1k_samples, r->usd_1b_tokens);
        if (isfinite(r->usd_run)) {
            fprintf(f, "; whole run (%.4g tokens) %.4g h, $%.4g on demand", job->train_tokens, r->run_hours, r->usd_run);
            if (isfinite(r->spot_usd_run)) fprintf(f, ", $%.4g spot", r->spot_usd_run);
        }
        fputc('\n', f);
    }
}

static void num(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

cJSON *dt_plan_result_json(const dt_plan_job *job, const dt_plan_result *r) {
    cJSON *o = cJSON_CreateObject();
    char name[64];
    dt_plan_layout_name(&r->lay, name, sizeof name);
    cJSON_AddStringToObject(o, "layout", name);
    cJSON_AddStringToObject(o, "strategy", dt_strategy_name(r->lay.zero));
    cJSON_AddBoolToObject(o, "hybrid", r->lay.hybrid);
    num(o, "dp", r->lay.dp), num(o, "tp", r->lay.tp), num(o, "pp", r->lay.pp), num(o, "cp", r->lay.cp);
    num(o, "ep", r->lay.ep), num(o, "micro_steps", r->micro_steps);
    const char *why = dt_plan_dtrain_refusal(job, &r->lay);
    cJSON_AddBoolToObject(o, "dtrain_runs", why == NULL);
    if (why) cJSON_AddStringToObject(o, "dtrain_refusal", why);
    cJSON_AddStringToObject(o, "memory_source", r->dtrain_sizing ? "dtrain" : "analytic");
    cJSON *mem = cJSON_AddObjectToObject(o, "memory_bytes");
    for (int k = 0; k < DT_MEM_NKINDS; k++) num(mem, dt_mem_kind_name((dt_mem_kind)k), r->mem[k]);
    num(mem, "total", r->mem_total);
    cJSON_AddBoolToObject(o, "fits", r->fits);
    num(o, "flops_per_token", r->flops_token), num(o, "flops_per_step", r->flops_step);
    num(o, "step_s", r->step_s), num(o, "compute_s", r->compute_s), num(o, "recompute_s", r->recompute_s);
    num(o, "bubble_s", r->bubble_s), num(o, "sliced_s", r->sliced_s), num(o, "comm_exposed_s", r->comm_s), num(o, "overhead_s", r->overhead_s);
    num(o, "collective_calls", r->calls), num(o, "optimizer_s", r->optimizer_s);
    num(o, "optimizer_params", r->opt_params), num(o, "optimizer_bytes_per_param", r->opt_bytes);
    cJSON *cm = cJSON_AddArrayToObject(o, "comm");
    for (int i = 0; i < r->n_comm; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "what", r->comm[i].what);
        num(c, "bytes", r->comm[i].bytes), num(c, "count", r->comm[i].count);
        num(c, "intra_s", r->comm[i].t_intra), num(c, "inter_s", r->comm[i].t_inter);
        num(c, "exposed_s", r->comm[i].exposed);
        cJSON_AddItemToArray(cm, c);
    }
    num(o, "tokens_per_s", r->tokens_s), num(o, "samples_per_s", r->samples_s);
    num(o, "tflops_per_gpu", r->tflops_gpu), num(o, "mfu", r->mfu), num(o, "scaling_efficiency", r->scaling_eff);
    num(o, "usd_per_1k_samples", r->usd_1k_samples), num(o, "usd_per_1b_tokens", r->usd_1b_tokens);
    num(o, "run_hours", r->run_hours), num(o, "usd_run", r->usd_run), num(o, "spot_usd_run", r->spot_usd_run);
    return o;
}

cJSON *dt_plan_job_json(const dt_plan_job *job) {
    const dt_plan_model *m = &job->model;
    cJSON *o = cJSON_CreateObject(), *mo = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(mo, "name", m->name);
    num(mo, "n_layer", m->n_layer), num(mo, "d_model", m->d_model), num(mo, "n_head", m->n_head);
    num(mo, "n_kv_head", m->n_kv_head), num(mo, "d_ff", m->d_ff), num(mo, "vocab", m->vocab);
    num(mo, "experts", m->experts), num(mo, "topk", m->topk), num(mo, "params", dt_plan_params(m));
    num(o, "micro_batch", job->train.micro_batch), num(o, "seq_len", job->train.seq_len);
    num(o, "global_batch", (double)job->global_batch), num(o, "gpus", job->gpus), num(o, "devices_per_node", job->dpn);
    cJSON_AddStringToObject(o, "precision", prec_name(job->train.model_opts.compute));
    cJSON_AddStringToObject(o, "checkpointing", dt_recompute_name(job->train.model_opts.recompute));
    cJSON_AddStringToObject(o, "hardware", job->hw->key);
    num(o, "peak_tflops", dt_hw_peak(job->hw, job->train.model_opts.compute));
    num(o, "memory_bytes", job->hw->memory_bytes);
    cJSON *e = cJSON_AddObjectToObject(o, "efficiency");
    num(e, "gemm", job->gemm_eff), num(e, "intra_link", job->intra_eff), num(e, "inter_link", job->inter_eff);
    num(e, "step_overhead_us", job->hw->step_overhead_us), num(e, "collective_call_us", job->hw->collective_call_us);
    num(e, "optimizer_bw_gbs", job->hw->optimizer_bw_gbs);
    num(e, "tp_overlap", job->tp_overlap);
    /* the link of the TP term (decision 71): the catalog's tp_link, else the intra-node link */
    const dt_hw_link *tl = job->tp ? job->tp : job->intra;
    cJSON *t = cJSON_AddObjectToObject(o, "tp_link");
    cJSON_AddStringToObject(t, "key", tl->key);
    num(t, "bw_gbs", tl->bw_gbs), num(t, "latency_us", tl->latency_us);
    num(t, "efficiency", job->tp ? job->tp_eff : job->intra_eff);
    /* the link of the pipeline term (decision 77): the catalog's pp_link, else the intra-node link */
    const dt_hw_link *pl = job->pp ? job->pp : job->intra;
    cJSON *pj = cJSON_AddObjectToObject(o, "pp_link");
    cJSON_AddStringToObject(pj, "key", pl->key);
    num(pj, "bw_gbs", pl->bw_gbs), num(pj, "latency_us", pl->latency_us);
    num(pj, "efficiency", job->pp ? job->pp_eff : job->intra_eff);
    /* the link of the expert all-to-all term (decision 92): the catalog's ep_link, else the intra-node link */
    const dt_hw_link *el = job->ep ? job->ep : job->intra;
    cJSON *ej = cJSON_AddObjectToObject(o, "ep_link");
    cJSON_AddStringToObject(ej, "key", el->key);
    num(ej, "bw_gbs", el->bw_gbs), num(ej, "latency_us", el->latency_us);
    num(ej, "efficiency", job->ep ? job->ep_eff : job->intra_eff);
    /* the same two across nodes (decision 92): the catalog's pp_inter_link / ep_inter_link, else the inter-node link */
    const dt_hw_link *pil = job->pp_inter ? job->pp_inter : job->inter, *eil = job->ep_inter ? job->ep_inter : job->inter;
    cJSON *pij = cJSON_AddObjectToObject(o, "pp_inter_link"), *eij = cJSON_AddObjectToObject(o, "ep_inter_link");
    cJSON_AddStringToObject(pij, "key", pil->key);
    num(pij, "bw_gbs", pil->bw_gbs), num(pij, "latency_us", pil->latency_us);
    num(pij, "efficiency", job->pp_inter ? job->pp_inter_eff : job->inter_eff);
    cJSON_AddStringToObject(eij, "key", eil->key);
    num(eij, "bw_gbs", eil->bw_gbs), num(eij, "latency_us", eil->latency_us);
    num(eij, "efficiency", job->ep_inter ? job->ep_inter_eff : job->inter_eff);
    cJSON_AddBoolToObject(o, "sequence_parallel", job->train.model_opts.sp != 0);
    num(o, "train_tokens", job->train_tokens);
    return o;
}
