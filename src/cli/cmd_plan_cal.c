/* dtrain plan --calibrate FILE: measures this machine with dtrain's own benchmarks and writes a
 * catalog entry for it (src/plan/calibrate.h): `dtrain launch -n R -- bench --json` (the
 * matmul peak and the model FLOP/s of a training step per rank, on the configuration given),
 * two probes, the same of gpt2-tiny under DDP and (R >= 2) ZeRO-3 (with the first run: the
 * time per FLOP and the fixed costs of a micro-batch and of a collective call; decision 55),
 * and `dtrain launch -n R -- bench comm --fit` (the node-local link, and read at the job's
 * activation size the tensor-parallel link tp-fit, decision 71, and from its ping-pong the
 * pipeline link pp-fit, decision 77, and from its all-to-all the expert-parallel link ep-fit,
 * decision 92). With --nodes M they all
 * run across M nodes (simulated with DTRAIN_NODE_ID, or the hosts of --hosts) and the fit
 * also gives the inter-node link.
 * --comm-fit FILE takes a fit made before instead. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/jsonfile.h"
#include "plan/calibrate.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* a macro's value as a string literal */

/* Runs argv (argv[0] = this executable) and waits; its output goes to ours. */
static dt_status run_child(dt_ctx *ctx, char **argv) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: fork: %s", strerror(errno));
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return dt_fail(ctx, DT_ERR_BACKEND, "plan --calibrate: 'dtrain %s %s' failed (status %d)", argv[1],
                       argv[2] ? argv[2] : "", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return DT_OK;
}

static double at(const cJSON *o, const char *a, const char *b, const char *c) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (c) x = cJSON_GetObjectItemCaseSensitive(x, c);
    return cJSON_IsNumber(x) ? x->valuedouble : 0.0;
}

static const char *str_at(const cJSON *o, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, a), b);
    return cJSON_IsString(x) ? x->valuestring : "";
}

/* One DDP run's measurements from its bench --json (the all-reduce only under ddp). */
static dt_status cal_run(dt_ctx *ctx, const cJSON *j, const char *what, dt_plan_cal_run *r) {
    memset(r, 0, sizeof *r);
    r->step_s = at(j, "summary", "step_s", "median"); /* robust to the odd step another process delays */
    r->flops = at(j, "flops_per_token", NULL, NULL) * at(j, "parallel", "micro_batch", NULL) *
               at(j, "model", "seq_len", NULL) * at(j, "parallel", "accum", NULL);
    if (!(r->step_s > 0) || !(r->flops > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: %s: the bench JSON has no step time or FLOPs", what);
    if (!strcmp(str_at(j, "parallel", "strategy"), "ddp")) r->grad_bytes = 4.0 * at(j, "model", "trainable_params", NULL);
    r->bucket_bytes = at(j, "parallel", "bucket_bytes", NULL);
    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "parallel"), "overlap");
    r->overlap = cJSON_IsTrue(ov);
    r->params = at(j, "model", "trainable_params", NULL);
    r->opt_s = at(j, "summary", "breakdown_s", "optimizer"); /* the mean over steps; 0 when absent */
    /* the head's share (its gradients computed in the forward by the fused loss: decision 97) */
    double fpt = at(j, "flops_per_token", NULL, NULL), head = 6.0 * at(j, "model", "vocab", NULL) * at(j, "model", "d_model", NULL);
    r->layer_share = fpt > 0 && head > 0 && head < fpt ? 1.0 - head / fpt : 0;
    return DT_OK;
}

/* The calibration's own flags; everything else goes to dtrain bench. */
typedef struct cal_flags {
    const char *out, *hosts, *comm_fit, *max_bytes;
    int ranks, nodes;
    double link_bytes;
} cal_flags;

/* `dtrain launch -n R [--hosts LIST | --simulate-nodes M] -- bench` into a; returns the count. */
static int launch_argv(char **a, char *self, char *nr, const cal_flags *f, char *nn) {
    int n = 0;
    a[n++] = self, a[n++] = "launch", a[n++] = "-n", a[n++] = nr;
    if (f->hosts) a[n++] = "--hosts", a[n++] = (char *)f->hosts;
    else if (f->nodes > 1) a[n++] = "--simulate-nodes", a[n++] = nn;
    a[n++] = "--", a[n++] = "bench";
    return n;
}

static dt_status whole_flag(dt_ctx *ctx, const char *flag, const char *v, const char *what, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < 1 || x > 4096)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s expects a whole number of %s >= 1", flag, what);
    *out = (int)x;
    return DT_OK;
}

