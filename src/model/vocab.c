/* Vocabulary tensors chunk by chunk: the token embedding and the lm_head (family_impl.h).
 *
 * Every strategy runs exactly these kernel calls, whether the chunks sit in one slab (DDP) or
 * are gathered one at a time (ZeRO-3): the lm_head's dx sums its chunks in one fixed order,
 * so the bits do not depend on where the parameters live. */
#include <math.h>

#include "model/family_impl.h"
#include "ops/ops.h"

/* The canonical row of a vocabulary tensor's first stored row (tensor parallelism: the first
 * held shard's). */
static size_t vocab_row0(const dt_model *m, int id) {
    const dt_tensor_info *t = &dt_model_weights(m)->tensors[id];
    return t->tp_k > 1 && t->split ? (size_t)t->tp_first * t->shard_rows : 0;
}

/* ---- the vocabulary-parallel cross-entropy (tensor parallelism): the logits (N, nb Vl) hold
 * the held shards' columns; row statistics are reduced over the shards in shard order and
 * then over the TP group in rank order: max, sum of exp(x - max), the target's logit. */

/* Real (unpadded) columns of held shard j. */
static int shard_real(const dt_model *m, int id, int j, int V) {
    const dt_tensor_info *t = &dt_model_weights(m)->tensors[id];
    long lo = (long)(t->tp_first + j) * (long)t->shard_rows, n = V - lo;
    return n <= 0 ? 0 : n < (long)t->shard_rows ? (int)n : (int)t->shard_rows;
}

/* lse (N) and losses (N) from the logits rows (stride ld) of the held shards; stat: 2 N
 * floats of scratch. */
static void tp_ce_forward(dt_model *m, int id, float *losses, float *lse, const float *logits, const int32_t *targets,
                          int N, int V, int ld, float *stat) {
    const dt_tensor_info *t = &dt_model_weights(m)->tensors[id];
    const int nb = dt_tp_local(&m->opts), Vl = (int)t->shard_rows;
    const long g0 = (long)t->tp_first * Vl; /* canonical column of the first held one */
    float *mx = stat, *tl = stat + N;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * ld;
        float v = -INFINITY, y = 0.0f;
        for (int j = 0; j < nb; j++)
            for (int i = 0, r = shard_real(m, id, j, V); i < r; i++) v = x[j * Vl + i] > v ? x[j * Vl + i] : v;
        long tg = targets[n] - g0;
        if (targets[n] >= 0 && tg >= 0 && tg < (long)nb * Vl) y = x[tg];
        mx[n] = v, tl[n] = y;
    }
    dt_tp_max(m, mx, (size_t)N);
    dt_tp_sum(m, tl, (size_t)N); /* one rank holds the target's logit, the others add 0 */
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * ld;
        float sum = 0.0f;
        for (int j = 0; j < nb; j++) {
            float part = dt_exp_sum(NULL, x + (size_t)j * Vl, mx[n], shard_real(m, id, j, V));
            sum = j == 0 ? part : sum + part;
        }
        lse[n] = sum;
    }
    dt_tp_sum(m, lse, (size_t)N);
    for (int n = 0; n < N; n++) {
        lse[n] = mx[n] + logf(lse[n]);
        losses[n] = targets[n] >= 0 ? lse[n] - tl[n] : 0.0f; /* < 0: not counted (loss mask) */
    }
}

/* dlogits = (softmax - onehot) dloss over the held shards' real columns, 0 elsewhere (in
 * place over the logits). */
static void tp_ce_backward(dt_model *m, int id, float *logits, const float *lse, const int32_t *targets, float dloss,
                           int N, int V, int ld) {
    const dt_tensor_info *t = &dt_model_weights(m)->tensors[id];
    const int nb = dt_tp_local(&m->opts), Vl = (int)t->shard_rows;
    const long g0 = (long)t->tp_first * Vl; /* canonical column of the first held one */
    dt_crossentropy_backward_blocks(logits, lse, targets, dloss, N, ld, nb, Vl, g0, V);
}

