/* The lock on a directory that a run writes into (lock.h). */
#include "ckpt/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_io.h"
#include "core/log.h"

struct dt_ckpt_lock {
    int fd;            /* -1: inherited from the supervisor, or no fcntl lock on this file system */
    int inherited;
    char path[4200];
    char token[40];
    struct dt_ckpt_lock *next; /* the locks this process holds */
};

static dt_ckpt_lock *held; /* acquisition happens at a command's start, on its main thread */

static void make_token(char *out, size_t n) {
    unsigned long long v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((unsigned long long)ts.tv_sec * 1000000007ull) ^ (unsigned long long)ts.tv_nsec ^
            ((unsigned long long)getpid() << 32);
    }
    if (fd >= 0) close(fd);
    snprintf(out, n, "%016llx", v);
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

int dt_ckpt_lock_parse(const char *text, size_t len, dt_ckpt_lock_info *out) {
    memset(out, 0, sizeof *out);
    out->pid = -1;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char line[512];
        if (l >= sizeof line) l = sizeof line - 1;
        memcpy(line, p, l);
        line[l] = 0;
        p += l + (nl ? 1 : 0);
        if (nl == NULL) p = end;
        char *colon = strchr(line, ':');
        if (!colon || colon[1] != ' ') continue;
        *colon = 0;
        char *v = colon + 2;
        trim(v);
        if (!strcmp(line, "host")) snprintf(out->host, sizeof out->host, "%s", v);
        else if (!strcmp(line, "pid")) out->pid = strtol(v, NULL, 10);
        else if (!strcmp(line, "started")) snprintf(out->started, sizeof out->started, "%s", v);
        else if (!strcmp(line, "command")) snprintf(out->command, sizeof out->command, "%s", v);
        else if (!strcmp(line, "token")) snprintf(out->token, sizeof out->token, "%s", v);
    }
    return out->host[0] && out->pid > 0;
}

/* The lock file's text, read through fd (at most 4 KiB). */
static size_t read_text(int fd, char *buf, size_t n) {
    ssize_t r = pread(fd, buf, n - 1, 0);
    size_t len = r > 0 ? (size_t)r : 0;
    buf[len] = 0;
    return len;
}

static int same_host(const dt_ctx *ctx, const char *host) { return !strcmp(ctx->host, host); }

/* "dtrain train pid 1234 on host h (started T)" */
static void describe(const dt_ckpt_lock_info *in, char *out, size_t n) {
    snprintf(out, n, "%s pid %ld on host %s (started %s)", in->command[0] ? in->command : "a run", in->pid, in->host,
             in->started[0] ? in->started : "at an unknown time");
}

