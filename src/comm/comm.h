/* comm.h - the communicator: who we are (rank, size, node) and the collectives dtrain
 * uses. Nothing outside src/comm calls MPI. Backends (comm_impl.h) fill a table of
 * functions: `self` for a single process (no MPI at all), `mpi` over any MPI-3 library.
 *
 * Groups are values the communicator hands out. Three exist from the start: DT_GROUP_WORLD
 * (all ranks), DT_GROUP_NODE (ranks sharing this node), and DT_GROUP_CROSS (the ranks with
 * this rank's node-local index, one per node); dt_comm_group_split makes more (the process
 * mesh's groups, parallel/mesh.h), once, at start. The node of a rank is its host name, or
 * DTRAIN_NODE_ID when set (to simulate several nodes on one machine).
 *
 *   dt_comm *c; DT_CHECK(dt_comm_init(ctx, &c));          // MPI if launched by mpirun/srun
 *   DT_CHECK(dt_comm_allreduce(ctx, c, DT_GROUP_WORLD, buf, n, DT_F32, DT_SUM));
 *   dt_comm_free(c);
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h" /* dt_dtype: the collectives take DT_F32, DT_F64, DT_I64 */
#include "core/status.h"

typedef struct dt_comm dt_comm;
typedef struct dt_comm_req dt_comm_req;

/* A group: an index into the communicator's table. The built-in ones are fixed values; those
 * of dt_comm_group_split follow them (DT_GROUP_N, DT_GROUP_N + 1, ...). */
typedef int dt_group;
enum { DT_GROUP_WORLD, DT_GROUP_NODE, DT_GROUP_CROSS, DT_GROUP_N /* the built-in groups */ };
#define DT_GROUP_MAX 32 /* groups of one communicator, built-in ones included */
typedef enum dt_redop { DT_SUM, DT_MAX, DT_MIN } dt_redop;

/* Starts the MPI backend when the process was launched by mpirun/mpiexec/srun (detected
 * from the launcher's environment) or DTRAIN_COMM=mpi, else the single-process backend.
 * Sets ctx->rank and ctx->world. */
dt_status dt_comm_init(dt_ctx *ctx, dt_comm **out);
/* dt_comm_init for a process mesh with tensor, context, expert or pipeline groups: MPI at
 * MPI_THREAD_MULTIPLE (refused when the library does not provide it), so that collectives of
 * different groups may run on different threads at once - the data-parallel lane (the
 * communication thread's FIFO of gradient buckets) and the compute thread's TP / CP / EP
 * collectives and PP transfers - and neither waits behind the other (docs/ARCHITECTURE.md
 * decision 61). Each group's operations must still come from one thread at a time, in the same
 * order on all its ranks. Plain data parallelism keeps dt_comm_init (MPI_THREAD_SERIALIZED).
 * The cost model's sum (dt_comm_predicted_us) is not kept exactly under concurrent lanes. */
dt_status dt_comm_init_concurrent(dt_ctx *ctx, dt_comm **out);
/* Whether dt_comm_init would start MPI (a launcher's environment, or DTRAIN_COMM=mpi). */
int dt_comm_launched_by_mpi(void);
/* This process's world rank as the launcher's environment says, before dt_comm_init
 * (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK): 0 when not launched by MPI, -1 when launched
 * by MPI but none of them is set (the rank is known only after dt_comm_init). */
int dt_comm_env_rank(void);
/* The single-process communicator (every group is {self}), whatever the environment. */
dt_status dt_comm_init_self(dt_ctx *ctx, dt_comm **out);
/* Finalises the backend; NULL is a no-op. */
void dt_comm_free(dt_comm *c);
/* Ends every rank of the job after a fatal error on this one (MPI_Abort); returns only for
 * the single-process backend. */
void dt_comm_abort(dt_comm *c, int code);

/* Splits the world into groups and hands this rank's out: a collective over the world, every
 * rank calling it at the same point with its own group's world ranks (which include it), in
 * the group's rank order; the groups of one call must partition the world (each rank's list
 * is the same list on every member). Makes a communicator of the group once (MPI: a split of
 * the world), and, when all its ranks share a node and shared memory is on (dt_comm_set_shm),
 * a shared-memory segment of its own, so its ordered collectives and gathers run there as the
 * node group's do (the same bits either way). Fails on every rank (naming the first
 * inconsistency) when the lists do not form a partition, or after DT_GROUP_MAX groups. */
