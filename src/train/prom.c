#include "train/prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/procinfo.h"
#include "core/sortcmp.h"
#include "core/timer.h"

void dt_prom_init(dt_prom *p, const char *path) {
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
}

void dt_prom_step(dt_prom *p, double step_s, double comm_s) {
    p->step_s[p->n % DT_PROM_WINDOW] = step_s;
    p->comm_s[p->n % DT_PROM_WINDOW] = comm_s;
    p->n++;
}

/* Per rank: mean step seconds, mean exposed communication seconds, RSS, then the allocator's
 * current bytes by kind. */
enum { F_STEP, F_COMM, F_RSS, F_MEM, NF = F_MEM + DT_MEM_NKINDS };

static const char *const kind_names[DT_MEM_NKINDS] = {"params", "grads", "optimizer", "activations", "comm", "other"};

dt_status dt_prom_write(dt_ctx *ctx, dt_prom *p, dt_comm *comm, const dt_prom_snapshot *s) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    long w = p->n < DT_PROM_WINDOW ? p->n : DT_PROM_WINDOW;
    double *all = malloc((size_t)world * NF * sizeof *all), mine[NF] = {0};
    if (!all) return dt_fail(ctx, DT_ERR_NOMEM, "logging.prometheus: out of memory");
    for (long i = 0; i < w; i++) mine[F_STEP] += p->step_s[i] / (double)w, mine[F_COMM] += p->comm_s[i] / (double)w;
    mine[F_RSS] = (double)dt_proc_bytes("/proc/self/status", "VmRSS");
    for (int k = 0; k < DT_MEM_NKINDS; k++) mine[F_MEM + k] = (double)s->alloc->cur[k];
    dt_status st = dt_comm_allgather_words(ctx, comm, DT_GROUP_WORLD, mine, NF, all);
    if (st != DT_OK || rank != 0) {
        free(all);
        return st;
    }
    double q[DT_PROM_WINDOW];
    memcpy(q, p->step_s, (size_t)w * sizeof *q);
    qsort(q, (size_t)w, sizeof *q, dt_cmp_double);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", p->path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(all);
        return dt_fail(ctx, DT_ERR_IO, "logging.prometheus: cannot write %s", tmp);
    }
#define GAUGE(name, help) fprintf(f, "# HELP " name " " help "\n# TYPE " name " gauge\n")
    GAUGE("dtrain_step", "optimizer steps done");
    fprintf(f, "dtrain_step %ld\n", s->step);
    GAUGE("dtrain_steps_total", "optimizer steps the run is configured for");
    fprintf(f, "dtrain_steps_total %ld\n", s->steps);
    GAUGE("dtrain_loss", "training loss of the last step (NaN if it was not finite)");
    fprintf(f, "dtrain_loss %.9g\n", isfinite(s->loss) ? s->loss : NAN);
    GAUGE("dtrain_tokens_per_second", "tokens per second of the last step, all ranks");
    fprintf(f, "dtrain_tokens_per_second %.6g\n", s->tokens_per_s);
    if (s->mfu >= 0) {
        GAUGE("dtrain_mfu", "model FLOPs utilisation of the last step (fraction)");
        fprintf(f, "dtrain_mfu %.6g\n", s->mfu);
    }
    fprintf(f, "# HELP dtrain_step_seconds step time of rank 0 over its last %ld steps\n"
               "# TYPE dtrain_step_seconds summary\n", w);
    static const double qs[3] = {0.5, 0.9, 0.99};
    double sum = 0;
    for (long i = 0; i < w; i++) sum += q[i];
    for (int i = 0; i < 3 && w > 0; i++) {
        long idx = (long)ceil(qs[i] * (double)w) - 1;
        fprintf(f, "dtrain_step_seconds{quantile=\"%g\"} %.6g\n", qs[i], q[idx < 0 ? 0 : idx]);
    }
    fprintf(f, "dtrain_step_seconds_sum %.6g\ndtrain_step_seconds_count %ld\n", sum, w);
    GAUGE("dtrain_rank_step_seconds", "mean step time of each rank over its recent steps");
    for (int r = 0; r < world; r++)
        fprintf(f, "dtrain_rank_step_seconds{rank=\"%d\"} %.6g\n", r, all[(size_t)r * NF + F_STEP]);
    GAUGE("dtrain_rank_comm_exposed_seconds", "mean exposed communication per step of each rank");
    for (int r = 0; r < world; r++)
        fprintf(f, "dtrain_rank_comm_exposed_seconds{rank=\"%d\"} %.6g\n", r, all[(size_t)r * NF + F_COMM]);
    GAUGE("dtrain_memory_bytes", "allocator bytes in use by kind, per rank");
    for (int r = 0; r < world; r++)
        for (int k = 0; k < DT_MEM_NKINDS; k++)
            fprintf(f, "dtrain_memory_bytes{rank=\"%d\",kind=\"%s\"} %.0f\n", r, kind_names[k],
                    all[(size_t)r * NF + F_MEM + k]);
    GAUGE("dtrain_rss_bytes", "resident set size of each rank's process");
    for (int r = 0; r < world; r++)
        fprintf(f, "dtrain_rss_bytes{rank=\"%d\"} %.0f\n", r, all[(size_t)r * NF + F_RSS]);
    GAUGE("dtrain_restarts", "restarts of this job by dtrain launch --max-restarts");
    fprintf(f, "dtrain_restarts %d\n", s->restarts);
    fprintf(f, "# HELP dtrain_skipped_steps_total steps skipped for a non-finite loss or gradient norm\n"
               "# TYPE dtrain_skipped_steps_total counter\ndtrain_skipped_steps_total %ld\n", s->skipped);
    GAUGE("dtrain_loss_scale", "the current loss scale, which the next step uses (1 = no loss scaling)");
    fprintf(f, "dtrain_loss_scale %.9g\n", s->loss_scale);
    fprintf(f, "# HELP dtrain_overflow_steps_total steps skipped because loss-scaled gradients overflowed\n"
               "# TYPE dtrain_overflow_steps_total counter\ndtrain_overflow_steps_total %ld\n", s->overflows);
    if (s->ckpt_age_s >= 0) {
        GAUGE("dtrain_checkpoint_age_seconds", "seconds since the last committed checkpoint");
        fprintf(f, "dtrain_checkpoint_age_seconds %.3f\n", s->ckpt_age_s);
    }
    GAUGE("dtrain_last_update_timestamp_seconds", "when this file was written (Unix time)");
    fprintf(f, "dtrain_last_update_timestamp_seconds %.3f\n", dt_now_epoch());
#undef GAUGE
    free(all);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, p->path) != 0) {
        unlink(tmp);
        return dt_fail(ctx, DT_ERR_IO, "logging.prometheus: cannot write %s", p->path);
    }
    return DT_OK;
}
