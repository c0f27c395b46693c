/* Efficiencies and recommendations drawn from the loaded runs (see report.h). Every
 * recommendation quotes the numbers it rests on; a topic without comparable runs says so. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"

/* What two runs may differ in and still be compared (bits of `ignore`). */
enum {
    D_WORLD = 1 << 0,
    D_STRATEGY = 1 << 1, /* strategy and hybrid */
    D_BUCKET = 1 << 2,
    D_OVERLAP = 1 << 3,
    D_MICRO = 1 << 4,
    D_ACCUM = 1 << 5,
    D_GLOBAL = 1 << 6,
    D_LOSS = 1 << 7, /* warm-up and measured steps: only the losses depend on them */
    D_LAYOUT = 1 << 8, /* tensor-parallel degree, sequence parallelism, the blocks test mode */
};

/* Relative throughput differences below this are treated as noise (or 2 std, if larger). */
#define NOISE_REL 0.02
/* Losses of runs that should match may differ by summation order (ARCHITECTURE decision 14). */
#define LOSS_TOL 1e-5

/* Config keys that are described by the "parallel" object or do not change the measurement. */
static int config_key_ignored(const char *k) {
    static const char *const prefixes[] = {"parallel.", "logging.", "checkpoint."};
    static const char *const keys[] = {"training.micro_batch", "training.grad_accum", "training.batch",
                                       "training.eval_interval", "training.eval_batches", "data.val"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(k, prefixes[i], strlen(prefixes[i]))) return 1;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return 1;
    return 0;
}

/* Every key of a (not ignored) is in b with the same value. */
static int config_covers(const cJSON *a, const cJSON *b) {
    const cJSON *e;
    if (!a) return 1;
    cJSON_ArrayForEach(e, a) {
        if (!e->string || config_key_ignored(e->string)) continue;
        const cJSON *o = b ? cJSON_GetObjectItemCaseSensitive(b, e->string) : NULL;
        if (!o || !cJSON_Compare(e, o, 1)) return 0;
    }
    return 1;
}

static int streq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static int same(const dt_rep_train *a, const dt_rep_train *b, unsigned ignore) {
    if (!streq(a->preset, b->preset) || a->n_layer != b->n_layer || a->d_model != b->d_model ||
        a->n_head != b->n_head || a->vocab != b->vocab || a->seq_len != b->seq_len)
        return 0;
    if (!config_covers(a->config, b->config) || !config_covers(b->config, a->config)) return 0;
    if (!(ignore & D_WORLD) && a->world != b->world) return 0;
    if (!(ignore & D_LAYOUT) && (a->tp != b->tp || a->sp != b->sp || a->tp_blocks != b->tp_blocks)) return 0;
    if (!(ignore & D_STRATEGY) && (!streq(a->strategy, b->strategy) || a->hybrid != b->hybrid)) return 0;
    if (!(ignore & D_BUCKET) && a->bucket_bytes != b->bucket_bytes) return 0;
    if (!(ignore & D_OVERLAP) && a->overlap != b->overlap) return 0;
    if (!(ignore & D_MICRO) && a->micro_batch != b->micro_batch) return 0;
    if (!(ignore & D_ACCUM) && a->accum != b->accum) return 0;
    if (!(ignore & D_GLOBAL) && a->global_batch != b->global_batch) return 0;
    if (!(ignore & D_LOSS) && (a->warmup != b->warmup || a->steps != b->steps)) return 0;
    return 1;
}

double dt_report_peak_bytes(const dt_rep_train *t, int model_only) {
    double best = 0;
    int nk = model_only ? DT_REP_MEM_ACTIVATIONS : DT_REP_MEM_N;
    for (int i = 0; i < t->nmem; i++) {
        double s = 0;
        for (int k = 0; k < nk; k++) s += t->mem[i].bytes[k];
        if (s > best) best = s;
    }
    return best;
}

double dt_report_peak_plan(const dt_rep_train *t) {
    double best = -1;
    for (int i = 0; i < t->nmem; i++)
        if (t->mem[i].plan > best) best = t->mem[i].plan;
    return best;
}

