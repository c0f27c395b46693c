/* testutil's error measures reject what they exist to catch: NaN, Inf, and one small element
 * wholly wrong (which the normwise measure alone passes). A helper that lets these through
 * turns every test that uses it into one that cannot fail on them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

enum { N = 64 };

/* b: a reference with one element 1e-4 of the largest (index 5); a: b to within 1e-7. */
static void pair(float *a, double *b) {
    tu_fill_uniform_d(b, N, 1.0, 11);
    b[0] = 1.0; /* the largest */
    b[5] = 1e-4;
    for (int i = 0; i < N; i++) a[i] = (float)(b[i] * (1.0 + 1e-7 * ((i % 3) - 1)));
}

static void test_close_passes_a_correct_copy(void **state) {
    (void)state;
    float a[N];
    double b[N];
    pair(a, b);
    tu_cmp r = tu_compare(a, b, N, 1e-5, 1e-9);
    assert_true(r.ok && r.norm <= 1e-5 && r.elem <= 1.0);
    assert_true(tu_close("a correct copy", a, b, N, 1e-5, 1e-9));
    /* exact zeros with atol 0: equal passes, and does not divide 0 by 0 */
    double z[3] = {0, 0, 1};
    float zf[3] = {0, 0, 1};
    assert_true(tu_compare(zf, z, 3, 1e-6, 0).ok);
    zf[1] = 1e-30f;
    assert_false(tu_compare(zf, z, 3, 1e-6, 0).ok); /* not zero where zero is wanted */
}

static void test_close_rejects_nan_and_inf(void **state) {
    (void)state;
    float a[N];
    double b[N];
    pair(a, b);
    for (int i = 0; i < N; i++) a[i] = NAN;
    tu_cmp r = tu_compare(a, b, N, 1e-5, 1e-9);
    assert_false(r.ok);
    assert_true(isinf(r.norm) && isinf(r.elem) && r.worst == 0);
    assert_false(tu_close("all NaN", a, b, N, 1e-5, 1e-9));
    assert_true(isinf(tu_rel_err(a, b, N)));
    pair(a, b);
    a[17] = NAN;
    r = tu_compare(a, b, N, 1e-5, 1e-9);
    assert_true(!r.ok && r.worst == 17 && isnan(r.got));
    pair(a, b);
    a[40] = -INFINITY;
    r = tu_compare(a, b, N, 1e-5, 1e-9);
    assert_true(!r.ok && r.worst == 40 && isinf(r.got));
    assert_false(tu_close("one -Inf", a, b, N, 1e-5, 1e-9));
    /* a non-finite reference checks nothing: it fails too */
    pair(a, b);
    b[3] = INFINITY;
    a[3] = INFINITY;
    assert_false(tu_compare(a, b, N, 1e-5, 1e-9).ok);
    /* the running maximum keeps a NaN (fmax and `e > worst` drop it) */
    assert_true(isinf(tu_worse(0.0, NAN)) && isinf(tu_worse(NAN, 1.0)));
    assert_true(fmax(0.5, NAN) == 0.5); /* what tu_worse is for */
}

static void test_close_rejects_one_small_element_wrong(void **state) {
    (void)state;
    float a[N];
    double b[N];
    pair(a, b);
    a[5] = 2e-4f; /* 100% off, and 1e-4 of the largest element */
    tu_cmp r = tu_compare(a, b, N, 1e-3, 1e-9);
    printf("  one element 100%% wrong: normwise %.3e (passes 1e-3), elementwise %.3e at [%zu]\n", r.norm, r.elem,
           r.worst);
    assert_true(r.norm <= 1e-3);           /* the normwise measure alone lets it through */
    assert_true(tu_rel_err(a, b, N) <= 1e-3);
    assert_false(r.ok);                    /* the elementwise one does not */
    assert_true(r.worst == 5 && r.got == (double)2e-4f && r.want == 1e-4 && r.elem > 1.0);
    assert_false(tu_close("one small element 100% wrong", a, b, N, 1e-3, 1e-9));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_close_passes_a_correct_copy),
        cmocka_unit_test(test_close_rejects_nan_and_inf),
        cmocka_unit_test(test_close_rejects_one_small_element_wrong),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
