/* Tests of the flash-style attention kernels (ops/cpu/attention.c) against the naive
 * double-precision reference, of the reference against finite differences, and of
 * determinism and causality of the fast kernels. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "ops/ops_ref.h"

typedef struct shape {
    int B, T, C, NH, NKV, causal; /* C = NH * hs (query width) */
} shape;

/* Tile-edge cases: T not a multiple of the tile, T = 1, NH = 1, hs not a multiple of 16,
 * hs > 64 (more than one register block of columns), and a multi-tile T; grouped-query
 * (NKV < NH) and multi-query (NKV = 1) heads; bidirectional (causal 0) rows. */
static const shape k_shapes[] = {
    {2, 37, 24, 3, 3, 1},  {1, 130, 64, 4, 4, 1}, {2, 256, 128, 4, 4, 1}, {3, 1, 32, 2, 2, 1},
    {1, 50, 20, 1, 1, 1},  {1, 70, 200, 2, 2, 1}, {1, 33, 48, 1, 1, 1},
    {2, 37, 64, 4, 2, 1},  {1, 130, 96, 6, 1, 1}, {2, 70, 48, 6, 3, 1},
    {2, 37, 24, 3, 3, 0},  {1, 130, 64, 4, 2, 0}, {2, 17, 8, 4, 1, 0},
};
/* Floats of one qkv row. */
#define QKV_W(s) ((size_t)((s).NH + 2 * (s).NKV) * ((s).C / (s).NH))
#define HS(s) ((s).C / (s).NH)
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

/* Everything one shape needs, float and double. */
typedef struct att_case {
    shape s;
    size_t nqkv, nout, nlse;
    float *qkv, *out, *lse, *dout, *dqkv;
    double *qkv_d, *out_d, *lse_d, *dout_d, *dqkv_d;
} att_case;

static void case_init(att_case *c, shape s, uint64_t seed) {
    c->s = s;
    c->nqkv = (size_t)s.B * s.T * QKV_W(s);
    c->nout = (size_t)s.B * s.T * s.C;
    c->nlse = (size_t)s.B * s.NH * s.T;
    c->qkv = tu_malloc(c->nqkv * sizeof(float));
    c->dqkv = tu_malloc(c->nqkv * sizeof(float));
    c->out = tu_malloc(c->nout * sizeof(float));
    c->dout = tu_malloc(c->nout * sizeof(float));
    c->lse = tu_malloc(c->nlse * sizeof(float));
    c->qkv_d = tu_malloc(c->nqkv * sizeof(double));
    c->dqkv_d = tu_malloc(c->nqkv * sizeof(double));
    c->out_d = tu_malloc(c->nout * sizeof(double));
    c->dout_d = tu_malloc(c->nout * sizeof(double));
    c->lse_d = tu_malloc(c->nlse * sizeof(double));
    /* Scale 2 gives scores of a few units: peaked but not one-hot softmax rows. */
    tu_fill_uniform(c->qkv, c->nqkv, 2.0f, seed);
    tu_fill_uniform(c->dout, c->nout, 1.0f, seed + 1);
    tu_to_double(c->qkv_d, c->qkv, c->nqkv);
    tu_to_double(c->dout_d, c->dout, c->nout);
}

static void case_free(att_case *c) {
    free(c->qkv), free(c->dqkv), free(c->out), free(c->dout), free(c->lse);
    free(c->qkv_d), free(c->dqkv_d), free(c->out_d), free(c->dout_d), free(c->lse_d);
}

static void case_run_fast(att_case *c) {
    shape s = c->s;
    dt_attention_forward(c->out, c->lse, c->qkv, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, DT_F32);
    /* Poison dqkv: the kernel must overwrite every element, not accumulate. */
    for (size_t i = 0; i < c->nqkv; i++) c->dqkv[i] = NAN;
    dt_attention_backward(c->dqkv, c->dout, c->qkv, c->out, c->lse, s.B, s.T, s.NH, s.NKV,
                          HS(s), s.causal, DT_F32);
}

static void case_run_ref(att_case *c) {
    shape s = c->s;
    dt_ref_attention_forward(c->out_d, c->lse_d, c->qkv_d, s.B, s.T, s.NH, s.NKV, HS(s),
                             s.causal);
    dt_ref_attention_backward(c->dqkv_d, c->dout_d, c->qkv_d, c->out_d, c->lse_d, s.B, s.T,
                              s.NH, s.NKV, HS(s), s.causal);
}

