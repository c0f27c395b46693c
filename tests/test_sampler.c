/* data/sampler + data/loader: exactly-once per epoch across ranks, accumulation, restarts
 * with another world size; the permutation is a bijection; the prefetching loader returns
 * bitwise what the sampler computes; the validation walk.
 *
 * The dataset is three llm.c v7 shards whose token t of shard s has the value
 * s * 1000000 + t, so every row read back names the shard and offset it came from: the
 * checks recover sample ids from the bytes the trainer would see, not from the sampler's
 * own bookkeeping. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/loader.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "testutil.h"

#define SEQ 4
#define SHARD_STRIDE 1000000
#define NS 3
/* Shard sizes: 40, 25 and 31 samples of T = 4 (the middle one has 2 spare tokens). */
static const uint32_t g_shard_tokens[NS] = {4 * 40 + 1, 4 * 25 + 3, 4 * 31 + 1};
static const uint64_t g_first[NS + 1] = {0, 40, 65, 96};
#define N 96

static char g_dir[64];
static char g_spec[512], g_spec2[512]; /* all three shards; the first two only */

static void write_shard(const char *path, int s, uint32_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t hdr[DT_LLMC_HEADER_INTS] = {DT_LLMC_MAGIC, 7, (int32_t)n};
    assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
    for (uint32_t t = 0; t < n; t++) {
        uint32_t v = (uint32_t)s * SHARD_STRIDE + t;
        assert_int_equal(fwrite(&v, 4, 1, f), 1);
    }
    fclose(f);
}

static dt_dataset *open_ds(const char *spec) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    if (dt_dataset_open(&ctx, &ds, spec, "auto", NS * SHARD_STRIDE) != DT_OK) fail_msg("%s", ctx.err);
    return ds;
}

static dt_sampler *new_sampler(const dt_dataset *ds, uint64_t seed, int shuffle) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_sampler *s;
    if (dt_sampler_init(&ctx, &s, ds, SEQ, seed, shuffle) != DT_OK) fail_msg("%s", ctx.err);
    return s;
}

/* The sample id of one row, from its tokens: checks the window is T+1 consecutive tokens
 * of one shard, aligned to the stride, and that targets are inputs shifted by one. */
static uint64_t row_id(const int32_t *in, const int32_t *tg) {
    int s = in[0] / SHARD_STRIDE;
    int32_t off = in[0] % SHARD_STRIDE;
    assert_true(s >= 0 && s < NS);
    assert_int_equal(off % SEQ, 0);
    assert_true((uint32_t)off + SEQ < g_shard_tokens[s]); /* inside the shard */
    for (int t = 0; t < SEQ; t++) {
        assert_int_equal(in[t], in[0] + t);
        assert_int_equal(tg[t], in[0] + t + 1);
    }
    return g_first[s] + (uint64_t)off / SEQ;
}

/* Runs `steps` optimizer steps of (W, B, accum) from *cursor, every rank and micro-step,
 * as the trainer would; counts[id] += 1 for positions of epoch 0 (< N), later positions
 * go to counts1 (epoch 1). Also checks that rows match dt_sampler_sample_id. */
static void run_steps(const dt_sampler *s, uint64_t *cursor, int steps, int W, int B, int accum,
                      int *counts, int *counts1) {
    int32_t *in = tu_malloc((size_t)B * SEQ * sizeof *in), *tg = tu_malloc((size_t)B * SEQ * sizeof *tg);
    for (int step = 0; step < steps; step++) {
        for (int r = 0; r < W; r++)
            for (int k = 0; k < accum; k++) {
                dt_sampler_fill(s, *cursor, W, r, B, accum, k, in, tg);
                for (int b = 0; b < B; b++) {
                    uint64_t p = *cursor + (uint64_t)(k * W + r) * (uint64_t)B + (uint64_t)b;
                    assert_int_equal(dt_sampler_position(*cursor, W, r, B, k, b), p);
                    uint64_t id = row_id(in + b * SEQ, tg + b * SEQ);
                    assert_int_equal(id, dt_sampler_sample_id(s, p));
                    if (p < N)
                        counts[id]++;
                    else if (p < 2 * N && counts1)
                        counts1[id]++;
                }
            }
        *cursor += (uint64_t)W * (uint64_t)B * (uint64_t)accum;
    }
    free(in);
    free(tg);
}

static void assert_each_once(const int *counts) {
    for (int i = 0; i < N; i++)
        if (counts[i] != 1) fail_msg("sample %d taken %d times", i, counts[i]);
}

