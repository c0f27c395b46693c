/* The communicator under mpiexec (3 ranks: uneven splits) and as a single process: every
 * collective against values each rank can compute itself, the ordered collectives bitwise
 * against a rank-order sum, the bf16 ones bitwise against comm.h's rule computed here
 * (contributions rounded, f32 sum in rank order, the sum rounded) with exact scratch sizes
 * and half the bytes, the node / cross groups from DTRAIN_NODE_ID. Every rank runs the same
 * tests; a failure on any rank fails the test. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/rankrec.h"
#include "ops/ops.h"
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

/* ---- bf16 gradient collectives */

/* Rank r's contribution at i: mixed signs and magnitudes, mostly not bf16-representable.
 * Sums of a few bf16 values of like magnitude are exact in f32 whatever the order, so at
 * every 4th element ranks 0 and 1 give +-2^20 v, which cancel in rank order but swallow the
 * low bits of the other ranks' values in any other order. */
static float gval(int r, size_t i) {
    if (i % 4 == 1 && r < 2) return (r ? -0x1p20f : 0x1p20f) * val(0, i);
    float sign = (i + (size_t)r) % 3 == 0 ? -1.0f : 1.0f;
    return sign * val(r, i) * (float)(1u << (i % 5));
}
static float round_bf16(float x) {
    uint16_t h;
    dt_f32_to_bf16(&h, &x, 1);
    dt_bf16_to_f32(&x, &h, 1);
    return x;
}
/* comm.h's rule for element i over the group whose members are world ranks first .. first+size-1. */
static float bf16_ref(int first, int size, size_t i) {
    float acc = round_bf16(gval(first, i));
    for (int q = 1; q < size; q++) acc += round_bf16(gval(first + q, i));
    return round_bf16(acc);
}
static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* A failing check is recorded, not returned from, so this rank still enters every later
 * collective the others enter (no hang); the test fails at its end with the first message. */
static char bf16_msg[256];
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond) && !bf16_msg[0]) snprintf(bf16_msg, sizeof bf16_msg, __VA_ARGS__);       \
    } while (0)

/* The group's first member: tests/CMakeLists.txt puts world ranks 0, 1 on node0 and 2 on
 * node1, so a node's members are consecutive world ranks (as are the world's). */
static int group_first(dt_group g) {
    return g == DT_GROUP_NODE ? dt_comm_rank(C, DT_GROUP_WORLD) - dt_comm_rank(C, DT_GROUP_NODE) : 0;
}

static void test_bf16_allreduce(void **state) {
    (void)state;
    bf16_msg[0] = 0;
    static const size_t sizes[] = {1, 2, 7, 1001, 4099};
    const dt_group groups[] = {DT_GROUP_WORLD, DT_GROUP_NODE};
    int me = dt_comm_rank(C, DT_GROUP_WORLD);
    for (size_t gi = 0; gi < 2; gi++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            dt_group g = groups[gi];
            size_t n = sizes[k], P = (size_t)dt_comm_size(C, g), need = DT_COMM_AR_BF16_SCRATCH(n, P);
            CHECK(need == n + P * ((n + P - 1) / P), "DT_COMM_AR_BF16_SCRATCH(%zu, %zu) = %zu", n, P, need);
            float *a = tu_malloc(n * 4), *b = tu_malloc(n * 4), *f32scr = tu_malloc(need * 4);
            uint16_t *scr = tu_malloc((need + 8) * 2);
            for (size_t i = 0; i < 8; i++) scr[need + i] = 0xBEEF; /* must stay: exact scratch size */
            for (size_t i = 0; i < n; i++) a[i] = b[i] = gval(me, i);
            uint64_t b0 = dt_comm_bytes(C);
            assert_int_equal(dt_comm_allreduce_ordered_bf16(&X, C, g, a, n, scr), DT_OK);
            uint64_t b1 = dt_comm_bytes(C);
            assert_int_equal(dt_comm_allreduce_ordered(&X, C, g, b, n, f32scr), DT_OK);
            uint64_t b2 = dt_comm_bytes(C);
            int first = group_first(g), rounded = 0;
            for (size_t i = 0; i < n; i++) {
                float want = bf16_ref(first, (int)P, i);
                CHECK(same_bits(a[i], want), "bf16 all-reduce group %d n %zu: element %zu is %.9g, want %.9g",
                      (int)g, n, i, (double)a[i], (double)want);
                rounded += a[i] != b[i];
            }
            CHECK(n < 7 || rounded > 0, "n %zu: bf16 result equals the f32 sum everywhere", n);
            for (size_t i = 0; i < 8; i++) CHECK(scr[need + i] == 0xBEEF, "n %zu: scratch overrun", n);
            /* Half the bytes of the f32 call (each counter is truncated once per collective). */
            uint64_t h = b1 - b0, f = b2 - b1;
            CHECK(2 * h <= f + 2 && f <= 2 * h + 2 && (P == 1 ? h == 0 : h > 0),
                  "n %zu: %llu bytes in bf16, %llu in f32", n, (unsigned long long)h, (unsigned long long)f);
            free(a);
            free(b);
            free(f32scr);
            free(scr);
        }
    if (bf16_msg[0]) fail_msg("rank %d: %s", me, bf16_msg);
}

