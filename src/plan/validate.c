/* `dtrain plan --validate`: predictions against published runs (validate.h). */
#include "plan/validate.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/sortcmp.h"
#include "parallel/pp_schedule.h"
#include "plan/plan.h"
#include "plan/validate_impl.h"

#define GIB 1073741824.0
#define MAX_ROWS DT_VAL_MAX_ROWS

enum { C_ID, C_SOURCE, C_SPLIT, C_FW, C_MODEL, C_LAYERS, C_DMODEL, C_HEADS, C_KV, C_DFF, C_FFN, C_VOCAB, C_SEQ, C_PARAMS, C_EXPERTS,
       C_TOPK, C_GPU, C_NGPUS, C_GPN, C_TP, C_PP, C_VPP, C_DP, C_CP, C_EP, C_ZERO, C_MB, C_GB, C_PREC, C_RECOMP, C_TFLOPS,
       C_MFU, C_STEP, C_TOKS, C_MEM, C_NOTES, C_N };
static const char *const col_names[C_N] = {
    "id", "source", "split", "framework", "model", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "ffn", "vocab", "seq_len",
    "params_b", "experts", "experts_topk", "gpu", "n_gpus", "gpus_per_node", "tp", "pp", "vpp", "dp", "cp", "ep", "zero",
    "micro_batch", "global_batch", "precision", "recompute", "reported_tflops_per_gpu", "reported_mfu",
    "reported_step_s", "reported_tokens_per_s", "reported_mem_gb", "notes"};

int dt_csv_split(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return n + 1; /* too many */
        char *w = p;
        fields[n++] = p;
        if (*p == '"') {
            fields[n - 1] = w = ++p;
            for (; *p; p++) {
                if (*p == '"' && p[1] == '"') *w++ = '"', p++;
                else if (*p == '"') { p++; break; }
                else *w++ = *p;
            }
            while (*p && *p != ',') p++;
        } else {
            while (*p && *p != ',') p++;
            w = p;
        }
        char c = *p;
        *w = 0;
        if (c != ',') return n;
        p++;
    }
}

