/* The planner's model arithmetic (parameters, FLOPs per token, activations) and the memory
 * per device of a layout (plan.h). Formulas: docs/planner.md, "Memory". */
#include <math.h>
#include <string.h>

#include "plan/plan.h"
#include "parallel/pp_schedule.h"
#include "plan/plan_impl.h"

void dt_plan_model_from_dtrain(const dt_model_config *mc, const char *preset, dt_plan_model *out) {
    memset(out, 0, sizeof *out);
    int gpt2 = !mc->family[0] || !strcmp(mc->family, "gpt2");
    snprintf(out->name, sizeof out->name, "%s", preset && *preset ? preset : gpt2 ? "gpt2 (custom)" : "llama (custom)");
    out->n_layer = mc->n_layer, out->d_model = mc->d_model, out->n_head = mc->n_head;
    out->n_kv_head = mc->n_kv_head ? mc->n_kv_head : mc->n_head;
    out->d_ff = mc->d_ff ? mc->d_ff : 4 * mc->d_model;
    out->vocab = mc->vocab, out->context = mc->context;
    out->swiglu = !gpt2, out->bias = gpt2, out->tied = gpt2 || !mc->untied;
    if (mc->n_experts) /* a llama mixture of experts (model/llama/moe.h) */
        out->experts = mc->n_experts, out->topk = mc->experts_topk, out->d_ff = mc->expert_d_ff;
    out->is_dtrain = 1;
    out->mc = *mc;
}

/* Matrices and vectors of one layer: attention (+ norms, biases, router) and one expert's MLP. */
static void layer_parts(const dt_plan_model *m, double *dense, double *mlp) {
    double C = m->d_model, hs = (double)(m->d_model / m->n_head);
    double q = m->n_head * hs, kv = m->n_kv_head * hs, F = m->d_ff;
    *dense = C * (q + 2 * kv) + q * C;
    *mlp = (m->swiglu ? 3 : 2) * C * F;
    if (m->bias) *dense += (q + 2 * kv) + C + 4 * C, *mlp += F + C; /* biases, two LayerNorms (w, b) */
    else *dense += 2 * C;                                              /* two RMSNorm weights */
    if (m->experts > 0) *dense += C * m->experts;                      /* router */
}

static double final_norm(const dt_plan_model *m) { return (m->bias ? 2.0 : 1.0) * m->d_model; }
static double embed(const dt_plan_model *m) {
    return (double)m->vocab * m->d_model + (m->bias ? (double)m->context * m->d_model : 0.0);
}

double dt_plan_params(const dt_plan_model *m) {
    double dense, mlp;
    layer_parts(m, &dense, &mlp);
    double head = m->tied ? 0.0 : (double)m->vocab * m->d_model;
    return embed(m) + head + m->n_layer * (dense + mlp * (m->experts > 0 ? m->experts : 1)) + final_norm(m);
}

/* Matmul parameters a token passes through: the layers with topk experts, the final norm and
 * the lm_head (tied or not); the embedding lookup does no matmul. */
double dt_plan_active_params(const dt_plan_model *m) {
    double dense, mlp;
    layer_parts(m, &dense, &mlp);
    return m->n_layer * (dense + mlp * (m->experts > 0 ? m->topk : 1)) + final_norm(m) +
           (double)m->vocab * m->d_model;
}

double dt_plan_attn_flops(const dt_plan_model *m, int T) { return 12.0 * m->n_layer * (double)T * m->d_model; }

double dt_plan_flops_per_token(const dt_plan_model *m, int T) {
    return 6.0 * dt_plan_active_params(m) + dt_plan_attn_flops(m, T);
}

double dt_plan_layer_act_bytes(const dt_plan_model *m, dt_recompute r, double b, double s, int t, int e) {
    double C = m->d_model, hs = (double)(m->d_model / m->n_head);
    double q = m->n_head * hs, kv = m->n_kv_head * hs, F = m->d_ff;
    double k = m->experts > 0 ? m->topk : 1; /* a token's MLP activations, once per routed expert */
    double up = (m->swiglu ? 2 : 1) * F * k, act = F * k;
    double per_token; /* elements */
    if (r == DT_RECOMPUTE_FULL) per_token = C;                         /* the layer input */
    else if (r == DT_RECOMPUTE_SELECTIVE) per_token = C + (q + 2 * kv) + C + up; /* input, matmul outputs */
    else per_token = C + C + (q + 2 * kv) + q + C + C + up + act;     /* x, ln1, qkv, att, r, ln2, up, act */
    double bytes = per_token * e * b * s;
    if (r != DT_RECOMPUTE_FULL) bytes += 4.0 * m->n_head * b * s; /* attention's log-sum-exp (fp32) */
    return bytes / t;
}

