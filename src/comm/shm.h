/* shm.h - collectives of the ranks of one node over a shared-memory segment (internal to
 * src/comm; the MPI backend sets it up and routes node-local groups to it).
 *
 * The node's ranks map one segment: a header of per-rank arrival counters (futex words) and
 * one slot of DT_SHM_SLOT_BYTES per rank. Every collective moves its data through the slots
 * in rounds: each rank copies its contribution into its own slot, and after a barrier every
 * rank reads the others' slots directly. Sums run in rank order, element by element
 * (((x0 + x1) + x2) + ...), so the results are bitwise those of the MPI ordered collectives
 * (comm.h) and of one process adding the contributions in that order.
 *
 * Life cycle: local rank 0 creates the segment under a name carrying its pid
 * ("/dtrain-shm-<pid>-<n>"), the others open and map it, and once every rank has mapped it
 * (an MPI barrier) the name is unlinked: from then on the segment lives exactly as long as
 * the processes that map it, so no exit - kill -9 included - leaves it behind. Only a rank
 * dying between create and unlink can strand a name; dt_shm_sweep_stale removes names whose
 * creator pid no longer exists, and every creation runs it first.
 *
 * A peer that never arrives (dead, or stopped) leaves the others waiting in a barrier; the
 * collective watchdog (comm.h) names it, as with MPI. */
#ifndef DT_SHM_H
#define DT_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define DT_SHM_SLOT_BYTES ((size_t)4 << 20)
#define DT_SHM_PREFIX "dtrain-shm-"

typedef struct dt_shm dt_shm;

/* Bytes of the segment for `ranks` local ranks. */
size_t dt_shm_segment_bytes(int ranks);
/* Local rank 0: creates (exclusively) and maps the segment, writing its name (without the
 * leading '/') into name (>= 64 bytes). */
dt_status dt_shm_create(dt_ctx *ctx, dt_shm **out, int ranks, char *name);
/* The other local ranks: open and map the segment `name`. */
dt_status dt_shm_attach(dt_ctx *ctx, dt_shm **out, int me, int ranks, const char *name);
/* Removes the name (local rank 0, after every rank attached); the mapping stays. */
void dt_shm_unlink(const char *name);
/* Unmaps (the segment disappears with the last process). NULL: no-op. */
void dt_shm_free(dt_shm *s);
/* Removes /dev/shm names of this prefix whose creator pid is gone; returns how many. */
int dt_shm_sweep_stale(void);

/* In-place ordered all-reduce (sum, f32) of n elements over the node's ranks. */
void dt_shm_allreduce_ordered(dt_shm *s, float *buf, size_t n);
/* The hierarchical ordered all-reduce: the nodes form a chain in world-rank order (ranks of a
 * node consecutive). For each part it owns, a rank takes the running sum of the nodes before
 * its own (prefix: returns 0 on the first node), adds its node's contributions in rank order,
 * and hands that on (finish: passes it to the next node and replaces it with the total from
 * the last), so every element is still summed in world-rank order. Callbacks talk to the
 * ranks with the same node-local index on the other nodes. */
typedef struct dt_shm_chain {
    void *ud;
    int (*prefix)(void *ud, float *acc, size_t n);
    void (*finish)(void *ud, float *acc, size_t n);
} dt_shm_chain;
void dt_shm_allreduce_ordered_chain(dt_shm *s, float *buf, size_t n, const dt_shm_chain *ch);
/* Ordered reduce-scatter (sum, f32), any owner map: out = the rank-order sum of every rank's
 * buf[displs[me] : displs[me] + counts[me]]. out may alias that range of buf. */
void dt_shm_reduce_scatter_ordered(dt_shm *s, const float *buf, const size_t *counts, const size_t *displs,
                                   float *out);
/* The 16-bit reduce-scatter (comm.h dt_comm_reduce_scatter_ordered_lp; t = DT_BF16 or DT_F16):
 * out (counts[me] values of t) = t of the f32 rank-order sum of every rank's contribution
 * rounded to t. */
void dt_shm_reduce_scatter_ordered_lp(dt_shm *s, dt_dtype t, const float *buf, const size_t *counts, const size_t *displs,
                                        uint16_t *out);
/* In-place all-gather of esize-byte elements (4: f32, 2: 16-bit), any layout. */
void dt_shm_allgatherv(dt_shm *s, void *buf, const size_t *counts, const size_t *displs, size_t esize);

#endif