double dt_median_abs(double *x, int n) {
    if (n <= 0) return NAN;
    for (int i = 0; i < n; i++) x[i] = fabs(x[i]);
    qsort(x, (size_t)n, sizeof *x, dt_cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

typedef dt_val_row row;

static double val(char **f, const int *idx, int c, double dflt) {
    if (idx[c] < 0 || !*f[idx[c]]) return dflt;
    char *end;
    double v = strtod(f[idx[c]], &end);
    return end != f[idx[c]] && !*end ? v : NAN;
}
static const char *str(char **f, const int *idx, int c) { return idx[c] < 0 ? "" : f[idx[c]]; }
static int has(char **f, const int *idx, int c) { return idx[c] >= 0 && *f[idx[c]]; }

/* Notes that say the published TFLOP/s count the recomputed forward ("hardware" FLOPs): the
 * comparison then adds the predicted recompute FLOPs (docs/planner-sources.md's table). */
static const char *const hw_phrases[] = {"flops counted with recompute", "counts a recompute", "hardware tflop",
                                         "counting the recompute", "hardware flop"};

/* Published shapes for rows that give only a parameter count (the seed tables): GPT-3 (Brown
 * et al. 2020, Table 2.1; GELU, 4d, vocab 50257), OPT-30B/66B (Zhang et al. 2022), LLaMA 1/2
 * and Llama 3 405B (their papers' model tables; SwiGLU), Megatron's 462B (its README table). A
 * name with "llama" takes a LLaMA shape; otherwise the nearest parameter count. */
typedef struct ref_shape {
    const char *name;
    double params_b;
    int llama, L, d, h, kv, ff, vocab;
} ref_shape;
static const ref_shape ref_shapes[] = {
    {"GPT-3 1.3B", 1.3, 0, 24, 2048, 16, 16, 8192, 50257},      {"GPT-3 2.7B", 2.7, 0, 32, 2560, 32, 32, 10240, 50257},
    {"GPT-3 6.7B", 6.7, 0, 32, 4096, 32, 32, 16384, 50257},     {"GPT-3 13B", 13, 0, 40, 5120, 40, 40, 20480, 50257},
    {"OPT-30B", 30, 0, 48, 7168, 56, 56, 28672, 50272},          {"OPT-66B", 66, 0, 64, 9216, 72, 72, 36864, 50272},
    {"GPT-3 175B", 175, 0, 96, 12288, 96, 96, 49152, 50257},     {"Megatron 462B", 462, 0, 112, 18432, 144, 144, 73728, 131072},
    {"LLaMA 7B", 6.7, 1, 32, 4096, 32, 32, 11008, 32000},        {"LLaMA 13B", 13, 1, 40, 5120, 40, 40, 13824, 32000},
    {"LLaMA 33B", 32.5, 1, 60, 6656, 52, 52, 17920, 32000},      {"Llama 2 70B", 69, 1, 80, 8192, 64, 8, 28672, 32000},
    {"Llama 3 405B", 405, 1, 126, 16384, 128, 8, 53248, 128256},
};

static const ref_shape *ref_for(const char *model, double params_b) {
    int llama = strcasestr(model, "llama") != NULL;
    const ref_shape *best = NULL;
    for (size_t i = 0; i < sizeof ref_shapes / sizeof ref_shapes[0]; i++) {
        const ref_shape *r = &ref_shapes[i];
        if (llama && !r->llama) continue;
        if (!best || fabs(log(r->params_b / params_b)) < fabs(log(best->params_b / params_b))) best = r;
    }
    return best;
}

static void assume(row *w, const char *fmt, const char *what, long v) {
    size_t k = strlen(w->assumed);
    snprintf(w->assumed + k, sizeof w->assumed - k, fmt, k ? ", " : "", what, v);
}

/* One CSV row -> a job and layout; ok = 0 with the reason when something is missing. */
static void build(const dt_hw_catalog *cat, char **f, const int *idx, row *w) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    snprintf(w->id, sizeof w->id, "%s", str(f, idx, C_ID));
    snprintf(w->model, sizeof w->model, "%s", str(f, idx, C_MODEL));
    snprintf(w->gpu, sizeof w->gpu, "%s", str(f, idx, C_GPU));
    /* every numeric column is a number in a sane range, or empty */
    static const int numeric[] = {C_LAYERS, C_DMODEL, C_HEADS, C_KV, C_DFF, C_VOCAB, C_SEQ, C_PARAMS, C_EXPERTS, C_TOPK,
                                  C_NGPUS, C_GPN, C_TP, C_PP, C_DP, C_CP, C_EP, C_ZERO, C_MB, C_GB, C_TFLOPS, C_MFU,
                                  C_STEP, C_TOKS, C_MEM};
    for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++) {
        int c = numeric[i];
        double v = val(f, idx, c, 0), hi = c == C_TOKS || c == C_GB ? 1e12 : 1e9;
        if (!(v >= 0 && v < hi)) {
            snprintf(w->why, sizeof w->why, "column %s: '%s' is not a number in [0, %g)", col_names[c], str(f, idx, c), hi);
            return;
        }
    }
    const dt_hw_accel *hw;
    if (dt_hw_find(&ctx, cat, w->gpu, &hw) != DT_OK) {
        snprintf(w->why, sizeof w->why, "gpu '%s' is not in the catalog", w->gpu);
        return;
    }
    dt_plan_job *j = &w->job;
    memset(j, 0, sizeof *j);
    dt_plan_model *m = &j->model;
    snprintf(m->name, sizeof m->name, "%s", w->model);
    if (strcasestr(w->model, "lora")) {
        snprintf(w->why, sizeof w->why, "LoRA/QLoRA fine-tuning (frozen, quantized base) is not modelled");
        return;
    }
    double pb = val(f, idx, C_PARAMS, NAN);
    if (!has(f, idx, C_LAYERS) && !has(f, idx, C_DMODEL) && pb > 0) { /* only a parameter count */
        const ref_shape *r = ref_for(w->model, pb);
        m->n_layer = r->L, m->d_model = r->d, m->n_head = r->h, m->n_kv_head = r->kv, m->d_ff = r->ff;
        m->vocab = r->vocab, m->swiglu = r->llama;
        snprintf(w->assumed, sizeof w->assumed, "shape of %s", r->name);
    } else {
        m->n_layer = (int)val(f, idx, C_LAYERS, 0), m->d_model = (int)val(f, idx, C_DMODEL, 0);
        m->n_head = (int)val(f, idx, C_HEADS, 0);
        m->n_kv_head = (int)val(f, idx, C_KV, m->n_head);
        m->swiglu = !strcasecmp(str(f, idx, C_FFN), "swiglu");
        m->d_ff = (int)val(f, idx, C_DFF, m->swiglu ? (8 * m->d_model / 3 + 255) / 256 * 256 : 4 * m->d_model);
        m->vocab = (int)val(f, idx, C_VOCAB, 0);
    }
    int T = (int)val(f, idx, C_SEQ, has(f, idx, C_LAYERS) ? 0 : 2048);
    if (!has(f, idx, C_SEQ) && T > 0) assume(w, "%s%s %ld", "seq_len", T);
    m->context = T, m->tied = !m->swiglu, m->bias = !m->swiglu;
    m->experts = (int)val(f, idx, C_EXPERTS, 0), m->topk = (int)val(f, idx, C_TOPK, m->experts ? 2 : 0);
    if (m->n_layer < 1 || m->d_model < 1 || m->n_head < 1 || m->n_kv_head < 1 || m->vocab < 1 || T < 1 ||
        m->d_ff < 1 || m->d_model % m->n_head) {
        snprintf(w->why, sizeof w->why, "model shape incomplete (n_layers, d_model, n_heads, vocab, seq_len, or params_b)");
        return;
    }
    dt_train_cfg_defaults(&j->train);
    /* the published runs' pipeline schedule: 1F1B (Megatron's and torchtitan's default; the
     * defaults' zero is gpipe), interleaved where the row's vpp says so (below) */
    j->train.pp_kind = DT_PP_1F1B, j->train.pp_virtual = 1;
    j->train.seq_len = T;
    j->train.micro_batch = (int)val(f, idx, C_MB, 1);
    const char *pr = str(f, idx, C_PREC), *rc = str(f, idx, C_RECOMP);
    j->train.model_opts.compute = !strcasecmp(pr, "fp32") ? DT_F32 : !strcasecmp(pr, "fp16") ? DT_F16 : DT_BF16;
    j->train.model_opts.recompute = !strcasecmp(rc, "full") ? DT_RECOMPUTE_FULL
                                    : !strcasecmp(rc, "selective") ? DT_RECOMPUTE_SELECTIVE : DT_RECOMPUTE_NONE;
    dt_plan_layout *l = &w->lay;
    l->tp = (int)val(f, idx, C_TP, 1), l->pp = (int)val(f, idx, C_PP, 1), l->cp = (int)val(f, idx, C_CP, 1);
    l->ep = (int)val(f, idx, C_EP, 1);
    int n = (int)val(f, idx, C_NGPUS, 0);
    l->dp = (int)val(f, idx, C_DP, n > 0 ? n / (l->tp * l->pp * l->cp) : 0);
    if (n <= 0) n = l->dp * l->tp * l->pp * l->cp;
    int z = (int)val(f, idx, C_ZERO, 0);
    l->zero = z >= 1 && z <= 3 ? (dt_strategy)z : DT_STRAT_DDP;
    j->gpus = n;
    w->acc = (int)(hw - cat->acc), w->hw = *hw;
    if (!strcasecmp(pr, "fp8")) { /* fp8 linears at the fp8 peak, the attention core at the 16-bit one */
        if (hw->peak_tflops[DT_HW_FP8] <= 0) {
            snprintf(w->why, sizeof w->why, "precision fp8: %s has no fp8 peak", hw->key);
            return;
        }
        w->hw.peak_tflops[DT_HW_BF16] = hw->peak_tflops[DT_HW_FP8];
        w->fp8 = 1;
        if (hw->peak_tflops[DT_HW_BF16] > 0) j->attn_peak = hw->peak_tflops[DT_HW_BF16] / hw->peak_tflops[DT_HW_FP8];
        snprintf(w->assumed + strlen(w->assumed), sizeof w->assumed - strlen(w->assumed),
                 "%sfp8 peak for the linear layers, 16-bit for the attention core",
                 w->assumed[0] ? ", " : "");
    }
    j->hw = &w->hw;
    /* a run that says it overlaps tensor-parallel communication with its GEMMs */
    const char *nt = str(f, idx, C_NOTES);
    j->tp_overlap = strcasestr(nt, "tp-comm-overlap") || strcasestr(nt, "asynctp") ? 1.0 : 0.0;
    j->intra = dt_hw_link_find(cat, hw->intra), j->inter = dt_hw_link_find(cat, hw->inter);
    j->gemm_eff = hw->gemm_eff, j->intra_eff = j->intra->eff, j->inter_eff = j->inter->eff;
    j->tp = dt_hw_tp_link(cat, hw), j->tp_eff = j->tp->eff;
    j->pp = dt_hw_pp_link(cat, hw), j->pp_eff = j->pp->eff;
    j->ep = dt_hw_ep_link(cat, hw), j->ep_eff = j->ep->eff;
    j->pp_inter = dt_hw_pp_inter_link(cat, hw), j->pp_inter_eff = j->pp_inter->eff;
    j->ep_inter = dt_hw_ep_inter_link(cat, hw), j->ep_inter_eff = j->ep_inter->eff;
    int gpn = (int)val(f, idx, C_GPN, hw->devices_per_node);
    j->dpn = gpn < n ? gpn : n;
    j->global_batch = (long)val(f, idx, C_GB, (double)j->train.micro_batch * l->dp);
    j->price_hour = j->spot_hour = -1;
    if (n < 1 || l->dp < 1 || j->dpn < 1 || j->train.micro_batch < 1 || j->global_batch < 1) {
        snprintf(w->why, sizeof w->why, "layout incomplete (n_gpus or dp, micro_batch)");
        return;
    }
    /* Megatron's gradient buckets: max(40M, 1M x dp) fp32 elements (its --ddp-bucket-size default) */
    j->train.parallel.bucket_bytes = (size_t)(fmax(4e7, 1e6 * l->dp) * 4);
    /* what the row leaves out: a global batch of 4 pp micro-batches per pipeline (m >> p, as
     * Narayanan et al. advise), the nearest multiple of micro x dp, the fastest layout that
     * fits, the smallest ZeRO stage, then the lightest checkpointing that fits */
    if (!has(f, idx, C_MB)) assume(w, "%s%s %ld", "micro_batch", 1);
    if (!has(f, idx, C_GB)) {
        j->global_batch = (long)j->train.micro_batch * l->dp * (l->pp > 1 ? 4 * l->pp : 1);
        assume(w, "%s%s %ld", "global_batch", j->global_batch);
    }
    /* a pipeline needs micro-batches: a "local batch" with fewer than pp of them is split into pp */
    if (l->pp > 1 && j->global_batch / ((long)j->train.micro_batch * l->dp) < l->pp && j->train.micro_batch % l->pp == 0) {
        j->train.micro_batch /= l->pp;
        assume(w, "%s%s %ld (the local batch split into pp micro-batches)", "micro_batch", j->train.micro_batch);
    }
    long per = (long)j->train.micro_batch * l->dp, gb = (j->global_batch + per / 2) / per * per;
    if (gb != j->global_batch && !(!has(f, idx, C_TP) && !has(f, idx, C_PP) && !has(f, idx, C_DP))) {
        j->global_batch = gb > 0 ? gb : per;
        assume(w, "%s%s %ld (a multiple of micro x dp)", "global_batch", j->global_batch);
    }
    /* the interleaved schedule (column vpp, decision 96): vpp chunks per pipeline rank, its
     * micro-batches in groups of pp (pp divides them, as Megatron requires); the stages stay
     * the planner's cut of the layers into pp, each rank's chunks equal shares of its stage -
     * also where pp x vpp does not divide n_layers (Megatron-Bridge's Llama 3.1 405B counts
     * the embedding and the loss as layers to make 126 + 2 = 8 x 8 x 2) */
    if (w->vpp >= 2) {
        long mstep = j->global_batch / ((long)j->train.micro_batch * l->dp);
        if (mstep < 1 || mstep > DT_PP_MAX_MICRO ||
            dt_pp_schedule_check(&ctx, DT_PP_INTERLEAVED, l->pp, w->vpp, (int)mstep) != DT_OK) {
            snprintf(w->why, sizeof w->why, "vpp %d: the interleaved schedule needs the micro-batches per step "
                     "(global_batch / (micro_batch x dp) = %ld) to be a multiple of pp %d", w->vpp, mstep, l->pp);
            return;
        }
        j->train.pp_kind = DT_PP_INTERLEAVED, j->train.pp_virtual = w->vpp;
        if (m->n_layer % (l->pp * w->vpp)) {
            size_t k = strlen(w->assumed);
            snprintf(w->assumed + k, sizeof w->assumed - k, "%svpp %d chunks of equal time (%d layers are not %d x %d x k)",
                     k ? ", " : "", w->vpp, m->n_layer, l->pp, w->vpp);
        }
    }
    int zero_known = has(f, idx, C_ZERO), rc_known = has(f, idx, C_RECOMP);
    if (!has(f, idx, C_TP) && !has(f, idx, C_PP) && !has(f, idx, C_DP)) {
        dt_plan_fix fix = {0, 0, l->cp, l->ep, zero_known ? (int)l->zero : -1, -1};
        dt_plan_result *res;
        int nres, fast, cheap;
        if (dt_plan_search(&ctx, j, &fix, &res, &nres) != DT_OK) {
            snprintf(w->why, sizeof w->why, "layout not stated, and none found: %.900s", ctx.err);
            return;
        }
        dt_plan_recommend(res, nres, &fast, &cheap);
        *l = res[fast >= 0 ? fast : 0].lay;
        free(res);
        char name[64];
        dt_plan_layout_name(l, name, sizeof name);
        size_t k = strlen(w->assumed);
        snprintf(w->assumed + k, sizeof w->assumed - k, "%slayout %s (searched)", k ? ", " : "", name);
        zero_known = 1;
    }
    if (dt_plan_predict(&ctx, j, l, &w->r) != DT_OK) {
        snprintf(w->why, sizeof w->why, "%s", ctx.err);
        return;
    }
    for (int rc_try = 0; !w->r.fits && rc_try < 3 && (!rc_known || rc_try == 0); rc_try++) {
        if (!rc_known) j->train.model_opts.recompute = (dt_recompute)rc_try;
        for (int zs = zero_known ? (int)l->zero : 0; zs <= (zero_known ? (int)l->zero : 3) && !w->r.fits; zs++) {
            l->zero = (dt_strategy)zs;
            if (dt_plan_predict(&ctx, j, l, &w->r) != DT_OK) break;
        }
    }
    if (w->r.fits && !zero_known && l->zero != DT_STRAT_DDP) assume(w, "%s%s %ld", "zero", (long)l->zero);
    if (w->r.fits && !rc_known && j->train.model_opts.recompute != DT_RECOMPUTE_NONE) {
        size_t k = strlen(w->assumed);
        snprintf(w->assumed + k, sizeof w->assumed - k, "%srecompute %s", k ? ", " : "",
                 dt_recompute_name(j->train.model_opts.recompute));
    }
    if (!w->r.fits) { /* nothing fits: report the row as stated */
        if (!zero_known) l->zero = DT_STRAT_DDP;
        if (!rc_known) j->train.model_opts.recompute = DT_RECOMPUTE_NONE;
        dt_plan_predict(&ctx, j, l, &w->r);
    }
    w->rep_step = val(f, idx, C_STEP, NAN), w->rep_mem = val(f, idx, C_MEM, NAN);
    double tf = val(f, idx, C_TFLOPS, NAN), mfu = val(f, idx, C_MFU, NAN), tok = val(f, idx, C_TOKS, NAN);
    double peak = dt_hw_peak(hw, j->train.model_opts.compute);
    double F = dt_plan_flops_per_token(m, T), tokens = (double)j->global_batch * T;
    w->rep_tflops = NAN, w->rep_from = "-";
    if (isfinite(tf)) w->rep_tflops = tf, w->rep_from = "tflops";
    else if (isfinite(mfu)) w->rep_tflops = mfu * peak, w->rep_from = "mfu";
    else if (isfinite(tok)) w->rep_tflops = tok * F / n / 1e12, w->rep_from = "tokens/s";
    else if (isfinite(w->rep_step)) w->rep_tflops = tokens * F / w->rep_step / n / 1e12, w->rep_from = "step_s";
    const char *notes = str(f, idx, C_NOTES);
    for (size_t i = 0; i < sizeof hw_phrases / sizeof hw_phrases[0]; i++) w->hw_flops |= strcasestr(notes, hw_phrases[i]) != NULL;
    w->ok = 1;
}