/* Owner maps of a W-rank group: even split of 100, rank r gets [5r, 5r + r + 1) (gaps,
 * uneven), 2 elements over W ranks (fewer than ranks: empty parts), and rank 0 owning
 * nothing while the last rank owns a large part. */
static void owner_map(int which, int W, size_t *cnt, size_t *dis) {
    for (int r = 0; r < W; r++) {
        switch (which) {
        case 0: break;
        case 1: cnt[r] = (size_t)r + 1, dis[r] = 5 * (size_t)r; break;
        case 2: cnt[r] = r < 2 ? 1 : 0, dis[r] = r < 2 ? (size_t)r : 0; break;
        default: cnt[r] = r == 0 ? 0 : r == W - 1 ? 1000 : 3, dis[r] = r == 0 ? 0 : 10 * (size_t)r; break;
        }
    }
    if (which == 0) dt_comm_split(100, W, cnt, dis);
}

static void test_bf16_reduce_scatter_and_allgather(void **state) {
    (void)state;
    bf16_msg[0] = 0;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    size_t len = 2000, cnt[64], dis[64];
    float *send = tu_malloc(len * 4), *f32out = tu_malloc(len * 4), *f32scr = tu_malloc(len * 4 * (size_t)W);
    for (size_t i = 0; i < len; i++) send[i] = gval(me, i);
    for (int which = 0; which < 4; which++) {
        owner_map(which, W, cnt, dis);
        size_t total = 0;
        for (int r = 0; r < W; r++) total += cnt[r];
        size_t need = total + (size_t)W * cnt[me];
        uint16_t *scr = tu_malloc((need + 8) * 2), *out = tu_malloc((cnt[me] + 1) * 2);
        for (size_t i = 0; i < 8; i++) scr[need + i] = 0xBEEF;
        uint64_t b0 = dt_comm_bytes(C);
        assert_int_equal(dt_comm_reduce_scatter_ordered_bf16(&X, C, DT_GROUP_WORLD, send, cnt, dis, out, scr), DT_OK);
        uint64_t b1 = dt_comm_bytes(C);
        assert_int_equal(dt_comm_reduce_scatter_ordered(&X, C, DT_GROUP_WORLD, send, cnt, dis, f32out, f32scr), DT_OK);
        uint64_t b2 = dt_comm_bytes(C);
        for (size_t i = 0; i < cnt[me]; i++) {
            float got;
            dt_bf16_to_f32(&got, &out[i], 1);
            float want = bf16_ref(0, W, dis[me] + i);
            CHECK(same_bits(got, want), "bf16 reduce-scatter map %d: element %zu is %.9g, want %.9g", which, i,
                  (double)got, (double)want);
        }
        for (size_t i = 0; i < 8; i++) CHECK(scr[need + i] == 0xBEEF, "map %d: scratch overrun", which);
        uint64_t h = b1 - b0, f = b2 - b1;
        CHECK(2 * h <= f + 1 && f <= 2 * h + 1, "map %d: %llu bytes in bf16, %llu in f32", which,
              (unsigned long long)h, (unsigned long long)f);
        /* All-gather of bf16 values in place, the same map: everyone fills its own part. */
        uint16_t *buf = tu_malloc(len * 2);
        for (size_t i = 0; i < cnt[me]; i++) buf[dis[me] + i] = (uint16_t)(me * 4096 + (int)i);
        b0 = dt_comm_bytes(C);
        assert_int_equal(dt_comm_allgatherv_bf16(&X, C, DT_GROUP_WORLD, buf, cnt, dis), DT_OK);
        b1 = dt_comm_bytes(C);
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < cnt[r]; i++)
                CHECK(buf[dis[r] + i] == (uint16_t)(r * 4096 + (int)i), "map %d: gathered element %zu of rank %d",
                      which, i, r);
        CHECK(b1 - b0 == (uint64_t)((double)(W - 1) / W * (double)(total * 2)), "map %d: all-gather bytes", which);
        free(buf);
        free(scr);
        free(out);
    }
    free(send);
    free(f32out);
    free(f32scr);
    if (bf16_msg[0]) fail_msg("rank %d: %s", me, bf16_msg);
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

