/* data/shard + data/sampler + data/loader on IDX image files (data.format idx): plain and
 * gzip files read back exactly, the record layout (pixels, then the label), the sampler's
 * exactly-once over records for 1..4 ranks, resume with another world size, the record
 * fingerprint, the validation walk, the prefetching loader, the real Fashion-MNIST files
 * (when installed), and every damaged file refused with one line naming it - plus byte
 * flips and truncations at every offset of a small file, which must never crash.
 *
 * Synthetic images encode where they come from: pixel 0 = shard, pixels 1-2 = record index
 * (little-endian), pixel j >= 3 = (record * 7 + j) % 256; label = (record + shard) % 10. So
 * the checks recover sample ids from the bytes the trainer sees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/loader.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "testutil.h"

#define H 2
#define W 3
#define HW (H * W)
#define NS 3
static const uint32_t g_recs[NS] = {40, 25, 31};
static const uint64_t g_first[NS + 1] = {0, 40, 65, 96};
#define N 96

#define FM_DIR "/usr/share/datasets/fashion-mnist"

static char g_dir[64];
static char g_spec[512]; /* the three synthetic shards, plain, gz, plain */

static const char *tmp_path(const char *name) {
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Writes `n` bytes to dir/name, gzip-compressed if gz. */
static void write_bytes(const char *name, const unsigned char *p, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(tmp_path(name), "wb");
        assert_non_null(f);
        if (n) assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(tmp_path(name), "wb");
        assert_non_null(f);
        if (n) assert_int_equal(fwrite(p, 1, n, f), n);
        fclose(f);
    }
}

static unsigned char pixel(int shard, uint32_t r, int j) {
    if (j == 0) return (unsigned char)shard;
    if (j == 1) return (unsigned char)(r & 0xff);
    if (j == 2) return (unsigned char)(r >> 8);
    return (unsigned char)((r * 7 + (uint32_t)j) % 256);
}

static int label_of(int shard, uint32_t r) { return (int)((r + (uint32_t)shard) % 10); }

/* An IDX images file (magic, n, h, w as given; n_write images actually written) and,
 * unless labels_n < 0, its labels file (labels_n labels in the header and written). */
static void write_idx(const char *images_name, int shard, uint32_t magic, uint32_t n, uint32_t h,
                      uint32_t w, uint32_t n_write, int labels_n, int gz) {
    size_t px = (size_t)n_write * h * w, bytes = 16 + px;
    unsigned char *b = tu_malloc(bytes);
    put_be32(b, magic);
    put_be32(b + 4, n);
    put_be32(b + 8, h);
    put_be32(b + 12, w);
    for (uint32_t r = 0; r < n_write; r++)
        for (uint32_t j = 0; j < h * w; j++) b[16 + (size_t)r * h * w + j] = pixel(shard, r, (int)j);
    write_bytes(images_name, b, bytes, gz);
    free(b);
    if (labels_n < 0) return;
    char lname[256];
    snprintf(lname, sizeof lname, "%s", images_name);
    char *at = strstr(lname, "images-idx3");
    assert_non_null(at);
    memcpy(at, "labels-idx1", 11);
    unsigned char *l = tu_malloc(8 + (size_t)labels_n);
    put_be32(l, 0x00000801);
    put_be32(l + 4, (uint32_t)labels_n);
    for (int r = 0; r < labels_n; r++) l[8 + r] = (unsigned char)label_of(shard, (uint32_t)r);
    write_bytes(lname, l, 8 + (size_t)labels_n, gz);
    free(l);
}

static void write_good(const char *images_name, int shard, uint32_t n, int gz) {
    write_idx(images_name, shard, 0x00000803, n, H, W, n, (int)n, gz);
}

static dt_dataset *open_ok(const char *spec, const char *format, int vocab) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    if (dt_dataset_open(&ctx, &ds, spec, format, vocab) != DT_OK) fail_msg("%s", ctx.err);
    return ds;
}

/* The message is one line, starts with `first` and holds both substrings. */
static void expect_msg(const dt_ctx *ctx, const char *first, const char *why1, const char *why2) {
    if (strncmp(ctx->err, first, strlen(first)) != 0 || strchr(ctx->err, '\n') ||
        !strstr(ctx->err, why1) || (why2 && !strstr(ctx->err, why2)))
        fail_msg("message '%s' (wanted '%s' ... '%s' ... '%s')", ctx->err, first, why1,
                 why2 ? why2 : "");
}

static void expect_fail(const char *images_name, const char *format, int vocab, dt_status code,
                        const char *why1, const char *why2) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = (dt_dataset *)&ctx; /* must be reset to NULL */
    const char *path = tmp_path(images_name);
    dt_status st = dt_dataset_open(&ctx, &ds, path, format, vocab);
    if (st != code) fail_msg("%s: got status %d message '%s'", images_name, (int)st, ctx.err);
    expect_msg(&ctx, path, why1, why2);
    assert_null(ds);
}

/* ---- reading ---- */

