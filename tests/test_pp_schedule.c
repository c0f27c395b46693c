/* Pipeline schedules (parallel/pp_schedule.h): the names and refusals; lists written out by
 * hand; the invariants on every pp 1..8, v 1..4, m 1..16 the check accepts, checked here
 * independently of dt_pp_schedule_valid (each pass exactly once, B after F, W after B, the
 * backward passes of every chunk in micro-batch order, 1f1b's warm-up / steady / cool-down
 * shape, the in-flight bound); no deadlock in the replay, with equal and with uneven
 * durations; the replay against a timeline worked by hand and on a deadlocking pair of lists;
 * the bubbles: 1f1b's idle fraction exactly (p-1)/(m+p-1), interleaved's (p-1)/(v m+p-1)
 * (at most 0.75 of 1f1b's for v = 2), zb-h1's below 1f1b's at the same peak activation
 * memory ((p-1)/(3m+p-1) for m >= p); point-to-point messages consumed in the order they
 * are sent; and the checker refusing lists with two passes swapped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pp_schedule.h"
#include "testutil.h"

#define MAXN (3 * 16 * 4)

static const dt_pp_kind kinds[] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZBH1};

static int accepted(dt_pp_kind k, int pp, int v, int m) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    return dt_pp_schedule_check(&ctx, k, pp, v, m) == DT_OK;
}

/* "F0 B0 W0 F1:1" -> actions (":c" the chunk, 0 when absent); returns the count. */
static int parse_list(const char *s, dt_pp_action *out) {
    int n = 0;
    while (*s) {
        while (*s == ' ') s++;
        if (!*s) break;
        dt_pp_op op = *s == 'F' ? DT_PP_F : *s == 'B' ? DT_PP_B : DT_PP_W;
        char *end;
        int mb = (int)strtol(s + 1, &end, 10), c = 0;
        if (*end == ':') c = (int)strtol(end + 1, &end, 10);
        out[n++] = (dt_pp_action){op, mb, c};
        s = end;
    }
    return n;
}

static void expect_list(dt_pp_kind k, int pp, int v, int m, int rank, const char *want) {
    dt_pp_action w[MAXN], got[MAXN];
    int nw = parse_list(want, w);
    int n = dt_pp_schedule(k, pp, v, m, rank, got);
    if (n != nw) fail_msg("%s pp %d v %d m %d rank %d: %d actions, want %d", dt_pp_kind_name(k), pp, v, m, rank, n, nw);
    for (int i = 0; i < n; i++) {
        if (got[i].op != w[i].op || got[i].mb != w[i].mb || got[i].chunk != w[i].chunk)
            fail_msg("%s pp %d v %d m %d rank %d: action %d is %c%d:%d, want %c%d:%d", dt_pp_kind_name(k), pp, v, m, rank, i,
                     "FBW"[got[i].op], got[i].mb, got[i].chunk, "FBW"[w[i].op], w[i].mb, w[i].chunk);
    }
    assert_true(dt_pp_schedule_valid(k, pp, v, m, rank, got, n));
}

static void test_names_and_parse(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (int i = 0; i < 4; i++) {
        dt_pp_kind k = DT_PP_GPIPE;
        assert_int_equal(dt_pp_kind_parse(&ctx, dt_pp_kind_name(kinds[i]), &k), DT_OK);
        assert_int_equal(k, kinds[i]);
    }
    assert_string_equal(dt_pp_kind_name(DT_PP_ZBH1), "zb-h1");
    assert_string_equal(dt_pp_kind_name(DT_PP_1F1B), "1f1b");
    dt_pp_kind k;
    assert_int_equal(dt_pp_kind_parse(&ctx, "zb", &k), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "parallel.pp_schedule"));
    assert_non_null(strstr(ctx.err, "'zb'"));
    assert_non_null(strstr(ctx.err, "gpipe, 1f1b, interleaved, zb-h1"));
    assert_null(strchr(ctx.err, '\n'));
    assert_int_equal(dt_pp_kind_parse(&ctx, "1F1B", &k), DT_ERR_CONFIG); /* names are exact */
}

