/* The supervisor: run, watch, report, restart (launch.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/rankrec.h"
#include "launch/launch_impl.h"

extern char **environ;

#define PFX "dtrain launch: "

static volatile sig_atomic_t sv_signal; /* a preemption signal arrived (its number) */
static volatile sig_atomic_t sv_count;  /* how many: a second one ends the job at once */

/* mpirun runs in its own process group, so a signal to our group (a terminal's ^C, timeout(1))
 * reaches only us and becomes a graceful preemption. */
static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc, (void)si;
    if (!sv_signal) sv_signal = sig;
    sv_count++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "HH:MM:SS.mmm" of the wall clock, for log lines that tests line up with a kill. */
static const char *stamp(char *buf, size_t n) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    snprintf(buf, n, "%02d:%02d:%02d.%03ld", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    return buf;
}

#define SV_LOG(...)                                                                      \
    do {                                                                                 \
        char ts_[32];                                                                    \
        fprintf(stderr, PFX "[%s] ", stamp(ts_, sizeof ts_));                            \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                             \
        fflush(stderr);                                                                  \
    } while (0)

/* What one attempt's output told us. */
typedef struct attempt_info {
    int rank, sig, code;   /* the first failing rank (-1: unknown), its signal or exit code */
    int first_step_seen;   /* a "step N/M" progress line appeared */
    double first_step_t;
    double fail_t;         /* when mpirun's output first named a failed rank (0: not yet) */
    char startup[640];     /* the start-up failed: which host(s) did not answer */
} attempt_info;

/* Scans one line of mpirun's output. */
static void scan_line(const char *l, attempt_info *a, double t) {
    const char *p;
    int r, s;
    if ((p = strstr(l, "process rank ")) && sscanf(p, "process rank %d with PID %*d on node %*s exited on signal %d", &r, &s) == 2) {
        if (a->rank < 0) {
            a->rank = r;
            a->sig = s;
            if (!a->fail_t) a->fail_t = t;
        }
    } else if ((p = strstr(l, "Process name: [[")) && sscanf(p, "Process name: [[%*d,%*d],%d]", &r) == 1) {
        if (a->rank < 0) a->rank = r;
        if (!a->fail_t) a->fail_t = t;
    } else if ((p = strstr(l, "Exit code:")) && sscanf(p, "Exit code: %d", &s) == 1) {
        if (!a->code) a->code = s;
    }
    long x, y;
    if (!a->first_step_seen && (p = strstr(l, " step ")) && sscanf(p, " step %ld/%ld", &x, &y) == 2) {
        a->first_step_seen = 1;
        a->first_step_t = t;
    }
}

typedef struct line_buf {
    char b[8192];
    size_t n;
    int in_banner; /* between the frames of an Open MPI banner */
} line_buf;

/* Forwards what is readable on fd to out, scanning complete lines; the ranks' start-up
 * reports are taken out. Returns 0 at EOF. */
static int pump(int fd, FILE *out, line_buf *lb, attempt_info *a, dt_startup *su) {
    ssize_t n = read(fd, lb->b + lb->n, sizeof lb->b - 1 - lb->n);
    if (n < 0) return errno == EINTR || errno == EAGAIN;
    if (n == 0) {
        if (lb->n) {
            fwrite(lb->b, 1, lb->n, out);
            lb->n = 0;
        }
        fflush(out);
        return 0;
    }
    lb->n += (size_t)n;
    lb->b[lb->n] = 0;
    char *start = lb->b, *nl;
    while ((nl = memchr(start, '\n', lb->n - (size_t)(start - lb->b)))) {
        *nl = 0;
        int frame = dt_launch_is_frame(start);
        if (frame) lb->in_banner = !lb->in_banner;
        if (!dt_startup_line(su, start, !frame && !lb->in_banner)) {
            scan_line(start, a, now_s());
            fputs(start, out);
            fputc('\n', out);
        }
        start = nl + 1;
    }
    size_t rest = lb->n - (size_t)(start - lb->b);
    if (rest == sizeof lb->b - 1) { /* an over-long line: pass it on as it is */
        fwrite(lb->b, 1, rest, out);
        rest = 0;
    } else {
        memmove(lb->b, start, rest);
    }
    lb->n = rest;
    fflush(out);
    return 1;
}