dt_status dt_comm_group_split(dt_ctx *ctx, dt_comm *c, const int *ranks, int n, dt_group *out);
/* The world rank of group g's rank r (-1 when r is outside g, or g is the node or cross group
 * of a node of several ranks, whose map the backend keeps): what the watchdog records as a
 * point-to-point operation's peer. */
int dt_comm_world_rank(const dt_comm *c, dt_group g, int r);
/* Whether group g's ordered collectives and gathers run over shared memory now. */
int dt_comm_group_shm(const dt_comm *c, dt_group g);

int dt_comm_rank(const dt_comm *c, dt_group g);
int dt_comm_size(const dt_comm *c, dt_group g);
int dt_comm_num_nodes(const dt_comm *c);
const char *dt_comm_backend(const dt_comm *c);
/* Node-local groups (the node group; the world on one node) run the ordered reduce-scatter,
 * the ordered all-reduce and the all-gathers over a shared-memory segment (comm/shm.h) when
 * on: the default under MPI with more than one rank on the node, unless DTRAIN_SHM=0. Returns
 * whether they now do (0 when there is no segment: single process, one rank per node, or it
 * could not be set up). The results are the same bits either way. */
int dt_comm_set_shm(dt_comm *c, int on);
/* With several nodes the world's ordered all-reduce runs hierarchically when on: node-local
 * exchange over shared memory, then each part down a chain of the nodes (each adds its ranks
 * in order) and the total broadcast back, so only one copy of each part crosses between
 * nodes each way, and the sums stay in world-rank order (the same bits as flat). On by
 * default where possible: more than one node, the same number (> 1) of ranks on each, each
 * node's world ranks consecutive, shared memory on. Returns whether it now is. */
int dt_comm_set_hierarchical(dt_comm *c, int on);
/* Where data moves now: "MPI", "shared memory inside the node", or "shared memory inside
 * nodes, hierarchical all-reduce across them" (for the banner). */
const char *dt_comm_routing(const dt_comm *c);

/* In-place all-reduce of n elements. */
dt_status dt_comm_allreduce(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t n,
                            dt_dtype t, dt_redop op);
/* Deterministic in-place all-reduce (sum, f32): every element is summed in rank order,
 * ((x0 + x1) + x2) + ..., whatever the MPI library's algorithms, so the result is bitwise
 * what one process gets by adding the ranks' contributions in that order. Bandwidth-optimal
 * (a chunk per rank is exchanged, summed by its owner, then all-gathered: 2(n-1)/n bytes per
 * byte). scratch holds size x ceil(n / size) floats (rank 0's part, stacked size times: up to
 * size - 1 more than n). */
dt_status dt_comm_allreduce_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                    float *scratch);
/* Deterministic reduce-scatter (sum, f32) with any owner map: rank r receives, in out, the
 * sum over the group's ranks (in rank order) of buf[displs[r] : displs[r] + counts[r]).
 * scratch holds size x counts[me] floats. */
dt_status dt_comm_reduce_scatter_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                         const size_t *counts, const size_t *displs, float *out,
                                         float *scratch);
/* All-gather (f32) with any layout: rank r contributes counts[r] elements at buf + displs[r]
 * (in place). */
dt_status dt_comm_allgatherv(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts,
                             const size_t *displs);

/* Gradient reductions in bf16 (parallel.grad_dtype: bf16): half the bytes of the f32 ones,
 * the same rule for every element whichever rank owns it:
 *   result = bf16( ((w(bf16(x0)) + w(bf16(x1))) + w(bf16(x2))) + ... )
 * each rank's contribution x_r is rounded to bf16 before it travels (to nearest even: ops.h
 * dt_f32_to_bf16, the same bits on every kernel path), the owner widens (w: exact) and sums
 * them in f32 in rank order, and rounds the sum to bf16 once. A group of one rank applies
 * the same rule (the result is bf16(x0)), though nothing travels; the trainer makes no such
 * call with one rank. dt_comm_bytes counts 2 bytes an element. bf16 values are held as their
 * uint16_t bit patterns. */
