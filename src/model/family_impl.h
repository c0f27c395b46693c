/* family_impl.h - helpers shared by the model families' forward/backward (internal to
 * src/model). */
#ifndef DT_FAMILY_IMPL_H
#define DT_FAMILY_IMPL_H

#include "core/timer.h"
#include "model/lora.h"
#include "model/model.h"

/* Times `stmt` into m->prof.fwd/bwd[kind] when profiling is on. */
#define DT_PROF(m, dir, kind, stmt)                                                          \
    do {                                                                                     \
        double t0_ = (m)->profile ? dt_now() : 0.0;                                          \
        stmt;                                                                                \
        if ((m)->profile) (m)->prof.dir[kind] += dt_now() - t0_;                             \
    } while (0)

/* The same into the accumulator array `arr` (m->prof.fwd or .bwd, chosen at run time: a
 * recomputed forward counts as backward time). */
#define DT_PROF_TO(m, arr, kind, stmt)                                                       \
    do {                                                                                     \
        double t0_ = (m)->profile ? dt_now() : 0.0;                                          \
        stmt;                                                                                \
        if ((m)->profile) (arr)[kind] += dt_now() - t0_;                                     \
    } while (0)

/* Activation layout: the next view of n floats at *off in base (NULL base: only count),
 * 64-byte aligned. Families lay their saved activations out with it, once to size them
 * (base NULL) and once to bind them. */
static inline float *dt_act_take(float *base, size_t *off, size_t n) {
    float *p = base ? base + *off : NULL;
    *off += (n + 15) / 16 * 16;
    return p;
}

/* Activation layout of n 16-bit values (mixed precision), as dt_act_take. */
static inline uint16_t *dt_act_take16(float *base, size_t *off, size_t n) {
    return (uint16_t *)dt_act_take(base, off, (n + 1) / 2);
}

/* ---- mixed precision (model.h dt_model_opts.compute). Activations that only feed matmuls
 * (norm outputs, the attention output's copy for its projection, the MLP activation, the
 * final norm's output) are stored in 16 bits; the fp32 kernels write them into a scratch
 * first and dt_fam_narrow stores them. */
static inline int dt_lowp(const dt_model *m) { return m->opts.compute != DT_F32; }

/* A matmul input: fp32 (f), or its 16-bit copy (h) under mixed precision. */
typedef struct dt_mmin {
    const float *f;
    const uint16_t *h;
} dt_mmin;

/* h = f narrowed to the compute dtype (n values); nothing in fp32. */
void dt_fam_narrow(dt_model *m, uint16_t *h, const float *f, size_t n);
/* out (N,OC) = x (N,C) @ W^T + bias (may be NULL), W = tensor id of layer l. */
void dt_fam_mm_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                       int OC);
/* dinp (N,C) = dout @ W (overwritten; NULL: skipped), dW += dout^T x, dbias += column sums
 * of dout (NULL: skipped). Mixed precision narrows dout into m->lp_scratch (N x OC). */
void dt_fam_mm_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OC);
/* zb-h1's input-gradient pass (m->wdefer; ARCHITECTURE decisions 79, 81, 84): whether tensor
 * id of layer l has its weight GEMMs deferred to W (a layer that recomputes its forward forms
 * them in B: its inputs are in working slots the next recompute overwrites). */
int dt_wdefer_on(const dt_model *m, int id, int l);
/* The backward's next deferred dout (n floats, as the family's defer_douts lists it) copied
 * into its place of the plan (dead activations, or the set's fallback); returns the copy
 * (dout NULL: the place only, which the caller fills - a mixture of experts' blocks). */
float *dt_wdefer_dout(dt_model *m, const float *dout, size_t n);
/* Records dW[woff...] (OC x C) += dout^T x and dbias (NULL: none) += dout's column sums for
 * W: dout a copy from dt_wdefer_dout (N rows at stride ld, at column col of them), x a saved
 * activation held until W (or a sequence-parallel gather, done again at W). */
dt_wdefer_item *dt_wdefer_gemm(dt_model *m, int id, int l, size_t woff, const float *dout, int ld, int col, dt_mmin x,
                               float *dbias, int N, int C, int OC);
/* dt_fam_mm_backward's input-gradient pass on a dout kept until W where it lies (a place of
 * the plan): dinp (NULL: none) formed, dW and dbias recorded. */
void dt_fam_mm_backward_kept(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                             int N, int C, int OC);
/* LoRA (lora_mm.c): B's part of the adapters of the base matmul over tensor id (shard j) -
 * dinp += their input gradient (NULL: none) - and their dA, dB recorded for W, reading c, the
 * dout's deferred copy (N x OC). */
