/* bench_gemm_lowp - GEMM rates of the linear layers at GPT-2 (124M) shapes: fp32 sgemm
 * against the bf16 GEMM of ops.h, native (oneDNN on 16-bit instructions, when this CPU has
 * them) and the fp32 fallback (operands widened, then sgemm; forced by switching the kernels
 * to a lower path, as DTRAIN_ISA=avx2 does). Not a test: run it alone on a quiet machine.
 *
 *   build/bench_gemm_lowp [--rows N] [--reps R] [--json FILE]
 *
 * Each rate is the median of R timed runs after one warm-up run (GFLOP/s = 2 M N K / s). The
 * check column is max |bf16 - fp32| / max |fp32| of the native (else fallback) result against
 * fp32 sgemm on the same, already rounded, operands: ~1e-6 (fp32 accumulation), not ~1e-3. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <oneapi/dnnl/dnnl.h>

#include "core/sortcmp.h"
#include "core/status.h"
#include "core/timer.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"

enum { OP_FWD, OP_DINP, OP_DW, OP_N };
static const char *const k_op_names[OP_N] = {"fwd", "bwd dinp", "bwd dw"};
enum { V_F32, V_NATIVE, V_FALLBACK, V_N };

typedef struct bufs {
    int N, C, OC;
    float *x, *w, *dout, *out, *dinp, *dw; /* fp32 (the rounded values) */
    uint16_t *xl, *wl, *doutl;             /* bf16 */
} bufs;

static void run(const bufs *b, int op, int v) {
    int N = b->N, C = b->C, OC = b->OC;
    if (v == V_F32) {
        if (op == OP_FWD)
            dt_matmul_forward_ld(b->out, OC, b->x, b->w, N, C, OC);
        else if (op == OP_DINP)
            dt_matmul_backward_ld(b->dinp, 0, NULL, b->dout, OC, b->x, b->w, N, C, OC);
        else
            dt_matmul_backward_ld(NULL, 0, b->dw, b->dout, OC, b->x, b->w, N, C, OC);
    } else {
        if (op == OP_FWD)
            dt_matmul_forward_ld_lp(DT_BF16, b->out, OC, b->xl, b->wl, N, C, OC);
        else if (op == OP_DINP)
            dt_matmul_backward_ld_lp(DT_BF16, b->dinp, 0, NULL, b->doutl, OC, b->xl, b->wl, N, C,
                                     OC);
        else
            dt_matmul_backward_ld_lp(DT_BF16, NULL, 0, b->dw, b->doutl, OC, b->xl, b->wl, N, C, OC);
    }
}

static float *result_of(const bufs *b, int op, size_t *n) {
    *n = op == OP_FWD    ? (size_t)b->N * b->OC
         : op == OP_DINP ? (size_t)b->N * b->C
                         : (size_t)b->OC * b->C;
    return op == OP_FWD ? b->out : op == OP_DINP ? b->dinp : b->dw;
}

static double median_gflops(const bufs *b, int op, int v, int reps, double flops) {
    double *t = malloc((size_t)reps * sizeof *t);
    if (!t) return 0.0;
    run(b, op, v); /* warm-up: primitive creation, JIT, page faults */
    for (int r = 0; r < reps; r++) {
        double t0 = dt_now();
        run(b, op, v);
        t[r] = dt_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, dt_cmp_double);
    double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    free(t);
    return flops / med / 1e9;
}

/* bf16 values of `scale`, and their fp32 widening. */
static void fill(uint16_t *lp, float *f, size_t n, float scale, unsigned seed) {
    srand(seed);
    for (size_t i = 0; i < n; i++)
        f[i] = scale * (2.0f * (float)rand() / (float)RAND_MAX - 1.0f);
    dt_to_lowp(DT_BF16, lp, f, n);
    dt_from_lowp(DT_BF16, f, lp, n);
}

