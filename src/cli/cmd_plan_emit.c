/* `dtrain plan ... --emit slurm|mpirun|k8s`: the recommended layout as a job file
 * (plan_emit.h; docs/launch.md "Job files"; decision 64). */
#include "cli/plan_emit.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parallel/parallel.h"

void dt_plan_emit_defaults(dt_plan_emit_opts *e) {
    memset(e, 0, sizeof *e);
    e->name = "dtrain";
    e->max_restarts = 3;
    e->signal_s = 120;
}

static int emit_need(dt_ctx *ctx, int argc, char **argv, int i) {
    if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) return 1;
    dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s needs a value", argv[i]);
    return 0;
}

static int emit_text(dt_ctx *ctx, int argc, char **argv, int *i, const char **out) {
    if (!emit_need(ctx, argc, argv, *i)) return -1;
    *out = argv[++*i];
    return 1;
}

static int emit_int(dt_ctx *ctx, int argc, char **argv, int *i, int lo, int hi, int *out) {
    if (!emit_need(ctx, argc, argv, *i)) return -1;
    char *end;
    errno = 0;
    long v = strtol(argv[*i + 1], &end, 10);
    if (end == argv[*i + 1] || *end || errno || v < lo || v > hi) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s must be a whole number in [%d, %d] (got '%s')", argv[*i], lo, hi,
                argv[*i + 1]);
        return -1;
    }
    *out = (int)v;
    ++*i;
    return 1;
}

static int emit_flag(dt_ctx *ctx, dt_plan_emit_opts *e, int argc, char **argv, int *i);

int dt_plan_emit_flag(dt_ctx *ctx, dt_plan_emit_opts *e, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    int r = emit_flag(ctx, e, argc, argv, i);
    if (r > 0 && strcmp(a, "--emit") && !e->first_flag) e->first_flag = a;
    return r;
}

static int emit_flag(dt_ctx *ctx, dt_plan_emit_opts *e, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "--emit")) {
        const char *k;
        if (emit_text(ctx, argc, argv, i, &k) < 0) return -1;
        if (!strcmp(k, "slurm")) e->kind = DT_EMIT_SLURM;
        else if (!strcmp(k, "mpirun")) e->kind = DT_EMIT_MPIRUN;
        else if (!strcmp(k, "k8s")) e->kind = DT_EMIT_K8S;
        else {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit %s: unknown kind (slurm, mpirun or k8s)", k);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--emit-out")) return emit_text(ctx, argc, argv, i, &e->out);
    if (!strcmp(a, "--job-name")) return emit_text(ctx, argc, argv, i, &e->name);
    if (!strcmp(a, "--partition")) return emit_text(ctx, argc, argv, i, &e->partition);
    if (!strcmp(a, "--time")) return emit_text(ctx, argc, argv, i, &e->time);
    if (!strcmp(a, "--account")) return emit_text(ctx, argc, argv, i, &e->account);
    if (!strcmp(a, "--hosts")) return emit_text(ctx, argc, argv, i, &e->hosts);
    if (!strcmp(a, "--hostfile")) return emit_text(ctx, argc, argv, i, &e->hostfile);
    if (!strcmp(a, "--image")) return emit_text(ctx, argc, argv, i, &e->image);
    if (!strcmp(a, "--pvc")) return emit_text(ctx, argc, argv, i, &e->pvc);
    if (!strcmp(a, "--dtrain")) return emit_text(ctx, argc, argv, i, &e->dtrain);
    if (!strcmp(a, "--cpus-per-task")) return emit_int(ctx, argc, argv, i, 1, 4096, &e->cpus_per_task);
    if (!strcmp(a, "--max-restarts")) return emit_int(ctx, argc, argv, i, 0, 1000, &e->max_restarts);
    if (!strcmp(a, "--signal-time")) return emit_int(ctx, argc, argv, i, 10, 65535, &e->signal_s);
    return 0;
}

/* Characters a value may hold to go into a job file line unquoted (#SBATCH, a hostfile). */
static int plain_word(const char *s, const char *extra) {
    if (!*s) return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr(extra, *p)) return 0;
    return 1;
}

/* Kubernetes object names: a DNS-1123 label (lower case, digits, '-', starting and ending
 * with an alphanumeric), kept to 50 characters so the operator's pod names stay within 63. */
