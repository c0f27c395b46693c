/* Placement, the mpirun command line, and running it with signal forwarding. */
#include "launch/launch.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define PFX "dtrain launch: "

typedef struct host {
    char *name;
    int slots;
} host;

typedef struct host_list {
    host *v;
    int n, cap;
} host_list;

/* A growable NULL-terminated argv of owned strings; `bad` remembers an allocation failure so
 * callers check once at the end instead of after every push. */
typedef struct argv_buf {
    char **v;
    int n, cap, bad;
} argv_buf;

static void argv_push(argv_buf *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void argv_push(argv_buf *a, const char *fmt, ...) {
    if (a->bad) return;
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? a->cap * 2 : 32;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->bad = 1;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int len = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (len < 0) {
        a->bad = 1;
        return;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void argv_free(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}

static void hosts_free(host_list *h) {
    for (int i = 0; i < h->n; i++) free(h->v[i].name);
    free(h->v);
    memset(h, 0, sizeof *h);
}

/* Host names as mpirun and /etc/hosts take them; anything else is a typo or an injection. */
static int valid_host_name(const char *s, size_t len) {
    if (len == 0 || len > 255) return 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

/* Strict positive int: all digits, 1..1e6. Returns 0 when s is not one. */
static int parse_count(const char *s, size_t len) {
    if (len == 0 || len > 7) return 0;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= 1000000 ? v : 0;
}

static dt_status hosts_add(dt_ctx *ctx, host_list *h, const char *name, size_t len, int slots,
                           const char *what) {
    for (int i = 0; i < h->n; i++)
        if (strlen(h->v[i].name) == len && !memcmp(h->v[i].name, name, len))
            return dt_fail(ctx, DT_ERR_CONFIG, PFX "%s: host '%.*s' appears twice", what, (int)len,
                           name);
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 8;
        host *v = realloc(h->v, (size_t)cap * sizeof *v);
        if (!v) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
        h->v = v;
        h->cap = cap;
    }
    char *s = strndup(name, len);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    h->v[h->n++] = (host){s, slots};
    return DT_OK;
}

/* --hosts h1:2,h2:2 (mpirun's --host syntax; a host without :K has one slot, as there). */
static dt_status parse_hosts(dt_ctx *ctx, const char *spec, host_list *h) {
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        size_t nlen = colon ? (size_t)(colon - p) : len;
        int slots = 1;
        if (colon && !(slots = parse_count(colon + 1, len - nlen - 1)))
            return dt_fail(ctx, DT_ERR_CONFIG,
                           PFX "--hosts: bad slot count in '%.*s' (expected HOST:K, K >= 1)",
                           (int)len, p);
        if (nlen == 0)
            return dt_fail(ctx, DT_ERR_CONFIG, PFX "--hosts: empty host name in '%s' (expected h1:2,h2:2)", spec);
        if (!valid_host_name(p, nlen))
            return dt_fail(ctx, DT_ERR_CONFIG,
                           PFX "--hosts: bad host name in '%.*s' (expected h1:2,h2:2)", (int)len, p);
        DT_CHECK(hosts_add(ctx, h, p, nlen, slots, "--hosts"));
        if (!p[len]) break;
        p += len + 1;
    }
    return DT_OK;
}

/* Open MPI hostfile: "host [slots=K] [max_slots=K]" per line, '#' comments. A host without
 * slots= gets `cpus` slots: mpirun gives it its core count, assumed equal to ours. */
static dt_status parse_hostfile(dt_ctx *ctx, const char *path, int cpus, host_list *h) {
    FILE *f = fopen(path, "r");
    if (!f) return dt_fail(ctx, DT_ERR_CONFIG, PFX "--hostfile: cannot open '%s': %s", path, strerror(errno));
    dt_status st = DT_OK;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        line[strcspn(line, "#\r\n")] = 0;
        char *save = NULL, *name = strtok_r(line, " \t", &save);
        if (!name) continue;
        if (!valid_host_name(name, strlen(name))) {
            st = dt_fail(ctx, DT_ERR_CONFIG, PFX "--hostfile %s:%d: bad host name '%s'", path, lineno, name);
            goto done;
        }
        int slots = cpus;
        for (char *tok; (tok = strtok_r(NULL, " \t", &save));) {
            char *eq = strchr(tok, '=');
            int v = eq ? parse_count(eq + 1, strlen(eq + 1)) : 0;
            size_t klen = eq ? (size_t)(eq - tok) : strlen(tok);
            int is_slots = klen == 5 && !strncmp(tok, "slots", 5);
            int is_max = klen == 9 && (!strncmp(tok, "max_slots", 9) || !strncmp(tok, "max-slots", 9));
            if (!is_slots && !is_max) {
                st = dt_fail(ctx, DT_ERR_CONFIG,
                             PFX "--hostfile %s:%d: unknown field '%s' (expected slots=K or max_slots=K)",
                             path, lineno, tok);
                goto done;
            }
            if (!v) {
                st = dt_fail(ctx, DT_ERR_CONFIG, PFX "--hostfile %s:%d: '%s' needs a positive integer",
                             path, lineno, tok);
                goto done;
            }
            if (is_slots) slots = v;
        }
        char what[64];
        snprintf(what, sizeof what, "--hostfile line %d", lineno);
        if ((st = hosts_add(ctx, h, name, strlen(name), slots, what)) != DT_OK) goto done;
    }
    if (h->n == 0) st = dt_fail(ctx, DT_ERR_CONFIG, PFX "--hostfile: no hosts in '%s'", path);
done:
    free(line);
    fclose(f);
    return st;
}

static int cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static int is_exec_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(path, X_OK) == 0;
}

