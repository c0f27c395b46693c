/* The planner's pipeline step (decision 95): the schedule's action lists (parallel/pp_schedule.h)
 * replayed in time order, each stage running one action at a time when its input exists, with
 * stages that share compute (time-sliced devices: more ranks than cores) running faster while
 * the others of their group are idle. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "parallel/pp_schedule.h"
#include "plan/plan.h"
#include "plan/plan_impl.h"

/* A busy stage's rate, in units of its all-busy rate: min(speedup, g / n) with g the stages of
 * its group (the last group may be smaller) and n of them busy. */
static double stage_rate(int r, int pp, int group, const int *busy, double speedup) {
    int g0 = (r / group) * group, gsize = g0 + group > pp ? pp - g0 : group;
    return fmin(speedup, (double)gsize / busy[r / group]);
}

static int simulate(int kind, int pp, int v, int m, const double *f, const double *b, const double *w, double speedup,
                    int group, double *makespan) {
    const dt_pp_kind k = (dt_pp_kind)kind;
    const int S = pp * v, len = dt_pp_schedule_len(k, pp, v, m);
    const int ngroups = (pp + group - 1) / group;
    size_t cells = (size_t)3 * (size_t)m * (size_t)S;
    dt_pp_action *all = malloc((size_t)pp * (size_t)len * sizeof *all);
    double *fin = malloc(cells * sizeof *fin); /* end time of (op, mb, virtual stage); < 0: not yet */
    int *next = calloc((size_t)pp, sizeof *next), *run = calloc((size_t)pp, sizeof *run);
    int *busy = calloc((size_t)ngroups, sizeof *busy);
    double *rem = calloc((size_t)pp, sizeof *rem), *dur = calloc((size_t)pp, sizeof *dur);
    int rc = 0;
    if (!all || !fin || !next || !run || !busy || !rem || !dur) {
        rc = -2;
        goto out;
    }
    for (int r = 0; r < pp; r++) dt_pp_schedule(k, pp, v, m, r, all + (size_t)r * (size_t)len);
    for (size_t i = 0; i < cells; i++) fin[i] = -1.0;
#define FIN(op, j, s) fin[((size_t)(op) * (size_t)m + (size_t)(j)) * (size_t)S + (size_t)(s)]
    double now = 0;
    for (;;) {
        /* start every action whose input exists (a zero-length one ends at once) */
        for (int changed = 1; changed;) {
            changed = 0;
            for (int r = 0; r < pp; r++) {
                while (!run[r] && next[r] < len) {
                    dt_pp_action a = all[(size_t)r * (size_t)len + (size_t)next[r]];
                    int s = a.chunk * pp + r, dep_s = s;
                    dt_pp_op dep_op = DT_PP_B;
                    double d = a.op == DT_PP_F ? f[r] : a.op == DT_PP_B ? b[r] : w ? w[r] : 0.0;
                    if (a.op == DT_PP_F) dep_op = DT_PP_F, dep_s = s - 1;
                    else if (a.op == DT_PP_B) dep_op = s == S - 1 ? DT_PP_F : DT_PP_B, dep_s = s == S - 1 ? s : s + 1;
                    if (dep_s >= 0 && FIN(dep_op, a.mb, dep_s) < 0) break; /* its input does not exist yet */
                    if (d > 0) {
                        run[r] = 1, rem[r] = dur[r] = d;
                    } else {
                        FIN(a.op, a.mb, s) = now;
                        next[r]++;
                    }
                    changed = 1;
                }
            }
        }
        int left = 0;
        for (int g = 0; g < ngroups; g++) busy[g] = 0;
        for (int r = 0; r < pp; r++) busy[r / group] += run[r], left |= run[r] || next[r] < len;
        if (!left) break;
        /* each running stage at min(speedup, group members / busy members) x the all-busy rate */
        double dt = INFINITY;
        int first = -1;
        for (int r = 0; r < pp; r++) {
            if (!run[r]) continue;
            double rate = stage_rate(r, pp, group, busy, speedup), t = rem[r] / rate;
            if (t < dt) dt = t, first = r;
        }
        if (first < 0) { /* nothing runs and actions remain: the lists deadlock */
            rc = -1;
            goto out;
        }
        now += dt;
        for (int r = 0; r < pp; r++) {
            if (!run[r]) continue;
            rem[r] -= stage_rate(r, pp, group, busy, speedup) * dt;
            if (r == first || rem[r] <= 1e-12 * dur[r]) {
                dt_pp_action a = all[(size_t)r * (size_t)len + (size_t)next[r]];
                FIN(a.op, a.mb, a.chunk * pp + r) = now;
                next[r]++, run[r] = 0;
            }
        }
    }
#undef FIN
    *makespan = now;
out:
    free(all);
    free(fin);
    free(next);
    free(run);
    free(busy);
    free(rem);
    free(dur);
    return rc;
}

