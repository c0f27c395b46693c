#include "bench/bench.h"

#include "model/lora.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/procinfo.h"
#include "core/sortcmp.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"

double dt_median(const double *x, int n) {
    dt_stats s;
    dt_stats_of(&s, x, n);
    return s.median;
}

void dt_stats_of(dt_stats *out, const double *x, int n) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return;
    double *c = malloc((size_t)n * sizeof *c);
    double sum = 0, sq = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    out->mean = sum / n;
    for (int i = 0; i < n; i++) sq += (x[i] - out->mean) * (x[i] - out->mean);
    out->std = n > 1 ? sqrt(sq / (n - 1)) : 0.0;
    out->min = out->max = x[0];
    for (int i = 1; i < n; i++) {
        out->min = x[i] < out->min ? x[i] : out->min;
        out->max = x[i] > out->max ? x[i] : out->max;
    }
    if (!c) { /* no memory for the sorted copy: the median is the one statistic lost */
        out->median = NAN;
        return;
    }
    memcpy(c, x, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, dt_cmp_double);
    out->median = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
}

double dt_bench_mfu(double flops_per_token, double tokens_per_s_rank, double peak_gflops) {
    return peak_gflops > 0 ? flops_per_token * tokens_per_s_rank / (peak_gflops * 1e9) : 0.0;
}

uint64_t dt_bench_loss_hash(const float *loss, int n) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &loss[i], 4);
        for (int k = 0; k < 4; k++) h = (h ^ ((bits >> (8 * k)) & 0xff)) * 1099511628211ULL;
    }
    return h;
}

size_t dt_bench_rss_hwm(void) { return dt_proc_bytes("/proc/self/status", "VmHWM"); }

void dt_bench_peak(dt_peak *out, dt_dtype dt, int n, int reps) {
    memset(out, 0, sizeof *out);
    out->n = n;
    out->reps = reps;
    out->gflops = dt == DT_F32 ? dt_matmul_peak_gflops(n, reps, &out->best)
                               : dt_matmul_peak_gflops_lp(dt, n, reps, &out->best);
}

/* A timed step's expert load (a mixture of experts) added to the run's sums. */
static dt_status add_moe(dt_ctx *ctx, dt_bench_result *r, const dt_step_stats *ss) {
    if (!ss->moe_load) return DT_OK;
    const size_t n = (size_t)ss->moe_layers * ss->moe_experts;
    if (!r->moe_load) {
        r->moe_load = calloc(n, sizeof *r->moe_load);
        if (!r->moe_load) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
        r->moe_layers = ss->moe_layers, r->moe_experts = ss->moe_experts;
    }
    for (size_t i = 0; i < n; i++) r->moe_load[i] += (double)ss->moe_load[i];
    r->moe_max_mean += ss->moe_load_max_mean;
    r->moe_dropped += ss->moe_dropped;
    r->moe_aux += ss->moe_aux, r->moe_z += ss->moe_z;
    return DT_OK;
}

