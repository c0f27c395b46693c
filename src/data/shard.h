/* shard.h - datasets: an ordered list of token shard files, mmap'd read-only, or of IDX
 * image files (records of pixels + label).
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
 *          IDX images (below) are taken when the name contains "idx3-ubyte" or the file
 *          (gunzipped if it is gzip) starts with the IDX images magic - for a plain *.bin
 *          file only if its size is also the one that header gives.
 *   idx    IDX images, the MNIST layout: big-endian magic 0x00000803 (uint8, 3 dims), N, H,
 *          W, then N*H*W pixels; plain or gzip (inflated into memory at open). Its labels
 *          file is the same path with "images-idx3" -> "labels-idx1" in the file name:
 *          magic 0x00000801, N, then N uint8 labels. The spec names the images files only.
 *
 * Record datasets (idx). Every image is one record of H*W + 1 tokens: its pixels (0..255,
 * row-major), then its label; a shard holds N records and a record never spans shards. All
 * shards of a dataset have the same H and W, and a dataset is all IDX or all token shards.
 * `vocab` bounds every token, pixels and labels alike (vocab >= 256 accepts any image);
 * labels get their own bound from dt_dataset_check_labels. The sampler then takes T = H*W
 * and one record per sample (sampler.h).
 *
 *   DT_CHECK(dt_dataset_open(ctx, &ds, "fm/train-images-idx3-ubyte.gz", "idx", 256));
 *   int h, w;
 *   if (dt_dataset_image_hw(ds, &h, &w)) {               // an image dataset
 *       DT_CHECK(dt_dataset_check_labels(ctx, ds, n_classes));
 *       T = h * w;                                       // == dt_dataset_record_len(ds) - 1
 *   }
 *
 * A dataset spec is a comma-separated list of entries; an entry with * ? or [ is a glob(3)
 * pattern (its matches sorted byte-wise, at least one required), any other entry is a path.
 * Entries keep their order. File names containing commas are not supported.
 *
 * Opening checks every shard (magic, version, size against the header, at least one token,
 * every token < vocab by a parallel scan; IDX: both magics, dimensions, sizes, the gzip
 * stream, the labels file present with the same N) and fails with one line naming the file
 * (and the labels file where it is the culprit) and the reason. Tokens are read through the
 * mapping and widened to int32; nothing is copied whole (but gzip'd IDX files).
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

/* Opens every file named by `spec` (format "auto", "llmc", "raw16" or "idx"; NULL = "auto")
 * and validates it against `vocab`. On failure *out is NULL and ctx->err names file and
 * reason. */
dt_status dt_dataset_open(dt_ctx *ctx, dt_dataset **out, const char *spec, const char *format,
                          int vocab);

/* Unmaps and frees everything; NULL is a no-op. */
void dt_dataset_close(dt_dataset *ds);

/* Fails, naming the first offending shard and the count needed, unless every shard holds at
 * least T+1 tokens (one sample). A record dataset needs T = H*W exactly (DT_ERR_CONFIG,
 * naming training.seq_len and the image size). */
dt_status dt_dataset_check_seq_len(dt_ctx *ctx, const dt_dataset *ds, int T);

/* Loss masks. A token shard PATH may have a mask file PATH.mask beside it (written by
 * `dtrain prepare --instruct`): a 1024-byte header of 256 little-endian int32 (magic
 * DT_MASK_MAGIC, version 1, token count), then one byte per token of the shard, 1 when the
 * token counts as a target of the loss (a response token), 0 when it does not (a prompt).
 * Opening finds the mask of every token shard; either every shard has one (the count must
 * equal the shard's, every byte 0 or 1) or none, else the shard without one is named.
 * The sampler turns the targets of uncounted tokens into -1 (sampler.h). */
#define DT_MASK_MAGIC 20261126
int dt_dataset_has_loss_mask(const dt_dataset *ds);
/* dst[i] = mask of token start + i of the shard (1 without a mask). */
void dt_dataset_read_mask(const dt_dataset *ds, int shard, uint64_t start, size_t n, uint8_t *dst);

/* Tokens per record: H*W + 1 for an image dataset, 0 for token streams. */
int dt_dataset_record_len(const dt_dataset *ds);

/* 1 with *h, *w the image size for an image dataset; 0 with *h = *w = 0 for token streams. */
int dt_dataset_image_hw(const dt_dataset *ds, int *h, int *w);

/* Records (images) over all shards; 0 for token streams. */
uint64_t dt_dataset_num_records(const dt_dataset *ds);

/* Fails with one line naming the images and labels files and the index of the first label
 * >= n_classes (DT_ERR_FORMAT), or if `ds` is a token dataset or n_classes <= 0
 * (DT_ERR_CONFIG). */
dt_status dt_dataset_check_labels(dt_ctx *ctx, const dt_dataset *ds, int n_classes);

int dt_dataset_num_shards(const dt_dataset *ds);
uint64_t dt_dataset_num_tokens(const dt_dataset *ds); /* over all shards */
int dt_dataset_vocab(const dt_dataset *ds);
const char *dt_dataset_spec(const dt_dataset *ds); /* the spec it was opened with */

uint64_t dt_dataset_shard_tokens(const dt_dataset *ds, int shard);
const char *dt_dataset_shard_path(const dt_dataset *ds, int shard);
int dt_dataset_shard_width(const dt_dataset *ds, int shard); /* bytes per token: 2 or 4 (IDX: 1) */
int dt_dataset_shard_is_raw(const dt_dataset *ds, int shard); /* 1 = raw uint16, 0 = llm.c, IDX */
uint64_t dt_dataset_shard_records(const dt_dataset *ds, int shard); /* images; 0 = token shard */
const char *dt_dataset_shard_labels_path(const dt_dataset *ds, int shard); /* NULL: token shard */

/* Label of image `rec` (< dt_dataset_shard_records, asserted) of an IDX shard. */
int dt_dataset_label(const dt_dataset *ds, int shard, uint64_t rec);

/* Token i of a shard, widened. i must be < dt_dataset_shard_tokens (asserted). In an IDX
 * shard token r*(H*W+1) + j is pixel j of image r for j < H*W, and j = H*W its label. */
int32_t dt_dataset_token(const dt_dataset *ds, int shard, uint64_t i);

/* dst[j] = token (start + j) of the shard for j < n; the range must lie inside the shard. */
void dt_dataset_read(const dt_dataset *ds, int shard, uint64_t start, size_t n, int32_t *dst);

#endif