int main(int argc, char **argv) {
    int rows = 1024, reps = 5;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--rows N] [--reps R] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    if (rows < 1 || reps < 1) {
        fprintf(stderr, "bench_gemm_lowp: --rows and --reps must be >= 1\n");
        return 2;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (dt_isa_init(&ctx) != DT_OK) {
        fprintf(stderr, "bench_gemm_lowp: %s\n", ctx.err);
        return 1;
    }
    dt_isa best = dt_isa_active();
    /* The fallback: the kernels on a lower path (avx2 where there is one) run the GEMMs as a
     * CPU without 16-bit dot products would. */
    dt_isa lower =
        dt_isa_supported(DT_ISA_AVX2) && best != DT_ISA_AVX2 ? DT_ISA_AVX2 : DT_ISA_SCALAR;
    int native = dt_lowp_gemm_native(DT_BF16);
    const dnnl_version_t *ver = dnnl_version();
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    static const int shapes[][2] = {
        {768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);

    printf("# bench_gemm_lowp: rows N=%d, median of %d runs, %d threads, oneDNN %d.%d.%d\n", rows,
           reps, threads, ver->major, ver->minor, ver->patch);
    printf("# cpu: %s; kernels %s, fallback measured on the %s path\n", dt_isa_cpu_flags(),
           dt_isa_name(best), dt_isa_name(lower));
    printf("# bf16 native GEMM: %s\n",
           native ? "yes" : "no (bf16 speed-up not available on this CPU)");
    printf("# fwd: (N,OC) = (N,C) (OC,C)^T; bwd dinp: (N,C) = (N,OC) (OC,C); bwd dw: (OC,C) += "
           "(N,OC)^T (N,C)\n");
    printf("# %5s %6s %-8s %9s %9s %9s %7s %7s %9s\n", "C", "OC", "op", "fp32", "bf16", "bf16",
           "native", "fallbk", "check");
    printf("# %5s %6s %-8s %9s %9s %9s %7s %7s %9s\n", "", "", "", "GFLOP/s", "native", "fallback",
           "/fp32", "/fp32", "rel err");
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "bench_gemm_lowp: cannot write %s\n", json);
        return 1;
    }
    if (jf) {
        fprintf(jf, "{\"argv\": [");
        for (int i = 0; i < argc; i++)
            fprintf(jf, "%s\"%s\"", i ? ", " : "", argv[i]);
        fprintf(jf,
                "], \"cpu\": \"%s\", \"threads\": %d, \"onednn\": \"%d.%d.%d\", \"native\": %d, "
                "\"rows\": [",
                dt_isa_cpu_flags(), threads, ver->major, ver->minor, ver->patch, native);
    }
    int first_row = 1;
    for (int s = 0; s < nshapes; s++) {
        bufs b = {rows, shapes[s][0], shapes[s][1], NULL, NULL, NULL,
                  NULL, NULL,         NULL,         NULL, NULL, NULL};
        size_t nx = (size_t)b.N * b.C, nw = (size_t)b.OC * b.C, no = (size_t)b.N * b.OC;
        b.x = malloc(nx * 4), b.w = malloc(nw * 4), b.dout = malloc(no * 4), b.out = malloc(no * 4);
        b.dinp = malloc(nx * 4), b.dw = calloc(nw, 4);
        b.xl = malloc(nx * 2), b.wl = malloc(nw * 2), b.doutl = malloc(no * 2);
        float *ref = malloc((no > nw ? (no > nx ? no : nx) : (nw > nx ? nw : nx)) * 4);
        if (!b.x || !b.w || !b.dout || !b.out || !b.dinp || !b.dw || !b.xl || !b.wl || !b.doutl ||
            !ref) {
            fprintf(stderr, "bench_gemm_lowp: out of memory at C=%d OC=%d\n", b.C, b.OC);
            return 1;
        }
        fill(b.xl, b.x, nx, 1.0f, 1);
        fill(b.wl, b.w, nw, 0.05f, 2);
        fill(b.doutl, b.dout, no, 0.01f, 3);
        for (int op = 0; op < OP_N; op++) {
            double flops = 2.0 * b.N * (double)b.C * b.OC;
            size_t n;
            float *res = result_of(&b, op, &n);
            /* the check: fp32 sgemm and the bf16 GEMM from a zero dw */
            memset(b.dw, 0, nw * 4);
            run(&b, op, V_F32);
            memcpy(ref, res, n * 4);
            memset(b.dw, 0, nw * 4);
            run(&b, op, V_NATIVE);
            double maxd = 0.0, maxr = 0.0;
            for (size_t i = 0; i < n; i++) {
                maxd = fmax(maxd, fabs((double)res[i] - ref[i]));
                maxr = fmax(maxr, fabs((double)ref[i]));
            }
            double check = maxd / (maxr > 0 ? maxr : 1.0);
            double g[V_N];
            g[V_F32] = median_gflops(&b, op, V_F32, reps, flops);
            g[V_NATIVE] = native ? median_gflops(&b, op, V_NATIVE, reps, flops) : NAN;
            if (dt_isa_use(&ctx, lower) != DT_OK) {
                fprintf(stderr, "bench_gemm_lowp: %s\n", ctx.err);
                return 1;
            }
            g[V_FALLBACK] = median_gflops(&b, op, V_FALLBACK, reps, flops);
            if (dt_isa_use(&ctx, best) != DT_OK) {
                fprintf(stderr, "bench_gemm_lowp: %s\n", ctx.err);
                return 1;
            }
            printf("  %5d %6d %-8s %9.1f %9.1f %9.1f %7.2f %7.2f %9.1e\n", b.C, b.OC,
                   k_op_names[op], g[V_F32], g[V_NATIVE], g[V_FALLBACK], g[V_NATIVE] / g[V_F32],
                   g[V_FALLBACK] / g[V_F32], check);
            fflush(stdout);
            if (jf) {
                fprintf(jf, "%s{\"C\": %d, \"OC\": %d, \"op\": \"%s\", \"fp32_gflops\": %.2f, ",
                        first_row ? "" : ", ", b.C, b.OC, k_op_names[op], g[V_F32]);
                if (native) fprintf(jf, "\"bf16_native_gflops\": %.2f, ", g[V_NATIVE]);
                fprintf(jf, "\"bf16_fallback_gflops\": %.2f, \"check_rel_err\": %.3e}",
                        g[V_FALLBACK], check);
                first_row = 0;
            }
        }
        free(b.x);
        free(b.w);
        free(b.dout);
        free(b.out);
        free(b.dinp);
        free(b.dw);
        free(b.xl);
        free(b.wl);
        free(b.doutl);
        free(ref);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    dt_matmul_lowp_cache_clear();
    return 0;
}
