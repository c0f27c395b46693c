/* The families' linear layers in either precision (family_impl.h, model.h): fp32 operands,
 * or 16-bit operands with fp32 results under mixed precision. */
#include "model/family_impl.h"
#include "ops/ops.h"

void dt_fam_narrow(dt_model *m, uint16_t *h, const float *f, size_t n) {
    if (dt_lowp(m)) dt_to_lowp(m->opts.compute, h, f, n);
}

void dt_fam_mm_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                       int OC) {
    if (!dt_lowp(m)) {
        dt_matmul_forward(out, x.f, dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, l), bias, N, C, OC);
        return;
    }
    dt_matmul_forward_lp(m->opts.compute, out, x.h, dt_model_lp_tensor(m, id, l), bias, N, C, OC);
}

void dt_fam_mm_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OC) {
    /* W is read only for dinp (the patch embedding has none: its unit is not gathered). */
    float *dw = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, id, l);
    if (!dt_lowp(m)) {
        dt_matmul_backward(dinp, dw, dbias, dout, x.f,
                           dinp ? dt_params_unit_tensor(&m->ps, m->ps.unit_params, id, l) : NULL, N, C, OC);
        return;
    }
    dt_matmul_backward_lp(m->opts.compute, dinp, dw, dbias, dout, m->lp_scratch, x.h,
                          dinp ? dt_model_lp_tensor(m, id, l) : NULL, N, C, OC);
}