static void check_shard_contents(const dt_dataset *ds, int s, int shard_tag, uint32_t n) {
    assert_int_equal(dt_dataset_shard_records(ds, s), n);
    assert_int_equal(dt_dataset_shard_tokens(ds, s), (uint64_t)n * (HW + 1));
    assert_int_equal(dt_dataset_shard_width(ds, s), 1);
    size_t total = (size_t)n * (HW + 1);
    int32_t *all = tu_malloc(total * sizeof *all);
    dt_dataset_read(ds, s, 0, total, all);
    for (uint32_t r = 0; r < n; r++) {
        for (int j = 0; j < HW; j++) assert_int_equal(all[r * (HW + 1) + (uint32_t)j], pixel(shard_tag, r, j));
        assert_int_equal(all[r * (HW + 1) + HW], label_of(shard_tag, r));
        assert_int_equal(dt_dataset_label(ds, s, r), label_of(shard_tag, r));
    }
    /* Ranges that start mid-record and cross records read the same as the whole. */
    for (size_t start = 0; start < 3 * (HW + 1); start++)
        for (size_t len = 0; len <= 2 * (HW + 1) + 1 && start + len <= total; len++) {
            int32_t part[2 * (HW + 1) + 1];
            dt_dataset_read(ds, s, start, len, part);
            for (size_t i = 0; i < len; i++) assert_int_equal(part[i], all[start + i]);
        }
    assert_int_equal(dt_dataset_token(ds, s, total - 1), label_of(shard_tag, n - 1));
    free(all);
}

/* tokens.bin: raw uint16 tokens 0, 776, ... - bytes 00 00 08 03, the IDX images magic. */
static void write_raw_like_idx(void) {
    const uint16_t raw[8] = {0, 776, 0, 5, 0, 1, 0, 1};
    write_bytes("tokens.bin", (const unsigned char *)raw, sizeof raw, 0);
}

static void test_read_plain_and_gz(void **state) {
    (void)state;
    write_good("a-images-idx3-ubyte", 0, 5, 0);
    write_good("b-images-idx3-ubyte.gz", 1, 7, 1);
    for (int gz = 0; gz < 2; gz++) {
        const char *name = gz ? "b-images-idx3-ubyte.gz" : "a-images-idx3-ubyte";
        for (int f = 0; f < 2; f++) { /* the name is enough for auto */
            dt_dataset *ds = open_ok(tmp_path(name), f ? "auto" : "idx", 256);
            int h = -1, w = -1;
            assert_int_equal(dt_dataset_image_hw(ds, &h, &w), 1);
            assert_int_equal(h, H);
            assert_int_equal(w, W);
            assert_int_equal(dt_dataset_record_len(ds), HW + 1);
            assert_int_equal(dt_dataset_num_records(ds), gz ? 7 : 5);
            assert_int_equal(dt_dataset_num_tokens(ds), (gz ? 7 : 5) * (HW + 1));
            char want_labels[256];
            snprintf(want_labels, sizeof want_labels, "%s", tmp_path(gz ? "b-labels-idx1-ubyte.gz" : "a-labels-idx1-ubyte"));
            assert_string_equal(dt_dataset_shard_labels_path(ds, 0), want_labels);
            check_shard_contents(ds, 0, gz, gz ? 7 : 5);
            dt_dataset_close(ds);
        }
    }
    /* Both in one list: order kept, records summed. */
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("b-images-idx3-ubyte.gz"), tmp_path("a-images-idx3-ubyte"));
    dt_dataset *ds = open_ok(spec, "idx", 256);
    assert_int_equal(dt_dataset_num_shards(ds), 2);
    assert_int_equal(dt_dataset_num_records(ds), 12);
    check_shard_contents(ds, 0, 1, 7);
    check_shard_contents(ds, 1, 0, 5);
    dt_dataset_close(ds);

    /* auto by content: the IDX magic (plain), or the gunzipped magic, in other names. */
    write_good("c-images-idx3.dat", 2, 3, 0);
    write_good("d-images-idx3.z", 2, 3, 1);
    ds = open_ok(tmp_path("c-images-idx3.dat"), "auto", 256);
    assert_int_equal(dt_dataset_record_len(ds), HW + 1);
    check_shard_contents(ds, 0, 2, 3);
    dt_dataset_close(ds);
    ds = open_ok(tmp_path("d-images-idx3.z"), NULL, 256);
    check_shard_contents(ds, 0, 2, 3);
    dt_dataset_close(ds);
    /* A vocab below 256 is fine while every pixel and label is below it. */
    ds = open_ok(tmp_path("c-images-idx3.dat"), "idx", 20); /* largest token: pixel 19 */
    dt_dataset_close(ds);

    /* A raw uint16 .bin whose first tokens are 0, 776 (= the IDX magic's bytes) stays raw:
     * its size is not the one that "header" gives. */
    write_raw_like_idx();
    ds = open_ok(tmp_path("tokens.bin"), "auto", 1000);
    assert_int_equal(dt_dataset_record_len(ds), 0);
    assert_int_equal(dt_dataset_shard_is_raw(ds, 0), 1);
    assert_int_equal(dt_dataset_token(ds, 0, 1), 776);
    int h = -1, w = -1;
    assert_int_equal(dt_dataset_image_hw(ds, &h, &w), 0);
    assert_int_equal(h, 0);
    assert_int_equal(dt_dataset_num_records(ds), 0);
    assert_null(dt_dataset_shard_labels_path(ds, 0));
    dt_dataset_close(ds);
}