dt_status dt_bench_train(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, int warmup,
                         int steps, int trace, dt_bench_result *r) {
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
    double pred0 = 0;
    dt_status st = DT_OK;
    r->warmup = warmup;
    r->steps = steps;
    for (int s = 0; s < warmup + steps; s++) {
        int timed = s >= warmup;
        tr.model.profile = timed;
        if (s == warmup) {
            dt_parallel_comm_time(tr.par, &ex0, &tot0);
            bytes0 = dt_comm_bytes(tr.comm);
            pred0 = dt_comm_predicted_us(tr.comm);
            if (trace) { /* time 0 of the trace: just after a barrier, on every rank */
                DT_CHECK_GOTO(dt_comm_barrier(ctx, tr.comm, DT_GROUP_WORLD));
                dt_trace_enable(dt_now());
            }
        }
        dt_step_stats ss;
        DT_CHECK_GOTO(dt_trainer_step(ctx, &tr, &ss));
        if (!timed) continue;
        r->step_s[s - warmup] = ss.seconds;
        r->loss[s - warmup] = ss.loss;
        r->optim_s += ss.optim_seconds;
        r->sync_s += ss.sync_seconds;
        r->fwd_s += ss.fwd_seconds;
        r->bwd_s += ss.bwd_seconds;
        r->opt_s += ss.opt_seconds;
        r->data_s += ss.data_seconds;
        r->exposed_s += ss.comm_seconds;
        r->tp_s += ss.tp_seconds / steps;
        r->tp_bytes_step += ss.tp_bytes / steps;
        r->cp_s += ss.cp_seconds / steps;
        r->cp_bytes_step += ss.cp_bytes / steps;
        r->ep_s += ss.ep_seconds / steps;
        r->ep_bytes_step += ss.ep_bytes / steps;
        r->pp_s += ss.pp_seconds / steps;
        r->pp_bytes_step += ss.pp_bytes / steps;
        r->pp_idle_s += ss.pp_idle / steps;
        r->pp_span_s += ss.pp_span / steps;
        r->pp_wgrad_s += ss.pp_wgrad;
        DT_CHECK_GOTO(add_moe(ctx, r, &ss));
    }
    r->pp_stage = tr.pp.n > 1 ? tr.pp.stage : 0;
    if (trace) dt_trace_disable();
    r->loss_hash = dt_bench_loss_hash(r->loss, steps);
    double ex1, tot1;
    dt_parallel_comm_time(tr.par, &ex1, &tot1);
    r->comm_exposed_s = (ex1 - ex0) / steps;
    r->comm_total_s = (tot1 - tot0) / steps;
    r->comm_bytes_step = (double)(dt_comm_bytes(tr.comm) - bytes0) / steps;
    r->comm_predicted_s = c.parallel.comm_model[0] ? (dt_comm_predicted_us(tr.comm) - pred0) / 1e6 / steps : -1.0;
    r->prof = tr.model.prof;
    memcpy(r->mem_peak, tr.alloc.peak, sizeof r->mem_peak);
    dt_stats sd;
    dt_stats_of(&sd, r->step_s, steps);
    r->median_s = sd.median;
    r->min_s = sd.min;
    r->max_s = sd.max;
    r->mean_s = sd.mean;
    r->std_s = sd.std;
    double tokens = (double)c.micro_batch * c.seq_len * c.accum;
    r->tokens_per_s_rank = tokens / r->median_s;
    r->tokens_per_s = r->tokens_per_s_rank * r->world;
    r->flops_per_token = dt_lora_flops_per_token(&tr.model.cfg, &c.model_opts.lora, c.seq_len); /* LoRA: no base dW */
    r->achieved_gflops = r->flops_per_token * r->tokens_per_s_rank / 1e9; /* per rank */
    r->n_params = dt_model_num_params(&tr.model.cfg);
    r->n_trainable = tr.model.lora ? dt_lora_num_params(&tr.model.cfg, &c.model_opts.lora) : r->n_params;
fail:
    if (trace) dt_trace_disable();
    dt_trainer_free(&tr);
    return st;
}

const char *const dt_bench_mem_names[DT_BENCH_MEM_N] = {"params", "grads", "optimizer", "activations",
                                                        "comm", "other", "total", "plan", "rss"};

/* The ranks that share rank 0's machine: those whose kernel boot id (the same in every network
 * namespace of one kernel, so simulated nodes count as one machine) matches rank 0's; the host
 * name where the boot id cannot be read. */
static dt_status gather_machine(dt_ctx *ctx, dt_comm *comm, dt_bench_suite *s) {
    int W = s->world, me = dt_comm_rank(comm, DT_GROUP_WORLD);
    char id[256] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f || !fgets(id, sizeof id, f)) {
        if (gethostname(id, sizeof id) != 0) snprintf(id, sizeof id, "unknown");
        id[sizeof id - 1] = 0;
    }
    if (f) fclose(f);
    uint64_t h = 1469598103934665603ull; /* FNV-1a, 48 bits: exact in a double */
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    double *ids = calloc((size_t)W, sizeof *ids);
    if (!ids) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    ids[me] = (double)(h >> 16);
    dt_status st = W > 1 ? dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, ids, (size_t)W, DT_F64, DT_SUM) : DT_OK;
    s->machine_ranks = 0;
    for (int r = 0; r < W && st == DT_OK; r++) s->machine_ranks += ids[r] == ids[0];
    free(ids);
    return st;
}

