/* Linear layers with bf16 / fp16 operands and fp32 results (ops.h, "low precision").
 *
 * One internal GEMM, C (f32) = op(A) op(B) + beta C with A, B 16-bit, runs on one of:
 *   - native: a oneDNN matmul primitive (bf16 or f16 src/weights, f32 dst; transposes and
 *     leading dimensions are strides; beta = 1 is a sum post-op). Used only when the kernels
 *     run on the best path (a forced lower path runs as on a CPU without 16-bit dot products)
 *     and oneDNN's chosen implementation is one on 16-bit instructions (its name: brgemm on
 *     avx512_core_bf16 / amx / avx2_vnni_2 / avx512_core_fp16). oneDNN's other bf16
 *     implementations (emulation on plain avx512_core, the reference loops) are slower than
 *     fp32, and oneDNN 2.x has no CPU f16 matmul at all: those take the fallback.
 *   - fallback: A and B widened into fp32 scratch, then oneDNN's sgemm.
 *   - DTRAIN_MATMUL=ref: widened, then matmul.c's reference loops (dt_sgemm), CPU-independent.
 * Primitive creation costs milliseconds, so created primitives (and "no native
 * implementation" verdicts) are kept in a small table keyed by the whole problem, looked up
 * under a mutex and kept until dt_matmul_lowp_cache_clear. Each execution brings its own
 * scratchpad (user scratchpad mode), so one primitive may run on several threads at once. */
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/sortcmp.h"
#include "core/status.h"
#include "core/timer.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/kernels.h"
#include "ops/ops.h"

#define DT_LP_CACHE 64 /* primitives kept; more distinct shapes are created per call */

typedef struct gemm_key {
    dt_dtype dt;
    char ta, tb;
    int beta1, nthr; /* oneDNN plans its blocking for the thread count at creation */
    long M, N, K, lda, ldb, ldc;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    dnnl_primitive_t prim; /* NULL: no native implementation, take the fallback */
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
} gemm_entry;

static struct {
    pthread_mutex_t mu;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    int eng_failed;
    int n;
    gemm_entry e[DT_LP_CACHE];
} g_lp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int key_eq(const gemm_key *a, const gemm_key *b) {
    return a->dt == b->dt && a->ta == b->ta && a->tb == b->tb && a->beta1 == b->beta1 &&
           a->nthr == b->nthr && a->M == b->M && a->N == b->N && a->K == b->K &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc;
}

/* oneDNN's implementation names that compute on 16-bit dot-product instructions. */
static int impl_is_native(dt_dtype dt, const char *impl) {
    if (!impl || !strncmp(impl, "ref", 3)) return 0;
#if defined(__x86_64__)
    /* Strided operands (the lm_head's vocabulary chunks) get oneDNN's gemm-based matmul,
     * which runs bf16 dot products when the CPU has them (measured 410-435 GFLOP/s on
     * Zen 4, like brgemm's dense ones) and emulates them otherwise. */
    if (dt == DT_BF16 && !strcmp(impl, "gemm:jit")) return __builtin_cpu_supports("avx512bf16");
#endif
    if (strstr(impl, "avx2_vnni_2")) return 1;
    return dt == DT_BF16 ? strstr(impl, "bf16") || strstr(impl, "amx")
                         : strstr(impl, "fp16") != NULL;
}

/* Under g_lp.mu. 0 when oneDNN has no CPU engine (then everything takes the fallback). */
static int engine_ready(void) {
    if (g_lp.eng) return 1;
    if (g_lp.eng_failed) return 0;
    if (dnnl_engine_create(&g_lp.eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&g_lp.stream, g_lp.eng, dnnl_stream_default_flags) != dnnl_success) {
        if (g_lp.eng) dnnl_engine_destroy(g_lp.eng);
        g_lp.eng = NULL;
        g_lp.eng_failed = 1;
        return 0;
    }
    return 1;
}

/* Row-major (rows, cols) with leading dimension ld, read as op(X) (trans 'T': transposed). */
static void md_of(dnnl_memory_desc_t *md, dnnl_data_type_t t, char trans, long rows, long cols,
                  long ld) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans == 'N' ? ld : 1, trans == 'N' ? 1 : ld};
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(md, 2, dims, t, strides);
    DT_ASSERT(s == dnnl_success);
}

