/* Context parallelism inside the families' layers (family_impl.h dt_fam_rope,
 * dt_fam_attention_*; model/cp.h). */
#include "model/cp.h"
#include "model/family_impl.h"
#include "ops/ops.h"

static int cp_on(const dt_model *m) { return m->opts.cp > 1; }

void dt_fam_rope(dt_model *m, float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv, float scale,
                 int backward) {
    if (!cp_on(m)) {
        if (backward) dt_rope_backward(qkv, B, T, NH, NKV, hs, inv, scale);
        else dt_rope_forward(qkv, B, T, NH, NKV, hs, inv, scale);
        return;
    }
    /* each sequence's two chunks: local rows [0, c) and [c, 2c), at their global positions */
    const int c = T / 2, P = m->opts.cp, r = m->opts.cp_rank;
    const size_t ld = (size_t)(NH + 2 * NKV) * hs;
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            float *x = qkv + ((size_t)b * T + (size_t)half * c) * ld;
            const int pos0 = dt_cp_pos(P, r, T, half * c, m->cp_ring.contiguous);
            if (backward) dt_rope_backward_at(x, 1, c, pos0, NH, NKV, hs, inv, scale);
            else dt_rope_forward_at(x, 1, c, pos0, NH, NKV, hs, inv, scale);
        }
}

void dt_fam_attention_forward(dt_model *m, float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                              float *cps) {
    if (!cp_on(m)) {
        dt_attention_forward(out, lse, qkv, B, T, NH, NKV, hs, 1, m->opts.compute);
        return;
    }
    if (dt_cp_attention_forward(&m->cp_ring, cps, out, lse, qkv, B, T, NH, NKV, hs, m->opts.compute)) m->cp_failed = 1;
}

void dt_fam_attention_backward(dt_model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int NH, int NKV, int hs, float *cps) {
    if (!cp_on(m)) {
        dt_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, 1, m->opts.compute);
        return;
    }
    if (dt_cp_attention_backward(&m->cp_ring, cps, dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, m->opts.compute))
        m->cp_failed = 1;
}

void dt_fam_pos(dt_model *m, float *x, float *wpe, int B, int T, int C, int backward) {
    if (!cp_on(m)) {
        if (backward) dt_pos_backward(wpe, x, B, T, C);
        else dt_pos_forward(x, wpe, B, T, C);
        return;
    }
    const int c = T / 2, P = m->opts.cp, r = m->opts.cp_rank;
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            float *rows = x + ((size_t)b * T + (size_t)half * c) * C, *w = wpe + (size_t)dt_cp_pos(P, r, T, half * c, m->cp_ring.contiguous) * C;
            if (backward) dt_pos_backward(w, rows, 1, c, C);
            else dt_pos_forward(rows, w, 1, c, C);
        }
}