/* Every rank's memory columns on every rank: each fills its row of a zeroed table, then a sum. */
static dt_status gather_memory(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm, dt_bench_suite *s) {
    int W = s->world, me = dt_comm_rank(comm, DT_GROUP_WORLD);
    s->mem = calloc((size_t)W * DT_BENCH_MEM_N, sizeof *s->mem);
    if (!s->mem) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    int64_t *row = s->mem + (size_t)me * DT_BENCH_MEM_N;
    for (int i = 0; i < s->opts.repeats; i++) { /* high-water over the repeats */
        const size_t *pk = s->runs[i].mem_peak;
        int64_t v[DT_BENCH_MEM_N] = {(int64_t)pk[DT_MEM_PARAMS], (int64_t)pk[DT_MEM_GRADS],
                                     (int64_t)pk[DT_MEM_OPTIM], (int64_t)pk[DT_MEM_ACTS],
                                     (int64_t)pk[DT_MEM_COMM],
                                     (int64_t)pk[DT_MEM_OTHER], 0, 0};
        for (int k = 0; k < DT_BENCH_MEM_OTHER + 1; k++) {
            if (v[k] > row[k]) row[k] = v[k];
        }
    }
    for (int k = 0; k <= DT_BENCH_MEM_OTHER; k++) row[DT_BENCH_MEM_TOTAL] += row[k];
    row[DT_BENCH_MEM_RSS] = (int64_t)dt_bench_rss_hwm();
    size_t plan[DT_MEM_NKINDS];
    DT_CHECK(dt_trainer_mem_plan_here(ctx, cfg, comm, plan));
    for (int k = 0; k < DT_MEM_NKINDS; k++) row[DT_BENCH_MEM_PLAN] += (int64_t)plan[k];
    /* Compute per timed step (the straggler view): every rank's, like the memory columns. */
    s->compute_ms = calloc((size_t)W, sizeof *s->compute_ms);
    if (!s->compute_ms) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    double c = 0;
    for (int i = 0; i < s->opts.repeats; i++) c += s->runs[i].fwd_s + s->runs[i].bwd_s + s->runs[i].opt_s;
    s->compute_ms[me] = 1e3 * c / ((double)s->opts.repeats * s->opts.steps);
    /* Exposed communication per rank: the rank that waits least (the last to arrive) waits
     * only for the collectives themselves. */
    s->exposed_ms = calloc((size_t)W, sizeof *s->exposed_ms);
    s->attn_ms = calloc((size_t)W, sizeof *s->attn_ms);
    s->cp_wait_ms = calloc((size_t)W, sizeof *s->cp_wait_ms);
    if (!s->exposed_ms || !s->attn_ms || !s->cp_wait_ms) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory");
    for (int i = 0; i < s->opts.repeats; i++) { /* the attention (context parallelism: per rank, its balance) */
        const dt_model_prof *p = &s->runs[i].prof;
        s->attn_ms[me] += 1e3 * (p->fwd[DT_OP_ATTENTION] + p->bwd[DT_OP_ATTENTION]) / ((double)s->opts.repeats * s->opts.steps);
        s->cp_wait_ms[me] += 1e3 * s->runs[i].cp_s / s->opts.repeats;
    }
    if (W > 1) DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, s->attn_ms, (size_t)W, DT_F64, DT_SUM));
    if (W > 1) DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, s->cp_wait_ms, (size_t)W, DT_F64, DT_SUM));
    for (int i = 0; i < s->opts.repeats; i++) s->exposed_ms[me] += 1e3 * s->runs[i].comm_exposed_s / s->opts.repeats;
    if (W > 1) DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, s->exposed_ms, (size_t)W, DT_F64, DT_SUM));
    s->comm_exposed_min_s = s->exposed_ms[0] / 1e3;
    for (int r = 1; r < W; r++)
        if (s->exposed_ms[r] / 1e3 < s->comm_exposed_min_s) s->comm_exposed_min_s = s->exposed_ms[r] / 1e3;
    if (W == 1) return DT_OK;
    DT_CHECK(dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, s->compute_ms, (size_t)W, DT_F64, DT_SUM));
    return dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, s->mem, (size_t)W * DT_BENCH_MEM_N, DT_I64, DT_SUM);
}