/* The mpirun to run: a path as given, or the first match in PATH (resolved here so a missing
 * mpirun is a clear usage error instead of a failed exec). */
static dt_status find_mpirun(dt_ctx *ctx, const char *name, char **out) {
    const char *flag = name ? "--mpirun" : "mpirun";
    if (!name) name = "mpirun";
    if (!*name) return dt_fail(ctx, DT_ERR_CONFIG, PFX "--mpirun needs a path");
    if (strchr(name, '/')) {
        if (!is_exec_file(name))
            return dt_fail(ctx, DT_ERR_CONFIG, PFX "--mpirun: '%s' is not an executable file", name);
        *out = strdup(name);
        return *out ? DT_OK : dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        size_t len = strcspn(p, ":");
        char *cand = NULL;
        if (asprintf(&cand, "%.*s/%s", (int)len, len ? p : ".", name) < 0)
            return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
        if (is_exec_file(cand)) {
            *out = cand;
            return DT_OK;
        }
        free(cand);
        if (!p[len]) break;
        p += len + 1;
    }
    return dt_fail(ctx, DT_ERR_CONFIG,
                   PFX "%s: '%s' not found in PATH (install Open MPI, e.g. apt-get install "
                       "openmpi-bin, or give --mpirun PATH)",
                   flag, name);
}

/* Placement: how many ranks the busiest machine runs, and how many nodes there are. */
static dt_status plan_placement(dt_ctx *ctx, const dt_launch_cfg *cfg, const host_list *h,
                                dt_launch_job *job) {
    int n = cfg->nranks, k = cfg->ranks_per_node, m = cfg->simulate_nodes;
    if (m) {
        if (m > n)
            return dt_fail(ctx, DT_ERR_CONFIG, PFX "--simulate-nodes %d exceeds -n %d (each node needs a rank)", m, n);
        if (k && (long)k * m != n)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           PFX "--ranks-per-node %d x --simulate-nodes %d = %ld ranks, but -n is %d", k,
                           m, (long)k * m, n);
        job->nodes = m;
        job->ranks_per_node = n; /* every simulated node shares this machine's cores */
        return DT_OK;
    }
    if (h->n == 0) {
        /* No host list: this machine, or whatever the resource manager allocated (then
         * --ranks-per-node says how the ranks are spread). */
        job->ranks_per_node = k ? k : n;
        job->nodes = (n + job->ranks_per_node - 1) / job->ranks_per_node;
        return DT_OK;
    }
    const char *flag = cfg->hosts ? "--hosts" : "--hostfile";
    if (k) {
        if ((long)k * h->n < n)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           PFX "--ranks-per-node %d x %d host(s) in %s = %ld ranks, fewer than -n %d",
                           k, h->n, flag, (long)k * h->n, n);
        job->ranks_per_node = k < n ? k : n;
        job->nodes = (n + k - 1) / k;
        return DT_OK;
    }
    /* mpirun's default by-slot mapping fills each host's slots in order. */
    long total = 0;
    int left = n, most = 0, used = 0;
    for (int i = 0; i < h->n; i++) {
        total += h->v[i].slots;
        int here = left < h->v[i].slots ? left : h->v[i].slots;
        if (here > most) most = here;
        if (here > 0) used++;
        left -= here;
    }
    if (left > 0)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       PFX "-n %d exceeds the %ld slot(s) of %s (give more slots, e.g. host:4, or "
                           "--ranks-per-node)",
                       n, total, flag);
    job->ranks_per_node = most;
    job->nodes = used;
    return DT_OK;
}

