/* Gradient compression: Top-K sparsification with error feedback (parallel/topk.h) and the
 * 16-bit casting reductions in fp16 and bf16 (comm.h dt_comm_*_lp), as one process and under
 * mpiexec (test_topk_mpi: 3 ranks, over shared memory and over MPI):
 *  - block k: ceil(ratio x length), at least 1, at most the length; pairs of odd sizes;
 *  - the chosen positions against a sort by (|x| descending, index ascending), with many tied
 *    magnitudes, signed zeros, blocks of 1 .. 65536 elements; the tie-break spelled out;
 *  - the residual is exactly what was not sent: over several steps, every element's sent value
 *    plus its new residual equals (exactly, in double) its gradient plus its old residual; an
 *    unsent element keeps all of it, fp32 values leave nothing, bf16 values their rounding error;
 *  - ratio 1 sends everything: the residual stays -0.0, and the summed messages are bitwise the
 *    dense ordered all-reduce (fp32) and the dense bf16 one (comm.h's rule);
 *  - ratio < 1 across ranks: bitwise the rank-order sum of each rank's reference choice; sizes
 *    smaller than the rank count; the bytes counted are the all-gather's, (W-1)/W of all
 *    messages, and at 1% they are >= 50x below the dense fp32 all-reduce's at 2 ranks;
 *  - fp16 and bf16 all-reduce and reduce-scatter (uneven owners, an owner of nothing) bitwise
 *    comm.h's rule, with fp16 subnormal magnitudes; fp16's results are not bf16's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "ops/ops.h"
#include "parallel/topk.h"
#include "testutil.h"

static dt_comm *C;
static dt_ctx X;

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* Values with many equal magnitudes of both signs, and signed zeros. */
static void fill_tied(float *x, size_t n, uint64_t seed) {
    tu_fill_uniform(x, n, 1.0f, seed);
    for (size_t i = 0; i < n; i++) {
        float q = floorf(fabsf(x[i]) * 8.0f) / 8.0f; /* 8 levels */
        x[i] = x[i] < 0 ? -q : q;
    }
}

/* The reference choice: indices sorted by (|x| desc, index asc), the first k, ascending. */
static const float *g_x;
static int by_mag(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    float u = fabsf(g_x[i]), v = fabsf(g_x[j]);
    if (u != v) return u > v ? -1 : 1;
    return i < j ? -1 : 1;
}
static int by_idx(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return i < j ? -1 : i > j;
}
static void ref_select(const float *x, size_t len, size_t k, size_t *out) {
    size_t *o = tu_malloc((len ? len : 1) * sizeof *o);
    for (size_t i = 0; i < len; i++) o[i] = i;
    g_x = x;
    qsort(o, len, sizeof *o, by_mag);
    qsort(o, k, sizeof *o, by_idx);
    memcpy(out, o, k * sizeof *out);
    free(o);
}

static void test_block_k(void **state) {
    (void)state;
    assert_int_equal(dt_topk_block_k(0, 0.01), 0);
    assert_int_equal(dt_topk_block_k(1, 0.01), 1);
    assert_int_equal(dt_topk_block_k(100, 0.01), 1);
    assert_int_equal(dt_topk_block_k(101, 0.01), 2);
    assert_int_equal(dt_topk_block_k(65536, 0.01), 656);
    assert_int_equal(dt_topk_block_k(65536, 0.01f), 656); /* the key is a float */
    assert_int_equal(dt_topk_block_k(7, 0.5), 4);
    assert_int_equal(dt_topk_block_k(10, 1.0), 10);
    assert_int_equal(dt_topk_block_k(65536, 1.0), 65536);
    assert_int_equal(dt_topk_pairs(2 * 65536 + 37, 0.01), 656 + 656 + 1);
    assert_int_equal(dt_topk_pairs(0, 0.5), 0);
    /* fp32: 2 index/value words + 1, bf16 1 + 1 */
    assert_int_equal(dt_topk_words(2 * 65536 + 37, 0.01, DT_F32), 3 * (656 + 656 + 1));
    assert_int_equal(dt_topk_words(2 * 65536 + 37, 0.01, DT_BF16), 2 * (656 + 656 + 1));
}

