/* Vocabulary tensors chunk by chunk: the token embedding and the lm_head (family_impl.h).
 *
 * Every strategy runs exactly these kernel calls, whether the chunks sit in one slab (DDP) or
 * are gathered one at a time (ZeRO-3): the lm_head's dx sums its chunks in one fixed order,
 * so the bits do not depend on where the parameters live. */
#include "model/family_impl.h"
#include "ops/ops.h"

void dt_vocab_embed_forward(dt_model *m, int id, float *out, const int32_t *tokens, int N, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols;
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c + 1 < K ? u + 1 : next); /* chunks are consecutive units */
        DT_PROF(m, fwd, DT_OP_ENCODER, dt_encoder_forward(out, tokens, ps->unit_params[u], (int)r0, (int)rows, N, C));
    }
}

void dt_vocab_head_forward(dt_model *m, int id, float *logits, const float *x, int N, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c + 1 < K ? u + 1 : next); /* chunks are consecutive units */
        DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward_ld(logits + r0, V, x, ps->unit_params[u], N, C, (int)rows));
    }
}

void dt_vocab_head_backward(dt_model *m, int id, float *dx, const float *dlogits, const float *x, int N,
                            int with_dw, int next) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = K - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c > 0 ? u - 1 : next);
        if (with_dw) dt_unit_grads_begin(m, u);
        DT_PROF(m, bwd, DT_OP_LMHEAD,
                dt_matmul_backward_ld(dx, c < K - 1, with_dw ? ps->unit_grads[u] : NULL, dlogits + r0, V, x,
                                      ps->unit_params[u], N, C, (int)rows));
        if (with_dw) dt_unit_grads_end(m, u);
    }
}

void dt_vocab_embed_backward(dt_model *m, int id, const float *dout, const int32_t *tokens, int N,
                             const float *dlogits, const float *x) {
    const dt_params *ps = &m->ps;
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols, V = (int)ps->tensors[id].rows;
    for (int c = K - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_grads_begin(m, u);
        float *g = ps->unit_grads[u];
        if (dlogits)
            DT_PROF(m, bwd, DT_OP_LMHEAD, dt_matmul_backward_ld(NULL, 0, g, dlogits + r0, V, x, NULL, N, C, (int)rows));
        DT_PROF(m, bwd, DT_OP_ENCODER, dt_encoder_backward(g, (int)r0, (int)rows, dout, tokens, N, C));
        dt_unit_grads_end(m, u);
    }
}