/* One app context: -n count, the environment, the program and its arguments. */
static void push_context(argv_buf *a, const dt_launch_cfg *cfg, const dt_launch_job *job,
                         const char *program, int count, int node) {
    argv_push(a, "-n");
    argv_push(a, "%d", count);
    argv_push(a, "-x");
    if (job->threads) argv_push(a, "OMP_NUM_THREADS=%d", job->threads);
    else argv_push(a, "OMP_NUM_THREADS");
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "DTRAIN_", 7) != 0) continue;
        size_t len = strcspn(*e, "=");
        if (node >= 0 && len == 14 && !strncmp(*e, "DTRAIN_NODE_ID", 14)) continue;
        argv_push(a, "-x");
        argv_push(a, "%.*s", (int)len, *e);
    }
    if (node >= 0) {
        argv_push(a, "-x");
        argv_push(a, "DTRAIN_NODE_ID=node%d", node);
    }
    argv_push(a, "%s", program);
    for (int i = 0; i < cfg->argc; i++) argv_push(a, "%s", cfg->argv[i]);
}

dt_status dt_launch_init(dt_ctx *ctx, const dt_launch_cfg *cfg, dt_launch_job *job) {
    /* Open MPI gives local ranks a pseudo-terminal for stdout, so a rank cannot tell whether
     * its output ends in a terminal or a log file: the launcher can (DTRAIN_* reach the ranks). */
    if (isatty(STDOUT_FILENO)) setenv("DTRAIN_LAUNCH_TTY", "1", 1);
    else unsetenv("DTRAIN_LAUNCH_TTY"); /* not exported: ranks print plain lines */
    dt_launch_job j = {0};
    host_list h = {0};
    argv_buf a = {0};
    char *mpirun = NULL, self[PATH_MAX];
    dt_status st = DT_OK;

    if (cfg->nranks < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "-n must be at least 1 (got %d)", cfg->nranks);
    if (cfg->ranks_per_node < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "--ranks-per-node must be at least 1");
    if (cfg->simulate_nodes < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "--simulate-nodes must be at least 1");
    if (cfg->hosts && cfg->hostfile)
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "--hosts and --hostfile exclude each other");
    if (cfg->simulate_nodes && (cfg->hosts || cfg->hostfile))
        return dt_fail(ctx, DT_ERR_CONFIG,
                       PFX "--simulate-nodes splits the ranks of this machine; it cannot be combined with %s",
                       cfg->hosts ? "--hosts" : "--hostfile");
    if (cfg->argc < 1 || !cfg->argv || !cfg->argv[0] || !*cfg->argv[0])
        return dt_fail(ctx, DT_ERR_CONFIG,
                       PFX "nothing to run after '--' (e.g. dtrain launch -n 2 -- train cfg.yaml)");
    if (!strcmp(cfg->argv[0], "launch"))
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "'--' must be followed by a dtrain subcommand other than launch");

    j.cpus = cfg->cpus > 0 ? cfg->cpus : cpu_count();
    const char *program = cfg->program;
    if (!program) {
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0)
            return dt_fail(ctx, DT_ERR_IO, PFX "cannot find this executable (/proc/self/exe): %s", strerror(errno));
        self[len] = 0;
        program = self;
    }
    if (cfg->hosts) DT_CHECK_GOTO(parse_hosts(ctx, cfg->hosts, &h));
    if (cfg->hostfile) DT_CHECK_GOTO(parse_hostfile(ctx, cfg->hostfile, j.cpus, &h));
    DT_CHECK_GOTO(plan_placement(ctx, cfg, &h, &j));
    DT_CHECK_GOTO(find_mpirun(ctx, cfg->mpirun, &mpirun));

    const char *user_threads = getenv("OMP_NUM_THREADS");
    j.oversubscribed = j.ranks_per_node > j.cpus;
    j.threads = user_threads && *user_threads ? 0 : (j.cpus / j.ranks_per_node > 1 ? j.cpus / j.ranks_per_node : 1);
    int pe = j.cpus / j.ranks_per_node;

    argv_push(&a, "%s", mpirun);
    /* mpirun refuses root without this; the flag reaches the remote daemons too. */
    if (geteuid() == 0) argv_push(&a, "--allow-run-as-root");
    if (cfg->hosts) {
        argv_push(&a, "--host");
        char *list = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&list, &len);
        if (!m) DT_CHECK_GOTO(dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory"));
        for (int i = 0; i < h.n; i++) fprintf(m, "%s%s:%d", i ? "," : "", h.v[i].name, h.v[i].slots);
        fclose(m);
        argv_push(&a, "%s", list ? list : "");
        free(list);
    } else if (cfg->hostfile) {
        argv_push(&a, "--hostfile");
        argv_push(&a, "%s", cfg->hostfile);
    }
    if (j.oversubscribed) {
        argv_push(&a, "--oversubscribe");
        argv_push(&a, "--bind-to");
        argv_push(&a, "none");
    } else {
        argv_push(&a, "--map-by");
        if (cfg->ranks_per_node && !cfg->simulate_nodes)
            argv_push(&a, "ppr:%d:node:PE=%d", cfg->ranks_per_node, pe);
        else
            argv_push(&a, "slot:PE=%d", pe);
        argv_push(&a, "--bind-to");
        argv_push(&a, "core");
    }
    if (cfg->simulate_nodes) {
        /* MPMD: one app context per simulated node; ranks are numbered context by context,
         * so node i holds a consecutive block (the first n % M nodes get one rank more). */
        int m = cfg->simulate_nodes;
        for (int i = 0; i < m; i++) {
            if (i) argv_push(&a, ":");
            push_context(&a, cfg, &j, program, cfg->nranks / m + (i < cfg->nranks % m), i);
        }
    } else {
        push_context(&a, cfg, &j, program, cfg->nranks, -1);
    }
    if (a.bad) DT_CHECK_GOTO(dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory"));
    j.argc = a.n;
    j.argv = a.v;
    a.v = NULL;
    *job = j;
fail:
    argv_free(a.v);
    free(mpirun);
    hosts_free(&h);
    return st;
}

