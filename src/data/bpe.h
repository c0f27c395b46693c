/* bpe.h - internal to the tokenizer module (tokenizer.c is its only user): the GPT-2
 * byte-level BPE vocabulary, the pre-tokenizer, and a per-thread encoder state holding the
 * piece cache and the merge scratch. The public API is tokenizer.h. bpe_load.c loads the
 * vocabulary, bpe.c encodes; the last section is what the two share.
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

/* Llama 3's pre-tokenizer (the pattern of Hugging Face's Llama 3 tokenizer.json) and its
 * safe split points, as dt_bpe_piece_end and dt_bpe_next_split for GPT-2's. Valid UTF-8. */
size_t dt_bpe_piece_end_llama3(const uint8_t *text, size_t i, size_t len);
size_t dt_bpe_next_split_llama3(const uint8_t *text, size_t len, size_t from);

/* ------------------- shared by bpe_load.c, bpe.c and hftok*.c (tokenizer.json), no one else */

#define DT_BPE_MERGE_EMPTY UINT64_MAX

struct dt_bpe {
    int n;              /* tokens */
    int eot;            /* id of "<|endoftext|>" or -1 */
    uint8_t *blob;      /* the bytes of all tokens */
    uint32_t *off, *len; /* (n) where token id's bytes are in blob */
    uint8_t *self;      /* (n) 1 if merging the token's own bytes gives just the token */
    int32_t byte_id[256];
    int32_t *tslot;     /* open addressing over token bytes: id, or -1 when empty */
    size_t tmask;
    uint64_t *mkey;     /* merges: (first id << 32 | second id), or DT_BPE_MERGE_EMPTY */
    uint32_t *mrank;    /* rank = order in vocab.bpe */
    int32_t *mres;      /* id of the merged token */
    size_t mmask;
    int strict;         /* merge order: 0 GPT-2's rounds (all pairs of one rank, then the next),
                         * 1 one merge at a time by (rank, position), as Hugging Face does */
};

/* Length (1..4) of the strictly valid UTF-8 sequence at s[0..n), n >= 1, code point in *cp;
 * 0 if none. */
size_t dt_bpe_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* A 64-bit finaliser (murmur3's): the hash of the merge table's keys. */
uint64_t dt_bpe_mix64(uint64_t x);
/* Hash of p[0..n): the hash of the token table and the piece cache. */
uint64_t dt_bpe_hash_bytes(const uint8_t *p, size_t n);
/* The smallest power of two >= x, and at least 16. */
size_t dt_bpe_pow2_at_least(size_t x);
/* Id of the token with bytes b[0..n) (h = dt_bpe_hash_bytes(b, n)), or -1. */
int dt_bpe_token_find(const dt_bpe *v, const uint8_t *b, size_t n, uint64_t h);
/* 1 with the rank and the merged token's id when (a, b) is a merge, else 0. */
int dt_bpe_merge_find(const dt_bpe *v, int32_t a, int32_t b, uint32_t *rank, int32_t *res);
/* Grows *p (*cap elements of elem bytes) to hold need, doubling; 0, or -1 (*p unchanged). */
int dt_bpe_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Appends the BPE of the single piece b[0..n), n >= 1, to out; 0, or -1 when out of memory. */
int dt_bpe_merge(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out);
/* The same for a piece given as n initial symbols (token ids): fill dt_bpe_syms(st, n)
 * (NULL when out of memory), then dt_bpe_merge_syms appends the merged ids to out. */
int32_t *dt_bpe_syms(dt_bpe_state *st, size_t n);
int dt_bpe_merge_syms(dt_bpe_state *st, size_t n, dt_ids *out);
/* One piece through the per-thread cache: the token itself when the piece is a token marked
 * in v->self, else its BPE (cached). */
int dt_bpe_encode_piece(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out);

/* GPT-2's byte alphabet (bytes_to_unicode): the byte a code point stands for, or -1. */
int dt_bpe_cp_to_byte(uint32_t cp);
/* Reads a whole file (NUL-terminated after *n bytes; free it); the message names the path. */
dt_status dt_bpe_read_file(dt_ctx *ctx, const char *path, uint8_t **buf, size_t *n);
/* Allocates the token hash for v->n tokens (v->off/len filled) and inserts the ids for which
 * skip is NULL or skip[id] == 0; returns the first id whose bytes repeat an earlier one's in
 * *dup (with that one in *first), or -1 there. -1 when out of memory, else 0. */
int dt_bpe_index_tokens(dt_bpe *v, const uint8_t *skip, int *dup, int *first);
/* Allocates the merge table for up to n merges. 0, or -1 when out of memory. */
int dt_bpe_merges_alloc(dt_bpe *v, size_t n);
/* Adds merge (a, b) -> res with the given rank; 1 if (a, b) is already a merge (*old_rank). */
int dt_bpe_merge_add(dt_bpe *v, int32_t a, int32_t b, int32_t res, uint32_t rank,
                     uint32_t *old_rank);
/* v->self for every token of two or more bytes (see bpe_load.c). */
dt_status dt_bpe_mark_self(dt_ctx *ctx, dt_bpe *v);

#endif
