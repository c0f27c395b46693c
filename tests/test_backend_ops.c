/* One list of operation cases for every backend (docs/BACKENDS.md), after ggml's
 * test-backend-ops: each case of k_cases (an operation of the dt_backend table, a shape with
 * odd sizes among them, a dtype, a variant flag, its tolerances) runs on the float64
 * reference backend "ref" once and on every other registered backend (the CPU backend on
 * every ISA path this CPU supports), from the same deterministic inputs, and each output is
 * compared with the reference's: elementwise |got - ref| <= atol + rtol |ref| and normwise
 * max |got - ref| / max |ref| <= rtol (tests/testutil.h tu_compare: NaN or Inf fails), or
 * bit for bit where the tolerances are 0 0 (conversions, copies, NF4 bytes). A failure names
 * the operation, its shape, dtype, variant, backend and path.
 *
 * Every operation of the table has an entry in k_ops (a compile-time count ties it to
 * backend.h: an operation added there without one stops this file compiling) and at least one
 * case (test_every_op_has_a_case). Adding a case is one line of k_cases; adding an
 * operation is one k_ops entry, one runner and its lines.
 *
 * Inputs and outputs live in the backend's memory (be->mem) and move through be->copy, so a
 * device backend is tested as it is registered. Gradient checks of the references against
 * finite differences stay in test_ops*.c, test_attention.c and test_nf4.c. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_ops.h"
#include "ops/cpu/isa.h"

/* ---------------------------------------------------------------- the operations */
typedef struct { const char *name; size_t off; } op_slot;
#define SLOT(m) {#m, offsetof(dt_backend, m)}
static const op_slot k_ops[] = {
    SLOT(encoder_forward), SLOT(encoder_backward), SLOT(pos_forward), SLOT(pos_backward),
    SLOT(layernorm_forward), SLOT(layernorm_backward), SLOT(matmul_forward), SLOT(matmul_backward),
    SLOT(matmul_forward_ld), SLOT(matmul_backward_ld), SLOT(attention_forward), SLOT(attention_backward),
    SLOT(attention_block_forward), SLOT(attention_block_backward), SLOT(attention_merge),
    SLOT(rmsnorm_forward), SLOT(rmsnorm_backward), SLOT(rope_forward), SLOT(rope_backward), SLOT(rope_forward_at), SLOT(rope_backward_at),
    SLOT(swiglu_forward), SLOT(swiglu_backward), SLOT(gelu_forward), SLOT(gelu_backward),
    SLOT(residual_forward), SLOT(crossentropy_forward), SLOT(crossentropy_backward), SLOT(exp_sum),
    SLOT(f32_to_bf16), SLOT(bf16_to_f32), SLOT(f32_to_f16), SLOT(f16_to_f32), SLOT(count_nonfinite_f32),
    SLOT(matmul_forward_lp), SLOT(matmul_backward_lp), SLOT(matmul_forward_ld_lp), SLOT(matmul_backward_ld_lp),
    SLOT(matmul_forward_nf4), SLOT(matmul_backward_nf4), SLOT(matmul_forward_nf4_lp), SLOT(matmul_backward_nf4_lp),
    SLOT(nf4_quantize), SLOT(nf4_dequantize), SLOT(matmul_peak_gflops), SLOT(matmul_peak_gflops_lp),
    SLOT(lowp_gemm_native), SLOT(matmul_lowp_cache_clear), SLOT(nf4_panel_bytes), SLOT(ops_serial_thread),
    /* parallel/ and optim/ operations */
    SLOT(adamw_chunked), SLOT(adamw_aged), SLOT(sumsq_chunked), SLOT(add_f32), SLOT(scale_f32),
    /* model/ operations */
    SLOT(patchify), SLOT(cls_pos_forward), SLOT(cls_pos_backward), SLOT(crossentropy_backward_blocks),
    SLOT(f32_to_lowp_rows_inplace), SLOT(lowrank_down_forward), SLOT(lowrank_up_forward), SLOT(lowrank_up_backward),
    SLOT(lowrank_down_backward), SLOT(fill_normal), SLOT(fill_f32), SLOT(lowrank_merge),
};
#define N_OPS (sizeof k_ops / sizeof k_ops[0])
/* Every member after `sync` is an operation (a function pointer): their number is fixed by
 * the struct's size. */
