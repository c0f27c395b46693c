/* Reading benchmark result files into the report model (see report.h). Every key the report
 * computes from is required; descriptive strings (argv, date, environment) are optional. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

const char *const dt_rep_breakdown_keys[DT_REP_BD_N] = {"forward", "backward", "optimizer",
                                                        "communication", "data", "idle"};
const char *const dt_rep_mem_keys[DT_REP_MEM_N] = {"params", "grads", "optimizer", "activations",
                                                   "comm", "other"};

#define DT_REP_MAX_FILE (256u << 20)

/* DT_CHECK for the readers below, whose context is j->ctx. */
#define JCHECK(expr)                                                                     \
    do {                                                                                 \
        dt_status js_ = (expr);                                                          \
        if (js_ != DT_OK) {                                                              \
            dt_ctx_trace(j->ctx, __FILE__, __LINE__);                                    \
            return js_;                                                                  \
        }                                                                                \
    } while (0)

/* Where a key lives, for messages: "summary.step_s" + "mean" -> "summary.step_s.mean". */
typedef struct jpath {
    dt_ctx *ctx;
    const char *file;
} jpath;

static void join(char *out, size_t n, const char *parent, const char *key) {
    if (parent && *parent)
        snprintf(out, n, "%s.%s", parent, key);
    else
        snprintf(out, n, "%s", key);
}

static dt_status missing(jpath *j, const char *parent, const char *key, const char *what) {
    char p[160];
    join(p, sizeof p, parent, key);
    return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' %s", j->file, p, what);
}

static dt_status get_item(jpath *j, const cJSON *o, const char *parent, const char *key,
                          const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*out) return missing(j, parent, key, "is missing");
    return DT_OK;
}

static dt_status need_obj(jpath *j, const cJSON *o, const char *parent, const char *key,
                          const cJSON **out) {
    JCHECK(get_item(j, o, parent, key, out));
    if (!cJSON_IsObject(*out)) return missing(j, parent, key, "must be an object");
    return DT_OK;
}

static dt_status need_arr(jpath *j, const cJSON *o, const char *parent, const char *key,
                          const cJSON **out) {
    JCHECK(get_item(j, o, parent, key, out));
    if (!cJSON_IsArray(*out)) return missing(j, parent, key, "must be an array");
    return DT_OK;
}

/* A number; with nullable, JSON null reads as NaN. */
static dt_status need_num_n(jpath *j, const cJSON *o, const char *parent, const char *key,
                            int nullable, double *out) {
    const cJSON *it;
    JCHECK(get_item(j, o, parent, key, &it));
    if (nullable && cJSON_IsNull(it)) {
        *out = NAN;
        return DT_OK;
    }
    if (!cJSON_IsNumber(it)) return missing(j, parent, key, "must be a number");
    *out = it->valuedouble;
    return DT_OK;
}

static dt_status need_num(jpath *j, const cJSON *o, const char *parent, const char *key,
                          double *out) {
    return need_num_n(j, o, parent, key, 0, out);
}

static dt_status need_int(jpath *j, const cJSON *o, const char *parent, const char *key, int *out) {
    double v;
    JCHECK(need_num(j, o, parent, key, &v));
    if (v != floor(v) || fabs(v) > 2e9) return missing(j, parent, key, "must be an integer");
    *out = (int)v;
    return DT_OK;
}

static dt_status need_bool(jpath *j, const cJSON *o, const char *parent, const char *key, int *out) {
    const cJSON *it;
    JCHECK(get_item(j, o, parent, key, &it));
    if (cJSON_IsBool(it))
        *out = cJSON_IsTrue(it);
    else if (cJSON_IsNumber(it))
        *out = it->valuedouble != 0;
    else
        return missing(j, parent, key, "must be true or false");
    return DT_OK;
}

static dt_status need_str(jpath *j, const cJSON *o, const char *parent, const char *key,
                          const char **out) {
    const cJSON *it;
    JCHECK(get_item(j, o, parent, key, &it));
    if (!cJSON_IsString(it)) return missing(j, parent, key, "must be a string");
    *out = it->valuestring;
    return DT_OK;
}

/* An optional number: `def` when absent, an error naming the key when not a number. */
static dt_status opt_num(jpath *j, const cJSON *o, const char *parent, const char *key, double def, double *out) {
    *out = def;
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) return DT_OK;
    return need_num(j, o, parent, key, out);
}

/* An optional whole number >= 1 (`def` when absent). */
static dt_status opt_count(jpath *j, const cJSON *o, const char *parent, const char *key, int def, int *out) {
    *out = def;
    if (!cJSON_GetObjectItemCaseSensitive(o, key)) return DT_OK;
    JCHECK(need_int(j, o, parent, key, out));
    if (*out < 1) return missing(j, parent, key, "must be >= 1");
    return DT_OK;
}