/* A source: the rows whose ids share the prefix before the first '-'; held out whole or fitted whole. */
typedef struct source {
    char key[64];
    int heldout, line; /* its split, and the first line that set it */
} source;

/* The row's source and split: every row names its source; split (when the column exists) is fit
 * or heldout, the same for every row of a source. */
static dt_status row_source(dt_ctx *ctx, const char *path, int lineno, char **f, const int *idx, row *w, source *srcs,
                            int *n_src) {
    if (!*str(f, idx, C_SOURCE))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'source' (field %d) is empty: every row names its source", path,
                       lineno, idx[C_SOURCE] + 1);
    const char *sp = str(f, idx, C_SPLIT);
    if (idx[C_SPLIT] >= 0 && strcmp(sp, "fit") && strcmp(sp, "heldout"))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'split' (field %d): '%s' is not fit or heldout", path, lineno,
                       idx[C_SPLIT] + 1, sp);
    w->heldout = !strcmp(sp, "heldout");
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(w->id, "-"), w->id);
    int s = 0;
    while (s < *n_src && strcmp(srcs[s].key, key)) s++;
    if (s == *n_src) {
        if (s == DT_VAL_MAX_SOURCES)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: more than %d sources", path, lineno, DT_VAL_MAX_SOURCES);
        snprintf(srcs[s].key, sizeof srcs[s].key, "%s", key);
        srcs[s].heldout = w->heldout, srcs[s].line = lineno;
        (*n_src)++;
    } else if (srcs[s].heldout != w->heldout)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "%s:%d: column 'split' (field %d): '%s' for source '%s', which line %d puts in %s (a source is held "
                       "out or fitted whole)", path, lineno, idx[C_SPLIT] + 1, sp, key, srcs[s].line,
                       srcs[s].heldout ? "heldout" : "fit");
    w->src = s;
    return DT_OK;
}