/* Runs one attempt: mpirun with stdout/stderr piped through us. */
static dt_status run_attempt(dt_ctx *ctx, const dt_launch_job *job, dt_startup *su, double grace, int *code,
                             attempt_info *a, int *preempted, int attempt, double failed_at) {
    int po[2], pe[2];
    line_buf *lo = calloc(1, sizeof *lo), *le = calloc(1, sizeof *le); /* before mpirun starts */
    if (!lo || !le) {
        free(lo), free(le);
        return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    }
    if (pipe(po) != 0 || pipe(pe) != 0) {
        free(lo), free(le);
        return dt_fail(ctx, DT_ERR_BACKEND, PFX "pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, pe[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, po[0]);
    posix_spawn_file_actions_addclose(&fa, pe[0]);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int err = posix_spawn(&pid, job->argv[0], &fa, &attr, job->argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(po[1]);
    close(pe[1]);
    if (err) {
        close(po[0]);
        close(pe[0]);
        free(lo), free(le);
        return dt_fail(ctx, DT_ERR_BACKEND, PFX "cannot start %s: %s", job->argv[0], strerror(err));
    }
    int open_o = 1, open_e = 1, exited = 0, status = 0, forwarded = 0;
    double term_at = 0, kill_at = 0, fwd_t = 0;
    int fwd_count = 0, told = 0, fail_told = 0, stopped = 0;
    while (open_o || open_e || !exited) {
        struct pollfd fds[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
        int pr = poll(fds, 2, 100);
        if (pr > 0) {
            if (open_o && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) open_o = pump(po[0], stdout, lo, a, su);
            if (open_e && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) open_e = pump(pe[0], stderr, le, a, su);
        }
        if (a->fail_t > 0 && !fail_told) {
            SV_LOG("failure detected: mpirun reports rank %d %s", a->rank, a->sig ? "killed by a signal" : "exited");
            fail_told = 1;
        }
        if (attempt > 0 && a->first_step_seen && !told) {
            SV_LOG("recovered: first step after restart %d logged %.2f s after the failure was detected", attempt,
                   a->first_step_t - failed_at);
            told = 1;
        }
        if (!exited) {
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) {
                exited = 1;
                /* Ranks that outlive mpirun may hold the pipes: read what is there, then stop. */
                double until = now_s() + 2.0;
                while ((open_o || open_e) && now_s() < until) {
                    struct pollfd f2[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
                    if (poll(f2, 2, 50) <= 0) break;
                    if (open_o && (f2[0].revents & (POLLIN | POLLHUP | POLLERR))) open_o = pump(po[0], stdout, lo, a, su);
                    if (open_e && (f2[1].revents & (POLLIN | POLLHUP | POLLERR))) open_e = pump(pe[0], stderr, le, a, su);
                }
                break;
            }
        }
        dt_proc_reap_orphans(pid);
        /* A start-up that does not finish in time, or a signal before every rank runs (nothing
         * to checkpoint yet): the job ends now, with everything it started. */
        int pending = dt_startup_pending(su);
        if (pending && (sv_signal || now_s() > su->deadline)) {
            if (sv_signal) {
                SV_LOG("preemption (signal %d, %s) before all ranks had started (%d of %d): stopping the job",
                       (int)sv_signal, strsignal(sv_signal), su->nseen, su->nranks);
                *preempted = 1;
            } else {
                dt_startup_describe(su, job, 1, a->startup, sizeof a->startup);
                if (!a->startup[0]) snprintf(a->startup, sizeof a->startup, "the start-up did not finish within %d s (--connect-timeout)", su->timeout);
            }
            int reaped = 0;
            dt_proc_kill_tree(pid, 2.0, &status, &reaped);
            while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            exited = stopped = 1;
            for (double until = now_s() + 2.0; (open_o || open_e) && now_s() < until;) {
                struct pollfd f2[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
                if (poll(f2, 2, 50) <= 0) break;
                if (open_o && (f2[0].revents & (POLLIN | POLLHUP | POLLERR))) open_o = pump(po[0], stdout, lo, a, su);
                if (open_e && (f2[1].revents & (POLLIN | POLLHUP | POLLERR))) open_e = pump(pe[0], stderr, le, a, su);
            }
            break;
        }
        if (sv_signal && !forwarded) {
            SV_LOG("preemption (signal %d, %s): asking every rank to checkpoint and exit (grace %.0f s)", (int)sv_signal,
                   strsignal(sv_signal), grace);
            kill(pid, SIGUSR1); /* mpirun passes SIGUSR1 on to every rank */
            forwarded = 1;
            *preempted = 1;
            term_at = now_s() + grace;
            fwd_t = now_s();
            fwd_count = sv_count;
        }
        /* Another signal a second or more later (a second ^C) ends the job now; copies of the
         * first that arrive together (timeout(1) forwarding, a process-group kill) do not. */
        int again = 0;
        if (forwarded && sv_count > fwd_count) {
            if (now_s() - fwd_t > 1.0) again = 1;
            else fwd_count = sv_count;
        }
        if (term_at > 0 && (now_s() > term_at || again)) {
            SV_LOG("%s: terminating the job", again ? "a second signal" : "the grace period passed");
            kill(pid, SIGTERM);
            term_at = 0;
            kill_at = now_s() + 10.0;
        }
        if (kill_at > 0 && now_s() > kill_at) {
            kill(pid, SIGKILL);
            kill_at = 0;
        }
    }
    if (!stopped && dt_startup_pending(su) && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        dt_startup_describe(su, job, 0, a->startup, sizeof a->startup); /* mpirun gave up first */
    /* Whatever mpirun left (an ssh, a hung rank) is ended by the caller once the failure has
     * been reported: its state is part of the report, and the report should not wait. */
    close(po[0]);
    close(pe[0]);
    free(lo);
    free(le);
    *code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (stopped && !*preempted && *code == 0) *code = 1;
    return DT_OK;
}

/* What the watchdog dumps and the rank records of one attempt say about a hang. */
typedef struct hang_info {
    long seq;               /* the collective the blocked ranks timed out in (-1: no hang) */
    char op[64];
    char waiting[256];      /* the ranks blocked in it */
    char culprit[1024];     /* "rank 1 on vm (pid 42, stopped)", for the one-line summary */
    char detail[2048];      /* their last collectives */
    char hosts[8][64];      /* the culprits' hosts */
    int nhosts;
    int peer;               /* the first dump's operation is point-to-point with this world rank; -1: a collective */
    char chain[1024];       /* the chains of point-to-point waits, "rank 0 -> rank 1 -> rank 2; rank 3 -> rank 2" */
} hang_info;

static void add_host(hang_info *h, const char *host) {
    for (int i = 0; i < h->nhosts; i++)
        if (!strcmp(h->hosts[i], host)) return;
    if (h->nhosts < 8) snprintf(h->hosts[h->nhosts++], sizeof h->hosts[0], "%s", host);
}

static void add_culprit(hang_info *h, int rank, const char *host, int pid, const char *state, long last,
                        const char *op, double age) {
    size_t l = strlen(h->culprit), d = strlen(h->detail);
    if (l < sizeof h->culprit - 96)
        snprintf(h->culprit + l, sizeof h->culprit - l, "%srank %d on %s (pid %d, %s)", l ? ", " : "", rank, host,
                 pid, state);
    if (d < sizeof h->detail - 128) {
        if (last > 0)
            snprintf(h->detail + d, sizeof h->detail - d, "%srank %d last entered #%ld %s %.1f s before", d ? "; " : "",
                     rank, last, op, age);
        else
            snprintf(h->detail + d, sizeof h->detail - d, "%srank %d entered no collective", d ? "; " : "", rank);
    }
    add_host(h, host);
}

/* The chains of point-to-point waits the records show (rankrec.h dt_rankrec_chain, records
 * only: the processes are gone by now), each from a rank that waits in a point-to-point
 * operation and on which no other waiting rank waits, to its end: a culprit the dumps named
 * (named[r]), else a rank in no operation - named now when no dump named anyone (a stage that
 * stopped outside every operation, its state as now seen). A chain through a culprit's own
 * wait stops at the culprit (a stage stopped inside a receive is where the chain ends). */
static void wait_chains(const char *dir, int nranks, unsigned char *named, hang_info *h) {
    int *to = malloc((size_t)nranks * sizeof(int)), *chain = malloc((size_t)nranks * sizeof(int));
    if (!to || !chain || nranks < 2) goto out;
    for (int r = 0; r < nranks; r++) {
        dt_rankrec_info in;
        to[r] = dt_rankrec_read(dir, r, &in) == 0 && dt_rankrec_inside(&in) && !named[r] ? in.peer : -1;
    }
    for (int r = 0; r < nranks; r++) {
        int waited_on = 0;
        for (int q = 0; q < nranks; q++) waited_on |= to[q] == r;
        if (to[r] < 0 || waited_on) continue;
        dt_chain_end end;
        chain[0] = r, chain[1] = to[r];
        int n = dt_rankrec_chain(dir, nranks, named, 0, chain, 2, nranks, &end);
        int e = chain[n - 1];
        dt_rankrec_info in;
        if (!h->culprit[0] && end == DT_CHAIN_OUTSIDE && dt_rankrec_read(dir, e, &in) == 0) {
            add_culprit(h, e, in.host, in.pid, dt_rankrec_state(&in), (long)in.entered, in.op, 0.0);
            named[e] = 1;
        }
        size_t l = strlen(h->chain);
        for (int i = 0; i < n && l < sizeof h->chain - 1; i++)
            l += (size_t)snprintf(h->chain + l, sizeof h->chain - l, "%srank %d", i ? " -> " : l ? "; " : "", chain[i]);
        if (l < sizeof h->chain - 1 && end != DT_CHAIN_STOP)
            snprintf(h->chain + l, sizeof h->chain - l, " (%s)", dt_chain_end_name(end));
    }
out:
    free(to);
    free(chain);
}

/* Reads the attempt's watchdog dumps (the blocked ranks' view, with the culprits and their
 * process state as seen when the watchdog fired) and, for ranks no dump names, the records
 * every rank left in the run directory (rankrec.h). */
static void analyze_hang(const char *dir, int nranks, hang_info *h) {
    memset(h, 0, sizeof *h);
    h->seq = -1;
    h->peer = -1;
    snprintf(h->op, sizeof h->op, "?");
    unsigned char *named = calloc((size_t)nranks, 1);
    if (!named) return;
    /* The first watchdogs to fire speak for the hang. A rank that was stopped and is woken
     * when mpirun ends the job (SIGCONT before the kill) dumps later, blaming the ranks that
     * have gone by then: dumps more than 3 s after the first (a tick and the grace) are not
     * counted. */
    double first = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < nranks; r++) {
            char p[4200], line[512];
            snprintf(p, sizeof p, "%s/watchdog-rank%d.txt", dir, r);
            FILE *f = fopen(p, "r");
            if (!f) continue;
            char st[32] = "", o[64] = "";
            int rr, pr = -1;
            long s;
            double t = 0;
            if (fgets(line, sizeof line, f) &&
                sscanf(line, "dtrain-watchdog rank=%d state=%31s seq=%ld op=%63s time=%lf peer=%d", &rr, st, &s, o, &t,
                       &pr) >= 4 &&
                rr == r && !strcmp(st, "blocked")) {
                if (pass == 0) {
                    if (t > 0 && (first == 0 || t < first)) first = t;
                } else if (t == 0 || first == 0 || t <= first + 3.0) {
                    /* Culprits from the first dump only: the ranks that fired later saw the
                     * job already coming down (peers gone). */
                    int authoritative = t == first || first == 0;
                    if (authoritative && h->seq < 0) { /* the collective the first dump timed out in */
                        h->seq = s;
                        h->peer = pr;
                        snprintf(h->op, sizeof h->op, "%s", o);
                    }
                    size_t l = strlen(h->waiting);
                    if (l < sizeof h->waiting - 16)
                        snprintf(h->waiting + l, sizeof h->waiting - l, "%s%d", l ? ", " : "", r);
                    while (authoritative && fgets(line, sizeof line, f) && !strncmp(line, "culprit ", 8)) {
                        int cr, pid, n = 0;
                        long last;
                        double age;
                        char host[64], op[32];
                        line[strcspn(line, "\n")] = 0;
                        if (sscanf(line, "culprit rank=%d pid=%d last=%ld age=%lf host=%63s op=%31s state=%n", &cr, &pid,
                                   &last, &age, host, op, &n) == 6 && n > 0 && cr >= 0 && cr < nranks && !named[cr]) {
                            named[cr] = 1;
                            add_culprit(h, cr, host, pid, line + n, last, op, age);
                        }
                    }
                }
            }
            fclose(f);
        }
    /* No dump named anyone (no records when the watchdogs fired): from the records, as seen
     * now, the ranks outside every collective short of the stuck one; failing those, the
     * ranks inside it whose watchdog never reported (a stopped process runs no thread). */
    for (int level = 0; level < 2 && h->seq >= 0 && !h->culprit[0]; level++)
        for (int r = 0; r < nranks; r++) {
            char p[4200];
            snprintf(p, sizeof p, "%s/watchdog-rank%d.txt", dir, r);
            dt_rankrec_info in;
            if (named[r] || dt_rankrec_read(dir, r, &in) != 0) continue;
            if (level == 0 && (long)in.entered < h->seq && in.left == in.entered)
                add_culprit(h, r, in.host, in.pid, dt_rankrec_state(&in), (long)in.entered, in.op, 0.0);
            else if (level == 1 && (long)in.entered == h->seq && in.left < in.entered && access(p, F_OK) != 0)
                add_culprit(h, r, in.host, in.pid, "inside it, silent: no watchdog report", (long)in.entered, in.op,
                            0.0);
        }
    if (h->seq >= 0) wait_chains(dir, nranks, named, h);
    free(named);
}

/* ---- elastic restarts (--min-ranks): which hosts still answer */

#define PROBE_TIMEOUT_S 10.0
#define MAX_HOSTS 64

/* Runs `dtrain --version` through mpirun on each host of `hosts` ("h1:2,h2:2") at once and
 * writes those that answered within PROBE_TIMEOUT_S into `alive` (same syntax) and their
 * slots into *slots; the others are named in `gone`. */
static void probe_hosts(const dt_launch_cfg *cfg, const char *hosts, char *alive, size_t na, char *gone, size_t ng,
                        int *slots, int *nalive) {
    char names[MAX_HOSTS][160];
    int sl[MAX_HOSTS], n = 0;
    pid_t pid[MAX_HOSTS];
    int ok[MAX_HOSTS];
    const char *p = hosts;
    while (*p && n < MAX_HOSTS) {
        size_t len = strcspn(p, ",");
        char item[160];
        size_t k = len < sizeof item - 1 ? len : sizeof item - 1;
        memcpy(item, p, k);
        item[k] = 0;
        char *colon = strchr(item, ':');
        sl[n] = colon ? atoi(colon + 1) : 1;
        if (colon) *colon = 0;
        memcpy(names[n], item, sizeof names[0]);
        n++;
        p += len + (p[len] == ',');
    }
    static char *vargs[] = {"--version", NULL};
    for (int i = 0; i < n; i++) {
        pid[i] = -1, ok[i] = 0;
        char one[176];
        snprintf(one, sizeof one, "%.159s:1", names[i]);
        dt_launch_cfg pc = *cfg;
        pc.nranks = 1, pc.hosts = one, pc.hostfile = NULL, pc.simulate_nodes = 0, pc.ranks_per_node = 0;
        pc.argc = 1, pc.argv = vargs, pc.startup_dir = NULL; /* ssh's ConnectTimeout is kept */
        dt_ctx pctx;
        dt_ctx_init(&pctx);
        dt_launch_job job;
        if (dt_launch_init(&pctx, &pc, &job) != DT_OK) continue;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t at;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        posix_spawnattr_init(&at);
        posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&at, 0);
        if (posix_spawn(&pid[i], job.argv[0], &fa, &at, job.argv, environ) != 0) pid[i] = -1;
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&at);
        dt_launch_free(&job);
    }
    double until = now_s() + PROBE_TIMEOUT_S;
    for (int left = n; left > 0 && now_s() < until;) {
        left = 0;
        for (int i = 0; i < n; i++) {
            if (pid[i] <= 0) continue;
            int status;
            pid_t r = waitpid(pid[i], &status, WNOHANG);
            if (r == pid[i]) {
                ok[i] = WIFEXITED(status) && WEXITSTATUS(status) == 0;
                pid[i] = 0;
            } else {
                left++;
            }
        }
        if (left) usleep(50000);
    }
    for (int i = 0; i < n; i++)
        if (pid[i] > 0) { /* no answer in time: the whole mpirun group goes */
            kill(-pid[i], SIGKILL);
            waitpid(pid[i], NULL, 0);
        }
    /* ...and what it started outside its group (Open MPI's ssh has a group of its own): no job
     * runs now, so every descendant of the supervisor is a probe's. */
    dt_proc_kill_tree(0, 0.5, NULL, NULL);
    size_t la = 0, lg = 0;
    alive[0] = gone[0] = 0;
    *slots = 0;
    *nalive = 0;
    if (*p) { /* more hosts than probed: keep them all rather than drop some unseen */
        snprintf(alive, na, "%s", hosts);
        snprintf(gone, ng, "%s", "");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (ok[i]) {
            (*nalive)++;
            la += (size_t)snprintf(alive + la, na - la, "%s%s:%d", la ? "," : "", names[i], sl[i]);
            *slots += sl[i];
        } else {
            lg += (size_t)snprintf(gone + lg, ng - lg, "%s%s", lg ? ", " : "", names[i]);
        }
        if (la >= na) la = na - 1;
        if (lg >= ng) lg = ng - 1;
    }
}

static void clear_dumps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        int rec = !strncmp(e->d_name, "rank", 4) && n > 4 && !strcmp(e->d_name + n - 4, ".rec");
        if (strncmp(e->d_name, "watchdog-rank", 13) != 0 && !rec) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

dt_status dt_launch_supervise(dt_ctx *ctx, const dt_launch_cfg *cfg, const dt_supervise_cfg *sc, int *exit_code) {
    char run_dir[4096];
    int own_dir = !sc->run_dir;
    if (own_dir) {
        char cwd[3800];
        if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
        snprintf(run_dir, sizeof run_dir, "%s/.dtrain-run-%d", cwd, (int)getpid());
    } else {
        snprintf(run_dir, sizeof run_dir, "%s", sc->run_dir);
    }
    if (mkdir(run_dir, 0755) != 0 && errno != EEXIST)
        return dt_fail(ctx, DT_ERR_IO, PFX "--run-dir %s: %s", run_dir, strerror(errno));
    setenv("DTRAIN_RUN_DIR", run_dir, 1);
    /* When a rank dies, mpirun sends the others SIGTERM and only SIGKILL after this many
     * seconds; dtrain's ranks treat SIGTERM as a preemption request, so the default (1 s)
     * added about 2 s to every failure. Checkpoints are crash-consistent: kill at once. */
    setenv("OMPI_MCA_odls_base_sigkill_timeout", "0", 0);
    int is_train = cfg->argc > 0 && strcmp(cfg->argv[0], "train") == 0;
    char **argv2 = calloc((size_t)cfg->argc + 3, sizeof *argv2);
    if (!argv2) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    memcpy(argv2, cfg->argv, (size_t)cfg->argc * sizeof *argv2);

    struct sigaction sa, old[3];
    static const int sigs[3] = {SIGTERM, SIGUSR1, SIGINT};
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sv_signal = 0;
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);

    dt_status st = DT_OK;
    int quick = 0;
    double failed_at = 0;
    dt_proc_become_reaper(); /* an ssh that mpirun leaves behind stays ours to end */
    dt_startup su;
    dt_launch_cfg cur; /* the hosts and ranks of the next attempt (elastic: fewer) */
    if ((st = dt_startup_begin(ctx, &su, cfg, &cur)) != DT_OK) {
        for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
        free(argv2);
        return st;
    }
    static char alive_hosts[2][4096];
    char hang_hosts[64][64]; /* hosts of hang culprits, and how often each hung */
    int hang_count[64] = {0}, n_hang_hosts = 0;
    for (int attempt = 0;; attempt++) {
        char num[16];
        snprintf(num, sizeof num, "%d", attempt);
        setenv("DTRAIN_RESTART", num, 1);
        clear_dumps(run_dir);
        dt_launch_cfg c = cur;
        if (attempt > 0 && is_train) {
            argv2[cfg->argc] = "--resume";
            argv2[cfg->argc + 1] = "auto";
            c.argv = argv2;
            c.argc = cfg->argc + 2;
        }
        dt_launch_job job;
        st = dt_launch_init(ctx, &c, &job);
        if (st != DT_OK) break;
        if ((st = dt_startup_reset(ctx, &su, &job)) != DT_OK) {
            dt_launch_free(&job);
            break;
        }
        fflush(NULL);
        attempt_info a = {.rank = -1};
        int code = 0, preempted = 0;
        double t0 = now_s();
        st = run_attempt(ctx, &job, &su, sc->grace, &code, &a, &preempted, attempt, failed_at);
        double t1 = now_s();
        dt_launch_free(&job);
        if (st != DT_OK) break;
        *exit_code = code;
        if (code == 0) {
            if (attempt > 0) SV_LOG("job finished after %d restart(s)", attempt);
            break;
        }
        if (preempted || sv_signal) {
            SV_LOG("job ended after a preemption signal with status %d; not restarting", code);
            break;
        }
        char what[700];
        if (a.startup[0]) snprintf(what, sizeof what, "%s", a.startup);
        else if (a.rank >= 0 && a.sig) snprintf(what, sizeof what, "rank %d killed by signal %d (%s)", a.rank, a.sig, strsignal(a.sig));
        else if (a.rank >= 0) snprintf(what, sizeof what, "rank %d exited with status %d%s", a.rank, a.code,
                                       a.code == 3 ? " (collective watchdog)" : "");
        else snprintf(what, sizeof what, "mpirun exited with status %d", code);
        failed_at = t1;
        hang_info h;
        analyze_hang(run_dir, cfg->nranks, &h);
        if (h.seq >= 0 && h.culprit[0]) {
            if (h.peer >= 0) {
                /* A point-to-point wait: the culprit is at the end of the chain of waits. */
                SV_LOG("job failed after %.1f s: %s hung: at the end of a chain of point-to-point waits; rank(s) %s "
                       "waited until the watchdog fired, the first in #%ld %s on rank %d (%s)", t1 - t0, h.culprit,
                       h.waiting, h.seq, h.op, h.peer, what);
                SV_LOG("hang: chain of waits: %s", h.chain[0] ? h.chain : "(none in the records)");
            } else {
                /* The rank whose watchdog fired is the messenger; the culprit is the rank that
                 * never arrived. */
                SV_LOG("job failed after %.1f s: %s hung: held up collective #%ld (%s), in which rank(s) %s "
                       "waited until the watchdog fired (%s)", t1 - t0, h.culprit, h.seq, h.op, h.waiting, what);
                if (h.chain[0]) SV_LOG("hang: chain of waits: %s", h.chain);
            }
            SV_LOG("hang: %s", h.detail);
            for (int i = 0; i < h.nhosts; i++) {
                int k = 0;
                while (k < n_hang_hosts && strcmp(hang_hosts[k], h.hosts[i])) k++;
                if (k == n_hang_hosts && n_hang_hosts < 64) snprintf(hang_hosts[n_hang_hosts++], sizeof hang_hosts[0], "%s", h.hosts[i]);
                if (k < 64 && ++hang_count[k] >= 2)
                    SV_LOG("host %s has hung %d times in this job (the restarts count against it)", h.hosts[i], hang_count[k]);
            }
        } else {
            SV_LOG("job failed after %.1f s: %s", t1 - t0, what);
            if (h.seq >= 0)
                SV_LOG("hang: collective #%ld (%s) timed out in rank(s) %s; every rank entered it", h.seq, h.op,
                       h.waiting);
        }
        dt_proc_kill_tree(0, 0.5, NULL, NULL); /* what the failed attempt left behind */
        /* Exit status 2 is dtrain's usage/configuration error (a misspelt key or subcommand,
         * a YAML error, a bad flag): the same input fails again, so no restart. */
        if ((a.rank >= 0 && !a.sig ? a.code : code) == 2) {
            SV_LOG("status 2 is a usage or configuration error (see the error line above): restarting "
                   "cannot help; not restarting");
            break;
        }
        if (attempt >= sc->max_restarts) {
            SV_LOG("giving up: %d restart(s) allowed (--max-restarts)", sc->max_restarts);
            break;
        }
        if (sc->min_ranks > 0 && cur.hosts) {
            double tp = now_s();
            int slots = 0;
            char gone[1024];
            int nalive = 0;
            probe_hosts(&cur, cur.hosts, alive_hosts[attempt % 2], sizeof alive_hosts[0], gone, sizeof gone, &slots,
                        &nalive);
            if (gone[0]) {
                /* --ranks-per-node K places K ranks on each host, whatever its slots. */
                int cap = cur.ranks_per_node > 0 ? cur.ranks_per_node * nalive : slots;
                int n = cap < cur.nranks ? cap : cur.nranks;
                if (n < sc->min_ranks) {
                    SV_LOG("giving up: host(s) %s did not answer a probe (%.1f s); %d rank(s) left, fewer than "
                           "--min-ranks %d", gone, now_s() - tp, n, sc->min_ranks);
                    break;
                }
                cur.hosts = alive_hosts[attempt % 2];
                cur.nranks = n;
                SV_LOG("host(s) %s did not answer a probe (%.1f s): continuing on %d rank(s) of %s (--min-ranks %d)%s",
                       gone, now_s() - tp, n, cur.hosts, sc->min_ranks,
                       is_train ? "; train resumes resharded (training.batch keeps the global batch)" : "");
            }
        }
        quick = t1 - t0 < 60.0 ? quick + 1 : 0;
        double wait = sc->backoff;
        for (int i = 1; i < quick && wait < sc->backoff_max; i++) wait *= 2;
        if (wait > sc->backoff_max) wait = sc->backoff_max;
        SV_LOG("restart %d of %d in %.1f s%s", attempt + 1, sc->max_restarts, wait,
               is_train ? ", resuming from the newest intact checkpoint (if checkpoint.dir is set)" : "");
        double until = now_s() + wait;
        while (now_s() < until && !sv_signal) usleep(20000);
        if (sv_signal) {
            SV_LOG("preemption signal while waiting to restart: stopping");
            break;
        }
    }
    dt_proc_kill_tree(0, 0.5, NULL, NULL); /* nothing of the job outlives the supervisor */
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    free(argv2);
    dt_startup_end(&su);
    if (own_dir) {
        clear_dumps(run_dir);
        rmdir(run_dir);
    }
    return st;
}