static void forward_matches_double_reference(void) {
    for (size_t k = 0; k < N_SHAPES; k++) {
        att_case c;
        case_init(&c, k_shapes[k], 100 + k);
        case_run_fast(&c);
        case_run_ref(&c);
        double eo = tu_rel_err(c.out, c.out_d, c.nout);
        double el = tu_rel_err(c.lse, c.lse_d, c.nlse);
        printf("forward  B=%d T=%3d C=%3d NH=%d NKV=%d causal=%d: rel err out %.2e lse %.2e\n",
               c.s.B, c.s.T, c.s.C, c.s.NH, c.s.NKV, c.s.causal, eo, el);
        assert_true(eo < 1e-5);
        assert_true(el < 1e-5);
        case_free(&c);
    }
}

static void test_forward_matches_double_reference(void **state) {
    (void)state;
    tu_each_isa(forward_matches_double_reference);
}

static void backward_matches_double_reference(void) {
    for (size_t k = 0; k < N_SHAPES; k++) {
        att_case c;
        case_init(&c, k_shapes[k], 200 + k);
        case_run_fast(&c);
        case_run_ref(&c);
        double e = tu_rel_err(c.dqkv, c.dqkv_d, c.nqkv);
        printf("backward B=%d T=%3d C=%3d NH=%d NKV=%d causal=%d: rel err dqkv %.2e\n", c.s.B,
               c.s.T, c.s.C, c.s.NH, c.s.NKV, c.s.causal, e);
        assert_true(e < 1e-4);
        case_free(&c);
    }
}

static void test_backward_matches_double_reference(void **state) {
    (void)state;
    tu_each_isa(backward_matches_double_reference);
}

/* loss = sum(out * G) through the reference forward. */
static double ref_loss(const double *qkv, const double *G, double *out, double *lse, shape s) {
    dt_ref_attention_forward(out, lse, qkv, s.B, s.T, s.NH, s.NKV, HS(s), s.causal);
    double loss = 0.0;
    for (size_t i = 0; i < (size_t)s.B * s.T * s.C; i++) loss += out[i] * G[i];
    return loss;
}

static void reference_backward_matches_finite_differences(shape s) {
    const size_t nqkv = (size_t)s.B * s.T * QKV_W(s), nout = (size_t)s.B * s.T * s.C;
    const size_t nlse = (size_t)s.B * s.NH * s.T;
    double *qkv = tu_malloc(nqkv * sizeof(double)), *G = tu_malloc(nout * sizeof(double));
    double *out = tu_malloc(nout * sizeof(double)), *lse = tu_malloc(nlse * sizeof(double));
    double *dqkv = tu_malloc(nqkv * sizeof(double)), *fd = tu_malloc(nqkv * sizeof(double));
    tu_fill_uniform_d(qkv, nqkv, 2.0, 301);
    tu_fill_uniform_d(G, nout, 1.0, 302);
    ref_loss(qkv, G, out, lse, s);
    dt_ref_attention_backward(dqkv, G, qkv, out, lse, s.B, s.T, s.NH, s.NKV, HS(s), s.causal);
    const double eps = 1e-6;
    for (size_t i = 0; i < nqkv; i++) {
        double x = qkv[i];
        qkv[i] = x + eps;
        double lp = ref_loss(qkv, G, out, lse, s);
        qkv[i] = x - eps;
        double lm = ref_loss(qkv, G, out, lse, s);
        qkv[i] = x;
        fd[i] = (lp - lm) / (2 * eps);
    }
    double e = tu_rel_err_dd(dqkv, fd, nqkv);
    printf("reference backward vs central differences (NH=%d NKV=%d causal=%d): rel err %.2e\n",
           s.NH, s.NKV, s.causal, e);
    assert_true(e < 1e-6);
    free(qkv), free(G), free(out), free(lse), free(dqkv), free(fd);
}