/* ---- sampler over records ---- */

static dt_sampler *new_sampler(const dt_dataset *ds, int T, uint64_t seed, int shuffle) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_sampler *s;
    if (dt_sampler_init(&ctx, &s, ds, T, seed, shuffle) != DT_OK) fail_msg("%s", ctx.err);
    return s;
}

/* The sample id of one row, from its bytes: a whole record of one shard, targets its label
 * in every slot. */
static uint64_t row_id(const int32_t *in, const int32_t *tg) {
    int s = in[0];
    assert_true(s >= 0 && s < NS);
    uint32_t r = (uint32_t)in[1] | (uint32_t)in[2] << 8;
    assert_true(r < g_recs[s]);
    for (int j = 0; j < HW; j++) assert_int_equal(in[j], pixel(s, r, j));
    for (int t = 0; t < HW; t++) assert_int_equal(tg[t], label_of(s, r));
    return g_first[s] + r;
}

static void run_steps(const dt_sampler *s, uint64_t *cursor, int steps, int Wd, int B, int A,
                      int *counts) {
    int32_t *in = tu_malloc((size_t)B * HW * sizeof *in), *tg = tu_malloc((size_t)B * HW * sizeof *tg);
    for (int step = 0; step < steps; step++) {
        for (int r = 0; r < Wd; r++)
            for (int k = 0; k < A; k++) {
                dt_sampler_fill(s, *cursor, Wd, r, B, A, k, in, tg);
                for (int b = 0; b < B; b++) {
                    uint64_t p = dt_sampler_position(*cursor, Wd, r, B, k, b);
                    uint64_t id = row_id(in + b * HW, tg + b * HW);
                    assert_int_equal(id, dt_sampler_sample_id(s, p));
                    int shard;
                    uint64_t start;
                    dt_sampler_locate(s, id, &shard, &start);
                    assert_int_equal(start, (id - g_first[shard]) * (HW + 1));
                    if (p < N) counts[id]++;
                }
            }
        *cursor += (uint64_t)Wd * (uint64_t)B * (uint64_t)A;
    }
    free(in);
    free(tg);
}

static void assert_each_once(const int *counts) {
    for (int i = 0; i < N; i++)
        if (counts[i] != 1) fail_msg("record %d taken %d times", i, counts[i]);
}

