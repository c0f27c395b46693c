#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/log.h"
#include "core/timer.h"
#include "train/trainer.h"

dt_status dt_progress_parse(dt_ctx *ctx, const char *s, dt_progress *out) {
    if (!strcmp(s, "auto")) *out = DT_PROGRESS_AUTO;
    else if (!strcmp(s, "bar")) *out = DT_PROGRESS_BAR;
    else if (!strcmp(s, "lines")) *out = DT_PROGRESS_LINES;
    else return dt_fail(ctx, DT_ERR_CONFIG, "logging.progress: '%s' is not one of auto|bar|lines", s);
    return DT_OK;
}

/* Creates the parent directories of a file path. */
static dt_status make_parents(dt_ctx *ctx, const char *path) {
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return dt_fail(ctx, DT_ERR_IO, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return dt_fail(ctx, DT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    return DT_OK;
}

dt_status dt_metrics_open(dt_ctx *ctx, dt_metrics *m, const char *path, dt_progress mode,
                          long total_steps, int append) {
    memset(m, 0, sizeof *m);
    m->total_steps = total_steps;
    m->t_start = dt_now();
    /* auto: a live bar only on a terminal. Under MPI the rank's stdout is a pseudo-terminal
     * whatever mpirun's own output is: a bar then only when dtrain launch saw a terminal
     * (DTRAIN_LAUNCH_TTY=1); under a plain mpirun, lines (logging.progress=bar forces it). */
    int tty = isatty(STDOUT_FILENO);
    if (dt_comm_launched_by_mpi()) {
        const char *lt = getenv("DTRAIN_LAUNCH_TTY");
        tty = tty && lt && !strcmp(lt, "1");
    }
    m->bar = mode == DT_PROGRESS_BAR || (mode == DT_PROGRESS_AUTO && tty);
    if (path && path[0]) {
        DT_CHECK(make_parents(ctx, path));
        m->jsonl = fopen(path, append ? "a" : "w");
        if (!m->jsonl)
            return dt_fail(ctx, DT_ERR_IO, "logging.metrics: cannot create %s: %s", path, strerror(errno));
    }
    return DT_OK;
}

static void clear_bar(dt_metrics *m) {
    if (m->bar_dirty) {
        fputs("\r\033[K", stdout);
        m->bar_dirty = 0;
    }
}

void dt_metrics_note(const dt_ctx *ctx, dt_metrics *m, const char *msg) {
    clear_bar(m);
    dt_log_info(ctx, "%s", msg);
}

static void fmt_hms(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, n, "--:--:--");
        return;
    }
    long t = (long)(s + 0.5);
    snprintf(buf, n, "%02ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
}

static dt_status write_line(dt_ctx *ctx, dt_metrics *m, const char *line) {
    if (!m->jsonl) return DT_OK;
    if (fputs(line, m->jsonl) < 0 || fflush(m->jsonl) != 0)
        return dt_fail(ctx, DT_ERR_IO, "logging.metrics: write failed: %s", strerror(errno));
    return DT_OK;
}

double dt_train_mfu(double flops_per_token, double tokens_per_s_rank, double peak_gflops) {
    double mfu = peak_gflops > 0 ? flops_per_token * tokens_per_s_rank / (peak_gflops * 1e9) : NAN;
    return mfu <= 1 ? mfu : NAN; /* (also NaN) */
}

/* ",\"moe_load\":[[...],...],\"moe_load_max_mean\":x" of a mixture of experts' step ("" otherwise),
 * malloc'd; NULL: out of memory. */
static char *moe_load_json(const dt_step_stats *s) {
    if (!s || !s->moe || !s->moe_load) return calloc(1, 1);
    const size_t L = (size_t)s->moe_layers, E = (size_t)s->moe_experts, cap = 64 + L * (3 + E * 21);
    char *b = malloc(cap);
    if (!b) return NULL;
    size_t at = (size_t)snprintf(b, cap, ",\"moe_load\":[");
    for (size_t l = 0; l < L; l++) {
        at += (size_t)snprintf(b + at, cap - at, "%s[", l ? "," : "");
        for (size_t e = 0; e < E; e++)
            at += (size_t)snprintf(b + at, cap - at, "%s%lld", e ? "," : "", (long long)s->moe_load[l * E + e]);
        at += (size_t)snprintf(b + at, cap - at, "]");
    }
    snprintf(b + at, cap - at, "],\"moe_load_max_mean\":%.6g", s->moe_load_max_mean);
    return b;
}

dt_status dt_metrics_step(dt_ctx *ctx, dt_metrics *m, const dt_step_record *r) {
    double elapsed = dt_now() - m->t_start;
    double tps = r->tokens / r->step_s;
    double mfu = dt_train_mfu(r->flops_per_token, tps, r->peak_gflops);
    if (isnan(mfu) && r->peak_gflops > 0 && !m->mfu_warned && r->step_s > 0) {
        m->mfu_warned = 1;
        dt_log_warn(ctx, "step %ld ran at %.4g GFLOP/s per rank, above the matmul peak %.4g GFLOP/s that MFU is "
                    "relative to (measured at start while the machine was busy, or logging.peak_gflops too low): MFU "
                    "is reported as unknown for such steps, never above 100%%", r->step,
                    r->flops_per_token * tps / 1e9, r->peak_gflops);
    }
    double eta = r->step > 0 ? elapsed / (double)r->step * (double)(m->total_steps - r->step) : NAN;
    char scale_j[48] = "", scale_t[48] = "";
    if (r->loss_scale != 1.0f && r->loss_scale > 0) {
        snprintf(scale_j, sizeof scale_j, ",\"loss_scale\":%.9g", (double)r->loss_scale);
        snprintf(scale_t, sizeof scale_t, " | scale %g", (double)r->loss_scale);
    }
    const char *skip_t = r->skipped == 2 ? " | SKIPPED (overflow)" : r->skipped ? " | SKIPPED (non-finite)" : "";
    /* JSON has no NaN: a missing MFU is null. */
    char mfu_s[32];
    if (isnan(mfu)) snprintf(mfu_s, sizeof mfu_s, "null");
    else snprintf(mfu_s, sizeof mfu_s, "%.4f", mfu);
    /* A skipped step's loss or norm may be NaN/Inf: null in JSON. */
    char loss_s[32] = "null", norm_s[32] = "null";
    if (isfinite(r->loss)) snprintf(loss_s, sizeof loss_s, "%.9g", (double)r->loss);
    if (isfinite(r->grad_norm)) snprintf(norm_s, sizeof norm_s, "%.6g", (double)r->grad_norm);
    /* a mixture of experts: the cross-entropy, aux and z-losses apart, and the dropped choices */
    char moe_j[256] = "", moe_t[128] = "";
    if (r->stats && r->stats->moe) {
        const dt_step_stats *s = r->stats;
        char v[3][32];
        const float x[3] = {s->moe_ce, s->moe_aux, s->moe_z};
        for (int i = 0; i < 3; i++)
            if (isfinite(x[i])) snprintf(v[i], sizeof v[i], "%.9g", (double)x[i]);
            else snprintf(v[i], sizeof v[i], "null");
        snprintf(moe_j, sizeof moe_j, ",\"ce_loss\":%s,\"moe_aux_loss\":%s,\"moe_z_loss\":%s,\"moe_dropped\":%.0f",
                 v[0], v[1], v[2], s->moe_dropped);
        if (s->ep_rows >= 0) { /* expert parallelism: the rows this rank's all-to-alls sent away */
            size_t at = strlen(moe_j);
            snprintf(moe_j + at, sizeof moe_j - at, ",\"ep_rows_sent\":%.0f,\"ep_comm_ms\":%.3f", s->ep_rows,
                     1e3 * s->ep_seconds);
        }
        snprintf(moe_t, sizeof moe_t, " | ce %.4f aux %.4f z %.4f dropped %.0f load max/mean %.3f", (double)s->moe_ce,
                 (double)s->moe_aux, (double)s->moe_z, s->moe_dropped, s->moe_load_max_mean);
    }
    /* the expert load (decision 86): [[choices per expert] per layer], and its max/mean */
    char *load_j = moe_load_json(r->stats);
    if (!load_j) return dt_fail(ctx, DT_ERR_NOMEM, "logging.metrics: out of memory");
    const size_t cap = 1100 + strlen(load_j);
    char *line = malloc(cap);
    if (!line) {
        free(load_j);
        return dt_fail(ctx, DT_ERR_NOMEM, "logging.metrics: out of memory");
    }
    snprintf(line, cap,
             "{\"type\":\"step\",\"step\":%ld,\"steps\":%ld,\"loss\":%s,\"lr\":%.9g,"
             "\"grad_norm\":%s,\"step_ms\":%.3f,\"tokens\":%.0f,\"tokens_seen\":%.0f,"
             "\"tokens_per_s\":%.2f,\"mfu\":%s,\"elapsed_s\":%.3f,\"eta_s\":%.1f%s%s%s%s%s}\n",
             r->step, m->total_steps, loss_s, (double)r->lr, norm_s,
             r->step_s * 1e3, r->tokens, r->tokens_seen, tps, mfu_s, elapsed, isnan(eta) ? 0.0 : eta,
             r->skipped ? ",\"skipped\":true" : "", r->skipped == 2 ? ",\"overflow\":true" : "", scale_j, moe_j, load_j);
    free(load_j);
    dt_status st = write_line(ctx, m, line);
    free(line);
    DT_CHECK(st);
    char eta_s[48], mfu_txt[32] = "";
    fmt_hms(eta_s, sizeof eta_s, eta);
    if (!isnan(mfu)) snprintf(mfu_txt, sizeof mfu_txt, " | MFU %.1f%%", 100 * mfu);
    if (m->bar) {
        char load_t[48] = ""; /* a mixture of experts: the expert load's balance */
        if (r->stats && r->stats->moe && r->stats->moe_load)
            snprintf(load_t, sizeof load_t, " | load max/mean %.3f", r->stats->moe_load_max_mean);
        printf("\r\033[Kstep %ld/%ld | loss %.4f%s | lr %.2e | %.0f tok/s%s%s | ETA %s%s", r->step,
               m->total_steps, (double)r->loss, load_t, (double)r->lr, tps, mfu_txt, scale_t, eta_s, skip_t);
        fflush(stdout);
        m->bar_dirty = 1;
    } else {
        dt_log_info(ctx, "step %ld/%ld | loss %.9g%s | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s%s%s | ETA %s%s",
                    r->step, m->total_steps, (double)r->loss, moe_t, (double)r->lr, (double)r->grad_norm,
                    r->step_s * 1e3, tps, mfu_txt, scale_t, eta_s, skip_t);
    }
    return DT_OK;
}

dt_status dt_metrics_straggler(dt_ctx *ctx, dt_metrics *m, long step, long from, int rank, double compute_ms,
                               double others_ms) {
    char line[512];
    snprintf(line, sizeof line,
             "{\"type\":\"straggler\",\"step\":%ld,\"from_step\":%ld,\"rank\":%d,\"compute_ms\":%.3f,"
             "\"others_median_ms\":%.3f,\"ratio\":%.3f}\n",
             step, from, rank, compute_ms, others_ms, others_ms > 0 ? compute_ms / others_ms : 0.0);
    DT_CHECK(write_line(ctx, m, line));
    clear_bar(m);
    dt_log_warn(ctx, "straggler: rank %d computes %.1f ms per step, %.1fx the median of the other ranks (%.1f ms), "
                "steps %ld-%ld", rank, compute_ms, others_ms > 0 ? compute_ms / others_ms : 0.0, others_ms, from, step);
    return DT_OK;
}

dt_status dt_metrics_spike(dt_ctx *ctx, dt_metrics *m, long step, double loss, double ref, int uniform_of) {
    char line[256];
    snprintf(line, sizeof line, "{\"type\":\"spike\",\"step\":%ld,\"loss\":%.9g,\"%s\":%.9g}\n", step, loss,
             uniform_of ? "uniform_loss" : "recent_median", ref);
    DT_CHECK(write_line(ctx, m, line));
    clear_bar(m);
    if (uniform_of)
        dt_log_warn(ctx, "loss spike at step %ld: %.4f, %.0fx the loss of uniform guessing (ln %d = %.4f): the run is "
                    "diverging; lower optimizer.lr, or bound the updates with optimizer.grad_clip", step, loss,
                    loss / ref, uniform_of, ref);
    else
        dt_log_warn(ctx, "loss spike at step %ld: %.4f, %.1fx the median of the previous steps (%.4f)", step, loss,
                    loss / ref, ref);
    return DT_OK;
}

dt_status dt_metrics_rollback(dt_ctx *ctx, dt_metrics *m, long step, double loss, double ref, int uniform, long to,
                              uint64_t skipped) {
    char line[256];
    snprintf(line, sizeof line, "{\"type\":\"rollback\",\"step\":%ld,\"loss\":%.9g,\"%s\":%.9g,"
             "\"to_step\":%ld,\"skipped_samples\":%llu}\n", step, loss, uniform ? "uniform_loss" : "recent_median", ref,
             to, (unsigned long long)skipped);
    DT_CHECK(write_line(ctx, m, line));
    clear_bar(m);
    dt_log_warn(ctx, "training.spike_rollback: loss spike at step %ld: back to the checkpoint of step %ld, skipping the "
                "%llu samples read since; training goes on from step %ld", step, to, (unsigned long long)skipped, to + 1);
    return DT_OK;
}

dt_status dt_metrics_watchdog(dt_ctx *ctx, dt_metrics *m, long step, double timeout_s, double slowest_s) {
    char line[256];
    snprintf(line, sizeof line, "{\"type\":\"watchdog\",\"step\":%ld,\"collective_timeout_s\":%.3f,"
             "\"slowest_collective_s\":%.6f}\n", step, timeout_s, slowest_s);
    DT_CHECK(write_line(ctx, m, line));
    clear_bar(m);
    dt_log_info(ctx, "fault.collective_timeout auto: %.1f s from step %ld (%.0f x the slowest collective, %.1f ms; "
                "at least %.0f s)", timeout_s, step, DT_WATCHDOG_MULT, 1e3 * slowest_s, DT_WATCHDOG_FLOOR_S);
    return DT_OK;
}

dt_status dt_metrics_eval(dt_ctx *ctx, dt_metrics *m, long step, double val_loss, double val_tokens,
                          double val_acc) {
    char line[512], acc[48] = "";
    if (!isnan(val_acc)) snprintf(acc, sizeof acc, "\"val_acc\":%.6g,", val_acc);
    snprintf(line, sizeof line,
             "{\"type\":\"eval\",\"step\":%ld,\"val_loss\":%.9g,\"val_ppl\":%.6g,\"val_tokens\":%.0f,%s"
             "\"elapsed_s\":%.3f}\n",
             step, val_loss, exp(val_loss), val_tokens, acc, dt_now() - m->t_start);
    DT_CHECK(write_line(ctx, m, line));
    clear_bar(m);
    if (!isnan(val_acc))
        dt_log_info(ctx, "step %ld | val loss %.4f | val accuracy %.2f%%", step, val_loss, 100.0 * val_acc);
    else
        dt_log_info(ctx, "step %ld | val loss %.4f | val ppl %.3f | %.0f tokens", step, val_loss,
                    exp(val_loss), val_tokens);
    return DT_OK;
}

void dt_metrics_close(dt_metrics *m) {
    if (m->bar_dirty) {
        fputc('\n', stdout);
        m->bar_dirty = 0;
    }
    if (m->jsonl) fclose(m->jsonl);
    m->jsonl = NULL;
}