static const char *opt_str(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int opt_int(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(it) ? (int)it->valuedouble : 0;
}

/* A boolean config value (true, or a non-zero number; "true"), 0 when absent. */
static int cfg_bool(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsTrue(it) || (cJSON_IsNumber(it) && it->valuedouble != 0) ||
           (cJSON_IsString(it) && !strcmp(it->valuestring, "true"));
}

/* A string config value, or `def` when absent. */
static const char *cfg_str(const cJSON *o, const char *key, const char *def) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(it) ? it->valuestring : def;
}

/* "fp32"; "bf16, ckpt selective"; "fp16, ckpt full/2, grads bf16, top-k 1%" (dt_rep_train.precision). */
static void precision_label(const cJSON *config, char *buf, size_t n) {
    const char *ck = cfg_str(config, "memory.activation_checkpointing", "none");
    const char *gd = cfg_str(config, "parallel.grad_dtype", "fp32");
    int every = opt_int(config, "memory.activation_checkpointing_every");
    size_t len = (size_t)snprintf(buf, n, "%s", cfg_str(config, "training.precision", "fp32"));
    if (strcmp(ck, "none") && len < n)
        len += (size_t)snprintf(buf + len, n - len, ", ckpt %s%s", ck, every > 1 ? "/" : "");
    if (strcmp(ck, "none") && every > 1 && len < n) len += (size_t)snprintf(buf + len, n - len, "%d", every);
    if (strcmp(gd, "fp32") && len < n) len += (size_t)snprintf(buf + len, n - len, ", grads %s", gd);
    const cJSON *ratio = cJSON_GetObjectItemCaseSensitive(config, "parallel.compression_ratio");
    if (!strcmp(cfg_str(config, "parallel.compression", "none"), "topk") && len < n)
        snprintf(buf + len, n - len, ", top-k %g%%", cJSON_IsNumber(ratio) ? 100.0 * ratio->valuedouble : 1.0);
}

/* An array of numbers into a fresh double array. */
static dt_status need_nums(jpath *j, const cJSON *o, const char *parent, const char *key,
                           double **out, int *n) {
    const cJSON *a, *e;
    JCHECK(need_arr(j, o, parent, key, &a));
    *n = cJSON_GetArraySize(a);
    *out = calloc((size_t)(*n > 0 ? *n : 1), sizeof **out);
    if (!*out) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    int i = 0;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e)) {
            char p[160], k[192];
            join(p, sizeof p, parent, key);
            snprintf(k, sizeof k, "%s[%d]", p, i);
            return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be a number", j->file, k);
        }
        (*out)[i++] = e->valuedouble;
    }
    return DT_OK;
}

static dt_status read_stat(jpath *j, const cJSON *summary, const char *key, dt_rep_stat *s) {
    const cJSON *o;
    char p[64];
    /* mfu is null without a peak (and tflops may be too): every statistic reads as NaN */
    int nullable = !strcmp(key, "mfu") || !strcmp(key, "tflops_rank");
    o = cJSON_GetObjectItemCaseSensitive(summary, key);
    if (nullable && cJSON_IsNull(o)) {
        s->mean = s->std = s->min = s->median = s->max = NAN;
        return DT_OK;
    }
    JCHECK(need_obj(j, summary, "summary", key, &o));
    snprintf(p, sizeof p, "summary.%s", key);
    JCHECK(need_num_n(j, o, p, "mean", nullable, &s->mean));
    JCHECK(need_num_n(j, o, p, "std", nullable, &s->std));
    JCHECK(need_num_n(j, o, p, "min", nullable, &s->min));
    JCHECK(need_num_n(j, o, p, "median", nullable, &s->median));
    JCHECK(need_num_n(j, o, p, "max", nullable, &s->max));
    return DT_OK;
}

static void read_env(const cJSON *e, dt_rep_env *env) {
    env->host = opt_str(e, "host");
    env->cpu_model = opt_str(e, "cpu_model");
    env->mpi = opt_str(e, "mpi");
    env->onednn = opt_str(e, "onednn");
    env->compiler = opt_str(e, "compiler");
    env->cores = opt_int(e, "cores");
    env->threads = opt_int(e, "threads");
    env->ranks = opt_int(e, "ranks");
    env->nodes = opt_int(e, "nodes");
}

