/* Choosing the kernel path: cpuid (x86-64) or the architecture (aarch64), DTRAIN_ISA, and
 * the active table. The only process-wide state of the kernels: a pointer set at start-up
 * (or by tests between runs), read by every kernel call. */
#include "ops/cpu/isa.h"

#include <oneapi/dnnl/dnnl.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu/kernels.h"

static const char *const k_names[DT_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

const char *dt_isa_name(dt_isa isa) {
    return (unsigned)isa < DT_ISA_COUNT ? k_names[isa] : "unknown";
}

static const dt_cpu_kernels *table_of(dt_isa isa) {
    switch (isa) {
    case DT_ISA_SCALAR: return &dt_cpu_kernels_scalar;
#if defined(__x86_64__)
    case DT_ISA_AVX2: return &dt_cpu_kernels_avx2;
    case DT_ISA_AVX512: return &dt_cpu_kernels_avx512;
#elif defined(__aarch64__)
    case DT_ISA_NEON: return &dt_cpu_kernels_neon;
#endif
    default: return NULL;
    }
}

int dt_isa_built(dt_isa isa) { return table_of(isa) != NULL; }

/* Missing CPU features of a path, space separated ("" when none is missing). */
static void missing_features(dt_isa isa, char *buf, size_t n) {
    buf[0] = '\0';
#if defined(__x86_64__)
    __builtin_cpu_init();
    static const char *const avx2[] = {"avx2", "fma", NULL};
    static const char *const avx512[] = {"avx2", "fma", "avx512f", "avx512bw", "avx512dq",
                                         "avx512vl", NULL};
    const char *const *need = isa == DT_ISA_AVX2 ? avx2 : isa == DT_ISA_AVX512 ? avx512 : NULL;
    for (int i = 0; need && need[i]; i++) {
        int have = 0;
        /* __builtin_cpu_supports wants a string literal. */
        if (!strcmp(need[i], "avx2")) have = __builtin_cpu_supports("avx2");
        else if (!strcmp(need[i], "fma")) have = __builtin_cpu_supports("fma");
        else if (!strcmp(need[i], "avx512f")) have = __builtin_cpu_supports("avx512f");
        else if (!strcmp(need[i], "avx512bw")) have = __builtin_cpu_supports("avx512bw");
        else if (!strcmp(need[i], "avx512dq")) have = __builtin_cpu_supports("avx512dq");
        else if (!strcmp(need[i], "avx512vl")) have = __builtin_cpu_supports("avx512vl");
        if (!have) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", l ? " " : "", need[i]);
        }
    }
#else
    (void)isa, (void)n;
#endif
}

int dt_isa_supported(dt_isa isa) {
    if (!dt_isa_built(isa)) return 0;
    char miss[128];
    missing_features(isa, miss, sizeof miss);
    return miss[0] == '\0';
}

dt_isa dt_isa_best(void) {
    static const dt_isa order[] = {DT_ISA_AVX512, DT_ISA_NEON, DT_ISA_AVX2};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (dt_isa_supported(order[i])) return order[i];
    return DT_ISA_SCALAR;
}

const char *dt_isa_cpu_flags(void) {
    static char buf[160];
#if defined(__x86_64__)
    __builtin_cpu_init();
    snprintf(buf, sizeof buf, "%s%s%s%s%s%s%s", __builtin_cpu_supports("avx2") ? "avx2 " : "",
             __builtin_cpu_supports("fma") ? "fma " : "",
             __builtin_cpu_supports("avx512f") ? "avx512f " : "",
             __builtin_cpu_supports("avx512bw") ? "avx512bw " : "",
             __builtin_cpu_supports("avx512dq") ? "avx512dq " : "",
             __builtin_cpu_supports("avx512vl") ? "avx512vl " : "",
             __builtin_cpu_supports("avx512bf16") ? "avx512bf16 " : "");
    size_t l = strlen(buf);
    if (l) buf[l - 1] = '\0';
    else snprintf(buf, sizeof buf, "sse2");
#elif defined(__aarch64__)
    snprintf(buf, sizeof buf, "neon");
#else
    snprintf(buf, sizeof buf, "none");
#endif
    return buf;
}

static const dt_cpu_kernels *g_active; /* set once at start-up; tests switch it */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void pick_best(void) {
    if (!g_active) g_active = table_of(dt_isa_best());
}

const dt_cpu_kernels *dt_cpu_kernels_get(void) {
    if (!g_active) pthread_once(&g_once, pick_best);
    return g_active;
}

