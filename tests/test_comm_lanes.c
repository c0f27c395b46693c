/* Concurrent communication lanes (comm.h dt_comm_init_concurrent; ARCHITECTURE decision 61):
 * 4 ranks on 2 simulated nodes (0, 1 | 2, 3), TP groups {0, 1} {2, 3} (inside a node: shared
 * memory) and DP groups {0, 2} {1, 3} (across: MPI). On every rank the main thread (the
 * compute thread's lane) runs ordered all-reduces on its TP group while a second thread (the
 * data-parallel lane) runs them on its DP group, and each rank enters them in a crossing order:
 * ranks 0 and 3 start TP first, 1 and 2 DP first (the other lane starts only once the first has
 * entered its collective). Queued on one FIFO per rank this is a cycle - 0 waits in TP for 1,
 * 1 in DP for 3, 3 in TP for 2, 2 in DP for 0 - and hangs; on lanes it completes, and every
 * sum is bitwise the rank-order sum. Plain cmocka-free checks: any failure exits non-zero. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"

enum { ROUNDS = 20, N = 70001 }; /* odd: uneven parts in the ordered all-reduce */

static dt_comm *C;
static dt_group TP, DP;
static atomic_int fails; /* both lanes count */
static atomic_int entered[2]; /* lane l has entered round r's collective: r + 1 */

static float val(int r, size_t i, int round) { return 0.1f * (float)(r + 1) + 1e-3f * (float)(i % 89) + 0.01f * (float)round; }

/* One lane: ROUNDS ordered all-reduces on group g, each checked bitwise; lane `first` of this
 * rank enters a round's collective before the other lane may enter it. */
typedef struct lane {
    int which; /* 0: TP, 1: DP */
    dt_group g;
    int members[2];
    int first;
} lane;

static void *run_lane(void *arg) {
    lane *L = arg;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    float *buf = malloc(N * sizeof(float)), *scratch = malloc(2 * N * sizeof(float));
    int me = dt_comm_rank(C, L->g), wr = dt_comm_rank(C, DT_GROUP_WORLD);
    for (int round = 0; round < ROUNDS && buf && scratch; round++) {
        if (L->which != L->first)
            while (atomic_load(&entered[L->first]) < round + 1) sched_yield();
        for (size_t i = 0; i < N; i++) buf[i] = val(L->members[me], i, round);
        atomic_store(&entered[L->which], round + 1);
        if (dt_comm_allreduce_ordered(&ctx, C, L->g, buf, N, scratch) != DT_OK) {
            fprintf(stderr, "rank %d lane %d: %s\n", wr, L->which, ctx.err);
            fails++;
            break;
        }
        for (size_t i = 0; i < N; i++) {
            float want = val(L->members[0], i, round) + val(L->members[1], i, round);
            if (buf[i] != want) {
                fprintf(stderr, "rank %d lane %d round %d: [%zu] %g, want %g\n", wr, L->which, round, i, buf[i], want);
                fails++;
                break;
            }
        }
    }
    free(buf);
    free(scratch);
    return NULL;
}

int main(void) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (dt_comm_init_concurrent(&ctx, &C) != DT_OK) {
        fprintf(stderr, "%s\n", ctx.err);
        return 1;
    }
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    if (W != 4 || dt_comm_num_nodes(C) != 2) {
        fprintf(stderr, "test_comm_lanes runs as 4 ranks on 2 nodes (got %d on %d)\n", W, dt_comm_num_nodes(C));
        dt_comm_free(C);
        return 1;
    }
    lane tp = {0, 0, {me & ~1, me | 1}, 0}, dp = {1, 0, {me & 1, (me & 1) + 2}, 0};
    if (dt_comm_group_split(&ctx, C, tp.members, 2, &TP) != DT_OK ||
        dt_comm_group_split(&ctx, C, dp.members, 2, &DP) != DT_OK) {
        fprintf(stderr, "%s\n", ctx.err);
        return 1;
    }
    tp.g = TP, dp.g = DP;
    tp.first = dp.first = me == 0 || me == 3 ? 0 : 1; /* the crossing order */
    pthread_t th;
    if (pthread_create(&th, NULL, run_lane, &dp) != 0) return 1;
    run_lane(&tp);
    pthread_join(th, NULL);
    printf("rank %d: %d rounds on TP {%d,%d} (%s) and DP {%d,%d} (%s) at once, crossing order: %s\n", me, ROUNDS,
           tp.members[0], tp.members[1], dt_comm_group_shm(C, TP) ? "shared memory" : "MPI", dp.members[0],
           dp.members[1], dt_comm_group_shm(C, DP) ? "shared memory" : "MPI", fails ? "FAILED" : "ok");
    double bad = fails != 0;
    if (dt_comm_allreduce(&ctx, C, DT_GROUP_WORLD, &bad, 1, DT_F64, DT_MAX) != DT_OK) bad = 1;
    dt_comm_free(C);
    return bad != 0;
}
