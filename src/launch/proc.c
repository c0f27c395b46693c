/* The job's processes, the start-up watch and mpirun's stderr filter (launch_impl.h). */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch/launch_impl.h"

#define PFX "dtrain launch: "

double dt_launch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the process tree */

void dt_proc_become_reaper(void) { prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

typedef struct proc_list {
    pid_t *v;
    int n, cap;
} proc_list;

static int list_push(proc_list *l, pid_t p) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        pid_t *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return 0;
}

/* The live (not zombie) descendants of this process, from /proc/PID/stat. */
static void descendants(proc_list *out) {
    out->n = 0;
    proc_list pids = {0}, ppids = {0}, dead = {0}, tree = {0};
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%.200s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        /* pid (comm) state ppid ...: comm may hold spaces and parentheses. */
        char *rp = strrchr(buf, ')'), state = 0;
        int ppid = 0;
        if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2) continue;
        if (list_push(&pids, (pid_t)atoi(e->d_name)) || list_push(&ppids, (pid_t)ppid) ||
            list_push(&dead, state == 'Z' || state == 'X'))
            break;
    }
    closedir(d);
    int n = pids.n < ppids.n ? (pids.n < dead.n ? pids.n : dead.n) : (ppids.n < dead.n ? ppids.n : dead.n);
    /* Breadth first from us: a child's children follow it. */
    list_push(&tree, getpid());
    for (int i = 0; i < tree.n; i++)
        for (int k = 0; k < n; k++)
            if (ppids.v[k] == tree.v[i] && pids.v[k] != tree.v[i]) {
                if (list_push(&tree, pids.v[k])) break;
                if (!dead.v[k]) list_push(out, pids.v[k]);
            }
    free(tree.v);
    free(pids.v);
    free(ppids.v);
    free(dead.v);
}

/* Reaps our finished children; mpirun's (pid) status is kept. */
static void reap_all(pid_t pid, int *status, int *reaped) {
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG)) > 0)
        if (r == pid) {
            if (status) *status = st;
            if (reaped) *reaped = 1;
        }
}

void dt_proc_reap_orphans(pid_t keep) {
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        /* Look first (WNOWAIT): mpirun's own exit is for the caller's waitpid. */
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0 || si.si_pid == keep) return;
        waitpid(si.si_pid, NULL, 0);
    }
}

int dt_proc_kill_tree(pid_t pid, double grace, int *status, int *reaped) {
    proc_list now = {0}, termed = {0};
    double t0 = dt_launch_now(), kill_from = t0 + grace, give_up = kill_from + 5.0;
    int signalled = 0;
    for (;;) {
        reap_all(pid, status, reaped);
        descendants(&now);
        if (now.n == 0) break;
        double t = dt_launch_now();
        if (t > give_up) break; /* D state: nothing more to do from here */
        for (int i = 0; i < now.n; i++) {
            int known = 0;
            for (int k = 0; k < termed.n && !known; k++) known = termed.v[k] == now.v[i];
            if (t >= kill_from) {
                kill(now.v[i], SIGKILL);
            } else if (!known) { /* SIGTERM once each: a dtrain rank takes a second as "now" */
                kill(now.v[i], SIGTERM);
            }
            if (!known) {
                list_push(&termed, now.v[i]);
                signalled++;
            }
        }
        usleep(20000);
    }
    free(now.v);
    free(termed.v);
    return signalled;
}

/* ---- the start-up watch */

static int safe_path(const char *s) {
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("/._-", *s)) return 0;
    return 1;
}

dt_status dt_startup_begin(dt_ctx *ctx, dt_startup *su, const dt_launch_cfg *cfg, dt_launch_cfg *out) {
    memset(su, 0, sizeof *su);
    *out = *cfg;
    out->startup_dir = NULL;
    if (!(cfg->hosts || cfg->hostfile) || cfg->connect_timeout <= 0) {
        unsetenv("DTRAIN_LAUNCH_ID"); /* ranks report only to a launcher that watches */
        return DT_OK;
    }
    su->timeout = cfg->connect_timeout;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(su->id, sizeof su->id, "%d-%lx", (int)getpid(), (unsigned long)ts.tv_nsec ^ (unsigned long)ts.tv_sec);
    if (setenv("DTRAIN_LAUNCH_ID", su->id, 1) != 0) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    /* ssh's LocalCommand is split on spaces by Open MPI and run by the user's shell: the
     * directory's path may only hold plain characters. Without it, no marks (the hosts are
     * then named from their ranks). */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || !safe_path(tmp) || strlen(tmp) > 150) tmp = "/tmp";
    snprintf(su->dir, sizeof su->dir, "%s/dtrain-launch-XXXXXX", tmp);
    if (!mkdtemp(su->dir)) {
        su->dir[0] = 0;
        return DT_OK;
    }
    char script[300];
    snprintf(script, sizeof script, "%s/mark", su->dir);
    FILE *f = fopen(script, "w");
    /* Run as DIR/up-<host>, a link to this script: leaves DIR/up-<host>.up behind. */
    int bad = !f || fputs("#!/bin/sh\n: >\"$0.up\"\n", f) < 0;
    if (f && fclose(f) != 0) bad = 1;
    if (bad || chmod(script, 0755) != 0) {
        unlink(script);
        rmdir(su->dir);
        su->dir[0] = 0;
        return DT_OK;
    }
    out->startup_dir = su->dir;
    return DT_OK;
}