static void reduce(dt_bench_suite *s) {
    const dt_bench_opts *o = &s->opts;
    int n = o->repeats * o->steps;
    double *x[5];
    for (int k = 0; k < 5; k++) x[k] = malloc((size_t)n * sizeof(double));
    /* the tokens one rank's share of the work covers: a TP group's ranks split one data-parallel
     * rank's tokens (the whole model's FLOPs on them) */
    double tokens_rank = (double)s->tokens_step / s->world;
    double means[1024];
    double fwd = 0, bwd = 0, opt = 0, data = 0, exp = 0, loss = 0;
    for (int i = 0; i < o->repeats; i++) {
        const dt_bench_result *r = &s->runs[i];
        for (int j = 0; j < o->steps; j++) {
            double t = r->step_s[j];
            if (x[0]) x[0][i * o->steps + j] = t;
            if (x[1]) x[1][i * o->steps + j] = (double)s->samples_step / t;
            if (x[2]) x[2][i * o->steps + j] = (double)s->tokens_step / t;
            if (x[3]) x[3][i * o->steps + j] = tokens_rank / t;
            if (x[4]) x[4][i * o->steps + j] = s->flops_per_token * tokens_rank / t / 1e12;
        }
        if (i < 1024) means[i] = r->mean_s;
        fwd += r->fwd_s, bwd += r->bwd_s, opt += r->opt_s, data += r->data_s, exp += r->exposed_s;
        s->comm_total_s += r->comm_total_s / o->repeats;
        s->comm_exposed_s += r->comm_exposed_s / o->repeats;
        s->comm_bytes_step += r->comm_bytes_step / o->repeats;
        s->tp_s += r->tp_s / o->repeats;
        s->tp_bytes_step += r->tp_bytes_step / o->repeats;
        s->cp_s += r->cp_s / o->repeats;
        s->cp_bytes_step += r->cp_bytes_step / o->repeats;
        s->ep_s += r->ep_s / o->repeats;
        s->ep_bytes_step += r->ep_bytes_step / o->repeats;
        s->comm_predicted_s = r->comm_predicted_s < 0 ? -1.0 : s->comm_predicted_s + r->comm_predicted_s / o->repeats;
        if (r->loss_hash != s->runs[0].loss_hash) s->hash_mismatch++;
    }
    dt_stats *dst[5] = {&s->step_s, &s->samples_per_s, &s->tokens_per_s, &s->tokens_per_s_rank, &s->tflops_rank};
    for (int k = 0; k < 5; k++)
        if (x[k]) dt_stats_of(dst[k], x[k], n);
    if (x[4] && o->peak_gflops > 0 && s->tflops_rank.max * 1e3 > o->peak_gflops)
        s->mfu_over_gflops = s->tflops_rank.max * 1e3; /* the peak was measured low (a busy machine) or given low */
    else if (x[4] && o->peak_gflops > 0) { /* tflops_rank x 1e12 = flops_per_token x tokens/s per rank */
        for (int i = 0; i < n; i++) x[4][i] = dt_bench_mfu(s->flops_per_token, x[4][i] * 1e12 / s->flops_per_token, o->peak_gflops);
        dt_stats_of(&s->mfu, x[4], n);
    }
    for (int k = 0; k < 5; k++) free(x[k]);
    dt_stats_of(&s->run_mean_s, means, o->repeats < 1024 ? o->repeats : 1024);
    s->bd_forward = fwd / n;
    s->bd_backward = bwd / n;
    s->bd_optimizer = opt / n;
    s->bd_data = data / n;
    s->bd_comm = exp / n;
    s->bd_idle = s->step_s.mean - (s->bd_forward + s->bd_backward + s->bd_optimizer + s->bd_data + s->bd_comm);
    for (int j = 0; j < o->steps; j++) loss += s->runs[0].loss[j];
    s->loss_avg = loss / o->steps;
    s->loss_final = s->runs[0].loss[o->steps - 1];
    s->loss_hash = s->runs[0].loss_hash;
    if (!s->runs[0].moe_load) return;
    /* a mixture of experts: the means over every timed step of every repeat */
    const size_t ne = (size_t)s->runs[0].moe_layers * s->runs[0].moe_experts;
    s->moe_load = calloc(ne, sizeof *s->moe_load);
    if (!s->moe_load) return; /* (no memory: the section is left out) */
    s->moe_layers = s->runs[0].moe_layers, s->moe_experts = s->runs[0].moe_experts;
    for (int i = 0; i < o->repeats; i++) {
        const dt_bench_result *r = &s->runs[i];
        for (size_t j = 0; j < ne && r->moe_load; j++) s->moe_load[j] += r->moe_load[j] / n;
        s->moe_max_mean += r->moe_max_mean / n, s->moe_dropped += r->moe_dropped / n;
        s->moe_aux += r->moe_aux / n, s->moe_z += r->moe_z / n;
    }
}

