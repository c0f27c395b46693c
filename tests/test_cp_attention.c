/* Context parallelism's ring attention (model/cp.c, decision 83) with the CP ranks as threads
 * of one process and an in-memory ring: for cp = 1..4, the load-balanced chunks (rank r holds
 * chunks r and 2 cp - 1 - r), grouped-query heads, chunk sizes that are not a multiple of the
 * kernel's tile, fp32 and bf16 operands:
 *  - each rank's out and lse equal the whole sequence's causal attention (dt_attention_forward)
 *    at the rows' global positions, to 1e-5 (the merges round; the float64 reference of the
 *    blocks is tests/test_backend_ops.c's);
 *  - each rank's dqkv, scattered to the global positions, equals dt_attention_backward's, to
 *    2e-5 (the gradients of the keys and values summed around the ring);
 *  - parallel.cp_comm=all_gather (the blocks gathered at once, the shares home by all-to-all)
 *    gives the ring's bits exactly;
 *  - the contiguous layout (parallel.cp_split=contiguous: rank r the r-th cp-th) with its own
 *    pairs matches too, and contiguous rows given to the balanced ring fail the comparison:
 *    the test sees the layout. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "model/cp.h"
#include "ops/ops.h"

#define MAXP 4

/* An in-memory ring: start records this rank's send and receive buffers; wait meets the other
 * ranks at a barrier, copies the previous rank's send into its receive, and meets them again
 * (so no rank overwrites a buffer another still copies from). */
typedef struct ring_sim {
    int P;
    pthread_barrier_t bar;
    const float *send[2][MAXP];
    float *recv[2][MAXP];
    size_t n[2][MAXP];
    float *gbuf[MAXP];         /* all_gather: each rank's in-place buffer */
    const float *a2a[MAXP];    /* and its all-to-all send */
} ring_sim;
typedef struct rank_ud {
    ring_sim *sim;
    int r;
} rank_ud;

static int sim_start(void *ud, int slot, const float *send, float *recv, size_t n) {
    rank_ud *u = ud;
    u->sim->send[slot][u->r] = send, u->sim->recv[slot][u->r] = recv, u->sim->n[slot][u->r] = n;
    return 0;
}
static int sim_wait(void *ud, int slot) {
    rank_ud *u = ud;
    ring_sim *s = u->sim;
    pthread_barrier_wait(&s->bar);
    const int prev = (u->r + s->P - 1) % s->P;
    if (s->n[slot][prev] != s->n[slot][u->r]) return 1;
    memcpy(s->recv[slot][u->r], s->send[slot][prev], s->n[slot][u->r] * sizeof(float));
    pthread_barrier_wait(&s->bar);
    return 0;
}

/* parallel.cp_comm=all_gather's collectives over the threads: meet, copy the others' parts,
 * meet again. */
static int sim_allgather(void *ud, float *buf, size_t n) {
    rank_ud *u = ud;
    ring_sim *s = u->sim;
    s->gbuf[u->r] = buf;
    pthread_barrier_wait(&s->bar);
    for (int q = 0; q < s->P; q++)
        if (q != u->r) memcpy(buf + (size_t)q * n, s->gbuf[q] + (size_t)q * n, n * sizeof(float));
    pthread_barrier_wait(&s->bar);
    return 0;
}
static int sim_alltoall(void *ud, const float *send, float *recv, size_t n) {
    rank_ud *u = ud;
    ring_sim *s = u->sim;
    s->a2a[u->r] = send;
    pthread_barrier_wait(&s->bar);
    for (int q = 0; q < s->P; q++) memcpy(recv + (size_t)q * n, s->a2a[q] + (size_t)u->r * n, n * sizeof(float));
    pthread_barrier_wait(&s->bar);
    return 0;
}

typedef struct job {
    rank_ud ud;
    int B, Tl, NH, NKV, hs;
    dt_dtype op;
    float *qkv, *out, *lse, *dout, *dqkv, *scratch;
    int contiguous; /* the ring's chunk layout (parallel.cp_split) */
    int all_gather; /* parallel.cp_comm=all_gather */
    int rc;
} job;

static void *run_rank(void *arg) {
    job *j = arg;
    dt_cp_ring ring = {j->ud.sim->P, j->ud.r, j->contiguous, &j->ud, sim_start, sim_wait,
                       j->all_gather ? sim_allgather : NULL, j->all_gather ? sim_alltoall : NULL, NULL};
    j->rc = dt_cp_attention_forward(&ring, j->scratch, j->out, j->lse, j->qkv, j->B, j->Tl, j->NH, j->NKV, j->hs, j->op);
    j->rc |= dt_cp_attention_backward(&ring, j->scratch, j->dqkv, j->dout, j->qkv, j->out, j->lse, j->B, j->Tl, j->NH,
                                      j->NKV, j->hs, j->op);
    return NULL;
}

