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