dt_status dt_bench_suite_run(dt_ctx *ctx, const dt_train_cfg *cfg, dt_comm *comm,
                             const dt_bench_opts *o, dt_bench_suite *s) {
    memset(s, 0, sizeof *s);
    s->opts = *o;
    if (o->repeats < 1 || o->repeats > 1000)
        return dt_fail(ctx, DT_ERR_CONFIG, "bench: --repeats must be in [1, 1000] (got %d)", o->repeats);
    s->world = dt_comm_size(comm, DT_GROUP_WORLD);
    s->nodes = dt_comm_num_nodes(comm);
    s->runs = calloc((size_t)o->repeats, sizeof *s->runs);
    if (!s->runs) return dt_fail(ctx, DT_ERR_NOMEM, "bench: out of memory for %d repeats", o->repeats);
    for (int i = 0; i < o->repeats; i++) {
        DT_CHECK(dt_bench_train(ctx, cfg, comm, o->warmup, o->steps, o->trace && i == 0, &s->runs[i]));
    }
    s->tp = cfg->model_opts.tp > 1 ? cfg->model_opts.tp : 1;
    /* the blocks mode: every rank data-parallel; a pipeline's stages hold one model together */
    s->cp = cfg->cp > 1 ? cfg->cp : 1; /* context parallelism: its ranks share each sequence */
    s->dp = s->world / (cfg->parallel.tp > 1 ? cfg->parallel.tp : 1) / (cfg->pp > 1 ? cfg->pp : 1) / s->cp;
    s->samples_step = (long)cfg->micro_batch * cfg->accum * s->dp;
    s->tokens_step = s->samples_step * cfg->seq_len;
    s->flops_per_token = s->runs[0].flops_per_token;
    s->n_params = s->runs[0].n_params;
    s->n_trainable = s->runs[0].n_trainable;
    reduce(s);
    DT_CHECK(gather_memory(ctx, cfg, comm, s));
    DT_CHECK(gather_machine(ctx, comm, s));
    return dt_bench_pp_gather(ctx, cfg, comm, s);
}

void dt_bench_suite_free(dt_bench_suite *s) {
    for (int i = 0; s->runs && i < s->opts.repeats; i++) free(s->runs[i].moe_load);
    free(s->runs);
    free(s->moe_load);
    free(s->mem);
    free(s->compute_ms);
    free(s->exposed_ms);
    free(s->attn_ms);
    free(s->cp_wait_ms);
    free(s->pp.rank), free(s->pp.f), free(s->pp.b), free(s->pp.w), free(s->pp.replay_idle);
    memset(s, 0, sizeof *s);
}