/* The row's virtual pipeline stages per pipeline rank (column vpp, Megatron's
 * virtual_pipeline_model_parallel_size): empty or 1 = no interleaving; 2 or more = the
 * interleaved schedule, which needs the row's pp of 2 or more. A file without the column
 * reads as 1 everywhere. */
static dt_status row_vpp(dt_ctx *ctx, const char *path, int lineno, char **f, const int *idx, row *w) {
    w->vpp = 1;
    if (!has(f, idx, C_VPP)) return DT_OK;
    const char *s = str(f, idx, C_VPP);
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > DT_PP_MAX_VIRTUAL)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'vpp' (field %d): '%s' is not a whole number in [1, %d]", path,
                       lineno, idx[C_VPP] + 1, s, DT_PP_MAX_VIRTUAL);
    double pp = val(f, idx, C_PP, 0);
    if (v >= 2 && !(pp >= 2))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'vpp' (field %d): %ld virtual stages per pipeline rank need a "
                       "pp of 2 or more (pp '%s')", path, lineno, idx[C_VPP] + 1, v, str(f, idx, C_PP));
    w->vpp = (int)v;
    return DT_OK;
}

/* The software that ran the row (column framework): empty = not stated (-1); otherwise a name
 * of lower-case letters, digits, '-', '_' and '.', up to 31 characters; rows naming the same
 * framework share its fitted efficiency (decision 98). A file without the column: -1 everywhere. */