static void test_tie_break(void **state) {
    (void)state;
    const float x[] = {1.0f, -3.0f, 3.0f, 2.0f, -3.0f, -0.0f, 0.0f};
    uint16_t idx[7];
    dt_topk_select(x, 7, 2, idx); /* |-3| at 1 and |3| at 2 beat the |-3| at 4 by index */
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 2);
    dt_topk_select(x, 7, 3, idx);
    assert_int_equal(idx[2], 4);
    dt_topk_select(x, 7, 6, idx); /* then 2, 1, and the first of the two zeros */
    const uint16_t want[6] = {0, 1, 2, 3, 4, 5};
    for (int i = 0; i < 6; i++) assert_int_equal(idx[i], want[i]);
    dt_topk_select(x, 7, 7, idx);
    assert_int_equal(idx[6], 6);
}

static void test_select_vs_reference(void **state) {
    (void)state;
    const size_t lens[] = {1, 2, 7, 255, 1000, 4097, 65536};
    const double ratios[] = {0.01, 0.1, 0.5, 1.0};
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
        for (size_t b = 0; b < 4; b++)
            for (int tied = 0; tied < 2; tied++) {
                size_t len = lens[a], k = dt_topk_block_k(len, ratios[b]);
                float *x = tu_malloc(len * sizeof *x);
                if (tied) fill_tied(x, len, 7 + a);
                else tu_fill_uniform(x, len, 1.0f, 7 + a);
                uint16_t *idx = tu_malloc(k * sizeof *idx);
                size_t *want = tu_malloc(k * sizeof *want);
                dt_topk_select(x, len, k, idx);
                ref_select(x, len, k, want);
                for (size_t j = 0; j < k; j++) assert_int_equal(idx[j], want[j]);
                free(x), free(idx), free(want);
            }
}

/* One rank's encode: the residual identity, unsent elements keep everything, the chosen set is
 * the reference's of g + residual. Returns the decoded values (what was sent; -0.0 elsewhere). */
static void check_encode(float *g, float *res, size_t n, double ratio, dt_dtype vt) {
    float *acc = tu_malloc(n * sizeof *acc), *sent = tu_malloc(n * sizeof *sent);
    for (size_t i = 0; i < n; i++) acc[i] = g[i] + res[i];
    uint16_t *msg = tu_malloc(dt_topk_words(n, ratio, vt) * sizeof *msg);
    dt_topk_encode(g, res, n, ratio, vt, msg);
    dt_topk_sum(sent, n, ratio, vt, msg, 1);
    size_t K = 0;
    for (size_t lo = 0; lo < n; lo += DT_TOPK_BLOCK) {
        size_t len = n - lo < DT_TOPK_BLOCK ? n - lo : DT_TOPK_BLOCK, k = dt_topk_block_k(len, ratio);
        size_t *want = tu_malloc(k * sizeof *want);
        ref_select(acc + lo, len, k, want);
        char *chosen = tu_malloc(len);
        for (size_t j = 0; j < k; j++) {
            chosen[want[j]] = 1;
            assert_int_equal(msg[K + j], want[j]); /* the message's indices, in order */
        }
        for (size_t i = 0; i < len; i++) {
            size_t e = lo + i;
            assert_true(bits(g[e]) == bits(acc[e])); /* g is left holding g + residual */
            /* exactly what was not sent: sent + residual == g + old residual */
            assert_true((double)sent[e] + (double)res[e] == (double)acc[e]);
            if (!chosen[i]) {
                assert_true(bits(sent[e]) == 0x80000000u);
                assert_true(res[e] == acc[e]);
            } else if (vt == DT_F32) {
                assert_true(bits(sent[e]) == bits(acc[e]));
                assert_true(bits(res[e]) == 0x80000000u); /* a zero residual is -0.0 */
            }
            if (res[e] == 0.0f) assert_true(bits(res[e]) == 0x80000000u);
        }
        K += k;
        free(want), free(chosen);
    }
    assert_int_equal(K, dt_topk_pairs(n, ratio));
    free(acc), free(sent), free(msg);
}

