/* This path's table of kernels (one per compilation of src/ops/cpu/kern). */
#include "ops/cpu/kern/kern.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void DT_K(thread_range)(int C, int *c0, int *c1) {
#ifdef _OPENMP
    int nt = omp_get_num_threads(), tid = omp_get_thread_num();
#else
    int nt = 1, tid = 0;
#endif
    int per = (C + nt - 1) / nt;
    *c0 = tid * per < C ? tid * per : C;
    *c1 = *c0 + per < C ? *c0 + per : C;
}

const dt_cpu_kernels DT_KPASTE(dt_cpu_kernels, DT_ISA_SFX) = {
    .isa = (dt_isa)DT_ISA_ID,
    .encoder_forward = DT_K(encoder_forward),
    .encoder_backward = DT_K(encoder_backward),
    .pos_forward = DT_K(pos_forward),
    .pos_backward = DT_K(pos_backward),
    .layernorm_forward = DT_K(layernorm_forward),
    .layernorm_backward = DT_K(layernorm_backward),
    .bias_backward = DT_K(bias_backward),
    .attention_forward = DT_K(attention_forward),
    .attention_backward = DT_K(attention_backward),
    .attention_block_forward = DT_K(attention_block_forward),
    .attention_block_backward = DT_K(attention_block_backward),
    .attention_merge = DT_K(attention_merge),
    .rmsnorm_forward = DT_K(rmsnorm_forward),
    .rmsnorm_backward = DT_K(rmsnorm_backward),
    .rope_forward = DT_K(rope_forward),
    .rope_backward = DT_K(rope_backward),
    .rope_forward_at = DT_K(rope_forward_at),
    .rope_backward_at = DT_K(rope_backward_at),
    .swiglu_forward = DT_K(swiglu_forward),
    .swiglu_backward = DT_K(swiglu_backward),
    .gelu_forward = DT_K(gelu_forward),
    .gelu_backward = DT_K(gelu_backward),
    .residual_forward = DT_K(residual_forward),
    .crossentropy_forward = DT_K(crossentropy_forward),
    .crossentropy_backward = DT_K(crossentropy_backward),
    .exp_sum = DT_K(exp_sum),
    .adamw = DT_K(adamw),
    .sumsq = DT_K(sumsq),
    .f32_to_bf16 = DT_K(f32_to_bf16),
    .bf16_to_f32 = DT_K(bf16_to_f32),
    .f32_to_f16 = DT_K(f32_to_f16),
    .f16_to_f32 = DT_K(f16_to_f32),
    .count_nonfinite = DT_K(count_nonfinite),
    .nf4_dequant = DT_K(nf4_dequant),
};