static dt_status read_model_parallel(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *m, *p;
    JCHECK(need_obj(j, root, "", "model", &m));
    JCHECK(need_str(j, m, "model", "preset", &t->preset));
    JCHECK(need_int(j, m, "model", "n_layer", &t->n_layer));
    JCHECK(need_int(j, m, "model", "d_model", &t->d_model));
    JCHECK(need_int(j, m, "model", "n_head", &t->n_head));
    JCHECK(need_int(j, m, "model", "vocab", &t->vocab));
    JCHECK(need_int(j, m, "model", "seq_len", &t->seq_len));
    JCHECK(need_num(j, m, "model", "params", &t->params));
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(m, "trainable_params");
    if (tp && !cJSON_IsNumber(tp)) return missing(j, "model", "trainable_params", "must be a number");
    t->trainable = tp ? tp->valuedouble : t->params;
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(m, "lora");
    if (lo) {
        const char *bd = opt_str(lo, "base_dtype");
        int rank = opt_int(lo, "rank");
        if (rank < 1) return missing(j, "model.lora", "rank", "must be an integer >= 1");
        snprintf(t->lora, sizeof t->lora, "LoRA r%d, %s", rank, bd ? bd : "fp32");
    }
    /* Optional (files of earlier versions lack it): an image model's samples are images. */
    t->n_classes = opt_int(cJSON_GetObjectItemCaseSensitive(root, "config"), "model.n_classes");
    precision_label(cJSON_GetObjectItemCaseSensitive(root, "config"), t->precision, sizeof t->precision);
    JCHECK(need_obj(j, root, "", "parallel", &p));
    JCHECK(need_int(j, p, "parallel", "world", &t->world));
    if (t->world < 1) return missing(j, "parallel", "world", "must be >= 1");
    JCHECK(need_str(j, p, "parallel", "strategy", &t->strategy));
    JCHECK(need_bool(j, p, "parallel", "hybrid", &t->hybrid));
    JCHECK(need_num(j, p, "parallel", "bucket_bytes", &t->bucket_bytes));
    JCHECK(need_bool(j, p, "parallel", "overlap", &t->overlap));
    JCHECK(need_int(j, p, "parallel", "micro_batch", &t->micro_batch));
    JCHECK(need_int(j, p, "parallel", "accum", &t->accum));
    JCHECK(need_int(j, p, "parallel", "global_batch", &t->global_batch));
    /* the layout (files of earlier versions: every rank data-parallel) */
    JCHECK(opt_count(j, p, "parallel", "tp", 1, &t->tp));
    JCHECK(opt_count(j, p, "parallel", "dp", t->world, &t->dp));
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    t->sp = t->tp > 1 && cfg_bool(cfg, "parallel.sequence_parallel");
    t->tp_blocks = t->tp > 1 && cfg_bool(cfg, "parallel.tp_blocks");
    return DT_OK;
}

static dt_status read_runs(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *runs, *e;
    JCHECK(need_arr(j, root, "", "runs", &runs));
    int n = cJSON_GetArraySize(runs);
    t->rep = calloc((size_t)(n > 0 ? n : 1), sizeof *t->rep);
    if (!t->rep) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    t->nrep = n;
    int i = 0;
    cJSON_ArrayForEach(e, runs) {
        char p[32];
        snprintf(p, sizeof p, "runs[%d]", i);
        dt_rep_repeat *r = &t->rep[i++];
        if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
        JCHECK(need_nums(j, e, p, "step_s", &r->step_s, &r->nsteps));
        JCHECK(need_nums(j, e, p, "loss", &r->loss, &r->nloss));
        JCHECK(need_str(j, e, p, "loss_hash", &r->loss_hash));
    }
    return DT_OK;
}

static dt_status read_summary(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *s, *b;
    JCHECK(need_obj(j, root, "", "summary", &s));
    JCHECK(read_stat(j, s, "step_s", &t->step_s));
    JCHECK(read_stat(j, s, "samples_per_s", &t->samples_per_s));
    JCHECK(read_stat(j, s, "tokens_per_s", &t->tokens_per_s));
    JCHECK(read_stat(j, s, "tokens_per_s_rank", &t->tokens_per_s_rank));
    JCHECK(read_stat(j, s, "tflops_rank", &t->tflops_rank));
    JCHECK(read_stat(j, s, "mfu", &t->mfu));
    JCHECK(need_num(j, s, "summary", "comm_total_s", &t->comm_total_s));
    JCHECK(need_num(j, s, "summary", "comm_exposed_s", &t->comm_exposed_s));
    JCHECK(need_num(j, s, "summary", "comm_overhead", &t->comm_overhead));
    JCHECK(need_num(j, s, "summary", "comm_bytes_step", &t->comm_bytes_step));
    JCHECK(opt_num(j, s, "summary", "tp_comm_s", 0, &t->tp_comm_s));
    JCHECK(opt_num(j, s, "summary", "tp_bytes_step", 0, &t->tp_bytes_step));
    if (t->tp_comm_s < 0) return missing(j, "summary", "tp_comm_s", "must be >= 0");
    if (t->tp_bytes_step < 0) return missing(j, "summary", "tp_bytes_step", "must be >= 0");
    JCHECK(need_obj(j, s, "summary", "breakdown_s", &b));
    for (int k = 0; k < DT_REP_BD_N; k++)
        JCHECK(need_num(j, b, "summary.breakdown_s", dt_rep_breakdown_keys[k], &t->breakdown[k]));
    JCHECK(need_num(j, s, "summary", "loss_avg", &t->loss_avg));
    JCHECK(need_num(j, s, "summary", "loss_final", &t->loss_final));
    JCHECK(need_str(j, s, "summary", "loss_hash", &t->loss_hash));
    return DT_OK;
}