double dt_report_peak_rss(const dt_rep_train *t) {
    double best = 0;
    for (int i = 0; i < t->nmem; i++)
        if (t->mem[i].rss > best) best = t->mem[i].rss;
    return best;
}

static double peak_kind(const dt_rep_train *t, int kind) {
    double best = 0;
    for (int i = 0; i < t->nmem; i++)
        if (t->mem[i].bytes[kind] > best) best = t->mem[i].bytes[kind];
    return best;
}

static double tps(const dt_rep_train *t) { return t->tokens_per_s.mean; }

/* Relative noise of a comparison: 2%, or twice the larger relative std. */
static double noise(const dt_rep_train *a, const dt_rep_train *b) {
    double n = NOISE_REL;
    if (tps(a) > 0 && 2 * a->tokens_per_s.std / tps(a) > n) n = 2 * a->tokens_per_s.std / tps(a);
    if (tps(b) > 0 && 2 * b->tokens_per_s.std / tps(b) > n) n = 2 * b->tokens_per_s.std / tps(b);
    return n;
}

/* Appends a formatted string to buf (of size n) at its end. */
static void cat(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *buf, size_t n, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

static dt_rep_rec *add_rec(dt_report *r, dt_rep_topic topic, dt_rep_level level) {
    if (r->nrec == r->caprec) {
        int cap = r->caprec ? 2 * r->caprec : 8;
        dt_rep_rec *nr = realloc(r->rec, (size_t)cap * sizeof *nr);
        if (!nr) return NULL;
        r->rec = nr;
        r->caprec = cap;
    }
    dt_rep_rec *x = &r->rec[r->nrec++];
    x->topic = topic;
    x->level = level;
    x->text[0] = 0;
    return x;
}

#define REC(topic, level)                                                                          \
    dt_rep_rec *rec = add_rec(r, topic, level);                                                    \
    if (!rec) return;                                                                              \
    char *tx = rec->text;                                                                          \
    const size_t txn = sizeof rec->text

static void mib(char *b, size_t n, double bytes) { dt_report_fmt_bytes(b, n, bytes); }

/* ---- efficiency ---------------------------------------------------------------------- */

/* Baseline preference: same strategy, then DDP, then any; same micro-batch for strong. */
static int base_score(const dt_rep_train *t, const dt_rep_train *b) {
    return (streq(b->strategy, t->strategy) ? 4 : 0) + (streq(b->strategy, "ddp") ? 2 : 0) +
           (b->micro_batch == t->micro_batch ? 1 : 0);
}

static void compute_efficiency(dt_report *r) {
    for (int i = 0; i < r->ntrain; i++) {
        dt_rep_train *t = &r->train[i];
        int wb = -1, sb = -1, ws = -1, ss = -1;
        if (t->world <= 1) continue;
        for (int j = 0; j < r->ntrain; j++) {
            const dt_rep_train *b = &r->train[j];
            if (b->world != 1 || tps(b) <= 0) continue;
            unsigned ign = D_WORLD | D_STRATEGY | D_BUCKET | D_OVERLAP | D_LOSS;
            if (same(t, b, ign | D_GLOBAL) && base_score(t, b) > ws) { /* weak: per-rank batch */
                wb = j;
                ws = base_score(t, b);
            }
            if (same(t, b, ign | D_MICRO | D_ACCUM) && base_score(t, b) > ss) { /* strong */
                sb = j;
                ss = base_score(t, b);
            }
        }
        t->weak_base = wb;
        t->strong_base = sb;
        if (wb >= 0) t->weak_calc = tps(t) / (t->world * tps(&r->train[wb]));
        if (sb >= 0) t->strong_calc = tps(t) / (t->world * tps(&r->train[sb]));
    }
}

/* ---- DDP vs ZeRO ---------------------------------------------------------------------- */

static int is_zero(const char *s) { return s && !strncmp(s, "zero", 4); }

static void rec_strategy(dt_report *r, double budget) {
    /* The DDP run at the largest world size that has ZeRO runs differing only in strategy. */
    int d = -1, nz = 0, z[16];
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        if (!streq(t->strategy, "ddp") || t->world < 2 || (d >= 0 && t->world <= r->train[d].world)) continue;
        int n = 0, zi[16];
        for (int j = 0; j < r->ntrain && n < 16; j++)
            if (is_zero(r->train[j].strategy) && same(t, &r->train[j], D_STRATEGY | D_LOSS)) zi[n++] = j;
        if (n) {
            d = i;
            nz = n;
            memcpy(z, zi, sizeof zi);
        }
    }
    if (d < 0) {
        REC(DT_REP_TOPIC_STRATEGY, DT_REP_NODATA);
        snprintf(tx, txn, "Not enough data for DDP vs ZeRO: this needs a DDP run and ZeRO runs at the same "
                          "world size (> 1) that differ only in parallel.strategy.");
        return;
    }
    const dt_rep_train *D = &r->train[d];
    double md = dt_report_peak_bytes(D, 0), ms = dt_report_peak_bytes(D, 1);
    double act = peak_kind(D, DT_REP_MEM_ACTIVATIONS);
    char a[32], b[32], c[32], details[512] = "";
    /* the facts behind every verdict: each stage's saving and slowdown against DDP */
    int best_free = -1, fastest = -1;
    double best_saved = 0, fastest_tps = tps(D);
    for (int k = 0; k < nz; k++) {
        const dt_rep_train *Z = &r->train[z[k]];
        double saved = md - dt_report_peak_bytes(Z, 0);
        double slow = tps(Z) > 0 ? tps(D) / tps(Z) - 1 : INFINITY;
        mib(a, sizeof a, saved);
        cat(details, sizeof details, "%s%s saves %s/rank (%.0f%%) at %.1f%% %s throughput (%.0f vs %.0f tokens/s)",
            k ? "; " : "", Z->strategy, a, md > 0 ? 100 * saved / md : 0, fabs(100 * slow),
            slow >= 0 ? "lower" : "higher", tps(Z), tps(D));
        if (slow <= noise(D, Z) && saved > best_saved) {
            best_saved = saved;
            best_free = z[k];
        }
        if (budget > 0 && dt_report_peak_bytes(Z, 0) <= budget && tps(Z) > fastest_tps && md > budget) {
            fastest_tps = tps(Z);
            fastest = z[k];
        }
    }
    mib(a, sizeof a, md);
    mib(b, sizeof b, ms);
    if (budget > 0) {
        mib(c, sizeof c, budget);
        if (md <= 0.8 * budget) {
            REC(DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND);
            snprintf(tx, txn, "Use DDP at %d ranks: its peak of %s/rank (model state %s) is %.0f%% of the %s "
                              "budget, so sharding buys nothing needed. %s.", D->world, a, b, 100 * md / budget, c, details);
        } else {
            /* fastest stage that fits; DDP counts if it fits at all */
            int pick = md <= budget ? d : fastest;
            for (int k = 0; k < nz && pick < 0; k++)
                if (dt_report_peak_bytes(&r->train[z[k]], 0) <= budget) pick = z[k];
            if (pick < 0) {
                REC(DT_REP_TOPIC_STRATEGY, DT_REP_WARNING);
                snprintf(tx, txn, "No measured strategy fits the %s budget at %d ranks (DDP needs %s/rank). %s. "
                                  "Reduce the micro-batch (activations: %.0f MiB/rank) or add ranks.",
                         c, D->world, a, details, act / 1048576.0);
            } else {
                const dt_rep_train *P = &r->train[pick];
                char pb[32];
                mib(pb, sizeof pb, dt_report_peak_bytes(P, 0));
                REC(DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND);
                snprintf(tx, txn, "Use %s at %d ranks: DDP's peak of %s/rank is over 80%% of the %s budget; %s "
                                  "needs %s/rank. %s.", P->strategy, D->world, a, c, P->strategy, pb, details);
            }
        }
    } else if (best_free >= 0) {
        REC(DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND);
        mib(c, sizeof c, best_saved);
        snprintf(tx, txn, "Use %s at %d ranks: it saves %s/rank against DDP's %s at no measurable throughput cost "
                          "(within noise). %s.", r->train[best_free].strategy, D->world, c, a, details);
    } else {
        REC(DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND);
        snprintf(tx, txn, "Use DDP at %d ranks if its peak of %s/rank (model state %s) fits: it is the fastest. "
                          "%s. Pick the least sharded stage whose saving makes the model fit "
                          "(dtrain report --mem-budget decides this).", D->world, a, b, details);
    }
    if (md > 0 && act >= 0.5 * md) {
        REC(DT_REP_TOPIC_STRATEGY, DT_REP_INFO);
        mib(c, sizeof c, act);
        snprintf(tx, txn, "Activations are %s of DDP's %s per rank (%.0f%%); ZeRO shards only the model state "
                          "(%s), so a smaller micro-batch saves more memory than a higher ZeRO stage.",
                 c, a, 100 * act / md, b);
    }
}