/* The collectives of a split group against the same sums by hand: ordered all-reduce and
 * reduce-scatter bitwise in the group's rank order (members[] in world ranks), gathers and a
 * broadcast from the group's last rank. */
static void check_group(dt_group g, const int *members, int n) {
    int me = dt_comm_rank(C, g);
    assert_int_equal(dt_comm_size(C, g), n);
    assert_int_equal(members[me], dt_comm_rank(C, DT_GROUP_WORLD));
    for (int r = 0; r < n; r++) assert_int_equal(dt_comm_world_rank(C, g, r), members[r]); /* the watchdog's peers */
    assert_int_equal(dt_comm_world_rank(C, g, n), -1);
    size_t len = 301, cnt[8], off[8];
    float *a = tu_malloc(len * 4), *scratch = tu_malloc(len * 4 * (size_t)n), *out = tu_malloc(len * 4);
    for (size_t i = 0; i < len; i++) a[i] = val(members[me], i);
    assert_int_equal(dt_comm_allreduce_ordered(&X, C, g, a, len, scratch), DT_OK);
    for (size_t i = 0; i < len; i++) {
        float want = val(members[0], i);
        for (int r = 1; r < n; r++) want += val(members[r], i);
        assert_true(a[i] == want);
    }
    dt_comm_split(len, n, cnt, off);
    for (size_t i = 0; i < len; i++) a[i] = val(members[me], i);
    assert_int_equal(dt_comm_reduce_scatter_ordered(&X, C, g, a, cnt, off, out, scratch), DT_OK);
    for (size_t i = 0; i < cnt[me]; i++) {
        float want = val(members[0], off[me] + i);
        for (int r = 1; r < n; r++) want += val(members[r], off[me] + i);
        assert_true(out[i] == want);
    }
    for (size_t i = 0; i < len; i++) a[i] = -1.0f;
    for (size_t i = 0; i < cnt[me]; i++) a[off[me] + i] = val(members[me], off[me] + i);
    assert_int_equal(dt_comm_allgatherv(&X, C, g, a, cnt, off), DT_OK);
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt[r]; i++) assert_true(a[off[r] + i] == val(members[r], off[r] + i));
    int64_t word = members[me] * 10 + 1, all[8];
    assert_int_equal(dt_comm_allgather_words(&X, C, g, &word, 1, all), DT_OK);
    for (int r = 0; r < n; r++) assert_true(all[r] == members[r] * 10 + 1);
    int64_t b = me == n - 1 ? 4242 : 0;
    assert_int_equal(dt_comm_broadcast(&X, C, g, &b, sizeof b, n - 1), DT_OK);
    assert_true(b == 4242);
    assert_int_equal(dt_comm_barrier(&X, C, g), DT_OK);
    free(a);
    free(scratch);
    free(out);
}

