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

#include "core/status.h"

typedef enum dt_st_dtype { DT_ST_F32, DT_ST_I32 } dt_st_dtype;

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

#endif