/* ---- bucket size ----------------------------------------------------------------------- */

/* Sorts indices by key[index] (insertion sort: the groups are small). */
static void sort_by(int *idx, int n, const double *key) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && key[idx[j - 1]] > key[idx[j]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
}

/* The largest group of runs that differ only in the dimensions `vary` (and at least `min`
 * distinct values of `key`); writes its members sorted by key, returns its size. */
static int largest_group(const dt_report *r, unsigned vary, const double *key, int world_min, int *out) {
    int best = 0;
    int *g = malloc((size_t)(r->ntrain ? r->ntrain : 1) * sizeof *g);
    if (!g) return 0;
    for (int i = 0; i < r->ntrain; i++) {
        if (r->train[i].world < world_min) continue;
        int n = 0, distinct = 0;
        for (int j = 0; j < r->ntrain; j++) {
            if (!same(&r->train[i], &r->train[j], vary | D_LOSS)) continue;
            int dup = 0;
            for (int k = 0; k < n; k++) dup |= key[g[k]] == key[j];
            if (dup) continue; /* one run per key value */
            g[n++] = j;
            distinct++;
        }
        if (distinct >= 2 && n > best) {
            best = n;
            memcpy(out, g, (size_t)n * sizeof *g);
        }
    }
    free(g);
    sort_by(out, best, key);
    return best;
}

