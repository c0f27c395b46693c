/* hftok.h - internal to the tokenizer module (tokenizer.c is its only user): Hugging Face
 * tokenizer.json BPE models on the tables and merge machinery of bpe.h. Two kinds:
 *   byte-level   GPT-2's byte alphabet, a regex pre-tokenizer (GPT-2's or Llama 3's), merges
 *                by rank, optionally ignore_merges (a piece that is a token is that token):
 *                Llama 3 and GPT-2 style files;
 *   sentencepiece  no pre-tokenizer: "▁" prepended and for every space, one symbol per code
 *                point (or its <0xNN> byte tokens when it is not a token), merges by rank over
 *                the whole text: Llama 2, Mistral, TinyLlama.
 * Added tokens (added_tokens) are cut out of the text first and become their ids. Invalid
 * UTF-8 in the text is read as U+FFFD (one per maximal invalid subsequence, as a JS
 * TextDecoder or Python's errors="replace" reads it), since the models are defined on text.
 * hftok_load.c reads and validates the file, hftok.c encodes and decodes.
 *
 *   dt_hftok *h; DT_CHECK(dt_hftok_load(ctx, "tokenizer.json", &h));
 *   dt_bpe_state *st = dt_bpe_state_new(h->bpe);     // one per thread
 *   dt_ids ids = {0}; dt_hftok_encode(h, st, text, len, &ids);
 */
#ifndef DT_HFTOK_H
#define DT_HFTOK_H

#include "data/bpe.h"

enum { DT_HF_BYTELEVEL, DT_HF_SENTENCEPIECE };
enum { DT_HF_PRE_GPT2, DT_HF_PRE_LLAMA3 };       /* byte-level pre-tokenizer patterns */
enum { DT_HF_PREPEND_NEVER, DT_HF_PREPEND_ALWAYS, DT_HF_PREPEND_FIRST };

typedef struct dt_hftok {
    dt_bpe *bpe;         /* every id's bytes (added tokens: their content), hash, merges */
    int kind, pre;
    int prepend;         /* sentencepiece: "▁" before every text segment, the first, none */
    int byte_fallback;   /* sentencepiece: unknown code points -> <0xNN> (else unk) */
    int fuse_unk;
    int unk, bos, eos;   /* ids or -1 */
    int space_id;        /* sentencepiece: the token "▁", or -1 */
    int16_t *byte_of;    /* sentencepiece: (n) the byte of a <0xNN> token, or -1 */
    uint8_t *added;      /* (n) 1 for an added token: matched in the text, decoded as is */
    int32_t *added_ids;  /* added tokens by first byte of content, longest first */
    size_t n_added;
    uint32_t first_byte[8]; /* bitmap of the added tokens' first bytes */
    int nl_cut;          /* a '\n' is a piece boundary: the text may be cut after one */
} dt_hftok;

/* Loads and validates a tokenizer.json; one message names the file and the key. */
dt_status dt_hftok_load(dt_ctx *ctx, const char *path, dt_hftok **out);
void dt_hftok_free(dt_hftok *h);

/* Appends the ids of text[0:len) (no BOS/EOS) to out; 0, or -1 when out of memory. first:
 * the text starts the document (sentencepiece's prepend_scheme "first"). */
int dt_hftok_encode(const dt_hftok *h, dt_bpe_state *st, const char *text, size_t len,
                    int first, dt_ids *out);

/* The smallest p in [from, len) after which the text can be cut without changing its ids,
 * or len. */
size_t dt_hftok_next_split(const dt_hftok *h, const char *text, size_t len, size_t from);

/* The bytes of ids (the decoder of the kind: byte alphabet, or "▁" -> ' ' and <0xNN> -> the
 * byte); at_start drops the space sentencepiece prepended to the text. Returns the length
 * written to out (NULL: only measures). Ids must be in [0, vocab). */
size_t dt_hftok_decode(const dt_hftok *h, const int32_t *ids, size_t n, int at_start, char *out);

#endif
