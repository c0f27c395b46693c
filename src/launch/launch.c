/* Placement, the mpirun command line, and running it with signal forwarding. */
#include "launch/launch.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch/launch_impl.h"

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

/* An Open MPI MCA parameter as mpirun will see it: OMPI_MCA_<name> in the environment, else
 * the parameter files (OMPI_MCA_mca_base_param_files, else the user's
 * ~/.openmpi/mca-params.conf, then the installation's and Debian's system file). Returns a
 * malloc'ed value, or NULL when it is set nowhere. */
static char *mca_param(const char *mpirun, const char *const *names) {
    for (const char *const *n = names; *n; n++) {
        char var[96];
        snprintf(var, sizeof var, "OMPI_MCA_%s", *n);
        const char *v = getenv(var);
        if (v) return strdup(v);
    }
    char *files[4] = {0};
    int nf = 0;
    const char *list = getenv("OMPI_MCA_mca_base_param_files");
    if (list) {
        files[nf++] = strdup(list);
    } else {
        const char *home = getenv("HOME");
        if (home && *home && asprintf(&files[nf], "%s/.openmpi/mca-params.conf", home) >= 0) nf++;
        char real[PATH_MAX];
        if (realpath(mpirun, real)) { /* PREFIX/bin/mpirun -> PREFIX/etc */
            char *slash = strrchr(real, '/');
            if (slash) *slash = 0;
            if ((slash = strrchr(real, '/'))) *slash = 0;
            if (asprintf(&files[nf], "%s/etc/openmpi-mca-params.conf", real) >= 0) nf++;
        }
        files[nf++] = strdup("/etc/openmpi/openmpi-mca-params.conf");
    }
    char *found = NULL, *line = NULL;
    size_t cap = 0;
    for (int i = 0; i < nf && !found; i++) {
        if (!files[i]) continue;
        char *save = NULL;
        /* The list variable holds several files (':'); the others are one each. */
        for (char *path = strtok_r(files[i], ":", &save); path && !found; path = strtok_r(NULL, ":", &save)) {
            FILE *f = fopen(path, "r");
            if (!f) continue;
            while (!found && getline(&line, &cap, f) >= 0) {
                line[strcspn(line, "#\r\n")] = 0;
                char *eq = strchr(line, '=');
                if (!eq) continue;
                char *k = line, *ke = eq, *v = eq + 1, *ve = v + strlen(v);
                while (*k == ' ' || *k == '\t') k++;
                while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
                while (*v == ' ' || *v == '\t') v++;
                while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
                *ke = 0;
                *ve = 0;
                for (const char *const *n = names; *n && !found; n++)
                    if (!strcmp(k, *n)) found = strdup(v);
            }
            fclose(f);
        }
    }
    free(line);
    for (int i = 0; i < nf; i++) free(files[i]);
    return found;
}

/* The ssh options of a remote launch, after the user's own plm_rsh_args (launch.h); NULL when
 * the rsh agent is not ssh. The LocalCommand that marks the hosts ssh reached comes last, when
 * the launcher watches the start-up (launch_impl.h). */
static char *ssh_args(const char *mpirun, const dt_launch_cfg *cfg) {
    static const char *const agent_names[] = {"plm_rsh_agent", "orte_rsh_agent", "pls_rsh_agent", NULL};
    static const char *const args_names[] = {"plm_rsh_args", NULL};
    char *agent = mca_param(mpirun, agent_names);
    /* "ssh : rsh" (Open MPI's default) tries ssh first; the first word of the first choice. */
    const char *a = agent ? agent : "ssh";
    a += strspn(a, " \t");
    size_t len = strcspn(a, " \t:");
    const char *base = a;
    for (const char *p = a; p < a + len; p++)
        if (*p == '/') base = p + 1;
    int is_ssh = (size_t)(a + len - base) == 3 && !strncmp(base, "ssh", 3);
    free(agent);
    if (!is_ssh) return NULL;
    char *user = mca_param(mpirun, args_names), *out = NULL;
    char timeout[48] = "";
    if (cfg->connect_timeout > 0) snprintf(timeout, sizeof timeout, "-o ConnectTimeout=%d ", cfg->connect_timeout);
    char marks[320] = "";
    if (cfg->startup_dir)
        snprintf(marks, sizeof marks, " -o PermitLocalCommand=yes -o LocalCommand=%s/up-%%n", cfg->startup_dir);
    if (asprintf(&out, "%s%s%s-o BatchMode=yes -o ServerAliveInterval=15%s", user && *user ? user : "",
                 user && *user ? " " : "", timeout, marks) < 0)
        out = NULL;
    free(user);
    return out;
}

/* How many ranks mpirun puts on each host: --map-by ppr:K:node places K per host in order;
 * otherwise mpirun fills each host's slots in order (oversubscribed: then round robin). */