static void rec_bucket(dt_report *r) {
    int n = r->ntrain, *g = malloc((size_t)(n ? n : 1) * sizeof *g);
    double *key = malloc((size_t)(n ? n : 1) * sizeof *key);
    if (!g || !key) goto done;
    for (int i = 0; i < n; i++) key[i] = r->train[i].bucket_bytes;
    int m = largest_group(r, D_BUCKET, key, 2, g);
    char a[32], b[32];
    if (m >= 2) {
        int best = g[0], worst = g[0];
        char list[384] = "";
        for (int k = 0; k < m; k++) {
            const dt_rep_train *t = &r->train[g[k]];
            mib(a, sizeof a, t->bucket_bytes);
            cat(list, sizeof list, "%s%s: %.0f tokens/s (exposed comm %.1f%%)", k ? ", " : "", a, tps(t),
                100 * t->comm_overhead);
            if (tps(t) > tps(&r->train[best])) best = g[k];
            if (tps(t) < tps(&r->train[worst])) worst = g[k];
        }
        const dt_rep_train *B = &r->train[best], *W = &r->train[worst];
        double gain = tps(W) > 0 ? tps(B) / tps(W) - 1 : 0;
        mib(a, sizeof a, B->bucket_bytes);
        REC(DT_REP_TOPIC_BUCKET, DT_REP_RECOMMEND);
        if (gain <= noise(B, W)) {
            mib(b, sizeof b, r->train[g[0]].bucket_bytes);
            snprintf(tx, txn, "Bucket size hardly matters here (%s %s x%d): throughput varies by %.1f%%, within noise "
                              "(%s); keep the smallest, %s (least scratch memory).",
                     B->strategy, B->preset, B->world, 100 * gain, list, b);
        } else {
            snprintf(tx, txn, "Use %s buckets (parallel.bucket_mb) for %s %s x%d: %.1f%% more throughput than the "
                              "worst size (%s).", a, B->strategy, B->preset, B->world, 100 * gain, list);
        }
        goto done;
    }
    /* no bucket sweep: judge from the exposed communication of multi-rank runs */
    int worst = -1;
    for (int i = 0; i < n; i++)
        if (r->train[i].world > 1 && (worst < 0 || r->train[i].comm_overhead > r->train[worst].comm_overhead))
            worst = i;
    if (worst < 0) {
        REC(DT_REP_TOPIC_BUCKET, DT_REP_NODATA);
        snprintf(tx, txn, "Not enough data for a bucket size: no multi-rank run (bucket size matters only with "
                          "communication), and no runs differing only in bucket size.");
        goto done;
    }
    const dt_rep_train *W = &r->train[worst];
    mib(a, sizeof a, W->bucket_bytes);
    REC(DT_REP_TOPIC_BUCKET, DT_REP_RECOMMEND);
    if (W->comm_overhead < 0.05)
        snprintf(tx, txn, "Keep the bucket size (%s): communication is hidden behind compute — at most %.1f%% of the "
                          "step is exposed (%s, %.1f of %.1f ms of communication per step exposed). No runs differ only "
                          "in bucket size, so no size was compared.", a, 100 * W->comm_overhead, W->label,
                 1e3 * W->comm_exposed_s, 1e3 * W->comm_total_s);
    else
        snprintf(tx, txn, "Tune the bucket size: %.1f%% of the step is exposed communication in %s (%.1f of %.1f ms "
                          "per step, buckets of %s%s). Sweep parallel.bucket_mb (larger buckets pay fewer latencies, "
                          "smaller ones start overlapping earlier); no runs differ only in bucket size yet.",
                 100 * W->comm_overhead, W->label, 1e3 * W->comm_exposed_s, 1e3 * W->comm_total_s, a,
                 W->overlap ? "" : ", overlap off: turn parallel.overlap on first");
done:
    free(g);
    free(key);
}