static void test_reference_backward_matches_finite_differences(void **state) {
    (void)state;
    const shape cases[] = {{1, 5, 8, 2, 2, 1}, {2, 5, 12, 3, 1, 1}, {1, 6, 16, 4, 2, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        reference_backward_matches_finite_differences(cases[k]);
}

static void fast_kernels_are_bitwise_deterministic(void) {
    const shape s = {2, 100, 96, 4, 2, 1};
    att_case a, b;
    case_init(&a, s, 400);
    case_init(&b, s, 400);
    case_run_fast(&a);
    case_run_fast(&b);
    assert_memory_equal(a.out, b.out, a.nout * sizeof(float));
    assert_memory_equal(a.lse, b.lse, a.nlse * sizeof(float));
    assert_memory_equal(a.dqkv, b.dqkv, a.nqkv * sizeof(float));
    case_free(&a);
    case_free(&b);
}

static void test_fast_kernels_are_bitwise_deterministic(void **state) {
    (void)state;
    tu_each_isa(fast_kernels_are_bitwise_deterministic);
}

static void future_keys_values_do_not_change_earlier_outputs(void) {
    const shape s = {2, 70, 64, 4, 4, 1};
    const int t0 = 40; /* inside the second tile, so the diagonal tile is exercised */
    att_case a, b;
    case_init(&a, s, 500);
    case_init(&b, s, 500);
    for (int bb = 0; bb < s.B; bb++)
        for (int t = t0; t < s.T; t++)
            for (int i = s.C; i < 3 * s.C; i++) /* k and v of every head */
                b.qkv[((size_t)bb * s.T + t) * 3 * s.C + i] += 0.5f;
    case_run_fast(&a);
    case_run_fast(&b);
    for (int bb = 0; bb < s.B; bb++) {
        const size_t row0 = (size_t)bb * s.T * s.C;
        assert_memory_equal(a.out + row0, b.out + row0, (size_t)t0 * s.C * sizeof(float));
        /* ... while the perturbation is visible from t0 on (the test can fail). */
        assert_memory_not_equal(a.out + row0 + (size_t)t0 * s.C,
                                b.out + row0 + (size_t)t0 * s.C, (size_t)s.C * sizeof(float));
        for (int h = 0; h < s.NH; h++) {
            const size_t l0 = ((size_t)bb * s.NH + h) * s.T;
            assert_memory_equal(a.lse + l0, b.lse + l0, (size_t)t0 * sizeof(float));
        }
    }
    case_free(&a);
    case_free(&b);
}

static void test_future_keys_values_do_not_change_earlier_outputs(void **state) {
    (void)state;
    tu_each_isa(future_keys_values_do_not_change_earlier_outputs);
}

/* Grouped-query attention is multi-head attention with each kv head copied to the NH/NKV
 * query heads of its group. The forward of a query head reads its kv head through the same
 * operations either way, so out and lse are bitwise equal (found on every path; asserted
 * as such), as is dQ. dK/dV of a kv head are the sum over its group of the MHA dK/dV: the
 * kernel sums the group inside its tile accumulators, a different rounding order than
 * summing the per-head results, so relative 1e-5 (measured <= 1.2e-6). */
static void gqa_equals_replicated_mha(void) {
    const int B = 2, T = 70, NH = 6, hs = 24; /* T: three tiles, the last partial */
    const int nkvs[2] = {2, 1};
    for (int k = 0; k < 2; k++)
        for (int causal = 1; causal >= 0; causal--) {
            const int NKV = nkvs[k], group = NH / NKV;
            const shape sg = {B, T, NH * hs, NH, NKV, causal}, sm = {B, T, NH * hs, NH, NH, causal};
            att_case g, m;
            case_init(&g, sg, 600 + 2 * k + causal);
            case_init(&m, sm, 0);
            const size_t wg = QKV_W(sg), wm = QKV_W(sm), qw = (size_t)NH * hs;
            for (size_t r = 0; r < (size_t)B * T; r++) {
                const float *src = g.qkv + r * wg;
                float *dst = m.qkv + r * wm;
                memcpy(dst, src, qw * sizeof(float)); /* the query heads */
                for (int h = 0; h < NH; h++) {
                    const int j = h / group;
                    memcpy(dst + qw + (size_t)h * hs, src + qw + (size_t)j * hs,
                           hs * sizeof(float));
                    memcpy(dst + 2 * qw + (size_t)h * hs,
                           src + qw + (size_t)(NKV + j) * hs, hs * sizeof(float));
                }
            }
            memcpy(m.dout, g.dout, g.nout * sizeof(float));
            case_run_fast(&g);
            case_run_fast(&m);
            printf("GQA NH=%d NKV=%d causal=%d vs replicated MHA:", NH, NKV, causal);
            assert_memory_equal(g.out, m.out, g.nout * sizeof(float));
            assert_memory_equal(g.lse, m.lse, g.nlse * sizeof(float));
            /* Backward: dQ bitwise; dK, dV of kv head j = sum over h in its group. */
            const size_t nkv = (size_t)B * T * NKV * hs;
            double *sum_dk = tu_malloc(nkv * sizeof(double));
            double *sum_dv = tu_malloc(nkv * sizeof(double));
            float *dk = tu_malloc(nkv * sizeof(float)), *dv = tu_malloc(nkv * sizeof(float));
            for (size_t r = 0; r < (size_t)B * T; r++) {
                const float *dg = g.dqkv + r * wg, *dm = m.dqkv + r * wm;
                assert_memory_equal(dg, dm, qw * sizeof(float));
                memcpy(dk + r * NKV * hs, dg + qw, (size_t)NKV * hs * sizeof(float));
                memcpy(dv + r * NKV * hs, dg + qw + (size_t)NKV * hs,
                       (size_t)NKV * hs * sizeof(float));
                for (int h = 0; h < NH; h++) /* ascending h, in double */
                    for (int i = 0; i < hs; i++) {
                        const size_t o = r * NKV * hs + (size_t)(h / group) * hs + i;
                        sum_dk[o] += dm[qw + (size_t)h * hs + i];
                        sum_dv[o] += dm[2 * qw + (size_t)h * hs + i];
                    }
            }
            const double ek = tu_rel_err(dk, sum_dk, nkv), ev = tu_rel_err(dv, sum_dv, nkv);
            printf(" out, lse, dQ bitwise equal; dK rel err %.2e, dV %.2e\n", ek, ev);
            assert_true(ek < 1e-5);
            assert_true(ev < 1e-5);
            free(sum_dk), free(sum_dv), free(dk), free(dv);
            case_free(&g);
            case_free(&m);
        }
}

static void test_gqa_equals_replicated_mha(void **state) {
    (void)state;
    tu_each_isa(gqa_equals_replicated_mha);
}

/* Bidirectional mode (causal = 0) is not causal: changing only the last position's keys
 * changes the outputs and lse of the earliest rows. The same change under causal = 1
 * leaves every earlier row bitwise unchanged (the control: the change is seen because the
 * mode lets it be, not because of some other input). */
static void bidirectional_sees_future_keys(void) {
    const shape shapes[2] = {{2, 70, 64, 4, 4, 0}, {1, 70, 48, 6, 2, 0}};
    for (int k = 0; k < 2; k++)
        for (int causal = 0; causal <= 1; causal++) {
            shape s = shapes[k];
            s.causal = causal;
            const int tk = s.T - 1, hs = HS(s);
            const size_t w = QKV_W(s);
            att_case a, b;
            case_init(&a, s, 700 + k);
            case_init(&b, s, 700 + k);
            for (int bb = 0; bb < s.B; bb++) /* the k heads of position tk only */
                for (int i = s.NH * hs; i < (s.NH + s.NKV) * hs; i++)
                    b.qkv[((size_t)bb * s.T + tk) * w + i] += 0.5f;
            case_run_fast(&a);
            case_run_fast(&b);
            for (int bb = 0; bb < s.B; bb++)
                for (int h = 0; h < s.NH; h++) {
                    const size_t l0 = ((size_t)bb * s.NH + h) * s.T;
                    for (int t = 0; t < tk; t += tk - 1) { /* the first and the last earlier row */
                        const size_t o = ((size_t)bb * s.T + t) * s.C + (size_t)h * hs;
                        if (causal) {
                            assert_memory_equal(a.out + o, b.out + o, hs * sizeof(float));
                            assert_true(a.lse[l0 + t] == b.lse[l0 + t]);
                        } else {
                            assert_memory_not_equal(a.out + o, b.out + o, hs * sizeof(float));
                            assert_true(a.lse[l0 + t] != b.lse[l0 + t]);
                        }
                    }
                }
            if (causal) /* and every earlier row at all */
                for (int bb = 0; bb < s.B; bb++) {
                    const size_t row0 = (size_t)bb * s.T * s.C, nb = (size_t)tk * s.C;
                    assert_memory_equal(a.out + row0, b.out + row0, nb * sizeof(float));
                }
            printf("NH=%d NKV=%d causal=%d: key at t=%d %s rows 0 and %d\n", s.NH, s.NKV, causal,
                   tk, causal ? "leaves unchanged" : "changes", tk - 1);
            case_free(&a);
            case_free(&b);
        }
}

static void test_bidirectional_sees_future_keys(void **state) {
    (void)state;
    tu_each_isa(bidirectional_sees_future_keys);
}

/* ---- mixed precision: the products on 16-bit operands (ops.h dt_attention_forward op) */

static double r16(dt_dtype op, double x) {
    float f = (float)x;
    uint16_t h;
    dt_to_lowp(op, &h, &f, 1);
    dt_from_lowp(op, &f, &h, 1);
    return f;
}

/* ||a - b|| / ||b||. */
static double nrel(const float *a, const double *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
    return sqrt(d / r);
}

/* The op-rounded attention written out naively in double for T <= 32 (one key tile, so the
 * kernel's running max is the row max): q, k, v, dO rounded; out = sum R(exp(s - max)) v / l;
 * P = exp(s - lse) rounded for dV, dS = P (dP - D) scale (unrounded P) rounded for dK, dQ. */
static void ref_lowp(const att_case *c, dt_dtype op, double *out, double *dqkv) {
    shape s = c->s;
    const int hs = HS(s), T = s.T, group = s.NH / s.NKV;
    const size_t ld = QKV_W(s);
    const double scale = 1.0 / sqrt((double)hs);
    double *qkv = tu_malloc(c->nqkv * sizeof(double)), *dO = tu_malloc(c->nout * sizeof(double));
    double *p = tu_malloc((size_t)T * T * sizeof(double)), *ds = tu_malloc((size_t)T * T * sizeof(double));
    for (size_t i = 0; i < c->nqkv; i++) qkv[i] = r16(op, c->qkv[i]);
    for (size_t i = 0; i < c->nout; i++) dO[i] = r16(op, c->dout[i]);
    memset(dqkv, 0, c->nqkv * sizeof(double));
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++) {
            const int kv = h / group;
            const double *Q = qkv + (size_t)b * T * ld + (size_t)h * hs;
            const double *K = qkv + (size_t)b * T * ld + (size_t)(s.NH + kv) * hs;
            const double *V = qkv + (size_t)b * T * ld + (size_t)(s.NH + s.NKV + kv) * hs;
            for (int i = 0; i < T; i++) {
                int nk = s.causal ? i + 1 : T;
                double mx = -INFINITY, l = 0, lse;
                for (int j = 0; j < nk; j++) {
                    double d = 0;
                    for (int e = 0; e < hs; e++) d += Q[(size_t)i * ld + e] * K[(size_t)j * ld + e];
                    p[(size_t)i * T + j] = d * scale;
                    mx = fmax(mx, d * scale);
                }
                for (int j = 0; j < nk; j++) l += exp(p[(size_t)i * T + j] - mx);
                lse = mx + log(l);
                double *o = out + ((size_t)b * T + i) * s.C + (size_t)h * hs;
                for (int e = 0; e < hs; e++) {
                    double acc = 0;
                    for (int j = 0; j < nk; j++) acc += r16(op, exp(p[(size_t)i * T + j] - mx)) * V[(size_t)j * ld + e];
                    o[e] = acc / l;
                }
                const double *g = dO + ((size_t)b * T + i) * s.C + (size_t)h * hs;
                double D = 0;
                for (int e = 0; e < hs; e++) D += g[e] * (float)o[e]; /* the kernel's O is fp32 */
                for (int j = 0; j < nk; j++) {
                    double pij = exp(p[(size_t)i * T + j] - lse), dp = 0;
                    for (int e = 0; e < hs; e++) dp += g[e] * V[(size_t)j * ld + e];
                    ds[(size_t)i * T + j] = r16(op, pij * (dp - D) * scale);
                    p[(size_t)i * T + j] = r16(op, pij);
                }
                for (int j = nk; j < T; j++) ds[(size_t)i * T + j] = p[(size_t)i * T + j] = 0;
            }
            double *dQ = dqkv + (size_t)b * T * ld + (size_t)h * hs;
            double *dK = dqkv + (size_t)b * T * ld + (size_t)(s.NH + kv) * hs;
            double *dV = dqkv + (size_t)b * T * ld + (size_t)(s.NH + s.NKV + kv) * hs;
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++)
                    for (int e = 0; e < hs; e++) {
                        const double *g = dO + ((size_t)b * T + i) * s.C + (size_t)h * hs;
                        dQ[(size_t)i * ld + e] += ds[(size_t)i * T + j] * K[(size_t)j * ld + e];
                        dK[(size_t)j * ld + e] += ds[(size_t)i * T + j] * Q[(size_t)i * ld + e];
                        dV[(size_t)j * ld + e] += p[(size_t)i * T + j] * g[e];
                    }
        }
    free(qkv), free(dO), free(p), free(ds);
}

