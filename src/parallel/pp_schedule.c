/* Pipeline-parallel schedules: the action lists, their checker and the replay (pp_schedule.h). */
#include "parallel/pp_schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[DT_PP_NKINDS] = {"gpipe", "1f1b", "interleaved", "zb-h1"};

const char *dt_pp_kind_name(dt_pp_kind k) { return (unsigned)k < DT_PP_NKINDS ? kind_names[k] : "?"; }

dt_status dt_pp_kind_parse(dt_ctx *ctx, const char *s, dt_pp_kind *out) {
    for (int k = 0; k < DT_PP_NKINDS; k++) {
        if (s && strcmp(s, kind_names[k]) == 0) {
            *out = (dt_pp_kind)k;
            return DT_OK;
        }
    }
    return dt_fail(ctx, DT_ERR_CONFIG, "parallel.pp_schedule: unknown schedule '%s' (choices: gpipe, 1f1b, interleaved, zb-h1)",
                   s ? s : "");
}

/* The message of the first rule (k, pp, v, m) breaks, or NULL; buf holds it. */
static const char *refusal(dt_pp_kind k, int pp, int v, int m, char *buf, size_t cap) {
    if ((unsigned)k >= DT_PP_NKINDS) {
        snprintf(buf, cap, "parallel.pp_schedule: unknown schedule %d (choices: gpipe, 1f1b, interleaved, zb-h1)", (int)k);
    } else if (pp < 1 || pp > DT_PP_MAX_STAGES) {
        snprintf(buf, cap, "parallel.pp must be in [1, %d] (got %d)", DT_PP_MAX_STAGES, pp);
    } else if (v < 1 || v > DT_PP_MAX_VIRTUAL) {
        snprintf(buf, cap, "parallel.pp_virtual must be in [1, %d] (got %d)", DT_PP_MAX_VIRTUAL, v);
    } else if (m < 1 || m > DT_PP_MAX_MICRO) {
        snprintf(buf, cap, "training.grad_accum (micro-batches per step) must be in [1, %d] (got %d)", DT_PP_MAX_MICRO, m);
    } else if (k != DT_PP_INTERLEAVED && v > 1) {
        snprintf(buf, cap, "parallel.pp_virtual=%d needs parallel.pp_schedule=interleaved (got %s)", v, kind_names[k]);
    } else if (k == DT_PP_INTERLEAVED && v < 2) {
        snprintf(buf, cap, "parallel.pp_schedule=interleaved needs parallel.pp_virtual >= 2 virtual stages per rank (got %d)", v);
    } else if (k == DT_PP_INTERLEAVED && pp < 2) {
        snprintf(buf, cap, "parallel.pp_schedule=interleaved needs parallel.pp >= 2 (got %d)", pp);
    } else if (k == DT_PP_INTERLEAVED && m % pp != 0) {
        snprintf(buf, cap,
                 "parallel.pp_schedule=interleaved needs training.grad_accum (micro-batches per step, %d) divisible by "
                 "parallel.pp (%d)",
                 m, pp);
    } else {
        return NULL;
    }
    return buf;
}

dt_status dt_pp_schedule_check(dt_ctx *ctx, dt_pp_kind k, int pp, int v, int m) {
    char buf[256];
    const char *why = refusal(k, pp, v, m, buf, sizeof buf);
    return why ? dt_fail(ctx, DT_ERR_CONFIG, "%s", why) : DT_OK;
}

static void assert_args(dt_pp_kind k, int pp, int v, int m, int rank) {
    char buf[256];
    DT_ASSERT(refusal(k, pp, v, m, buf, sizeof buf) == NULL);
    DT_ASSERT(rank >= 0 && rank < pp);
}

