/* shard_impl.h - the shard and dataset structs, shared by shard.c (token shards, the
 * dataset) and idx.c (IDX image files); internal to src/data. */
#ifndef DT_SHARD_IMPL_H
#define DT_SHARD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum shard_format { FMT_AUTO, FMT_LLMC, FMT_RAW16, FMT_IDX } shard_format;

/* A whole file in memory: mapped read-only, or (gzip) inflated into a malloc'd buffer. */
typedef struct blob {
    unsigned char *p;
    size_t n;
    int mapped;
} blob;

typedef struct dt_shard {
    char *path;
    void *map; /* the whole file; NULL until mapped */
    size_t map_bytes;
    const unsigned char *tok; /* first token, inside map (page + 1024 bytes: aligned) */
    uint64_t n;               /* tokens (IDX: records x (H*W + 1)) */
    int width;                /* bytes per token: 2 or 4 (IDX: 1) */
    int raw;                  /* 1 = headerless uint16 */
    /* IDX images only (rec_len > 0): pixels (n_rec, h, w) and labels (n_rec), uint8. */
    int rec_len; /* h*w + 1; 0 for a token shard */
    int h, w;
    uint64_t n_rec;
    char *labels_path;
    blob img, lab;
    const unsigned char *pix, *labels;
    /* A loss mask beside a token shard (PATH.mask): one byte per token, 1 = counted. */
    blob maskb;
    const unsigned char *mask; /* NULL: no mask file */
} dt_shard;

struct dt_dataset {
    char *spec;
    int vocab;
    int n_shards;
    dt_shard *shards;
    uint64_t n_tokens;
    int rec_len; /* h*w + 1 for an image dataset, 0 for token streams */
    int h, w;
    uint64_t n_rec;
    int has_mask; /* every shard has its loss mask */
};

/* Maps `path` read-only into *b. Messages start with `who` (the path, or "images: labels
 * file labels" for a labels file, so that both are named). */
dt_status dt_shard_file_map(dt_ctx *ctx, const char *path, const char *who, blob *b);
void dt_shard_blob_free(blob *b);

/* 1 when `path` is an IDX images file: by name (idx3-ubyte) or by content (the magic, after
 * gunzip; a plain file's size must also match its header). */
int dt_idx_detect(const char *path);
/* Opens sh->path as IDX images and its labels file (images-idx3 -> labels-idx1 in the name). */
dt_status dt_idx_open(dt_ctx *ctx, dt_shard *sh);

#endif