static void test_exactly_once_per_epoch_any_world(void **state) {
    (void)state;
    dt_dataset *ds = open_ds(g_spec);
    dt_sampler *s = new_sampler(ds, 42, 1);
    assert_int_equal(dt_sampler_num_samples(s), N);
    const int cfg[][3] = {{1, 4, 2}, {2, 3, 2}, {3, 4, 2}, {4, 2, 3}, {4, 24, 1}, {1, 1, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int W = cfg[c][0], B = cfg[c][1], A = cfg[c][2];
        int counts[N] = {0};
        uint64_t cursor = 0;
        run_steps(s, &cursor, N / (W * B * A), W, B, A, counts, NULL);
        assert_int_equal(cursor, N);
        assert_each_once(counts);
    }
    /* Epoch not divisible by the global batch (15): the last step rolls into epoch 1. The
     * first N positions cover every id once; the spill-over is the start of another
     * permutation, so its ids are distinct too, and the next epoch's order differs. */
    int counts[N] = {0}, counts1[N] = {0};
    uint64_t cursor = 0;
    run_steps(s, &cursor, 7, 3, 5, 1, counts, counts1);
    assert_int_equal(cursor, 105);
    assert_each_once(counts);
    int spill = 0;
    for (int i = 0; i < N; i++) {
        assert_true(counts1[i] <= 1);
        spill += counts1[i];
    }
    assert_int_equal(spill, 105 - N);
    int same = 0;
    for (uint64_t i = 0; i < N; i++) same += dt_sampler_sample_id(s, i) == dt_sampler_sample_id(s, N + i);
    assert_true(same < N / 4);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

static void test_ranks_disjoint_and_accum_equivalence(void **state) {
    (void)state;
    dt_dataset *ds = open_ds(g_spec);
    dt_sampler *s = new_sampler(ds, 7, 1);
    enum { B = 3 };
    int32_t a_in[B * SEQ], a_tg[B * SEQ], b_in[B * SEQ], b_tg[B * SEQ];
    /* Disjoint across 4 ranks x 2 micro-steps inside one step. */
    int seen[N] = {0};
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 2; k++) {
            dt_sampler_fill(s, 24, 4, r, B, 2, k, a_in, a_tg);
            for (int b = 0; b < B; b++) assert_int_equal(seen[row_id(a_in + b * SEQ, a_tg + b * SEQ)]++, 0);
        }
    /* 1 rank x 2 micro-steps reads exactly the rows of 2 ranks x 1 micro-step. */
    for (uint64_t cursor = 0; cursor < 3 * N; cursor += 2 * B) {
        for (int j = 0; j < 2; j++) {
            dt_sampler_fill(s, cursor, 1, 0, B, 2, j, a_in, a_tg);
            dt_sampler_fill(s, cursor, 2, j, B, 1, 0, b_in, b_tg);
            assert_memory_equal(a_in, b_in, sizeof a_in);
            assert_memory_equal(a_tg, b_tg, sizeof a_tg);
        }
    }
    /* Pure: the same call twice gives the same bits; another seed gives other rows. */
    dt_sampler_fill(s, 10, 2, 1, B, 1, 0, a_in, a_tg);
    dt_sampler_fill(s, 10, 2, 1, B, 1, 0, b_in, b_tg);
    assert_memory_equal(a_in, b_in, sizeof a_in);
    dt_sampler *s2 = new_sampler(ds, 8, 1);
    int differ = 0;
    for (uint64_t p = 0; p < N; p++) differ += dt_sampler_sample_id(s, p) != dt_sampler_sample_id(s2, p);
    assert_true(differ > N / 2);
    dt_sampler_free(s2);
    /* shuffle = 0 walks the dataset in order. */
    dt_sampler *s0 = new_sampler(ds, 7, 0);
    for (uint64_t p = 0; p < 2 * N; p++) assert_int_equal(dt_sampler_sample_id(s0, p), p % N);
    dt_sampler_free(s0);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

static void test_restart_with_other_world_size(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ds(g_spec);
    dt_sampler *s = new_sampler(ds, 1234, 1);
    int counts[N] = {0};
    uint64_t cursor = 0;
    run_steps(s, &cursor, 3, 4, 2, 2, counts, NULL); /* W=4, B=2, accum=2: 48 samples */
    dt_sampler_state saved = dt_sampler_state_get(s, cursor);
    assert_int_equal(saved.cursor, 48);
    assert_int_equal(saved.n_samples, N);
    assert_int_equal(saved.T, SEQ);

    /* "Restart": a fresh sampler configured with another seed adopts the saved one. */
    dt_sampler *r = new_sampler(ds, 999, 1);
    uint64_t resumed = 0;
    assert_int_equal(dt_sampler_state_set(&ctx, r, &saved, &resumed), DT_OK);
    assert_int_equal(resumed, 48);
    for (uint64_t p = 0; p < 2 * N; p++)
        assert_int_equal(dt_sampler_sample_id(r, p), dt_sampler_sample_id(s, p));
    run_steps(r, &resumed, 6, 3, 3, 1, counts, NULL); /* W=3, B=3: 48 + 6*9 = 102 */
    assert_int_equal(resumed, 102);
    assert_each_once(counts);

    /* A state from another dataset or another T is refused, naming both. */
    dt_dataset *ds2 = open_ds(g_spec2);
    dt_sampler *other = new_sampler(ds2, 1234, 1);
    assert_int_equal(dt_sampler_num_samples(other), 65);
    assert_int_equal(dt_sampler_state_set(&ctx, other, &saved, &resumed), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "saved data state does not match dataset"));
    assert_non_null(strstr(ctx.err, "saved 96 samples of T=4"));
    assert_non_null(strstr(ctx.err, "now 65 samples of T=4"));
    dt_sampler_state wrong_t = saved;
    wrong_t.T = 8;
    assert_int_equal(dt_sampler_state_set(&ctx, r, &wrong_t, &resumed), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "saved 96 samples of T=8"));
    assert_non_null(strstr(ctx.err, "now 96 samples of T=4"));
    /* Same sample count, different shard sizes: the layout hash catches it. */
    dt_sampler_state moved = saved;
    moved.layout ^= 1;
    assert_int_equal(dt_sampler_state_set(&ctx, r, &moved, &resumed), DT_ERR_CONFIG);
    dt_sampler_free(other);
    dt_dataset_close(ds2);
    dt_sampler_free(r);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

static void check_bijection(uint64_t n, uint64_t seed, uint64_t epoch) {
    unsigned char *seen = tu_malloc(n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = dt_sampler_perm(n, seed, epoch, i);
        if (v >= n || seen[v]) fail_msg("n=%llu seed=%llu epoch=%llu: %llu -> %llu repeats",
                                        (unsigned long long)n, (unsigned long long)seed,
                                        (unsigned long long)epoch, (unsigned long long)i,
                                        (unsigned long long)v);
        seen[v] = 1;
    }
    free(seen);
}

static void test_permutation_is_a_bijection(void **state) {
    (void)state;
    const uint64_t ns[] = {1, 2, 3, 5, 64, 97, 1000, 4097, 65536, 100003};
    const uint64_t seeds[] = {0, 1, 0xdeadbeefULL};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < 3; b++)
            for (uint64_t e = 0; e < 3; e++) check_bijection(ns[a], seeds[b], e * 5);
    /* Differs between epochs and seeds, and is no identity. */
    uint64_t n = 1000;
    int same_epoch = 0, same_seed = 0, fixed = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = dt_sampler_perm(n, 1, 0, i);
        same_epoch += v == dt_sampler_perm(n, 1, 1, i);
        same_seed += v == dt_sampler_perm(n, 2, 0, i);
        fixed += v == i;
    }
    assert_true(same_epoch < 20 && same_seed < 20 && fixed < 20);
    /* n = 2: both orders occur over seeds. */
    int swapped = 0;
    for (uint64_t seed = 0; seed < 64; seed++) swapped += dt_sampler_perm(2, seed, 0, 0) == 1;
    assert_true(swapped > 8 && swapped < 56);
    /* Billions of samples need no table: values stay in range and are distinct. */
    uint64_t big = 10000000019ULL;
    uint64_t vals[512];
    for (int i = 0; i < 512; i++) {
        vals[i] = dt_sampler_perm(big, 3, 2, big - 1 - (uint64_t)i * 12345);
        assert_true(vals[i] < big);
        for (int j = 0; j < i; j++) assert_true(vals[j] != vals[i]);
    }
}