static void test_sampler_records_exactly_once(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ok(g_spec, "idx", 256);
    assert_int_equal(dt_dataset_num_records(ds), N);
    /* T must be H*W, named as the config key with the image size. */
    const int bad_t[] = {HW - 1, HW + 1, 0};
    for (int i = 0; i < 3; i++) {
        dt_sampler *s = (dt_sampler *)&ctx;
        assert_int_equal(dt_sampler_init(&ctx, &s, ds, bad_t[i], 1, 1), DT_ERR_CONFIG);
        assert_null(s);
        expect_msg(&ctx, "'", "holds 2x3 images: training.seq_len must be 6", NULL);
        assert_int_equal(dt_dataset_check_seq_len(&ctx, ds, bad_t[i]), DT_ERR_CONFIG);
    }
    assert_int_equal(dt_dataset_check_seq_len(&ctx, ds, HW), DT_OK);
    dt_sampler *s = new_sampler(ds, HW, 42, 1);
    assert_int_equal(dt_sampler_num_samples(s), N);
    assert_int_equal(dt_sampler_seq_len(s), HW);
    /* 1..4 ranks, with and without accumulation; the last config spills into epoch 1. */
    const int cfg[][4] = {{1, 4, 2, 12}, {2, 3, 2, 8}, {3, 4, 2, 4}, {4, 2, 3, 4}, {4, 24, 1, 1},
                          {1, 1, 1, 96}, {3, 5, 1, 7}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int counts[N] = {0};
        uint64_t cursor = 0;
        run_steps(s, &cursor, cfg[c][3], cfg[c][0], cfg[c][1], cfg[c][2], counts);
        assert_true(cursor >= N);
        assert_each_once(counts);
    }
    /* Shuffled: not the file order; unshuffled: exactly it. */
    int in_order = 0;
    for (uint64_t p = 0; p < N; p++) in_order += dt_sampler_sample_id(s, p) == p;
    assert_true(in_order < N / 4);
    dt_sampler *s0 = new_sampler(ds, HW, 42, 0);
    for (uint64_t p = 0; p < 2 * N; p++) assert_int_equal(dt_sampler_sample_id(s0, p), p % N);
    dt_sampler_free(s0);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

/* An llm.c v1 shard of n tokens t % 200. */
static void write_llmc16(const char *name, uint32_t n) {
    FILE *f = fopen(tmp_path(name), "wb");
    assert_non_null(f);
    int32_t hdr[DT_LLMC_HEADER_INTS] = {DT_LLMC_MAGIC, 1, (int32_t)n};
    assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
    for (uint32_t t = 0; t < n; t++) {
        uint16_t v = (uint16_t)(t % 200);
        assert_int_equal(fwrite(&v, 2, 1, f), 1);
    }
    fclose(f);
}

static void test_resume_other_world_and_fingerprint(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ok(g_spec, "idx", 256);
    dt_sampler *s = new_sampler(ds, HW, 1234, 1);
    int counts[N] = {0};
    uint64_t cursor = 0;
    run_steps(s, &cursor, 3, 4, 2, 2, counts); /* 4 ranks: 48 records */
    dt_sampler_state saved = dt_sampler_state_get(s, cursor);
    assert_int_equal(saved.cursor, 48);
    assert_int_equal(saved.n_samples, N);
    assert_int_equal(saved.T, HW);
    dt_sampler *r = new_sampler(ds, HW, 999, 1);
    uint64_t resumed = 0;
    assert_int_equal(dt_sampler_state_set(&ctx, r, &saved, &resumed), DT_OK);
    run_steps(r, &resumed, 6, 3, 3, 1, counts); /* 3 ranks: 48 + 54 */
    assert_int_equal(resumed, 102);
    assert_each_once(counts);
    dt_sampler_free(r);
    dt_sampler_free(s);
    dt_dataset_close(ds);

    /* Tokens with the same shard token counts, T and sample count: only the fingerprint's
     * record length tells them apart. 2 and 5 records of 7 tokens; llm.c shards of 14 and
     * 35 tokens give (14-1)/6 = 2 and (35-1)/6 = 5 windows of T = 6. */
    write_good("fp0-images-idx3-ubyte", 0, 2, 0);
    write_good("fp1-images-idx3-ubyte", 1, 5, 0);
    write_llmc16("fp0.bin", 14);
    write_llmc16("fp1.bin", 35);
    char spec_img[600], spec_tok[600];
    snprintf(spec_img, sizeof spec_img, "%s,%s", tmp_path("fp0-images-idx3-ubyte"), tmp_path("fp1-images-idx3-ubyte"));
    snprintf(spec_tok, sizeof spec_tok, "%s,%s", tmp_path("fp0.bin"), tmp_path("fp1.bin"));
    dt_dataset *di = open_ok(spec_img, "auto", 256), *dtok = open_ok(spec_tok, "auto", 256);
    assert_int_equal(dt_dataset_shard_tokens(di, 0), dt_dataset_shard_tokens(dtok, 0));
    assert_int_equal(dt_dataset_shard_tokens(di, 1), dt_dataset_shard_tokens(dtok, 1));
    dt_sampler *si = new_sampler(di, HW, 5, 1), *st = new_sampler(dtok, HW, 5, 1);
    assert_int_equal(dt_sampler_num_samples(si), 7);
    assert_int_equal(dt_sampler_num_samples(st), 7);
    dt_sampler_state a = dt_sampler_state_get(si, 3), b = dt_sampler_state_get(st, 3);
    assert_true(a.layout != b.layout);
    assert_int_equal(dt_sampler_state_set(&ctx, st, &a, &resumed), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "saved data state does not match dataset"));
    assert_int_equal(dt_sampler_state_set(&ctx, si, &b, &resumed), DT_ERR_CONFIG);
    assert_int_equal(dt_sampler_state_set(&ctx, si, &a, &resumed), DT_OK);
    dt_sampler_free(si);
    dt_sampler_free(st);
    dt_dataset_close(di);
    dt_dataset_close(dtok);
}

static void test_loaders_on_records(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ok(g_spec, "idx", 256);
    /* Validation: global batch i = records [10i, 10i+10) in file order, rank 1 rows 5..9. */
    dt_val_loader *vl;
    int32_t *in, *tg;
    assert_int_equal(dt_val_loader_init(&ctx, &vl, ds, HW, 2, 1, 5, 0), DT_OK);
    assert_int_equal(dt_val_loader_num_batches(vl), 9);
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < 9; i++) {
            assert_int_equal(dt_val_loader_next(vl, &in, &tg), 1);
            for (int b = 0; b < 5; b++)
                assert_int_equal(row_id(in + b * HW, tg + b * HW), i * 10 + 5 + (uint64_t)b);
        }
        assert_int_equal(dt_val_loader_next(vl, &in, &tg), 0);
        dt_val_loader_reset(vl);
    }
    dt_val_loader_free(vl);
    assert_int_equal(dt_val_loader_init(&ctx, &vl, ds, 784, 1, 0, 4, 0), DT_ERR_CONFIG);
    assert_null(vl);
    expect_msg(&ctx, "'", "training.seq_len must be 6", "got 784");

    /* The prefetching loader, 3 ranks: bitwise the sampler's rows, every record once. */
    dt_sampler *s = new_sampler(ds, HW, 77, 1);
    enum { WD = 3, B = 4, A = 2 };
    dt_loader *ld[WD];
    for (int r = 0; r < WD; r++) assert_int_equal(dt_loader_init(&ctx, &ld[r], s, WD, r, B, A, 0), DT_OK);
    int counts[N] = {0};
    int32_t want_in[B * HW], want_tg[B * HW];
    for (int step = 0; step < N / (WD * B * A); step++)
        for (int k = 0; k < A; k++)
            for (int r = 0; r < WD; r++) {
                assert_int_equal(dt_loader_next(&ctx, ld[r], &in, &tg), DT_OK);
                dt_sampler_fill(s, (uint64_t)step * WD * B * A, WD, r, B, A, k, want_in, want_tg);
                assert_memory_equal(in, want_in, sizeof want_in);
                assert_memory_equal(tg, want_tg, sizeof want_tg);
                for (int b = 0; b < B; b++) counts[row_id(in + b * HW, tg + b * HW)]++;
            }
    assert_each_once(counts);
    for (int r = 0; r < WD; r++) dt_loader_free(ld[r]);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

