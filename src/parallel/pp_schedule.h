/* pp_schedule.h - pipeline-parallel schedules as pure action lists, their invariants, and a
 * replay (issue 32 item 2; docs/ARCHITECTURE.md decision 75). No communication and no model
 * code: the pipeline runtime asks for its rank's list and runs it; the bench and the tests
 * replay all ranks' lists to see what a schedule implies.
 *
 * Terms. pp ranks (stages), v virtual stages ("chunks") per rank, m micro-batches per step
 * (training.grad_accum). Chunk c of rank r is the global virtual stage s = c pp + r (Megatron's
 * interleaving: a micro-batch visits rank 0, 1, .., pp-1, then rank 0's chunk 1, ...); S = v pp
 * virtual stages. An action is F (forward of one micro-batch through one chunk), B (its whole
 * backward, or under zb-h1 only the input-gradient pass, the one the previous stage waits
 * for) or W (zb-h1's weight-gradient pass of the same micro-batch and chunk).
 *
 * How each schedule is formed (rank r; "warm-up" forwards run before the first backward):
 *   gpipe        F 0..m-1, then B 0..m-1. The backwards run in micro-batch order, not
 *                reversed (GPipe's usual picture), so that gradients accumulate in the order
 *                one rank's training would (below). Holds m activation sets.
 *   1f1b         warm-up min(m, pp-r-1) forwards; steady state: F of the next micro-batch,
 *                then B of the oldest; cool-down: the remaining B's (PipeDream-Flush, the
 *                Megatron/torchtitan default). Holds min(m, pp-r) activation sets.
 *   interleaved  Megatron-Core's interleaved 1F1B (v >= 2, pp >= 2, pp divides m): the k-th
 *                forward of the rank (k < m v) is micro-batch (k / (pp v)) pp + k % pp of chunk
 *                (k / pp) % v - micro-batches in groups of pp, each group through chunk 0,
 *                then chunk 1, ...; the k-th backward the same micro-batch of chunk
 *                v-1 - (k / pp) % v. Warm-up min(m v, 2 (pp-r-1) + (v-1) pp) forwards, then
 *                one forward / one backward, then the remaining backwards. Megatron's rule
 *                that m = pp runs all forwards first is not taken: these lists do not need it
 *                (the replay proves them free of deadlock), and it would raise rank r's
 *                activation sets to m v. Holds min(m v, 2 (pp-r-1) + (v-1) pp + 1) chunk sets.
 *   zb-h1        ZB-H1 of Qi et al. 2024 ("Zero Bubble Pipeline Parallelism"): 1f1b's F and
 *                B order with B the input-gradient pass only; W of micro-batch j runs right
 *                after B of micro-batch j + r (after the last B, the W's still owed run in
 *                order). Deferring W by r passes on rank r fills the cool-down bubble with
 *                weight-gradient work: with F = B = W durations the idle time per rank is
 *                (pp-1) F (the paper's (p-1)(T_F + T_B - T_W)) against 1f1b's 3 (pp-1) F for
 *                m >= pp. Every rank then holds min(m, pp) activation sets (a set is freed
 *                after its W): the peak over ranks is 1f1b's (stage 0's), as in the paper;
 *                later ranks hold more than under 1f1b, which frees theirs sooner.
 *
 * Invariants (dt_pp_schedule_valid checks a list against them; the runtime asserts it):
 *   1. every (micro-batch, chunk) of the rank gets exactly one F and one B, and under zb-h1
 *      one W; its B runs after its F, its W after its B;
 *   2. for each chunk, the F's, the B's and the W's each run in micro-batch order 0..m-1 -
 *      gradient accumulation in a parameter's buffer happens in the order of pp = 1, which is
 *      what makes a pipelined step bitwise equal to the unpipelined one;
 *   3. the activation sets held (pairs whose F ran and whose last backward pass - B, or W
 *      under zb-h1 - has not) never exceed dt_pp_inflight.
 * Across ranks, the lists are free of deadlock: run by every rank in order, each action
 * waiting for its inputs, all complete (dt_pp_replay returns 0; the unit test runs every pp
 * 1..8, v 1..4, m 1..16 that dt_pp_schedule_check accepts). The replay's model is that a
 * send completes without waiting for its receive (a buffered or non-blocking send); a
 * runtime with rendezvous sends must pair them the way Megatron's send_forward_recv_backward
 * does. Because every rank orders (micro-batch, chunk) pairs by the same formula, the
 * activations rank r sends to rank r+1 (and rank pp-1 to rank 0's next chunk) arrive in the
 * order the receiver consumes them, and so do the gradients going back.
 *
 *   DT_CHECK(dt_pp_schedule_check(ctx, k, pp, v, m));
 *   dt_pp_action *a = malloc(dt_pp_schedule_len(k, pp, v, m) * sizeof *a);
 *   int n = dt_pp_schedule(k, pp, v, m, rank, a);
 *   DT_ASSERT(dt_pp_schedule_valid(k, pp, v, m, rank, a, n));
 */