static void test_loader_matches_sampler_and_seeks(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ds(g_spec);
    dt_sampler *s = new_sampler(ds, 5, 1);
    enum { W = 2, R = 1, B = 3, A = 2, STEP = W * B * A };
    int32_t want_in[B * SEQ], want_tg[B * SEQ], *in, *tg;
    dt_loader *ld;
    assert_int_equal(dt_loader_init(&ctx, &ld, s, W, R, B, A, 12), DT_OK);
    for (uint64_t q = 0; q < 40; q++) {
        uint64_t cursor = 12 + (q / A) * STEP;
        assert_int_equal(dt_loader_cursor(ld), cursor);
        if (q % 7 == 3) usleep(2000); /* let the thread run ahead and wait on full slots */
        assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_OK);
        dt_sampler_fill(s, cursor, W, R, B, A, (int)(q % A), want_in, want_tg);
        assert_memory_equal(in, want_in, sizeof want_in);
        assert_memory_equal(tg, want_tg, sizeof want_tg);
    }
    assert_int_equal(dt_loader_cursor(ld), 12 + 20 * STEP);
    /* Seek (resume) to another step boundary, also back in time. */
    const uint64_t seeks[] = {36, 0, 1000};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dt_loader_seek(&ctx, ld, seeks[i]), DT_OK);
        for (int k = 0; k < 3; k++) {
            assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_OK);
            dt_sampler_fill(s, seeks[i] + (uint64_t)(k / A) * STEP, W, R, B, A, k % A, want_in, want_tg);
            assert_memory_equal(in, want_in, sizeof want_in);
        }
    }
    /* A failure inside the thread comes back as the status, every call, until a seek. */
    dt_loader_inject_fault(ld, 2);
    assert_int_equal(dt_loader_seek(&ctx, ld, 0), DT_OK);
    assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_OK);
    assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_ERR_IO);
        assert_null(in);
        assert_non_null(strstr(ctx.err, "injected fault at micro-batch 2"));
    }
    dt_loader_inject_fault(ld, UINT64_MAX);
    assert_int_equal(dt_loader_seek(&ctx, ld, 0), DT_OK);
    for (int i = 0; i < 4; i++) assert_int_equal(dt_loader_next(&ctx, ld, &in, &tg), DT_OK);
    dt_loader_free(ld); /* joins a thread that is waiting on full slots */

    assert_int_equal(dt_loader_init(&ctx, &ld, s, 2, 2, B, A, 0), DT_ERR_CONFIG);
    assert_null(ld);
    assert_non_null(strstr(ctx.err, "rank 2 outside [0, 2)"));
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