static dt_status read_memory(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *a, *e;
    JCHECK(need_arr(j, root, "", "memory", &a));
    t->nmem = cJSON_GetArraySize(a);
    t->mem = calloc((size_t)(t->nmem > 0 ? t->nmem : 1), sizeof *t->mem);
    if (!t->mem) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    int i = 0;
    cJSON_ArrayForEach(e, a) {
        char p[32];
        snprintf(p, sizeof p, "memory[%d]", i);
        dt_rep_mem *m = &t->mem[i++];
        if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
        JCHECK(need_int(j, e, p, "rank", &m->rank));
        for (int k = 0; k < DT_REP_MEM_N; k++) {
            /* "comm" is newer than the other kinds: files without it held those buffers in "other". */
            if (k == DT_REP_MEM_COMM && !cJSON_GetObjectItemCaseSensitive(e, dt_rep_mem_keys[k])) continue;
            JCHECK(need_num(j, e, p, dt_rep_mem_keys[k], &m->bytes[k]));
        }
        JCHECK(need_num(j, e, p, "rss", &m->rss));
        /* "plan" is newer than the kinds: absent in older files. */
        m->plan = -1;
        if (cJSON_GetObjectItemCaseSensitive(e, "plan")) JCHECK(need_num(j, e, p, "plan", &m->plan));
    }
    return DT_OK;
}

/* "ranks" (optional: files of earlier versions lack it): compute time per step per rank. */
static dt_status read_ranks(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "ranks"), *e;
    const cJSON *cf = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "config"),
                                                       "logging.straggler_factor");
    t->straggler_factor = cJSON_IsNumber(cf) && cf->valuedouble > 1 ? cf->valuedouble : 1.5;
    if (!a || cJSON_IsNull(a)) return DT_OK;
    if (!cJSON_IsArray(a)) return missing(j, "", "ranks", "must be an array");
    t->ncompute = cJSON_GetArraySize(a);
    t->compute_ms = calloc((size_t)(t->ncompute > 0 ? t->ncompute : 1), sizeof *t->compute_ms);
    if (!t->compute_ms) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    int i = 0;
    cJSON_ArrayForEach(e, a) {
        char p[32];
        snprintf(p, sizeof p, "ranks[%d]", i);
        if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
        JCHECK(need_num(j, e, p, "compute_ms", &t->compute_ms[i]));
        i++;
    }
    return DT_OK;
}

/* A mixture of experts' expert load (optional "moe": ARCHITECTURE decision 86): moe.load, L
 * rows of E finite counts >= 0, and moe.load_max_mean. */
static dt_status read_moe(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(root, "moe"), *a, *row, *x;
    if (!mo) return DT_OK;
    if (!cJSON_IsObject(mo)) return missing(j, "", "moe", "must be an object");
    JCHECK(need_arr(j, mo, "moe", "load", &a));
    JCHECK(need_num(j, mo, "moe", "load_max_mean", &t->moe_max_mean));
    const int L = cJSON_GetArraySize(a);
    const cJSON *r0 = cJSON_GetArrayItem(a, 0);
    const int E = cJSON_IsArray(r0) ? cJSON_GetArraySize(r0) : 0;
    if (L < 1 || L > 1024 || E < 1 || E > 64)
        return missing(j, "moe", "load", "must be 1..1024 rows (layers) of 1..64 numbers (experts)");
    t->moe_load = calloc((size_t)L * E, sizeof *t->moe_load);
    if (!t->moe_load) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    t->moe_layers = L, t->moe_experts = E;
    int l = 0;
    cJSON_ArrayForEach(row, a) {
        int e = 0;
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != E)
            return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key 'moe.load[%d]' must be an array of %d numbers", j->file, l, E);
        cJSON_ArrayForEach(x, row) {
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
                return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key 'moe.load[%d][%d]' must be a finite number >= 0", j->file,
                               l, e);
            t->moe_load[(size_t)l * E + e++] = x->valuedouble;
        }
        l++;
    }
    return DT_OK;
}

