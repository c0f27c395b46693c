/* lock.h - an exclusive lock on a directory that a run writes into (checkpoint.dir, the
 * OUT_DIR of `dtrain ckpt merge`/`export`): two runs on one checkpoint.dir delete each
 * other's steps (keep_last) and interleave their `latest`, so the second one is refused.
 *
 *   dt_ckpt_lock *lk;
 *   DT_CHECK(dt_ckpt_lock_acquire(ctx, "ckpt", "checkpoint.dir ", "dtrain train", &lk));
 *   ... write into ckpt/ ...
 *   dt_ckpt_lock_release(lk);
 *
 * The lock is DIR/.lock (DT_CKPT_LOCK_NAME) with a write lock on the whole file by
 * fcntl(F_SETLK): POSIX record locks also work across hosts on NFS with locking (lockd,
 * NFSv4), and the kernel drops them when the holding process dies, however it dies. While
 * held, the file says who holds it (host, pid, start time, command, a random token; format
 * below). A clean release removes the file; so a file with content whose fcntl lock nobody
 * holds is a stale lock (its process died): it is taken over with a warning naming that
 * process. A lock held by a live process is refused, in < 1 s, with DT_ERR_CONFIG (exit
 * status 2) and one line naming its command, pid, host and start time.
 *
 * Inherited locks (the supervisor): `dtrain launch --max-restarts` takes the lock on the
 * job's checkpoint.dir itself, holds it across its restarts, and exports its token in
 * DTRAIN_CKPT_LOCK (DT_CKPT_LOCK_ENV; forwarded to every rank as every DTRAIN_* variable).
 * A process that finds the lock held, by a lock file whose token is that variable's (and,
 * when the file names this host, whose fcntl holder is the pid it names), accepts it as its
 * supervisor's: dt_ckpt_lock_acquire succeeds without holding anything
 * (dt_ckpt_lock_inherited), and its release does nothing.
 *
 * fcntl locks belong to a process and are released when the process closes ANY descriptor
 * of the file: a process must not open DIR/.lock of a lock it holds. This module keeps the
 * locks it holds and refuses to take one of them twice (DT_ERR_CONFIG).
 *
 * Lock file format (text, one "key: value" per line, after a first line "dtrain-lock 1"):
 *   host, pid, started (ISO 8601 local time with offset, e.g. 2026-05-01T12:00:00+0200),
 *   command (e.g. "dtrain train"), token (16 hex digits).
 * Readers (eval, sample, export's source, ckpt verify/info) never look at it: they scan only
 * step-* directories and `latest`. */
#ifndef DT_CKPT_LOCK_H
#define DT_CKPT_LOCK_H

#include "core/status.h"

#define DT_CKPT_LOCK_NAME ".lock"
#define DT_CKPT_LOCK_ENV "DTRAIN_CKPT_LOCK"

typedef struct dt_ckpt_lock dt_ckpt_lock;

/* What a lock file says. */
typedef struct dt_ckpt_lock_info {
    char host[256];
    long pid;
    char started[64];
    char command[64];
    char token[40];
} dt_ckpt_lock_info;

/* Takes the lock on dir (created if missing). label prefixes dir in messages
 * ("checkpoint.dir "); command is written into the lock file and names this process in the
 * refusal another one gets. Errors: DT_ERR_CONFIG when another live process (not this
 * process's supervisor) holds it or this process holds it already, DT_ERR_IO when dir or the
 * lock file cannot be created. On a file system without fcntl locks it warns that a second
 * run will not be detected and goes on with the file only. */
dt_status dt_ckpt_lock_acquire(dt_ctx *ctx, const char *dir, const char *label, const char *command,
                               dt_ckpt_lock **out);
/* Removes the lock file and releases the lock (an inherited lock: nothing). NULL: no-op. */
void dt_ckpt_lock_release(dt_ckpt_lock *l);
/* The token written into the lock file (for DT_CKPT_LOCK_ENV); "" for an inherited lock. */
const char *dt_ckpt_lock_token(const dt_ckpt_lock *l);
/* 1 when acquire accepted the supervisor's lock instead of taking one. */
int dt_ckpt_lock_inherited(const dt_ckpt_lock *l);
/* Parses lock file text (len bytes). Returns 1 when it names a host and a pid. */
int dt_ckpt_lock_parse(const char *text, size_t len, dt_ckpt_lock_info *out);

#endif