#define FIRST_OP offsetof(dt_backend, encoder_forward)
_Static_assert((sizeof(dt_backend) - FIRST_OP) / sizeof(void (*)(void)) == N_OPS,
               "dt_backend (src/ops/backend.h) has an operation without an entry in k_ops of "
               "tests/test_backend_ops.c: add it there and give it cases in k_cases");

/* ---------------------------------------------------------------- the list
 * Tolerances: fp32 results of long sums get rtol and atol ~1e-5 (the fp32 accumulation over
 * K terms of magnitude ~1, and the scalar path's serial sum of 50257 exponentials); elementwise
 * maps ~1e-6 (3e-6 for GELU's derivative of an fp32 tanh); copies, conversions and NF4 bytes are
 * bit for bit (0 0). 16-bit operands do not loosen the GEMMs (their products are exact in
 * fp32); 16-bit attention does (the kernels round the probabilities too, which the reference
 * does not model). */
#define E(op, fn, dims, ...) {op, fn, dims, __VA_ARGS__}
static const op_case k_cases[] = {
    E("encoder_forward", run_encoder, "N,C,V,row0,rows", {27, 21, 11, 0, 11}, DT_F32, 0, 0, 0),
    E("encoder_forward", run_encoder, "N,C,V,row0,rows", {64, 67, 50, 16, 9}, DT_F32, 0, 0, 0),
    E("encoder_backward", run_encoder, "N,C,V,row0,rows", {27, 21, 11, 0, 11}, DT_F32, 0, 1e-6, 1e-6),
    E("encoder_backward", run_encoder, "N,C,V,row0,rows", {64, 67, 50, 16, 9}, DT_F32, 0, 1e-6, 1e-6),
    E("pos_forward", run_pos, "B,T,C", {3, 9, 21}, DT_F32, 0, 0, 0),
    E("pos_backward", run_pos, "B,T,C", {3, 9, 21}, DT_F32, 0, 1e-6, 1e-6),
    E("pos_backward", run_pos, "B,T,C", {5, 33, 100}, DT_F32, 0, 1e-6, 1e-6),
    E("layernorm_forward", run_layernorm, "N,C", {7, 13}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_forward", run_layernorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_forward", run_layernorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {7, 13}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("layernorm_backward", run_layernorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {1, 7}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {1, 4096}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {33, 100}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {64, 768}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_forward", run_rmsnorm, "N,C", {5, 1003}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {1, 7}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {7, 13}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {64, 768}, DT_F32, 0, 1e-5, 1e-5),
    E("rmsnorm_backward", run_rmsnorm, "N,C", {5, 1003}, DT_F32, F_EPS6, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {5, 7, 3}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {64, 96, 288}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward", run_matmul, "N,C,OC", {37, 50, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {5, 7, 3}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {64, 96, 288}, DT_F32, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward", run_matmul, "N,C,OC", {37, 50, 130}, DT_F32, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_forward_ld", run_matmul, "N,C,OC,ld", {5, 7, 3, 3}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F32, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_F32, F_ACC | F_NODW, 1e-5, 1e-5),
    E("matmul_backward_ld", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_F32, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {7, 13, 5}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {64, 96, 288}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_lp", run_matmul, "N,C,OC", {1, 1, 1}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {7, 13, 5}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {130, 200, 70}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_BIAS, 1e-5, 1e-5),
    E("matmul_backward_lp", run_matmul, "N,C,OC", {37, 50, 130}, DT_F16, F_NODINP | F_NODW, 1e-5, 1e-5),
    E("matmul_forward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_BF16, 0, 1e-5, 1e-5),
    E("matmul_forward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_BF16, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {37, 50, 43, 130}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_ld_lp", run_matmul, "N,C,OC,ld", {64, 96, 100, 288}, DT_BF16, F_NODINP, 1e-5, 1e-5),
    E("matmul_forward_nf4", run_nf4_matmul, "N,C,OC", {7, 13, 5}, DT_F32, F_BIAS, 1e-5, 1e-5),
    /* K = 4097 summed serially in fp32 (the scalar and NEON builds' GEMM): up to ~sqrt(K) eps
     * sum |terms| ~ 1e-4 on an element whose terms cancel (4e-5 seen under qemu), so atol 2e-4 */
    E("matmul_forward_nf4", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, 0, 1e-5, 2e-4),
    E("matmul_backward_nf4", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_F32, 0, 1e-5, 1e-5),
    E("matmul_backward_nf4", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, F_ACC, 1e-5, 1e-5),
    E("matmul_forward_nf4_lp", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_BF16, F_BIAS, 1e-5, 1e-5),
    E("matmul_forward_nf4_lp", run_nf4_matmul, "N,C,OC", {4, 64, 3}, DT_F16, 0, 1e-5, 1e-5),
    E("matmul_backward_nf4_lp", run_nf4_matmul, "N,C,OC", {33, 200, 70}, DT_BF16, F_ACC, 1e-5, 1e-5),
    E("matmul_backward_nf4_lp", run_nf4_matmul, "N,C,OC", {7, 13, 5}, DT_F16, 0, 1e-5, 1e-5),
    E("nf4_quantize", run_nf4, "n", {64 * 256 * 2 + 77}, DT_F32, 0, 0, 0),
    E("nf4_quantize", run_nf4, "n", {13}, DT_F32, 0, 0, 0),
    E("nf4_quantize", run_nf4, "n", {1000}, DT_F32, F_NAN, 0, 0),
    E("nf4_dequantize", run_nf4, "n,i0,count", {64 * 256 * 5 + 77, 0, 64 * 256 * 5 + 77}, DT_F32, 0, 0, 0),
    E("nf4_dequantize", run_nf4, "n,i0,count", {1000, 13, 501}, DT_F32, 0, 0, 0),
    E("attention_block_forward", run_attention_block, "Tq,Tk,NH,NKV,hs", {29, 45, 4, 2, 8}, DT_F32, 0, 1e-5, 1e-5),
    E("attention_block_forward", run_attention_block, "Tq,Tk,NH,NKV,hs", {70, 70, 3, 3, 12}, DT_F32, F_CAUSAL, 1e-5, 1e-5),
    E("attention_block_forward", run_attention_block, "Tq,Tk,NH,NKV,hs", {33, 17, 4, 1, 16}, DT_BF16, 0, 4e-3, 4e-3),
    E("attention_block_backward", run_attention_block, "Tq,Tk,NH,NKV,hs", {29, 45, 4, 2, 8}, DT_F32, 0, 1e-4, 1e-5),
    E("attention_block_backward", run_attention_block, "Tq,Tk,NH,NKV,hs", {70, 70, 3, 3, 12}, DT_F32, F_CAUSAL, 1e-4, 1e-5),
    E("attention_block_backward", run_attention_block, "Tq,Tk,NH,NKV,hs", {33, 17, 4, 1, 16}, DT_F16, 0, 1e-3, 1e-3),
    E("attention_merge", run_attention_block, "Tq,Tk,NH,NKV,hs", {37, 20, 3, 3, 8}, DT_F32, 0, 1e-6, 1e-6),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_F32, F_CAUSAL, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 100, 4, 2, 16}, DT_F32, F_CAUSAL, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 17, 4, 1, 2}, DT_F32, 0, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 4, 12}, DT_F32, 0, 1e-5, 1e-5),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_BF16, F_CAUSAL, 4e-3, 4e-3),
    E("attention_forward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 2, 16}, DT_F16, 0, 1e-3, 1e-3),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_F32, F_CAUSAL, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {1, 100, 4, 2, 16}, DT_F32, F_CAUSAL, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 17, 4, 1, 2}, DT_F32, 0, 1e-4, 1e-5),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {2, 29, 3, 3, 8}, DT_BF16, F_CAUSAL, 5e-3, 5e-3),
    E("attention_backward", run_attention, "B,T,NH,NKV,hs", {1, 70, 4, 2, 16}, DT_F16, 0, 1e-3, 1e-3),
    E("rope_forward", run_rope, "B,T,NH,NKV,hs", {2, 37, 4, 2, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("rope_forward", run_rope, "B,T,NH,NKV,hs", {1, 9, 3, 1, 6}, DT_F32, F_SCALE, 1e-5, 1e-5),
    E("rope_backward", run_rope, "B,T,NH,NKV,hs", {2, 37, 4, 2, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("rope_backward", run_rope, "B,T,NH,NKV,hs", {1, 9, 3, 1, 6}, DT_F32, F_SCALE, 1e-5, 1e-5),
    /* positions pos0.. (a context-parallel chunk): fl(t f) of t ~ 100 is ~4e-6 rad from t f */
    E("rope_forward_at", run_rope, "B,T,NH,NKV,hs,pos0", {2, 37, 4, 2, 16, 91}, DT_F32, 0, 1e-5, 3e-5),
    E("rope_backward_at", run_rope, "B,T,NH,NKV,hs,pos0", {1, 9, 3, 1, 6, 130}, DT_F32, F_SCALE, 1e-5, 3e-5),
    E("swiglu_forward", run_swiglu, "N,F,gate", {1, 1, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {3, 13, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {5, 2731, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_forward", run_swiglu, "N,F,gate", {2, 37, 120}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {1, 7, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {64, 1000, 6}, DT_F32, 0, 1e-6, 1e-6),
    E("swiglu_backward", run_swiglu, "N,F,gate", {2, 37, 120}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_forward", run_gelu, "N", {1}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_forward", run_gelu, "N", {100003}, DT_F32, 0, 1e-6, 1e-6),
    E("gelu_backward", run_gelu, "N", {17}, DT_F32, 0, 3e-6, 3e-6),
    E("gelu_backward", run_gelu, "N", {100003}, DT_F32, F_INPLACE, 3e-6, 3e-6),
    E("residual_forward", run_residual, "N", {1001}, DT_F32, 0, 0, 0),
    E("residual_forward", run_residual, "N", {1001}, DT_F32, F_INPLACE, 0, 0),
    E("crossentropy_forward", run_crossentropy, "N,V,Vp", {4, 10, 16}, DT_F32, 0, 1e-5, 1e-5),
    E("crossentropy_forward", run_crossentropy, "N,V,Vp", {8, 50257, 50304}, DT_F32, F_MASK, 1e-5, 1e-5),
    E("crossentropy_backward", run_crossentropy, "N,V,Vp", {5, 33, 33}, DT_F32, F_MASK, 1e-6, 1e-7),
    E("crossentropy_backward", run_crossentropy, "N,V,Vp", {8, 50257, 50304}, DT_F32, F_INPLACE, 1e-6, 1e-7),
    E("exp_sum", run_exp_sum, "n", {1}, DT_F32, 0, 1e-6, 1e-30),
    E("exp_sum", run_exp_sum, "n", {1001}, DT_F32, 0, 1e-6, 1e-30),
    E("exp_sum", run_exp_sum, "n", {50257}, DT_F32, F_NOY, 1e-6, 1e-30),
    E("f32_to_bf16", run_convert, "n", {100003}, DT_BF16, 0, 0, 0),
    E("f32_to_f16", run_convert, "n", {100003}, DT_F16, 0, 0, 0),
    E("f32_to_bf16", run_convert, "n", {7}, DT_BF16, 0, 0, 0),
    E("bf16_to_f32", run_convert, "n", {65536}, DT_BF16, 0, 0, 0),
    E("f16_to_f32", run_convert, "n", {65536}, DT_F16, 0, 0, 0),
    E("f16_to_f32", run_convert, "n", {1001}, DT_F16, 0, 0, 0),
    E("count_nonfinite_f32", run_convert, "n", {100003}, DT_F32, 0, 0, 0),
    E("count_nonfinite_f32", run_convert, "n", {17}, DT_F32, 0, 0, 0),
    E("ops_serial_thread", run_serial, "n", {(1 << 20) + 37}, DT_F32, 0, 0, 0),
    E("matmul_lowp_cache_clear", run_query, "N,C,OC", {37, 50, 130}, DT_BF16, 0, 1e-5, 1e-5),
    E("nf4_panel_bytes", run_nf4_matmul, "N,C,OC", {5, 4097, 600}, DT_F32, 0, 1e-5, 2e-4), /* K = 4097: above */
    E("lowp_gemm_native", run_query, "-", {0}, DT_BF16, 0, 0, 0),
    E("lowp_gemm_native", run_query, "-", {0}, DT_F16, 0, 0, 0),
    E("matmul_peak_gflops", run_query, "n", {64}, DT_F32, 0, 0, 0),
    E("matmul_peak_gflops_lp", run_query, "n", {64}, DT_BF16, 0, 0, 0),
    /* parallel/ and optim/ operations: AdamW in fp32 against float64 (a few fp32 roundings per
     * element, cancellations near 0: atol 1e-8); the sum of squares in double lanes (1e-12); add and scale bit for bit */
    E("adamw_chunked", run_adamw, "n", {16384 * 3 + 7}, DT_F32, 0, 2e-6, 1e-8),
    E("adamw_chunked", run_adamw, "n", {5}, DT_F32, 0, 2e-6, 1e-8),
    E("adamw_aged", run_adamw, "n", {16384 + 333}, DT_F32, F_MASK, 2e-6, 1e-8),
    E("sumsq_chunked", run_sumsq, "n", {65536 * 2 + 1001}, DT_F32, 0, 1e-12, 0),
    E("sumsq_chunked", run_sumsq, "n", {3}, DT_F32, 0, 1e-12, 0),
    E("add_f32", run_add_scale, "n", {100003}, DT_F32, 0, 0, 0),
    E("scale_f32", run_add_scale, "n", {100003}, DT_F32, F_SCALE, 0, 0),
    /* model/ operations: patchify (a quotient), the class token and positions forward (a sum of
     * two floats), the narrowing and the fills bit for bit; the position sums over the batch
     * ~1e-6; the cross-entropy block backward as crossentropy_backward; the low-rank products
     * as the fp32 GEMMs (their 16-bit x widened exactly; dropout by the ops.h mask, so every
     * backend drops the same features) */
    E("patchify", run_patchify, "B,CH,S,p", {2, 3, 12, 4}, DT_F32, 0, 0, 0),
    E("patchify", run_patchify, "B,CH,S,p", {3, 1, 35, 7}, DT_F32, 0, 0, 0),
    E("patchify", run_patchify, "B,CH,S,p", {1, 3, 5, 5}, DT_F32, 0, 0, 0),
    E("cls_pos_forward", run_cls_pos, "B,T,C,r0,rows", {2, 10, 10, 7, 11}, DT_F32, 0, 0, 0),
    E("cls_pos_forward", run_cls_pos, "B,T,C,r0,rows", {3, 17, 33, 0, 51}, DT_F32, 0, 0, 0),
    E("cls_pos_forward", run_cls_pos, "B,T,C,r0,rows", {4, 50, 1, 49, 1}, DT_F32, 0, 0, 0),
    E("cls_pos_backward", run_cls_pos, "B,T,C", {2, 10, 10}, DT_F32, 0, 1e-6, 1e-6),
    E("cls_pos_backward", run_cls_pos, "B,T,C", {5, 17, 33}, DT_F32, 0, 1e-6, 1e-6),
    E("cls_pos_backward", run_cls_pos, "B,T,C", {1, 2, 7}, DT_F32, 0, 1e-6, 1e-6),
    E("crossentropy_backward_blocks", run_ce_blocks, "N,ld,nb,Vl,col0,V", {9, 214, 3, 70, 140, 250}, DT_F32, F_MASK, 1e-6, 1e-7),
    E("crossentropy_backward_blocks", run_ce_blocks, "N,ld,nb,Vl,col0,V", {7, 33, 1, 33, 0, 30}, DT_F32, 0, 1e-6, 1e-7),
    E("crossentropy_backward_blocks", run_ce_blocks, "N,ld,nb,Vl,col0,V", {5, 25152, 1, 25152, 25152, 50257}, DT_F32, F_MASK, 1e-6, 1e-7),
    E("crossentropy_backward_blocks", run_ce_blocks, "N,ld,nb,Vl,col0,V", {6, 1001, 4, 250, 0, 1000}, DT_F32, 0, 1e-6, 1e-7),
    E("f32_to_lowp_rows_inplace", run_lowp_rows, "N,ld", {5, 600}, DT_BF16, 0, 0, 0),
    E("f32_to_lowp_rows_inplace", run_lowp_rows, "N,ld", {5, 600}, DT_F16, 0, 0, 0),
    E("f32_to_lowp_rows_inplace", run_lowp_rows, "N,ld", {3, 7}, DT_BF16, 0, 0, 0),
    E("f32_to_lowp_rows_inplace", run_lowp_rows, "N,ld", {2, 1025}, DT_F16, 0, 0, 0),
    E("lowrank_down_forward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_down_forward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_F32, F_DROP, 1e-5, 1e-5),
    E("lowrank_down_forward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_BF16, 0, 1e-5, 1e-5),
    E("lowrank_down_forward", run_lowrank_down, "N,C,r,T", {64, 767, 33, 13}, DT_BF16, F_DROP, 1e-5, 1e-5),
    E("lowrank_down_forward", run_lowrank_down, "N,C,r,T", {5, 7, 3, 2}, DT_F16, F_DROP, 1e-5, 1e-5),
    E("lowrank_up_forward", run_lowrank_up, "N,rows,r,ld", {37, 19, 20, 23}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_up_forward", run_lowrank_up, "N,rows,r,ld", {65, 300, 33, 300}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_up_forward", run_lowrank_up, "N,rows,r,ld", {1, 1, 1, 3}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_up_backward", run_lowrank_up, "N,rows,r,ld", {37, 19, 20, 23}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_up_backward", run_lowrank_up, "N,rows,r,ld", {65, 300, 33, 300}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_up_backward", run_lowrank_up, "N,rows,r,ld", {3, 9, 17, 11}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_F32, 0, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_F32, F_DROP, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_BF16, 0, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {64, 767, 33, 13}, DT_BF16, F_DROP, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {37, 150, 20, 8}, DT_F32, F_DROP | F_NODINP, 1e-5, 1e-5),
    E("lowrank_down_backward", run_lowrank_down, "N,C,r,T", {5, 7, 3, 2}, DT_F16, 0, 1e-5, 1e-5),
    E("fill_normal", run_fill, "n,i0,drawn", {1000, 300, 900}, DT_F32, 0, 0, 0),
    E("fill_normal", run_fill, "n,i0,drawn", {100003, 0, 100003}, DT_F32, 0, 0, 0),
    E("fill_normal", run_fill, "n,i0,drawn", {17, 50, 10}, DT_F32, 0, 0, 0),
    E("fill_f32", run_fill, "n", {100003}, DT_F32, 0, 0, 0),
    E("fill_f32", run_fill, "n", {1}, DT_F32, 0, 0, 0),
    /* the merge's sums are double on every backend, in k order: bit for bit */
    E("lowrank_merge", run_lowrank_merge, "rows,C,r", {37, 150, 20}, DT_F32, 0, 0, 0),
    E("lowrank_merge", run_lowrank_merge, "rows,C,r", {1, 7, 1}, DT_F32, 0, 0, 0),
};
#define N_CASES (sizeof k_cases / sizeof k_cases[0])

/* ---------------------------------------------------------------- the driver */

static const char *dt_str(dt_dtype dt) { return dt == DT_F32 ? "fp32" : dt_dtype_name(dt); }

/* "matmul_forward N=7 C=13 OC=5 fp32 [bias]" */
static void case_name(char *s, size_t n, const op_case *c) {
    int l = snprintf(s, n, "%s", c->op);
    const char *p = c->dims;
    for (int i = 0; *p && *p != '-' && i < 6; i++) {
        const char *e = strchr(p, ',');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        l += snprintf(s + l, n - l, " %.*s=%d", (int)k, p, c->d[i]);
        p += k + (e != NULL);
    }
    l += snprintf(s + l, n - l, " %s", dt_str(c->dt));
    static const char *fl[] = {"bias", "accumulate", "causal", "in-place", "no-dinp", "no-dw", "masked", "scaled", "no-y", "nan", "eps=1e-6", "dropout"};
    for (int i = 0; i < 12; i++)
        if (c->flag & (1 << i)) l += snprintf(s + l, n - l, " [%s]", fl[i]);
}

/* Host copies of a run's outputs. */
typedef struct { void *h[MAX_OUT]; out_spec o[MAX_OUT]; int n; char err[256]; } result;

static void result_free(result *res) {
    for (int i = 0; i < res->n; i++) free(res->h[i]);
    res->n = 0;
}

static void run_case(const op_case *c, const dt_backend *be, result *res) {
    run r = {.c = c, .be = be};
    c->fn(&r);
    be->sync();
    memset(res, 0, sizeof *res);
    for (int i = 0; i < r.nout; i++) {
        res->o[i] = r.out[i];
        res->h[i] = tu_malloc(r.out[i].bytes + 8);
        be->copy(res->h[i], r.out[i].dev, r.out[i].bytes);
    }
    res->n = r.nout;
    snprintf(res->err, sizeof res->err, "%s", r.err);
    for (int i = 0; i < r.nbuf; i++) be->mem->free(r.buf[i], r.bytes[i]);
}

/* Compares got with the reference; prints a line per output; returns the failures. */
static int compare(const op_case *c, const char *where, const result *got, const result *ref) {
    char name[160];
    case_name(name, sizeof name, c);
    int bad = 0;
    if (got->err[0]) {
        printf("FAIL %s on %s: %s\n", name, where, got->err);
        bad++;
    }
    if (got->n != ref->n) {
        printf("FAIL %s on %s: %d outputs, the reference %d\n", name, where, got->n, ref->n);
        return bad + 1;
    }
    for (int i = 0; i < got->n; i++) {
        const out_spec *o = &ref->o[i];
        size_t n = o->bytes / o->elem;
        if (o->elem != 4 || (o->rtol == 0 && o->atol == 0)) {
            if (memcmp(got->h[i], ref->h[i], o->bytes) == 0) continue;
            size_t k = 0; /* the first element that differs */
            while (k < n && !memcmp((char *)got->h[i] + k * o->elem, (char *)ref->h[i] + k * o->elem, o->elem)) k++;
            uint32_t a = 0, b = 0;
            memcpy(&a, (char *)got->h[i] + k * o->elem, o->elem), memcpy(&b, (char *)ref->h[i] + k * o->elem, o->elem);
            printf("FAIL %s on %s: %s not bit for bit: [%zu] %0*x, the reference %0*x\n", name, where, o->name, k,
                   o->elem * 2, a, o->elem * 2, b);
            bad++;
            continue;
        }
        double *want = tu_malloc(n * sizeof(double) + 8);
        tu_to_double(want, ref->h[i], n);
        tu_cmp r = tu_compare(got->h[i], want, n, o->rtol, o->atol);
        free(want);
        if (r.ok) continue;
        printf("FAIL %s on %s: %s: normwise %.3e (rtol %.0e), elementwise %.3f of atol %.0e + rtol |ref| "
               "(worst [%zu] %.9g, the reference %.9g)\n",
               name, where, o->name, r.norm, o->rtol, r.elem, o->atol, r.worst, r.got, r.want);
        bad++;
    }
    return bad;
}

/* Runs case c on every backend but the reference, and on the CPU backend on every ISA path of
 * this CPU; returns the failures. */
static int check_case(const op_case *c) {
    result ref, got;
    run_case(c, &dt_backend_ref, &ref);
    if (ref.err[0]) {
        char name[160];
        case_name(name, sizeof name, c);
        printf("FAIL %s on ref: %s\n", name, ref.err);
        result_free(&ref);
        return 1;
    }
    int bad = 0;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (int b = 0; b < dt_backend_count(); b++) {
        const dt_backend *be = dt_backend_at(b);
        if (be == &dt_backend_ref) continue;
        int cpu = be == &dt_backend_cpu;
        for (int isa = 0; isa < (cpu ? DT_ISA_COUNT : 1); isa++) {
            char where[64];
            if (cpu) {
                if (!dt_isa_supported((dt_isa)isa)) continue;
                if (dt_isa_use(&ctx, (dt_isa)isa) != DT_OK) fail_msg("%s", ctx.err);
                snprintf(where, sizeof where, "%s/%s", be->name, dt_isa_name((dt_isa)isa));
            } else {
                snprintf(where, sizeof where, "%s", be->name);
            }
            run_case(c, be, &got);
            bad += compare(c, where, &got, &ref);
            result_free(&got);
        }
    }
    if (dt_isa_use(&ctx, dt_isa_best()) != DT_OK) fail_msg("%s", ctx.err);
    result_free(&ref);
    return bad;
}

/* ---------------------------------------------------------------- tests */

static const op_slot *slot(const char *name) {
    for (size_t i = 0; i < N_OPS; i++)
        if (!strcmp(k_ops[i].name, name)) return &k_ops[i];
    return NULL;
}

/* k_ops names every member once (its offsets are the table's operation slots, each once), every
 * op has a case, every case names an op, and every registered backend fills every slot. */
static void test_every_op_has_a_case(void **state) {
    (void)state;
    int seen[N_OPS] = {0};
    for (size_t i = 0; i < N_OPS; i++) {
        size_t k = (k_ops[i].off - FIRST_OP) / sizeof(void (*)(void));
        assert_true(k_ops[i].off >= FIRST_OP && k < N_OPS);
        if (seen[k]++) fail_msg("k_ops: %s names a slot twice", k_ops[i].name);
    }
    int missing = 0;
    for (size_t i = 0; i < N_OPS; i++) {
        size_t n = 0;
        for (size_t j = 0; j < N_CASES; j++) n += !strcmp(k_cases[j].op, k_ops[i].name);
        if (!n) printf("FAIL %s: no case in k_cases\n", k_ops[i].name), missing++;
    }
    for (size_t j = 0; j < N_CASES; j++)
        if (!slot(k_cases[j].op)) printf("FAIL case %zu: %s is no operation of dt_backend\n", j, k_cases[j].op), missing++;
    for (int b = 0; b < dt_backend_count(); b++)
        for (size_t i = 0; i < N_OPS; i++) {
            void (*const *fn)(void) = (void (*const *)(void))((const char *)dt_backend_at(b) + k_ops[i].off);
            if (!*fn) printf("FAIL backend %s: no %s\n", dt_backend_at(b)->name, k_ops[i].name), missing++;
        }
    printf("%zu operations, %zu cases, %d backends\n", N_OPS, N_CASES, dt_backend_count());
    if (missing) fail_msg("%d operations without a case or an implementation", missing);
}

static void test_registry(void **state) {
    (void)state;
    assert_ptr_equal(dt_backend_find("cpu"), &dt_backend_cpu);
    assert_ptr_equal(dt_backend_find("ref"), &dt_backend_ref);
    assert_null(dt_backend_find("nope"));
    assert_string_equal(dt_backend_ref.mem->owner, "ref");
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(setenv("DTRAIN_BACKEND", "ref", 1), 0);
    assert_int_equal(dt_backend_init(&ctx), DT_OK);
    assert_ptr_equal(dt_backend_active(), &dt_backend_ref);
    dt_alloc a;
    dt_alloc_init(&a);
    assert_string_equal(a.mem->owner, "ref"); /* dt_alloc now gives the reference's memory */
    assert_int_equal(setenv("DTRAIN_BACKEND", "cuda9", 1), 0);
    assert_int_not_equal(dt_backend_init(&ctx), DT_OK);
    printf("refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "DTRAIN_BACKEND=cuda9"));
    assert_int_equal(dt_backend_use(&ctx, "cpu"), DT_OK);
    unsetenv("DTRAIN_BACKEND");
}

static void test_cases(void **state) {
    (void)state;
    int bad = 0;
    for (int b = 0; b < dt_backend_count(); b++) {
        const dt_backend *be = dt_backend_at(b);
        printf("backend %s%s", be->name, be == &dt_backend_ref ? " (the reference)\n" : be == &dt_backend_cpu ? ", paths:" : "\n");
        for (int isa = 0; be == &dt_backend_cpu && isa < DT_ISA_COUNT; isa++)
            if (dt_isa_built((dt_isa)isa))
                printf(" %s%s", dt_isa_name((dt_isa)isa), dt_isa_supported((dt_isa)isa) ? "" : " (NOT RUN: this CPU lacks it)");
        if (be == &dt_backend_cpu) printf("\n");
    }
    for (size_t j = 0; j < N_CASES; j++) {
        char name[160];
        case_name(name, sizeof name, &k_cases[j]);
        int b = check_case(&k_cases[j]);
        printf("%s %s\n", b ? "FAIL" : "ok  ", name);
        bad += b;
    }
    if (bad) fail_msg("%d comparisons outside their tolerances (FAIL lines above)", bad);
}

/* The low-rank adapter's dropout mask (ops.h dt_dropout_row_key, dt_dropout_kept), which every
 * backend draws alike (the list compares the masked products): about p of the features
 * dropped, and a row's key depends on its sequence and position. */
static void test_dropout_mask(void **state) {
    (void)state;
    const dt_dropout d = {.on = 1, .T = 8, .coff = 5, .inv = 1.0f / (1.0f - 0.3f),
                          .thresh = (uint64_t)(0.3 * 4294967296.0), .seed = 7, .stream = 99, .seq0 = 3, .salt = 0x1234};
    long dropped = 0, n = 0;
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 1000; c++, n++) dropped += !dt_dropout_kept(&d, dt_dropout_row_key(&d, r), c);
    printf("dropout: %.4f of %ld dropped (p 0.3)\n", (double)dropped / (double)n, n);
    assert_true(fabs((double)dropped / (double)n - 0.3) < 0.01);
    assert_true(dt_dropout_row_key(&d, 0) != dt_dropout_row_key(&d, 1));
    assert_true(dt_dropout_row_key(&d, 1) != dt_dropout_row_key(&d, 9)); /* position 1 of the next sequence */
    dt_dropout d2 = d;
    d2.seq0 = 4; /* row 1 of sequence 4 is row 9 of sequence 3 */
    assert_true(dt_dropout_row_key(&d2, 1) == dt_dropout_row_key(&d, 9));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_a_case),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_dropout_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