/* ---- micro-batch vs accumulation ---------------------------------------------------- */

static void rec_micro(dt_report *r, double budget) {
    int n = r->ntrain, *g = malloc((size_t)(n ? n : 1) * sizeof *g);
    double *key = malloc((size_t)(n ? n : 1) * sizeof *key);
    if (!g || !key) goto done;
    for (int i = 0; i < n; i++) key[i] = r->train[i].micro_batch;
    /* same global batch (micro-batch traded for accumulation) first, else any */
    int same_global = 1, m = largest_group(r, D_MICRO | D_ACCUM, key, 1, g);
    if (m < 2) {
        same_global = 0;
        m = largest_group(r, D_MICRO | D_ACCUM | D_GLOBAL, key, 1, g);
    }
    if (m < 2) {
        REC(DT_REP_TOPIC_MICROBATCH, DT_REP_NODATA);
        snprintf(tx, txn, "Not enough data for micro-batch vs accumulation: this needs runs that differ only in "
                          "training.micro_batch (and grad_accum).");
        goto done;
    }
    char list[384] = "", a[32], b[32];
    int best = -1;
    for (int k = 0; k < m; k++) {
        const dt_rep_train *t = &r->train[g[k]];
        mib(a, sizeof a, dt_report_peak_bytes(t, 0));
        cat(list, sizeof list, "%smicro %d x accum %d: %.0f tokens/s, %s/rank", k ? "; " : "", t->micro_batch,
            t->accum, tps(t), a);
        if (budget > 0 && dt_report_peak_bytes(t, 0) > budget) continue;
        if (best < 0 || tps(t) > tps(&r->train[best])) best = g[k];
    }
    if (best < 0) {
        REC(DT_REP_TOPIC_MICROBATCH, DT_REP_WARNING);
        mib(b, sizeof b, budget);
        snprintf(tx, txn, "No measured micro-batch fits the %s budget (%s).", b, list);
        goto done;
    }
    /* the smallest micro-batch that is within noise of the fastest saves activation memory */
    int pick = best;
    for (int k = 0; k < m; k++) {
        const dt_rep_train *t = &r->train[g[k]], *B = &r->train[best];
        if (t->micro_batch < r->train[pick].micro_batch && tps(t) >= tps(B) * (1 - noise(t, B)) &&
            dt_report_peak_bytes(t, 0) < dt_report_peak_bytes(B, 0) &&
            (budget <= 0 || dt_report_peak_bytes(t, 0) <= budget))
            pick = g[k];
    }
    const dt_rep_train *P = &r->train[pick], *B = &r->train[best], *S = &r->train[g[0]];
    REC(DT_REP_TOPIC_MICROBATCH, DT_REP_RECOMMEND);
    if (pick != best) {
        mib(a, sizeof a, dt_report_peak_bytes(B, 0) - dt_report_peak_bytes(P, 0));
        snprintf(tx, txn, "Use micro-batch %d with %d accumulation step(s): within %.1f%% of the fastest (micro %d) "
                          "and %s/rank less memory (%s).%s", P->micro_batch, P->accum, 100 * (1 - tps(P) / tps(B)),
                 B->micro_batch, a, list, same_global ? "" : " (The global batch differs between these runs.)");
    } else if (P == S) {
        snprintf(tx, txn, "Use micro-batch %d (%d accumulation step(s)): the smallest measured one is also the fastest "
                          "(%s).%s", P->micro_batch, P->accum, list,
                 same_global ? "" : " (The global batch differs between these runs.)");
    } else {
        /* Accumulation keeps a second gradient buffer, so the smaller micro-batch can cost
         * more memory, not less: say which. */
        double d = (double)dt_report_peak_bytes(P, 0) - (double)dt_report_peak_bytes(S, 0);
        mib(a, sizeof a, d >= 0 ? d : -d);
        snprintf(tx, txn, "Use micro-batch %d with %d accumulation step(s): %.1f%% more throughput than micro %d %s "
                          "%s/rank %s memory (%s).%s", P->micro_batch, P->accum,
                 tps(S) > 0 ? 100 * (tps(P) / tps(S) - 1) : 0, S->micro_batch, d >= 0 ? "for" : "and", a,
                 d >= 0 ? "more" : "less", list, same_global ? "" : " (The global batch differs between these runs.)");
    }
done:
    free(g);
    free(key);
}