void dt_lora_mm_backward_defer(dt_model *m, float *dinp, const float *dout, const float *c, dt_mmin x, int id, int l,
                               int j, int N, int C, int OC);
/* W's part: the dA and dB of item it (it->site >= 0), the whole backward's arithmetic (a
 * replicated adapter's per-shard contributions summed in shard order, then over the TP group). */
void dt_lora_mm_weights(dt_model *m, const dt_wdefer_item *it);

/* ---- activation checkpointing (model.h dt_model_opts). A layer's saved activations are of
 * three classes:
 *   DT_ACT_OUT   its output, the next layer's input: kept for every layer;
 *   DT_ACT_SEL   what selective keeps: kept unless the layer is fully recomputed. In fp32
 *                the MLP's input projection output and one attention matmul output (q|k|v in
 *                gpt2 and vit, the attention block's output in llama); under bf16/fp16, where
 *                the norm outputs and the MLP activation are already 16-bit (so dropping them
 *                saves less), the attention output, its log-sum-exp and the attention
 *                block's output, with q|k|v (gpt2) or the MLP's input projection output
 *                (vit), so that the attention is not recomputed; llama gate|up alone;
 *   DT_ACT_RECOMP the rest (norm outputs and statistics, the MLP activation, whatever
 *                selective does not keep): kept only by layers that are not recomputed.
 * Each buffer of a class has one slot per layer that keeps it, in layer order, plus one
 * working slot shared by the layers that recompute it. */
enum { DT_ACT_OUT, DT_ACT_SEL, DT_ACT_RECOMP };

static inline int dt_act_keeps(const dt_model_opts *o, int l, int cls) {
    if (cls == DT_ACT_OUT || !dt_model_recomputes(o, l)) return 1;
    return cls == DT_ACT_SEL && o->recompute == DT_RECOMPUTE_SELECTIVE;
}
/* Whether layer l's forward forms its buffers of class cls: always in the forward, and in the
 * backward's re-run (`recompute`) those the layer did not keep. */
static inline int dt_act_forms(const dt_model_opts *o, int l, int recompute, int cls) {
    return !recompute || !dt_act_keeps(o, l, cls);
}
/* Slot of layer l (of L) for class cls; l = L gives the number of slots. */
static inline size_t dt_act_slot(const dt_model_opts *o, int L, int cls, int l) {
    size_t below = 0, kept = 0;
    int shared = 0;
    for (int k = 0; k < L; k++) {
        int keeps = dt_act_keeps(o, k, cls);
        kept += (size_t)keeps;
        below += (size_t)(keeps && k < l);
        shared |= !keeps;
    }
    if (l >= L) return kept + (size_t)shared;
    return dt_act_keeps(o, l, cls) ? below : kept;
}
/* The highest recomputed layer (-1: none): the working slots still hold its activations when
 * the backward starts, so it is not recomputed. */
static inline int dt_act_top_recomputed(const dt_model_opts *o, int L) {
    for (int l = L - 1; l >= 0; l--)
        if (dt_model_recomputes(o, l)) return l;
    return -1;
}

/* The unit hooks (model.h), skipped when unset. */
/* The families announce units of the store they read (dt_model_weights); under LoRA these
 * map to the adapter units (lora.h dt_lora_unit: a base layer's units to the layer's adapter
 * unit, PRE/POST to none), begun at the layer's first begin and ended with its lowest unit. */
static inline void dt_unit_need_flags(dt_model *m, int u, int next, int flags) {
    if (m->lora) {
        u = dt_lora_unit(m, u, NULL);
        next = dt_lora_unit(m, next, NULL);
        flags = 0; /* adapters are read in fp32 */
        if (u < 0) return;
    }
    if (m->hooks.need_params) m->hooks.need_params(m->hooks.ud, u, next, flags);
}
static inline void dt_unit_need(dt_model *m, int u, int next) { dt_unit_need_flags(m, u, next, 0); }
static inline void dt_unit_grads_begin(dt_model *m, int u) {
    if (m->lora) {
        u = dt_lora_unit(m, u, NULL);
        if (u < 0 || u == m->lora_open) return;
        m->lora_open = u;
    }
    if (m->hooks.grads_begin) m->hooks.grads_begin(m->hooks.ud, u);
}
static inline void dt_unit_grads_end(dt_model *m, int u) {
    if (m->lora) {
        int first;
        u = dt_lora_unit(m, u, &first);
        if (u < 0 || !first) return;
        m->lora_open = -1;
    }
    if (m->hooks.grads_end) m->hooks.grads_end(m->hooks.ud, u);
}