void dt_vocab_embed_forward(dt_model *m, int id, float *out, const int32_t *tokens, int N, int next) {
    const dt_params *ps = dt_model_weights(m);
    int K = dt_params_chunks(ps, id), C = (int)ps->tensors[id].cols;
    const int tp = dt_tp_size(&m->opts) > 1;
    /* ZeRO-3: only the rows the tokens name travel (the same values, zero_lookup.c) */
    if (m->hooks.lookup && !m->lora && !tp && m->hooks.lookup(m->hooks.ud, id, tokens, N, next, out)) return;
    /* vocabulary-parallel: each rank fills the rows of its tokens, zeros elsewhere, summed */
    if (tp) dt_fill(out, 0, (size_t)N * C * sizeof(float));
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        /* chunks are consecutive units; the lookup reads them in fp32 (a tied head's too) */
        dt_unit_need_flags(m, u, c + 1 < K ? u + 1 : next, DT_NEED_F32 | (c + 1 < K ? DT_NEED_NEXT_F32 : 0));
        DT_PROF(m, fwd, DT_OP_ENCODER, dt_encoder_forward(out, tokens, ps->unit_params[u], (int)(r0 + vocab_row0(m, id)),
                                                          (int)rows, N, C));
    }
    if (tp) dt_tp_sum(m, out, (size_t)N * C);
}

/* Every lm_head GEMM is one (row block, vocabulary chunk) pair: rows [b0, b0 + R) of the
 * token rows against chunk c's rows [r0, r0 + rows) of the tensor, whether the logits are
 * stored (all rows, chunk-major loops) or fused (one block at a time, block-major loops).
 * Each output element then sees the same sums in the same order: dx of a block adds the
 * chunks from the last, dW of a chunk adds the blocks from the first. */
typedef struct head_call {
    dt_model *m;
    dt_mmin x; /* (N, C) */
    int C, V;  /* V: the tensor's rows (padded vocabulary), the logits' row stride */
} head_call;

static void head_gemm_fwd(const head_call *h, float *logits_b, int b0, int R, int u, size_t r0, size_t rows) {
    dt_model *m = h->m;
    const int C = h->C;
    if (dt_lowp(m))
        DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward_ld_lp(m->opts.compute, logits_b + r0, h->V, h->x.h + (size_t)b0 * C,
                                                              dt_model_lp_unit(m, u), R, C, (int)rows));
    else
        DT_PROF(m, fwd, DT_OP_LMHEAD, dt_matmul_forward_ld(logits_b + r0, h->V, h->x.f + (size_t)b0 * C,
                                                           dt_model_weights(m)->unit_params[u], R, C, (int)rows));
}

/* dx_b (R, C) (+)= dlogits_b[:, chunk] @ W_c, and dW_c += dlogits_b[:, chunk]^T x_b (dw NULL:
 * skipped; dx_b NULL: skipped). dlogits_b as dt_vocab_pack_dlogits left them. */
static void head_gemm_bwd(const head_call *h, double *prof, float *dx_b, int acc, float *dw, const float *dlogits_b,
                          int b0, int R, int u, size_t r0, size_t rows) {
    dt_model *m = h->m;
    const int C = h->C;
    const float *w = dx_b ? dt_model_weights(m)->unit_params[u] : NULL;
    if (dt_lowp(m))
        DT_PROF_TO(m, prof, DT_OP_LMHEAD,
                   dt_matmul_backward_ld_lp(m->opts.compute, dx_b, acc, dw, (const uint16_t *)dlogits_b + r0, 2 * h->V,
                                            h->x.h + (size_t)b0 * C, dx_b ? dt_model_lp_unit(m, u) : NULL, R, C,
                                            (int)rows));
    else
        DT_PROF_TO(m, prof, DT_OP_LMHEAD,
                   dt_matmul_backward_ld(dx_b, acc, dw, dlogits_b + r0, h->V, h->x.f + (size_t)b0 * C, w, R, C,
                                         (int)rows));
}

void dt_vocab_head_forward(dt_model *m, int id, float *logits, dt_mmin x, int N, int next) {
    const dt_params *ps = dt_model_weights(m);
    head_call h = {m, x, (int)ps->tensors[id].cols, (int)ps->tensors[id].rows};
    int K = dt_params_chunks(ps, id), R = dt_model_head_rows(&m->opts, N);
    for (int c = 0; c < K; c++) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_need(m, u, c + 1 < K ? u + 1 : next); /* chunks are consecutive units */
        for (int b0 = 0; b0 < N; b0 += R)
            head_gemm_fwd(&h, logits + (size_t)b0 * h.V, b0, N - b0 < R ? N - b0 : R, u, r0, rows);
    }
}