static dt_status row_fw(dt_ctx *ctx, const char *path, int lineno, char **f, const int *idx, row *w, dt_val_fws *fws) {
    w->fw = -1;
    if (!has(f, idx, C_FW)) return DT_OK;
    const char *s = str(f, idx, C_FW);
    size_t len = strlen(s);
    if (len > 31 || strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != len)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'framework' (field %d): '%s' is not a name of up to 31 "
                       "lower-case letters, digits, '-', '_' or '.'", path, lineno, idx[C_FW] + 1, s);
    int k = 0;
    while (k < fws->n && strcmp(fws->name[k], s)) k++;
    if (k == fws->n) {
        if (k == DT_VAL_MAX_FW)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: column 'framework' (field %d): more than %d frameworks", path, lineno,
                           idx[C_FW] + 1, DT_VAL_MAX_FW);
        snprintf(fws->name[fws->n++], sizeof fws->name[0], "%s", s);
    }
    w->fw = k;
    return DT_OK;
}

static dt_status read_rows(dt_ctx *ctx, const dt_hw_catalog *cat, const char *path, row *rows, int *nrows, source *srcs,
                           int *n_src, dt_val_fws *fws) {
    FILE *fp = fopen(path, "r");
    if (!fp) return dt_fail(ctx, DT_ERR_IO, "--validate %s: cannot open", path);
    char line[8192], *f[128];
    int idx[C_N], lineno = 0, ncols = 0;
    dt_status st = DT_OK;
    *nrows = *n_src = fws->n = 0;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        int nf = dt_csv_split(line, f, 128);
        if (!ncols) {
            ncols = nf;
            for (int c = 0; c < C_N; c++) {
                idx[c] = -1;
                for (int i = 0; i < nf && i < 128; i++)
                    if (!strcmp(f[i], col_names[c])) idx[c] = i;
            }
            const int need[] = {C_ID, C_MODEL, C_LAYERS, C_DMODEL, C_HEADS, C_SEQ, C_GPU, C_VOCAB, C_SOURCE};
            for (size_t i = 0; i < sizeof need / sizeof need[0] && st == DT_OK; i++)
                if (idx[need[i]] < 0)
                    st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: header lacks the column '%s'", path, lineno, col_names[need[i]]);
            if (st) break;
            continue;
        }
        if (nf != ncols) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: %d fields, the header has %d", path, lineno, nf, ncols);
            break;
        }
        if (*nrows == MAX_ROWS) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%d: more than %d rows", path, lineno, MAX_ROWS);
            break;
        }
        row *w = &rows[(*nrows)++];
        memset(w, 0, sizeof *w);
        w->line = lineno;
        snprintf(w->id, sizeof w->id, "%s", str(f, idx, C_ID));
        if ((st = row_source(ctx, path, lineno, f, idx, w, srcs, n_src)) != DT_OK) break;
        if ((st = row_vpp(ctx, path, lineno, f, idx, w)) != DT_OK) break;
        if ((st = row_fw(ctx, path, lineno, f, idx, w, fws)) != DT_OK) break;
        build(cat, f, idx, w);
    }
    fclose(fp);
    if (st == DT_OK && !ncols) st = dt_fail(ctx, DT_ERR_CONFIG, "%s: empty (no header line)", path);
    return st;
}