static int dns_label(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 50 || !isalnum((unsigned char)s[0]) || !isalnum((unsigned char)s[n - 1])) return 0;
    for (const char *p = s; *p; p++)
        if (!(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '-')) return 0;
    return 1;
}

dt_status dt_plan_emit_check(dt_ctx *ctx, const dt_plan_emit_opts *e) {
    if (e->kind == DT_EMIT_NONE) {
        if (e->first_flag) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s needs --emit slurm|mpirun|k8s", e->first_flag);
        return DT_OK;
    }
    if (e->out) { /* before the plan is printed: an unwritable file fails at once */
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s", e->out);
        char *slash = strrchr(d, '/');
        if (slash) slash == d ? (void)(d[1] = 0) : (void)(*slash = 0);
        else snprintf(d, sizeof d, ".");
        if (access(e->out, F_OK) == 0 ? access(e->out, W_OK) != 0 : access(d, W_OK) != 0)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit-out %s: %s", e->out, strerror(errno));
    }
    if (e->kind == DT_EMIT_K8S) {
        if (!dns_label(e->name))
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --job-name %s: an MPIJob name is 1-50 lower-case letters, "
                           "digits and '-', starting and ending with a letter or digit", e->name);
    } else if (!plain_word(e->name, "._-") || strlen(e->name) > 64) {
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --job-name %s: use 1-64 letters, digits, '.', '_' or '-'", e->name);
    }
    const char *slurm_only[][2] = {{"--partition", e->partition}, {"--time", e->time}, {"--account", e->account}};
    for (int k = 0; k < 3; k++) {
        const char *v = slurm_only[k][1];
        if (!v) continue;
        if (e->kind != DT_EMIT_SLURM)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s is a Slurm flag (--emit slurm)", slurm_only[k][0]);
        if (!plain_word(v, "._-:,+@%"))
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s %s: not a Slurm value (letters, digits and ._-:,+@%%)",
                           slurm_only[k][0], v);
    }
    if (e->kind != DT_EMIT_MPIRUN && (e->hosts || e->hostfile))
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s goes with --emit mpirun", e->hosts ? "--hosts" : "--hostfile");
    if (e->kind == DT_EMIT_MPIRUN) {
        if (!e->hosts == !e->hostfile)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit mpirun needs the nodes: --hosts a,b,... (one host per "
                           "node) or --hostfile FILE");
        if (e->hostfile && access(e->hostfile, R_OK) != 0)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hostfile %s: %s", e->hostfile, strerror(errno));
    }
    if (e->kind != DT_EMIT_K8S && (e->image || e->pvc))
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s goes with --emit k8s", e->image ? "--image" : "--pvc");
    if (e->kind == DT_EMIT_K8S) {
        if (!e->image) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit k8s needs --image IMAGE (with dtrain and sshd)");
        if (!e->pvc)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit k8s needs --pvc CLAIM: the PersistentVolumeClaim every "
                           "pod mounts at checkpoint.dir");
        if (!dns_label(e->pvc)) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --pvc %s: not a claim name (DNS-1123 label)", e->pvc);
        if (strpbrk(e->image, " \t\n\"\\"))
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --image %s: an image reference has no blanks, quotes or backslashes",
                           e->image);
    }
    return DT_OK;
}

/* ---- the command the job runs */

typedef struct emit_cmd {
    char **w;
    int n, cap;
} emit_cmd;

static dt_status cmd_add(dt_ctx *ctx, emit_cmd *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static dt_status cmd_add(dt_ctx *ctx, emit_cmd *c, const char *fmt, ...) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        char **w = realloc(c->w, (size_t)cap * sizeof *w);
        if (!w) return dt_fail(ctx, DT_ERR_NOMEM, "dtrain plan: out of memory");
        c->w = w, c->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = malloc((size_t)len + 1);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "dtrain plan: out of memory");
    va_start(ap, fmt);
    vsnprintf(s, (size_t)len + 1, fmt, ap);
    va_end(ap);
    c->w[c->n++] = s;
    return DT_OK;
}

static void cmd_free(emit_cmd *c) {
    for (int i = 0; i < c->n; i++) free(c->w[i]);
    free(c->w);
}

/* An absolute path for a file named relative to the current directory (not resolved: it may
 * not exist yet, and on a cluster it is read where the job runs). */