dt_isa dt_isa_active(void) { return dt_cpu_kernels_get()->isa; }

static dt_status check_usable(dt_ctx *ctx, dt_isa isa, const char *what) {
    if (!dt_isa_built(isa))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s%s: this binary has no %s path (built: %s)",
                       what, dt_isa_name(isa), dt_isa_name(isa),
#if defined(__x86_64__)
                       "scalar avx2 avx512"
#elif defined(__aarch64__)
                       "scalar neon"
#else
                       "scalar"
#endif
        );
    char miss[128];
    missing_features(isa, miss, sizeof miss);
    if (miss[0])
        return dt_fail(ctx, DT_ERR_CONFIG, "%s%s: this CPU lacks %s (best path here: %s)", what,
                       dt_isa_name(isa), miss, dt_isa_name(dt_isa_best()));
    return DT_OK;
}

dt_status dt_isa_use(dt_ctx *ctx, dt_isa isa) {
    DT_CHECK(check_usable(ctx, isa, "kernel path "));
    g_active = table_of(isa);
    return DT_OK;
}

static int g_matmul_ref;
static int g_lowp_rule = -1; /* DTRAIN_LOWP_GEMM: -1 = by CPU, 0 = widened, 1 = native */

int dt_isa_lowp_native_preferred(void) {
    if (g_lowp_rule >= 0) return g_lowp_rule;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_is("intel")) return 1;
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1); /* AMX-BF16 */
#else
    return 1;
#endif
}

int dt_isa_matmul_ref(void) { return g_matmul_ref; }

dt_status dt_isa_init(dt_ctx *ctx) {
    const char *mm = getenv("DTRAIN_MATMUL");
    if (mm && *mm && strcmp(mm, "onednn") != 0 && strcmp(mm, "ref") != 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "DTRAIN_MATMUL=%s: unknown matmul (onednn, ref)", mm);
    g_matmul_ref = mm && !strcmp(mm, "ref");
    const char *lg = getenv("DTRAIN_LOWP_GEMM");
    if (lg && *lg && strcmp(lg, "auto") && strcmp(lg, "native") && strcmp(lg, "widened"))
        return dt_fail(ctx, DT_ERR_CONFIG, "DTRAIN_LOWP_GEMM=%s: unknown 16-bit matmul engine (auto, native, widened)", lg);
    g_lowp_rule = lg && !strcmp(lg, "native") ? 1 : lg && !strcmp(lg, "widened") ? 0 : -1;
    const char *env = getenv("DTRAIN_ISA");
    dt_isa isa = dt_isa_best();
    if (env && *env && strcmp(env, "auto") != 0) {
        int found = 0;
        for (int i = 0; i < DT_ISA_COUNT; i++)
            if (!strcmp(env, k_names[i])) isa = (dt_isa)i, found = 1;
        if (!found)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "DTRAIN_ISA=%s: unknown kernel path (auto, scalar, avx2, avx512, neon)",
                           env);
        DT_CHECK(check_usable(ctx, isa, "DTRAIN_ISA="));
#if defined(__x86_64__)
        /* A forced lower path also holds oneDNN's JIT to it, so the matmuls run as on a CPU
         * of that kind (the only way to measure such a CPU here). */
        if (isa != dt_isa_best()) {
            dnnl_cpu_isa_t cap = isa == DT_ISA_AVX2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41;
            if (dnnl_set_max_cpu_isa(cap) != dnnl_success)
                return dt_fail(ctx, DT_ERR_BACKEND,
                               "DTRAIN_ISA=%s: oneDNN refused to cap its ISA (set it before the "
                               "first matmul)", env);
        }
#endif
    }
    g_active = table_of(isa);
    return DT_OK;
}

const char *dt_isa_matmul_name(void) {
    if (g_matmul_ref) return "reference loops (DTRAIN_MATMUL=ref)";
    /* oneDNN reports the cap, not what the CPU has: name it only when we set one. */
    if (dt_isa_active() == dt_isa_best()) return "oneDNN (its best ISA for this CPU)";
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "oneDNN capped at sse41";
    case dnnl_cpu_isa_avx2: return "oneDNN capped at avx2";
    default: return "oneDNN";
    }
}

void dt_isa_describe(char *buf, size_t n) {
    snprintf(buf, n, "kernels %s%s (cpu: %s), matmul %s", dt_isa_name(dt_isa_active()),
             dt_isa_active() != dt_isa_best() ? " forced by DTRAIN_ISA" : "", dt_isa_cpu_flags(),
             dt_isa_matmul_name());
}