/* Global position of local row i of rank r: the balanced layout (mode 0), contiguous rows
 * given to the balanced ring (1: wrong), or the contiguous layout and ring (2:
 * parallel.cp_split=contiguous). */
static int pos_of(int P, int r, int Tl, int i, int mode) {
    return dt_cp_pos(P, r, Tl, i, mode != 0);
}

/* Runs the ring at cp = P for chunk size c; returns 1 when every rank's results match the
 * whole sequence's (printing the comparisons). */
/* The last run's results at their global positions (all_gather against the ring). */
static float *g_last[3];
static size_t g_last_n[3];

static int ring_run(int P, int B, int c, int NH, int NKV, int hs, dt_dtype op, int wrong, int all_gather) {
    const int T = 2 * P * c, Tl = 2 * c, ldq = (NH + 2 * NKV) * hs, ldo = NH * hs;
    float *qkv = tu_malloc((size_t)B * T * ldq * 4), *dout = tu_malloc((size_t)B * T * ldo * 4);
    tu_fill_uniform(qkv, (size_t)B * T * ldq, 1.5f, 91 + (uint64_t)P);
    tu_fill_uniform(dout, (size_t)B * T * ldo, 1.0f, 93 + (uint64_t)c);
    float *out = tu_malloc((size_t)B * T * ldo * 4), *lse = tu_malloc((size_t)B * NH * T * 4);
    float *dqkv = tu_malloc((size_t)B * T * ldq * 4);
    dt_attention_forward(out, lse, qkv, B, T, NH, NKV, hs, 1, op);
    dt_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, 1, op);

    ring_sim sim = {.P = P};
    pthread_barrier_init(&sim.bar, NULL, (unsigned)P);
    job jobs[MAXP];
    pthread_t th[MAXP];
    for (int r = 0; r < P; r++) {
        job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->ud = (rank_ud){&sim, r}, j->B = B, j->Tl = Tl, j->NH = NH, j->NKV = NKV, j->hs = hs, j->op = op;
        j->contiguous = wrong == 2, j->all_gather = all_gather;
        j->qkv = tu_malloc((size_t)B * Tl * ldq * 4), j->dout = tu_malloc((size_t)B * Tl * ldo * 4);
        j->out = tu_malloc((size_t)B * Tl * ldo * 4), j->lse = tu_malloc((size_t)B * NH * Tl * 4);
        j->dqkv = tu_malloc((size_t)B * Tl * ldq * 4);
        j->scratch = tu_malloc(dt_cp_scratch_floats(B, Tl, NH, NKV, hs, P, all_gather) * 4);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                const int t = pos_of(P, r, Tl, i, wrong);
                memcpy(j->qkv + ((size_t)b * Tl + i) * ldq, qkv + ((size_t)b * T + t) * ldq, (size_t)ldq * 4);
                memcpy(j->dout + ((size_t)b * Tl + i) * ldo, dout + ((size_t)b * T + t) * ldo, (size_t)ldo * 4);
            }
    }
    for (int r = 0; r < P; r++) pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    for (int r = 0; r < P; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&sim.bar);

    /* the ranks' rows back at their global positions, against the whole sequence's */
    double *wo = tu_malloc((size_t)B * T * ldo * 8), *wl = tu_malloc((size_t)B * NH * T * 8);
    double *wd = tu_malloc((size_t)B * T * ldq * 8);
    float *go = tu_malloc((size_t)B * T * ldo * 4), *gl = tu_malloc((size_t)B * NH * T * 4);
    float *gd = tu_malloc((size_t)B * T * ldq * 4);
    int rc = 0;
    for (int r = 0; r < P; r++) {
        rc |= jobs[r].rc;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < Tl; i++) {
                const int t = pos_of(P, r, Tl, i, wrong);
                memcpy(go + ((size_t)b * T + t) * ldo, jobs[r].out + ((size_t)b * Tl + i) * ldo, (size_t)ldo * 4);
                memcpy(gd + ((size_t)b * T + t) * ldq, jobs[r].dqkv + ((size_t)b * Tl + i) * ldq, (size_t)ldq * 4);
                for (int h = 0; h < NH; h++)
                    gl[((size_t)b * NH + h) * T + t] = jobs[r].lse[((size_t)b * NH + h) * Tl + i];
            }
    }
    for (size_t i = 0; i < (size_t)B * T * ldo; i++) wo[i] = out[i];
    for (size_t i = 0; i < (size_t)B * NH * T; i++) wl[i] = lse[i];
    for (size_t i = 0; i < (size_t)B * T * ldq; i++) wd[i] = dqkv[i];
    char what[160];
    const double tol = op == DT_F32 ? 1e-5 : 2e-3;
    const char *lay = wrong == 1 ? " (contiguous rows, balanced ring)" : wrong == 2 ? " (contiguous)" : "";
    snprintf(what, sizeof what, "cp %d c %d %s%s out", P, c, dt_dtype_name(op), lay);
    int ok = tu_close(what, go, wo, (size_t)B * T * ldo, tol, tol);
    snprintf(what, sizeof what, "cp %d c %d %s%s lse", P, c, dt_dtype_name(op), lay);
    ok &= tu_close(what, gl, wl, (size_t)B * NH * T, tol, tol);
    snprintf(what, sizeof what, "cp %d c %d %s%s dqkv", P, c, dt_dtype_name(op), lay);
    ok &= tu_close(what, gd, wd, (size_t)B * T * ldq, 2 * tol, 2 * tol);
    for (int r = 0; r < P; r++) {
        free(jobs[r].qkv), free(jobs[r].dout), free(jobs[r].out), free(jobs[r].lse), free(jobs[r].dqkv);
        free(jobs[r].scratch);
    }
    float *keep[3] = {go, gl, gd};
    const size_t kn[3] = {(size_t)B * T * ldo, (size_t)B * NH * T, (size_t)B * T * ldq};
    for (int k = 0; k < 3; k++) free(g_last[k]), g_last[k] = keep[k], g_last_n[k] = kn[k];
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(wo), free(wl), free(wd);
    return ok && rc == 0;
}

