/* ckpt_io.h - the file operations of a checkpoint save: every file is written under a
 * temporary name while its XXH3-64 checksum is computed, fsynced, closed and renamed into
 * place; directories are fsynced after renames. Each operation is a numbered "I/O point"
 * where tests can inject a crash or an error (DTRAIN_CKPT_FAULT, see below), so the save
 * path can be proven crash-consistent point by point.
 *
 *   dt_io_file f;
 *   DT_CHECK(dt_io_open(ctx, &f, "ckpt/step-00000010/trainer.json"));
 *   DT_CHECK(dt_io_write(ctx, &f, buf, len));            // any number of times
 *   dt_io_info info; DT_CHECK(dt_io_commit(ctx, &f, &info));  // fsync, rename, size+hash
 *   DT_CHECK(dt_io_fsync_dir(ctx, "ckpt/step-00000010"));
 *
 * Fault injection (tests only): DTRAIN_CKPT_FAULT=KIND@N[:RANK] makes the N-th I/O point
 * (1-based, counted per process from the first use) of rank RANK (default: every rank)
 * crash the process (KIND=crash: SIGKILL, as kill -9 or a power cut would), fail with
 * ENOSPC (KIND=enospc) or with EIO (KIND=eio). DTRAIN_CKPT_FAULT_LOG=1 prints each point.
 * Under `dtrain launch --max-restarts` only the first attempt (DTRAIN_RESTART=0) is faulted.
 */
#ifndef DT_CKPT_IO_H
#define DT_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_io_info {
    uint64_t size;  /* bytes in the file */
    uint64_t xxh3;  /* XXH3-64 (seed 0) of its contents */
} dt_io_info;

typedef struct dt_io_file {
    int fd;
    char path[4096], tmp[4108];
    uint64_t size;
    void *hash; /* XXH3_state_t */
} dt_io_file;

/* Creates path.tmp for writing (any stale one is truncated). */
dt_status dt_io_open(dt_ctx *ctx, dt_io_file *f, const char *path);
dt_status dt_io_write(dt_ctx *ctx, dt_io_file *f, const void *p, size_t n);
/* fsync + close + rename to the final path; info (may be NULL) gets size and checksum. On
 * failure the temporary file is removed. */
dt_status dt_io_commit(dt_ctx *ctx, dt_io_file *f, dt_io_info *info);
/* Closes and removes the temporary file (after a failure elsewhere). */
void dt_io_abort(dt_io_file *f);
/* Writes a whole small file atomically (open, write, commit). */
dt_status dt_io_write_file(dt_ctx *ctx, const char *path, const void *p, size_t n, dt_io_info *info);
dt_status dt_io_fsync_dir(dt_ctx *ctx, const char *dir);
/* mkdir -p */
dt_status dt_io_mkdirs(dt_ctx *ctx, const char *dir);
/* Size and XXH3-64 of an existing file (streamed; no mmap, so a file truncated meanwhile
 * is an error, not a SIGBUS). */
dt_status dt_io_hash_file(dt_ctx *ctx, const char *path, dt_io_info *out);
/* Reads a whole small file (at most max bytes; larger is DT_ERR_FORMAT) into *buf
 * (malloc'd, NUL-terminated; the caller frees it). */
dt_status dt_io_read_small(dt_ctx *ctx, const char *path, size_t max, char **buf, size_t *len);
/* Removes a directory and everything directly inside it (checkpoint dirs are flat). */
int dt_io_remove_dir(const char *dir);

/* XXH3-64 of a buffer. */
uint64_t dt_xxh3(const void *p, size_t n);

/* Re-reads DTRAIN_CKPT_FAULT (tests that fork call it); rank selects the ":RANK" filter. */
void dt_io_fault_reset(int rank);
/* I/O points passed so far in this process. */
long dt_io_points(void);
/* Injected faults since the last reset (0 or 1): a test can tell "the save survived the
 * fault" from "the fault never came". */
long dt_io_fault_fired(void);

#endif