void dt_plan_pp_costs(const dt_plan_model *m, int T, dt_pp_costs *k) {
    if (m->is_dtrain) { /* the trainer's own costs */
        dt_pp_costs_of(&m->mc, T, k);
        return;
    }
    /* the same terms from the shape (pp_split.h): 6 x active parameters + 12 T d per layer; the
     * final norm and the lm_head's 6 x parameters + the loss; the lookup of the token table
     * (and of the positions with learned ones) */
    double dense, mlp, C = m->d_model, V = m->vocab;
    layer_parts(m, &dense, &mlp);
    k->layer = 6.0 * (dense + mlp * (m->experts > 0 ? m->topk : 1)) + 12.0 * (double)T * C;
    k->head = 6.0 * (final_norm(m) + V * C) + DT_PP_LOSS_FLOPS * V;
    k->embed = DT_PP_LOOKUP_FLOPS * C * (m->bias ? 2.0 : 1.0);
}

void dt_plan_pp_split(const dt_plan_model *m, int T, int pp, int *first) {
    dt_pp_costs k;
    dt_plan_pp_costs(m, T, &k);
    dt_pp_split_costs(&k, m->n_layer, pp, first);
}

void dt_plan_stages_of(const dt_plan_model *m, int T, int pp, dt_plan_stages *out) {
    dt_pp_costs k;
    dt_plan_pp_costs(m, T, &k);
    out->pp = pp < 1 ? 1 : pp > DT_PP_RULE_MAX ? DT_PP_RULE_MAX : pp;
    dt_pp_split_costs(&k, m->n_layer, out->pp, out->first);
    double total = 0, top = -1;
    out->heavy = 0;
    for (int s = 0; s < out->pp; s++) {
        double c = dt_pp_costs_stage(&k, out->pp, out->first, s);
        total += c;
        if (c > top * (1 + 1e-9) || (c >= top * (1 - 1e-9) && dt_plan_stage_n(out, s) > dt_plan_stage_n(out, out->heavy)))
            top = c, out->heavy = s;
    }
    out->u = out->pp == 1 ? 1.0 : total > 0 ? out->pp * top / total : 1.0;
}

double dt_plan_stage_layers(const dt_plan_model *m, const dt_plan_layout *l, int T) {
    dt_plan_stages st;
    dt_plan_stages_of(m, T, l->pp, &st);
    return (double)dt_plan_stage_n(&st, st.heavy);
}

/* Parameters on one device of a stage holding n layers. */
static double stage_params_n(const dt_plan_model *m, const dt_plan_layout *l, int stage, int n);
double dt_plan_stages_params(const dt_plan_model *m, const dt_plan_layout *l, const dt_plan_stages *st, int stage) {
    return stage_params_n(m, l, stage, dt_plan_stage_n(st, stage));
}
static double stage_params_n(const dt_plan_model *m, const dt_plan_layout *l, int stage, int n) {
    double dense, mlp;
    layer_parts(m, &dense, &mlp);
    double experts = mlp * (m->experts > 0 ? m->experts : 1) / (m->experts > 0 ? l->ep : 1);
    double p = (double)n * (dense + experts) / l->tp;
    if (stage == 0) p += embed(m) / l->tp;
    if (stage == l->pp - 1) {
        p += final_norm(m);
        /* untied head, or the tied embedding's copy on the last stage (Megatron keeps one) */
        if (!m->tied || l->pp > 1) p += (double)m->vocab * m->d_model / l->tp;
    }
    return p;
}

double dt_plan_stage_params(const dt_plan_model *m, const dt_plan_layout *l, int T, int stage) {
    dt_plan_stages st;
    dt_plan_stages_of(m, T, l->pp, &st);
    return stage_params_n(m, l, stage, dt_plan_stage_n(&st, stage));
}