/* Under g_lp.mu: fills e for key k; e->prim stays NULL when no native implementation. */
static void entry_create(gemm_entry *e, const gemm_key *k) {
    memset(e, 0, sizeof *e);
    e->key = *k;
    dnnl_data_type_t t = k->dt == DT_BF16 ? dnnl_bf16 : dnnl_f16;
    md_of(&e->a_md, t, k->ta, k->M, k->K, k->lda);
    md_of(&e->b_md, t, k->tb, k->K, k->N, k->ldb);
    md_of(&e->c_md, dnnl_f32, 'N', k->M, k->N, k->ldc);
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t desc;
    const char *impl = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) goto done;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        goto done;
    if (k->beta1) {
        if (dnnl_post_ops_create(&po) != dnnl_success ||
            dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
            goto done;
    }
    if (dnnl_matmul_desc_init(&desc, &e->a_md, &e->b_md, NULL, &e->c_md) != dnnl_success) goto done;
    /* unimplemented (no bf16/f16 matmul for this ISA cap or dtype): the fallback */
    if (dnnl_primitive_desc_create(&pd, &desc, attr, g_lp.eng, NULL) != dnnl_success) goto done;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl_is_native(k->dt, impl))
        goto done;
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (smd) {
        e->scratch_md = *smd;
        e->scratch_bytes = dnnl_memory_desc_get_size(smd);
    }
    if (dnnl_primitive_create(&e->prim, pd) != dnnl_success) e->prim = NULL;
done:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
}

/* The cached entry of k (created on first use), or, when the table is full, *tmp filled for
 * this call only (the caller destroys tmp->prim). NULL when oneDNN has no engine. */
static const gemm_entry *entry_get(const gemm_key *k, gemm_entry *tmp) {
    const gemm_entry *found = NULL;
    pthread_mutex_lock(&g_lp.mu);
    if (engine_ready()) {
        for (int i = 0; i < g_lp.n && !found; i++)
            if (key_eq(&g_lp.e[i].key, k)) found = &g_lp.e[i];
        if (!found && g_lp.n < DT_LP_CACHE) {
            entry_create(&g_lp.e[g_lp.n], k);
            found = &g_lp.e[g_lp.n++];
        } else if (!found) {
            entry_create(tmp, k);
            found = tmp;
        }
    }
    pthread_mutex_unlock(&g_lp.mu);
    return found;
}

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Native GEMMs are allowed on the best path only: DTRAIN_ISA=avx2 (and tests that switch
 * paths) must run as a CPU without 16-bit dot products would; and only on CPUs whose 16-bit
 * dot products beat their fp32 GEMM (isa.h dt_isa_lowp_native_preferred). */
static int native_allowed(void) { return dt_isa_active() == dt_isa_best() && dt_isa_lowp_native_preferred(); }

/* The calling thread's scratchpad of at least `bytes`, kept between calls: a fresh buffer per
 * GEMM would page-fault its way through megabytes every call. Grows, never shrinks; a cache
 * outside the memory plan, like oneDNN's own. */
static void *scratchpad(size_t bytes) {
    static __thread void *buf;
    static __thread size_t cap;
    if (bytes > cap) {
        free(buf);
        cap = (bytes + 4095) / 4096 * 4096;
        buf = aligned_alloc(64, cap);
        DT_ASSERT(buf != NULL); /* out of memory inside a GEMM: nothing to hand back */
    }
    return buf;
}

static void run_native(const gemm_entry *e, const void *A, const void *B, float *C) {
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    void *scratch = NULL;
    dnnl_status_t s = dnnl_memory_create(&ma, &e->a_md, g_lp.eng, (void *)A);
    if (s == dnnl_success) s = dnnl_memory_create(&mb, &e->b_md, g_lp.eng, (void *)B);
    if (s == dnnl_success) s = dnnl_memory_create(&mc, &e->c_md, g_lp.eng, C);
    int nargs = 3;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    if (s == dnnl_success && e->scratch_bytes) {
        scratch = scratchpad(e->scratch_bytes);
        s = dnnl_memory_create(&ms, &e->scratch_md, g_lp.eng, scratch);
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(e->prim, g_lp.stream, nargs, args);
    if (s == dnnl_success) s = dnnl_stream_wait(g_lp.stream);
    /* Arguments were validated at creation: a failure here is a programming error. */
    DT_ASSERT(s == dnnl_success);
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    if (ms) dnnl_memory_destroy(ms);
}

/* Floats per widened operand panel of the fallback: its two panels per thread are bounded
 * (2 x 16 MiB, or one K-long row or column each when K is larger), whatever the GEMM. */
#define DT_LP_PANEL ((size_t)1 << 22)

/* The calling thread's widened panel `which` (0: A, 1: B) of at least `floats`, kept between
 * calls (as the scratchpad above). */
static float *panel(int which, size_t floats) {
    static __thread float *buf[2];
    static __thread size_t cap[2];
    if (floats > cap[which]) {
        free(buf[which]);
        cap[which] = (floats + 1023) / 1024 * 1024;
        buf[which] = aligned_alloc(64, cap[which] * sizeof(float));
        DT_ASSERT(buf[which] != NULL); /* out of memory inside a GEMM: nothing to hand back */
    }
    return buf[which];
}

/* dst (rows, cols) dense fp32 = src (rows, cols of ld) widened. */
static void widen(dt_dtype dt, float *dst, const uint16_t *src, long rows, long cols, long ld) {
    if (ld == cols) {
        dt_from_lowp(dt, dst, src, (size_t)rows * (size_t)cols);
        return;
    }
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++)
        dt_from_lowp(dt, dst + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols);
}

