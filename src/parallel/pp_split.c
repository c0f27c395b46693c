/* Pipeline stage boundaries: the cost of a stage and the rule that cuts the layers
 * (pp_split.h; ARCHITECTURE decision 76). */
#include "parallel/pp_split.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define REL_TOL 1e-9

void dt_pp_costs_of(const dt_model_config *c, int T, dt_pp_costs *out) {
    *out = (dt_pp_costs){0, 0, 0};
    const dt_model_family *fam = dt_model_family_of(c);
    if (!fam || c->n_layer < 1) return;
    /* one layer: the growth of the family's own count per layer (flops_per_token is affine in
     * n_layer for every family), so this is exactly how flops_per_token counts a layer */
    dt_model_config c0 = *c;
    c0.n_layer = 0;
    const double f = dt_model_flops_per_token(c, T), f0 = dt_model_flops_per_token(&c0, T);
    out->layer = (f - f0) / c->n_layer;
    const double C = c->d_model;
    double head_mm, lookup, loss;
    if (!strcmp(fam->name, "vit")) {
        /* per pixel (the trainer's token; vit_flops_per_token): per image / context */
        const double px = c->context > 0 ? c->context : 1, p = c->image_size / (c->patch_size > 0 ? c->patch_size : 1);
        const double Tp = p * p + 1; /* patches + the class token */
        head_mm = 6.0 * C * c->n_classes / px;
        lookup = DT_PP_LOOKUP_FLOPS * C * Tp / px; /* class token and positions over T positions */
        loss = DT_PP_LOSS_FLOPS * c->n_classes / px;
    } else {
        const int gpt2 = !strcmp(fam->name, "gpt2");
        head_mm = 6.0 * ((double)c->vocab * C + (gpt2 ? 2.0 : 1.0) * C); /* lm_head + final norm */
        lookup = DT_PP_LOOKUP_FLOPS * C * (gpt2 ? 2.0 : 1.0);           /* token (+ position) table */
        loss = DT_PP_LOSS_FLOPS * c->vocab;
    }
    /* what flops_per_token counts outside the layers and the head: vit's patch embedding
     * (a matmul); 0 up to rounding for the language families */
    double embed_mm = f0 - head_mm;
    if (embed_mm < 0) embed_mm = 0;
    out->embed = embed_mm + lookup;
    out->head = head_mm + loss;
}

/* Stage s's fixed extra cost. */
static double extra(const dt_pp_costs *k, int pp, int s) {
    return (s == 0 ? k->embed : 0.0) + (s == pp - 1 ? k->head : 0.0);
}

/* The most layers stage s can take under a bound M on every stage's cost. */
static long cap_of(const dt_pp_costs *k, int pp, int s, double M) {
    double x = (M * (1 + REL_TOL) - extra(k, pp, s)) / k->layer;
    return x < 0 ? -1 : x > 1e15 ? (long)1e15 : (long)floor(x);
}

static int feasible(const dt_pp_costs *k, int L, int pp, double M) {
    long sum = 0;
    for (int s = 0; s < pp; s++) {
        long cap = cap_of(k, pp, s, M);
        if (cap < 1) return 0;
        sum += cap;
        if (sum >= L) sum = L; /* no overflow; enough already */
    }
    return sum >= L;
}

/* Most even counts for stages [0, n) with caps cap[] and floors 1 summing to R (the caller
 * checked n <= R <= sum of caps): levels filled up, the remainder to the last eligible stages
 * (earlier stages fewer). Writes cnt[] and returns the sum of squares. */
static double fill(const long *cap, int n, long R, long *cnt) {
    if (n == 0) return 0;
    /* the largest level lam >= 1 with sum min(cap, lam) <= R */
    long lo = 1, hi = R;
    while (lo < hi) {
        long mid = lo + (hi - lo + 1) / 2, s = 0;
        for (int i = 0; i < n && s <= R; i++) s += cap[i] < mid ? cap[i] : mid;
        if (s <= R) lo = mid;
        else hi = mid - 1;
    }
    long used = 0;
    for (int i = 0; i < n; i++) used += cnt[i] = cap[i] < lo ? cap[i] : lo;
    for (int i = n - 1; i >= 0 && used < R; i--)
        if (cap[i] > cnt[i]) cnt[i]++, used++;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)cnt[i] * cnt[i];
    return ss;
}