static dt_status absolute(dt_ctx *ctx, const char *p, char *out, size_t n) {
    char cwd[PATH_MAX];
    if (p[0] == '/') {
        snprintf(out, n, "%s", p);
        return DT_OK;
    }
    if (!getcwd(cwd, sizeof cwd)) return dt_fail(ctx, DT_ERR_IO, "dtrain plan: getcwd: %s", strerror(errno));
    if ((size_t)snprintf(out, n, "%s/%s", cwd, p) >= n) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: path too long: %s", p);
    return DT_OK;
}

/* Keys the job file sets itself: the user's own values of them are left out. */
static int key_we_set(const char *k, size_t n) {
    static const char *const keys[] = {"parallel.strategy", "parallel.hybrid", "parallel.tp", "parallel.pp", "training.batch",
                                       "checkpoint.dir", "checkpoint.resume"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strlen(keys[i]) == n && !strncmp(k, keys[i], n)) return 1;
    return 0;
}

/* `train CONFIG FLAGS... layout keys`: plan's own flags (used[]) are left out; the config
 * path is made absolute (Slurm, mpirun) or kept as given (k8s: a path in the image). */
static dt_status train_args(dt_ctx *ctx, const dt_plan_emit_opts *e, const dt_run_cfg *rc, const dt_plan_job *job,
                            const dt_plan_layout *l, int argc, char **argv, const unsigned char *used, emit_cmd *c) {
    char path[PATH_MAX + 64];
    DT_CHECK(cmd_add(ctx, c, "train"));
    for (int i = 0; i < argc; i++) {
        if (used[i]) continue;
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) { /* the config file */
            if (e->kind == DT_EMIT_K8S) DT_CHECK(cmd_add(ctx, c, "%s", a));
            else {
                DT_CHECK(absolute(ctx, a, path, sizeof path));
                DT_CHECK(cmd_add(ctx, c, "%s", path));
            }
            continue;
        }
        const char *val = strchr(a, '=') ? NULL : i + 1 < argc ? argv[i + 1] : NULL; /* a separate value */
        const char *k = a + 2, *kv = !strcmp(a, "--set") ? val : !strncmp(a, "--set=", 6) ? a + 6 : NULL;
        size_t kn = strcspn(k, "=");
        if (kv) k = kv, kn = strcspn(kv, "=");
        if (key_we_set(k, kn)) {
            i += val != NULL;
            continue;
        }
        DT_CHECK(cmd_add(ctx, c, "%s", a));
        if (val) DT_CHECK(cmd_add(ctx, c, "%s", argv[++i]));
    }
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "parallel.strategy=%s", dt_strategy_name(l->zero)));
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "parallel.hybrid=%s", l->hybrid ? "true" : "false"));
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "parallel.tp=%d", l->tp));
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "parallel.pp=%d", l->pp));
    if (l->cp > 1) {
        DT_CHECK(cmd_add(ctx, c, "--set"));
        DT_CHECK(cmd_add(ctx, c, "parallel.cp=%d", l->cp));
    }
    if (l->ep > 1) {
        DT_CHECK(cmd_add(ctx, c, "--set"));
        DT_CHECK(cmd_add(ctx, c, "parallel.ep=%d", l->ep));
    }
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "training.batch=%ld", job->global_batch));
    if (e->kind == DT_EMIT_K8S) {
        if (rc->ckpt_dir[0] != '/')
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit k8s: checkpoint.dir %s must be an absolute path (where "
                           "--pvc %s is mounted in every pod)", rc->ckpt_dir, e->pvc);
        snprintf(path, sizeof path, "%s", rc->ckpt_dir);
    } else DT_CHECK(absolute(ctx, rc->ckpt_dir, path, sizeof path));
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "checkpoint.dir=%s", path));
    DT_CHECK(cmd_add(ctx, c, "--set"));
    DT_CHECK(cmd_add(ctx, c, "checkpoint.resume=auto"));
    return DT_OK;
}

/* ---- writing */

/* A word for bash: as it is when it holds only safe characters, else in single quotes; a
 * variable reference of the script's own ("$DTRAIN") goes out as it is. */