/* ---- sub-layer units (params.h): a layer is layer_units units in table order. A family
 * announces each before the part of the layer that reads it: in the forward (and a
 * recompute) ascending, in the backward descending, each between its grads_begin/end. */

/* A family's layer l is layer l of the current chunk of an interleaved pipeline stage
 * (model.h dt_model_set_chunk): the store's layer chunk_l0 + l (l itself otherwise). The
 * families index activations by l and parameters through these helpers. */
static inline int dt_fam_layer(const dt_model *m, int l) { return m->chunk_l0 + l; }

/* The unit of tensor id in layer l. */
static inline int dt_fam_unit(const dt_model *m, int id, int l) {
    size_t off;
    return dt_params_unit_of(dt_model_weights(m), id, dt_fam_layer(m, l), &off);
}
/* The unit layer l's backward reads first (the `next` of the unit read before it): its first
 * unit `lo` when it recomputes its forward there (model.h), else its last unit `hi`. */
static inline int dt_fam_bwd_first(const dt_model *m, int l, int lo, int hi) {
    int L = dt_stage_layers(&m->cfg, &m->opts); /* the layers the backward runs (a stage's) */
    return dt_model_recomputes(&m->opts, l) && l != dt_act_top_recomputed(&m->opts, L) ? lo : hi;
}

/* Weights of tensor id of layer l (the store dt_model_weights), and where its gradient goes:
 * under LoRA the base is frozen and a non-matmul tensor's gradient (norms, biases) goes to a
 * discarded sink. */
static inline float *dt_fam_param(const dt_model *m, int id, int l) {
    const dt_params *w = dt_model_weights(m);
    return dt_params_unit_tensor(w, w->unit_params, id, dt_fam_layer(m, l));
}
static inline float *dt_fam_grad(const dt_model *m, int id, int l) {
    if (m->lora) return m->lora_sink + m->lora_sink_off[id];
    return dt_params_unit_tensor(&m->ps, m->ps.unit_grads, id, dt_fam_layer(m, l));
}

/* ---- vocabulary tensors, chunk by chunk (vocab.c). A vocabulary tensor (V, C) is stored
 * as row chunks, one unit each (params.h); these run the embedding and the lm_head one
 * chunk at a time, calling the unit hooks, with the same kernel calls in every strategy
 * (so DDP and ZeRO-3 stay bitwise equal). */

/* out (N,C) = rows of tensor id for the N tokens (fp32 master rows in every precision).
 * `next`: the unit read after the last chunk. */
void dt_vocab_embed_forward(dt_model *m, int id, float *out, const int32_t *tokens, int N, int next);
/* logits (N, Vp) = x (N,C) @ W^T, chunks ascending (the last stays gathered for the backward);
 * each chunk row block by row block (dt_model_head_rows), as the fused loss runs it. */
void dt_vocab_head_forward(dt_model *m, int id, float *logits, dt_mmin x, int N, int next);
/* The fused loss (model.h dt_model_opts.fused_loss), over the model's B T rows, one block of
 * rows at a time in buf (head_rows x Vp): logits, losses and lse (cross-entropy over the
 * first `vocab` columns); with dx non-NULL also dlogits = dloss (softmax - onehot), dx (N,C)
 * = dlogits @ W and, with `with_dw`, dW += dlogits^T x into the gradient slab (in place: no
 * hooks; the caller ends the head's units with dt_vocab_head_grads_done, or the tied
 * embedding's backward does). The same kernel calls as the stored path, so the same bits. */
void dt_vocab_head_loss(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *losses, float *lse,
                        float *buf, float *dx, float dloss, int with_dw, int vocab);
/* A language model's head and loss, fused or stored (model.h dt_model_opts.fused_loss), over
 * its B T rows: the forward leaves losses and lse (with targets), logits (stored; all rows
 * without targets), and under a training forward with the fused loss also dx and the head's
 * dW. The backward gives dx (N,C) = d(loss scale)/dx, ends an untied head's units (dW formed)
 * and returns the dlogits a tied head's dt_vocab_embed_backward still needs (NULL: none).
 * `next`: the unit read after the head in the backward. */
void dt_vocab_lm_forward(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *logits, float *losses,
                         float *lse, float *dx);
