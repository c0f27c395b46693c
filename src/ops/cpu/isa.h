/* isa.h - which instruction-set path the CPU kernels run on, chosen once at start-up.
 *
 * One binary carries every path its architecture can use (x86-64: scalar, avx2, avx512;
 * aarch64: scalar, neon). The best path the CPU supports is chosen from cpuid unless
 * DTRAIN_ISA names a lower one (refused when the CPU lacks it). Everything above the kernels
 * calls the plain dt_* functions of ops.h / optim.h; they go through the active table.
 *
 *   if (dt_isa_init(&ctx) != DT_OK) fail;           // reads DTRAIN_ISA
 *   printf("kernels: %s\n", dt_isa_name(dt_isa_active()));
 *
 * Same path + same thread count => bitwise the same results. Paths differ from each other
 * in the order of reductions (lane count), so forward/backward values differ in the last
 * bits between paths; AdamW and the gradient sum of squares are bitwise the same on every
 * path, so ranks on different CPUs keep identical weights (docs/ARCHITECTURE.md).
 */
#ifndef DT_ISA_H
#define DT_ISA_H

#include <stddef.h>

#include "core/status.h"

/* Numeric ids, also used by the preprocessor in simd.h (-DDT_ISA_ID=...). */
#define DT_ISA_ID_SCALAR 0
#define DT_ISA_ID_AVX2 1
#define DT_ISA_ID_AVX512 2
#define DT_ISA_ID_NEON 3

typedef enum dt_isa {
    DT_ISA_SCALAR = DT_ISA_ID_SCALAR,
    DT_ISA_AVX2 = DT_ISA_ID_AVX2,     /* AVX2 + FMA */
    DT_ISA_AVX512 = DT_ISA_ID_AVX512, /* AVX-512 F/BW/DQ/VL */
    DT_ISA_NEON = DT_ISA_ID_NEON,     /* aarch64 Advanced SIMD */
    DT_ISA_COUNT
} dt_isa;

/* "scalar", "avx2", "avx512", "neon". */
const char *dt_isa_name(dt_isa isa);
/* 1 when this binary has the path and this CPU can run it. */
int dt_isa_supported(dt_isa isa);
/* 1 when this binary has the path (whatever the CPU). */
int dt_isa_built(dt_isa isa);
/* The best supported path. */
dt_isa dt_isa_best(void);
/* Chooses the path: DTRAIN_ISA if set (a name above, or "auto"), else the best. A name
 * that is unknown, not built or not supported by the CPU fails naming DTRAIN_ISA. A forced
 * lower path also caps oneDNN's JIT at that ISA, so the whole step runs as on such a CPU. */
dt_status dt_isa_init(dt_ctx *ctx);
/* The active path (the best one if dt_isa_init was never called). */
dt_isa dt_isa_active(void);
/* Switches the kernels to a supported path (tests run every path in one process). */
dt_status dt_isa_use(dt_ctx *ctx, dt_isa isa);
/* The CPU's relevant feature flags, space separated ("avx2 fma avx512f ..."). */
const char *dt_isa_cpu_flags(void);

/* What the matmuls run on: oneDNN at its best, or capped by a forced lower path. */
const char *dt_isa_matmul_name(void);
/* 1 when DTRAIN_MATMUL=ref: matmuls run as plain loops, each output a float sum over k in
 * index order (slow; the same bits on every x86-64 CPU with the portable build, for the
 * stored reference hashes of tests/test_golden.sh). */
int dt_isa_matmul_ref(void);
/* 1 when this CPU's 16-bit dot-product matmul is expected to beat its fp32 GEMM, so mixed
 * precision should use it (matmul_lowp.c's native engine); 0: widen to fp32 instead. A fixed
 * rule per CPU, never a timing, because the engine decides the bits: DTRAIN_LOWP_GEMM=native
 * or widened, else x86-64: not on Intel cores without AMX-BF16 (measured: oneDNN's
 * AVX512_BF16 matmul at half the fp32 sgemm rate on an Intel Xeon, family 6 model 207;
 * 1.9x on AMD Zen 4), yes elsewhere. */
int dt_isa_lowp_native_preferred(void);
/* One line for banners: "kernels avx2 forced by DTRAIN_ISA (cpu: avx2 fma ...), matmul
 * oneDNN capped at avx2". */
void dt_isa_describe(char *buf, size_t n);

#endif
