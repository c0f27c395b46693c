/* straggler.h - a rank that computes much slower than the others (a throttled CPU, a noisy
 * neighbour, a failing disk behind its data): every logging.straggler_every steps the ranks
 * compare their mean compute time per step (forward + backward + optimizer, communication
 * waits excluded), and rank 0 names each rank slower than logging.straggler_factor x the
 * median of the other ranks, in the log and the metrics JSONL. */
#ifndef DT_TRAIN_STRAGGLER_H
#define DT_TRAIN_STRAGGLER_H

#include "comm/comm.h"
#include "train/metrics.h"

typedef struct dt_straggler {
    double sum; /* compute seconds since the last check */
    long n, from;
    long found; /* stragglers named so far (rank 0) */
} dt_straggler;

void dt_straggler_add(dt_straggler *s, long step, double compute_s);
/* Collective: compares the ranks (one all-reduce of one double per rank) and starts a new window. */
dt_status dt_straggler_check(dt_ctx *ctx, dt_straggler *s, dt_comm *comm, long step, double factor,
                             dt_metrics *m);

#endif