/* op(X) rows [i0, i0 + m) (or columns, for the right operand: `right`) of a 16-bit operand
 * widened into a dense panel; returns its leading dimension. */
static long widen_block(dt_dtype dt, float *dst, const uint16_t *X, long ldx, char trans, int right, long i0,
                        long m, long K) {
    /* Left operand op(A) (M,K): 'N' rows i0.. of A; 'T' columns i0.. of A (K,M). Right
     * operand op(B) (K,N): 'N' columns i0.. of B; 'T' rows i0.. of B (N,K). */
    if ((trans == 'N') != (right != 0)) {
        widen(dt, dst, X + (size_t)i0 * ldx, m, K, ldx);
        return K;
    }
    widen(dt, dst, X + i0, K, m, ldx);
    return m;
}

/* Widened in panels of at most DT_LP_PANEL floats per operand (one K-long row or column at
 * least): blocks of C's rows and columns, each one sgemm over the whole K, so every element
 * still sums over k in one call; the operands are never copied whole. */
static void gemm_fallback(dt_dtype dt, char ta, char tb, long M, long N, long K,
                          const uint16_t *A, long lda, const uint16_t *B, long ldb, float beta,
                          float *C, long ldc, int ref) {
    long kk = K > 0 ? K : 1;
    long mb = (long)(DT_LP_PANEL / (size_t)kk), nb = mb;
    mb = mb < 1 ? 1 : mb > M ? M : mb;
    nb = nb < 1 ? 1 : nb > N ? N : nb;
    float *a = panel(0, (size_t)mb * (size_t)kk), *b = panel(1, (size_t)nb * (size_t)kk);
    long la = 0, lb;
    if (mb == M) la = widen_block(dt, a, A, lda, ta, 0, 0, M, K); /* A whole: once */
    for (long j0 = 0; j0 < N; j0 += nb) {
        long n = N - j0 < nb ? N - j0 : nb;
        lb = widen_block(dt, b, B, ldb, tb, 1, j0, n, K);
        for (long i0 = 0; i0 < M; i0 += mb) {
            long m = M - i0 < mb ? M - i0 : mb;
            if (mb < M) la = widen_block(dt, a, A, lda, ta, 0, i0, m, K);
            float *c = C + (size_t)i0 * ldc + j0;
            if (ref) {
                dt_sgemm(ta, tb, m, n, K, a, la, b, lb, beta, c, ldc);
            } else {
                dnnl_status_t s = dnnl_sgemm(ta, tb, m, n, K, 1.0f, a, la, b, lb, beta, c, ldc);
                DT_ASSERT(s == dnnl_success);
            }
        }
    }
}

/* C (M,N of ldc) = op(A) op(B) + beta C, beta 0 or 1; `allow_ref` 0 ignores
 * DTRAIN_MATMUL=ref (the peak measurement). */
static void gemm_lp(dt_dtype dt, char ta, char tb, long M, long N, long K, const uint16_t *A,
                    long lda, const uint16_t *B, long ldb, float beta, float *C, long ldc,
                    int allow_ref) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    DT_ASSERT(beta == 0.0f || beta == 1.0f);
    if (M <= 0 || N <= 0) return;
    int ref = allow_ref && dt_isa_matmul_ref();
    if (!ref && K > 0 && native_allowed()) {
        gemm_key k = {dt, ta, tb, beta != 0.0f, max_threads(), M, N, K, lda, ldb, ldc};
        gemm_entry tmp;
        const gemm_entry *e = entry_get(&k, &tmp);
        if (e && e->prim) {
            run_native(e, A, B, C);
            if (e == &tmp) dnnl_primitive_destroy(tmp.prim);
            return;
        }
    }
    gemm_fallback(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ref);
}

void dt_gemm_lowp(dt_dtype dt, char ta, char tb, long M, long N, long K, const uint16_t *A,
                  long lda, const uint16_t *B, long ldb, float beta, float *C, long ldc) {
    gemm_lp(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, 1);
}

