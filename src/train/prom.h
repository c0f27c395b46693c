/* prom.h - metrics for Prometheus as a node-exporter textfile (logging.prometheus): rank 0
 * writes one file, atomically (tmp + rename), every logging.prometheus_every steps and at the
 * end; per-rank series carry a rank label. Nothing listens on a port.
 *
 *   dt_prom p; dt_prom_init(&p, path, world);
 *   each step: dt_prom_step(&p, &sample);  every N steps: DT_CHECK(dt_prom_write(ctx, &p, comm, &snap));
 */
#ifndef DT_TRAIN_PROM_H
#define DT_TRAIN_PROM_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/alloc.h"
#include "core/status.h"

#define DT_PROM_WINDOW 256 /* step times kept for the quantiles */

typedef struct dt_prom {
    char path[4096];
    double step_s[DT_PROM_WINDOW]; /* this rank's recent step times (ring) */
    double comm_s[DT_PROM_WINDOW]; /* and exposed communication per step */
    long n;                        /* steps recorded */
} dt_prom;

/* What rank 0 reports besides the per-rank series. */
typedef struct dt_prom_snapshot {
    long step, steps, skipped;
    double loss, tokens_per_s, mfu; /* mfu < 0: unknown */
    double ckpt_age_s;              /* < 0: no checkpoint committed yet */
    int restarts;
    double loss_scale;              /* the loss scaler's scale (1 = off) */
    long overflows;                 /* steps skipped for loss-scaled gradient overflow */
    const dt_alloc *alloc;          /* this rank's allocator (current bytes by kind) */
} dt_prom_snapshot;

void dt_prom_init(dt_prom *p, const char *path);
void dt_prom_step(dt_prom *p, double step_s, double comm_s);
/* Collective (all ranks): gathers every rank's recent step time, exposed communication and
 * memory; rank 0 writes the file. */
dt_status dt_prom_write(dt_ctx *ctx, dt_prom *p, dt_comm *comm, const dt_prom_snapshot *s);

#endif
