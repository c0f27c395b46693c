/* prepare.h - text to token shards (`dtrain prepare`): read text files or stdin, split into
 * documents, tokenize on all cores, send every k-th document to a validation set, write
 * llm.c shards (version 1 = uint16 tokens when the vocabulary fits, else 7 = uint32). Each
 * document is [bos] ids eot: bos when the tokenizer has one, eot its end-of-text id or '\n'.
 *
 *   dt_prepare_cfg p = {.tok = tok, .inputs = files, .n_inputs = n, .doc_sep = "%",
 *                       .val_fraction = 0.05, .shard_tokens = 100000000, .out_prefix = "data/x"};
 *   dt_prepare_stats s; DT_CHECK(dt_prepare(ctx, &p, &s));
 *   // data/x_train_000000.bin ..., data/x_val_000000.bin ...
 */
#ifndef DT_PREPARE_H
#define DT_PREPARE_H

#include <stdint.h>

#include "data/tokenizer.h"

typedef struct dt_prepare_cfg {
    const dt_tokenizer *tok;
    const char *const *inputs; /* paths; "-" = standard input */
    int n_inputs;
    const char *doc_sep;       /* a line equal to this separates documents; NULL: one per file */
    double val_fraction;       /* share of documents for validation (every round(1/f)-th); 0 = none */
    uint64_t shard_tokens;     /* maximum tokens per shard file */
    const char *out_prefix;    /* shards are PREFIX_train_NNNNNN.bin and PREFIX_val_NNNNNN.bin */
    int threads;               /* <= 0: OpenMP default */
} dt_prepare_cfg;

typedef struct dt_prepare_stats {
    uint64_t bytes, docs, val_docs, train_tokens, val_tokens;
    int train_shards, val_shards;
    double tokenize_seconds;
} dt_prepare_stats;

dt_status dt_prepare(dt_ctx *ctx, const dt_prepare_cfg *p, dt_prepare_stats *out);

/* Reads a whole file ("-": standard input) into *text (malloc'ed, NUL-terminated after *len
 * bytes), naming the file on failure. */
dt_status dt_read_text(dt_ctx *ctx, const char *path, char **text, size_t *len);

/* Writes head then body to PATH.tmp, fsyncs it and renames it to PATH (removed on failure). */
dt_status dt_file_write_atomic(dt_ctx *ctx, const char *path, const void *head, size_t head_bytes, const void *body,
                               size_t body_bytes);

/* Writes one llm.c shard (tmp file, fsync, rename). */
dt_status dt_shard_write(dt_ctx *ctx, const char *path, const int32_t *tokens, uint64_t n, int vocab);

#endif