void dt_pp_split_costs(const dt_pp_costs *kin, int L, int pp, int *first) {
    dt_pp_costs k = *kin;
    if (!(k.layer > 0) || !isfinite(k.layer) || !isfinite(k.embed) || !isfinite(k.head) || k.embed < 0 ||
        k.head < 0) /* no usable costs: count layers alone */
        k.layer = 1, k.embed = k.head = 0;
    if (pp < 1) pp = 1;
    first[0] = 0, first[pp] = L;
    if (pp == 1) return;
    if (pp > L) { /* refused by every caller; keep the boundaries ordered */
        for (int s = 1; s < pp; s++) first[s] = s < L ? s : L;
        return;
    }
    /* 1. the smallest bound: for each kind of candidate (stage 0's, a middle stage's, the last
     * stage's cost at k layers) the smallest feasible k, by bisection (feasibility grows with
     * the bound); the smallest of the three */
    const double base[3] = {k.embed, 0.0, k.head};
    double M = INFINITY;
    for (int t = 0; t < 3; t++) {
        long lo = 1, hi = L;
        if (!feasible(&k, L, pp, base[t] + (double)hi * k.layer)) continue;
        while (lo < hi) {
            long mid = lo + (hi - lo) / 2;
            if (feasible(&k, L, pp, base[t] + (double)mid * k.layer)) hi = mid;
            else lo = mid + 1;
        }
        double m = base[t] + (double)lo * k.layer;
        if (m < M) M = m;
    }
    /* 2-4. under M: the most even counts, then the fewest on the last stage, then earlier
     * stages fewer */
    if (pp > DT_PP_RULE_MAX) { /* beyond any layout the planner lists: layers alone, evenly */
        for (int s = 1; s < pp; s++) first[s] = (int)((long)L * s / pp);
        return;
    }
    long capv[DT_PP_RULE_MAX], cntv[DT_PP_RULE_MAX], bestv[DT_PP_RULE_MAX];
    for (int s = 0; s < pp; s++) capv[s] = cap_of(&k, pp, s, M);
    double best_ss = INFINITY;
    long best_last = -1;
    long rest_cap = 0;
    for (int s = 0; s < pp - 1; s++) rest_cap += capv[s];
    for (long nl = 1; nl <= capv[pp - 1] && nl <= L - (pp - 1); nl++) {
        long R = L - nl;
        if (R > rest_cap) continue;
        double ss = (double)nl * nl + fill(capv, pp - 1, R, cntv);
        if (ss < best_ss) { /* strict: ties keep the fewer layers on the last stage */
            best_ss = ss, best_last = nl;
            for (int s = 0; s < pp - 1; s++) bestv[s] = cntv[s];
        }
    }
    if (best_last < 0) { /* unreachable (M is feasible); an even split rather than garbage */
        for (int s = 1; s < pp; s++) first[s] = (int)((long)L * s / pp);
        return;
    }
    for (int s = 0; s < pp - 1; s++) first[s + 1] = first[s] + (int)bestv[s];
}

double dt_pp_costs_stage(const dt_pp_costs *k, int pp, const int first[], int s) {
    return (double)(first[s + 1] - first[s]) * k->layer + extra(k, pp, s);
}

void dt_pp_split(const dt_model_config *c, int T, int pp, int first[DT_PP_MAX + 1]) {
    dt_pp_costs k;
    dt_pp_costs_of(c, T, &k);
    dt_pp_split_costs(&k, c->n_layer, pp > DT_PP_MAX ? DT_PP_MAX : pp, first);
}

double dt_pp_stage_cost(const dt_model_config *c, int T, int pp, const int first[], int s) {
    dt_pp_costs k;
    dt_pp_costs_of(c, T, &k);
    return dt_pp_costs_stage(&k, pp, first, s);
}

/* "[2, 3, 4]" (at most 16 numbers, then "...") */
static void list_text(const int *v, int n, char *buf, size_t cap) {
    size_t j = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && j < cap; i++) {
        if (i == 16) {
            j += (size_t)snprintf(buf + j, cap - j, ", ...");
            break;
        }
        j += (size_t)snprintf(buf + j, cap - j, "%s%d", i ? ", " : "", v[i]);
    }
    if (j < cap) snprintf(buf + j, cap - j, "]");
}

dt_status dt_pp_check_degree(dt_ctx *ctx, int pp, int L) {
    if (pp > DT_PP_MAX) return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d: at most %d pipeline stages", pp, DT_PP_MAX);
    if (pp > L) return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp=%d: more stages than layers (model.n_layer = %d)", pp, L);
    return DT_OK;
}

dt_status dt_pp_split_explicit(dt_ctx *ctx, const int *counts, int n, int pp, int L, int first[DT_PP_MAX + 1]) {
    char txt[160];
    list_text(counts, n, txt, sizeof txt);
    if (pp < 1 || pp > DT_PP_MAX)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers %s: parallel.pp must be in [1, %d] (got %d)", txt,
                       DT_PP_MAX, pp);
    if (n != pp)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers %s: %d number%s for parallel.pp = %d stage%s (give one "
                       "layer count per stage)", txt, n, n == 1 ? "" : "s", pp, pp == 1 ? "" : "s");
    long sum = 0;
    for (int i = 0; i < n; i++) {
        if (counts[i] < 1)
            return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers %s: stage %d has %d layers (every stage needs >= 1)",
                           txt, i, counts[i]);
        sum += counts[i];
    }
    if (sum != L)
        return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_layers %s: the counts sum to %ld, not model.n_layer = %d", txt,
                       sum, L);
    first[0] = 0;
    for (int i = 0; i < n; i++) first[i + 1] = first[i] + counts[i];
    return DT_OK;
}
