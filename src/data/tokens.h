/* tokens.h - a source of training batches: synthetic tokens from the counter RNG, or an
 * llm.c token shard (256 x int32 header, magic 20240520, version 1 = uint16 tokens,
 * version 7 = uint32) read as consecutive windows. The full data pipeline (globs,
 * validation sets, distributed sampler, prefetch) grows from here.
 *
 *   dt_tokens src; DT_CHECK(dt_tokens_open(ctx, &src, path_or_NULL, vocab, seed));
 *   dt_tokens_batch(&src, k, B, T, inputs, targets);  // k-th micro-batch
 *   dt_tokens_close(&src);
 */
#ifndef DT_TOKENS_H
#define DT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DT_SHARD_MAGIC 20240520
#define DT_SHARD_HEADER_INTS 256

typedef struct dt_tokens {
    int32_t *tok; /* file tokens, widened; NULL for synthetic */
    size_t n;     /* number of tokens in the file */
    int vocab;
    uint64_t seed;
} dt_tokens;

/* path NULL => synthetic uniform tokens in [0, vocab). A file is checked: header magic and
 * version, size against the header's token count, and every token < vocab. */
dt_status dt_tokens_open(dt_ctx *ctx, dt_tokens *s, const char *path, int vocab, uint64_t seed);
void dt_tokens_close(dt_tokens *s);

/* The k-th micro-batch (B rows of T tokens, targets shifted by one). Same k => same batch. */
void dt_tokens_batch(const dt_tokens *s, uint64_t k, int B, int T, int32_t *inputs,
                     int32_t *targets);

#endif