static dt_status read_cost(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "cost"), *e;
    if (!a || cJSON_IsNull(a)) return DT_OK; /* optional */
    if (!cJSON_IsArray(a)) return missing(j, "", "cost", "must be an array");
    t->ncost = cJSON_GetArraySize(a);
    t->cost = calloc((size_t)(t->ncost > 0 ? t->ncost : 1), sizeof *t->cost);
    if (!t->cost) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    int i = 0;
    cJSON_ArrayForEach(e, a) {
        char p[32];
        snprintf(p, sizeof p, "cost[%d]", i);
        dt_rep_cost *c = &t->cost[i++];
        if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
        JCHECK(need_str(j, e, p, "instance", &c->instance));
        JCHECK(need_num(j, e, p, "price_hour", &c->price_hour));
        JCHECK(need_num_n(j, e, p, "spot_hour", 1, &c->spot_hour));
        JCHECK(need_num(j, e, p, "usd_per_1k_samples", &c->usd_per_1k_samples));
        JCHECK(need_num(j, e, p, "usd_per_1b_tokens", &c->usd_per_1b_tokens));
        JCHECK(need_num_n(j, e, p, "hours_to_train", 1, &c->hours_to_train));
        JCHECK(need_num_n(j, e, p, "usd_to_train", 1, &c->usd_to_train));
        JCHECK(need_num_n(j, e, p, "spot_usd_to_train", 1, &c->spot_usd_to_train));
    }
    return DT_OK;
}

static dt_status read_sweep(jpath *j, const cJSON *root, dt_rep_train *t) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "sweep");
    t->weak_eff = t->strong_eff = NAN;
    if (!s || cJSON_IsNull(s)) return DT_OK; /* optional */
    if (!cJSON_IsObject(s)) return missing(j, "", "sweep", "must be an object");
    t->has_sweep = 1;
    t->sweep_id = opt_str(s, "id");
    JCHECK(need_num_n(j, s, "sweep", "weak_efficiency", 1, &t->weak_eff));
    JCHECK(need_num_n(j, s, "sweep", "strong_efficiency", 1, &t->strong_eff));
    return DT_OK;
}

static void join_argv(const cJSON *a, char *out, size_t n) {
    const cJSON *e;
    size_t len = 0;
    out[0] = 0;
    if (!cJSON_IsArray(a)) return;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsString(e)) continue;
        int w = snprintf(out + len, n - len, "%s%s", len ? " " : "", e->valuestring);
        if (w < 0 || (size_t)w >= n - len) break; /* truncated: keep what fits */
        len += (size_t)w;
    }
}

static dt_status read_train(jpath *j, const cJSON *root, dt_rep_train *t) {
    t->file = j->file;
    t->date = opt_str(root, "date");
    t->version = opt_str(root, "dtrain_version");
    join_argv(cJSON_GetObjectItemCaseSensitive(root, "argv"), t->argv, sizeof t->argv);
    const cJSON *env;
    JCHECK(need_obj(j, root, "", "environment", &env));
    read_env(env, &t->env);
    t->config = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (t->config && !cJSON_IsObject(t->config)) return missing(j, "", "config", "must be an object");
    JCHECK(read_model_parallel(j, root, t));
    JCHECK(need_num_n(j, root, "", "peak_gflops", 1, &t->peak_gflops));
    JCHECK(need_num_n(j, root, "", "flops_per_token", 1, &t->flops_per_token));
    t->peak_source = opt_str(root, "peak_source");
    t->mfu_formula = opt_str(root, "mfu_formula");
    JCHECK(need_int(j, root, "", "warmup", &t->warmup));
    JCHECK(need_int(j, root, "", "steps", &t->steps));
    JCHECK(need_int(j, root, "", "repeats", &t->repeats));
    JCHECK(read_runs(j, root, t));
    JCHECK(read_summary(j, root, t));
    JCHECK(read_memory(j, root, t));
    JCHECK(read_ranks(j, root, t));
    JCHECK(read_cost(j, root, t));
    JCHECK(read_moe(j, root, t));
    JCHECK(read_sweep(j, root, t));
    t->weak_calc = t->strong_calc = NAN;
    t->weak_base = t->strong_base = -1;
    return DT_OK;
}