const float *dt_vocab_lm_backward(dt_model *m, int id, dt_mmin x, const int32_t *targets, float *logits,
                                  float *losses, float *lse, float *dx, float scale, int next);
/* Begins and ends tensor id's chunk units, descending: its gradients were formed in place. */
void dt_vocab_head_grads_done(dt_model *m, int id);
/* Mixed precision: narrows dlogits (N, Vp) in place, each fp32 row's first half becoming its
 * 16-bit row (row stride 2 Vp values), for the head's GEMMs; nothing in fp32. */
void dt_vocab_pack_dlogits(dt_model *m, float *dlogits, int N, int Vp);
/* dx (N,C) = dlogits (N,Vp) @ W, chunks descending, each adding its part. With `with_dw`
 * (an untied head) each chunk's dW += dlogits_c^T x between grads_begin and grads_end; a
 * tied head leaves dW to dt_vocab_embed_backward. `next`: the unit read after chunk 0.
 * dlogits as dt_vocab_pack_dlogits left them. */
void dt_vocab_head_backward(dt_model *m, int id, float *dx, const float *dlogits, dt_mmin x, int N,
                            int with_dw, int next);
/* Embedding gradients, chunks descending, each between grads_begin and grads_end: for a tied
 * head (dlogits non-NULL) dW_c += dlogits_c^T x first, then dW_c += the scatter of dout
 * by token (the order DDP always used: the head's gradient, then the embedding's). */
void dt_vocab_embed_backward(dt_model *m, int id, const float *dout, const int32_t *tokens, int N,
                             const float *dlogits, dt_mmin x);

/* ---- tensor parallelism (model.h dt_model_opts.tp; tp.c; ARCHITECTURE decision 62). A
 * family's layer runs each split tensor shard by shard: shard j (of the dt_tp_local(o) this
 * process holds) is the j-th block of the stored tensor (params.h), its activations the j-th
 * block of theirs. Column-parallel layers need nothing but their shard; a row-parallel layer's
 * output and a column-parallel layer's input gradient are partial sums: the shards' parts are
 * added in shard order, then over the TP group in rank order (the same sums, in the same
 * order, whether one process holds every shard or each rank one). Without tensor parallelism
 * (tp = 1) each helper is the one plain call it replaces, bias fused: the same bits as
 * before. */

/* dt_fam_mm_forward / _backward on shard j of tensor id (its j-th block; bias and dbias are
 * the caller's pointers into the shard's part, or NULL). */
void dt_fam_mm_forward_sh(dt_model *m, float *out, dt_mmin x, int id, int l, int j, const float *bias, int N,
                          int C, int OC);
void dt_fam_mm_backward_sh(dt_model *m, float *dinp, int id, int l, int j, float *dbias, const float *dout,
                           dt_mmin x, int N, int C, int OC);
/* A matmul input's shard j: block j of n values per shard. */
static inline dt_mmin dt_mmin_shard(dt_mmin x, int j, size_t n) {
    return (dt_mmin){x.f ? x.f + (size_t)j * n : NULL, x.h ? x.h + (size_t)j * n : NULL};
}
/* Column-parallel forward: shard j's out block (N, OCl) = x (N,C) @ W_j^T + b_j, for every
 * shard held (bias: the whole stored bias, NULL: none). */
void dt_tp_col_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int C,
                       int OCl);
/* Column-parallel backward: dW_j, db_j for every shard held, and dinp (N,C) = the sum over
 * every shard of the group of dout_j @ W_j (overwritten; NULL: skipped; scratch: N C floats
 * when several shards are held). dout: the shards' blocks (N, OCl) each. */
void dt_tp_col_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int C, int OCl, float *scratch);
/* Row-parallel forward: out (N,OC) = sum over the group's shards of x_j (N,Cl) @ W_j^T, then
 * + bias (replicated; NULL: none). scratch: N OC floats when several shards are held. */
void dt_tp_row_forward(dt_model *m, float *out, dt_mmin x, int id, int l, const float *bias, int N, int Cl,
                       int OC, float *scratch);
/* Row-parallel backward: dinp_j (N,Cl) = dout @ W_j (blocks of dinp), dW_j; dbias (replicated)
 * once. */
void dt_tp_row_backward(dt_model *m, float *dinp, int id, int l, float *dbias, const float *dout, dt_mmin x,
                        int N, int Cl, int OC);