#ifndef DT_PP_SCHEDULE_H
#define DT_PP_SCHEDULE_H

#include "core/status.h"

typedef enum dt_pp_kind {
    DT_PP_GPIPE,
    DT_PP_1F1B,
    DT_PP_INTERLEAVED,
    DT_PP_ZBH1,
    DT_PP_NKINDS
} dt_pp_kind;

/* B: the whole backward, or under zb-h1 the input-gradient pass; W: zb-h1's weight-gradient
 * pass. */
typedef enum dt_pp_op { DT_PP_F, DT_PP_B, DT_PP_W } dt_pp_op;

/* chunk: the virtual stage on this rank, 0..v-1; its global virtual stage is chunk pp + rank;
 * 0 when v = 1. */
typedef struct dt_pp_action {
    dt_pp_op op;
    int mb;
    int chunk;
} dt_pp_action;

/* Bounds dt_pp_schedule_check enforces (list lengths and replay indices stay in int). */
#define DT_PP_MAX_STAGES (1 << 20) /* parallel.pp */
#define DT_PP_MAX_VIRTUAL 64       /* parallel.pp_virtual */
#define DT_PP_MAX_MICRO (1 << 20)  /* training.grad_accum */

/* "gpipe", "1f1b", "interleaved", "zb-h1" into *out; anything else fails with one line naming
 * parallel.pp_schedule, the value and the choices. */
dt_status dt_pp_kind_parse(dt_ctx *ctx, const char *s, dt_pp_kind *out);
/* The name dt_pp_kind_parse reads ("?" for a value out of range). */
const char *dt_pp_kind_name(dt_pp_kind k);

/* Refuses (DT_ERR_CONFIG, one line naming the key: parallel.pp, parallel.pp_schedule,
 * parallel.pp_virtual or training.grad_accum) what the schedule cannot run: pp, v or m < 1
 * or above the bounds; v > 1 for a kind other than interleaved; interleaved with v < 2, with
 * pp = 1, or with m not divisible by pp (Megatron's rule). */
dt_status dt_pp_schedule_check(dt_ctx *ctx, dt_pp_kind k, int pp, int v, int m);

/* The functions below take arguments dt_pp_schedule_check accepts (and 0 <= rank < pp);
 * anything else is a programming error (DT_ASSERT). */

/* Actions per rank: 2 m v (3 m under zb-h1). */
int dt_pp_schedule_len(dt_pp_kind k, int pp, int v, int m);
/* This rank's actions in execution order into out (dt_pp_schedule_len entries); returns
 * their count. */
int dt_pp_schedule(dt_pp_kind k, int pp, int v, int m, int rank, dt_pp_action *out);
/* The most (micro-batch, chunk) pairs whose F ran and whose last backward pass (B, or W under
 * zb-h1) has not: the activation sets the rank must hold at once. gpipe m, 1f1b
 * min(m, pp-rank), interleaved min(m v, 2 (pp-rank-1) + (v-1) pp + 1), zb-h1 min(m, pp). */
int dt_pp_inflight(dt_pp_kind k, int pp, int v, int m, int rank);

/* 1 when actions[0..n) is a list rank may run under the schedule: n = dt_pp_schedule_len,
 * every action in range (W only under zb-h1) and invariants 1-3 of the header hold; else 0.
 * The schedule's own lists pass; a list with two B's (or F's, or W's) of one chunk swapped,
 * a pass before its input, or more activation sets held than dt_pp_inflight does not. Whether
 * the ranks' lists fit together (no deadlock) is the replay's question. */
int dt_pp_schedule_valid(dt_pp_kind k, int pp, int v, int m, int rank,
                         const dt_pp_action *actions, int n);

/* Replay: a discrete-event simulation of all ranks running their action lists in order, each
 * action starting when its rank is free and its inputs exist: F of virtual stage s > 0 needs
 * F of s-1 of that micro-batch, B of s < S-1 needs B of s+1 (B of the last virtual stage its
 * own F), W its own B; an input made on another rank arrives p2p later. f[r], b[r], w[r]: the
 * duration of one action of rank r (per chunk; w may be NULL where no list has a W). Fills
 * *makespan (the last action's end, the step starting at 0) and idle[r] = makespan - busy time
 * of rank r (pp entries). Returns 0; -1 when the lists deadlock (no rank can proceed); -2 when
 * memory runs out. */
int dt_pp_replay(dt_pp_kind k, int pp, int v, int m, const double *f, const double *b,
                 const double *w, double p2p, double *makespan, double *idle);
/* The same for any lists: lists[r][0..lens[r]) is rank r's. Returns 0, -1 on deadlock, -2
 * when an action is out of range (mb outside 0..m-1, chunk outside 0..v-1) or runs twice, or
 * memory runs out. */
int dt_pp_replay_lists(int pp, int v, int m, const dt_pp_action *const *lists, const int *lens,
                       const double *f, const double *b, const double *w, double p2p,
                       double *makespan, double *idle);

#endif