/* The names ssh may be given for a host: as written, and without its domain (Open MPI drops
 * the domain of a host name unless orte_keep_fqdn_hostnames is set). */
static int short_name(const char *h, char *out, size_t n) {
    struct in6_addr a6;
    struct in_addr a4;
    const char *dot = strchr(h, '.');
    if (!dot || inet_pton(AF_INET, h, &a4) == 1 || inet_pton(AF_INET6, h, &a6) == 1) return 0;
    snprintf(out, n, "%.*s", (int)(dot - h), h);
    return 1;
}

dt_status dt_startup_reset(dt_ctx *ctx, dt_startup *su, const dt_launch_job *job) {
    if (su->timeout <= 0) return DT_OK;
    free(su->seen);
    su->seen = calloc((size_t)job->nranks + 1, 1);
    if (!su->seen) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    su->nranks = job->nranks;
    su->nseen = 0;
    su->job = job;
    free(su->named);
    if (!(su->named = calloc((size_t)job->nhosts + 1, 1))) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    if (su->dir[0] && job->ssh_marks)
        for (int i = 0; i < job->nhosts; i++) {
            char names[2][256];
            int nn = 1;
            snprintf(names[0], sizeof names[0], "%s", job->hosts[i]);
            nn += short_name(job->hosts[i], names[1], sizeof names[1]);
            for (int k = 0; k < nn; k++) {
                char link[1024];
                snprintf(link, sizeof link, "%s/up-%s.up", su->dir, names[k]);
                unlink(link); /* a mark of the previous attempt */
                snprintf(link, sizeof link, "%s/up-%s", su->dir, names[k]);
                if (symlink("mark", link) != 0 && errno != EEXIST) {
                    /* no mark for this host: it is named from its ranks */
                }
            }
        }
    su->t0 = dt_launch_now();
    su->deadline = su->t0 + su->timeout;
    return DT_OK;
}

int dt_startup_pending(const dt_startup *su) { return su->timeout > 0 && su->seen && su->nseen < su->nranks; }

/* Whether `word` occurs in `line` as a whole host name (127.0.0.1 is not in 127.0.0.10). */
static int has_word(const char *line, const char *word) {
    size_t n = strlen(word);
    for (const char *p = line; n && (p = strstr(p, word)); p++) {
        int before = p > line && (isalnum((unsigned char)p[-1]) || strchr(".-_", p[-1]));
        const char *e = p + n;
        int after = isalnum((unsigned char)*e) || *e == '-' || *e == '_' || (*e == '.' && isalnum((unsigned char)e[1]));
        if (!before && !after) return 1;
    }
    return 0;
}

int dt_startup_line(dt_startup *su, const char *line, int scan_names) {
    static const char tag[] = "dtrain-launch-started ";
    const char *p = strstr(line, tag);
    if (!p && scan_names && dt_startup_pending(su) && su->job && su->named)
        for (int i = 0; i < su->job->nhosts; i++)
            if (!su->named[i] && has_word(line, su->job->hosts[i])) su->named[i] = 1;
    if (!p || !su->id[0]) return 0;
    char id[48];
    int r;
    if (sscanf(p + sizeof tag - 1, "%47s %d", id, &r) != 2 || strcmp(id, su->id) != 0) return 0;
    if (su->seen && r >= 0 && r < su->nranks && !su->seen[r]) {
        su->seen[r] = 1;
        su->nseen++;
    }
    return 1;
}

/* Whether ssh's LocalCommand marked host h. */
static int marked(const dt_startup *su, const char *h) {
    char p[600], s[256];
    snprintf(p, sizeof p, "%s/up-%s.up", su->dir, h);
    if (access(p, F_OK) == 0) return 1;
    if (!short_name(h, s, sizeof s)) return 0;
    snprintf(p, sizeof p, "%s/up-%s.up", su->dir, s);
    return access(p, F_OK) == 0;
}