static void sh_word(FILE *f, const char *s) {
    if (plain_word(s, "_./:=,+@%-") || (s[0] == '"' && s[1] == '$')) {
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

/* A YAML (and JSON) double-quoted string. */
static void yaml_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* The launch, one word per argument, continued over lines for bash. */
static void sh_command(FILE *f, const char *prefix, const emit_cmd *launch, const emit_cmd *train) {
    fputs(prefix, f);
    for (int i = 0; i < launch->n; i++) {
        if (i) fputc(' ', f);
        sh_word(f, launch->w[i]);
    }
    fputs(" \\\n  ", f);
    for (int i = 0; i < train->n; i++) {
        const char *w = train->w[i];
        if (i && !strcmp(w, "--set")) fputs(" \\\n  ", f);
        else if (i) fputc(' ', f);
        sh_word(f, w);
    }
}

static int grace_s(const dt_plan_emit_opts *e) { return e->signal_s >= 60 ? e->signal_s - 30 : e->signal_s / 2; }

static void header(FILE *f, const char *what, const dt_plan_job *job, const dt_plan_result *x, const char *note) {
    char name[64];
    dt_plan_layout_name(&x->lay, name, sizeof name);
    int nodes = (job->gpus + job->dpn - 1) / job->dpn;
    fprintf(f, "# %s, written by `dtrain plan --emit` (docs/launch.md, \"Job files\").\n", what);
    fprintf(f, "# Plan: %s on %d x %s (%d node(s) x %d): %s, %.2f GiB per device, predicted step %.4g s, "
               "%.4g tokens/s.\n", job->model.name, job->gpus, job->hw->key, nodes, job->dpn, name,
            x->mem_total / 1073741824.0, x->step_s, x->tokens_s);
    if (note) fprintf(f, "# %s\n", note);
}

/* ckpt: checkpoint.dir (absolute); last: the run's last step (its final checkpoint). */
static void write_slurm(FILE *f, const dt_plan_emit_opts *e, const dt_plan_job *job, const dt_plan_result *x,
                        const char *note, const emit_cmd *launch, const emit_cmd *train, const char *ckpt, long last) {
    int nodes = job->gpus / job->dpn, cpt = e->cpus_per_task ? e->cpus_per_task : 1;
    fputs("#!/bin/bash\n", f);
    header(f, "dtrain job for Slurm (sbatch FILE)", job, x, note);
    fprintf(f, "#SBATCH --job-name=%s\n", e->name);
    fprintf(f, "#SBATCH --nodes=%d\n#SBATCH --ntasks-per-node=%d\n#SBATCH --cpus-per-task=%d\n", nodes, job->dpn, cpt);
    if (e->partition) fprintf(f, "#SBATCH --partition=%s\n", e->partition);
    if (e->account) fprintf(f, "#SBATCH --account=%s\n", e->account);
    if (e->time) fprintf(f, "#SBATCH --time=%s\n", e->time);
    fprintf(f, "#SBATCH --signal=B:USR1@%d\n#SBATCH --requeue\n#SBATCH --open-mode=append\n", e->signal_s);
    fprintf(f, "#SBATCH --output=%s-%%j.out\n", e->name);
    fprintf(f,
            "#\n"
            "# %d rank(s) run under dtrain's supervisor (dtrain launch, Open MPI's mpirun inside the\n"
            "# allocation), which restarts a failed attempt from the newest checkpoint up to %d time(s).\n"
            "# Preemption: SIGUSR1 reaches this script %d s before the time limit (or from\n"
            "# `scancel --signal=USR1 --batch JOB`); it goes on to the supervisor, every rank checkpoints\n"
            "# at the next step boundary and exits, then the script requeues the job (scontrol requeue),\n"
            "# which resumes from checkpoint.dir when it runs again. SIGTERM (scancel, Slurm's own\n"
            "# preemption) also ends in a checkpoint, but the job is not requeued by this script.\n"
            "set -u\n",
            job->gpus, e->max_restarts, e->signal_s);
    fputs("DTRAIN=${DTRAIN:-", f);
    sh_word(f, e->dtrain);
    fputs("}\n", f);
    fprintf(f, "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-%d}\n", cpt);
    fputs("echo \"dtrain job $SLURM_JOB_ID: run $((${SLURM_RESTART_COUNT:-0} + 1)) on $SLURM_JOB_NODELIST\"\n"
          "pid='' requeue=0\n"
          "forward() { [ -n \"$pid\" ] && kill -USR1 \"$pid\" 2>/dev/null; }\n"
          "trap 'requeue=1; forward' USR1\n"
          "trap forward TERM\n",
          f);
    sh_command(f, "", launch, train);
    fputs(" &\n"
          "pid=$!\n"
          "[ \"$requeue\" = 1 ] && forward\n"
          "while :; do  # wait returns early when a trapped signal arrives\n"
          "  wait \"$pid\"\n"
          "  rc=$?\n"
          "  kill -0 \"$pid\" 2>/dev/null || break\n"
          "done\n"
          "if [ \"$requeue\" = 1 ] && [ \"$rc\" = 0 ]; then\n",
          f);
    fputs("  if [ \"$(cat ", f);
    char latest[PATH_MAX + 80];
    snprintf(latest, sizeof latest, "%s/latest", ckpt);
    sh_word(f, latest);
    fprintf(f, " 2>/dev/null)\" = step-%08ld ]; then\n"
               "    echo \"dtrain job $SLURM_JOB_ID: SIGUSR1 came after the last step (%ld): finished, not requeueing\"\n"
               "    exit 0\n"
               "  fi\n",
            last, last);
    fputs("  echo \"dtrain job $SLURM_JOB_ID: checkpointed after SIGUSR1; requeueing\"\n"
          "  scontrol requeue \"$SLURM_JOB_ID\" && exit 0\n"
          "  echo \"dtrain job $SLURM_JOB_ID: scontrol requeue failed\" >&2\n"
          "  exit 1\n"
          "fi\n"
          "exit \"$rc\"\n",
          f);
}

static dt_status write_mpirun(dt_ctx *ctx, FILE *f, const dt_plan_emit_opts *e, const dt_plan_job *job,
                              const dt_plan_result *x, const char *note, const emit_cmd *launch, const emit_cmd *train) {
    fputs("#!/bin/bash\n", f);
    header(f, "dtrain job for hosts in a hostfile (bash FILE)", job, x, note);
    fprintf(f,
            "# %d rank(s), %d per host, under dtrain's supervisor (dtrain launch: Open MPI's mpirun over\n"
            "# ssh), which restarts a failed attempt from the newest checkpoint up to %d time(s).\n"
            "# SIGTERM, SIGUSR1 or SIGINT to this script: every rank checkpoints and the job ends (status 0).\n"
            "set -u\n",
            job->gpus, job->dpn, e->max_restarts);
    fputs("DTRAIN=${DTRAIN:-", f);
    sh_word(f, e->dtrain);
    fputs("}\n", f);
    if (e->hosts) {
        fprintf(f, "hostfile=$(dirname \"$0\")/%s.hosts\n"
                   "cat >\"$hostfile\" <<'EOF'\n", e->name);
        char *h = strdup(e->hosts);
        if (!h) return dt_fail(ctx, DT_ERR_NOMEM, "dtrain plan: out of memory");
        for (char *save = NULL, *t = strtok_r(h, ",", &save); t; t = strtok_r(NULL, ",", &save))
            fprintf(f, "%s slots=%d\n", t, job->dpn);
        free(h);
        fputs("EOF\n", f);
    } else {
        char path[PATH_MAX + 64];
        DT_CHECK(absolute(ctx, e->hostfile, path, sizeof path));
        fputs("hostfile=", f);
        sh_word(f, path);
        fputs("\n[ -r \"$hostfile\" ] || { echo \"$0: hostfile $hostfile is not readable\" >&2; exit 2; }\n", f);
    }
    if (e->cpus_per_task) fprintf(f, "export OMP_NUM_THREADS=%d\n", e->cpus_per_task);
    sh_command(f, "exec ", launch, train);
    fputc('\n', f);
    return DT_OK;
}

static void yaml_mounts(FILE *f, const char *in, const char *ckpt) {
    fprintf(f, "%svolumeMounts:\n%s- name: checkpoints\n%s  mountPath: ", in, in, in);
    yaml_str(f, ckpt);
    fputc('\n', f);
}

static void yaml_pod_end(FILE *f, const dt_plan_emit_opts *e) {
    fputs("          volumes:\n          - name: checkpoints\n            persistentVolumeClaim:\n"
          "              claimName: ", f);
    yaml_str(f, e->pvc);
    fputc('\n', f);
}

static void write_k8s(FILE *f, const dt_plan_emit_opts *e, const dt_run_cfg *rc, const dt_plan_job *job,
                      const dt_plan_result *x, const char *note, const emit_cmd *launch, const emit_cmd *train) {
    int nodes = job->gpus / job->dpn, cpt = e->cpus_per_task ? e->cpus_per_task : 1;
    header(f, "dtrain MPIJob for the Kubeflow MPI operator (kubectl apply -f FILE)", job, x, note);
    fprintf(f,
            "# %d worker pod(s) x %d slot(s) run the ranks; the launcher pod runs dtrain's supervisor (dtrain\n"
            "# launch: mpirun over the operator's ssh and hostfile), which restarts a failed attempt from the\n"
            "# newest checkpoint up to %d time(s). A pod's SIGTERM (eviction, deletion) makes every rank\n"
            "# checkpoint at the next step boundary within %d s; a new launcher resumes from checkpoint.dir\n"
            "# on the claim %s.\n",
            nodes, job->dpn, e->max_restarts, grace_s(e), e->pvc);
    fprintf(f, "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata:\n  name: %s\nspec:\n", e->name);
    fprintf(f, "  slotsPerWorker: %d\n  mpiImplementation: OpenMPI\n  runPolicy:\n    cleanPodPolicy: Running\n"
               "    backoffLimit: %d\n  mpiReplicaSpecs:\n",
            job->dpn, e->max_restarts);
    fputs("    Launcher:\n      replicas: 1\n      restartPolicy: OnFailure\n      template:\n        spec:\n", f);
    fprintf(f, "          terminationGracePeriodSeconds: %d\n          containers:\n          - name: launcher\n"
               "            image: ", grace_s(e) + 30);
    yaml_str(f, e->image);
    fputs("\n            command:\n", f);
    for (int i = 0; i < launch->n; i++) {
        fputs("            - ", f);
        yaml_str(f, launch->w[i]);
        fputc('\n', f);
    }
    for (int i = 0; i < train->n; i++) {
        fputs("            - ", f);
        yaml_str(f, train->w[i]);
        fputc('\n', f);
    }
    fprintf(f, "            env:\n            - name: OMP_NUM_THREADS\n              value: \"%d\"\n", cpt);
    yaml_mounts(f, "            ", rc->ckpt_dir);
    yaml_pod_end(f, e);
    fprintf(f, "    Worker:\n      replicas: %d\n      restartPolicy: OnFailure\n      template:\n        spec:\n", nodes);
    fprintf(f, "          terminationGracePeriodSeconds: %d\n          containers:\n          - name: worker\n"
               "            image: ", grace_s(e) + 30);
    yaml_str(f, e->image);
    fprintf(f, "\n            command: [\"/usr/sbin/sshd\", \"-De\"]\n            resources:\n"
               "              requests:\n                cpu: \"%d\"\n              limits:\n                cpu: \"%d\"\n",
            job->dpn * cpt, job->dpn * cpt);
    yaml_mounts(f, "            ", rc->ckpt_dir);
    yaml_pod_end(f, e);
}


dt_status dt_plan_emit(dt_ctx *ctx, const dt_plan_emit_opts *e, const dt_run_cfg *rc, const dt_plan_job *job,
                       const dt_plan_result *r, int n, int argc, char **argv, const unsigned char *used) {
    int best = -1, fastest = -1;
    for (int i = 0; i < n; i++) {
        if (!r[i].fits) continue;
        if (fastest < 0 || r[i].step_s < r[fastest].step_s) fastest = i;
        if (dt_plan_dtrain_runs(job, &r[i].lay) && (best < 0 || r[i].step_s < r[best].step_s)) best = i;
    }
    if (best < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit: no layout a dtrain job can run (data parallel: ddp, "
                       "zero1-3, hybrid; tensor parallel dividing the heads; pipeline parallel; context parallel over "
                       "sequences of a multiple of 2 cp; expert parallel with ddp) fits %d x %s%s", job->gpus, job->hw->key,
                       fastest >= 0 ? " (layouts a job cannot run yet do: marked * in the table)" : "");
    if (!rc->ckpt_dir[0])
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit needs checkpoint.dir (in the config or --set "
                       "checkpoint.dir=DIR): a restarted or requeued job resumes from it");
    if (e->kind == DT_EMIT_MPIRUN && e->hosts) {
        int count = 1;
        for (const char *p = e->hosts; *p; p++) count += *p == ',';
        if (!plain_word(e->hosts, "._-,") || strstr(e->hosts, ",,") || e->hosts[strlen(e->hosts) - 1] == ',')
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hosts %s: expected host names separated by commas", e->hosts);
        if (count != job->gpus / job->dpn)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hosts names %d host(s); the plan has %d node(s) of %d rank(s)",
                           count, job->gpus / job->dpn, job->dpn);
    }
    char note[512], fname[64], bname[64];
    const char *note_p = NULL;
    if (best != fastest) {
        dt_plan_layout_name(&r[fastest].lay, fname, sizeof fname);
        dt_plan_layout_name(&r[best].lay, bname, sizeof bname);
        snprintf(note, sizeof note, "The fastest layout, %s (step %.4g s), is one a dtrain job cannot run yet (no "
                 "context or expert parallelism); this job runs the fastest one it can, %s (step %.4g s).", fname,
                 r[fastest].step_s, bname, r[best].step_s);
        note_p = note;
    }
    dt_plan_emit_opts eo = *e;
    char self[PATH_MAX];
    if (!eo.dtrain) {
        if (e->kind == DT_EMIT_K8S) eo.dtrain = "dtrain";
        else {
            ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
            if (k <= 0) return dt_fail(ctx, DT_ERR_IO, "dtrain plan: cannot find this binary (/proc/self/exe); give --dtrain PATH");
            self[k] = 0;
            eo.dtrain = self;
        }
    }
    emit_cmd launch = {0}, train = {0};
    dt_status st = DT_OK;
    /* The scripts name the binary once, in DTRAIN (overridable from the environment). */
    st = cmd_add(ctx, &launch, "%s", e->kind == DT_EMIT_K8S ? eo.dtrain : "\"$DTRAIN\"");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "launch");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "-n");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "%d", job->gpus);
    if (st == DT_OK && e->kind == DT_EMIT_MPIRUN) st = cmd_add(ctx, &launch, "--hostfile");
    if (st == DT_OK && e->kind == DT_EMIT_MPIRUN) st = cmd_add(ctx, &launch, "\"$hostfile\"");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "--ranks-per-node");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "%d", job->dpn);
    if (st == DT_OK) st = cmd_add(ctx, &launch, "--max-restarts");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "%d", e->max_restarts);
    if (st == DT_OK) st = cmd_add(ctx, &launch, "--grace");
    if (st == DT_OK) st = cmd_add(ctx, &launch, "%d", grace_s(e));
    if (st == DT_OK) st = cmd_add(ctx, &launch, "--");
    if (st == DT_OK) st = train_args(ctx, e, rc, job, &r[best].lay, argc, argv, used, &train);
    /* The run's last step: training.steps, or training.tokens over the global batch the job sets. */
    long per_step = job->global_batch * (long)rc->train.seq_len;
    long last = rc->tokens > 0 && per_step > 0 ? (rc->tokens + per_step - 1) / per_step : rc->train.steps;
    char ckpt[PATH_MAX + 64];
    if (st == DT_OK) st = e->kind == DT_EMIT_K8S ? DT_OK : absolute(ctx, rc->ckpt_dir, ckpt, sizeof ckpt);
    FILE *f = stdout;
    if (st == DT_OK && e->out && !(f = fopen(e->out, "w")))
        st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --emit-out %s: %s", e->out, strerror(errno));
    if (st == DT_OK) {
        if (e->kind == DT_EMIT_SLURM) write_slurm(f, &eo, job, &r[best], note_p, &launch, &train, ckpt, last);
        else if (e->kind == DT_EMIT_MPIRUN) st = write_mpirun(ctx, f, &eo, job, &r[best], note_p, &launch, &train);
        else write_k8s(f, &eo, rc, job, &r[best], note_p, &launch, &train);
        int bad = ferror(f);
        if (f != stdout) {
            bad |= fclose(f) != 0;
            if (e->kind != DT_EMIT_K8S) chmod(e->out, 0755);
        } else bad |= fflush(f) != 0;
        if (st == DT_OK && bad) st = dt_fail(ctx, DT_ERR_IO, "dtrain plan: --emit-out %s: write failed", e->out ? e->out : "(stdout)");
    }
    if (st == DT_OK) {
        static const char *kinds[] = {"", "slurm", "mpirun", "k8s"};
        dt_plan_layout_name(&r[best].lay, bname, sizeof bname);
        fprintf(stderr, "dtrain plan: %s job %s for %s on %d node(s) x %d written to %s\n", kinds[e->kind], e->name, bname,
                job->gpus / job->dpn, job->dpn, e->out ? e->out : "stdout");
        if (note_p) fprintf(stderr, "dtrain plan: %s\n", note_p);
    }
    cmd_free(&launch);
    cmd_free(&train);
    return st;
}
