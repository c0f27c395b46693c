/* manifest.h - MANIFEST.json, the commit record of a checkpoint directory: every file of
 * the checkpoint with its size and XXH3-64 checksum. It is written last (tmp, fsync,
 * rename, fsync of the directory), so a directory without a valid manifest is an
 * incomplete save and is never loaded.
 *
 *   {"format": "dtrain-checkpoint", "version": 1, "step": 120, "world": 2,
 *    "strategy": "zero3", "checksum": "xxh3-64",
 *    "files": [{"name": "model.safetensors", "size": 1234, "xxh3": "0f1e2d3c4b5a6978"}, ...],
 *    "manifest_xxh3": "..."}        <- XXH3-64 of every byte before ", \"manifest_xxh3\"" 
 *
 *   dt_manifest m;
 *   DT_CHECK(dt_manifest_read(ctx, "ckpt/step-00000120", &m));   // parse + bounds checks
 *   DT_CHECK(dt_manifest_verify_files(ctx, "ckpt/step-00000120", &m)); // sizes + checksums
 *   dt_manifest_free(&m);
 */
#ifndef DT_MANIFEST_H
#define DT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DT_MANIFEST_NAME "MANIFEST.json"
#define DT_MANIFEST_MAX_FILES 65536
#define DT_MANIFEST_NAME_MAX 96

typedef struct dt_manifest_file {
    char name[DT_MANIFEST_NAME_MAX]; /* a plain file name inside the directory */
    uint64_t size, xxh3;
} dt_manifest_file;

typedef struct dt_manifest {
    long step;
    int world;
    char strategy[16];
    int nfiles;
    dt_manifest_file *files;
} dt_manifest;

/* Parses manifest text (len bytes, need not be NUL-terminated). `origin` names the file in
 * messages. Refuses anything malformed: a wrong own checksum (the last key), wrong format/version, missing keys, a file name
 * with '/' or "..", duplicate names, sizes beyond 2^62. */
dt_status dt_manifest_parse(dt_ctx *ctx, const char *text, size_t len, const char *origin,
                            dt_manifest *out);
/* Reads DIR/MANIFEST.json (at most 16 MiB). */
dt_status dt_manifest_read(dt_ctx *ctx, const char *dir, dt_manifest *out);
/* Every listed file exists with the listed size and checksum. */
dt_status dt_manifest_verify_files(dt_ctx *ctx, const char *dir, const dt_manifest *m);
/* Writes DIR/MANIFEST.json atomically and fsyncs DIR. */
dt_status dt_manifest_write(dt_ctx *ctx, const char *dir, const dt_manifest *m);
const dt_manifest_file *dt_manifest_find(const dt_manifest *m, const char *name);
void dt_manifest_free(dt_manifest *m);

#endif
