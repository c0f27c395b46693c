/* testutil.h - helpers shared by the unit tests: random arrays, float<->double copies,
 * error measures. */
#ifndef DT_TESTUTIL_H
#define DT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the three above first. */
#include <cmocka.h>

/* x[i] ~ U(-scale, scale), deterministic in (seed, i). */
void tu_fill_uniform(float *x, size_t n, float scale, uint64_t seed);
void tu_fill_uniform_d(double *x, size_t n, double scale, uint64_t seed);
void tu_to_double(double *dst, const float *src, size_t n);
void tu_to_float(float *dst, const double *src, size_t n);

/* max |a-b| / max(max |b|, tiny): a scale-aware relative error; INFINITY when any element
 * of a or b is NaN or Inf, so `err <= tol` fails on non-finite values. */
double tu_rel_err(const float *a, const double *b, size_t n);
double tu_rel_err_dd(const double *a, const double *b, size_t n);
/* The larger of two errors for a running maximum; NaN in either gives INFINITY (fmax and
 * `if (e > worst)` both drop a NaN). */
double tu_worse(double worst, double e);

/* A result checked two ways against a reference b:
 *   normwise:    max_i |a_i - b_i| / max_i |b_i| <= rtol (tu_rel_err's measure), and
 *   elementwise: |a_i - b_i| <= atol + rtol |b_i| for every i.
 * The normwise measure alone lets a small element be wholly wrong: one 1e-4 of the tensor's
 * largest can be off by 100% and pass rtol 1e-4; the elementwise one catches it, atol being
 * the absolute error the arithmetic may leave on elements near zero. Any NaN or Inf in a or
 * b fails both (and is the worst element). */
typedef struct {
    double norm;  /* the normwise error; INFINITY on a non-finite value */
    double elem;  /* max_i |a_i - b_i| / (atol + rtol |b_i|): the check passes at <= 1 */
    size_t worst; /* the element of elem (the first non-finite one, if any) */
    double got, want; /* a and b there */
    int ok;       /* norm <= rtol and elem <= 1, both finite */
} tu_cmp;
tu_cmp tu_compare_dd(const double *a, const double *b, size_t n, double rtol, double atol);
tu_cmp tu_compare(const float *a, const double *b, size_t n, double rtol, double atol);
/* tu_compare, printed as "what: normwise ..., elementwise ... (worst [i] got vs want)";
 * returns 1 when it passes. tu_assert_close fails the test when it does not. */
int tu_close(const char *what, const float *a, const double *b, size_t n, double rtol, double atol);
void tu_assert_close(const char *what, const float *a, const double *b, size_t n, double rtol, double atol);

/* A case that cannot run here (a data set or a file that is not installed): "skip: why" on
 * stdout, then cmocka's skip(). Under CI=true a failure instead, as tests/lib.sh's skip():
 * cmocka counts a skipped case as passed, so CI would go green on it. Does not return. */
void tu_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Runs fn once on every kernel ISA path this CPU supports (dt_isa_use), printing each
 * path, and names the paths of this architecture it could not run; leaves the best path
 * active. */
void tu_each_isa(void (*fn)(void));

void *tu_malloc(size_t bytes); /* zeroed; aborts the test on failure */

/* Creates a fresh directory /tmp/dt_<name>_XXXXXX into buf (n bytes); 0 on success. Every
 * such directory is removed (tu_rmtree) when the process that made it exits, failed tests
 * included (cmocka leaves a failed test by longjmp and runs the next; a crash that kills the
 * process leaves it); DT_TEST_KEEP_TMP=1 keeps them and names them on stderr. A test may
 * remove its directory earlier itself. */
int tu_mkdtemp(char *buf, size_t n, const char *name);
/* Writes text to dir/name; returns the path (a static buffer, valid until the next call). */
const char *tu_write_file(const char *dir, const char *name, const char *text);
/* Removes a directory tree (for group teardowns); 0 on success. */
int tu_rmtree(const char *dir);

/* A scalar loss of some inputs (L = sum(out * G)); the closure evaluates it. */
typedef double (*tu_loss_fn)(void *ud);
/* Central differences (step 1e-6) of f w.r.t. x[0..n), relative error against analytic. */
double tu_fd_rel_err(double *x, size_t n, tu_loss_fn f, void *ud, const double *analytic);
double tu_dot(const double *a, const double *b, size_t n);
/* Prints "what: rel err" and fails the test when err > tol (or NaN). */
void tu_report(const char *what, double err, double tol);

#endif