/* A memo of the replays (the planner is single-threaded): `plan --validate --fit` predicts each
 * row at hundreds of GEMM efficiencies, and the planner passes durations in units of a
 * micro-batch's compute, which do not depend on the efficiency - one replay serves them all. */
#define MEMO_SLOTS 8192
#define MEMO_PROBE 16 /* slots looked at from the hash's: the first free or matching one, else the hash's */
typedef struct memo_entry {
    int kind, pp, v, m, group, rc;
    double speedup, makespan;
    double *d; /* f, b, w (w zeros when NULL) */
} memo_entry;
static memo_entry memo[MEMO_SLOTS];

int dt_plan_pp_makespan(int kind, int pp, int v, int m, const double *f, const double *b, const double *w,
                        double speedup, int group, double *makespan) {
    if (!(speedup >= 1)) speedup = 1;
    if (group < 1 || group > pp) group = pp;
    uint64_t h = 1469598103934665603ull;
#define MIX(x)                                                                                                          \
    do {                                                                                                               \
        const unsigned char *p_ = (const unsigned char *)&(x);                                                         \
        for (size_t i_ = 0; i_ < sizeof(x); i_++) h = (h ^ p_[i_]) * 1099511628211ull;                                 \
    } while (0)
    MIX(kind);
    MIX(pp);
    MIX(v);
    MIX(m);
    MIX(group);
    MIX(speedup);
    for (int s = 0; s < pp; s++) {
        double z = w ? w[s] : 0.0;
        MIX(f[s]);
        MIX(b[s]);
        MIX(z);
    }
#undef MIX
    memo_entry *e = NULL;
    for (int q = 0; q < MEMO_PROBE && !e; q++) {
        memo_entry *x = &memo[(h + (uint64_t)q) % MEMO_SLOTS];
        int hit = x->d && x->kind == kind && x->pp == pp && x->v == v && x->m == m && x->group == group &&
                  x->speedup == speedup;
        for (int s = 0; hit && s < pp; s++)
            hit = x->d[s] == f[s] && x->d[pp + s] == b[s] && x->d[2 * pp + s] == (w ? w[s] : 0.0);
        if (hit) {
            if (x->rc == 0) *makespan = x->makespan;
            return x->rc;
        }
        if (!x->d) e = x;
    }
    if (!e) e = &memo[h % MEMO_SLOTS];
    double t = 0;
    int rc = simulate(kind, pp, v, m, f, b, w, speedup, group, &t);
    if (rc == 0) *makespan = t;
    double *d = realloc(e->d, 3 * (size_t)pp * sizeof *d);
    if (d) {
        for (int s = 0; s < pp; s++) d[s] = f[s], d[pp + s] = b[s], d[2 * pp + s] = w ? w[s] : 0.0;
        e->d = d, e->kind = kind, e->pp = pp, e->v = v, e->m = m, e->group = group, e->speedup = speedup;
        e->rc = rc, e->makespan = t;
    }
    return rc;
}

int dt_plan_pp_kind(const dt_plan_job *job, int pp, int m, int *v) {
    int kind = job->train.pp_kind;
    *v = kind == DT_PP_INTERLEAVED ? job->train.pp_virtual : 1;
    dt_ctx scratch;
    dt_ctx_init(&scratch);
    if (pp < 1 || m < 1 || m > DT_PP_MAX_MICRO || dt_pp_schedule_check(&scratch, (dt_pp_kind)kind, pp, *v, m) != DT_OK)
        kind = DT_PP_1F1B, *v = 1;
    return kind;
}