static void test_residual_exact(void **state) {
    (void)state;
    const size_t n = 2 * DT_TOPK_BLOCK + 37;
    const double ratios[] = {0.01, 0.3};
    const dt_dtype vts[] = {DT_F32, DT_BF16};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            float *g = tu_malloc(n * sizeof *g), *res = tu_malloc(n * sizeof *res);
            dt_topk_residual_clear(res, n);
            for (int step = 0; step < 5; step++) { /* the residual carries over steps */
                tu_fill_uniform(g, n, 1.0f, 100 + (uint64_t)step);
                if (step == 2) fill_tied(g, n, 5);
                check_encode(g, res, n, ratios[a], vts[b]);
            }
            free(g), free(res);
        }
}

static void test_ratio1_sends_everything(void **state) {
    (void)state;
    const size_t n = DT_TOPK_BLOCK + 5;
    float *g = tu_malloc(n * sizeof *g), *res = tu_malloc(n * sizeof *res), *out = tu_malloc(n * sizeof *out);
    tu_fill_uniform(g, n, 1.0f, 3);
    g[0] = -0.0f; /* a signed zero goes through as itself */
    float *g0 = tu_malloc(n * sizeof *g0);
    memcpy(g0, g, n * sizeof *g);
    dt_topk_residual_clear(res, n);
    uint16_t *msg = tu_malloc(dt_topk_words(n, 1.0, DT_F32) * sizeof *msg);
    dt_topk_encode(g, res, n, 1.0, DT_F32, msg);
    dt_topk_sum(out, n, 1.0, DT_F32, msg, 1);
    for (size_t i = 0; i < n; i++) {
        assert_true(bits(out[i]) == bits(g0[i]));
        assert_true(bits(res[i]) == 0x80000000u);
    }
    free(g), free(res), free(out), free(g0), free(msg);
}

/* What rank r contributes at i (fixed, so every rank can recompute anyone's). */
static void contrib(float *x, size_t n, int r, int round) { tu_fill_uniform(x, n, 1.0f, 1000u * (uint64_t)r + (uint64_t)round); }

/* All ranks: encode my part, all-gather the messages, sum them; returns the bytes counted. */
static uint64_t topk_reduce(float *g, float *res, size_t n, double ratio, dt_dtype vt) {
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    size_t words = dt_topk_words(n, ratio, vt), cnt[16], dis[16];
    uint16_t *msgs = tu_malloc((size_t)W * words * sizeof *msgs + 2);
    for (int w = 0; w < W; w++) cnt[w] = words, dis[w] = (size_t)w * words;
    dt_topk_encode(g, res, n, ratio, vt, msgs + dis[me]);
    uint64_t b0 = dt_comm_bytes(C);
    assert_int_equal(dt_comm_allgatherv_bf16(&X, C, DT_GROUP_WORLD, msgs, cnt, dis), DT_OK);
    uint64_t bytes = dt_comm_bytes(C) - b0;
    dt_topk_sum(g, n, ratio, vt, msgs, W);
    free(msgs);
    return bytes;
}