/* Groups as values (dt_comm_group_split): with 3 ranks on node0 = {0, 1}, node1 = {2}, a
 * node-local group listed in reverse order ({1, 0}: its shared-memory segment of its own,
 * when the node has one) and a cross-node group ({0, 2}: MPI); lists that do not partition the
 * world fail on every rank and make no group. One process: {0}. */
static void test_split_groups(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    dt_group a, b;
    if (W == 1) {
        assert_int_equal(dt_comm_group_split(&X, C, (int[]){0}, 1, &a), DT_OK);
        assert_true(a >= DT_GROUP_N);
        check_group(a, (int[]){0}, 1);
        assert_int_equal(dt_comm_group_split(&X, C, (int[]){1}, 1, &b), DT_ERR_BACKEND);
        assert_non_null(strstr(X.err, "not a rank of the world"));
        return;
    }
    assert_int_equal(W, 3);
    int node_shm = strstr(dt_comm_routing(C), "shared memory") != NULL;
    const int *la = me < 2 ? (int[]){1, 0} : (int[]){2};
    int na = me < 2 ? 2 : 1;
    assert_int_equal(dt_comm_group_split(&X, C, la, na, &a), DT_OK);
    assert_int_equal(dt_comm_group_shm(C, a), me < 2 && node_shm);
    check_group(a, la, na);
    const int *lb = me != 1 ? (int[]){0, 2} : (int[]){1};
    int nb = me != 1 ? 2 : 1;
    assert_int_equal(dt_comm_group_split(&X, C, lb, nb, &b), DT_OK);
    assert_true(b != a && b >= DT_GROUP_N && a >= DT_GROUP_N);
    assert_int_equal(dt_comm_group_shm(C, b), 0);
    check_group(b, lb, nb);
    /* a again, after b: groups keep their own communicators */
    check_group(a, la, na);
    /* rank 0 lists {0, 1}, rank 1 lists {1, 2}: no partition */
    const int *bad = me == 0 ? (int[]){0, 1} : me == 1 ? (int[]){1, 2} : (int[]){2};
    dt_group z = -1;
    assert_int_equal(dt_comm_group_split(&X, C, bad, me < 2 ? 2 : 1, &z), DT_ERR_BACKEND);
    assert_non_null(strstr(X.err, "partition the world"));
    assert_int_equal(z, -1);
    /* rank 2 puts itself in no group it names */
    const int *bad2 = me < 2 ? (int[]){0, 1} : (int[]){0};
    assert_int_equal(dt_comm_group_split(&X, C, bad2, me < 2 ? 2 : 1, &z), DT_ERR_BACKEND);
    assert_int_equal(z, -1);
    /* the next split still works */
    dt_group w;
    assert_int_equal(dt_comm_group_split(&X, C, (int[]){0, 1, 2}, 3, &w), DT_OK);
    check_group(w, (int[]){0, 1, 2}, 3);
}

/* Point-to-point and all-to-all: a ring of non-blocking sends on the world, blocking
 * ping-pong on a split group across the nodes, all-to-allv with uneven counts (rank r sends
 * r + q + 1 elements to q) on the world and all-to-all on a split group; one process: the
 * all-to-all is a copy and point-to-point is refused. */
static int64_t a2a_val(int from, int to, size_t i) { return (int64_t)from * 1000000 + to * 1000 + (int64_t)i; }

