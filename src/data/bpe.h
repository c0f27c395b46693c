/* bpe.h - internal to the tokenizer module (tokenizer.c is its only user): the GPT-2
 * byte-level BPE vocabulary, the pre-tokenizer, and a per-thread encoder state holding the
 * piece cache and the merge scratch. The public API is tokenizer.h.
 *
 *   dt_bpe *v; DT_CHECK(dt_bpe_load(ctx, "encoder.json", "vocab.bpe", &v));
 *   dt_bpe_state *st = dt_bpe_state_new(v);       // one per thread
 *   dt_ids ids = {0};
 *   if (!st || dt_bpe_encode(st, text, len, &ids) != 0) ... out of memory
 *   dt_bpe_state_free(st); free(ids.v); dt_bpe_free(v);
 */
#ifndef DT_BPE_H
#define DT_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_bpe dt_bpe;             /* immutable once loaded: share across threads */
typedef struct dt_bpe_state dt_bpe_state; /* one per thread */

/* A growable id array; zero-initialise, free(v) when done. */
typedef struct dt_ids {
    int32_t *v;
    size_t n, cap;
} dt_ids;

/* Loads and validates encoder.json and vocab.bpe; on failure one message names the file. */
dt_status dt_bpe_load(dt_ctx *ctx, const char *encoder_json, const char *vocab_bpe,
                      dt_bpe **out);
void dt_bpe_free(dt_bpe *v);

int dt_bpe_vocab(const dt_bpe *v);
/* Id of "<|endoftext|>", or -1 if the vocabulary has none. */
int dt_bpe_eot(const dt_bpe *v);
/* The bytes of token id; id must be in [0, vocab). */
const uint8_t *dt_bpe_token(const dt_bpe *v, int id, size_t *len);

/* NULL when out of memory. */
dt_bpe_state *dt_bpe_state_new(const dt_bpe *v);
void dt_bpe_state_free(dt_bpe_state *st);

/* Appends the ids of text[0:len] to out. 0, or -1 when out of memory (out stays valid).
 * At most len ids: when out->cap - out->n >= len, out->v is never reallocated (it may then
 * point into a larger array). */
int dt_bpe_encode(dt_bpe_state *st, const uint8_t *text, size_t len, dt_ids *out);

/* The pre-tokenizer: end of the piece (regex match) that starts at text[i], i < len.
 * Exported for the parity test, which compares piece boundaries with the reference's. */
size_t dt_bpe_piece_end(const uint8_t *text, size_t i, size_t len);

/* The smallest p in [from, len) where the pre-tokenizer has a boundary whatever comes before
 * or after (so encoding text[..p) and text[p..) apart equals encoding them together), or len
 * when there is none. */
size_t dt_bpe_next_split(const uint8_t *text, size_t len, size_t from);

#endif