void dt_vocab_head_loss(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *losses, float *lse,
                        float *buf, float *dx, float dloss, int with_dw, int vocab) {
    const dt_params *ps = dt_model_weights(m);
    head_call h = {m, x, (int)ps->tensors[id].cols, (int)ps->tensors[id].rows};
    int K = dt_params_chunks(ps, id), N = m->B * m->T, R = dt_model_head_rows(&m->opts, N);
    double *prof = dx && !m->train_fwd ? m->prof.bwd : m->prof.fwd;
    /* tensor parallelism (the stored path's arithmetic, block by block): the row statistics
     * over the group, dx per held shard (chunks from the shard's last) added in shard order,
     * and over the group once every block is done */
    const int tp = dt_tp_size(&m->opts) > 1, nb = dt_tp_local(&m->opts), kc = K / nb;
    for (int b0 = 0; b0 < N; b0 += R) {
        int n = N - b0 < R ? N - b0 : R;
        for (int c = 0; c < K; c++) {
            int u;
            size_t r0, rows;
            dt_params_chunk(ps, id, c, &u, &r0, &rows);
            dt_unit_need(m, u, -1); /* in place: nothing to gather */
            head_gemm_fwd(&h, buf, b0, n, u, r0, rows);
        }
        if (tp)
            DT_PROF(m, fwd, DT_OP_CROSSENTROPY, tp_ce_forward(m, id, losses + b0, lse + b0, buf, targets + b0, n, vocab, h.V,
                                                              m->tp_stat));
        else
            DT_PROF(m, fwd, DT_OP_CROSSENTROPY, dt_crossentropy_forward(losses + b0, lse + b0, buf, targets + b0, n, vocab, h.V));
        if (!dx) continue;
        if (tp)
            DT_PROF_TO(m, prof, DT_OP_CROSSENTROPY, tp_ce_backward(m, id, buf, lse + b0, targets + b0, dloss, n, vocab, h.V));
        else
            DT_PROF_TO(m, prof, DT_OP_CROSSENTROPY, dt_crossentropy_backward(buf, buf, lse + b0, targets + b0, dloss, n, vocab, h.V));
        dt_vocab_pack_dlogits(m, buf, n, h.V);
        for (int j = 0; j < nb; j++) {
            float *dst = (j > 0 ? m->tp_scratch : dx) + (size_t)b0 * h.C;
            for (int c = (j + 1) * kc - 1; c >= j * kc; c--) {
                int u;
                size_t r0, rows;
                dt_params_chunk(ps, id, c, &u, &r0, &rows);
                head_gemm_bwd(&h, prof, dst, c < (j + 1) * kc - 1, with_dw ? ps->unit_grads[u] : NULL, buf, b0, n, u, r0,
                              rows);
            }
            if (j > 0) dt_tp_add(dx + (size_t)b0 * h.C, dst, (size_t)n * h.C);
        }
    }
    if (dx && tp) dt_tp_sum(m, dx, (size_t)N * h.C);
}

void dt_vocab_lm_forward(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *logits, float *losses,
                         float *lse, float *dx) {
    int N = m->B * m->T, V = m->cfg.vocab, Vp = (int)dt_model_weights(m)->tensors[id].rows;
    if (m->opts.fused_loss) {
        DT_ASSERT(targets != NULL); /* the fused loss never holds all logits */
        /* a training forward forms the head's dx now and its dW in place */
        dt_vocab_head_loss(m, id, x, targets, losses, lse, logits, m->train_fwd ? dx : NULL,
                           m->train_scale / (float)N, 1, V);
        m->head_grads = m->train_fwd;
        return;
    }
    dt_vocab_head_forward(m, id, logits, x, N, -1);
    if (!targets) return;
    if (dt_tp_size(&m->opts) > 1)
        DT_PROF(m, fwd, DT_OP_CROSSENTROPY, tp_ce_forward(m, id, losses, lse, logits, targets, N, V, Vp, m->tp_stat));
    else
        DT_PROF(m, fwd, DT_OP_CROSSENTROPY, dt_crossentropy_forward(losses, lse, logits, targets, N, V, Vp));
}

const float *dt_vocab_lm_backward(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *logits,
                                  float *losses, float *lse, float *dx, float scale, int next) {
    int N = m->B * m->T, V = m->cfg.vocab, Vp = (int)dt_model_weights(m)->tensors[id].rows;
    if (m->opts.fused_loss) {
        if (m->head_grads)
            DT_ASSERT(scale == m->train_scale); /* the forward formed the head's gradients with it */
        else /* after a plain forward: form them now (dW in place) */
            dt_vocab_head_loss(m, id, x, targets, losses, lse, logits, dx, scale / (float)N, 1, V);
        if (m->cfg.untied) dt_vocab_head_grads_done(m, id); /* the highest units end here */
        return NULL;
    }
    if (dt_tp_size(&m->opts) > 1)
        DT_PROF(m, bwd, DT_OP_CROSSENTROPY, tp_ce_backward(m, id, logits, lse, targets, scale / (float)N, N, V, Vp));
    else
        DT_PROF(m, bwd, DT_OP_CROSSENTROPY, dt_crossentropy_backward(logits, logits, lse, targets, scale / (float)N, N, V, Vp));
    /* An untied head's chunks end here (the highest units); a tied head's weight gradient is
     * formed with the embedding's, at the end, from these dlogits. */
    dt_vocab_pack_dlogits(m, logits, N, Vp);
    dt_vocab_head_backward(m, id, dx, logits, x, N, m->cfg.untied, next);
    return m->cfg.untied ? NULL : logits;
}