/* In-place all-reduce: every rank ends with w(result) in buf; the reduced parts travel in
 * bf16 too. scratch holds n + size x ceil(n / size) bf16 values (DT_COMM_AR_BF16_SCRATCH). */
#define DT_COMM_AR_BF16_SCRATCH(n, size) ((n) + (size_t)(size) * (((n) + (size_t)(size) - 1) / (size_t)(size)))
dt_status dt_comm_allreduce_ordered_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                         uint16_t *scratch);
/* Reduce-scatter with any owner map (as dt_comm_reduce_scatter_ordered): rank r receives in
 * out (counts[r] bf16 values) the result for buf[displs[r] : displs[r] + counts[r]).
 * scratch holds sum(counts) + size x counts[me] bf16 values; out is not inside it. */
dt_status dt_comm_reduce_scatter_ordered_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                              const size_t *counts, const size_t *displs, uint16_t *out,
                                              uint16_t *scratch);
/* The same reductions with t = DT_BF16 or DT_F16 (IEEE half, parallel.grad_dtype: fp16): the
 * rule above with t's rounding (ops.h dt_to_lowp: to nearest even; |x| >= 65520 gives Inf, so
 * an fp16 overflow makes the step non-finite, as under loss scaling). The _bf16 functions are
 * these with DT_BF16. */
dt_status dt_comm_allreduce_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, float *buf, size_t n,
                                       uint16_t *scratch);
dt_status dt_comm_reduce_scatter_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, const float *buf,
                                            const size_t *counts, const size_t *displs, uint16_t *out,
                                            uint16_t *scratch);
/* In-place all-gather of bf16 values with any layout (as dt_comm_allgatherv). The values
 * travel as raw 16-bit patterns, so any 16-bit type works (ZeRO-3 gathers fp16 weights). */
dt_status dt_comm_allgatherv_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, uint16_t *buf, const size_t *counts,
                                  const size_t *displs);
/* Reduce-scatter (sum, f32): rank r of the group receives the sum over ranks of
 * send[off_r : off_r + counts[r]) into recv, off_r = sum of counts before r. Uneven counts
 * are fine. */
dt_status dt_comm_reduce_scatter(dt_ctx *ctx, dt_comm *c, dt_group g, const float *send,
                                 float *recv, const size_t *counts);
/* All-gather (f32): every rank contributes counts[rank] elements at buf + off_rank (in
 * place); afterwards buf holds all ranks' parts. */
dt_status dt_comm_allgather(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts);
/* All-gather of a small record of 8-byte words (int64, double or uint64 bit patterns) per
 * rank: all[r * words ...] gets rank r's `mine`, bit for bit (each rank's slot summed as
 * integers with the others' zeros). For step-boundary bookkeeping, not for tensors. */
dt_status dt_comm_allgather_words(dt_ctx *ctx, dt_comm *c, dt_group g, const void *mine, size_t words,
                                  void *all);
dt_status dt_comm_broadcast(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int root);
dt_status dt_comm_barrier(dt_ctx *ctx, dt_comm *c, dt_group g);

/* Non-blocking in-place all-reduce (sum, f32); complete it with dt_comm_wait. */
dt_status dt_comm_iallreduce(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                             dt_comm_req **req);
dt_status dt_comm_wait(dt_ctx *ctx, dt_comm *c, dt_comm_req *req);

/* Point-to-point between ranks of group g (peer: a rank of g; tag: any value in [0, 32767]
 * telling apart messages between the same pair, matched in order per pair and tag), bytes as
 * they are. Over MPI everywhere (inside a node MPI's own shared-memory transport carries them).
 * The single-process backend has no peer and refuses. The non-blocking forms complete with
 * dt_comm_wait; their buffers must stay untouched until then. */
dt_status dt_comm_send(dt_ctx *ctx, dt_comm *c, dt_group g, const void *buf, size_t bytes, int peer, int tag);
dt_status dt_comm_recv(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int peer, int tag);
dt_status dt_comm_isend(dt_ctx *ctx, dt_comm *c, dt_group g, const void *buf, size_t bytes, int peer, int tag,
                        dt_comm_req **req);
