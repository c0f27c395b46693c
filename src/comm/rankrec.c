/* Per-rank collective records in the run directory (rankrec.h). */
#include "comm/rankrec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define REC_MAGIC "DTRANK01"

/* The file's layout: identity written once, then the hot part. Readers copy the whole struct
 * and check the magic; the hot fields are written entered-op first, seq last, so a reader
 * that races a write sees the previous seq with a possibly newer op (harmless for a hang,
 * where nothing moves). */
typedef struct rec_file {
    char magic[8];
    int32_t rank, world, pid, pad;
    char host[64], boot[40], pidns[40];
    char op[24];
    double t_entered, t_left;
    volatile uint64_t entered, left;
    int32_t peer, pad2; /* the entered operation's point-to-point peer (world rank), else -1 */
} rec_file;

struct dt_rankrec {
    rec_file *f;
};

static void read_line(const char *path, char *buf, size_t n) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(buf, (int)n, f)) buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

static void identity(char *boot, char *pidns) {
    read_line("/proc/sys/kernel/random/boot_id", boot, 40);
    ssize_t k = readlink("/proc/self/ns/pid", pidns, 39);
    pidns[k > 0 ? k : 0] = 0;
}

dt_rankrec *dt_rankrec_open(const char *dir, int rank, int world) {
    if (!dir || !*dir) return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/rank%d.rec", dir, rank);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return NULL;
    dt_rankrec *r = NULL;
    if (ftruncate(fd, sizeof(rec_file)) != 0) goto out;
    void *m = mmap(NULL, sizeof(rec_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) goto out;
    r = malloc(sizeof *r);
    if (!r) {
        munmap(m, sizeof(rec_file));
        goto out;
    }
    r->f = m;
    rec_file *f = r->f;
    memset(f, 0, sizeof *f);
    f->peer = -1;
    f->rank = rank, f->world = world, f->pid = (int32_t)getpid();
    gethostname(f->host, sizeof f->host - 1);
    identity(f->boot, f->pidns);
    memcpy(f->magic, REC_MAGIC, 8); /* last: a reader never sees a half-made identity */
out:
    close(fd); /* the mapping keeps the file */
    return r;
}

void dt_rankrec_close(dt_rankrec *r) {
    if (!r) return;
    munmap(r->f, sizeof(rec_file));
    free(r);
}

void dt_rankrec_enter(dt_rankrec *r, uint64_t seq, const char *op, int peer, double t) {
    if (!r) return;
    rec_file *f = r->f;
    strncpy(f->op, op, sizeof f->op - 1);
    f->peer = peer;
    f->t_entered = t;
    __atomic_store_n(&f->entered, seq, __ATOMIC_RELEASE);
}

void dt_rankrec_leave(dt_rankrec *r, uint64_t seq, double t) {
    if (!r) return;
    r->f->t_left = t;
    __atomic_store_n(&r->f->left, seq, __ATOMIC_RELEASE);
}

int dt_rankrec_read(const char *dir, int rank, dt_rankrec_info *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rank%d.rec", dir, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    rec_file f;
    ssize_t n = read(fd, &f, sizeof f);
    close(fd);
    if (n != (ssize_t)sizeof f || memcmp(f.magic, REC_MAGIC, 8) != 0 || f.rank != rank) return -1;
    memset(out, 0, sizeof *out);
    out->rank = f.rank, out->world = f.world, out->pid = f.pid;
    memcpy(out->host, f.host, sizeof out->host - 1);
    memcpy(out->boot, f.boot, sizeof out->boot - 1);
    memcpy(out->pidns, f.pidns, sizeof out->pidns - 1);
    memcpy(out->op, f.op, sizeof out->op - 1);
    out->entered = f.entered, out->left = f.left;
    out->peer = f.peer;
    out->t_entered = f.t_entered, out->t_left = f.t_left;
    return 0;
}

const char *dt_rankrec_state(const dt_rankrec_info *in) {
    char boot[40], pidns[40];
    identity(boot, pidns);
    if (!in->boot[0] || strcmp(boot, in->boot) || strcmp(pidns, in->pidns)) return "not visible from here";
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", in->pid);
    read_line(path, line, sizeof line);
    /* "pid (comm) S ...": the state follows the last ')' (comm may hold spaces or parens). */
    const char *p = strrchr(line, ')');
    if (!line[0] || !p || !p[1] || !p[2]) return "gone";
    switch (p[2]) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "D-state (uninterruptible)";
    case 'T': return "stopped";
    case 't': return "stopped (traced)";
    case 'Z': return "zombie";
    case 'X': return "gone";
    }
    return "unknown";
}

int dt_rankrec_inside(const dt_rankrec_info *in) { return in->entered > 0 && in->left < in->entered; }

/* Whether rank r's watchdog fired (it dumped "state=blocked"): a gone rank that timed out. */
static int fired(const char *dir, int r) {
    char path[4200], line[128];
    snprintf(path, sizeof path, "%s/watchdog-rank%d.txt", dir, r);
    read_line(path, line, sizeof line);
    return strstr(line, " state=blocked ") != NULL;
}

static int cannot_run(const char *s) {
    return !strncmp(s, "stopped", 7) || !strncmp(s, "D-state", 7) || !strcmp(s, "zombie") || !strcmp(s, "gone");
}

int dt_rankrec_chain(const char *dir, int world, const unsigned char *stop, int live, int *chain, int n, int max,
                     dt_chain_end *end) {
    for (;;) {
        const int p = chain[n - 1];
        dt_rankrec_info in;
        if (stop && p >= 0 && p < world && stop[p]) return *end = DT_CHAIN_STOP, n;
        if (p < 0 || p >= world || dt_rankrec_read(dir, p, &in) != 0) return *end = DT_CHAIN_NORECORD, n;
        if (live) {
            const char *s = dt_rankrec_state(&in);
            if (cannot_run(s) && !(!strcmp(s, "gone") && dt_rankrec_inside(&in) && fired(dir, p)))
                return *end = DT_CHAIN_DEAD, n;
        }
        if (!dt_rankrec_inside(&in)) return *end = DT_CHAIN_OUTSIDE, n;
        if (in.peer < 0) return *end = DT_CHAIN_COLLECTIVE, n;
        for (int i = 0; i < n; i++)
            if (chain[i] == in.peer) return *end = DT_CHAIN_CYCLE, n;
        if (n >= max) return *end = DT_CHAIN_LONG, n;
        chain[n++] = in.peer;
    }
}

const char *dt_chain_end_name(dt_chain_end e) {
    switch (e) {
    case DT_CHAIN_OUTSIDE: return "in no operation";
    case DT_CHAIN_DEAD: return "cannot run";
    case DT_CHAIN_COLLECTIVE: return "waits in a collective";
    case DT_CHAIN_NORECORD: return "no record";
    case DT_CHAIN_STOP: return "named";
    case DT_CHAIN_CYCLE: return "waits on a rank earlier in the chain (a deadlock)";
    case DT_CHAIN_LONG: return "chain too long";
    }
    return "?";
}
