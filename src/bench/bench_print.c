/* The fixed-width tables of `dtrain bench` (rank 0): header lines start with '#' and carry
 * units; every row of repeats carries the loss hash (nccl-tests / speedtest1 style). */
#include <math.h>

#include "bench/bench.h"
#include "core/sortcmp.h"
#include "ops/cpu/isa.h"

#define MIB(x) ((double)(x) / 1048576.0)

static void stats_row(FILE *f, const char *name, const char *unit, const dt_stats *s, double scale) {
    fprintf(f, "  %-20s %-8s %12.4g %12.4g %12.4g %12.4g %12.4g\n", name, unit, s->mean * scale,
            s->std * scale, s->min * scale, s->median * scale, s->max * scale);
}

void dt_bench_suite_print(FILE *f, const dt_bench_suite *s, const dt_train_cfg *c,
                          const char *peak_source, int threads) {
    const dt_model_config *m = &c->model;
    const dt_bench_opts *o = &s->opts;
    int n = o->repeats * o->steps;
    char desc[400];
    dt_model_describe(m, desc, sizeof desc);
    char trainable[96] = ""; /* LoRA: what the optimizer updates and the gradients carry */
    if (s->n_trainable != s->n_params)
        snprintf(trainable, sizeof trainable, ", %.4fM trainable (LoRA rank %d%s)", (double)s->n_trainable / 1e6,
                 c->model_opts.lora.rank, c->model_opts.lora.nf4 ? ", NF4 base" : "");
    fprintf(f, "# dtrain bench: %s (%s, %.2fM params%s), batch %d x %d x %d "
               "accum per rank, fp32, %d rank(s) x %d threads on %d node(s), %s%s\n",
            c->preset[0] ? c->preset : "custom", desc, (double)s->n_params / 1e6, trainable, c->micro_batch,
            c->seq_len, c->accum, s->world, threads, s->nodes, dt_strategy_name(c->parallel.strategy),
            c->parallel.overlap ? "" : " (no overlap)");
    if (s->tp > 1)
        fprintf(f, "# layout: tp %d x dp %d (%s)\n", s->tp, s->dp,
                c->parallel.tp > 1 ? "each TP group splits its data-parallel rank's batch" : "parallel.tp_blocks: every shard in each process");
    if (m->n_classes > 0)
        fprintf(f, "# a sample is one image of %d pixel values: tokens count pixels, samples count images\n",
                m->context);
    fprintf(f, "# %d warm-up + %d timed steps, %d repeat(s), each a fresh trainer with seed %llu\n",
            o->warmup, o->steps, o->repeats, (unsigned long long)c->seed);
    char isa[320];
    dt_isa_describe(isa, sizeof isa);
    fprintf(f, "# %s\n", isa);
    if (o->peak_gflops > 0) fprintf(f, "# peak %.1f GFLOP/s per rank (%s)\n", o->peak_gflops, peak_source);
    if (s->mfu_over_gflops > 0)
        fprintf(f, "# MFU unknown: a step ran at %.1f GFLOP/s per rank, above the peak %.1f it is relative to (measured "
                "while the machine was busy, or given too low): left out rather than shown above 100%%\n",
                s->mfu_over_gflops, o->peak_gflops);
    if (m->n_classes > 0)
        fprintf(f, "# MFU = FLOP/image x images/s per rank / peak; FLOP/image = 6 x (patch embedding x patches "
                   "+ blocks x (patches + 1) + head) + 12 L T^2 d = %.4g\n",
                s->flops_per_token * m->context);
    else
        fprintf(f, "# MFU = (6 N + 12 L T d) x tokens/s per rank / peak; N = non-embedding params + lm_head "
                   "(V d) = %.4g; %.4g FLOP/token\n",
                (s->flops_per_token - 12.0 * m->n_layer * c->seq_len * m->d_model) / 6.0, s->flops_per_token);

    fprintf(f, "# %-6s %-10s %-10s %-10s %-10s %-10s %-12s %-10s %-16s\n", "repeat", "mean_ms", "std_ms",
            "min_ms", "median_ms", "max_ms", "tokens/s", "loss_last", "loss_hash");
    for (int i = 0; i < o->repeats; i++) {
        const dt_bench_result *r = &s->runs[i];
        fprintf(f, "  %-6d %-10.2f %-10.2f %-10.2f %-10.2f %-10.2f %-12.1f %-10.6f %016llx%s\n", i + 1,
                r->mean_s * 1e3, r->std_s * 1e3, r->min_s * 1e3, r->median_s * 1e3, r->max_s * 1e3,
                (double)s->tokens_step / r->mean_s, (double)r->loss[o->steps - 1], r->loss_hash,
                r->loss_hash != s->loss_hash ? "  MISMATCH" : "");
    }
    fprintf(f, "# statistics over all %d timed steps (%d repeat(s) x %d); repeat means: %.3f +- %.3f ms\n", n,
            o->repeats, o->steps, s->run_mean_s.mean * 1e3, s->run_mean_s.std * 1e3);
    fprintf(f, "# %-20s %-8s %12s %12s %12s %12s %12s\n", "metric", "unit", "mean", "std", "min", "median", "max");
    stats_row(f, "step_time", "ms", &s->step_s, 1e3);
    stats_row(f, "samples/s", "global", &s->samples_per_s, 1);
    stats_row(f, "samples/s_per_rank", "rank", &s->samples_per_s, 1.0 / s->world);
    if (m->n_classes > 0) {
        stats_row(f, "images/s", "global", &s->samples_per_s, 1);
        stats_row(f, "images/s_per_rank", "rank", &s->samples_per_s, 1.0 / s->world);
    }
    stats_row(f, "tokens/s", "global", &s->tokens_per_s, 1);
    stats_row(f, "tokens/s_per_rank", "rank", &s->tokens_per_s_rank, 1);
    stats_row(f, "TFLOP/s_per_rank", "rank", &s->tflops_rank, 1);
    if (o->peak_gflops > 0 && !(s->mfu_over_gflops > 0)) stats_row(f, "MFU", "%", &s->mfu, 100);
    fprintf(f, "# %-12s %-12s %-12s %-12s %-10s %-10s %-8s %-16s\n", "median_ms", "mean_ms", "min_ms", "max_ms",
            "tokens/s", "GFLOP/s", "MFU_%", "loss_hash");
    fprintf(f, "  %-12.2f %-12.2f %-12.2f %-12.2f %-10.1f %-10.1f %-8.1f %016llx\n", s->step_s.median * 1e3,
            s->step_s.mean * 1e3, s->step_s.min * 1e3, s->step_s.max * 1e3, s->tokens_per_s.median,
            s->tflops_rank.median * 1e3,
            o->peak_gflops > 0 && !(s->mfu_over_gflops > 0) ? 100 * s->mfu.median : NAN, s->loss_hash);

    /* Kernels: the profiler's per-op sums, over every timed step of every repeat. */
    double total = s->step_s.mean, sync = 0, optim = 0;
    dt_model_prof p = {{0}, {0}};
    for (int i = 0; i < o->repeats; i++) {
        for (int k = 0; k < DT_OP_NKINDS; k++) {
            p.fwd[k] += s->runs[i].prof.fwd[k];
            p.bwd[k] += s->runs[i].prof.bwd[k];
        }
        sync += s->runs[i].sync_s;
        optim += s->runs[i].optim_s;
    }
    fprintf(f, "# kernel time per step (mean over %d steps)\n", n);
    fprintf(f, "# %-14s %-10s %-10s %-10s %-8s\n", "kernel", "fwd_ms", "bwd_ms", "total_ms", "%step");
    for (int k = 0; k < DT_OP_NKINDS; k++) {
        double fw = p.fwd[k] / n, bw = p.bwd[k] / n;
        if (p.fwd[k] == 0.0 && p.bwd[k] == 0.0) continue; /* a kernel this family has not */
        fprintf(f, "  %-14s %-10.2f %-10.2f %-10.2f %-8.1f\n", dt_op_kind_names[k], fw * 1e3, bw * 1e3,
                (fw + bw) * 1e3, 100 * (fw + bw) / total);
    }
    fprintf(f, "  %-14s %-10s %-10s %-10.2f %-8.1f\n", "optimizer", "-", "-", optim / n * 1e3, 100 * optim / n / total);
    fprintf(f, "  %-14s %-10s %-10s %-10.2f %-8.1f\n", "grad_sync_wait", "-", "-", sync / n * 1e3, 100 * sync / n / total);

    /* The trainer's straggler rule on the timed steps (logging.straggler_factor). */
    if (s->compute_ms && s->world > 1) {
        fprintf(f, "# compute per rank (forward + backward + optimizer, ms per timed step):");
        for (int r = 0; r < s->world; r++) fprintf(f, " %d: %.2f", r, s->compute_ms[r]);
        fputc('\n', f);
        for (int r = 0; r < s->world; r++) {
            double med = dt_median_others(s->compute_ms, s->world, r);
            if (med > 0 && s->compute_ms[r] > o->straggler_factor * med)
                fprintf(f, "# straggler: rank %d computes %.2f ms per step, %.1fx the median of the others (%.2f ms; "
                           "logging.straggler_factor %.2g)\n", r, s->compute_ms[r], s->compute_ms[r] / med, med,
                        o->straggler_factor);
        }
    }
    fprintf(f, "# step breakdown (mean per step; parts add up to the step; communication = exposed waits)\n");
    fprintf(f, "# %-16s %-10s %-8s\n", "part", "ms", "%step");
    const char *names[6] = {"forward", "backward", "optimizer", "communication", "data", "idle/other"};
    double vals[6] = {s->bd_forward, s->bd_backward, s->bd_optimizer, s->bd_comm, s->bd_data, s->bd_idle};
    for (int k = 0; k < 6; k++)
        fprintf(f, "  %-16s %-10.3f %-8.1f\n", names[k], vals[k] * 1e3, 100 * vals[k] / total);
    fprintf(f, "# communication per step: %.2f ms in collectives, %.2f ms exposed (%.1f%% of the step), "
               "%.3f MB sent by rank 0\n",
            s->comm_total_s * 1e3, s->comm_exposed_s * 1e3, 100 * s->comm_exposed_s / total,
            s->comm_bytes_step / 1e6);
    if (s->tp > 1)
        fprintf(f, "# tensor parallelism: tp %d x dp %d; TP collectives %.2f ms per step (exposed: the compute thread "
                   "waits for them; %.1f%% of the step), %.3f MB sent by rank 0\n",
                s->tp, s->dp, s->tp_s * 1e3, 100 * s->tp_s / total, s->tp_bytes_step / 1e6);
    if (s->ep_bytes_step > 0)
        fprintf(f, "# expert parallelism: all-to-alls %.2f ms per step (exposed: %.1f%% of the step), %.3f MB sent by "
                   "rank 0\n", s->ep_s * 1e3, 100 * s->ep_s / total, s->ep_bytes_step / 1e6);
    if (s->cp > 1 && s->attn_ms && s->cp_wait_ms) {
        fprintf(f, "# context parallelism: cp %d; the ring's waits %.2f ms per step (%.1f%% of the step), %.3f MB sent by "
                   "rank 0; per rank, attention ms (of it ring waits):", s->cp, s->cp_s * 1e3, 100 * s->cp_s / total,
                s->cp_bytes_step / 1e6);
        for (int r = 0; r < s->world; r++) fprintf(f, " %d: %.2f (%.2f)", r, s->attn_ms[r], s->cp_wait_ms[r]);
        fputc('\n', f);
    }
    dt_bench_pp_print(f, s);
    if (s->exposed_ms && s->world > 1) {
        fprintf(f, "# exposed communication per rank (ms per timed step):");
        for (int r = 0; r < s->world; r++) fprintf(f, " %d: %.2f", r, s->exposed_ms[r]);
        fprintf(f, "; least %.2f ms (%.2f%% of the step): the collectives' own cost, the rest of the others' waits "
                   "is load imbalance\n",
                s->comm_exposed_min_s * 1e3, 100 * s->comm_exposed_min_s / total);
    }
    if (s->comm_predicted_s >= 0)
        fprintf(f, "# cost model (parallel.comm_model): %.2f ms predicted in collectives per step, measured %.2f (%+.0f%%)\n",
                s->comm_predicted_s * 1e3, s->comm_total_s * 1e3,
                s->comm_total_s > 0 ? 100 * (s->comm_predicted_s - s->comm_total_s) / s->comm_total_s : 0.0);

    fprintf(f, "# memory per rank (MiB): allocator high-water by kind, the memory plan (equal to the total), "
               "and the process's VmHWM\n");
    fprintf(f, "# %-5s", "rank");
    for (int k = 0; k < DT_BENCH_MEM_N; k++) fprintf(f, " %-11s", dt_bench_mem_names[k]);
    fprintf(f, "\n");
    double peak_total = 0, peak_rss = 0, sum_total = 0, sum_rss = 0;
    int peak_rank = 0, rss_rank = 0;
    for (int r = 0; r < s->world; r++) {
        const int64_t *row = s->mem + (size_t)r * DT_BENCH_MEM_N;
        fprintf(f, "  %-5d", r);
        for (int k = 0; k < DT_BENCH_MEM_N; k++) fprintf(f, " %-11.2f", MIB(row[k]));
        fprintf(f, "\n");
        double t = (double)row[DT_BENCH_MEM_TOTAL], rs = (double)row[DT_BENCH_MEM_RSS];
        if (t > peak_total) peak_total = t, peak_rank = r;
        if (rs > peak_rss) peak_rss = rs, rss_rank = r;
        sum_total += t;
        sum_rss += rs;
    }
    if (s->hash_mismatch)
        fprintf(f, "# WARNING: %d of %d repeats computed different losses (loss hash differs from repeat 1): "
                   "the run is not deterministic, the numbers above are suspect\n",
                s->hash_mismatch, o->repeats);

    fprintf(f, "# Training Summary\n");
    fprintf(f, "  %-18s %d (%d repeat(s) x %d timed steps; %d warm-up steps each not counted)\n", "num_steps", n,
            o->repeats, o->steps, o->warmup);
    fprintf(f, "  %-18s %.3f ms (std %.3f ms)\n", "avg_step_time", s->step_s.mean * 1e3, s->step_s.std * 1e3);
    fprintf(f, "  %-18s %.3f ms\n", "min_step_time", s->step_s.min * 1e3);
    fprintf(f, "  %-18s %.3f ms\n", "max_step_time", s->step_s.max * 1e3);
    if (m->n_classes > 0)
        fprintf(f, "  %-18s %.2f images/s (global); %.2f images/s per rank\n", "throughput",
                s->samples_per_s.mean, s->samples_per_s.mean / s->world);
    else
        fprintf(f, "  %-18s %.2f samples/s, %.1f tokens/s (global); %.1f tokens/s per rank\n", "throughput",
                s->samples_per_s.mean, s->tokens_per_s.mean, s->tokens_per_s_rank.mean);
    fprintf(f, "  %-18s %.6f\n", "avg_loss", s->loss_avg);
    fprintf(f, "  %-18s %.6f (hash %016llx%s)\n", "final_loss", s->loss_final, s->loss_hash,
            s->hash_mismatch ? ", MISMATCH across repeats" : ", equal across repeats");
    fprintf(f, "  %-18s %.2f MiB allocated (rank %d), %.2f MiB RSS (rank %d)\n", "peak_memory", MIB(peak_total),
            peak_rank, MIB(peak_rss), rss_rank);
    fprintf(f, "  %-18s %.2f MiB allocated, %.2f MiB RSS per rank\n", "avg_memory", MIB(sum_total / s->world),
            MIB(sum_rss / s->world));
}