/* ---- losses that should match ------------------------------------------------------ */

/* Largest relative difference of the first repeat's losses; INFINITY if lengths differ. */
static double loss_diff(const dt_rep_train *a, const dt_rep_train *b, int *at) {
    *at = -1;
    if (a->nrep < 1 || b->nrep < 1 || a->rep[0].nloss != b->rep[0].nloss || a->rep[0].nloss == 0) return INFINITY;
    double worst = 0;
    for (int s = 0; s < a->rep[0].nloss; s++) {
        double x = a->rep[0].loss[s], y = b->rep[0].loss[s];
        double d = fabs(x - y) / fmax(fabs(x), 1e-30);
        if (!(d <= worst)) {
            worst = d;
            *at = s;
        }
    }
    return worst;
}

/* "R3" of a label "R3 ddp x2 mb8". */
static const char *short_id(const dt_rep_train *t, char *buf, size_t n) {
    snprintf(buf, n, "%.*s", (int)strcspn(t->label, " "), t->label);
    return buf;
}

static void rec_loss(dt_report *r) {
    int pairs = 0, agree = 0, warned = 0;
    char ok[400] = "";
    for (int i = 0; i < r->ntrain; i++) {
        const dt_rep_train *t = &r->train[i];
        for (int k = 1; k < t->nrep; k++)
            if (!streq(t->rep[k].loss_hash, t->rep[0].loss_hash)) {
                REC(DT_REP_TOPIC_LOSS, DT_REP_WARNING);
                snprintf(tx, txn, "%s is not deterministic: repeat %d has loss hash %s, repeat 1 has %s.", t->label,
                         k + 1, t->rep[k].loss_hash, t->rep[0].loss_hash);
                warned++;
                break;
            }
    }
    for (int i = 0; i < r->ntrain; i++)
        for (int j = i + 1; j < r->ntrain; j++) {
            const dt_rep_train *a = &r->train[i], *b = &r->train[j];
            const char *why = NULL;
            if (a->world == b->world && same(a, b, D_STRATEGY | D_BUCKET | D_OVERLAP))
                why = "same configuration except strategy/bucket/overlap";
            else if ((a->world == 1) != (b->world == 1) &&
                     same(a, b, D_WORLD | D_STRATEGY | D_BUCKET | D_OVERLAP | D_MICRO | D_ACCUM | D_LAYOUT))
                why = "1 rank vs N ranks with the same global batch";
            if (!why || a == b) continue;
            pairs++;
            char i1[16], i2[16];
            if (streq(a->loss_hash, b->loss_hash)) {
                if (++agree <= 12) cat(ok, sizeof ok, "%s%s = %s", agree > 1 ? ", " : "", short_id(a, i1, sizeof i1),
                                     short_id(b, i2, sizeof i2));
                continue;
            }
            int at;
            double d = loss_diff(a, b, &at);
            REC(DT_REP_TOPIC_LOSS, d <= LOSS_TOL ? DT_REP_INFO : DT_REP_WARNING);
            if (d <= LOSS_TOL)
                snprintf(tx, txn, "%s and %s (%s) have different loss hashes (%s vs %s) but their losses agree to "
                                  "%.1e relative: not bitwise, as expected when the reduction order differs "
                                  "(e.g. ZeRO-2/3 or several ranks with accumulation).",
                         a->label, b->label, why, a->loss_hash, b->loss_hash, d);
            else {
                warned++;
                if (at >= 0 && isfinite(d))
                    snprintf(tx, txn, "Loss mismatch: %s and %s should train identically (%s) but their loss hashes "
                                      "differ (%s vs %s); first repeat differs by %.2e relative at measured step %d "
                                      "(%.6g vs %.6g).", a->label, b->label, why, a->loss_hash, b->loss_hash, d, at + 1,
                             a->rep[0].loss[at], b->rep[0].loss[at]);
                else
                    snprintf(tx, txn, "Loss mismatch: %s and %s should train identically (%s) but their loss hashes "
                                      "differ (%s vs %s).", a->label, b->label, why, a->loss_hash, b->loss_hash);
            }
        }
    if (pairs == 0 && !warned) {
        REC(DT_REP_TOPIC_LOSS, DT_REP_NODATA);
        snprintf(tx, txn, "No pair of runs that should give identical losses (same configuration except strategy, or "
                          "1 vs N ranks at the same global batch), so the loss hashes were not cross-checked.");
    } else if (!warned && ok[0]) {
        REC(DT_REP_TOPIC_LOSS, DT_REP_INFO);
        snprintf(tx, txn, "Loss hashes agree across %d pair(s) of runs that should match (%s%s).", agree, ok,
                 agree > 12 ? ", ..." : "");
    }
}