void dt_vocab_pack_dlogits(dt_model *m, float *dlogits, int N, int Vp) {
    if (dt_lowp(m)) dt_f32_to_lowp_rows_inplace(m->opts.compute, dlogits, N, Vp);
}

void dt_vocab_head_backward(dt_model *m, int id, float *dx, const float *dlogits, dt_mmin x, int N,
                            int with_dw, int next) {
    const dt_params *ps = dt_model_weights(m);
    head_call h = {m, x, (int)ps->tensors[id].cols, (int)ps->tensors[id].rows};
    int K = dt_params_chunks(ps, id), R = dt_model_head_rows(&m->opts, N);
    /* dx sums the chunks from the last, each held shard on its own (the first into dx, a
     * later one into the scratch, added in shard order), then over the TP group */
    const int nb = dt_tp_local(&m->opts), kc = K / nb;
    for (int j = 0; j < nb; j++) {
        float *dst = j > 0 ? m->tp_scratch : dx;
        for (int c = (j + 1) * kc - 1; c >= j * kc; c--) {
            int u;
            size_t r0, rows;
            dt_params_chunk(ps, id, c, &u, &r0, &rows);
            dt_unit_need(m, u, c > 0 ? u - 1 : next);
            if (with_dw) dt_unit_grads_begin(m, u);
            for (int b0 = 0; b0 < N; b0 += R)
                head_gemm_bwd(&h, m->prof.bwd, dst + (size_t)b0 * h.C, c < (j + 1) * kc - 1,
                              with_dw ? ps->unit_grads[u] : NULL, dlogits + (size_t)b0 * h.V, b0, N - b0 < R ? N - b0 : R,
                              u, r0, rows);
            if (with_dw) dt_unit_grads_end(m, u);
        }
        if (j > 0) dt_tp_add(dx, m->tp_scratch, (size_t)N * h.C);
    }
    if (dt_tp_size(&m->opts) > 1) dt_tp_sum(m, dx, (size_t)N * h.C);
}

void dt_vocab_head_grads_done(dt_model *m, int id) {
    const dt_params *ps = dt_model_weights(m);
    for (int c = dt_params_chunks(ps, id) - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_grads_begin(m, u);
        dt_unit_grads_end(m, u);
    }
}

void dt_vocab_embed_backward(dt_model *m, int id, const float *dout, const int32_t *tokens, int N,
                             const float *dlogits, dt_mmin x) {
    if (m->lora) return; /* a frozen base: no embedding (or tied head) gradient */
    const dt_params *ps = dt_model_weights(m);
    head_call h = {m, x, (int)ps->tensors[id].cols, (int)ps->tensors[id].rows};
    int K = dt_params_chunks(ps, id), C = h.C, R = dt_model_head_rows(&m->opts, N);
    for (int c = K - 1; c >= 0; c--) {
        int u;
        size_t r0, rows;
        dt_params_chunk(ps, id, c, &u, &r0, &rows);
        dt_unit_grads_begin(m, u);
        float *g = ps->unit_grads[u];
        /* the head's two gradients apart (model.h tied_h): the head's into tied_h's chunk */
        float *hw = m->tied_h ? m->tied_h + (ps->unit_lo[u] - ps->tensors[id].offset) : g;
        if (dlogits)
            for (int b0 = 0; b0 < N; b0 += R)
                head_gemm_bwd(&h, m->prof.bwd, NULL, 0, hw, dlogits + (size_t)b0 * h.V, b0, N - b0 < R ? N - b0 : R, u,
                              r0, rows);
        if (dout)
            DT_PROF(m, bwd, DT_OP_ENCODER, dt_encoder_backward(g, (int)(r0 + vocab_row0(m, id)), (int)rows, dout, tokens, N, C));
        if (m->tied_h && m->tied_add) dt_add_f32(g, hw, ps->unit_len[u]); /* once per step, after the scatter */
        dt_unit_grads_end(m, u);
    }
}