double dt_plan_unit_params(const dt_plan_model *m, const dt_plan_layout *l) {
    double dense, mlp;
    layer_parts(m, &dense, &mlp);
    double layer = (dense + mlp * (m->experts > 0 ? m->experts : 1) / (m->experts > 0 ? l->ep : 1)) / l->tp;
    double vocab = (double)m->vocab * m->d_model / l->tp;
    return layer > vocab ? layer : vocab;
}

const char *dt_plan_dtrain_refusal(const dt_plan_job *job, const dt_plan_layout *l) {
    const dt_plan_model *m = &job->model;
    const dt_train_cfg *t = &job->train;
    if (l->ep > 1) { /* expert parallelism (decisions 85, 87, 88, 89, 91): DDP over the data-parallel ranks
                        with pipeline stages or tensor parallelism (not both) and any gradient dtype, or
                        ZeRO (not hybrid; ZeRO-2/3 reducing once a step) alone with fp32 gradients */
        if (m->experts <= 0) return "expert parallelism needs a mixture of experts";
        if (m->experts % l->ep || l->dp % l->ep) return "expert parallelism: ep must divide the experts and dp";
        if (l->hybrid) return "expert parallelism with hybrid sharding";
        if (l->zero >= DT_STRAT_ZERO2 && t->parallel.zero_reduce == DT_ZR_MICRO)
            return "expert parallelism with ZeRO-2/3 reducing every micro-step (parallel.zero_reduce: step runs)";
        if (l->zero != DT_STRAT_DDP && (l->tp > 1 || l->pp > 1))
            return "expert parallelism with ZeRO and tensor or pipeline parallelism";
        if (l->zero != DT_STRAT_DDP && t->parallel.grad_dtype != DT_F32)
            return "expert parallelism with ZeRO and 16-bit gradients";
        if (l->tp > 1 && l->pp > 1) return "expert parallelism with both tensor and pipeline parallelism";
        if (l->cp > 1) return "expert parallelism with context parallelism";
        if (t->model_opts.lora.rank > 0 || t->model_opts.lora.nf4) return "expert parallelism with LoRA or QLoRA";
        if (t->parallel.compression != DT_COMPRESS_NONE) return "expert parallelism with gradient compression";
    }
    if (l->cp > 1) { /* context parallelism (decision 83): the causal families, no hybrid sharding; a
                        mixture of experts dropless (decision 89) */
        if (m->experts > 0 && t->moe_capacity > 0.0f) return "context parallelism with capacity-limited experts";
        if (l->hybrid) return "context parallelism with hybrid sharding";
        if (t->seq_len % (2 * l->cp)) return "context parallelism: the sequence is not a multiple of 2 cp";
        if (m->is_dtrain && strcmp(m->mc.family, "llama") && strcmp(m->mc.family, "gpt2"))
            return "context parallelism of a model that is not causal (vit)";
    }
    /* pipeline parallelism (decision 74): a stage holds a layer at least; experts too (82) */
    if (l->pp > m->n_layer) return "a pipeline of more stages than layers";
    if (l->pp > DT_PP_MAX) return "a pipeline of more stages than dtrain's limit";
    if (l->tp <= 1) return NULL;
    const int kv = m->n_kv_head > 0 ? m->n_kv_head : m->n_head;
    /* tensor parallelism: the heads and the MLP (each expert's, decision 91: not under a pipeline) */
    if (m->n_head % l->tp || kv % l->tp || m->d_ff % l->tp)
        return "tensor parallelism not dividing the heads, the kv heads and the MLP";
    if (m->experts > 0 && (l->pp > 1 || t->model_opts.compute != DT_F32 || t->model_opts.lora.rank > 0 ||
                           t->model_opts.lora.nf4)) /* decision 91: fp32, no LoRA */
        return "tensor parallelism of experts under a pipeline, in 16 bits or with LoRA";
    return NULL;
}

int dt_plan_dtrain_runs(const dt_plan_job *job, const dt_plan_layout *l) { return dt_plan_dtrain_refusal(job, l) == NULL; }

