#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "ops/ops.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dt_median(const double *x, int n) {
    if (n <= 0) return 0.0;
    double *c = malloc((size_t)n * sizeof *c);
    if (!c) return x[0];
    memcpy(c, x, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

void dt_bench_peak(dt_peak *out, int n, int reps) {
    memset(out, 0, sizeof *out);
    out->n = n;
    out->reps = reps;
    out->gflops = dt_matmul_peak_gflops(n, reps, &out->best);
}

dt_status dt_bench_train(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, int warmup,
                         int steps, dt_bench_result *r) {
    memset(r, 0, sizeof *r);
    if (warmup < 0 || steps < 1 || warmup + steps > DT_BENCH_MAX_STEPS)
        return dt_fail(ctx, DT_ERR_CONFIG, "bench: need warm-up >= 0 and 1..%d timed steps in all",
                       DT_BENCH_MAX_STEPS);
    dt_train_cfg c = *cfg;
    c.steps = warmup + steps;
    if (c.sched.total < c.steps) c.sched.total = c.steps;
    dt_trainer tr;
    DT_CHECK(dt_trainer_init(ctx, &tr, &c, comm));
    r->world = dt_comm_size(tr.comm, DT_GROUP_WORLD);
    double ex0 = 0, tot0 = 0;
    uint64_t bytes0 = 0;
    dt_status st = DT_OK;
    r->warmup = warmup;
    r->steps = steps;
    unsigned long long h = 1469598103934665603ULL;
    for (int s = 0; s < warmup + steps; s++) {
        int timed = s >= warmup;
        tr.model.profile = timed;
        if (s == warmup) {
            dt_parallel_comm_time(tr.par, &ex0, &tot0);
            bytes0 = dt_comm_bytes(tr.comm);
        }
        dt_step_stats ss;
        DT_CHECK_GOTO(dt_trainer_step(ctx, &tr, &ss));
        if (!timed) continue;
        r->step_s[s - warmup] = ss.seconds;
        r->loss[s - warmup] = ss.loss;
        r->optim_s += ss.optim_seconds;
        r->sync_s += ss.sync_seconds;
        uint32_t bits;
        memcpy(&bits, &ss.loss, 4);
        for (int k = 0; k < 4; k++) h = (h ^ ((bits >> (8 * k)) & 0xff)) * 1099511628211ULL;
    }
    r->loss_hash = h;
    double ex1, tot1;
    dt_parallel_comm_time(tr.par, &ex1, &tot1);
    r->comm_exposed_s = (ex1 - ex0) / steps;
    r->comm_total_s = (tot1 - tot0) / steps;
    r->comm_bytes_step = (double)(dt_comm_bytes(tr.comm) - bytes0) / steps;
    r->prof = tr.model.prof;
    memcpy(r->mem_peak, tr.alloc.peak, sizeof r->mem_peak);
    r->median_s = dt_median(r->step_s, steps);
    r->min_s = r->max_s = r->step_s[0];
    double sum = 0, sq = 0;
    for (int i = 0; i < steps; i++) {
        double x = r->step_s[i];
        r->min_s = x < r->min_s ? x : r->min_s;
        r->max_s = x > r->max_s ? x : r->max_s;
        sum += x;
    }
    r->mean_s = sum / steps;
    for (int i = 0; i < steps; i++) sq += (r->step_s[i] - r->mean_s) * (r->step_s[i] - r->mean_s);
    r->std_s = steps > 1 ? sqrt(sq / (steps - 1)) : 0.0;
    double tokens = (double)c.micro_batch * c.seq_len * c.accum;
    r->tokens_per_s_rank = tokens / r->median_s;
    r->tokens_per_s = r->tokens_per_s_rank * r->world;
    r->flops_per_token = dt_gpt2_flops_per_token(&tr.model.cfg, c.seq_len);
    r->achieved_gflops = r->flops_per_token * r->tokens_per_s_rank / 1e9; /* per rank */
    r->n_params = dt_gpt2_num_params(&tr.model.cfg);
fail:
    dt_trainer_free(&tr);
    return st;
}