static void test_ratio1_is_dense(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    const size_t sizes[] = {1, 2, (size_t)W > 1 ? (size_t)W - 1 : 1, 1001, DT_TOPK_BLOCK + 3};
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        size_t n = sizes[a];
        float *g = tu_malloc(n * 4), *d = tu_malloc(n * 4), *res = tu_malloc(n * 4);
        float *scratch = tu_malloc((n + (size_t)W) * 4 * (size_t)W);
        uint16_t *s16 = tu_malloc(DT_COMM_AR_BF16_SCRATCH(n, W) * 2);
        /* fp32 */
        contrib(g, n, me, 0);
        memcpy(d, g, n * 4);
        dt_topk_residual_clear(res, n);
        topk_reduce(g, res, n, 1.0, DT_F32);
        assert_int_equal(dt_comm_allreduce_ordered(&X, C, DT_GROUP_WORLD, d, n, scratch), DT_OK);
        if (W > 1)
            for (size_t i = 0; i < n; i++) assert_true(bits(g[i]) == bits(d[i]));
        /* bf16 and fp16, nothing owed before: the dense 16-bit rule exactly */
        for (int lt = 0; lt < 2; lt++) {
            dt_dtype t = lt ? DT_F16 : DT_BF16;
            contrib(g, n, me, 1);
            memcpy(d, g, n * 4);
            dt_topk_residual_clear(res, n);
            topk_reduce(g, res, n, 1.0, t);
            assert_int_equal(dt_comm_allreduce_ordered_lp(&X, C, DT_GROUP_WORLD, t, d, n, s16), DT_OK);
            for (size_t i = 0; i < n; i++) assert_true(bits(g[i]) == bits(d[i]));
        }
        free(g), free(d), free(res), free(scratch), free(s16);
    }
}

static void test_sparse_across_ranks(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    const size_t sizes[] = {1, (size_t)W > 1 ? (size_t)W - 1 : 1, 1001, DT_TOPK_BLOCK + 700};
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++) {
        size_t n = sizes[a];
        const double ratio = 0.05;
        float *g = tu_malloc(n * 4), *res = tu_malloc(n * 4), *x = tu_malloc(n * 4), *want = tu_malloc(n * 4);
        size_t *sel = tu_malloc(DT_TOPK_BLOCK * sizeof *sel);
        dt_topk_residual_clear(res, n);
        contrib(g, n, me, 7);
        uint64_t bytes = topk_reduce(g, res, n, ratio, DT_F32);
        /* reference: each rank's choice of its own contribution, summed in rank order */
        for (size_t i = 0; i < n; i++) want[i] = -0.0f;
        for (int r = 0; r < W; r++) {
            contrib(x, n, r, 7);
            for (size_t lo = 0; lo < n; lo += DT_TOPK_BLOCK) {
                size_t len = n - lo < DT_TOPK_BLOCK ? n - lo : DT_TOPK_BLOCK, k = dt_topk_block_k(len, ratio);
                ref_select(x + lo, len, k, sel);
                for (size_t j = 0; j < k; j++) want[lo + sel[j]] += x[lo + sel[j]];
            }
        }
        for (size_t i = 0; i < n; i++) assert_true(bits(g[i]) == bits(want[i]));
        /* the all-gather's bytes: (W-1)/W of every rank's message, 2 bytes a word */
        size_t words = dt_topk_words(n, ratio, DT_F32);
        assert_true(bytes == (uint64_t)((double)(W - 1) / W * (double)((size_t)W * words * 2)));
        free(g), free(res), free(x), free(want), free(sel);
    }
}

/* The 16-bit reductions with t = DT_F16 (parallel.grad_dtype: fp16) and DT_BF16, against comm.h's
 * rule computed here: t(sum in rank order of w(t(x_r))); an uneven owner map for the
 * reduce-scatter (rank r owns r + 2 elements, some owning none when W > 3); magnitudes that fp16
 * rounds differently from bf16, and below fp16's normal range. */