int dt_plan_shard_ranks(const dt_plan_job *job, const dt_plan_layout *l) {
    if (!l->hybrid) return l->dp * l->cp; /* the gradient's group: data and context parallel (decision 94) */
    int in_node = job->dpn / (l->tp * l->cp);
    if (in_node < 1) in_node = 1;
    return in_node < l->dp ? in_node : l->dp;
}

/* dtrain's own plan: the fullest of its ranks (rank 0 and the last differ by a shard's rounding). */
static dt_status dtrain_memory(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *l, dt_plan_result *r) {
    dt_train_cfg c = job->train;
    c.model = job->model.mc;
    c.parallel.strategy = l->zero;
    c.parallel.hybrid = l->hybrid;
    c.accum = r->micro_steps;
    /* tensor parallelism: each rank of a TP group holds one shard (the trainer's own plan) */
    c.parallel.tp = l->tp;
    c.model_opts.tp = l->tp > 1 ? l->tp : 0, c.model_opts.tp_local = 1, c.model_opts.tp_first = 0;
    /* pipeline parallelism: 1F1B over the step's micro-batches, the stages cut by the cost rule
     * (parallel/pp_split.h); every stage's plan, as they differ (stage 0's activations, the
     * last stage's head) */
    c.pp = l->pp, c.pp_kind = DT_PP_1F1B, c.pp_virtual = 1, c.pp_blocks = 0;
    memset(c.pp_first, 0, sizeof c.pp_first);
    /* context parallelism: each rank T / cp rows of every sequence (decision 83) */
    c.cp = l->cp > 1 ? l->cp : 1, c.model_opts.cp = l->cp > 1 ? l->cp : 0, c.model_opts.cp_rank = 0;
    /* expert parallelism: each rank n_experts / ep of them (decision 85) */
    c.ep = l->ep > 1 ? l->ep : 1, c.model_opts.ep = l->ep > 1 ? l->ep : 0, c.model_opts.ep_rank = 0;
    int world = l->dp * l->tp * l->pp * c.cp, node = world < job->dpn ? world : job->dpn;
    if (node < 1 || world % node) node = world;
    /* ZeRO's modes (decision 80): parallel.zero_reduce's auto is the trainer's (step under a
     * pipeline); parallel.zero3_gather's auto is step when every rank's plan with the resident
     * parameters fits the device's memory, else use (the trainer's rule with the device for the
     * host's share) */
    const int try_step = c.parallel.zero3_gather == DT_ZG_AUTO && l->zero == DT_STRAT_ZERO3 && l->pp > 1;
    if (c.parallel.zero3_gather == DT_ZG_AUTO) c.parallel.zero3_gather = try_step ? DT_ZG_STEP : DT_ZG_USE;
    for (int pass = 0; pass < 2; pass++) {
        double best = -1;
        for (int q = 0; q < 2 * l->pp; q++) { /* each stage's first and last data-parallel rank */
            const int p = q / 2, d = q % 2 ? l->dp - 1 : 0;
            if (q % 2 && l->dp == 1) continue;
            size_t b[DT_MEM_NKINDS];
            DT_CHECK(dt_trainer_mem_plan(ctx, &c, world, node, (d + l->dp * p) * c.cp * l->tp, b)); /* tp, cp, dp, pp */
            double tot = 0;
            for (int k = 0; k < DT_MEM_NKINDS; k++) tot += (double)b[k];
            if (tot > best) {
                best = tot;
                for (int k = 0; k < DT_MEM_NKINDS; k++) r->mem[k] = (double)b[k];
            }
        }
        if (!try_step || c.parallel.zero3_gather != DT_ZG_STEP || best <= job->hw->memory_bytes) break;
        c.parallel.zero3_gather = DT_ZG_USE; /* the resident parameters do not fit: per use */
    }
    r->dtrain_sizing = 1;
    return DT_OK;
}