/* ---- the real data ---- */

static void test_fashion_mnist(void **state) {
    (void)state;
    const char *train = FM_DIR "/train-images-idx3-ubyte.gz", *test = FM_DIR "/t10k-images-idx3-ubyte.gz";
    if (access(train, R_OK) != 0 || access(test, R_OK) != 0) {
        tu_skip("%s not installed (Debian package dataset-fashion-mnist)", FM_DIR);
        return;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = open_ok(train, "auto", 256);
    int h, w;
    assert_int_equal(dt_dataset_image_hw(ds, &h, &w), 1);
    assert_int_equal(h, 28);
    assert_int_equal(w, 28);
    assert_int_equal(dt_dataset_record_len(ds), 785);
    assert_int_equal(dt_dataset_num_records(ds), 60000);
    assert_int_equal(dt_dataset_num_tokens(ds), 60000ULL * 785);
    assert_string_equal(dt_dataset_shard_labels_path(ds, 0), FM_DIR "/train-labels-idx1-ubyte.gz");
    /* Facts computed independently (Python's gzip module): 6000 images of each class,
     * labels start 9 0 0 3 0 2 7, image 0's pixels sum to 76247 (433 non-zero, pixel
     * (14,14) = 217), all pixels to 3431114169, the last image (label 5) to 16684. */
    int hist[10] = {0};
    for (uint64_t r = 0; r < 60000; r++) {
        int l = dt_dataset_label(ds, 0, r);
        assert_true(l >= 0 && l < 10);
        hist[l]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(hist[c], 6000);
    const int first[7] = {9, 0, 0, 3, 0, 2, 7};
    for (int i = 0; i < 7; i++) assert_int_equal(dt_dataset_label(ds, 0, (uint64_t)i), first[i]);
    int32_t *rec = tu_malloc(785 * sizeof *rec);
    uint64_t total = 0;
    for (uint64_t r = 0; r < 60000; r++) {
        dt_dataset_read(ds, 0, r * 785, 785, rec);
        uint64_t sum = 0;
        int nz = 0;
        for (int j = 0; j < 784; j++) {
            assert_true(rec[j] >= 0 && rec[j] < 256);
            sum += (uint64_t)rec[j];
            nz += rec[j] != 0;
        }
        assert_int_equal(rec[784], dt_dataset_label(ds, 0, r));
        if (r == 0) {
            assert_int_equal(sum, 76247);
            assert_int_equal(nz, 433);
            assert_int_equal(rec[14 * 28 + 14], 217);
        }
        if (r == 59999) {
            assert_int_equal(sum, 16684);
            assert_int_equal(rec[784], 5);
        }
        total += sum;
    }
    assert_int_equal(total, 3431114169ULL);
    free(rec);
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 10), DT_OK);
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 9), DT_ERR_FORMAT); /* image 0 is a 9 */
    expect_msg(&ctx, train, "label 9 at index 0 is >= n_classes 9", "train-labels-idx1-ubyte.gz");
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 8), DT_ERR_FORMAT);
    expect_msg(&ctx, train, "label 9 at index 0 is >= n_classes 8", NULL);
    /* The sampler: 60000 samples of T = 784, a batch holds whole images and their labels. */
    dt_sampler *s = new_sampler(ds, 784, 3, 1);
    assert_int_equal(dt_sampler_num_samples(s), 60000);
    int32_t *in = tu_malloc(2 * 784 * sizeof *in), *tg = tu_malloc(2 * 784 * sizeof *tg);
    dt_sampler_fill(s, 0, 1, 0, 2, 1, 0, in, tg);
    for (int b = 0; b < 2; b++) {
        uint64_t id = dt_sampler_sample_id(s, (uint64_t)b);
        for (int t = 0; t < 784; t++) assert_int_equal(tg[b * 784 + t], dt_dataset_label(ds, 0, id));
        assert_int_equal(in[b * 784 + 14 * 28 + 14], dt_dataset_token(ds, 0, id * 785 + 14 * 28 + 14));
    }
    free(in);
    free(tg);
    dt_sampler_free(s);
    dt_dataset_close(ds);

    /* train + test as two shards: 70000 records, sample 60000 is the first test image. */
    ds = open_ok(FM_DIR "/train-images-idx3-ubyte.gz," FM_DIR "/t10k-images-idx3-ubyte.gz", "idx", 256);
    assert_int_equal(dt_dataset_num_records(ds), 70000);
    s = new_sampler(ds, 784, 3, 0);
    int shard;
    uint64_t start;
    dt_sampler_locate(s, 60000, &shard, &start);
    assert_int_equal(shard, 1);
    assert_int_equal(start, 0);
    dt_sampler_locate(s, 59999, &shard, &start);
    assert_int_equal(shard, 0);
    assert_int_equal(start, 59999ULL * 785);
    int hist_t[10] = {0};
    for (uint64_t r = 0; r < 10000; r++) hist_t[dt_dataset_label(ds, 1, r)]++;
    for (int c = 0; c < 10; c++) assert_int_equal(hist_t[c], 1000);
    dt_sampler_free(s);
    dt_dataset_close(ds);
}