static void test_lp_reductions(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    const size_t n = 3001;
    for (int lt = 0; lt < 2; lt++) {
        dt_dtype t = lt ? DT_F16 : DT_BF16;
        float *x = tu_malloc(n * 4), *want = tu_malloc(n * 4), *y = tu_malloc(n * 4), *w = tu_malloc(n * 4);
        uint16_t *h = tu_malloc(n * 2), *s16 = tu_malloc((DT_COMM_AR_BF16_SCRATCH(n, W) + n * (size_t)W) * 2);
        for (size_t i = 0; i < n; i++) want[i] = -0.0f;
        for (int r = 0; r < W; r++) {
            contrib(y, n, r, 11);
            for (size_t i = 0; i < n; i++) y[i] *= i % 3 == 0 ? 1e-6f : 3.0f; /* fp16 subnormals too */
            dt_to_lowp(t, h, y, n);
            dt_from_lowp(t, w, h, n);
            for (size_t i = 0; i < n; i++) want[i] += w[i];
            if (r == me) memcpy(x, y, n * 4);
        }
        dt_to_lowp(t, h, want, n);
        dt_from_lowp(t, want, h, n);
        float *ar = tu_malloc(n * 4);
        memcpy(ar, x, n * 4);
        assert_int_equal(dt_comm_allreduce_ordered_lp(&X, C, DT_GROUP_WORLD, t, ar, n, s16), DT_OK);
        for (size_t i = 0; i < n; i++) assert_true(bits(ar[i]) == bits(want[i]));
        size_t cnt[16], dis[16], off = 0;
        for (int r = 0; r < W; r++) {
            cnt[r] = r == 3 ? 0 : (size_t)r + 2;
            dis[r] = off;
            off += cnt[r];
        }
        uint16_t *out = tu_malloc((cnt[me] + 1) * 2);
        assert_int_equal(dt_comm_reduce_scatter_ordered_lp(&X, C, DT_GROUP_WORLD, t, x, cnt, dis, out, s16), DT_OK);
        dt_from_lowp(t, w, out, cnt[me]);
        for (size_t i = 0; i < cnt[me]; i++) assert_true(bits(w[i]) == bits(want[dis[me] + i]));
        if (t == DT_F16 && W > 1) { /* fp16 is not bf16: its 3 more mantissa bits show */
            float *b = tu_malloc(n * 4);
            memcpy(b, x, n * 4);
            assert_int_equal(dt_comm_allreduce_ordered_lp(&X, C, DT_GROUP_WORLD, DT_BF16, b, n, s16), DT_OK);
            size_t differ = 0;
            for (size_t i = 0; i < n; i++) differ += bits(b[i]) != bits(ar[i]);
            assert_true(differ > n / 2);
            free(b);
        }
        free(x), free(want), free(y), free(w), free(h), free(s16), free(ar), free(out);
    }
}

/* The wire at 1%: dense fp32 all-reduce counts 2(W-1)/W x 4 bytes an element (comm.h), Top-K
 * (W-1) messages of 6 (fp32) or 4 (bf16) bytes a pair: at 2 ranks >= 50x fewer bytes. */
static void test_bytes_at_one_percent(void **state) {
    (void)state;
    const size_t n = 4u << 20 >> 2; /* a 4 MiB bucket */
    for (int W = 2; W <= 2; W++) {
        double dense = 2.0 * (W - 1) / W * (double)n * 4;
        double f32 = (double)(W - 1) / W * W * (double)dt_topk_words(n, 0.01, DT_F32) * 2;
        double b16 = (double)(W - 1) / W * W * (double)dt_topk_words(n, 0.01, DT_BF16) * 2;
        printf("1%% of a 4 MiB bucket at %d ranks: %.1fx fewer bytes (fp32 values), %.1fx (bf16)\n", W, dense / f32,
               dense / b16);
        assert_true(dense / f32 >= 65.0);
        assert_true(dense / b16 >= 98.0);
    }
}

int main(void) {
    dt_ctx_init(&X);
    if (dt_comm_init(&X, &C) != DT_OK) {
        fprintf(stderr, "%s\n", X.err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_k),
        cmocka_unit_test(test_tie_break),
        cmocka_unit_test(test_select_vs_reference),
        cmocka_unit_test(test_residual_exact),
        cmocka_unit_test(test_ratio1_sends_everything),
        cmocka_unit_test(test_ratio1_is_dense),
        cmocka_unit_test(test_sparse_across_ranks),
        cmocka_unit_test(test_lp_reductions),
        cmocka_unit_test(test_bytes_at_one_percent),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    double bad = rc != 0;
    if (dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &bad, 1, DT_F64, DT_MAX) != DT_OK) bad = 1;
    dt_comm_free(C);
    return bad != 0;
}