static void test_p2p_and_alltoall(void **state) {
    (void)state;
    int W = dt_comm_size(C, DT_GROUP_WORLD), me = dt_comm_rank(C, DT_GROUP_WORLD);
    /* all-to-allv over the world */
    size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
    for (int q = 0; q < W; q++) {
        sc[q] = (size_t)(me + q + 1), sd[q] = so, so += sc[q];
        rc[q] = (size_t)(q + me + 1), rd[q] = ro, ro += rc[q];
    }
    int64_t *snd = tu_malloc(so * 8), *rcv = tu_malloc(ro * 8);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < sc[q]; i++) snd[sd[q] + i] = a2a_val(me, q, i);
    assert_int_equal(dt_comm_alltoallv(&X, C, DT_GROUP_WORLD, snd, sc, sd, rcv, rc, rd, 8), DT_OK);
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < rc[q]; i++) assert_true(rcv[rd[q] + i] == a2a_val(q, me, i));
    free(snd);
    free(rcv);
    if (W == 1) {
        char x = 0;
        assert_int_equal(dt_comm_send(&X, C, DT_GROUP_WORLD, &x, 1, 0, 0), DT_ERR_BACKEND);
        return;
    }
    /* a ring: everyone posts its receive and its send, then waits */
    double out = me + 0.5, in = -1;
    dt_comm_req *rq, *sq;
    assert_int_equal(dt_comm_irecv(&X, C, DT_GROUP_WORLD, &in, sizeof in, (me + W - 1) % W, 7, &rq), DT_OK);
    assert_int_equal(dt_comm_isend(&X, C, DT_GROUP_WORLD, &out, sizeof out, (me + 1) % W, 7, &sq), DT_OK);
    assert_int_equal(dt_comm_wait(&X, C, sq), DT_OK);
    assert_int_equal(dt_comm_wait(&X, C, rq), DT_OK);
    assert_true(in == (me + W - 1) % W + 0.5);
    assert_int_equal(dt_comm_send(&X, C, DT_GROUP_WORLD, &out, sizeof out, W, 0), DT_ERR_BACKEND);
    assert_non_null(strstr(X.err, "peer 3 is not a rank of a group of 3"));
    /* ping-pong on {0, 2} (across the nodes), in group ranks */
    dt_group b;
    const int *lb = me != 1 ? (int[]){0, 2} : (int[]){1};
    assert_int_equal(dt_comm_group_split(&X, C, lb, me != 1 ? 2 : 1, &b), DT_OK);
    if (me != 1) {
        int gr = dt_comm_rank(C, b);
        int64_t v = 0;
        if (gr == 0) {
            v = 99;
            assert_int_equal(dt_comm_send(&X, C, b, &v, 8, 1, 3), DT_OK);
            assert_int_equal(dt_comm_recv(&X, C, b, &v, 8, 1, 4), DT_OK);
            assert_true(v == 100);
        } else {
            assert_int_equal(dt_comm_recv(&X, C, b, &v, 8, 0, 3), DT_OK);
            v++;
            assert_int_equal(dt_comm_send(&X, C, b, &v, 8, 0, 4), DT_OK);
        }
        float s2[2] = {(float)me, (float)me + 0.25f}, r2[2];
        assert_int_equal(dt_comm_alltoall(&X, C, b, s2, r2, 1, sizeof(float)), DT_OK);
        assert_true(r2[0] == 0.0f + (gr == 1 ? 0.25f : 0.0f) && r2[1] == 2.0f + (gr == 1 ? 0.25f : 0.0f));
    }
}

/* Rank records with point-to-point peers, and the chain of waits through them (rankrec.h):
 * records of a world of 5 made here (this process's pid: running), one by a child that exited
 * (gone), followed to their end in each way a chain ends. */