int dt_cpu_lowp_gemm_native(dt_dtype dt) {
    if (dt != DT_BF16 && dt != DT_F16) return 0;
    if (dt_isa_matmul_ref() || !native_allowed()) return 0;
    /* A representative problem: the verdict of oneDNN's implementation choice. */
    gemm_key k = {dt, 'N', 'T', 0, max_threads(), 64, 64, 64, 64, 64, 64};
    gemm_entry tmp;
    const gemm_entry *e = entry_get(&k, &tmp);
    int native = e && e->prim;
    if (e == &tmp && tmp.prim) dnnl_primitive_destroy(tmp.prim);
    return native;
}

void dt_cpu_matmul_lowp_cache_clear(void) {
    pthread_mutex_lock(&g_lp.mu);
    for (int i = 0; i < g_lp.n; i++)
        if (g_lp.e[i].prim) dnnl_primitive_destroy(g_lp.e[i].prim);
    g_lp.n = 0;
    if (g_lp.stream) dnnl_stream_destroy(g_lp.stream);
    if (g_lp.eng) dnnl_engine_destroy(g_lp.eng);
    g_lp.stream = NULL;
    g_lp.eng = NULL;
    g_lp.eng_failed = 0;
    pthread_mutex_unlock(&g_lp.mu);
}

void dt_cpu_matmul_forward_lp(dt_dtype dt, float *out, const uint16_t *inp, const uint16_t *w,
                          const float *bias, int N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    /* out (N,OC) = inp (N,C) . w^T */
    gemm_lp(dt, 'N', 'T', N, OC, C, inp, C, w, C, beta, out, OC, 1);
}

void dt_cpu_matmul_backward_lp(dt_dtype dt, float *dinp, float *dw, float *dbias, const float *dout,
                           uint16_t *dout_lp, const uint16_t *inp, const uint16_t *w, int N,
                           int C, int OC) {
    dt_to_lowp(dt, dout_lp, dout, (size_t)N * OC);
    dt_cpu_matmul_backward_ld_lp(dt, dinp, 0, dw, dout_lp, OC, inp, w, N, C, OC);
    if (dbias) dt_cpu_kernels_get()->bias_backward(dbias, dout, N, OC);
}

void dt_cpu_matmul_forward_ld_lp(dt_dtype dt, float *out, int ldo, const uint16_t *inp,
                             const uint16_t *w, int N, int C, int OC) {
    gemm_lp(dt, 'N', 'T', N, OC, C, inp, C, w, C, 0.0f, out, ldo, 1);
}

void dt_cpu_matmul_backward_ld_lp(dt_dtype dt, float *dinp, int accumulate, float *dw,
                              const uint16_t *dout_lp, int ldd, const uint16_t *inp,
                              const uint16_t *w, int N, int C, int OC) {
    /* dinp (N,C) = dout (N,OC) . w (OC,C) */
    if (dinp)
        gemm_lp(dt, 'N', 'N', N, C, OC, dout_lp, ldd, w, C, accumulate ? 1.0f : 0.0f, dinp, C, 1);
    /* dw (OC,C) += dout^T (OC,N) . inp (N,C) */
    if (dw) gemm_lp(dt, 'T', 'N', OC, C, N, dout_lp, ldd, inp, C, 1.0f, dw, C, 1);
}

typedef struct sq_args {
    dt_dtype dt;
    int n;
    const uint16_t *a, *b;
    float *c;
} sq_args;

static void sq_gemm(void *p) {
    const sq_args *s = p;
    gemm_lp(s->dt, 'N', 'N', s->n, s->n, s->n, s->a, s->n, s->b, s->n, 0.0f, s->c, s->n, 0);
}

/* As dt_matmul_peak_gflops, on dt's GEMM. */
double dt_cpu_matmul_peak_gflops_lp(dt_dtype dt, int n, int reps, double *best) {
    size_t nn = (size_t)n * n;
    float *f = calloc(nn ? nn : 1, sizeof(float)), *c = malloc(nn * sizeof(float));
    uint16_t *a = malloc(nn * sizeof(uint16_t)), *b = malloc(nn * sizeof(uint16_t));
    double median = 0.0;
    if (best) *best = 0.0;
    if (!f || !c || !a || !b) goto done;
    for (size_t i = 0; i < nn; i++) f[i] = (float)(i % 7) * 0.01f;
    dt_to_lowp(dt, a, f, nn);
    for (size_t i = 0; i < nn; i++) f[i] = (float)(i % 5) * 0.01f;
    dt_to_lowp(dt, b, f, nn);
    sq_args s = {dt, n, a, b, c};
    median = dt_gemm_rate(sq_gemm, &s, n, reps, best);
done:
    free(f);
    free(c);
    free(a);
    free(b);
    return median;
}
