/* shard.h - token datasets: an ordered list of token shard files, mmap'd read-only.
 *
 * Formats:
 *   llmc   llm.c shard: 256 x int32 little-endian header (magic 20240520, version, token
 *          count), then the tokens; version 1 = uint16 tokens, 7 = uint32 tokens.
 *   raw16  raw little-endian uint16 tokens, no header (nanoGPT's train.bin / val.bin).
 *   auto   per file: the llm.c magic in the first 4 bytes => llmc. Otherwise raw16 only if
 *          the name ends in ".bin", the size is even and bytes 4..11 do not look like an
 *          llm.c header (version 1 or 7 and a token count matching the size) - so a shard
 *          whose magic was damaged is refused as "bad magic", not read as raw tokens.
 *          Anything else is refused; pass "raw16" to force raw reading of other names.
 *
 * A dataset spec is a comma-separated list of entries; an entry with * ? or [ is a glob(3)
 * pattern (its matches sorted byte-wise, at least one required), any other entry is a path.
 * Entries keep their order. File names containing commas are not supported.
 *
 * Opening checks every shard (magic, version, size against the header, at least one token,
 * every token < vocab by a parallel scan) and fails with one line naming the file and the
 * reason. Tokens are read through the mapping and widened to int32; nothing is copied whole.
 *
 *   dt_dataset *ds;
 *   DT_CHECK(dt_dataset_open(ctx, &ds, "data/fineweb_train_*.bin", "auto", 50257));
 *   DT_CHECK(dt_dataset_check_seq_len(ctx, ds, T));   // every shard holds one T+1 window
 *   dt_dataset_read(ds, shard, start, T + 1, buf);
 *   dt_dataset_close(ds);
 */
#ifndef DT_SHARD_H
#define DT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DT_LLMC_MAGIC 20240520
#define DT_LLMC_HEADER_INTS 256
#define DT_LLMC_HEADER_BYTES (DT_LLMC_HEADER_INTS * 4)

typedef struct dt_dataset dt_dataset;

/* Opens every file named by `spec` (format "auto", "llmc" or "raw16"; NULL = "auto") and
 * validates it against `vocab`. On failure *out is NULL and ctx->err names file and reason. */
dt_status dt_dataset_open(dt_ctx *ctx, dt_dataset **out, const char *spec, const char *format,
                          int vocab);

/* Unmaps and frees everything; NULL is a no-op. */
void dt_dataset_close(dt_dataset *ds);

/* Fails, naming the first offending shard and the count needed, unless every shard holds at
 * least T+1 tokens (one sample). */
dt_status dt_dataset_check_seq_len(dt_ctx *ctx, const dt_dataset *ds, int T);

int dt_dataset_num_shards(const dt_dataset *ds);
uint64_t dt_dataset_num_tokens(const dt_dataset *ds); /* over all shards */
int dt_dataset_vocab(const dt_dataset *ds);
const char *dt_dataset_spec(const dt_dataset *ds); /* the spec it was opened with */

uint64_t dt_dataset_shard_tokens(const dt_dataset *ds, int shard);
const char *dt_dataset_shard_path(const dt_dataset *ds, int shard);
int dt_dataset_shard_width(const dt_dataset *ds, int shard); /* bytes per token: 2 or 4 */
int dt_dataset_shard_is_raw(const dt_dataset *ds, int shard); /* 1 = raw uint16, 0 = llm.c */

/* Token i of a shard, widened. i must be < dt_dataset_shard_tokens (asserted). */
int32_t dt_dataset_token(const dt_dataset *ds, int shard, uint64_t i);

/* dst[j] = token (start + j) of the shard for j < n; the range must lie inside the shard. */
void dt_dataset_read(const dt_dataset *ds, int shard, uint64_t start, size_t n, int32_t *dst);

#endif