static int same_addr(const struct sockaddr *a, const struct sockaddr *b) {
    if (!a || !b || a->sa_family != b->sa_family) return 0;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

/* This machine, as Open MPI decides it (no ssh for it): "localhost", our host name (with or
 * without its domain), or an address of one of our interfaces. */
static int host_is_local(const char *h) {
    char me[256] = "", a[256], b[256];
    if (!strcmp(h, "localhost")) return 1;
    gethostname(me, sizeof me - 1);
    if (!strcmp(h, me)) return 1;
    snprintf(a, sizeof a, "%.*s", (int)strcspn(h, "."), h);
    snprintf(b, sizeof b, "%.*s", (int)strcspn(me, "."), me);
    if (!short_name(h, a, sizeof a)) snprintf(a, sizeof a, "%s", h);
    if (!strcmp(a, b)) return 1;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(h, NULL, &hints, &res) != 0) return 0;
    struct ifaddrs *ifs = NULL;
    int local = 0;
    if (getifaddrs(&ifs) == 0) {
        for (struct addrinfo *r = res; r && !local; r = r->ai_next)
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next) local = same_addr(r->ai_addr, i->ifa_addr);
        freeifaddrs(ifs);
    }
    freeaddrinfo(res);
    return local;
}

static void append(char *buf, size_t n, const char *fmt, const char *s) {
    size_t l = strlen(buf);
    if (l < n) snprintf(buf + l, n - l, fmt, s);
}

void dt_startup_describe(const dt_startup *su, const dt_launch_job *job, int deadline_passed, char *buf,
                         size_t n) {
    buf[0] = 0;
    if (su->timeout <= 0 || !su->seen || job->nhosts == 0) return;
    char silent[512] = "", slow[512] = "", within[64] = "", said[512] = "";
    int nsilent = 0, nslow = 0, nsaid = 0, first = 0;
    if (deadline_passed) snprintf(within, sizeof within, " within %d s (--connect-timeout)", su->timeout);
    for (int i = 0; i < job->nhosts; i++) {
        int k = job->host_ranks[i], seen = 0;
        for (int r = first; r < first + k && r < su->nranks; r++) seen += su->seen[r];
        first += k;
        if (k == 0 || seen == k) continue;
        if (seen == 0 && job->ssh_marks && su->dir[0] && !marked(su, job->hosts[i]) && !host_is_local(job->hosts[i])) {
            append(silent, sizeof silent, nsilent ? ", %s" : "%s", job->hosts[i]);
            nsilent++;
            if (su->named && su->named[i]) {
                append(said, sizeof said, nsaid ? ", %s" : "%s", job->hosts[i]);
                nsaid++;
            }
        } else {
            append(slow, sizeof slow, nslow ? ", %s" : "%s", job->hosts[i]);
            nslow++;
        }
    }
    if (nsilent && deadline_passed)
        snprintf(buf, n, "host%s %s did not answer%s: no ssh session (ssh -o ConnectTimeout=%d -o BatchMode=yes)",
                 nsilent > 1 ? "s" : "", silent, within, su->timeout);
    else if (nsaid) /* mpirun gave up first: the hosts ssh's errors named */
        snprintf(buf, n, "host%s %s did not answer: ssh could not open a session (its message is above)",
                 nsaid > 1 ? "s" : "", said);
    else if (nsilent)
        snprintf(buf, n, "no ssh session to host%s %s when mpirun gave up (see the messages above)",
                 nsilent > 1 ? "s" : "", silent);
    else if (nslow && deadline_passed)
        snprintf(buf, n, "the ranks of host%s %s did not start%s (%d of %d rank(s) started)", nslow > 1 ? "s" : "",
                 slow, within, su->nseen, su->nranks);
}

void dt_startup_end(dt_startup *su) {
    if (su->dir[0]) {
        DIR *d = opendir(su->dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[600];
            snprintf(p, sizeof p, "%s/%s", su->dir, e->d_name);
            unlink(p);
        }
        if (d) closedir(d);
        rmdir(su->dir);
    }
    free(su->seen);
    free(su->named);
    memset(su, 0, sizeof *su);
}

/* ---- mpirun's stderr */

static void out_write(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

/* Open MPI's help messages are framed by lines of exactly 74 dashes. */
int dt_launch_is_frame(const char *l) {
    size_t n = strcspn(l, "\r");
    if (n != 74) return 0;
    for (size_t i = 0; i < n; i++)
        if (l[i] != '-') return 0;
    return 1;
}

/* A rank's error line: "HOST:RANK error: ..." (core/log.c), perhaps after Open MPI's tag. */
static int is_rank_error(const char *l) {
    const char *p = strstr(l, " error: ");
    if (!p) return 0;
    const char *q = p;
    while (q > l && isdigit((unsigned char)q[-1])) q--;
    if (q == p || q == l || q[-1] != ':') return 0;
    for (const char *c = l; c < q - 1; c++)
        if (*c == ' ') return 0;
    return 1;
}

/* mpirun's own one-liners that follow an abort: "[host:pid] 1 more process has sent help
 * message ...", "[host:pid] Set MCA parameter "orte_base_help_aggregate" ...", and the
 * ORTE_ERROR_LOG lines of its help aggregation racing two MPI_Aborts. */
static int is_abort_noise(const char *l) {
    const char *e = l[0] == '[' ? strchr(l, ']') : NULL;
    if (!e || !memchr(l, ':', (size_t)(e - l))) return 0;
    return strstr(e, "more process") || strstr(e, "orte_base_help_aggregate") || strstr(e, "ORTE_ERROR_LOG");
}

static int blk_add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 4096;
        while (c < *len + n + 1) c *= 2;
        char *v = realloc(*b, c);
        if (!v) return -1;
        *b = v;
        *cap = c;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return 0;
}