int dt_pp_schedule_len(dt_pp_kind k, int pp, int v, int m) {
    assert_args(k, pp, v, m, 0);
    return (k == DT_PP_ZBH1 ? 3 : 2) * m * v;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* Interleaved: warm-up forwards of rank r, and the k-th forward / backward's pair. */
static int interleaved_warmup(int pp, int v, int m, int r) { return imin(m * v, 2 * (pp - r - 1) + (v - 1) * pp); }
static dt_pp_action interleaved_at(dt_pp_op op, int pp, int v, int k) {
    int c = (k / pp) % v;
    return (dt_pp_action){op, (k / (pp * v)) * pp + k % pp, op == DT_PP_F ? c : v - 1 - c};
}

int dt_pp_inflight(dt_pp_kind k, int pp, int v, int m, int rank) {
    assert_args(k, pp, v, m, rank);
    switch (k) {
    case DT_PP_GPIPE: return m;
    case DT_PP_1F1B: return imin(m, pp - rank);
    case DT_PP_INTERLEAVED: return imin(m * v, interleaved_warmup(pp, v, m, rank) + 1);
    case DT_PP_ZBH1: return imin(m, pp);
    default: DT_ASSERT(0); return 0;
    }
}

#define ACT(o, j, c) (out[n++] = (dt_pp_action){(o), (j), (c)})

int dt_pp_schedule(dt_pp_kind k, int pp, int v, int m, int rank, dt_pp_action *out) {
    assert_args(k, pp, v, m, rank);
    int n = 0;
    if (k == DT_PP_GPIPE) {
        for (int j = 0; j < m; j++) ACT(DT_PP_F, j, 0);
        for (int j = 0; j < m; j++) ACT(DT_PP_B, j, 0);
    } else if (k == DT_PP_INTERLEAVED) {
        int total = m * v, warm = interleaved_warmup(pp, v, m, rank);
        for (int i = 0; i < warm; i++) out[n++] = interleaved_at(DT_PP_F, pp, v, i);
        for (int i = 0; i < total - warm; i++) {
            out[n++] = interleaved_at(DT_PP_F, pp, v, warm + i);
            out[n++] = interleaved_at(DT_PP_B, pp, v, i);
        }
        for (int i = total - warm; i < total; i++) out[n++] = interleaved_at(DT_PP_B, pp, v, i);
    } else { /* 1f1b, zb-h1: 1f1b's F/B order; zb-h1 runs W of j after B of j + rank */
        int zb = k == DT_PP_ZBH1, warm = imin(m, pp - rank - 1), nw = 0;
        for (int j = 0; j < warm; j++) ACT(DT_PP_F, j, 0);
        for (int i = 0; i < m; i++) {
            if (i < m - warm) ACT(DT_PP_F, warm + i, 0);
            ACT(DT_PP_B, i, 0);
            if (zb && i - rank >= nw) ACT(DT_PP_W, nw++, 0);
        }
        while (zb && nw < m) ACT(DT_PP_W, nw++, 0);
    }
    DT_ASSERT(n == dt_pp_schedule_len(k, pp, v, m));
    return n;
}

int dt_pp_schedule_valid(dt_pp_kind k, int pp, int v, int m, int rank, const dt_pp_action *a, int n) {
    char buf[256];
    if (refusal(k, pp, v, m, buf, sizeof buf) || rank < 0 || rank >= pp || !a) return 0;
    if (n != dt_pp_schedule_len(k, pp, v, m)) return 0;
    /* done[op][chunk]: how many of that pass the chunk ran; the next must be micro-batch done. */
    int done[3][DT_PP_MAX_VIRTUAL] = {{0}};
    dt_pp_op last = k == DT_PP_ZBH1 ? DT_PP_W : DT_PP_B;
    int held = 0, bound = dt_pp_inflight(k, pp, v, m, rank);
    for (int i = 0; i < n; i++) {
        dt_pp_op op = a[i].op;
        int c = a[i].chunk, j = a[i].mb;
        if ((unsigned)op > DT_PP_W || (op == DT_PP_W && k != DT_PP_ZBH1)) return 0;
        if (c < 0 || c >= v || j < 0 || j >= m) return 0;
        if (j != done[op][c]) return 0;                      /* exactly once each, in micro-batch order */
        if (op != DT_PP_F && done[op - 1][c] <= j) return 0; /* B after its F, W after its B */
        done[op][c]++;
        if (op == DT_PP_F && ++held > bound) return 0;
        if (op == last) held--;
    }
    for (int c = 0; c < v; c++)
        for (int op = 0; op <= (int)last; op++)
            if (done[op][c] != m) return 0;
    return 1;
}

int dt_pp_replay_lists(int pp, int v, int m, const dt_pp_action *const *lists, const int *lens, const double *f, const double *b,
                       const double *w, double p2p, double *makespan, double *idle) {
    DT_ASSERT(pp >= 1 && v >= 1 && m >= 1);
    int S = pp * v;
    size_t cells = (size_t)3 * (size_t)m * (size_t)S;
    double *fin = malloc(cells * sizeof *fin); /* end time of (op, mb, stage); < 0: not run */
    int *next = calloc((size_t)pp, sizeof *next);
    double *clock = calloc((size_t)pp, sizeof *clock), *busy = calloc((size_t)pp, sizeof *busy);
    int rc = 0;
    if (!fin || !next || !clock || !busy) {
        rc = -2;
        goto out;
    }
    for (size_t i = 0; i < cells; i++) fin[i] = -1.0;
#define FIN(op, j, s) fin[((size_t)(op) * (size_t)m + (size_t)(j)) * (size_t)S + (size_t)(s)]
    for (int progress = 1, left = 1; left;) {
        if (!progress) {
            rc = -1;
            goto out;
        }
        progress = left = 0;
        for (int r = 0; r < pp; r++) {
            for (; next[r] < lens[r]; next[r]++) {
                dt_pp_action a = lists[r][next[r]];
                if ((unsigned)a.op > DT_PP_W || a.mb < 0 || a.mb >= m || a.chunk < 0 || a.chunk >= v) {
                    rc = -2;
                    goto out;
                }
                int s = a.chunk * pp + r, dep_s = s;
                dt_pp_op dep_op;
                double dur;
                if (a.op == DT_PP_F) {
                    dep_op = DT_PP_F, dep_s = s - 1, dur = f[r];
                } else if (a.op == DT_PP_B) {
                    dep_op = s == S - 1 ? DT_PP_F : DT_PP_B, dep_s = s == S - 1 ? s : s + 1, dur = b[r];
                } else {
                    dep_op = DT_PP_B, dur = w ? w[r] : 0.0;
                }
                double ready = 0.0;
                if (dep_s >= 0) {
                    double t = FIN(dep_op, a.mb, dep_s);
                    if (t < 0) break; /* its input does not exist yet */
                    ready = t + (dep_s % pp != r ? p2p : 0.0);
                }
                if (FIN(a.op, a.mb, s) >= 0) {
                    rc = -2;
                    goto out;
                }
                double start = clock[r] > ready ? clock[r] : ready;
                clock[r] = start + dur;
                busy[r] += dur;
                FIN(a.op, a.mb, s) = clock[r];
                progress = 1;
            }
            if (next[r] < lens[r]) left = 1;
        }
    }
#undef FIN
    double end = 0.0;
    for (int r = 0; r < pp; r++)
        if (clock[r] > end) end = clock[r];
    *makespan = end;
    for (int r = 0; r < pp; r++) idle[r] = end - busy[r];
out:
    free(fin);
    free(next);
    free(clock);
    free(busy);
    return rc;
}

int dt_pp_replay(dt_pp_kind k, int pp, int v, int m, const double *f, const double *b, const double *w, double p2p,
                 double *makespan, double *idle) {
    int len = dt_pp_schedule_len(k, pp, v, m);
    dt_pp_action *all = malloc((size_t)pp * (size_t)len * sizeof *all);
    const dt_pp_action **lists = malloc((size_t)pp * sizeof *lists);
    int *lens = malloc((size_t)pp * sizeof *lens);
    int rc = -2;
    if (all && lists && lens) {
        for (int r = 0; r < pp; r++) {
            lens[r] = dt_pp_schedule(k, pp, v, m, r, all + (size_t)r * (size_t)len);
            lists[r] = all + (size_t)r * (size_t)len;
        }
        rc = dt_pp_replay_lists(pp, v, m, lists, lens, f, b, w, p2p, makespan, idle);
    }
    free(all);
    free(lists);
    free(lens);
    return rc;
}