static int held_here(const char *path) {
    struct stat a, b;
    if (stat(path, &a) != 0) return 0;
    for (dt_ckpt_lock *l = held; l; l = l->next)
        if (l->fd >= 0 && fstat(l->fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return 1;
    return 0;
}

/* Another process holds the lock on fd's file: the supervisor's (inherited) or a refusal. */
static dt_status contended(dt_ctx *ctx, int fd, const char *dir, const char *label, dt_ckpt_lock *l) {
    char text[4096];
    dt_ckpt_lock_info in;
    int ok = 0;
    /* The holder writes its line right after locking: give it a moment (< 0.5 s). */
    for (int tries = 0; tries < 50 && !(ok = dt_ckpt_lock_parse(text, read_text(fd, text, sizeof text), &in)); tries++)
        usleep(10000);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    long holder = fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK ? (long)fl.l_pid : -1;
    const char *env = getenv(DT_CKPT_LOCK_ENV);
    if (ok && env && env[0] && in.token[0] && !strcmp(env, in.token) &&
        (!same_host(ctx, in.host) || holder == in.pid)) {
        l->fd = -1;
        l->inherited = 1;
        char who[512];
        describe(&in, who, sizeof who);
        dt_log_info(ctx, "%s%s: locked by this run's supervisor, %s", label, dir, who);
        return DT_OK;
    }
    if (!ok)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s%s is in use by another process (pid %ld per fcntl; its lock file %s "
                       "names no run): two runs must not share a checkpoint directory", label, dir, holder, l->path);
    char who[512];
    describe(&in, who, sizeof who);
    return dt_fail(ctx, DT_ERR_CONFIG, "%s%s is in use by %s: two runs must not share a checkpoint directory", label,
                   dir, who);
}

/* We hold the lock: say so in the file, after a warning about a stale holder it names. */
static dt_status take(dt_ctx *ctx, int fd, const char *dir, const char *label, const char *command,
                      dt_ckpt_lock *l) {
    char text[4096];
    dt_ckpt_lock_info in;
    if (dt_ckpt_lock_parse(text, read_text(fd, text, sizeof text), &in)) {
        char who[512];
        describe(&in, who, sizeof who);
        const char *why = "its process ended without releasing it";
        if (same_host(ctx, in.host) && kill((pid_t)in.pid, 0) != 0 && errno == ESRCH)
            why = "that process is no longer running";
        else if (!same_host(ctx, in.host))
            why = "its process ended without releasing it, or its host lost the lock";
        dt_log_warn(ctx, "%s%s: taking over the stale lock of %s: %s", label, dir, who, why);
    }
    make_token(l->token, sizeof l->token);
    time_t now = time(NULL);
    struct tm tm;
    char started[64];
    localtime_r(&now, &tm);
    strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%S%z", &tm);
    int n = snprintf(text, sizeof text, "dtrain-lock 1\nhost: %s\npid: %ld\nstarted: %s\ncommand: %s\ntoken: %s\n",
                     ctx->host, (long)getpid(), started, command, l->token);
    /* fsync: another host reads it over NFS. */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n || fsync(fd) != 0)
        return dt_fail(ctx, DT_ERR_IO, "%s%s: cannot write the lock file %s: %s", label, dir, l->path, strerror(errno));
    return DT_OK;
}

dt_status dt_ckpt_lock_acquire(dt_ctx *ctx, const char *dir, const char *label, const char *command,
                               dt_ckpt_lock **out) {
    *out = NULL;
    label = label ? label : "";
    DT_CHECK(dt_io_mkdirs(ctx, dir));
    dt_ckpt_lock *l = calloc(1, sizeof *l);
    if (!l) return dt_fail(ctx, DT_ERR_NOMEM, "lock: out of memory");
    l->fd = -1;
    snprintf(l->path, sizeof l->path, "%s/" DT_CKPT_LOCK_NAME, dir);
    if (held_here(l->path)) {
        free(l);
        return dt_fail(ctx, DT_ERR_CONFIG, "%s%s is locked by this process already", label, dir);
    }
    dt_status st = DT_OK;
    /* A holder releases by removing the file, then closing it: a lock won on a file that is
     * no longer the one at the path was won on a released one, so try again. */
    for (int attempt = 0;; attempt++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            st = dt_fail(ctx, DT_ERR_IO, "%s%s: cannot create the lock file %s: %s", label, dir, l->path,
                         strerror(errno));
            break;
        }
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
        if (fcntl(fd, F_SETLK, &fl) != 0) {
            int e = errno;
            if (e == EACCES || e == EAGAIN) {
                st = contended(ctx, fd, dir, label, l);
                close(fd); /* this process holds no lock on it: closing releases nothing */
                break;
            }
            /* ENOLCK, EOPNOTSUPP, ...: no record locks here (NFS mounted with nolock). */
            dt_log_warn(ctx, "%s%s: cannot lock %s (%s): this file system has no fcntl locks, so a second run on "
                        "this directory will not be detected", label, dir, l->path, strerror(e));
            st = take(ctx, fd, dir, label, command, l);
            if (st == DT_OK) l->fd = fd;
            else close(fd);
            break;
        }
        struct stat a, b;
        if (attempt < 100 && (fstat(fd, &a) != 0 || stat(l->path, &b) != 0 || a.st_dev != b.st_dev ||
                              a.st_ino != b.st_ino)) {
            close(fd);
            continue;
        }
        st = take(ctx, fd, dir, label, command, l);
        if (st != DT_OK) {
            unlink(l->path);
            close(fd);
            break;
        }
        l->fd = fd;
        break;
    }
    if (st != DT_OK) {
        free(l);
        return st;
    }
    if (!l->inherited) {
        l->next = held;
        held = l;
    }
    *out = l;
    return DT_OK;
}

void dt_ckpt_lock_release(dt_ckpt_lock *l) {
    if (!l) return;
    for (dt_ckpt_lock **p = &held; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    if (l->fd >= 0) {
        unlink(l->path); /* first: whoever waits on this file must see that it is gone */
        close(l->fd);
    }
    free(l);
}

const char *dt_ckpt_lock_token(const dt_ckpt_lock *l) { return l && !l->inherited ? l->token : ""; }

int dt_ckpt_lock_inherited(const dt_ckpt_lock *l) { return l && l->inherited; }