/* One key tile (T <= 32), causal and bidirectional, GQA and MQA, hs off the vector width. */
static const shape k_lowp_shapes[] = {{2, 29, 24, 3, 3, 1}, {1, 32, 64, 4, 2, 1}, {2, 17, 8, 4, 1, 0}, {1, 5, 48, 4, 4, 0}};

static void lowp_matches_rounded_reference(void) {
    static const dt_dtype ops[] = {DT_BF16, DT_F16};
    for (size_t si = 0; si < sizeof k_lowp_shapes / sizeof k_lowp_shapes[0]; si++)
        for (int oi = 0; oi < 2; oi++) {
            att_case c;
            shape s = k_lowp_shapes[si];
            case_init(&c, s, 300 + si);
            double *out = tu_malloc(c.nout * sizeof(double)), *dq = tu_malloc(c.nqkv * sizeof(double));
            dt_attention_forward(c.out, c.lse, c.qkv, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, ops[oi]);
            dt_attention_backward(c.dqkv, c.dout, c.qkv, c.out, c.lse, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, ops[oi]);
            ref_lowp(&c, ops[oi], out, dq);
            double eo = nrel(c.out, out, c.nout), eg = nrel(c.dqkv, dq, c.nqkv);
            /* Sensitivity: the fp32 kernel (nothing rounded) against the same reference. */
            float *o32 = tu_malloc(c.nout * sizeof(float)), *g32 = tu_malloc(c.nqkv * sizeof(float));
            float *l32 = tu_malloc(c.nlse * sizeof(float));
            dt_attention_forward(o32, l32, c.qkv, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, DT_F32);
            dt_attention_backward(g32, c.dout, c.qkv, o32, l32, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, DT_F32);
            double so = nrel(o32, out, c.nout), sg = nrel(g32, dq, c.nqkv);
            printf("  %s B%d T%d C%d NH%d NKV%d causal %d: out nrel %.2e, dqkv %.2e (unrounded fp32 kernel: %.2e, %.2e)\n",
                   dt_dtype_name(ops[oi]), s.B, s.T, s.C, s.NH, s.NKV, s.causal, eo, eg, so, sg);
            assert_true(eo <= 2e-6 && eg <= 2e-5);
            assert_true(so >= 10 * 2e-6 && sg >= 10 * 2e-5); /* the rounding is there */
            free(out), free(dq), free(o32), free(g32), free(l32);
            case_free(&c);
        }
}