static dt_status read_comm(jpath *j, const cJSON *root, dt_rep_comm *c) {
    const cJSON *env, *rows, *e;
    c->file = j->file;
    JCHECK(need_obj(j, root, "", "environment", &env));
    read_env(env, &c->env);
    JCHECK(need_int(j, root, "", "ranks", &c->ranks));
    JCHECK(need_arr(j, root, "", "rows", &rows));
    c->nrows = cJSON_GetArraySize(rows);
    c->rows = calloc((size_t)(c->nrows > 0 ? c->nrows : 1), sizeof *c->rows);
    if (!c->rows) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    int i = 0;
    cJSON_ArrayForEach(e, rows) {
        char p[32];
        double wrong;
        snprintf(p, sizeof p, "rows[%d]", i);
        dt_rep_comm_row *r = &c->rows[i++];
        if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
        JCHECK(need_str(j, e, p, "op", &r->op));
        JCHECK(need_num(j, e, p, "bytes", &r->bytes));
        JCHECK(need_num(j, e, p, "time_us", &r->time_us));
        JCHECK(need_num(j, e, p, "algbw_gbs", &r->algbw_gbs));
        JCHECK(need_num(j, e, p, "busbw_gbs", &r->busbw_gbs));
        JCHECK(need_num(j, e, p, "wrong", &wrong));
        r->wrong = (long long)wrong;
    }
    return DT_OK;
}

/* ---- plan files (dtrain plan --json) ------------------------------------------------ */

static dt_status read_plan_layout(jpath *j, const cJSON *e, const char *p, int gpus, dt_rep_plan_layout *l) {
    const cJSON *mem;
    if (!cJSON_IsObject(e)) return dt_fail(j->ctx, DT_ERR_FORMAT, "%s: key '%s' must be an object", j->file, p);
    JCHECK(need_str(j, e, p, "layout", &l->layout));
    JCHECK(need_str(j, e, p, "strategy", &l->strategy));
    JCHECK(need_bool(j, e, p, "hybrid", &l->hybrid));
    JCHECK(need_int(j, e, p, "dp", &l->dp));
    JCHECK(need_int(j, e, p, "tp", &l->tp));
    JCHECK(need_int(j, e, p, "pp", &l->pp));
    JCHECK(need_int(j, e, p, "micro_steps", &l->micro_steps));
    JCHECK(need_bool(j, e, p, "fits", &l->fits));
    l->gpus = gpus;
    if (cJSON_GetObjectItemCaseSensitive(e, "gpus")) JCHECK(need_int(j, e, p, "gpus", &l->gpus)); /* --sweep */
    char mp[64];
    snprintf(mp, sizeof mp, "%s.memory_bytes", p);
    JCHECK(need_obj(j, e, p, "memory_bytes", &mem));
    for (int k = 0; k < DT_REP_MEM_N; k++) JCHECK(need_num(j, mem, mp, dt_rep_mem_keys[k], &l->mem[k]));
    JCHECK(need_num(j, mem, mp, "total", &l->mem_total));
    static const char *const keys[] = {"step_s", "compute_s", "recompute_s", "bubble_s", "comm_exposed_s",
                                       "tokens_per_s", "tflops_per_gpu", "mfu", "scaling_efficiency",
                                       "usd_per_1k_samples"};
    double *dst[] = {&l->step_s,       &l->compute_s,      &l->recompute_s, &l->bubble_s,    &l->comm_exposed_s,
                     &l->tokens_per_s, &l->tflops_per_gpu, &l->mfu,         &l->scaling_eff, &l->usd_per_1k_samples};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) JCHECK(need_num_n(j, e, p, keys[k], 1, dst[k]));
    l->overhead_s = 0; /* plans written before decision 55 have no overhead term */
    if (cJSON_GetObjectItemCaseSensitive(e, "overhead_s")) JCHECK(need_num_n(j, e, p, "overhead_s", 1, &l->overhead_s));
    /* nor before decision 95 the time-sliced pipeline's gain (<= 0): taken off the bubble, and
       what exceeds the bubble off the compute (the stages' work ran faster), so the terms stay
       >= 0 and still add up to the step */
    double sliced = 0;
    if (cJSON_GetObjectItemCaseSensitive(e, "sliced_s")) JCHECK(need_num_n(j, e, p, "sliced_s", 1, &sliced));
    if (isfinite(sliced) && sliced < 0) {
        l->bubble_s += sliced;
        if (l->bubble_s < 0) l->compute_s += l->bubble_s, l->bubble_s = 0;
    }
    l->optimizer_s = 0; /* nor before decision 56 an optimizer term */
    if (cJSON_GetObjectItemCaseSensitive(e, "optimizer_s"))
        JCHECK(need_num_n(j, e, p, "optimizer_s", 1, &l->optimizer_s));
    return DT_OK;
}

/* 1 when the recommendation `rec` (an object or null) names layout l. */
static int plan_is(const cJSON *rec, const dt_rep_plan_layout *l) {
    const char *name = opt_str(rec, "layout");
    return name && !strcmp(name, l->layout);
}