/* ---- damaged files ---- */

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(tmp_path(from), "rb"), *b = fopen(tmp_path(to), "wb");
    assert_non_null(a);
    assert_non_null(b);
    int c;
    while ((c = fgetc(a)) != EOF) fputc(c, b);
    fclose(a);
    fclose(b);
}

static long file_size(const char *name) {
    struct stat sb;
    assert_int_equal(stat(tmp_path(name), &sb), 0);
    return (long)sb.st_size;
}

static void test_damaged_files_refused(void **state) {
    (void)state;
    /* Wrong magic: images, labels. */
    write_idx("m1-images-idx3-ubyte", 0, 0x00000801, 4, H, W, 4, 4, 0);
    expect_fail("m1-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "bad magic 0x00000801",
                "expected 0x00000803: IDX uint8 images");
    write_idx("m2-images-idx3-ubyte.gz", 0, 0x00000d03, 4, H, W, 4, 4, 1); /* float data */
    expect_fail("m2-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "bad magic 0x00000d03", NULL);
    write_good("m3-images-idx3-ubyte", 0, 4, 0);
    unsigned char bad_lab[12] = {0, 0, 8, 3, 0, 0, 0, 4, 1, 2, 3, 4};
    write_bytes("m3-labels-idx1-ubyte", bad_lab, sizeof bad_lab, 0);
    expect_fail("m3-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "labels file", "bad magic 0x00000803 (expected 0x00000801");

    /* Truncated: plain (short data, short header), gz (cut stream), gz with short data. */
    write_idx("t1-images-idx3-ubyte", 0, 0x00000803, 5, H, W, 4, 5, 0);
    expect_fail("t1-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT,
                "size mismatch: the IDX header says 5 images (46 bytes with the header) but the file has 40 bytes",
                "(truncated)");
    write_bytes("t2-images-idx3-ubyte", (const unsigned char[]){0, 0, 8, 3, 0, 0, 0, 5, 0, 0}, 10, 0);
    expect_fail("t2-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "truncated: 10 bytes, shorter than the 16-byte IDX header", NULL);
    write_good("t3-images-idx3-ubyte.gz", 0, 40, 1);
    long gzn = file_size("t3-images-idx3-ubyte.gz");
    assert_int_equal(truncate(tmp_path("t3-images-idx3-ubyte.gz"), gzn - 12), 0); /* into the data */
    expect_fail("t3-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "gzip data damaged or truncated",
                "(zlib: unexpected end of file)");
    write_good("t4-images-idx3-ubyte.gz", 0, 40, 1);
    assert_int_equal(truncate(tmp_path("t4-images-idx3-ubyte.gz"), file_size("t4-images-idx3-ubyte.gz") - 4), 0); /* the length trailer */
    expect_fail("t4-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "gzip data damaged or truncated", NULL);
    write_idx("t5-images-idx3-ubyte.gz", 0, 0x00000803, 5, H, W, 4, 5, 1); /* a whole gzip of too little */
    expect_fail("t5-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT,
                "the IDX header says 46 bytes but the file decompresses to 40 (truncated)", NULL);
    write_idx("t6-images-idx3-ubyte.gz", 0, 0x00000803, 3, H, W, 4, 3, 1);
    expect_fail("t6-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT,
                "the IDX header says 34 bytes but the file decompresses to more (extra bytes)", NULL);
    write_idx("t7-images-idx3-ubyte", 0, 0x00000803, 3, H, W, 4, 3, 0);
    expect_fail("t7-images-idx3-ubyte", "auto", 256, DT_ERR_FORMAT, "(extra bytes)", NULL);
    /* A damaged gzip body: CRC or data error, never a crash. */
    write_good("t8-images-idx3-ubyte.gz", 0, 40, 1);
    FILE *f = fopen(tmp_path("t8-images-idx3-ubyte.gz"), "r+b");
    fseek(f, file_size("t8-images-idx3-ubyte.gz") - 8, SEEK_SET); /* the CRC */
    fputc(0x5a, f);
    fclose(f);
    expect_fail("t8-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "gzip data damaged or truncated",
                "(zlib: incorrect data check)");

    /* The same on a file larger than zlib's buffers (2.3 MB inflated). */
    write_idx("t9-images-idx3-ubyte.gz", 0, 0x00000803, 3000, 28, 28, 3000, 3000, 1);
    copy_file("t9-images-idx3-ubyte.gz", "t10-images-idx3-ubyte.gz");
    copy_file("t9-labels-idx1-ubyte.gz", "t10-labels-idx1-ubyte.gz");
    f = fopen(tmp_path("t9-images-idx3-ubyte.gz"), "r+b");
    fseek(f, file_size("t9-images-idx3-ubyte.gz") - 8, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    expect_fail("t9-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "gzip data damaged or truncated after",
                "(zlib: incorrect data check)");
    assert_int_equal(truncate(tmp_path("t10-images-idx3-ubyte.gz"), file_size("t10-images-idx3-ubyte.gz") - 3), 0);
    expect_fail("t10-images-idx3-ubyte.gz", "auto", 256, DT_ERR_FORMAT, "gzip data damaged or truncated",
                "(zlib: unexpected end of file)");

    /* Count mismatch either way, missing labels file, no labels name. */
    write_idx("c1-images-idx3-ubyte", 0, 0x00000803, 6, H, W, 6, 5, 0);
    expect_fail("c1-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "6 images but its labels file", "c1-labels-idx1-ubyte has 5 labels");
    write_idx("c4-images-idx3-ubyte.gz", 0, 0x00000803, 6, H, W, 6, 7, 1);
    expect_fail("c4-images-idx3-ubyte.gz", "idx", 256, DT_ERR_FORMAT, "6 images but its labels file", "has 7 labels");
    write_idx("c2-images-idx3-ubyte", 0, 0x00000803, 6, H, W, 6, -1, 0);
    expect_fail("c2-images-idx3-ubyte", "idx", 256, DT_ERR_IO, "labels file", "c2-labels-idx1-ubyte: cannot open: No such file");
    write_idx("c3-images-idx3-ubyte.gz", 0, 0x00000803, 6, H, W, 6, 6, 1);
    unlink(tmp_path("c3-labels-idx1-ubyte.gz"));
    expect_fail("c3-images-idx3-ubyte.gz", "auto", 256, DT_ERR_IO, "labels file", "c3-labels-idx1-ubyte.gz: cannot open");
    copy_file("c1-images-idx3-ubyte", "pictures.idx");
    expect_fail("pictures.idx", "idx", 256, DT_ERR_CONFIG, "without 'images-idx3' in its name", "labels-idx1");
    expect_fail("pictures.idx", "auto", 256, DT_ERR_CONFIG, "without 'images-idx3' in its name", NULL);

    /* Header nonsense: no images, a 0-pixel side, sizes that overflow. */
    write_idx("h1-images-idx3-ubyte", 0, 0x00000803, 0, H, W, 0, 0, 0);
    expect_fail("h1-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "empty: the IDX header says 0 images", NULL);
    write_idx("h2-images-idx3-ubyte", 0, 0x00000803, 3, 0, W, 0, 3, 0);
    expect_fail("h2-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "image size 0x3", NULL);
    write_idx("h3-images-idx3-ubyte", 0, 0x00000803, 0xffffffffu, 46341, 46341, 0, 3, 0);
    expect_fail("h3-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "image size 46341x46341", NULL);
    write_idx("h4-images-idx3-ubyte", 0, 0x00000803, 0xffffffffu, 40000, 50000, 0, 3, 0);
    expect_fail("h4-images-idx3-ubyte", "idx", 256, DT_ERR_FORMAT, "size mismatch", "(truncated)");
    write_idx("h5-images-idx3-ubyte.gz", 0, 0x00000803, 0xffffffffu, 1000, 1000, 2, 3, 1); /* claims 4 TB */
    expect_fail("h5-images-idx3-ubyte.gz", "idx", 256, DT_ERR_FORMAT, "decompresses to 2000016 (truncated)", NULL);

    /* Token bounds at open: a pixel or label >= vocab. */
    write_good("v1-images-idx3-ubyte", 0, 40, 0);
    expect_fail("v1-images-idx3-ubyte", "idx", 200, DT_ERR_FORMAT, "pixel value 200 (image 28, pixel 4) is >= vocab size 200",
                "vocab >= 256");
    write_idx("v2-images-idx3-ubyte", 0, 0x00000803, 2, 1, 1, 2, 2, 0); /* pixels 0 0, labels 0 1 */
    expect_fail("v2-images-idx3-ubyte", "idx", 1, DT_ERR_FORMAT, "labels file", "label 1 at index 1 is >= vocab size 1");

    /* Labels against n_classes; a token dataset has none. */
    write_raw_like_idx();
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char spec[600];
    dt_dataset *ds = open_ok(tmp_path("v1-images-idx3-ubyte"), "idx", 256);
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 10), DT_OK);
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 9), DT_ERR_FORMAT); /* first 9: record 9 */
    expect_msg(&ctx, tmp_path("v1-images-idx3-ubyte"), "labels file", "label 9 at index 9 is >= n_classes 9");
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 0), DT_ERR_CONFIG);
    dt_dataset_close(ds);
    ds = open_ok(tmp_path("tokens.bin"), "auto", 1000);
    assert_int_equal(dt_dataset_check_labels(&ctx, ds, 10), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "is a token dataset"));
    dt_dataset_close(ds);

    /* One dataset, one kind and one image size. */
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("v1-images-idx3-ubyte"), tmp_path("tokens.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 1000), DT_ERR_CONFIG);
    expect_msg(&ctx, tmp_path("tokens.bin"), "a token shard, but", "is an IDX images file");
    write_idx("s1-images-idx3-ubyte", 0, 0x00000803, 2, 3, 2, 2, 2, 0);
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("v1-images-idx3-ubyte"), tmp_path("s1-images-idx3-ubyte"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "idx", 256), DT_ERR_FORMAT);
    expect_msg(&ctx, tmp_path("s1-images-idx3-ubyte"), "3x2 images, but", "has 2x3; a dataset holds one image size");
    assert_null(ds);
    /* idx forced on token shards: an llm.c shard, raw tokens that begin like IDX. */
    write_llmc16("fp0.bin", 14);
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("fp0.bin"), "idx", 1000), DT_ERR_FORMAT);
    expect_msg(&ctx, tmp_path("fp0.bin"), "bad magic 0x", "expected 0x00000803");
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("tokens.bin"), "idx", 1000), DT_ERR_FORMAT);
    expect_msg(&ctx, tmp_path("tokens.bin"), "size mismatch: the IDX header says 1280 images", NULL);
}