/* ---- labels and entry point -------------------------------------------------------- */

static void make_labels(dt_report *r) {
    int vary_bucket = 0, vary_model = 0;
    for (int i = 1; i < r->ntrain; i++) {
        vary_bucket |= r->train[i].bucket_bytes != r->train[0].bucket_bytes;
        vary_model |= !streq(r->train[i].preset, r->train[0].preset);
    }
    for (int i = 0; i < r->ntrain; i++) {
        dt_rep_train *t = &r->train[i];
        char bk[40] = "", b[32], acc[16] = "";
        if (vary_bucket) {
            dt_report_fmt_bytes(b, sizeof b, t->bucket_bytes);
            snprintf(bk, sizeof bk, " bk %s", b);
        }
        if (t->accum > 1) snprintf(acc, sizeof acc, " acc%d", t->accum);
        char tp[32] = ""; /* the layout: "tp2", "tp2 sp", "tp2 blocks" */
        if (t->tp > 1) snprintf(tp, sizeof tp, " tp%d%s", t->tp, t->tp_blocks ? " blocks" : t->sp ? " sp" : "");
        snprintf(t->label, sizeof t->label, "R%d %s%s%s x%d%s mb%d%s%s%s", i + 1, vary_model ? t->preset : "",
                 vary_model ? " " : "", t->strategy, t->world, tp, t->micro_batch, acc, bk,
                 t->overlap ? "" : " no-overlap");
    }
}

void dt_report_analyze(dt_report *r, double mem_budget) {
    r->nrec = 0;
    make_labels(r);
    compute_efficiency(r);
    if (r->ntrain == 0) return;
    rec_strategy(r, mem_budget);
    rec_bucket(r);
    rec_micro(r, mem_budget);
    rec_loss(r);
}
