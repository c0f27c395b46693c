/* The node-local shared-memory collectives (comm/shm.h) against the MPI ones, under mpiexec
 * (tests/CMakeLists.txt: 2, 3 and 4 ranks on one node, 4 ranks on 2 simulated nodes): for
 * every node-local group (the node; the world on one node) the ordered all-reduce, the
 * ordered reduce-scatter with the even split and with an uneven owner map (empty parts
 * included), the bf16 ordered all-reduce (its reduce-scatter and 16-bit all-gather), and the
 * f32 and 16-bit all-gathers, on sizes below the rank count, odd sizes
 * and sizes of several slot rounds, give bitwise the results of the same call over MPI
 * (dt_comm_set_shm off), which are themselves the rank-order sums computed here. The
 * segment exists (a node with 2+ ranks that fell back to MPI fails the test) and its name is
 * gone from /dev/shm once the communicator is up. On several nodes the world's ordered
 * all-reduce runs hierarchically, bitwise the flat one. Any rank's failure fails all. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/shm.h"

static dt_comm *C;
static dt_ctx X;
static int g_fail;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", dt_comm_rank(C, DT_GROUP_WORLD), __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            g_fail++;                                                                        \
        }                                                                                    \
    } while (0)

static float val(int r, size_t i) { return 0.1f * (float)(r + 1) + 1e-3f * (float)(i % 997) + 1.0f / (float)(3 + r); }

static void fill(float *b, size_t n, int r) {
    for (size_t i = 0; i < n; i++) b[i] = val(r, i);
}

/* One run of each collective on group g with the current routing, into out arrays. */
static void run_all(dt_group g, size_t n, float *ar, float *rs_even, float *rs_map, float *ag, uint16_t *ag16,
                    float *bf) {
    int P = dt_comm_size(C, g), me = dt_comm_rank(C, g);
    float *scratch = malloc((n / (size_t)P + 1) * (size_t)P * sizeof(float) + 64);
    size_t cnt[64], dis[64];
    fill(ar, n, me);
    CHECK(dt_comm_allreduce_ordered(&X, C, g, ar, n, scratch) == DT_OK, "allreduce_ordered: %s", X.err);
    /* even split */
    float *send = malloc(n * sizeof(float) + 4);
    fill(send, n, me);
    dt_comm_split(n, P, cnt, dis);
    CHECK(dt_comm_reduce_scatter_ordered(&X, C, g, send, cnt, dis, rs_even, scratch) == DT_OK, "rs: %s", X.err);
    /* an owner map in reverse order with uneven parts, rank 0's part empty when P > 1 */
    size_t used = 0;
    for (int r = P - 1; r >= 0; r--) {
        cnt[r] = r == 0 && P > 1 ? 0 : (n - used) / (size_t)(r + 1);
        dis[r] = used;
        used += cnt[r];
    }
    CHECK(dt_comm_reduce_scatter_ordered(&X, C, g, send, cnt, dis, rs_map, scratch) == DT_OK, "rs map: %s", X.err);
    /* all-gathers: my part of the even split written, the rest garbage before */
    dt_comm_split(n, P, cnt, dis);
    for (size_t i = 0; i < n; i++) ag[i] = -1.0f, ag16[i] = 0xffff;
    for (size_t i = 0; i < cnt[me]; i++) ag[dis[me] + i] = val(me, dis[me] + i), ag16[dis[me] + i] = (uint16_t)(me * 1000 + i);
    CHECK(dt_comm_allgatherv(&X, C, g, ag, cnt, dis) == DT_OK, "allgatherv: %s", X.err);
    /* bf16: the ordered all-reduce (its reduce-scatter, then a 16-bit all-gather) */
    uint16_t *scr16 = malloc((n + (n / (size_t)P + 1) * (size_t)P) * sizeof(uint16_t) + 64);
    fill(bf, n, me);
    CHECK(dt_comm_allreduce_ordered_bf16(&X, C, g, bf, n, scr16) == DT_OK, "allreduce_ordered_bf16: %s", X.err);
    free(scr16);
    CHECK(dt_comm_allgatherv_bf16(&X, C, g, ag16, cnt, dis) == DT_OK, "allgatherv16: %s", X.err);
    free(scratch);
    free(send);
}