/* Every single-byte flip and every truncation of a small IDX file, plain and gzip, images
 * and labels: opening either succeeds with consistent sizes or fails with one line that
 * starts with the images path. Run under ASan (SANITIZE=address) this also proves the
 * reads stay in bounds. */
static void check_open_survives(const char *name) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    const char *path = tmp_path(name);
    if (dt_dataset_open(&ctx, &ds, path, "auto", 256) != DT_OK) {
        assert_null(ds);
        if (strncmp(ctx.err, path, strlen(path)) != 0 || strchr(ctx.err, '\n'))
            fail_msg("bad message '%s'", ctx.err);
        return;
    }
    int h, w;
    assert_int_equal(dt_dataset_image_hw(ds, &h, &w), 1);
    uint64_t n = dt_dataset_shard_tokens(ds, 0);
    assert_int_equal(n, dt_dataset_num_records(ds) * (uint64_t)(h * w + 1));
    int32_t *all = tu_malloc(n * sizeof *all);
    dt_dataset_read(ds, 0, 0, n, all);
    for (uint64_t i = 0; i < n; i++) assert_true(all[i] >= 0 && all[i] < 256);
    free(all);
    dt_dataset_close(ds);
}

static void mutate_and_open(const char *good, const char *victim, const char *images_name) {
    FILE *f = fopen(tmp_path(good), "rb");
    assert_non_null(f);
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(n > 0 && n < sizeof buf);
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            unsigned char m[4096];
            memcpy(m, buf, n);
            m[i] ^= k ? 0xff : 0x01;
            write_bytes(victim, m, n, 0);
            check_open_survives(images_name);
        }
        write_bytes(victim, buf, i, 0); /* truncated to i bytes */
        check_open_survives(images_name);
    }
    write_bytes(victim, buf, n, 0);
}

