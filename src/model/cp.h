/* cp.h - context parallelism's ring attention (parallel.cp; ARCHITECTURE decision 83).
 *
 * A sequence of T tokens is cut into 2 cp chunks of c = T / (2 cp); CP rank r holds chunks r
 * and 2 cp - 1 - r (the causal load balance: every rank then has the same share of the causal
 * mask's work), as its rows [0, c) and [c, 2c) of Tl = 2c local rows. Everything but the
 * attention works on those rows alone (positions are global: dt_cp_pos). The attention runs
 * around the CP ring in cp steps: at step s this rank holds the keys and values of rank
 * j = r - s (mod cp), computes its queries against the chunks of that block they may see
 * (dt_attention_block_forward: a diagonal chunk causally, an earlier chunk whole, a later one
 * not at all) and merges each partial result into the running (out, lse) (dt_attention_merge),
 * while the block travels on to rank r + 1 (posted before the step's compute: the transfer
 * overlaps it). Steps and chunk pairs run in a fixed order, so the result does not depend on
 * timing.
 *
 * The backward walks the ring again with the rows' merged out and lse: each step adds its
 * queries' gradient (dq stays home) and forms this rank's share of the block's dK and dV,
 * which is added to the share the block brought along (dkv travels with it: owner first, then
 * r + 1, ...) and sent on; after cp steps each block's gradient returns to its owner.
 *
 * parallel.cp_comm=all_gather (Megatron-Core's all-gather variant): the blocks are gathered
 * once and visited in the ring's order, and the gradient shares go home with one all-to-all and
 * are added there in the ring's order (the owner's first): the same bits as the ring, with cp
 * blocks of memory instead of two and no overlap.
 *
 * The exchange is the caller's (the trainer installs point-to-point over the CP group; a test
 * may run the ranks as threads): start(slot) sends `send` to rank + 1 and receives `recv` from
 * rank - 1 (n floats each), wait(slot) completes both; slot DT_CP_KV carries the blocks, slot
 * DT_CP_DKV their gradients (both may be in flight at once). Each returns 0, or non-zero after
 * a communication failure (the trainer names it). */
#ifndef DT_MODEL_CP_H
#define DT_MODEL_CP_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

enum { DT_CP_KV = 0, DT_CP_DKV = 1 };
#define DT_CP_MAX 1024 /* parallel.cp at most */
typedef struct dt_cp_ring {
    int n, rank; /* ring size (parallel.cp) and this rank's place */
    int contiguous; /* parallel.cp_split=contiguous: rank r holds chunks 2r and 2r + 1 (the
                       sequence's r-th cp-th, unbalanced: for comparison) */
    void *ud;
    int (*start)(void *ud, int slot, const float *send, float *recv, size_t n);
    int (*wait)(void *ud, int slot);
    /* parallel.cp_comm=all_gather: every rank's blocks gathered once (in place: this rank's n
     * floats at buf + rank n), and the blocks' gradient shares sent home with one all-to-all
     * (send and recv: n floats per rank, in rank order). NULL: the ring (p2p). */
    int (*allgather)(void *ud, float *buf, size_t n);
    int (*alltoall)(void *ud, const float *send, float *recv, size_t n);
    /* x (n doubles) replaced by its sum over the ring's ranks, added in rank order (the same
     * bits on every rank): a mixture of experts' router totals (moe.h; decision 89) */
    int (*sum)(void *ud, double *x, size_t n);
} dt_cp_ring;

/* Floats of scratch the ring attention of one TP shard's heads needs (B sequences of Tl local
 * rows; all_gather: every rank's blocks and gradient shares at once, cp of each). */
size_t dt_cp_scratch_floats(int B, int Tl, int NH, int NKV, int hs, int cp, int all_gather);

/* out (B, Tl, NH hs) and lse (B, NH, Tl) of the local rows' queries of qkv (B, Tl, (NH + 2 NKV)
 * hs) against every rank's keys, as dt_attention_forward's causal attention over the whole
 * sequence would give them (to rounding: the blocks' merges). */
int dt_cp_attention_forward(const dt_cp_ring *ring, float *scratch, float *out, float *lse, const float *qkv, int B,
                            int Tl, int NH, int NKV, int hs, dt_dtype op);
/* dqkv (B, Tl, (NH + 2 NKV) hs), overwritten: the local rows' share of the whole sequence's
 * attention gradient (dq of the local queries, dk and dv of the local keys and values from
 * every rank's queries). */
int dt_cp_attention_backward(const dt_cp_ring *ring, float *scratch, float *dqkv, const float *dout, const float *qkv,
                             const float *out, const float *lse, int B, int Tl, int NH, int NKV, int hs, dt_dtype op);

/* dst (B, T / cp): the rows of src (B, T) CP rank r holds, in its order. */
void dt_cp_rows(int32_t *dst, const int32_t *src, int B, int T, int cp, int r, int contiguous);

/* Global position of local row i (of Tl) on CP rank r of cp (contiguous: rows r Tl ...). */
static inline int dt_cp_pos(int cp, int r, int Tl, int i, int contiguous) {
    const int c = Tl / 2;
    if (cp <= 1) return i;
    if (contiguous) return r * Tl + i;
    return i < c ? r * c + i : (2 * cp - 1 - r) * c + (i - c);
}

#endif