static void test_rankrec_chain(void **state) {
    (void)state;
    char dir[] = "/tmp/dt_rankrec_XXXXXX";
    assert_non_null(mkdtemp(dir));
    dt_rankrec *r[4];
    for (int i = 0; i < 4; i++) assert_non_null(r[i] = dt_rankrec_open(dir, i, 5));
    dt_rankrec_enter(r[0], 7, "recv", 1, 1.0);
    dt_rankrec_enter(r[1], 9, "wait_isend", 2, 1.0);
    dt_rankrec_enter(r[2], 8, "recv", 3, 1.0);
    dt_rankrec_enter(r[3], 4, "allreduce", -1, 1.0); /* rank 3: out of every operation */
    dt_rankrec_leave(r[3], 4, 2.0);
    dt_rankrec_info in;
    assert_int_equal(dt_rankrec_read(dir, 1, &in), 0);
    assert_int_equal(in.peer, 2);
    assert_true(dt_rankrec_inside(&in));
    assert_string_equal(in.op, "wait_isend");
    int chain[8] = {0, 1};
    dt_chain_end e;
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 4);
    assert_int_equal(e, DT_CHAIN_OUTSIDE);
    assert_true(chain[2] == 2 && chain[3] == 3);
    unsigned char stop[5] = {0, 0, 1, 0, 0}; /* a culprit already named ends the chain */
    assert_int_equal(dt_rankrec_chain(dir, 5, stop, 0, chain, 2, 8, &e), 3);
    assert_int_equal(e, DT_CHAIN_STOP);
    dt_rankrec_enter(r[3], 5, "allreduce", -1, 3.0); /* waits in a collective */
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 4);
    assert_int_equal(e, DT_CHAIN_COLLECTIVE);
    dt_rankrec_enter(r[3], 6, "recv", 1, 4.0); /* on rank 1, earlier in the chain */
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 4);
    assert_int_equal(e, DT_CHAIN_CYCLE);
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 3, &e), 3);
    assert_int_equal(e, DT_CHAIN_LONG);
    dt_rankrec_enter(r[3], 7, "recv", 4, 5.0); /* on rank 4, which has no record */
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 5);
    assert_int_equal(e, DT_CHAIN_NORECORD);
    assert_int_equal(chain[4], 4);
    /* rank 4's record from a process that exited inside a receive from rank 0: gone */
    pid_t k = fork();
    if (k == 0) {
        dt_rankrec *c = dt_rankrec_open(dir, 4, 5);
        dt_rankrec_enter(c, 3, "recv", 0, 6.0);
        _exit(c ? 0 : 1);
    }
    int ws = 1;
    assert_int_equal(waitpid(k, &ws, 0), k);
    assert_int_equal(ws, 0);
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 5); /* live: it cannot run */
    assert_int_equal(e, DT_CHAIN_DEAD);
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 0, chain, 2, 8, &e), 5); /* records: on rank 0 */
    assert_int_equal(e, DT_CHAIN_CYCLE);
    /* gone after its own watchdog fired: it timed out waiting, so the chain goes on */
    char p[256];
    snprintf(p, sizeof p, "%s/watchdog-rank4.txt", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "dtrain-watchdog rank=4 state=blocked seq=3 op=recv time=6.000 peer=0\n");
    fclose(f);
    assert_int_equal(dt_rankrec_chain(dir, 5, NULL, 1, chain, 2, 8, &e), 5);
    assert_int_equal(e, DT_CHAIN_CYCLE);
    for (int i = 0; i < 4; i++) dt_rankrec_close(r[i]);
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/rank%d.rec", dir, i);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/watchdog-rank4.txt", dir);
    unlink(p);
    rmdir(dir);
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
        cmocka_unit_test(test_bf16_allreduce),
        cmocka_unit_test(test_bf16_reduce_scatter_and_allgather),
        cmocka_unit_test(test_broadcast_barrier_nonblocking),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_split_groups),
        cmocka_unit_test(test_p2p_and_alltoall),
        cmocka_unit_test(test_rankrec_chain),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    /* Any rank's failure fails everyone's exit status. */
    double bad = rc != 0;
    if (dt_comm_allreduce(&X, C, DT_GROUP_WORLD, &bad, 1, DT_F64, DT_MAX) != DT_OK) bad = 1;
    dt_comm_free(C);
    return bad != 0;
}