static void test_lowp_products_match_rounded_reference(void **state) {
    (void)state;
    tu_each_isa(lowp_matches_rounded_reference);
}

/* Several key tiles: the running max rounds exp(s - m) against a smaller m than the row's,
 * so only bf16-level agreement with the fp32 reference is claimed, and fp32 op is unchanged. */
static void lowp_multi_tile(void) {
    shape s = {2, 130, 64, 4, 2, 1};
    att_case c;
    case_init(&c, s, 77);
    case_run_ref(&c);
    dt_attention_forward(c.out, c.lse, c.qkv, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, DT_BF16);
    dt_attention_backward(c.dqkv, c.dout, c.qkv, c.out, c.lse, s.B, s.T, s.NH, s.NKV, HS(s), s.causal, DT_BF16);
    double eo = nrel(c.out, c.out_d, c.nout), eg = nrel(c.dqkv, c.dqkv_d, c.nqkv);
    printf("  bf16, 5 key tiles vs fp64: out nrel %.2e, dqkv %.2e\n", eo, eg);
    assert_true(eo < 1e-2 && eg < 2e-2 && eo > 1e-5);
    case_free(&c);
}

static void test_lowp_multi_tile(void **state) {
    (void)state;
    tu_each_isa(lowp_multi_tile);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_double_reference),
        cmocka_unit_test(test_backward_matches_double_reference),
        cmocka_unit_test(test_reference_backward_matches_finite_differences),
        cmocka_unit_test(test_fast_kernels_are_bitwise_deterministic),
        cmocka_unit_test(test_future_keys_values_do_not_change_earlier_outputs),
        cmocka_unit_test(test_gqa_equals_replicated_mha),
        cmocka_unit_test(test_bidirectional_sees_future_keys),
        cmocka_unit_test(test_lowp_products_match_rounded_reference),
        cmocka_unit_test(test_lowp_multi_tile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