static dt_status size_flag(dt_ctx *ctx, const char *v, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0, mul = 1;
    if (v && (*end == 'K' || *end == 'k')) mul = 1024, end++;
    else if (v && (*end == 'M' || *end == 'm')) mul = 1048576, end++;
    else if (v && (*end == 'G' || *end == 'g')) mul = 1073741824.0, end++;
    if (!v || end == v || *end || !(x * mul >= 4096 && x * mul <= 1073741824.0))
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --comm-max-bytes expects a size like 64M, from 4K to 1G (got '%s')",
                       v ? v : "");
    *out = x * mul;
    return DT_OK;
}

/* Takes the calibration's flags out of argv (pass: the rest, for dtrain bench) and checks them. */
static dt_status cal_parse(dt_ctx *ctx, int argc, char **argv, cal_flags *f, char **pass, int *np) {
    memset(f, 0, sizeof *f);
    f->ranks = 2, f->nodes = 1, f->max_bytes = "64M", f->link_bytes = 64.0 * 1048576;
    *np = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        dt_status st = DT_OK;
        if (!strcmp(a, "--calibrate")) f->out = v;
        else if (!strcmp(a, "--ranks")) st = whole_flag(ctx, a, v, "ranks", &f->ranks);
        else if (!strcmp(a, "--nodes")) st = whole_flag(ctx, a, v, "nodes", &f->nodes);
        else if (!strcmp(a, "--hosts")) f->hosts = v;
        else if (!strcmp(a, "--comm-fit")) f->comm_fit = v;
        else if (!strcmp(a, "--comm-max-bytes")) st = size_flag(ctx, v, &f->link_bytes), f->max_bytes = v;
        else {
            pass[(*np)++] = argv[i];
            continue;
        }
        DT_CHECK(st);
        if (!v || !strncmp(v, "--", 2)) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: %s needs a value", a);
        i++;
    }
    if (f->ranks % f->nodes)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --ranks %d do not split evenly over --nodes %d (each node the "
                       "same ranks)", f->ranks, f->nodes);
    if (f->hosts && f->nodes < 2)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hosts %s goes with --nodes M >= 2 (the comm fit across them)",
                       f->hosts);
    if (f->hosts && f->comm_fit)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --hosts runs a comm fit, --comm-fit %s reuses one: not both",
                       f->comm_fit);
    return DT_OK;
}