void dt_launch_free(dt_launch_job *job) {
    argv_free(job->argv);
    memset(job, 0, sizeof *job);
}

/* POSIX shell quoting: bare when every character is safe, else single quotes. */
static void print_quoted(FILE *f, const char *s) {
    int safe = *s != 0;
    for (const char *p = s; *p && safe; p++)
        safe = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
               strchr("_@%+=:,./-", *p);
    if (safe) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (const char *p = s; *p; p++) {
        if (*p == '\'') fputs("'\\''", f);
        else fputc(*p, f);
    }
    fputc('\'', f);
}

void dt_launch_print(const dt_launch_job *job, FILE *f) {
    for (int i = 0; i < job->argc; i++) {
        if (i) fputc(' ', f);
        print_quoted(f, job->argv[i]);
    }
    fputc('\n', f);
}

/* The only mutable global of the module: a signal handler has no other way to learn whom
 * to forward to. Set while mpirun runs, 0 otherwise. */
static volatile sig_atomic_t launch_child;

static volatile sig_atomic_t launch_preempted; /* signals turned into a preemption request */

static void forward_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    pid_t pid = (pid_t)launch_child;
    /* si_code <= 0: sent by a process (kill, sigqueue, tgkill), e.g. a batch system or
     * timeout(1). A terminal's ^C (SI_KERNEL) went to the whole foreground process group,
     * mpirun included; a second copy would make mpirun skip its orderly abort. The first such
     * signal becomes SIGUSR1, which mpirun passes to every rank: dtrain's ranks checkpoint at
     * the next step boundary and exit 0, so the job ends cleanly (as under the supervisor);
     * a second one is forwarded as it is, and mpirun aborts the job. */
    if (pid > 0 && si && si->si_code <= 0) {
        if (launch_preempted++ == 0) kill(pid, SIGUSR1);
        else kill(pid, sig);
    }
}

int dt_launch_preempted(void) { return launch_preempted != 0; }

dt_status dt_launch_run(dt_ctx *ctx, const dt_launch_job *job, int *exit_code) {
    static const int sigs[2] = {SIGINT, SIGTERM};
    struct sigaction old[2], sa;
    int installed[2] = {0, 0};
    sigset_t block, saved;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    /* Blocked until the pid is known, so a signal in between is forwarded, not lost. */
    sigprocmask(SIG_BLOCK, &block, &saved);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = forward_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; i++) {
        sigaction(sigs[i], NULL, &old[i]);
        /* An ignored signal (nohup, a background job of a script) stays ignored. */
        if (old[i].sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
        installed[i] = 1;
    }

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &saved);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    pid_t pid;
    int err = posix_spawn(&pid, job->argv[0], NULL, &attr, job->argv, environ);
    posix_spawnattr_destroy(&attr);
    dt_status st = DT_OK;
    if (err) {
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "cannot start %s: %s", job->argv[0], strerror(err));
    } else {
        launch_child = pid;
        sigprocmask(SIG_SETMASK, &saved, NULL);
        int status = 0;
        pid_t r;
        while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
        if (r < 0) st = dt_fail(ctx, DT_ERR_BACKEND, PFX "waiting for mpirun: %s", strerror(errno));
        else if (WIFSIGNALED(status)) *exit_code = 128 + WTERMSIG(status);
        else *exit_code = WEXITSTATUS(status);
        sigprocmask(SIG_BLOCK, &block, NULL);
        launch_child = 0;
    }
    for (int i = 0; i < 2; i++)
        if (installed[i]) sigaction(sigs[i], &old[i], NULL);
    sigprocmask(SIG_SETMASK, &saved, NULL);
    return st;
}