/* The analytic model: per pipeline stage, the fullest one. */
static void analytic_memory(const dt_plan_job *job, const dt_plan_layout *l, dt_plan_result *r) {
    const dt_plan_model *m = &job->model;
    dt_dtype cd = job->train.model_opts.compute;
    int lowp = cd == DT_BF16 || cd == DT_F16, e = lowp ? 2 : 4;
    double b = job->train.micro_batch, s = (double)job->train.seq_len / l->cp;
    int shard = dt_plan_shard_ranks(job, l), mstep = r->micro_steps;
    double U = dt_plan_unit_params(m, l), best = -1;
    dt_recompute rc = job->train.model_opts.recompute;
    dt_plan_stages sts;
    dt_plan_stages_of(m, job->train.seq_len, l->pp, &sts);
    /* stage 0's activation sets in flight, counted in whole stages: 1F1B holds min(pp, m); the
     * interleaved schedule (train.pp_kind, pp_virtual; decision 96) holds dt_pp_inflight's
     * chunk sets, each 1/v of the stage (2 (pp-1) + (v-1) pp + 1 for m large: (1 + (pp-1)/(pp v))
     * x pp, Narayanan et al. 2021's factor). A schedule the pipeline would refuse (pp not dividing
     * m) is counted as 1F1B. */
    double inflight0 = l->pp < mstep ? l->pp : mstep;
    int v = 1;
    if (l->pp > 1 && dt_plan_pp_kind(job, l->pp, mstep, &v) == DT_PP_INTERLEAVED)
        inflight0 = dt_pp_inflight(DT_PP_INTERLEAVED, l->pp, v, mstep, 0) / (double)v;
    for (int st = 0; st < l->pp; st++) { /* every stage: a middle one may hold the most layers */
        double P = stage_params_n(m, l, st, dt_plan_stage_n(&sts, st)), x[DT_MEM_NKINDS] = {0};
        /* weights in the compute dtype (w bytes); fp32 gradients; the optimizer holds m, v and,
         * under 16-bit compute, the fp32 master weights (K = 8 or 12 bytes): ZeRO-1 shards
         * the optimizer, ZeRO-2 the gradients too, ZeRO-3 the weights too (two units whole) */
        double w = e, K = lowp ? 12 : 8;
        x[DT_MEM_PARAMS] = l->zero == DT_STRAT_ZERO3 ? w * P / shard + 2 * U * w : w * P;
        x[DT_MEM_GRADS] = l->zero >= DT_STRAT_ZERO2 ? 4 * P / shard + 2 * U * 4 : 4 * P;
        x[DT_MEM_OPTIM] = l->zero >= DT_STRAT_ZERO1 ? K * P / shard : K * P;
        double bucket = (double)job->train.parallel.bucket_bytes;
        if (l->dp * l->cp > 1 && l->zero != DT_STRAT_ZERO3) x[DT_MEM_COMM] += 2 * fmin(bucket, 4 * P);
        if (l->tp > 1) x[DT_MEM_COMM] += 2.0 * e * b * s * m->d_model; /* sequence-parallel gather buffers */
        double layers = dt_plan_stage_n(&sts, st);
        double inflight = st == 0 ? inflight0 : 1; /* 1F1B: stage 0 holds p micro-batches */
        x[DT_MEM_ACTS] = layers * inflight * dt_plan_layer_act_bytes(m, rc, b, s, l->tp, e);
        if (st == 0) x[DT_MEM_ACTS] += inflight * e * b * s * m->d_model / l->tp; /* embedding output */
        if (st == l->pp - 1) x[DT_MEM_ACTS] += 4.0 * b * s * m->vocab / l->tp;   /* fp32 logits */
        double tot = 0;
        for (int k = 0; k < DT_MEM_NKINDS; k++) tot += x[k];
        if (tot > best) {
            best = tot;
            memcpy(r->mem, x, sizeof x);
        }
    }
    r->dtrain_sizing = 0;
}

dt_status dt_plan_memory(dt_ctx *ctx, const dt_plan_job *job, const dt_plan_layout *l, dt_plan_result *r) {
    /* dtrain's own sizing for the layouts it runs: data and tensor parallelism */
    int dtrain = job->model.is_dtrain && dt_plan_dtrain_runs(job, l);
    if (dtrain) DT_CHECK(dtrain_memory(ctx, job, l, r));
    else analytic_memory(job, l, r);
    r->mem_total = 0;
    for (int k = 0; k < DT_MEM_NKINDS; k++) r->mem_total += r->mem[k];
    r->fits = r->mem_total <= job->hw->memory_bytes;
    return DT_OK;
}
