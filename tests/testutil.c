#include "testutil.h"

#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/rng.h"
#include "ops/cpu/isa.h"

void tu_fill_uniform(float *x, size_t n, float scale, uint64_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = (2.0f * dt_rng_uniform(seed, 7, i) - 1.0f) * scale;
}

void tu_fill_uniform_d(double *x, size_t n, double scale, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        x[i] = (2.0 * (double)dt_rng_uniform(seed, 7, i) - 1.0) * scale;
}

void tu_to_double(double *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

void tu_to_float(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

double tu_rel_err_dd(const double *a, const double *b, size_t n) {
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        /* NaN or Inf on either side is an infinite error: a comparison that skips them
         * would let a kernel that writes NaN (or never writes at all) pass. */
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = fabs(a[i] - b[i]);
        if (d > maxdiff) maxdiff = d;
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
    }
    return maxdiff / (maxref > 1e-30 ? maxref : 1e-30);
}

double tu_worse(double worst, double e) {
    if (isnan(e) || isnan(worst)) return INFINITY;
    return e > worst ? e : worst;
}

tu_cmp tu_compare_dd(const double *a, const double *b, size_t n, double rtol, double atol) {
    tu_cmp r = {0};
    double maxdiff = 0, maxref = 0;
    int bad = 0; /* a non-finite value seen */
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            /* The first one is the element to show; nothing after it can pass. */
            if (!bad) r.worst = i, r.got = a[i], r.want = b[i];
            bad = 1;
            continue;
        }
        double d = fabs(a[i] - b[i]), bound = atol + rtol * fabs(b[i]);
        /* d == 0 passes even with a zero bound (atol 0 and b_i 0: exact zeros wanted). */
        double q = d == 0 ? 0 : bound > 0 ? d / bound : INFINITY;
        if (d > maxdiff) maxdiff = d;
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
        if (!bad && (q > r.elem || i == 0)) r.elem = q, r.worst = i, r.got = a[i], r.want = b[i];
    }
    if (bad) {
        r.norm = r.elem = INFINITY;
        return r;
    }
    r.norm = maxdiff / (maxref > 1e-30 ? maxref : 1e-30);
    r.ok = r.norm <= rtol && r.elem <= 1.0;
    return r;
}

tu_cmp tu_compare(const float *a, const double *b, size_t n, double rtol, double atol) {
    double *ad = tu_malloc(n * sizeof(double));
    tu_to_double(ad, a, n);
    tu_cmp r = tu_compare_dd(ad, b, n, rtol, atol);
    free(ad);
    return r;
}

static void close_line(const char *what, tu_cmp r, double rtol, double atol) {
    printf("  %-40s normwise %.3e (tol %.0e), elementwise %.3f of atol %.0e + rtol |ref| (worst [%zu] "
           "%.9g vs %.9g)%s\n", what, r.norm, rtol, r.elem, atol, r.worst, r.got, r.want, r.ok ? "" : " <- outside");
}

int tu_close(const char *what, const float *a, const double *b, size_t n, double rtol, double atol) {
    tu_cmp r = tu_compare(a, b, n, rtol, atol);
    close_line(what, r, rtol, atol);
    return r.ok;
}

void tu_assert_close(const char *what, const float *a, const double *b, size_t n, double rtol, double atol) {
    tu_cmp r = tu_compare(a, b, n, rtol, atol);
    close_line(what, r, rtol, atol);
    if (!r.ok)
        fail_msg("%s: normwise %.3e (tol %.0e), elementwise %.3g x (atol %.0e + rtol |ref|) at [%zu]: %.9g vs %.9g",
                 what, r.norm, rtol, r.elem, atol, r.worst, r.got, r.want);
}

void tu_skip(const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *ci = getenv("CI");
    if (ci && strcmp(ci, "true") == 0) fail_msg("%s (CI=true: a skip is a failure)", why);
    printf("skip: %s\n", why);
    skip();
}

double tu_rel_err(const float *a, const double *b, size_t n) {
    double *ad = tu_malloc(n * sizeof(double));
    tu_to_double(ad, a, n);
    double e = tu_rel_err_dd(ad, b, n);
    free(ad);
    return e;
}

void *tu_malloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) fail_msg("out of memory allocating %zu bytes", bytes);
    return p;
}

/* The directories tu_mkdtemp made, removed when the process that made them exits. */
static char **g_tmp;
static int g_ntmp;
static pid_t g_tmp_pid;

static void rm_tmp_dirs(void) {
    if (getpid() != g_tmp_pid) return; /* a forked child's exit(): the parent still uses them */
    const char *keep = getenv("DT_TEST_KEEP_TMP");
    for (int i = 0; i < g_ntmp; i++) {
        if (access(g_tmp[i], F_OK)) { /* the test removed it */
        } else if (keep && !strcmp(keep, "1")) {
            fprintf(stderr, "kept %s (DT_TEST_KEEP_TMP=1)\n", g_tmp[i]);
        } else {
            tu_rmtree(g_tmp[i]);
        }
        free(g_tmp[i]);
    }
    free(g_tmp);
    g_tmp = NULL;
    g_ntmp = 0;
}

int tu_mkdtemp(char *buf, size_t n, const char *name) {
    if ((size_t)snprintf(buf, n, "/tmp/dt_%s_XXXXXX", name) >= n) return -1;
    if (!mkdtemp(buf)) return -1;
    if (!g_tmp_pid) {
        g_tmp_pid = getpid();
        if (atexit(rm_tmp_dirs)) return -1;
    }
    char **grown = realloc(g_tmp, (size_t)(g_ntmp + 1) * sizeof *g_tmp);
    char *copy = strdup(buf);
    if (!grown || !copy) {
        free(copy);
        if (grown) g_tmp = grown;
        tu_rmtree(buf);
        return -1;
    }
    g_tmp = grown;
    g_tmp[g_ntmp++] = copy;
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int tu_rmtree(const char *dir) { return nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

const char *tu_write_file(const char *dir, const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

void tu_each_isa(void (*fn)(void)) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char not_run[128] = "";
    for (int i = 0; i < DT_ISA_COUNT; i++) {
        if (!dt_isa_built((dt_isa)i)) continue; /* another architecture's path */
        if (!dt_isa_supported((dt_isa)i)) {
            size_t l = strlen(not_run);
            snprintf(not_run + l, sizeof not_run - l, " %s", dt_isa_name((dt_isa)i));
            continue;
        }
        if (dt_isa_use(&ctx, (dt_isa)i) != DT_OK) fail_msg("%s", ctx.err);
        printf("[kernel path %s]\n", dt_isa_name((dt_isa)i));
        fn();
    }
    if (not_run[0]) printf("[kernel paths NOT RUN (this CPU lacks them):%s]\n", not_run);
    if (dt_isa_use(&ctx, dt_isa_best()) != DT_OK) fail_msg("%s", ctx.err);
}

double tu_fd_rel_err(double *x, size_t n, tu_loss_fn f, void *ud, const double *analytic) {
    const double eps = 1e-6;
    double *num = tu_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + eps;
        double lp = f(ud);
        x[i] = keep - eps;
        double lm = f(ud);
        x[i] = keep;
        num[i] = (lp - lm) / (2 * eps);
    }
    double e = tu_rel_err_dd(analytic, num, n);
    free(num);
    return e;
}

double tu_dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void tu_report(const char *what, double err, double tol) {
    printf("  %-40s rel err %.3e (tol %.0e)\n", what, err, tol);
    if (!(err <= tol)) fail_msg("%s: relative error %.3e exceeds %.0e", what, err, tol);
}