/* One loader per rank, in one process: over an epoch every sample comes out once. */
static void test_loaders_of_all_ranks_cover_epoch_once(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ds(g_spec);
    dt_sampler *s = new_sampler(ds, 77, 1);
    enum { W = 3, B = 4, A = 2 };
    dt_loader *ld[W];
    for (int r = 0; r < W; r++) assert_int_equal(dt_loader_init(&ctx, &ld[r], s, W, r, B, A, 0), DT_OK);
    int counts[N] = {0};
    for (int step = 0; step < N / (W * B * A); step++)
        for (int k = 0; k < A; k++)
            for (int r = 0; r < W; r++) {
                int32_t *in, *tg;
                assert_int_equal(dt_loader_next(&ctx, ld[r], &in, &tg), DT_OK);
                for (int b = 0; b < B; b++) counts[row_id(in + b * SEQ, tg + b * SEQ)]++;
            }
    assert_each_once(counts);
    for (int r = 0; r < W; r++) {
        assert_int_equal(dt_loader_cursor(ld[r]), N);
        dt_loader_free(ld[r]);
    }
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

static void test_validation_walk(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ds(g_spec);
    dt_val_loader *vl;
    int32_t *in, *tg;
    assert_int_equal(dt_val_loader_init(&ctx, &vl, ds, SEQ, 2, 1, 5, 3), DT_OK);
    assert_int_equal(dt_val_loader_num_batches(vl), 3);
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < 3; i++) {
            assert_int_equal(dt_val_loader_next(vl, &in, &tg), 1);
            for (int b = 0; b < 5; b++) /* rank 1 of 2: rows 5..9 of global batch i */
                assert_int_equal(row_id(in + b * SEQ, tg + b * SEQ), i * 10 + 5 + (uint64_t)b);
        }
        assert_int_equal(dt_val_loader_next(vl, &in, &tg), 0);
        dt_val_loader_reset(vl);
    }
    dt_val_loader_free(vl);
    assert_int_equal(dt_val_loader_init(&ctx, &vl, ds, SEQ, 2, 0, 5, 0), DT_OK);
    assert_int_equal(dt_val_loader_num_batches(vl), 9); /* all complete batches of 10 */
    dt_val_loader_free(vl);
    assert_int_equal(dt_val_loader_init(&ctx, &vl, ds, SEQ, 4, 0, 30, 0), DT_ERR_CONFIG);
    assert_null(vl);
    assert_non_null(strstr(ctx.err, "has 96 samples of T=4, fewer than one batch"));
    dt_dataset_close(ds);
}

static int setup(void **state) {
    (void)state;
    if (tu_mkdtemp(g_dir, sizeof g_dir, "test_sampler")) return -1;
    for (int s = 0; s < NS; s++) {
        char path[256];
        snprintf(path, sizeof path, "%s/train_%02d.bin", g_dir, s);
        write_shard(path, s, g_shard_tokens[s]);
    }
    snprintf(g_spec, sizeof g_spec, "%s/train_*.bin", g_dir);
    snprintf(g_spec2, sizeof g_spec2, "%s/train_00.bin,%s/train_01.bin", g_dir, g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exactly_once_per_epoch_any_world),
        cmocka_unit_test(test_ranks_disjoint_and_accum_equivalence),
        cmocka_unit_test(test_restart_with_other_world_size),
        cmocka_unit_test(test_permutation_is_a_bijection),
        cmocka_unit_test(test_loader_matches_sampler_and_seeks),
        cmocka_unit_test(test_loaders_of_all_ranks_cover_epoch_once),
        cmocka_unit_test(test_validation_walk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