dt_status dt_plan_calibrate(dt_ctx *ctx, int argc, char **argv) {
    char self[4096], dir[4200], bench_json[4300], comm_json[4300], probe_json[2][4300], nr[16], ncr[16], nn[16];
    char **pass = calloc((size_t)argc + 16, sizeof *pass);
    if (!pass) return dt_fail(ctx, DT_ERR_NOMEM, "plan --calibrate: out of memory");
    cal_flags f;
    int np = 0;
    dt_status st = cal_parse(ctx, argc, argv, &f, pass, &np);
    const int multi = f.nodes > 1;
    int comm_ranks = multi ? f.ranks : f.ranks < 2 ? 2 : f.ranks; /* a link needs two ends */
    dt_comm_fit fit;
    dt_plan_cal c = {.ranks = f.ranks, .fit = &fit, .source = "dtrain bench + dtrain bench comm --fit",
                     .comm_ranks = comm_ranks, .nodes = f.nodes, .link_bytes = f.link_bytes};
    if (st == DT_OK && f.comm_fit) { /* a fit made before: checked before anything runs */
        if ((st = dt_comm_fit_load(ctx, f.comm_fit, &fit)) == DT_OK && !multi && fit.nodes > 1)
            st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --comm-fit %s ran on %d nodes: give --nodes %d", f.comm_fit,
                         fit.nodes, fit.nodes);
        c.comm_ranks = multi ? f.ranks : fit.ranks;
        c.source = "dtrain bench + the comm fit of --comm-fit";
        double bw, lat;
        const char *name;
        for (int lv = 0; lv < 2 && st == DT_OK; lv++)
            if ((st = dt_plan_cal_link(ctx, &c, lv, &bw, &lat, &name)) != DT_OK) {
                char why[DT_ERRMSG_MAX];
                const char *p = strncmp(ctx->err, "plan --calibrate: ", 18) ? ctx->err : ctx->err + 18;
                snprintf(why, sizeof why, "%s", p);
                st = dt_fail(ctx, DT_ERR_CONFIG, "dtrain plan: --comm-fit %s: %s", f.comm_fit, why);
            }
    }
    ssize_t sl = st == DT_OK ? readlink("/proc/self/exe", self, sizeof self - 1) : 1;
    if (sl <= 0) st = dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot find this executable (/proc/self/exe)");
    if (st != DT_OK) {
        free(pass);
        return st;
    }
    self[sl] = 0;
    snprintf(dir, sizeof dir, "%s/dtrain-calibrate-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        free(pass);
        return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot create %s: %s", dir, strerror(errno));
    }
    snprintf(bench_json, sizeof bench_json, "%s/bench.json", dir);
    snprintf(comm_json, sizeof comm_json, "%s/commfit.json", dir);
    snprintf(probe_json[0], sizeof probe_json[0], "%s/probe.json", dir);
    snprintf(probe_json[1], sizeof probe_json[1], "%s/probe-zero3.json", dir);
    snprintf(nr, sizeof nr, "%d", f.ranks);
    snprintf(ncr, sizeof ncr, "%d", comm_ranks);
    snprintf(nn, sizeof nn, "%d", f.nodes);
    char **a = calloc((size_t)np + 16, sizeof *a);
    if (!a) st = dt_fail(ctx, DT_ERR_NOMEM, "plan --calibrate: out of memory");
    const int probes = f.ranks > 1 ? 2 : 1; /* ZeRO-3 needs 2+ ranks */
    int n = 0, steps = 1 + probes + !f.comm_fit, step = 1;
    /* the runs are laid out as the entry's devices: R ranks, on the M nodes of the comm fit
     * (--hosts, else simulated on this machine, sharing its cores) */
    char where[4200];
    snprintf(where, sizeof where, "%s%s", f.hosts ? " --hosts " : multi ? " --simulate-nodes " : "",
             f.hosts ? f.hosts : multi ? nn : "");
    if (st == DT_OK) {
        n = launch_argv(a, self, nr, &f, nn);
        for (int i = 0; i < np; i++) a[n++] = pass[i];
        a[n++] = "--json", a[n++] = bench_json, a[n] = NULL;
        printf("# plan --calibrate: %d/%d dtrain launch -n %d%s -- bench (the matmul peak and a step's FLOP/s per rank)\n",
               step++, steps, f.ranks, where);
        st = run_child(ctx, a);
    }
    for (int z = 0; z < probes && st == DT_OK; z++) { /* the probes: a tiny model's step is mostly fixed
                                                         cost, per step and per collective call (decision 55) */
        static char *const probe[] = {"--model", DT_PLAN_CAL_PROBE_MODEL, "--seq", STR(DT_PLAN_CAL_PROBE_SEQ),
                                      "--batch", STR(DT_PLAN_CAL_PROBE_BATCH),
                                      "--bench-steps", "30", "--warmup-steps", "5", "--repeats", "3", "--peak", "100",
                                      "--set"};
        char *pr[48];
        int k = launch_argv(pr, self, nr, &f, nn);
        for (size_t i = 0; i < sizeof probe / sizeof *probe; i++) pr[k++] = probe[i];
        pr[k++] = z ? "parallel.strategy=zero3" : "parallel.strategy=ddp";
        pr[k++] = "--json", pr[k++] = probe_json[z], pr[k] = NULL;
        printf("# plan --calibrate: %d/%d dtrain launch -n %d%s -- bench --model gpt2-tiny --set %s (the fixed cost of "
               "%s)\n", step++, steps, f.ranks, where, pr[k - 3], z ? "a collective call" : "a step");
        st = run_child(ctx, pr);
    }
    if (st == DT_OK && !f.comm_fit) {
        char *cm[20];
        int k = launch_argv(cm, self, ncr, &f, nn);
        cm[k++] = "comm", cm[k++] = "--max-bytes", cm[k++] = (char *)f.max_bytes;
        cm[k++] = "--fit", cm[k++] = comm_json, cm[k] = NULL;
        if (!multi)
            printf("# plan --calibrate: %d/%d dtrain launch -n %d -- bench comm --fit (the node's link)\n", step, steps,
                   comm_ranks);
        else
            printf("# plan --calibrate: %d/%d dtrain launch -n %d%s -- bench comm --fit (the links inside and across %d "
                   "nodes)\n", step, steps, comm_ranks, where, f.nodes);
        st = run_child(ctx, cm);
        if (st == DT_OK) st = dt_comm_fit_load(ctx, comm_json, &fit);
    }
    free(a);
    free(pass);
    cJSON *bj = NULL, *pj = NULL, *zj = NULL;
    if (st == DT_OK) st = dt_json_read(ctx, bench_json, &bj);
    if (st == DT_OK) st = dt_json_read(ctx, probe_json[0], &pj);
    if (st == DT_OK && probes > 1) st = dt_json_read(ctx, probe_json[1], &zj);
    if (st == DT_OK) st = cal_run(ctx, bj, "the calibration run", &c.run);
    if (st == DT_OK) st = cal_run(ctx, pj, "the gpt2-tiny probe", &c.probe);
    if (st == DT_OK && zj) st = cal_run(ctx, zj, "the gpt2-tiny ZeRO-3 probe", &c.zprobe);
    if (st == DT_OK) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        c.peak_gflops = at(bj, "peak_gflops", NULL, NULL), c.achieved_gflops = c.run.flops / c.run.step_s / 1e9;
        c.memory_bytes = (double)pages * (double)psz;
        c.machine_ranks = (int)at(bj, "environment", "machine_ranks", NULL); /* who share the cores */
        c.cores = (int)at(bj, "environment", "cores", NULL), c.threads = (int)at(bj, "environment", "threads", NULL);
        /* the TP link is read at the activation a TP group of this job all-reduces (decision 71) */
        c.tp_bytes = 4.0 * at(bj, "parallel", "micro_batch", NULL) * at(bj, "model", "seq_len", NULL) *
                     at(bj, "model", "d_model", NULL);
        dt_plan_cal_fit fit_out;
        st = dt_plan_cal_write(ctx, f.out, &c, &fit_out);
        if (st == DT_OK)
            printf("# measured: the calibration's step %.6g ms (%.6g GFLOP per rank), the probe's %.6g ms (%.6g GFLOP), "
                   "the ZeRO-3 probe's %.6g ms\n", c.run.step_s * 1e3, c.run.flops / 1e9, c.probe.step_s * 1e3,
                   c.probe.flops / 1e9, c.zprobe.step_s * 1e3);
        if (st == DT_OK && fit_out.comm_over_s > 0)
            printf("# note: the calibration run's predicted all-reduce and calls (%.4g ms) exceed its step (%.4g ms): "
                   "its time per FLOP is the whole step, no fixed costs solved (the links' fit over-predicts; a "
                   "loaded machine?)\n", fit_out.comm_over_s * 1e3, c.run.step_s * 1e3);
        double tbw, tlat;
        if (st == DT_OK && dt_plan_cal_tp_link(ctx, &c, &tbw, &tlat) == DT_OK)
            printf("# tensor-parallel link tp-fit: %.4g GB/s, %.4g us (the all-reduce fit at the job's activation, "
                   "%.4g KiB)\n", tbw, tlat, c.tp_bytes / 1024);
        if (st == DT_OK && dt_plan_cal_pp_link(ctx, &c, &tbw, &tlat) == DT_OK)
            printf("# pipeline link pp-fit: %.4g GB/s, %.4g us (the ping-pong fit at the job's activation, %.4g KiB)\n",
                   tbw, tlat, c.tp_bytes / 1024);
        if (st == DT_OK && dt_plan_cal_ep_link(ctx, &c, &tbw, &tlat) == DT_OK)
            printf("# expert-parallel link ep-fit: %.4g GB/s, %.4g us (the all-to-all fit at the job's activation, "
                   "%.4g KiB a rank)\n", tbw, tlat, c.tp_bytes / 1024);
        if (st == DT_OK && dt_plan_cal_pp_inter_link(ctx, &c, &tbw, &tlat) == DT_OK)
            printf("# pipeline link across nodes pp-net-fit: %.4g GB/s, %.4g us (the cross group's ping-pong)\n", tbw, tlat);
        if (st == DT_OK && dt_plan_cal_ep_inter_link(ctx, &c, &tbw, &tlat) == DT_OK)
            printf("# expert-parallel link across nodes ep-net-fit: %.4g GB/s, %.4g us (the cross group's all-to-all)\n",
                   tbw, tlat);
        if (st == DT_OK)
            printf("# wrote %s: cpu-calibrated, peak %.4g GFLOP/s per rank%s, a step reached %.4g; GEMM efficiency %.3g "
                   "of peak, fixed costs %.4g us per micro-batch and %.4g us per collective call, optimizer %.4g GB/s; "
                   "dtrain plan --catalog %s --hardware cpu-calibrated --gpus N%s ...\n",
                   f.out, fit_out.peak_gflops, fit_out.peak_raised ? " (raised from the benchmark's: the runs were faster)" : "",
                   c.achieved_gflops, fit_out.eff, fit_out.overhead_us, fit_out.call_us,
                   fit_out.opt_bw_gbs, f.out,
                   multi ? " --nodes M" : "");
    }
    cJSON_Delete(bj);
    cJSON_Delete(pj);
    cJSON_Delete(zj);
    remove(bench_json), remove(probe_json[0]), remove(probe_json[1]), remove(comm_json), rmdir(dir);
    return st;
}