static dt_status read_plan(jpath *j, const cJSON *root, dt_rep_plan *pl) {
    const cJSON *job, *m, *eff, *lays;
    pl->file = j->file;
    JCHECK(need_obj(j, root, "", "job", &job));
    JCHECK(need_obj(j, job, "job", "model", &m));
    JCHECK(need_str(j, m, "job.model", "name", &pl->model));
    JCHECK(need_int(j, m, "job.model", "n_layer", &pl->n_layer));
    JCHECK(need_int(j, m, "job.model", "d_model", &pl->d_model));
    JCHECK(need_int(j, m, "job.model", "n_head", &pl->n_head));
    JCHECK(need_num(j, m, "job.model", "params", &pl->params));
    JCHECK(need_int(j, job, "job", "micro_batch", &pl->micro_batch));
    JCHECK(need_int(j, job, "job", "seq_len", &pl->seq_len));
    JCHECK(need_int(j, job, "job", "gpus", &pl->gpus));
    JCHECK(need_str(j, job, "job", "precision", &pl->precision));
    JCHECK(need_str(j, job, "job", "checkpointing", &pl->checkpointing));
    JCHECK(need_str(j, job, "job", "hardware", &pl->hardware));
    pl->sp = 0; /* plans written before it: no sequence parallelism */
    if (cJSON_GetObjectItemCaseSensitive(job, "sequence_parallel"))
        JCHECK(need_bool(j, job, "job", "sequence_parallel", &pl->sp));
    JCHECK(need_num(j, job, "job", "peak_tflops", &pl->peak_tflops));
    JCHECK(need_obj(j, job, "job", "efficiency", &eff));
    JCHECK(need_num(j, eff, "job.efficiency", "gemm", &pl->eff_gemm));
    JCHECK(need_num(j, eff, "job.efficiency", "intra_link", &pl->eff_intra));
    JCHECK(need_num(j, eff, "job.efficiency", "inter_link", &pl->eff_inter));
    const char *key = cJSON_GetObjectItemCaseSensitive(root, "sweep") ? "sweep" : "layouts";
    JCHECK(need_arr(j, root, "", key, &lays));
    pl->nlay = cJSON_GetArraySize(lays);
    if (pl->nlay < 1) return missing(j, "", key, "has no layouts");
    pl->lay = calloc((size_t)pl->nlay, sizeof *pl->lay);
    if (!pl->lay) return dt_fail(j->ctx, DT_ERR_NOMEM, "%s: out of memory", j->file);
    const cJSON *e, *fast = cJSON_GetObjectItemCaseSensitive(root, "fastest"),
                   *cheap = cJSON_GetObjectItemCaseSensitive(root, "cheapest");
    int i = 0;
    cJSON_ArrayForEach(e, lays) {
        char p[40];
        snprintf(p, sizeof p, "%s[%d]", key, i);
        dt_rep_plan_layout *l = &pl->lay[i++];
        JCHECK(read_plan_layout(j, e, p, pl->gpus, l));
        l->fastest = plan_is(fast, l);
        l->cheapest = plan_is(cheap, l);
    }
    return DT_OK;
}

/* The first word of a run's precision label ("bf16, ckpt full" -> "bf16"). */
static int same_precision(const char *run, const char *plan) {
    size_t n = strcspn(run, ",");
    return strlen(plan) == n && !strncmp(run, plan, n);
}

int dt_report_match_plans(const dt_report *r, dt_rep_plan_match *out, int max) {
    int n = 0;
    for (int t = 0; t < r->ntrain && n < max; t++) {
        const dt_rep_train *x = &r->train[t];
        int found = 0;
        for (int p = 0; p < r->nplan && !found; p++) {
            const dt_rep_plan *pl = &r->plan[p];
            if (pl->n_layer != x->n_layer || pl->d_model != x->d_model || pl->n_head != x->n_head ||
                fabs(pl->params - x->params) > 0.5 || /* the family: gpt2-tiny and llama-tiny share a shape */
                pl->seq_len != x->seq_len || pl->micro_batch != x->micro_batch || !same_precision(x->precision, pl->precision) ||
                pl->sp != x->sp || x->tp_blocks)
                continue;
            for (int k = 0; k < pl->nlay && !found; k++) {
                const dt_rep_plan_layout *l = &pl->lay[k];
                if (l->gpus != x->world || l->tp != x->tp || l->pp != 1 || l->dp != x->dp || l->micro_steps != x->accum ||
                    strcmp(l->strategy, x->strategy) || l->hybrid != x->hybrid)
                    continue;
                double meas_mem = dt_report_peak_bytes(x, 0);
                out[n++] = (dt_rep_plan_match){t, p, k, l->step_s / x->step_s.mean - 1,
                                               meas_mem > 0 ? l->mem_total / meas_mem - 1 : NAN};
                found = 1;
            }
        }
    }
    return n;
}

