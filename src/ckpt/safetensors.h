/* safetensors.h - writing the safetensors format: u64 little-endian header length, a JSON
 * header {"__metadata__": {...}, name: {dtype, shape, data_offsets}}, then raw data.
 * The file is written to PATH.tmp, fsynced and renamed into place, so a reader never sees
 * a partial file.
 *
 *   dt_st_entry e[] = {{"wte.weight", DT_ST_F32, 2, {V, C}, wte}};
 *   const char *meta[] = {"step", "10", NULL};
 *   DT_CHECK(dt_st_write(ctx, "model.safetensors", e, 1, meta));
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include <stdint.h>

#include "ckpt/ckpt_io.h"
#include "core/status.h"

/* F16 and BF16 are read (Hugging Face checkpoints), never written by dtrain. */
typedef enum dt_st_dtype { DT_ST_F32, DT_ST_I32, DT_ST_F16, DT_ST_BF16 } dt_st_dtype;
/* Bytes per element. */
size_t dt_st_dtype_size(dt_st_dtype d);

#define DT_ST_MAXDIM 4

typedef struct dt_st_entry {
    const char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_ST_MAXDIM];
    const void *data;
} dt_st_entry;

/* meta: NULL-terminated key, value, key, value, ... list (may be NULL). */
dt_status dt_st_write(dt_ctx *ctx, const char *path, const dt_st_entry *e, int n,
                      const char *const *meta);
/* Same, returning the file's size and XXH3-64 checksum (computed while writing). */
dt_status dt_st_write_info(dt_ctx *ctx, const char *path, const dt_st_entry *e, int n,
                           const char *const *meta, dt_io_info *info);

/* Reading: the file is mmap'd; every length, offset and shape is checked against the file
 * before any tensor is exposed, so a truncated or corrupted file is refused, never read
 * out of bounds. Tensor data pointers stay valid until dt_st_close. */
typedef struct dt_st_file dt_st_file;

typedef struct dt_st_tensor {
    const char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_ST_MAXDIM];
    const void *data;
    size_t nbytes;
} dt_st_tensor;

dt_status dt_st_open(dt_ctx *ctx, const char *path, dt_st_file **out);
/* Same checks on size bytes at data (a file already in memory, the fuzzers); `name` names it
 * in messages. data must outlive the handle. */
dt_status dt_st_open_mem(dt_ctx *ctx, const char *name, const void *data, size_t size,
                         dt_st_file **out);
void dt_st_close(dt_st_file *f);
/* The tensor called `name`, or NULL. */
const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
int dt_st_count(const dt_st_file *f);
const dt_st_tensor *dt_st_at(const dt_st_file *f, int i);
/* A __metadata__ value, or NULL. */
const char *dt_st_meta(const dt_st_file *f, const char *key);

#endif