static void compare(dt_group g, size_t n) {
    int P = dt_comm_size(C, g), me = dt_comm_rank(C, g);
    float *a[2][5];
    uint16_t *h[2];
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 5; j++) a[k][j] = calloc(n + 1, sizeof(float));
        h[k] = calloc(n + 1, sizeof(uint16_t));
    }
    for (int k = 0; k < 2; k++) { /* k 0: MPI, 1: shared memory */
        int on = dt_comm_set_shm(C, k);
        CHECK(on == k, "dt_comm_set_shm(%d) gave %d: no segment on a node of %d ranks", k, on, P);
        run_all(g, n, a[k][0], a[k][1], a[k][2], a[k][3], h[k], a[k][4]);
    }
    /* the MPI results are the rank-order sums */
    for (size_t i = 0; i < n; i++) {
        float want = val(0, i);
        for (int r = 1; r < P; r++) want += val(r, i);
        if (a[0][0][i] != want) {
            CHECK(0, "MPI allreduce_ordered[%zu] is not the rank-order sum", i);
            break;
        }
    }
    size_t cnt[64], dis[64];
    dt_comm_split(n, P, cnt, dis);
    const char *what[5] = {"allreduce_ordered", "reduce_scatter_ordered (even)", "reduce_scatter_ordered (map)",
                           "allgatherv", "allreduce_ordered_bf16"};
    size_t len[5] = {n, cnt[me], 0, n, n};
    size_t used = 0;
    for (int r = P - 1; r >= 0; r--) {
        size_t c = r == 0 && P > 1 ? 0 : (n - used) / (size_t)(r + 1);
        if (r == me) len[2] = c;
        used += c;
    }
    for (int j = 0; j < 5; j++)
        CHECK(!memcmp(a[0][j], a[1][j], len[j] * sizeof(float)), "group %d n %zu: %s differs from MPI's", (int)g, n,
              what[j]);
    CHECK(!memcmp(h[0], h[1], n * sizeof(uint16_t)), "group %d n %zu: 16-bit allgatherv differs", (int)g, n);
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 5; j++) free(a[k][j]);
        free(h[k]);
    }
}

/* Several nodes: the world's ordered all-reduce, hierarchical (node-local shared memory, a
 * chain of the nodes, the total broadcast back) against flat (MPI), bitwise, and both the
 * world-rank-order sum. */
static void compare_hier(size_t n) {
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    float *a = malloc(n * sizeof(float) + 4), *b = malloc(n * sizeof(float) + 4);
    float *scratch = malloc((n / (size_t)W + 1) * (size_t)W * sizeof(float) + 64);
    fill(a, n, me);
    fill(b, n, me);
    int on = dt_comm_set_hierarchical(C, 1);
    CHECK(on == 1, "hierarchical all-reduce unavailable on %d ranks, %d nodes", W, dt_comm_num_nodes(C));
    CHECK(dt_comm_allreduce_ordered(&X, C, DT_GROUP_WORLD, a, n, scratch) == DT_OK, "hierarchical: %s", X.err);
    CHECK(dt_comm_set_hierarchical(C, 0) == 0, "hierarchical stays on");
    CHECK(dt_comm_allreduce_ordered(&X, C, DT_GROUP_WORLD, b, n, scratch) == DT_OK, "flat: %s", X.err);
    dt_comm_set_hierarchical(C, 1);
    CHECK(!memcmp(a, b, n * sizeof(float)), "n %zu: hierarchical all-reduce differs from flat", n);
    for (size_t i = 0; i < n; i++) {
        float want = val(0, i);
        for (int r = 1; r < W; r++) want += val(r, i);
        if (a[i] != want) {
            CHECK(0, "n %zu: hierarchical [%zu] is not the world-rank-order sum", n, i);
            break;
        }
    }
    free(a), free(b), free(scratch);
}

/* Names in /dev/shm of segments this process created ("dtrain-shm-<my pid>-..."): other jobs
 * (a parallel ctest) may be in their own set-up. */
static int my_shm_names(void) {
    char mine[64];
    snprintf(mine, sizeof mine, DT_SHM_PREFIX "%ld-", (long)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, mine, strlen(mine))) n++;
    if (d) closedir(d);
    return n;
}

int main(void) {
    dt_ctx_init(&X);
    if (dt_comm_init(&X, &C) != DT_OK) {
        fprintf(stderr, "%s\n", X.err);
        return 1;
    }
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    int nodes = dt_comm_num_nodes(C), local = dt_comm_size(C, DT_GROUP_NODE);
    CHECK(W > 1, "run me under mpiexec");
    CHECK(dt_comm_barrier(&X, C, DT_GROUP_WORLD) == DT_OK, "barrier"); /* every node's set-up done */
    /* node-local rank 0 created its node's segment: its name is gone */
    CHECK(my_shm_names() == 0, "this process's " DT_SHM_PREFIX "* name is left in /dev/shm after set-up");
    /* sizes: below the rank count, odd, and several slot rounds (1M floats a slot) */
    const size_t sizes[] = {1, 2, 3, 1001, 262147, 2500003};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        if (local > 1) compare(DT_GROUP_NODE, sizes[k]);
        if (nodes == 1) compare(DT_GROUP_WORLD, sizes[k]);
        else compare_hier(sizes[k]);
    }
    if (me == 0)
        printf("test_comm_shm: %d ranks, %d node(s), %d on this node: shared-memory collectives %s MPI's bitwise\n",
               W, nodes, local, g_fail ? "DIFFER from" : "equal");
    double bad = g_fail != 0;
    dt_comm_set_shm(C, 0);
    if (dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &bad, 1, DT_F64, DT_MAX) != DT_OK) bad = 1;
    dt_comm_free(C);
    return bad != 0;
}
