/* topk.h - Top-K gradient sparsification with error feedback (parallel.compression: topk).
 *
 * A bucket of n gradient elements is cut into blocks of DT_TOPK_BLOCK elements (the last one
 * shorter); each block sends its k = ceil(ratio x length) largest magnitudes. Before choosing,
 * the rank's residual (what it did not send before) is added to its gradient; afterwards the
 * residual is exactly what was not sent: the whole sum where nothing was sent, the rounding
 * error of the value where a 16-bit value was sent (0 where the value went out exactly).
 *
 *   float *g;        bucket of n elements (the rank's gradient in, the sum over ranks out)
 *   float *res;      this rank's residual for the same n elements (persistent)
 *   uint16_t *msgs;  world x dt_topk_words(n, ratio, vt) words
 *   dt_topk_encode(g, res, n, ratio, vt, msgs + rank * words);
 *   ... all-gather the messages (every rank's message the same size) ...
 *   dt_topk_sum(g, n, ratio, vt, msgs, world);
 *
 * Choice: by |x| (its bits without the sign), ties to the lower index: a total order, so the
 * chosen set does not depend on how it is found (radix select: 4 histogram passes a block).
 * Message of a bucket: K = sum over blocks of k uint16 indices (block-relative: a block has at
 * most 65536 elements), then K values (vt: DT_F32 as two words each, DT_BF16/DT_F16 one word),
 * both in index order. So a pair costs 6 bytes in fp32, 4 in 16 bits.
 * Sum: every rank adds the messages in rank order into a buffer of -0.0 (the exact identity of
 * addition: the first contribution is taken as it is), and with 16-bit values rounds each sum
 * to vt once (comm.h's bf16 rule). With ratio 1 every element is sent, so the result is
 * bitwise the dense ordered all-reduce (fp32) or the dense bf16 one (DT_BF16); a zero
 * residual is kept as -0.0 so it changes no gradient's bits when added.
 */
#ifndef DT_TOPK_H
#define DT_TOPK_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define DT_TOPK_BLOCK 65536

/* k of a block of len elements: ceil(ratio x len), at least 1, at most len (0 for len 0). */
size_t dt_topk_block_k(size_t len, double ratio);
/* Pairs a bucket of n elements sends: the sum of its blocks' k. */
size_t dt_topk_pairs(size_t n, double ratio);
/* uint16 words of a bucket's message with values of type vt (DT_F32, DT_BF16 or DT_F16). */
size_t dt_topk_words(size_t n, double ratio, dt_dtype vt);

/* The positions of the k largest |x| of a block (len <= DT_TOPK_BLOCK), ties to the lower
 * index, written to idx (k entries) in increasing order. */
void dt_topk_select(const float *x, size_t len, size_t k, uint16_t *idx);

/* g += res; chooses each block's k largest; writes the message (dt_topk_words words) to msg;
 * res = g - (what was sent), as described above. g is left holding g + res (before). */
void dt_topk_encode(float *g, float *res, size_t n, double ratio, dt_dtype vt, uint16_t *msg);

/* out (n) = the sum over parts messages (stacked, dt_topk_words each) in order; elements no
 * message names are -0.0. */
void dt_topk_sum(float *out, size_t n, double ratio, dt_dtype vt, const uint16_t *msgs, int parts);

/* Fills a residual with -0.0 (nothing owed). */
void dt_topk_residual_clear(float *res, size_t n);

#endif
