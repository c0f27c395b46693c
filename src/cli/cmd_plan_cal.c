/* dtrain plan --calibrate FILE: measures this machine with dtrain's own benchmarks and writes a
 * catalog entry for it (src/plan/calibrate.h): `dtrain launch -n R -- bench --json` (the
 * matmul peak and the model FLOP/s of a training step per rank, on the configuration given)
 * and `dtrain launch -n R -- bench comm --fit` (the node-local link). */
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

dt_status dt_plan_calibrate(dt_ctx *ctx, const char *out, int ranks, int argc, char **argv) {
    char self[4096], dir[4200], bench_json[4300], comm_json[4300], nr[16], ncr[16];
    int comm_ranks = ranks < 2 ? 2 : ranks; /* a link needs two ends */
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot find this executable (/proc/self/exe)");
    self[sl] = 0;
    snprintf(dir, sizeof dir, "%s/dtrain-calibrate-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot create %s: %s", dir, strerror(errno));
    snprintf(bench_json, sizeof bench_json, "%s/bench.json", dir);
    snprintf(comm_json, sizeof comm_json, "%s/commfit.json", dir);
    snprintf(nr, sizeof nr, "%d", ranks);
    snprintf(ncr, sizeof ncr, "%d", comm_ranks);
    char **a = calloc((size_t)argc + 16, sizeof *a);
    if (!a) return dt_fail(ctx, DT_ERR_NOMEM, "plan --calibrate: out of memory");
    int n = 0;
    /* under R ranks, as the comm fit: peak_gflops and tflops_rank are then one rank's */
    a[n++] = self, a[n++] = "launch", a[n++] = "-n", a[n++] = nr, a[n++] = "--", a[n++] = "bench";
    for (int i = 0; i < argc; i++) a[n++] = argv[i];
    a[n++] = "--json", a[n++] = bench_json, a[n] = NULL;
    printf("# plan --calibrate: 1/2 dtrain launch -n %d -- bench (the matmul peak and a step's FLOP/s per rank)\n", ranks);
    dt_status st = run_child(ctx, a);
    if (st == DT_OK) {
        char *c[] = {self, "launch", "-n", ncr, "--", "bench", "comm", "--max-bytes", "64M", "--fit", comm_json, NULL};
        printf("# plan --calibrate: 2/2 dtrain launch -n %d -- bench comm --fit (the node's link)\n", comm_ranks);
        st = run_child(ctx, c);
    }
    free(a);
    cJSON *bj = NULL;
    dt_comm_fit fit;
    if (st == DT_OK) st = dt_json_read(ctx, bench_json, &bj);
    if (st == DT_OK) st = dt_comm_fit_load(ctx, comm_json, &fit);
    if (st == DT_OK) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        dt_plan_cal c = {at(bj, "peak_gflops", NULL, NULL), 1e3 * at(bj, "summary", "tflops_rank", "mean"),
                         (double)pages * (double)psz, ranks, &fit, "dtrain bench + dtrain bench comm --fit",
                         comm_ranks};
        st = dt_plan_cal_write(ctx, out, &c);
        if (st == DT_OK)
            printf("# wrote %s: cpu-calibrated, peak %.4g GFLOP/s per rank, a step reached %.4g (GEMM efficiency "
                   "%.3g, at most 1); dtrain plan --catalog %s --hardware cpu-calibrated --gpus N ...\n",
                   out, c.peak_gflops, c.achieved_gflops, c.achieved_gflops / c.peak_gflops, out);
    }
    cJSON_Delete(bj);
    remove(bench_json), remove(comm_json), rmdir(dir);
    return st;
}