static dt_status plan_hosts(dt_ctx *ctx, const dt_launch_cfg *cfg, const host_list *h, int ppr,
                            dt_launch_job *j) {
    if (h->n == 0) return DT_OK;
    j->hosts = calloc((size_t)h->n + 1, sizeof *j->hosts);
    j->host_ranks = calloc((size_t)h->n, sizeof *j->host_ranks);
    if (!j->hosts || !j->host_ranks) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
    j->nhosts = h->n;
    int left = cfg->nranks;
    for (int i = 0; i < h->n; i++) {
        if (!(j->hosts[i] = strdup(h->v[i].name))) return dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
        int cap = ppr ? ppr : h->v[i].slots;
        j->host_ranks[i] = left < cap ? left : cap;
        left -= j->host_ranks[i];
    }
    for (int i = 0; left > 0; i = (i + 1) % h->n, left--) j->host_ranks[i]++;
    return DT_OK;
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
    if (cfg->connect_timeout < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, PFX "--connect-timeout must be 0 (no limit) or more seconds");
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
    if (cfg->hosts || cfg->hostfile) {
        char *rsh = ssh_args(mpirun, cfg);
        if (rsh) {
            argv_push(&a, "--mca");
            argv_push(&a, "plm_rsh_args");
            argv_push(&a, "%s", rsh);
            j.ssh_marks = cfg->startup_dir != NULL;
            free(rsh);
        }
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
    DT_CHECK_GOTO(plan_hosts(ctx, cfg, &h, !j.oversubscribed && cfg->ranks_per_node ? cfg->ranks_per_node : 0, &j));
    j.nranks = cfg->nranks;
    j.connect_timeout = cfg->connect_timeout;
    j.argc = a.n;
    j.argv = a.v;
    a.v = NULL;
    *job = j;
    memset(&j, 0, sizeof j);
fail:
    dt_launch_free(&j);
    argv_free(a.v);
    free(mpirun);
    hosts_free(&h);
    return st;
}

void dt_launch_free(dt_launch_job *job) {
    argv_free(job->argv);
    argv_free(job->hosts);
    free(job->host_ranks);
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

/* Signals while mpirun runs: the handler only counts them, the loop of run_job acts. The
 * only mutable globals of the module: a handler has no other way to reach the loop. */
static volatile sig_atomic_t sig_ext, sig_ext_last; /* SIGINT/SIGTERM sent by a process */
static volatile sig_atomic_t sig_tty, sig_tty_last; /* the same from the kernel: a terminal's ^C */
static volatile sig_atomic_t sig_hup;
static int launch_preempted; /* a signal was turned into a preemption request */

static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    /* si_code <= 0: sent by a process (kill, sigqueue, tgkill), e.g. a batch system or
     * timeout(1); a terminal's ^C comes from the kernel (SI_KERNEL). */
    if (sig == SIGHUP) {
        sig_hup++;
    } else if (si && si->si_code <= 0) {
        sig_ext_last = sig;
        sig_ext++;
    } else {
        sig_tty_last = sig;
        sig_tty++;
    }
}

static int launch_rank_error; /* a rank printed its own error line */

int dt_launch_preempted(void) { return launch_preempted; }
int dt_launch_rank_error(void) { return launch_rank_error; }

/* Runs the planned job (dt_launch_run). */
static dt_status run_job(dt_ctx *ctx, const dt_launch_job *job, dt_startup *su, int *exit_code) {
    static const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction old[3], sa;
    int installed[3] = {0, 0, 0};
    sigset_t block, saved;
    sigemptyset(&block);
    for (int i = 0; i < 3; i++) sigaddset(&block, sigs[i]);
    /* Blocked until mpirun runs, so a signal in between is acted on, not lost. */
    sigprocmask(SIG_BLOCK, &block, &saved);
    sig_ext = sig_tty = sig_hup = 0;
    launch_preempted = launch_rank_error = 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) {
        sigaction(sigs[i], NULL, &old[i]);
        /* An ignored signal (nohup, a background job of a script) stays ignored. */
        if (old[i].sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
        installed[i] = 1;
    }
    dt_proc_become_reaper();

    dt_status st = DT_OK;
    dt_errfilter *ef = calloc(1, sizeof *ef);
    int pe[2] = {-1, -1};
    pid_t pid = -1;
    if (!ef) {
        st = dt_fail(ctx, DT_ERR_NOMEM, PFX "out of memory");
        goto out;
    }
    ef->fd_out = STDERR_FILENO;
    if (pipe(pe) != 0) {
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "pipe: %s", strerror(errno));
        goto out;
    }
    /* mpirun in a process group of its own: a signal to ours (a terminal's ^C, timeout(1))
     * reaches only the launcher, which passes it on as described in launch.h. stdout goes
     * straight to ours (live progress lines); stderr through the launcher. */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pe[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, pe[0]);
    posix_spawn_file_actions_addclose(&fa, pe[1]);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &saved);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
    int err = posix_spawn(&pid, job->argv[0], &fa, &attr, job->argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(pe[1]);
    pe[1] = -1;
    if (err) {
        pid = -1;
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "cannot start %s: %s", job->argv[0], strerror(err));
        goto out;
    }
    sigprocmask(SIG_SETMASK, &saved, NULL);

    int open_e = 1, status = 0, reaped = 0, stop_sig = 0, deadline = 0;
    int done_ext = 0, done_tty = 0, done_hup = 0;
    double kill_at = 0;
    for (;;) {
        struct pollfd pf = {open_e ? pe[0] : -1, POLLIN, 0};
        if (poll(&pf, 1, 100) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR)))
            open_e = dt_errfilter_pump(ef, pe[0], su);
        dt_errfilter_tick(ef, su);
        if (waitpid(pid, &status, WNOHANG) == pid) {
            reaped = 1;
            break;
        }
        dt_proc_reap_orphans(pid);
        double t = dt_launch_now();
        int pending = dt_startup_pending(su);
        /* Before every rank runs there is nothing to checkpoint, and a stalled start-up may
         * not react to a signal at all: any signal then ends the job at once. */
        int ext = sig_ext, tty = sig_tty, hup = sig_hup;
        if (pending && (ext != done_ext || tty != done_tty || hup != done_hup)) {
            stop_sig = hup != done_hup ? SIGHUP : ext != done_ext ? (int)sig_ext_last : (int)sig_tty_last;
            break;
        }
        for (; done_ext != ext; done_ext++) {
            /* The first becomes SIGUSR1, which mpirun passes to every rank: dtrain's ranks
             * checkpoint at the next step boundary and exit 0, so the job ends cleanly (as
             * under the supervisor); a later one is passed on as it is: mpirun aborts. */
            if (!launch_preempted) {
                launch_preempted = 1;
                kill(pid, SIGUSR1);
            } else {
                kill(pid, (int)sig_ext_last);
                if (!kill_at) kill_at = t + 10.0;
            }
        }
        if (done_tty != tty) { /* a terminal's ^C: mpirun's own orderly abort */
            done_tty = tty;
            kill(pid, (int)sig_tty_last);
            if (!kill_at) kill_at = t + 10.0;
        }
        if (done_hup != hup) { /* the terminal went away */
            done_hup = hup;
            kill(pid, SIGTERM);
            if (!kill_at) kill_at = t + 10.0;
        }
        if (pending && su->deadline > 0 && t > su->deadline) {
            deadline = 1;
            break;
        }
        if (kill_at > 0 && t > kill_at) { /* mpirun did not end its job: end everything */
            kill_at = 0;
            dt_proc_kill_tree(pid, 2.0, &status, &reaped);
            if (reaped) break;
        }
    }
    char why[900] = "";
    if (!reaped) { /* the start-up failed or was interrupted: name the hosts, then stop */
        if (deadline) dt_startup_describe(su, job, 1, why, sizeof why);
        dt_proc_kill_tree(pid, 2.0, &status, &reaped);
        while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    /* Ranks that outlive mpirun may hold the pipe: read what is there, then stop. */
    for (double until = dt_launch_now() + 2.0; open_e && dt_launch_now() < until;) {
        struct pollfd pf = {pe[0], POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) break;
        open_e = dt_errfilter_pump(ef, pe[0], su);
    }
    *exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (!deadline && !stop_sig && *exit_code != 0 && dt_startup_pending(su))
        dt_startup_describe(su, job, 0, why, sizeof why); /* mpirun gave up first (ssh failed) */
    launch_rank_error = ef->rank_error;
    dt_errfilter_finish(ef, why[0] != 0);
    if (deadline) {
        *exit_code = 1; /* a runtime failure (dtrain's exit codes) */
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "%s; stopped the job", why);
    } else if (stop_sig) {
        *exit_code = 128 + stop_sig;
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "signal %d (%s) before all ranks had started (%d of %d): stopped the job",
                     stop_sig, strsignal(stop_sig), su->nseen, su->nranks);
    } else if (why[0]) {
        st = dt_fail(ctx, DT_ERR_BACKEND, PFX "%s; mpirun exited with status %d", why, *exit_code);
    }