static void test_bit_flips_and_truncations_never_crash(void **state) {
    (void)state;
    for (int gz = 0; gz < 2; gz++) {
        const char *img = gz ? "f-images-idx3-ubyte.gz" : "f-images-idx3-ubyte";
        const char *lab = gz ? "f-labels-idx1-ubyte.gz" : "f-labels-idx1-ubyte";
        write_good(img, 1, 9, gz);
        copy_file(img, "good-img");
        copy_file(lab, "good-lab");
        mutate_and_open("good-img", img, img);
        mutate_and_open("good-lab", lab, img);
        check_open_survives(img); /* restored: opens */
    }
}

static int setup(void **state) {
    (void)state;
    if (tu_mkdtemp(g_dir, sizeof g_dir, "test_images")) return -1;
    for (int s = 0; s < NS; s++) {
        char name[64];
        snprintf(name, sizeof name, "train%d-images-idx3-ubyte%s", s, s == 1 ? ".gz" : "");
        write_good(name, s, g_recs[s], s == 1);
    }
    snprintf(g_spec, sizeof g_spec, "%s/train*-images-idx3-ubyte*", g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_plain_and_gz),
        cmocka_unit_test(test_sampler_records_exactly_once),
        cmocka_unit_test(test_resume_other_world_and_fingerprint),
        cmocka_unit_test(test_loaders_on_records),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_damaged_files_refused),
        cmocka_unit_test(test_bit_flips_and_truncations_never_crash),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
