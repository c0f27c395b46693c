/* Vocabulary tensors chunk by chunk: the token embedding and the lm_head (family_impl.h).
 *
 * Every strategy runs exactly these kernel calls, whether the chunks sit in one slab (DDP) or
 * are gathered one at a time (ZeRO-3): the lm_head's dx sums its chunks in one fixed order,
 * so the bits do not depend on where the parameters live. */
#include <string.h>

#include "model/family_impl.h"
#include "ops/ops.h"

void dt_vocab_embed_forward(dt_model *m, int id, float *out, const int32_t *tokens, int N, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols;
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        /* chunks are consecutive units; the lookup reads them in fp32 (a tied head's too) */
        dt_unit_need_flags(m, u, c + 1 < K ? u + 1 : next, DT_NEED_F32 | (c + 1 < K ? DT_NEED_NEXT_F32 : 0));
        DT_PROF(m, fwd, DT_OP_ENCODER, dt_encoder_forward(out, tokens, ps->unit_params[u], (int)r0, (int)rows, N, C));
    }
}

void dt_vocab_head_forward(dt_model *m, int id, float *logits, dt_mmin x, int N, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c + 1 < K ? u + 1 : next); /* chunks are consecutive units */
        if (dt_lowp(m))
            DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward_ld_lp(m->opts.compute, logits + r0, V, x.h,
                                                                  dt_model_lp_unit(m, u), N, C, (int)rows));
        else
            DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward_ld(logits + r0, V, x.f, ps->unit_params[u], N, C, (int)rows));
    }
}

void dt_vocab_pack_dlogits(dt_model *m, float *dlogits, int N, int Vp) {
    if (!dt_lowp(m)) return;
    enum { BLK = 256 };
    const dt_dtype dt = m->opts.compute;
    /* Block b of a row reads floats [256 b, 256 b + 256) and writes 16-bit values over bytes
     * [512 b, 512 b + 512): below every later block's input, and its own input is copied
     * first, so front to back in place is safe. */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r++) {
        float *row = dlogits + (size_t)r * Vp, f[BLK];
        uint16_t *h = (uint16_t *)row, hb[BLK];
        for (int b = 0; b < Vp; b += BLK) {
            int n = Vp - b < BLK ? Vp - b : BLK;
            memcpy(f, row + b, (size_t)n * sizeof(float));
            dt_to_lowp(dt, hb, f, (size_t)n);
            memcpy(h + b, hb, (size_t)n * sizeof(uint16_t));
        }
    }
}

void dt_vocab_head_backward(dt_model *m, int id, float *dx, const float *dlogits, dt_mmin x, int N,
                            int with_dw, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = K - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c > 0 ? u - 1 : next);
        if (with_dw) dt_unit_grads_begin(m, u);
        float *dw = with_dw ? ps->unit_grads[u] : NULL;
        if (dt_lowp(m))
            DT_PROF(m, bwd, DT_OP_LMHEAD,
                    dt_matmul_backward_ld_lp(m->opts.compute, dx, c < K - 1, dw, (const uint16_t *)dlogits + r0,
                                             2 * V, x.h, dt_model_lp_unit(m, u), N, C, (int)rows));
        else
            DT_PROF(m, bwd, DT_OP_LMHEAD,
                    dt_matmul_backward_ld(dx, c < K - 1, dw, dlogits + r0, V, x.f, ps->unit_params[u], N, C,
                                          (int)rows));
        if (with_dw) dt_unit_grads_end(m, u);
    }
}

void dt_vocab_embed_backward(dt_model *m, int id, const float *dout, const int32_t *tokens, int N,
                             const float *dlogits, dt_mmin x) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = K - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_grads_begin(m, u);
        float *g = ps->unit_grads[u];
        if (dlogits && dt_lowp(m))
            DT_PROF(m, bwd, DT_OP_LMHEAD,
                    dt_matmul_backward_ld_lp(m->opts.compute, NULL, 0, g, (const uint16_t *)dlogits + r0, 2 * V, x.h,
                                             NULL, N, C, (int)rows));
        else if (dlogits)
            DT_PROF(m, bwd, DT_OP_LMHEAD, dt_matmul_backward_ld(NULL, 0, g, dlogits + r0, V, x.f, NULL, N, C, (int)rows));
        DT_PROF(m, bwd, DT_OP_ENCODER, dt_encoder_backward(g, (int)r0, (int)rows, dout, tokens, N, C));
        dt_unit_grads_end(m, u);
    }
}