out:
    /* Whatever mpirun left (an ssh, a rank that hangs): the job is over, so a short grace. */
    if (pid > 0) dt_proc_kill_tree(pid, 0.5, NULL, NULL);
    if (pe[0] >= 0) close(pe[0]);
    if (ef) dt_errfilter_finish(ef, 1); /* frees; a no-op after the one above */
    free(ef);
    for (int i = 0; i < 3; i++)
        if (installed[i]) sigaction(sigs[i], &old[i], NULL);
    sigprocmask(SIG_SETMASK, &saved, NULL);
    return st;
}

dt_status dt_launch_run(dt_ctx *ctx, const dt_launch_cfg *cfg, int *exit_code) {
    *exit_code = 0;
    dt_startup su;
    dt_launch_cfg c;
    DT_CHECK(dt_startup_begin(ctx, &su, cfg, &c));
    dt_launch_job job;
    dt_status st = dt_launch_init(ctx, &c, &job);
    if (st == DT_OK) {
        fflush(NULL); /* nothing buffered here may be written twice or after mpirun's output */
        if ((st = dt_startup_reset(ctx, &su, &job)) == DT_OK) st = run_job(ctx, &job, &su, exit_code);
        dt_launch_free(&job);
    }
    dt_startup_end(&su);
    return st;
}