static int ring_matches(int P, int B, int c, int NH, int NKV, int hs, dt_dtype op, int wrong) {
    return ring_run(P, B, c, NH, NKV, hs, op, wrong, 0);
}

static void test_ring_equals_whole_attention(void **state) {
    (void)state;
    static const int cases[][6] = {/* P, B, c, NH, NKV, hs */
                                   {1, 2, 24, 4, 2, 16}, {2, 2, 24, 4, 2, 16}, {2, 1, 40, 3, 3, 12},
                                   {3, 2, 17, 4, 1, 8},  {4, 1, 33, 4, 2, 16}, {4, 2, 64, 2, 2, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *k = cases[i];
        assert_true(ring_matches(k[0], k[1], k[2], k[3], k[4], k[5], DT_F32, 0));
    }
    assert_true(ring_matches(2, 2, 24, 4, 2, 16, DT_BF16, 0));
    assert_true(ring_matches(4, 1, 33, 4, 2, 16, DT_BF16, 0));
    /* parallel.cp_split=contiguous: its own pairs (an earlier rank's block whole, a later one never) */
    assert_true(ring_matches(2, 2, 24, 4, 2, 16, DT_F32, 2));
    assert_true(ring_matches(3, 1, 17, 4, 1, 8, DT_F32, 2));
}

/* parallel.cp_comm=all_gather visits the same blocks in the same order and adds the gradient
 * shares in the ring's order: the ring's bits (and the whole attention to tolerance). */
static void test_all_gather_equals_ring(void **state) {
    (void)state;
    static const int cases[][6] = {{2, 2, 24, 4, 2, 16}, {3, 2, 17, 4, 1, 8}, {4, 1, 33, 4, 2, 16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int *k = cases[i];
        for (int contig = 0; contig <= 2; contig += 2) {
            assert_true(ring_run(k[0], k[1], k[2], k[3], k[4], k[5], DT_F32, contig, 0));
            float *ring[3];
            for (int q = 0; q < 3; q++) ring[q] = g_last[q], g_last[q] = NULL;
            assert_true(ring_run(k[0], k[1], k[2], k[3], k[4], k[5], DT_F32, contig, 1));
            for (int q = 0; q < 3; q++) {
                assert_memory_equal(ring[q], g_last[q], g_last_n[q] * sizeof(float));
                free(ring[q]);
            }
        }
    }
    printf("  all_gather: bitwise the ring's out, lse and dqkv (cp 2, 3, 4; balanced and contiguous)\n");
}

static void test_wrong_layout_fails(void **state) {
    (void)state;
    /* the kernel computes the balanced layout's masks: contiguous chunks give other rows */
    assert_false(ring_matches(2, 1, 24, 2, 2, 16, DT_F32, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_equals_whole_attention),
        cmocka_unit_test(test_all_gather_equals_ring),
        cmocka_unit_test(test_wrong_layout_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