/* One summary line: "# LABEL: median |error| of TFLOP/s per GPU M% (worst W%) over N rows" (+ tail). */
static void print_err(FILE *out, const char *label, dt_val_err e, const char *tail) {
    if (e.n > 0)
        fprintf(out, "# %s: median |error| of TFLOP/s per GPU %.1f%% (worst %.1f%%) over %d rows%s\n", label, 100 * e.median,
                100 * e.worst, e.n, tail);
    else fprintf(out, "# %s: no rows%s\n", label, tail);
}

static void json_err(cJSON *o, const char *key, dt_val_err e, int sources) {
    cJSON *x = cJSON_AddObjectToObject(o, key);
    cJSON_AddNumberToObject(x, "rows", e.n);
    if (sources >= 0) cJSON_AddNumberToObject(x, "sources", sources);
    if (e.n > 0) {
        cJSON_AddNumberToObject(x, "median_abs_rel_err_tflops", e.median);
        cJSON_AddNumberToObject(x, "worst_abs_rel_err_tflops", e.worst);
    }
}

dt_status dt_plan_validate(dt_ctx *ctx, const dt_hw_catalog *cat, const char *csv, int fit, int json, FILE *out) {
    row *rows = calloc(MAX_ROWS, sizeof *rows);
    source *srcs = calloc(DT_VAL_MAX_SOURCES, sizeof *srcs);
    dt_val_fws *fws = calloc(1, sizeof *fws);
    dt_val_eff eff = {0};
    if (!rows || !srcs || !fws) {
        free(rows), free(srcs), free(fws);
        return dt_fail(ctx, DT_ERR_NOMEM, "--validate: out of memory");
    }
    int n = 0, n_src = 0;
    dt_status st = read_rows(ctx, cat, csv, rows, &n, srcs, &n_src, fws);
    if (st != DT_OK) goto done;
    if (dt_val_eff_init(&eff, cat, fws->n) != 0) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "--validate: out of memory");
        goto done;
    }
    /* the GEMM efficiencies: the catalog's per GPU type, or fitted on the fitting rows (per GPU
       type, per GPU type and framework, the fp8 factor: decisions 98, 99) */
    if (fit) dt_val_fit(cat, rows, n, -1, &eff);
    int loso_src = 0, fit_src = 0, held_src = 0;
    for (int s = 0; s < n_src; s++) { /* the sources with a row scored */
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = rows[i].src == s && dt_val_scored(&rows[i]);
        if (any) srcs[s].heldout ? held_src++ : fit_src++;
    }
    dt_val_err loso = {0, NAN, NAN};
    if (fit) loso = dt_val_loso(cat, rows, n, n_src, fws->n, &loso_src);
    dt_val_err in = dt_val_score(rows, n, &eff, 0), held = dt_val_score(rows, n, &eff, 1);
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json) {
        fprintf(out, "# %s against %s; link efficiencies from the catalog (default %.3g); tp overlap 1 where the notes "
                     "say tp-comm-overlap or AsyncTP, else 0; eff = the GEMM efficiency used\n", csv, cat->path,
                cat->link_default);
        fprintf(out, "# %-22s %-16s %-14s %5s %-30s %7s %8s %8s %7s %8s %8s %7s %7s %7s  %s\n", "id", "model", "gpu", "gpus",
                "layout", "eff", "TFLOP/s", "publ.", "err", "step_s", "publ.", "err", "GiB", "publ.", "flags");
    }
    for (int i = 0; i < n; i++) {
        row *w = &rows[i];
        char fl[512] = "", name[64] = "-";
        if (w->ok) {
            dt_val_predict(w, dt_val_eff_of(&eff, w));
            dt_val_flags(w, fl, sizeof fl);
            dt_plan_layout_name(&w->lay, name, sizeof name);
        }
        if (arr) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", w->id);
            cJSON_AddStringToObject(o, "model", w->model);
            cJSON_AddStringToObject(o, "gpu", w->gpu);
            cJSON_AddStringToObject(o, "split", w->heldout ? "heldout" : "fit");
            cJSON_AddStringToObject(o, "source", srcs[w->src].key);
            if (w->fw >= 0) cJSON_AddStringToObject(o, "framework", fws->name[w->fw]);
            if (w->ok) {
                cJSON_AddStringToObject(o, "layout", name);
                cJSON_AddStringToObject(o, "pp_schedule", dt_pp_kind_name((dt_pp_kind)w->job.train.pp_kind));
                cJSON_AddNumberToObject(o, "pp_virtual", w->job.train.pp_virtual);
                cJSON_AddNumberToObject(o, "gemm_eff", w->job.gemm_eff);
                cJSON_AddNumberToObject(o, "pred_tflops_per_gpu", w->pred_tflops);
                cJSON_AddNumberToObject(o, "flops_per_token", w->r.flops_token);
                if (isfinite(w->rep_tflops)) cJSON_AddNumberToObject(o, "reported_tflops_per_gpu", w->rep_tflops);
                cJSON_AddNumberToObject(o, "pred_step_s", w->r.step_s);
                cJSON_AddNumberToObject(o, "pred_mem_gib", w->r.mem_total / GIB);
                cJSON_AddStringToObject(o, "flags", fl);
                cJSON_AddStringToObject(o, "assumed", w->assumed);
                cJSON_AddBoolToObject(o, "hardware_flops", w->hw_flops);
            } else cJSON_AddStringToObject(o, "skipped", w->why);
            cJSON_AddItemToArray(arr, o);
            continue;
        }
        if (!w->ok) {
            fprintf(out, "  %-22s %-16s %-14s skipped (line %d): %s\n", w->id, w->model, w->gpu, w->line, w->why);
            continue;
        }
        fprintf(out, "  %-22.22s %-16.16s %-14.14s %5d %-30.30s %7.3f %8.4g", w->id, w->model, w->gpu, w->job.gpus, name,
                w->job.gemm_eff, w->pred_tflops);
        double e1 = dt_val_rel(w->pred_tflops, w->rep_tflops), e2 = dt_val_rel(w->r.step_s, w->rep_step);
        if (isfinite(w->rep_tflops)) fprintf(out, " %8.4g %+6.1f%%", w->rep_tflops, 100 * e1);
        else fprintf(out, " %8s %7s", "-", "-");
        fprintf(out, " %8.4g", w->r.step_s);
        if (isfinite(w->rep_step)) fprintf(out, " %8.4g %+6.1f%%", w->rep_step, 100 * e2);
        else fprintf(out, " %8s %7s", "-", "-");
        fprintf(out, " %7.1f", w->r.mem_total / GIB);
        if (isfinite(w->rep_mem)) fprintf(out, " %7.1f", w->rep_mem);
        else fprintf(out, " %7s", "-");
        fprintf(out, "  %s%s%s%s%s%s\n", w->heldout ? "[held-out] " : "", w->hw_flops ? "[hardware FLOPs] " : "",
                w->assumed[0] ? "assumed: " : "", w->assumed, w->assumed[0] && fl[0] ? "; " : "", fl);
    }
    /* the errors over the rows compared (impossible claims left out): the fitting rows, then the held-out ones */
    if (arr) {
        cJSON *o = cJSON_CreateObject(), *ef = cJSON_AddObjectToObject(o, "gemm_eff");
        for (int a = 0; a < cat->n_acc; a++) cJSON_AddNumberToObject(ef, cat->acc[a].key, eff.acc[a]);
        cJSON *fe = cJSON_AddObjectToObject(o, "gemm_eff_framework");
        for (int a = 0; a < cat->n_acc; a++)
            for (int f = 0; f < fws->n; f++) {
                char key[96];
                snprintf(key, sizeof key, "%s/%s", cat->acc[a].key, fws->name[f]);
                if (!isnan(eff.cls[a * fws->n + f])) cJSON_AddNumberToObject(fe, key, eff.cls[a * fws->n + f]);
            }
        cJSON_AddNumberToObject(o, "fp8_factor", eff.fp8);
        cJSON_AddNumberToObject(o, "fp8_fitting_rows", eff.fp8_rows);
        cJSON_AddItemToObject(o, "rows", arr);
        if (in.n > 0) cJSON_AddNumberToObject(o, "median_abs_rel_err_tflops", in.median);
        cJSON_AddNumberToObject(o, "rows_compared", in.n);
        json_err(o, "in_sample", in, fit_src);
        json_err(o, "heldout", held, held_src);
        if (fit) json_err(o, "leave_one_source_out", loso, loso_src);
        char *js = cJSON_Print(o);
        fprintf(out, "%s\n", js);
        free(js);
        cJSON_Delete(o);
    } else {
        fprintf(out, "# GEMM efficiency per GPU type (%s):",
                fit ? "fitted on its 16-bit rows: minimum median |error| of TFLOP/s per GPU" : "catalog");
        for (int a = 0; a < cat->n_acc; a++) {
            int used = 0;
            for (int i = 0; i < n; i++) used |= rows[i].ok && rows[i].acc == a && (!fit || !rows[i].heldout);
            if (used) fprintf(out, " %s %.4g", cat->acc[a].key, eff.acc[a]);
        }
        int any = 0;
        for (int a = 0; fit && a < cat->n_acc; a++)
            for (int f = 0; f < fws->n; f++) {
                int used = 0; /* a fitted class some row is predicted with */
                for (int i = 0; i < n && !used; i++) used = rows[i].ok && rows[i].acc == a && rows[i].fw == f;
                if (!used || isnan(eff.cls[a * fws->n + f])) continue;
                if (!any++) fprintf(out, "\n# per GPU type and framework (fitted on its 16-bit rows; others take the GPU type's):");
                fprintf(out, " %s/%s %.4g", cat->acc[a].key, fws->name[f], eff.cls[a * fws->n + f]);
            }
        if (fit)
            fprintf(out, "\n# fp8 rows: their 16-bit efficiency x %.4g (%s %d fp8 fitting rows), the linear layers at "
                    "the fp8 peak, the attention core at the 16-bit one", eff.fp8, eff.fp8_rows ? "fitted on" : "1 without",
                    eff.fp8_rows);
        for (int a = 0; fit && a < cat->n_acc; a++) {
            int used = 0;
            for (int i = 0; i < n; i++) used |= rows[i].ok && rows[i].acc == a;
            if (used && dt_val_twin_fitted(cat, rows, n, a))
                fprintf(out, "\n# %s has no fitting row and the same compute as %s (same_compute_as): its fitted %.4g",
                        cat->acc[a].key, cat->acc[cat->acc[a].compute_twin].key, eff.acc[a]);
        }
        fprintf(out, "\n# median |error| of TFLOP/s per GPU over %d rows (impossible claims excluded): %.1f%%\n", in.n,
                100 * in.median);
        char tail[96];
        snprintf(tail, sizeof tail, " in %d sources%s", fit_src, fit ? " (fitted on these)" : " (catalog efficiencies)");
        print_err(out, "in-sample", in, tail);
        snprintf(tail, sizeof tail, " in %d sources (split heldout: never fitted)", held_src);
        print_err(out, "held-out", held, tail);
        if (fit) {
            snprintf(tail, sizeof tail, " in %d sources (each predicted by a fit on the other fitting sources)", loso_src);
            print_err(out, "leave-one-source-out", loso, tail);
        }
    }
done:
    free(rows), free(srcs), free(fws), dt_val_eff_free(&eff);
    return st;
}