static void close_block(dt_errfilter *f, dt_startup *su) {
    f->in_block = 0;
    if (!f->blen) return;
    if (f->rank_error) { /* mpirun's account of an error a rank has already reported */
    } else if (dt_startup_pending(su)) {
        if (blk_add(&f->held, &f->hlen, &f->hcap, f->blk, f->blen) != 0) out_write(f->fd_out, f->blk, f->blen);
    } else {
        out_write(f->fd_out, f->blk, f->blen);
    }
    f->blen = 0;
}

static void handle_line(dt_errfilter *f, char *line, size_t len, int nl, dt_startup *su) {
    /* Open MPI's banners name every host they like ("target node: h1"); ssh's errors, outside
     * them, name the host that failed. */
    if (dt_startup_line(su, line, !f->in_block && !dt_launch_is_frame(line))) return;
    if (f->in_block) {
        int frame = dt_launch_is_frame(line);
        if (blk_add(&f->blk, &f->blen, &f->bcap, line, len) != 0 || (nl && blk_add(&f->blk, &f->blen, &f->bcap, "\n", 1))) {
            out_write(f->fd_out, f->blk, f->blen); /* no memory: pass it on as it is */
            f->blen = 0;
            f->in_block = 0;
            return;
        }
        if (frame || f->blen > 65536) close_block(f, su);
        return;
    }
    if (dt_launch_is_frame(line)) {
        f->in_block = 1;
        f->blk_t = dt_launch_now();
        f->blen = 0;
        if (blk_add(&f->blk, &f->blen, &f->bcap, line, len) == 0 && (!nl || blk_add(&f->blk, &f->blen, &f->bcap, "\n", 1) == 0))
            return;
        f->in_block = 0;
    }
    if (f->rank_error && is_abort_noise(line)) return;
    if (is_rank_error(line)) f->rank_error = 1;
    out_write(f->fd_out, line, len);
    if (nl) out_write(f->fd_out, "\n", 1);
}

int dt_errfilter_pump(dt_errfilter *f, int fd, dt_startup *su) {
    ssize_t n = read(fd, f->buf + f->n, sizeof f->buf - 1 - f->n);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) return 0;
    f->n += (size_t)n;
    f->buf[f->n] = 0;
    char *start = f->buf, *nl;
    while ((nl = memchr(start, '\n', f->n - (size_t)(start - f->buf)))) {
        *nl = 0;
        handle_line(f, start, (size_t)(nl - start), 1, su);
        start = nl + 1;
    }
    size_t rest = f->n - (size_t)(start - f->buf);
    if (rest == sizeof f->buf - 1) { /* an over-long line: pass it on as it is */
        out_write(f->fd_out, f->buf, rest);
        rest = 0;
    } else {
        memmove(f->buf, start, rest);
    }
    f->n = rest;
    return 1;
}

void dt_errfilter_tick(dt_errfilter *f, const dt_startup *su) {
    if (f->hlen && !dt_startup_pending(su)) { /* the start-up went through: nothing to replace */
        out_write(f->fd_out, f->held, f->hlen);
        f->hlen = 0;
    }
    /* A frame line that opened no banner (a rank's own ruler): do not sit on its output. */
    if (f->in_block && dt_launch_now() - f->blk_t > 2.0) {
        out_write(f->fd_out, f->blk, f->blen);
        f->in_block = 0;
        f->blen = 0;
    }
}

void dt_errfilter_finish(dt_errfilter *f, int drop_held) {
    if (f->n) {
        f->buf[f->n] = 0;
        handle_line(f, f->buf, f->n, 0, &(dt_startup){0});
        f->n = 0;
    }
    if (f->in_block && f->blen) out_write(f->fd_out, f->blk, f->blen);
    f->in_block = 0;
    f->blen = 0;
    if (f->hlen && !drop_held) out_write(f->fd_out, f->held, f->hlen);
    free(f->blk);
    free(f->held);
    f->blk = f->held = NULL;
    f->bcap = f->hlen = f->hcap = 0;
}