static void test_refusals_name_the_key(void **state) {
    (void)state;
    static const struct {
        dt_pp_kind k;
        int pp, v, m;
        const char *key;
    } bad[] = {
        {DT_PP_1F1B, 0, 1, 4, "parallel.pp must be in [1,"},
        {DT_PP_1F1B, 2, 0, 4, "parallel.pp_virtual must be in [1,"},
        {DT_PP_1F1B, 2, 1, 0, "training.grad_accum (micro-batches per step) must be in [1,"},
        {DT_PP_GPIPE, 2, 1, -3, "training.grad_accum"},
        {DT_PP_1F1B, 2, DT_PP_MAX_VIRTUAL + 1, 4, "parallel.pp_virtual"},
        {DT_PP_1F1B, 2, 2, 4, "parallel.pp_virtual=2 needs parallel.pp_schedule=interleaved (got 1f1b)"},
        {DT_PP_GPIPE, 2, 3, 4, "parallel.pp_virtual=3 needs parallel.pp_schedule=interleaved (got gpipe)"},
        {DT_PP_ZBH1, 2, 2, 4, "parallel.pp_virtual=2 needs parallel.pp_schedule=interleaved (got zb-h1)"},
        {DT_PP_INTERLEAVED, 2, 1, 4, "parallel.pp_schedule=interleaved needs parallel.pp_virtual >= 2"},
        {DT_PP_INTERLEAVED, 1, 2, 4, "parallel.pp_schedule=interleaved needs parallel.pp >= 2 (got 1)"},
        {DT_PP_INTERLEAVED, 4, 2, 6,
         "parallel.pp_schedule=interleaved needs training.grad_accum (micro-batches per step, 6) divisible by parallel.pp (4)"},
        {(dt_pp_kind)7, 2, 1, 4, "parallel.pp_schedule"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        assert_int_equal(dt_pp_schedule_check(&ctx, bad[i].k, bad[i].pp, bad[i].v, bad[i].m), DT_ERR_CONFIG);
        if (!strstr(ctx.err, bad[i].key) || strchr(ctx.err, '\n')) fail_msg("case %zu: '%s'", i, ctx.err);
    }
    assert_true(accepted(DT_PP_GPIPE, 1, 1, 1));
    assert_true(accepted(DT_PP_ZBH1, 1, 1, 3));
    assert_true(accepted(DT_PP_1F1B, 8, 1, 3)); /* fewer micro-batches than stages: runs, with a larger bubble */
    assert_true(accepted(DT_PP_INTERLEAVED, 4, 3, 8));
}

/* Lists written out by hand from each schedule's definition (pp_schedule.h). */
static void test_lists_by_hand(void **state) {
    (void)state;
    /* 1f1b pp 4 m 6: rank r warms up with 3 - r forwards. */
    expect_list(DT_PP_1F1B, 4, 1, 6, 0, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
    expect_list(DT_PP_1F1B, 4, 1, 6, 2, "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
    expect_list(DT_PP_1F1B, 4, 1, 6, 3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
    expect_list(DT_PP_1F1B, 4, 1, 2, 0, "F0 F1 B0 B1"); /* warm-up capped by m */
    /* gpipe: backwards in micro-batch order, not reversed. */
    expect_list(DT_PP_GPIPE, 3, 1, 4, 1, "F0 F1 F2 F3 B0 B1 B2 B3");
    /* interleaved pp 2 v 2 m 4: forwards in groups of pp micro-batches through chunk 0 then
     * chunk 1; backwards through chunk 1 then chunk 0. Rank 0 warms up with
     * 2 (2-0-1) + (2-1) 2 = 4 forwards, rank 1 with 2. */
    expect_list(DT_PP_INTERLEAVED, 2, 2, 4, 0, "F0:0 F1:0 F0:1 F1:1 F2:0 B0:1 F3:0 B1:1 F2:1 B0:0 F3:1 B1:0 B2:1 B3:1 B2:0 B3:0");
    expect_list(DT_PP_INTERLEAVED, 2, 2, 4, 1, "F0:0 F1:0 F0:1 B0:1 F1:1 B1:1 F2:0 B0:0 F3:0 B1:0 F2:1 B2:1 F3:1 B3:1 B2:0 B3:0");
    /* zb-h1 pp 4 m 8: 1f1b's F/B order, W of j after B of j + rank. */
    expect_list(DT_PP_ZBH1, 4, 1, 8, 0, "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
    expect_list(DT_PP_ZBH1, 4, 1, 8, 1, "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7");
    expect_list(DT_PP_ZBH1, 4, 1, 8, 3, "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
    expect_list(DT_PP_ZBH1, 1, 1, 2, 0, "F0 B0 W0 F1 B1 W1");
}

/* Invariants 1-3 and 1f1b's shape, checked from the list itself; returns the in-flight peak. */
static int check_list(dt_pp_kind k, int pp, int v, int m, int rank, const dt_pp_action *a, int n) {
    int zb = k == DT_PP_ZBH1;
    int pos[3][16][4];
    for (int o = 0; o < 3; o++)
        for (int j = 0; j < 16; j++)
            for (int c = 0; c < 4; c++) pos[o][j][c] = -1;
    for (int i = 0; i < n; i++) {
        int o = (int)a[i].op, j = a[i].mb, c = a[i].chunk;
        if (o < 0 || o > 2 || j < 0 || j >= m || c < 0 || c >= v || (o == DT_PP_W && !zb) || pos[o][j][c] >= 0)
            fail_msg("%s pp %d v %d m %d rank %d: action %d out of range or repeated", dt_pp_kind_name(k), pp, v, m, rank, i);
        pos[o][j][c] = i;
    }
    assert_int_equal(n, (zb ? 3 : 2) * m * v);
    for (int c = 0; c < v; c++) {
        for (int j = 0; j < m; j++) {
            for (int o = 0; o <= (zb ? 2 : 1); o++) {
                if (pos[o][j][c] < 0)
                    fail_msg("%s pp %d v %d m %d rank %d: no %c%d:%d", dt_pp_kind_name(k), pp, v, m, rank, "FBW"[o], j, c);
                if (o > 0 && pos[o][j][c] < pos[o - 1][j][c]) fail_msg("%c%d:%d before its %c", "FBW"[o], j, c, "FBW"[o - 1]);
                if (j > 0 && pos[o][j][c] < pos[o][j - 1][c])
                    fail_msg("%s pp %d v %d m %d rank %d: %c%d:%d before %c%d:%d", dt_pp_kind_name(k), pp, v, m, rank, "FBW"[o],
                             j, c, "FBW"[o], j - 1, c);
            }
        }
    }
    int held = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].op == DT_PP_F && ++held > peak) peak = held;
        if (a[i].op == (zb ? DT_PP_W : DT_PP_B)) held--;
    }
    if (k == DT_PP_1F1B) { /* warm-up min(m, pp-rank-1) F's, then F B pairs, then B's */
        int warm = pp - rank - 1 < m ? pp - rank - 1 : m, i = 0;
        for (; i < warm; i++) assert_int_equal(a[i].op, DT_PP_F);
        for (int s = 0; s < m - warm; s++, i += 2) {
            assert_int_equal(a[i].op, DT_PP_F);
            assert_int_equal(a[i + 1].op, DT_PP_B);
        }
        for (; i < n; i++) assert_int_equal(a[i].op, DT_PP_B);
        assert_true(peak <= (m < pp - rank ? m : pp - rank));
    }
    if (k == DT_PP_GPIPE) assert_int_equal(peak, m);
    return peak;
}

static void test_invariants_everywhere(void **state) {
    (void)state;
    int lists = 0;
    dt_pp_action a[MAXN];
    for (int ki = 0; ki < 4; ki++) {
        for (int pp = 1; pp <= 8; pp++) {
            for (int v = 1; v <= 4; v++) {
                for (int m = 1; m <= 16; m++) {
                    dt_pp_kind k = kinds[ki];
                    if (!accepted(k, pp, v, m)) continue;
                    for (int r = 0; r < pp; r++) {
                        int n = dt_pp_schedule(k, pp, v, m, r, a);
                        assert_int_equal(n, dt_pp_schedule_len(k, pp, v, m));
                        int peak = check_list(k, pp, v, m, r, a, n);
                        if (peak != dt_pp_inflight(k, pp, v, m, r))
                            fail_msg("%s pp %d v %d m %d rank %d: holds %d, dt_pp_inflight says %d", dt_pp_kind_name(k), pp, v, m,
                                     r, peak, dt_pp_inflight(k, pp, v, m, r));
                        if (!dt_pp_schedule_valid(k, pp, v, m, r, a, n))
                            fail_msg("%s pp %d v %d m %d rank %d: the checker refuses the schedule's own list",
                                     dt_pp_kind_name(k), pp, v, m, r);
                        lists++;
                    }
                }
            }
        }
    }
    /* gpipe, 1f1b, zb-h1: 36 pp-rank pairs x 16 m each; interleaved: v 2..4 x the m that pp divides */
    assert_true(lists > 3 * 36 * 16);
}

/* What a runtime with one first-in-first-out channel per (sender, receiver, direction) needs:
 * the activations rank r sends to rank q come in the order q's forwards consume them, and the
 * gradients going back in the order q's backwards do. */
static void test_messages_arrive_in_order(void **state) {
    (void)state;
    static dt_pp_action all[8][MAXN];
    int lens[8];
    for (int ki = 0; ki < 4; ki++) {
        for (int pp = 2; pp <= 8; pp++) {
            for (int v = 1; v <= 4; v++) {
                for (int m = 1; m <= 16; m++) {
                    dt_pp_kind k = kinds[ki];
                    if (!accepted(k, pp, v, m)) continue;
                    int S = pp * v;
                    for (int r = 0; r < pp; r++) lens[r] = dt_pp_schedule(k, pp, v, m, r, all[r]);
                    for (int dir = 0; dir < 2; dir++) { /* 0: F forward, 1: B backward */
                        dt_pp_op op = dir ? DT_PP_B : DT_PP_F;
                        int step = dir ? -1 : 1;
                        for (int src = 0; src < pp; src++) {
                            int dst = (src + step + pp) % pp, sent[MAXN][2], ns = 0, ng = 0;
                            for (int i = 0; i < lens[src]; i++) { /* what src sends to dst, in order */
                                const dt_pp_action *a = &all[src][i];
                                int s = a->chunk * pp + src, t = s + step;
                                if (a->op == op && t >= 0 && t < S) sent[ns][0] = a->mb, sent[ns++][1] = t;
                            }
                            for (int i = 0; i < lens[dst]; i++) { /* what dst receives from src */
                                const dt_pp_action *a = &all[dst][i];
                                int t = a->chunk * pp + dst, s = t - step;
                                if (a->op != op || s < 0 || s >= S) continue;
                                if (ng >= ns || sent[ng][0] != a->mb || sent[ng][1] != t)
                                    fail_msg("%s pp %d v %d m %d: rank %d's %c%d:%d is not the next message from rank %d",
                                             dt_pp_kind_name(k), pp, v, m, dst, "FBW"[op], a->mb, a->chunk, src);
                                ng++;
                            }
                            assert_int_equal(ng, ns);
                        }
                    }
                }
            }
        }
    }
}

static double idle_fraction(int pp, double makespan, const double *idle) {
    double s = 0;
    for (int r = 0; r < pp; r++) s += idle[r];
    return s / (pp * makespan);
}

/* Invariant 3: run by all ranks, the lists complete, whatever the durations. */
static void test_replay_never_deadlocks(void **state) {
    (void)state;
    double f1[8], b1[8], w1[8], f2[8], b2[8], w2[8];
    for (int r = 0; r < 8; r++) {
        f1[r] = 1, b1[r] = 2, w1[r] = 1;
        f2[r] = 1 + r % 3, b2[r] = 2.5 + (r * 5 % 7), w2[r] = 0.5 + r % 2; /* uneven stages */
    }
    for (int ki = 0; ki < 4; ki++) {
        for (int pp = 1; pp <= 8; pp++) {
            for (int v = 1; v <= 4; v++) {
                for (int m = 1; m <= 16; m++) {
                    dt_pp_kind k = kinds[ki];
                    if (!accepted(k, pp, v, m)) continue;
                    for (int d = 0; d < 2; d++) {
                        const double *f = d ? f2 : f1, *b = d ? b2 : b1, *w = d ? w2 : w1;
                        double mk = NAN, idle[8];
                        int rc = dt_pp_replay(k, pp, v, m, f, b, w, d ? 0.75 : 0.0, &mk, idle);
                        if (rc != 0) fail_msg("%s pp %d v %d m %d: replay returns %d", dt_pp_kind_name(k), pp, v, m, rc);
                        for (int r = 0; r < pp; r++) {
                            double busy = m * v * (f[r] + b[r] + (k == DT_PP_ZBH1 ? w[r] : 0));
                            assert_true(isfinite(mk) && isfinite(idle[r]));
                            assert_true(fabs(idle[r] - (mk - busy)) <= 1e-9 * mk);
                            assert_true(idle[r] >= 0);
                        }
                    }
                }
            }
        }
    }
}

/* 1f1b pp 2 m 2, f 1, b 2, p2p 0.5. Rank 0: F0 [0,1] F1 [1,2]; rank 1: F0 [1.5,2.5] B0
 * [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5]; rank 0: B0 [5,7] B1 [8,10]. Makespan 10, each rank
 * busy 6. A pair of lists that waits in a circle deadlocks; a repeated action is refused. */
static void test_replay_by_hand(void **state) {
    (void)state;
    double f[2] = {1, 1}, b[2] = {2, 2}, mk = NAN, idle[2] = {NAN, NAN};
    assert_int_equal(dt_pp_replay(DT_PP_1F1B, 2, 1, 2, f, b, NULL, 0.5, &mk, idle), 0);
    assert_true(mk == 10.0 && idle[0] == 4.0 && idle[1] == 4.0);
    /* rank 0's B0 waits for rank 1's B0, which comes after rank 1's F1, which waits for rank
     * 0's F1, which comes after rank 0's B0. */
    dt_pp_action q0[4], q1[4];
    const dt_pp_action *dl[2] = {q0, q1};
    int dlens[2] = {parse_list("F0 B0 F1 B1", q0), parse_list("F0 F1 B0 B1", q1)};
    assert_int_equal(dt_pp_replay_lists(2, 1, 2, dl, dlens, f, b, NULL, 0.5, &mk, idle), -1);
    dlens[1] = parse_list("F0 B0 F0 B1", q1);
    assert_int_equal(dt_pp_replay_lists(2, 1, 2, dl, dlens, f, b, NULL, 0.5, &mk, idle), -2);
}

static void test_bubbles(void **state) {
    (void)state;
    double one[8], two[8], zero[8], half[8], quarter[8], third[8], two3[8], mk = NAN, idle[8];
    for (int r = 0; r < 8; r++)
        one[r] = 1, two[r] = 2, zero[r] = 0, half[r] = 0.5, quarter[r] = 0.25, third[r] = 1.0 / 3, two3[r] = 2.0 / 3;
    for (int pp = 1; pp <= 8; pp++) {
        for (int m = 1; m <= 16; m++) {
            /* 1f1b, f 1, b 2: idle fraction exactly (p-1)/(m+p-1) (all integers: exact in double). */
            assert_int_equal(dt_pp_replay(DT_PP_1F1B, pp, 1, m, one, two, zero, 0, &mk, idle), 0);
            double sum = 0;
            for (int r = 0; r < pp; r++) sum += idle[r];
            if (sum * (m + pp - 1) != (double)(pp - 1) * pp * mk) fail_msg("1f1b pp %d m %d: idle %g of %g", pp, m, sum, pp * mk);
            for (int r = 0; r < pp; r++) /* every rank idles (p-1)(f+b) */
                if (idle[r] != 3.0 * (pp - 1)) fail_msg("1f1b pp %d m %d rank %d: idle %g", pp, m, r, idle[r]);
            double f1b = idle_fraction(pp, mk, idle);
            int peak1 = 0;
            for (int r = 0; r < pp; r++)
                if (dt_pp_inflight(DT_PP_1F1B, pp, 1, m, r) > peak1) peak1 = dt_pp_inflight(DT_PP_1F1B, pp, 1, m, r);
            /* zb-h1: b split in halves (B 1, W 1): strictly less idle at the same peak. */
            assert_int_equal(dt_pp_replay(DT_PP_ZBH1, pp, 1, m, one, one, one, 0, &mk, idle), 0);
            double zb = idle_fraction(pp, mk, idle);
            if (pp > 1 && !(zb < f1b)) fail_msg("zb-h1 pp %d m %d: idle fraction %g, 1f1b %g", pp, m, zb, f1b);
            if (pp == 1 && !(zb == 0 && f1b == 0)) fail_msg("pp 1 m %d: idle %g / %g", m, zb, f1b);
            if (m >= pp) {
                sum = 0;
                for (int r = 0; r < pp; r++) sum += idle[r];
                for (int r = 0; r < pp; r++) /* every rank idles (p-1)(f+b-w) */
                    if (idle[r] != pp - 1.0) fail_msg("zb-h1 pp %d m %d rank %d: idle %g", pp, m, r, idle[r]);
                if (sum * (3 * m + pp - 1) != (double)(pp - 1) * pp * mk)
                    fail_msg("zb-h1 pp %d m %d: idle %g of %g", pp, m, sum, pp * mk);
            }
            for (int r = 0; r < pp; r++) assert_true(dt_pp_inflight(DT_PP_ZBH1, pp, 1, m, r) <= peak1);
            /* interleaved: the same work in v chunks per rank; idle (p-1)/(v m+p-1). */
            if (pp < 2 || m % pp) continue;
            for (int v = 2; v <= 4; v++) {
                const double *fv = v == 2 ? half : v == 3 ? third : quarter, *bv = v == 2 ? one : v == 3 ? two3 : half;
                assert_int_equal(dt_pp_replay(DT_PP_INTERLEAVED, pp, v, m, fv, bv, NULL, 0, &mk, idle), 0);
                double fr = idle_fraction(pp, mk, idle), want = (double)(pp - 1) / (v * m + pp - 1);
                if (!(fabs(fr - want) <= 1e-12))
                    fail_msg("interleaved pp %d v %d m %d: idle fraction %.17g, want %.17g", pp, v, m, fr, want);
                if (v == 2 && !(fr <= 0.75 * f1b)) fail_msg("interleaved pp %d m %d: %g, 1f1b %g", pp, m, fr, f1b);
            }
        }
    }
}

static void swap(dt_pp_action *a, int i, int j) {
    dt_pp_action t = a[i];
    a[i] = a[j];
    a[j] = t;
}

static int find(const dt_pp_action *a, int n, dt_pp_op op, int mb, int chunk) {
    for (int i = 0; i < n; i++)
        if (a[i].op == op && a[i].mb == mb && a[i].chunk == chunk) return i;
    fail_msg("no %c%d:%d", "FBW"[op], mb, chunk);
    return -1;
}

/* The checker the runtime asserts: a list with two passes of one chunk swapped, a pass moved
 * before its input, a pass dropped or added, or more activation sets held than the schedule's
 * bound is not a list of the schedule. */
static void test_checker_catches_wrong_lists(void **state) {
    (void)state;
    dt_pp_action a[MAXN];
    int n;
    n = dt_pp_schedule(DT_PP_1F1B, 4, 1, 8, 1, a);
    swap(a, find(a, n, DT_PP_B, 2, 0), find(a, n, DT_PP_B, 5, 0)); /* two micro-batches' backwards swapped */
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 1, a, n));
    n = dt_pp_schedule(DT_PP_GPIPE, 2, 1, 4, 0, a);
    swap(a, find(a, n, DT_PP_B, 0, 0), find(a, n, DT_PP_B, 3, 0)); /* reversed gpipe backwards */
    assert_false(dt_pp_schedule_valid(DT_PP_GPIPE, 2, 1, 4, 0, a, n));
    n = dt_pp_schedule(DT_PP_INTERLEAVED, 2, 2, 4, 0, a);
    swap(a, find(a, n, DT_PP_B, 0, 1), find(a, n, DT_PP_B, 1, 1));
    assert_false(dt_pp_schedule_valid(DT_PP_INTERLEAVED, 2, 2, 4, 0, a, n));
    n = dt_pp_schedule(DT_PP_ZBH1, 4, 1, 8, 2, a);
    swap(a, find(a, n, DT_PP_W, 3, 0), find(a, n, DT_PP_W, 4, 0)); /* weight passes swapped */
    assert_false(dt_pp_schedule_valid(DT_PP_ZBH1, 4, 1, 8, 2, a, n));
    n = dt_pp_schedule(DT_PP_ZBH1, 4, 1, 8, 2, a);
    swap(a, find(a, n, DT_PP_W, 0, 0), find(a, n, DT_PP_B, 0, 0)); /* W before its B */
    assert_false(dt_pp_schedule_valid(DT_PP_ZBH1, 4, 1, 8, 2, a, n));
    n = dt_pp_schedule(DT_PP_1F1B, 4, 1, 8, 3, a);
    swap(a, find(a, n, DT_PP_F, 1, 0), find(a, n, DT_PP_B, 1, 0)); /* B before its F */
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 3, a, n));
    n = dt_pp_schedule(DT_PP_1F1B, 4, 1, 8, 3, a);
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 3, a, n - 1)); /* one pass short */
    a[n - 1] = (dt_pp_action){DT_PP_W, 7, 0};                             /* a W outside zb-h1 */
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 3, a, n));
    /* gpipe's order on 1f1b's rank 2 holds 8 sets where 1f1b allows 2. */
    n = dt_pp_schedule(DT_PP_GPIPE, 4, 1, 8, 2, a);
    assert_true(dt_pp_schedule_valid(DT_PP_GPIPE, 4, 1, 8, 2, a, n));
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 2, a, n));
    n = dt_pp_schedule(DT_PP_1F1B, 4, 1, 8, 2, a);
    a[0].chunk = 1; /* chunk out of range for v = 1 */
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 4, 1, 8, 2, a, n));
    /* Two micro-batches' backwards swapped on stage 0 of pp 2: the ranks still complete (the
     * replay cannot see the order of accumulation), which is why the checker exists. */
    n = dt_pp_schedule(DT_PP_1F1B, 2, 1, 4, 0, a);
    dt_pp_action b1[MAXN];
    int n1 = dt_pp_schedule(DT_PP_1F1B, 2, 1, 4, 1, b1);
    swap(a, find(a, n, DT_PP_B, 2, 0), find(a, n, DT_PP_B, 3, 0)); /* rank 0's last two backwards */
    const dt_pp_action *lists[2] = {a, b1};
    int lens[2] = {n, n1};
    double f[2] = {1, 1}, b[2] = {2, 2}, mk, idle[2];
    assert_int_equal(dt_pp_replay_lists(2, 1, 4, lists, lens, f, b, NULL, 0, &mk, idle), 0);
    assert_false(dt_pp_schedule_valid(DT_PP_1F1B, 2, 1, 4, 0, a, n));
    assert_true(dt_pp_schedule_valid(DT_PP_1F1B, 2, 1, 4, 1, b1, n1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_parse),
        cmocka_unit_test(test_refusals_name_the_key),
        cmocka_unit_test(test_lists_by_hand),
        cmocka_unit_test(test_invariants_everywhere),
        cmocka_unit_test(test_replay_never_deadlocks),
        cmocka_unit_test(test_replay_by_hand),
        cmocka_unit_test(test_bubbles),
        cmocka_unit_test(test_messages_arrive_in_order),
        cmocka_unit_test(test_checker_catches_wrong_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
