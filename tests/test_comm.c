/* The communicator under mpiexec (3 ranks: uneven splits) and as a single process: every
 * collective against values each rank can compute itself, the ordered collectives bitwise
 * against a rank-order sum, the node / cross groups from DTRAIN_NODE_ID. Every rank runs
 * the same tests; a failure on any rank fails the test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "testutil.h"

static dt_comm *C;
static dt_ctx X;

/* What rank r contributes at index i: distinct, not exactly representable sums. */
static float val(int r, size_t i) { return 0.1f * (float)(r + 1) + 1e-3f * (float)(i % 97) + 1.0f / (float)(3 + r); }

static void test_allreduce_and_ordered(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    size_t n = 1001;
    float *a = tu_malloc(n * 4), *b = tu_malloc(n * 4), *scratch = tu_malloc(n * 4 * (size_t)W);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = val(me, i);
    assert_int_equal(dt_comm_allreduce(&X, C, DT_GROUP_WORLD, a, n, DT_F32, DT_SUM), DT_OK);
    assert_int_equal(dt_comm_allreduce_ordered(&X, C, DT_GROUP_WORLD, b, n, scratch), DT_OK);
    for (size_t i = 0; i < n; i++) {
        float want = val(0, i); /* ((x0 + x1) + x2) ... in float, as one process would add */
        for (int r = 1; r < W; r++) want += val(r, i);
        assert_true(b[i] == want); /* bitwise */
        assert_true(fabsf(a[i] - want) <= 1e-5f * fabsf(want));
    }
    double d = me + 1.0;
    assert_int_equal(dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &d, 1, DT_F64, DT_MAX), DT_OK);
    assert_true(d == (double)W);
    int64_t q = me;
    assert_int_equal(dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &q, 1, DT_I64, DT_SUM), DT_OK);
    assert_true(q == (int64_t)W * (W - 1) / 2);
    free(a);
    free(b);
    free(scratch);
}

static void test_reduce_scatter_and_allgather(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    size_t n = 100, cnt[64], off[64];
    dt_comm_split(n, W, cnt, off);
    size_t tot = 0;
    for (int r = 0; r < W; r++) {
        assert_true(cnt[r] == n / (size_t)W || cnt[r] == n / (size_t)W + 1);
        assert_true(off[r] == tot);
        tot += cnt[r];
    }
    assert_true(tot == n);
    float *send = tu_malloc(n * 4), *recv = tu_malloc(n * 4), *scratch = tu_malloc(n * 4 * (size_t)W);
    for (size_t i = 0; i < n; i++) send[i] = val(me, i);
    assert_int_equal(dt_comm_reduce_scatter(&X, C, DT_GROUP_WORLD, send, recv, cnt), DT_OK);
    for (size_t i = 0; i < cnt[me]; i++) {
        float want = 0;
        for (int r = 0; r < W; r++) want += val(r, off[me] + i);
        assert_true(fabsf(recv[i] - want) <= 1e-5f * fabsf(want));
    }
    /* Ordered, with an owner map that is not the even split: rank r gets [5r, 5r + r + 1). */
    size_t oc[64], od[64];
    for (int r = 0; r < W; r++) {
        oc[r] = (size_t)r + 1;
        od[r] = 5 * (size_t)r;
    }
    assert_int_equal(dt_comm_reduce_scatter_ordered(&X, C, DT_GROUP_WORLD, send, oc, od, recv, scratch), DT_OK);
    for (size_t i = 0; i < oc[me]; i++) {
        float want = val(0, od[me] + i);
        for (int r = 1; r < W; r++) want += val(r, od[me] + i);
        assert_true(recv[i] == want);
    }
    /* All-gather in place: everyone fills its own part. */
    float *buf = tu_malloc(n * 4);
    for (size_t i = 0; i < cnt[me]; i++) buf[off[me] + i] = (float)(me * 1000 + (int)i);
    assert_int_equal(dt_comm_allgather(&X, C, DT_GROUP_WORLD, buf, cnt), DT_OK);
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < cnt[r]; i++) assert_true(buf[off[r] + i] == (float)(r * 1000 + (int)i));
    free(send);
    free(recv);
    free(scratch);
    free(buf);
}

static void test_broadcast_barrier_nonblocking(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    char msg[32] = "";
    if (me == W - 1) strcpy(msg, "from the last rank");
    assert_int_equal(dt_comm_broadcast(&X, C, DT_GROUP_WORLD, msg, sizeof msg, W - 1), DT_OK);
    assert_string_equal(msg, "from the last rank");
    assert_int_equal(dt_comm_barrier(&X, C, DT_GROUP_WORLD), DT_OK);
    float v[7];
    for (int i = 0; i < 7; i++) v[i] = (float)(me + i);
    dt_comm_req *req;
    assert_int_equal(dt_comm_iallreduce(&X, C, DT_GROUP_WORLD, v, 7, &req), DT_OK);
    assert_int_equal(dt_comm_wait(&X, C, req), DT_OK);
    for (int i = 0; i < 7; i++) assert_true(v[i] == (float)(W * (W - 1) / 2 + W * i));
    assert_true(dt_comm_bytes(C) > 0 || W == 1);
}

static void test_groups(void **state) {
    (void)state;
    /* tests/CMakeLists.txt runs 3 ranks with DTRAIN_NODE_ID = node0, node0, node1. */
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    if (W == 1) {
        assert_int_equal(dt_comm_num_nodes(C), 1);
        assert_string_equal(dt_comm_backend(C), "self");
        return;
    }
    assert_string_equal(dt_comm_backend(C), "mpi");
    assert_int_equal(W, 3);
    assert_int_equal(dt_comm_num_nodes(C), 2);
    int node_size = dt_comm_size(C, DT_GROUP_NODE), node_rank = dt_comm_rank(C, DT_GROUP_NODE);
    assert_int_equal(node_size, me < 2 ? 2 : 1);
    assert_int_equal(node_rank, me < 2 ? me : 0);
    /* Cross group: ranks with the same node-local index. */
    assert_int_equal(dt_comm_size(C, DT_GROUP_CROSS), node_rank == 0 ? 2 : 1);
    float x = 1.0f;
    assert_int_equal(dt_comm_allreduce(&X, C, DT_GROUP_NODE, &x, 1, DT_F32, DT_SUM), DT_OK);
    assert_true(x == (float)node_size);
}

int main(void) {
    dt_ctx_init(&X);
    if (dt_comm_init(&X, &C) != DT_OK) {
        fprintf(stderr, "%s\n", X.err);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_and_ordered),
        cmocka_unit_test(test_reduce_scatter_and_allgather),
        cmocka_unit_test(test_broadcast_barrier_nonblocking),
        cmocka_unit_test(test_groups),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    /* Any rank's failure fails everyone's exit status. */
    double bad = rc != 0;
    if (dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &bad, 1, DT_F64, DT_MAX) != DT_OK) bad = 1;
    dt_comm_free(C);
    return bad != 0;
}