dt_report *dt_report_new(void) { return calloc(1, sizeof(dt_report)); }

static void free_train(dt_rep_train *t) {
    for (int i = 0; i < t->nrep; i++) {
        free(t->rep[i].step_s);
        free(t->rep[i].loss);
    }
    free(t->rep);
    free(t->mem);
    free(t->compute_ms);
    free(t->cost);
    free(t->moe_load);
}

void dt_report_free(dt_report *r) {
    if (!r) return;
    for (int i = 0; i < r->ntrain; i++) free_train(&r->train[i]);
    for (int i = 0; i < r->ncomm; i++) free(r->comm[i].rows);
    for (int i = 0; i < r->nplan; i++) free(r->plan[i].lay);
    free(r->plan);
    for (int i = 0; i < r->nroots; i++) {
        cJSON_Delete(r->roots[i]);
        free(r->names[i]);
    }
    free(r->roots);
    free(r->names);
    free(r->train);
    free(r->comm);
    free(r->rec);
    free(r);
}

dt_status dt_report_add_text(dt_ctx *ctx, dt_report *r, const char *name, const char *text) {
    cJSON *root = cJSON_Parse(text);
    if (!root) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON", name);
    /* Keep the tree and a copy of the name: the model's strings point into them. */
    cJSON **roots = realloc(r->roots, (size_t)(r->nroots + 1) * sizeof *roots);
    if (roots) r->roots = roots;
    char **names = roots ? realloc(r->names, (size_t)(r->nroots + 1) * sizeof *names) : NULL;
    if (names) r->names = names;
    char *fname = names ? strdup(name) : NULL;
    if (!fname) {
        cJSON_Delete(root);
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", name);
    }
    r->roots[r->nroots] = root;
    r->names[r->nroots++] = fname;
    jpath j = {ctx, fname};
    if (!cJSON_IsObject(root)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a JSON object", name);
    const char *schema, *kind;
    DT_CHECK(need_str(&j, root, "", "schema", &schema));
    DT_CHECK(need_str(&j, root, "", "kind", &kind));
    if (!strcmp(schema, "dtrain-plan/1")) {
        if (strcmp(kind, "plan"))
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'kind' is '%s', expected 'plan' (schema dtrain-plan/1)", name, kind);
        dt_rep_plan *pl = realloc(r->plan, (size_t)(r->nplan + 1) * sizeof *pl);
        if (!pl) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", name);
        r->plan = pl;
        pl = &r->plan[r->nplan++];
        memset(pl, 0, sizeof *pl);
        return read_plan(&j, root, pl);
    }
    if (strcmp(schema, "dtrain-bench/1"))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'schema' is '%s', expected 'dtrain-bench/1' or 'dtrain-plan/1'",
                       name, schema);
    if (!strcmp(kind, "train")) {
        dt_rep_train *t = realloc(r->train, (size_t)(r->ntrain + 1) * sizeof *t);
        if (!t) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", name);
        r->train = t;
        t = &r->train[r->ntrain++];
        memset(t, 0, sizeof *t);
        return read_train(&j, root, t);
    }
    if (!strcmp(kind, "comm")) {
        dt_rep_comm *c = realloc(r->comm, (size_t)(r->ncomm + 1) * sizeof *c);
        if (!c) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", name);
        r->comm = c;
        c = &r->comm[r->ncomm++];
        memset(c, 0, sizeof *c);
        return read_comm(&j, root, c);
    }
    return dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'kind' is '%s', expected 'train' or 'comm'", name, kind);
}

static dt_status read_file(dt_ctx *ctx, const char *path, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
        if (len + 1 == cap) {
            if (cap >= DT_REP_MAX_FILE) {
                free(buf);
                fclose(f);
                return dt_fail(ctx, DT_ERR_FORMAT, "%s: larger than %u MiB", path, DT_REP_MAX_FILE >> 20);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    if (err) {
        free(buf);
        return dt_fail(ctx, DT_ERR_IO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    return DT_OK;
}

dt_status dt_report_load(dt_ctx *ctx, const char *const *paths, int n, dt_report **out) {
    dt_status st = DT_OK;
    char *text = NULL;
    dt_report *r = dt_report_new();
    *out = NULL;
    if (!r) return dt_fail(ctx, DT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        DT_CHECK_GOTO(read_file(ctx, paths[i], &text));
        DT_CHECK_GOTO(dt_report_add_text(ctx, r, paths[i], text));
        free(text);
        text = NULL;
    }
    *out = r;
    return DT_OK;
fail:
    free(text);
    dt_report_free(r);
    return st;
}
