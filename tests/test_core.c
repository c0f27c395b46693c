/* core: status messages and DT_CHECK traces, the counting allocator and its fault
 * injection, the counter-based RNG, the clock. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/timer.h"
#include "testutil.h"

static dt_status inner(dt_ctx *ctx) { return dt_fail(ctx, DT_ERR_CONFIG, "model.n_head must divide"); }
static dt_status outer(dt_ctx *ctx) {
    DT_CHECK(inner(ctx));
    return DT_OK;
}

static void test_status_message_and_trace(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(outer(&ctx), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "model.n_head must divide"));
    assert_non_null(strstr(ctx.where, "test_core.c:"));
    assert_null(strstr(ctx.err, "test_core.c")); /* the user's line stays clean */
    assert_string_equal(dt_status_name(DT_ERR_IO), "I/O error");
    assert_true(ctx.host[0] != 0);
}

static void test_alloc_counts_by_kind_and_peak(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    void *p, *q;
    assert_int_equal(dt_alloc_get(&ctx, &a, DT_MEM_PARAMS, 1000, &p), DT_OK);
    assert_int_equal(dt_alloc_get(&ctx, &a, DT_MEM_ACTS, 3000, &q), DT_OK);
    assert_true(((uintptr_t)p % DT_ALIGN) == 0 && ((uintptr_t)q % DT_ALIGN) == 0);
    assert_int_equal(((char *)p)[999], 0); /* zeroed */
    assert_int_equal(a.cur[DT_MEM_PARAMS], 1000);
    assert_int_equal(a.cur[DT_MEM_ACTS], 3000);
    assert_int_equal(a.total_cur, 4000);
    dt_alloc_put(&a, DT_MEM_ACTS, q, 3000);
    assert_int_equal(a.cur[DT_MEM_ACTS], 0);
    assert_int_equal(a.peak[DT_MEM_ACTS], 3000);
    assert_int_equal(a.total_peak, 4000);
    dt_alloc_put(&a, DT_MEM_PARAMS, p, 1000);
    assert_int_equal(a.total_cur, 0);
}

static void test_alloc_injected_failure(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    a.fail_at = 2;
    void *p, *q;
    assert_int_equal(dt_alloc_get(&ctx, &a, DT_MEM_GRADS, 64, &p), DT_OK);
    assert_int_equal(dt_alloc_get(&ctx, &a, DT_MEM_OPTIM, 64, &q), DT_ERR_NOMEM);
    assert_null(q);
    assert_non_null(strstr(ctx.err, "optimizer"));
    assert_int_equal(a.cur[DT_MEM_OPTIM], 0);
    dt_alloc_put(&a, DT_MEM_GRADS, p, 64);
}

static void test_rng_is_a_pure_function_with_sane_statistics(void **state) {
    (void)state;
    assert_true(dt_rng_u64(1, 2, 3) == dt_rng_u64(1, 2, 3));
    assert_true(dt_rng_u64(1, 2, 3) != dt_rng_u64(1, 2, 4));
    assert_true(dt_rng_u64(1, 2, 3) != dt_rng_u64(1, 3, 3));
    assert_true(dt_rng_u64(1, 2, 3) != dt_rng_u64(2, 2, 3));
    int n = 200000;
    double s = 0, s2 = 0, u = 0;
    long below[10] = {0};
    for (int i = 0; i < n; i++) {
        double x = dt_rng_normal(7, 1, (uint64_t)i);
        s += x;
        s2 += x * x;
        float v = dt_rng_uniform(7, 2, (uint64_t)i);
        assert_true(v >= 0.0f && v < 1.0f);
        u += v;
        below[dt_rng_below(7, 3, (uint64_t)i, 10)]++;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    printf("normal mean %.4f var %.4f; uniform mean %.4f\n", mean, var, u / n);
    assert_true(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.02);
    assert_true(fabs(u / n - 0.5) < 0.005);
    for (int k = 0; k < 10; k++) assert_true(labs(below[k] - n / 10) < n / 100);
}

static void test_clock_is_monotonic(void **state) {
    (void)state;
    double a = dt_now(), b = dt_now();
    assert_true(b >= a && a > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_message_and_trace),
        cmocka_unit_test(test_alloc_counts_by_kind_and_peak),
        cmocka_unit_test(test_alloc_injected_failure),
        cmocka_unit_test(test_rng_is_a_pure_function_with_sane_statistics),
        cmocka_unit_test(test_clock_is_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