/* Adjacent column-parallel tensors ids[0..n) (each OUT-split) as one projection: out holds, per
 * shard held, (N, W) with W the sum of the tensors' shard widths (the caller's: a QLoRA base's
 * NF4 tensors have no fp32 rows), tensor after tensor (without
 * tensor parallelism: the one plain GEMM over their adjacent rows). The backward forms each
 * dW and dinp (N,C) = the sum over tensors and shards (scratch: N C floats when several shards
 * are held), then over the TP group. No biases. */
void dt_tp_cols_forward(dt_model *m, float *out, dt_mmin x, const int *ids, int n, int l, int N, int C, int W);
void dt_tp_cols_backward(dt_model *m, float *dinp, const int *ids, int n, int l, const float *dout, dt_mmin x,
                         int N, int C, int W, float *scratch);
/* LoRA (ARCHITECTURE decision 69): the frozen base's part of shard j of tensor id (rows: the
 * shard's, dt_lora_shard_rows; NF4 or fp32): out (N, rows) at row stride ld = x W_j^T + bias
 * (NULL; only when ld = rows); dinp (N, C) = dout W_j, or += with `accumulate` (dout at row
 * stride ld). No weight gradient: the base is frozen. tp.c adds the adapters' part. */
void dt_lora_base_forward_sh(dt_model *m, float *out, int ld, dt_mmin x, int id, int l, int j, const float *bias,
                             int N, int C, int rows);
void dt_lora_base_backward_sh(dt_model *m, float *dinp, int accumulate, int id, int l, int j, const float *dout,
                              int ld, int N, int C, int rows);
/* x (n) summed over the TP group in rank order / its maximum (a group of one: nothing). */
void dt_tp_sum(dt_model *m, float *x, size_t n);
void dt_tp_max(dt_model *m, float *x, size_t n);
/* Adds the shards' partial sums: acc (n) += part (n) (the next shard's, in shard order). */
void dt_tp_add(float *acc, const float *part, size_t n);

/* ---- sequence parallelism (model.h dt_model_opts.sp; tp.c): a process holds rows
 * [first N/k, ...) of the N token rows, nb N/k of them (the blocks mode: all). Each helper
 * below that has a tensor-parallel counterpart is that plain call when sequence parallelism
 * is off (N rows held), so a family runs one layer code for both. */

/* Token rows held, and the first one. */
static inline int dt_sp_rows(const dt_model *m, int N) {
    return m->opts.sp ? N / dt_tp_size(&m->opts) * dt_tp_local(&m->opts) : N;
}
static inline int dt_sp_row0(const dt_model *m, int N) {
    return m->opts.sp ? N / dt_tp_size(&m->opts) * dt_tp_first(&m->opts) : 0;
}
/* full (N, C) = every rank's rows, from this process's loc (its rows). */
void dt_sp_gather(dt_model *m, float *full, const float *loc, int N, int C);
/* The same for 16-bit rows (C even). */
void dt_sp_gather16(dt_model *m, uint16_t *full, const uint16_t *loc, int N, int C);
/* A column-parallel GEMM's input, every row: x itself without sequence parallelism; with it,
 * the held rows of x gathered into full (fp32, N C) or, under mixed precision, their 16-bit
 * copy into full16. */
dt_mmin dt_sp_col_input(dt_model *m, dt_mmin x, float *full, uint16_t *full16, int N, int C);
/* A norm's output for the head, every row: nothing without sequence parallelism; with it, the
 * held rows loc (fp32) gathered into full, or under mixed precision full16's held rows (narrowed
 * in their place) gathered into full16. */
void dt_sp_gather_norm(dt_model *m, float *full, uint16_t *full16, const float *loc, int N, int C);
/* A row-parallel backward's dout, every row: loc itself, or its held rows gathered into full. */
const float *dt_sp_dout(dt_model *m, const float *loc, float *full, int N, int C);
/* Row-parallel forward, reduce-scattered: out_loc (held rows, OC) = the sum over the group's
 * shards of x_j (N, Cl) @ W_j^T, rows held, then + bias. full: N OC floats (the partial sum). */
void dt_sp_row_forward(dt_model *m, float *out_loc, dt_mmin x, int id, int l, const float *bias, int N, int Cl, int OC,
                       float *full, float *scratch);
/* Column-parallel backward, reduce-scattered: dW_j, db_j, and dinp_loc (held rows, C) = the
 * sum over the group's shards of dout_j @ W_j, rows held. full: N C floats. */
void dt_sp_col_backward(dt_model *m, float *dinp_loc, int id, int l, float *dbias, const float *dout, dt_mmin x, int N,
                        int C, int OCl, float *full, float *scratch);
