#ifndef DT_TRAIN_REPLICAS_H
#define DT_TRAIN_REPLICAS_H
/* Replicas across ranks: which kernel path each rank runs (ranks on different CPUs may
 * differ), and a check that every rank holds the same parameters (parallel.check_replicas). */
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "parallel/parallel.h"

/* Gathers every rank's kernel path; rank 0 logs them when they differ (one line). */
dt_status dt_replicas_log_isa(dt_ctx *ctx, dt_comm *comm);

/* Hashes this rank's full parameters (XXH3-64, gathered first under ZeRO-3: every rank takes
 * part) and compares the hashes of all ranks. Fails on every rank alike, naming the ranks
 * whose parameters differ from rank 0's, when they differ. */
dt_status dt_replicas_check(dt_ctx *ctx, dt_comm *comm, dt_parallel *par, size_t n_params, long step,
                            uint64_t *hash);

#endif