dt_status dt_comm_irecv(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int peer, int tag,
                        dt_comm_req **req);
/* All-to-all of esize-byte elements over group g: rank r's scounts[q] elements at
 * send + sdispls[q] land at rank q's recv + rdispls[r] (rcounts[r] elements, equal to r's
 * scounts[q]). Counts and displacements in elements; send and recv must not overlap. */
dt_status dt_comm_alltoallv(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, const size_t *scounts,
                            const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
                            size_t esize);
/* The same with `count` elements to and from every rank, packed in rank order. */
dt_status dt_comm_alltoall(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, void *recv, size_t count,
                           size_t esize);

/* The cost model (comm_fit.h; NULL: none): from now on every collective of a group of 2+ ranks
 * adds its predicted time, by the fit of its kind (the bf16 variants by their f32 kind at
 * their own bytes), to dt_comm_predicted_us. The model is copied. */
typedef struct dt_comm_fit dt_comm_fit;
void dt_comm_set_model(dt_comm *c, const dt_comm_fit *f);
double dt_comm_predicted_us(const dt_comm *c);
/* Bytes this rank has sent into collectives since init (for the benchmark's traffic
 * column: ring-algorithm accounting, 2(n-1)/n per all-reduce byte). */
uint64_t dt_comm_bytes(const dt_comm *c);

/* The collective watchdog. Every collective is recorded (sequence number, op, group, bytes,
 * start and end time) in a ring of the last 64, and - under `dtrain launch`, which sets
 * $DTRAIN_RUN_DIR - in this rank's record file there (comm/rankrec.h), which other ranks
 * and the supervisor read without this rank's help. With a timeout a thread checks them:
 * when one has blocked that long, this rank reads every other rank's record and names the
 * ranks that never entered that collective (host, pid, their last collective and when, and
 * their process state where visible), prints its recent collectives, writes all of it to
 * $DTRAIN_RUN_DIR/watchdog-rank<R>.txt, waits half a second so the other ranks can dump too,
 * and exits with DT_EXIT_HANG. Point-to-point operations (send, recv, the wait on an isend or
 * irecv) are recorded too, with the peer's world rank (dt_comm_world_rank): one blocked that
 * long names the rank at the end of the chain of waits from its peer (rankrec.h
 * dt_rankrec_chain), not the ranks that never entered. A rank outside any collective for the timeout only writes its
 * file (state "outside"), once. timeout_s: seconds; 0 = off; DT_WATCHDOG_AUTO = follow the
 * job: DT_WATCHDOG_WARM_S until dt_comm_watchdog_arm ends the warm-up, then DT_WATCHDOG_MULT x
 * the slowest collective measured (not counting relaxed ones), at least DT_WATCHDOG_FLOOR_S. */
#define DT_EXIT_HANG 3
#define DT_WATCHDOG_AUTO (-1.0)
#define DT_WATCHDOG_WARM_S 300.0
#define DT_WATCHDOG_FLOOR_S 25.0
#define DT_WATCHDOG_MULT 10.0
void dt_comm_set_watchdog(dt_comm *c, double timeout_s);
/* Auto mode, called twice: the first call starts measuring the collectives (the start-up is
 * behind), the second ends the warm-up (the timeout follows what was measured since). */
void dt_comm_watchdog_arm(dt_comm *c);
/* Collectives entered while relaxed (on > 0; calls nest) wait up to DT_WATCHDOG_WARM_S in
 * auto mode and do not count as the slowest: phases whose waits follow disk or data, not
 * the network (checkpoint commits, evaluation, loading). */
void dt_comm_watchdog_relax(dt_comm *c, int on);
/* The timeout in force (seconds; 0 = off) and, in auto mode, the slowest armed collective. */
double dt_comm_watchdog_timeout(const dt_comm *c, double *slowest_s);

/* Near-even split of n elements into `parts` contiguous shards: counts[r] (the first
 * n % parts shards get one more) and offsets. */
void dt_comm_split(size_t n, int parts, size_t *counts, size_t *offsets);

#endif