/* LayerNorm backward over the rows held: dinp (+=) as the kernel; the weight and bias
 * gradients summed per shard of rows (in shard order, then over the group) into a scratch of
 * 4 C floats, then added to dw, db once. N: every row of the group. */
void dt_sp_layernorm_backward(dt_model *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                              const float *w, const float *mean, const float *rstd, int N, int C, float *tmp);
/* dt_tp_cols_backward, reduce-scattered to the rows held (full: N C floats). */
void dt_sp_cols_backward(dt_model *m, float *dinp_loc, const int *ids, int n, int l, const float *dout, dt_mmin x,
                         int N, int C, int W, float *full, float *scratch);
/* RMSNorm backward over the rows held, as dt_sp_layernorm_backward (tmp: 2 C floats). */
void dt_sp_rmsnorm_backward(dt_model *m, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const float *rstd, int N, int C, float *tmp);
/* Learned positions over the held rows (row r of the micro-batch is position r % T): out +=,
 * and the backward's dwpe (T, C) += the group's sum (shard order, scratch T C floats, 2 of). */
void dt_sp_pos_forward(dt_model *m, float *out, const float *wpe, int N, int T, int C);
void dt_sp_pos_backward(dt_model *m, float *dwpe, const float *dout, int N, int T, int C, float *tmp);

/* A pipeline stage's buffers (model.h dt_model_stage_buf), the same in every family: the input
 * is `encoded`, the output the last layer's output in res3 (rows x d_model floats per layer,
 * the token rows held), and both gradients pass through dres. */
static inline float *dt_fam_stage_buf(dt_model *m, dt_stage_buf which, float *encoded, float *res3, float *dres,
                                      int rows) {
    const size_t rwc = (size_t)dt_sp_rows(m, rows) * (size_t)m->cfg.d_model;
    switch (which) {
    case DT_STAGE_IN: return encoded;
    case DT_STAGE_OUT: return res3 + (size_t)(dt_stage_layers(&m->cfg, &m->opts) - 1) * rwc;
    default: return dres;
    }
}

/* Context parallelism (model/cp.h; dt_model_opts.cp > 1): RoPE at the held rows' global
 * positions (the two chunks' ranges; backward: the transposed rotation), and the causal
 * attention around the CP ring with scratch cps (dt_cp_scratch_floats; a failed exchange sets
 * m->cp_failed). Without context parallelism: the plain operations. */
void dt_fam_rope(dt_model *m, float *qkv, int B, int T, int NH, int NKV, int hs, const float *inv, float scale,
                 int backward);
void dt_fam_attention_forward(dt_model *m, float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int hs,
                              float *cps);
void dt_fam_attention_backward(dt_model *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int NH, int NKV, int hs, float *cps);
/* Learned positions at the held rows' global positions: forward, x (B,T,C) += wpe[pos] (wpe
 * const); backward, wpe (the gradient) += x rows at their positions, sequences in order. */
void dt_fam_pos(dt_model *m, float *x, float *wpe, int B, int T, int C, int backward);

/* zb-h1's dead spans of a layer that recomputes its forward (decision 81): its output and, for
 * layer 0, the embedding output (rwc floats each; the rest of it is working slots); res3 and
 * encoded are NULL for the planner (no activations). Returns the spans written. */
static inline int dt_fam_recomputed_spans(int l, float *res3, float *encoded, size_t rwc, dt_act_span *out) {
    int n = 0;
    out[n++] = (dt_act_span){res3, rwc, 0};
    if (l == 0) out[n++] = (dt_act_span){encoded, rwc, 0};
    return n;
}

/* Token ids come from files: refuses any outside [0, V), naming the position. */
dt_status dt_model_check_tokens(dt_ctx *ctx, const int32_t *inputs, const int32_t *targets, int n,
                                int V);
/* Mean of the per-position losses whose target is counted (>= 0; every one if targets is
 * NULL), in a fixed order (deterministic); 0 when none is; may be NaN/Inf. */
float dt_model_mean_loss(const float *losses, const int32_t *targets, int n);

/* Refuses the vision keys (image_size, patch_size, channels, n_classes) for a language
 * family, naming the key. */
dt_status dt_model_refuse_vision(dt_ctx *ctx, const dt_model_config *c, const char *family);
/* Refuses the expert keys (n_experts, experts_topk, expert_d_ff) for a family without
 * experts, naming the key. */
dt_status dt_model_refuse_experts(dt_ctx *ctx, const dt_model_config *c, const char *family);

#endif
