/* The CPU backend (backend.h): host memory, the ISA paths' kernels (dispatch.c, kern/),
 * oneDNN's GEMMs (matmul.c, matmul_lowp.c) and the NF4 panels (nf4.c). */
#include <pthread.h>
#include <string.h>

#include "ops/backend.h"
#include "ops/cpu/kernels.h"

/* A forked child (the crash tests fork a checkpoint writer) must not enter OpenMP: the
 * parent's thread pool does not exist there and libgomp would wait for it forever. */
static int in_forked_child;
static void mark_child(void) { in_forked_child = 1; }
/* registered when the program loads, before anything can fork */
__attribute__((constructor)) static void register_atfork(void) { pthread_atfork(NULL, NULL, mark_child); }

/* Copies of 4 MiB and more whose ranges do not overlap run on the OpenMP threads in 1 MiB
 * blocks (a checkpoint's staging copy is what the training loop pays for an asynchronous
 * save); smaller ones, overlapping ones, and those of a thread marked serial (the
 * communication thread: dt_ops_serial_thread) or of a forked child are one memmove. */
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    enum { BLK = 1 << 20, PAR = 4 << 20 };
    if (!bytes) return;
    char *d = dst;
    const char *s = src;
    if (bytes < PAR || dt_cpu_serial || in_forked_child || (d < s + bytes && s < d + bytes)) {
        memmove(dst, src, bytes);
        return;
    }
    const long nb = (long)((bytes + BLK - 1) / BLK);
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; b++) {
        const size_t lo = (size_t)b * BLK, len = bytes - lo < BLK ? bytes - lo : BLK;
        memcpy(d + lo, s + lo, len);
    }
}
static void cpu_fill(void *dst, int byte, size_t bytes) {
    if (bytes) memset(dst, byte, bytes);
}
static void cpu_sync(void) {}

const dt_backend dt_backend_cpu = {
    .name = "cpu",
    .mem = &dt_mem_host,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .sync = cpu_sync,
    .encoder_forward = dt_cpu_encoder_forward,
    .encoder_backward = dt_cpu_encoder_backward,
    .pos_forward = dt_cpu_pos_forward,
    .pos_backward = dt_cpu_pos_backward,
    .layernorm_forward = dt_cpu_layernorm_forward,
    .layernorm_backward = dt_cpu_layernorm_backward,
    .matmul_forward = dt_cpu_matmul_forward,
    .matmul_backward = dt_cpu_matmul_backward,
    .matmul_forward_ld = dt_cpu_matmul_forward_ld,
    .matmul_backward_ld = dt_cpu_matmul_backward_ld,
    .attention_forward = dt_cpu_attention_forward,
    .attention_backward = dt_cpu_attention_backward,
    .attention_block_forward = dt_cpu_attention_block_forward,
    .attention_block_backward = dt_cpu_attention_block_backward,
    .attention_merge = dt_cpu_attention_merge,
    .rmsnorm_forward = dt_cpu_rmsnorm_forward,
    .rmsnorm_backward = dt_cpu_rmsnorm_backward,
    .rope_forward = dt_cpu_rope_forward,
    .rope_backward = dt_cpu_rope_backward,
    .rope_forward_at = dt_cpu_rope_forward_at,
    .rope_backward_at = dt_cpu_rope_backward_at,
    .swiglu_forward = dt_cpu_swiglu_forward,
    .swiglu_backward = dt_cpu_swiglu_backward,
    .gelu_forward = dt_cpu_gelu_forward,
    .gelu_backward = dt_cpu_gelu_backward,
    .residual_forward = dt_cpu_residual_forward,
    .crossentropy_forward = dt_cpu_crossentropy_forward,
    .crossentropy_backward = dt_cpu_crossentropy_backward,
    .exp_sum = dt_cpu_exp_sum,
    .f32_to_bf16 = dt_cpu_f32_to_bf16,
    .bf16_to_f32 = dt_cpu_bf16_to_f32,
    .f32_to_f16 = dt_cpu_f32_to_f16,
    .f16_to_f32 = dt_cpu_f16_to_f32,
    .count_nonfinite_f32 = dt_cpu_count_nonfinite_f32,
    .matmul_forward_lp = dt_cpu_matmul_forward_lp,
    .matmul_backward_lp = dt_cpu_matmul_backward_lp,
    .matmul_forward_ld_lp = dt_cpu_matmul_forward_ld_lp,
    .matmul_backward_ld_lp = dt_cpu_matmul_backward_ld_lp,
    .matmul_forward_nf4 = dt_cpu_matmul_forward_nf4,
    .matmul_backward_nf4 = dt_cpu_matmul_backward_nf4,
    .matmul_forward_nf4_lp = dt_cpu_matmul_forward_nf4_lp,
    .matmul_backward_nf4_lp = dt_cpu_matmul_backward_nf4_lp,
    .nf4_quantize = dt_cpu_nf4_quantize,
    .nf4_dequantize = dt_cpu_nf4_dequantize,
    .matmul_peak_gflops = dt_cpu_matmul_peak_gflops,
    .matmul_peak_gflops_lp = dt_cpu_matmul_peak_gflops_lp,
    .lowp_gemm_native = dt_cpu_lowp_gemm_native,
    .matmul_lowp_cache_clear = dt_cpu_matmul_lowp_cache_clear,
    .nf4_panel_bytes = dt_cpu_nf4_panel_bytes,
    .ops_serial_thread = dt_cpu_ops_serial_thread,
    /* parallel/ and optim/ operations */
    .adamw_chunked = dt_cpu_adamw_chunked,
    .adamw_aged = dt_cpu_adamw_aged,
    .sumsq_chunked = dt_cpu_sumsq_chunked,
    .add_f32 = dt_cpu_add_f32,
    .scale_f32 = dt_cpu_scale_f32,
    /* model/ operations */
    .patchify = dt_cpu_patchify,
    .cls_pos_forward = dt_cpu_cls_pos_forward,
    .cls_pos_backward = dt_cpu_cls_pos_backward,
    .crossentropy_backward_blocks = dt_cpu_crossentropy_backward_blocks,
    .f32_to_lowp_rows_inplace = dt_cpu_f32_to_lowp_rows_inplace,
    .lowrank_down_forward = dt_cpu_lowrank_down_forward,
    .lowrank_up_forward = dt_cpu_lowrank_up_forward,
    .lowrank_up_backward = dt_cpu_lowrank_up_backward,
    .lowrank_down_backward = dt_cpu_lowrank_down_backward,
    .fill_normal = dt_cpu_fill_normal,
    .fill_f32 = dt_cpu_fill_f32,
    .lowrank_merge = dt_cpu_lowrank_merge,
};
