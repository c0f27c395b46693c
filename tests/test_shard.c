/* data/shard: llm.c v1/v7 and raw uint16 files read back exactly, glob and comma-list
 * order, the auto-detection rule, and every malformed input refused with one message that
 * names the file and the reason. Files are written to a fresh temporary directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/sampler.h"
#include "data/shard.h"
#include "testutil.h"

static char g_dir[64];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

/* An llm.c shard: header (magic, version, count) then n tokens of `width` bytes, then
 * `extra` zero bytes. The header count and the tokens written may disagree on purpose. */
static void write_llmc(const char *name, int32_t magic, int32_t version, int32_t count,
                       const uint32_t *tok, size_t n, int width, size_t extra) {
    FILE *f = fopen(tmp_path(name), "wb");
    assert_non_null(f);
    int32_t hdr[DT_LLMC_HEADER_INTS] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
    for (size_t i = 0; i < n; i++) {
        if (width == 2) {
            uint16_t v = (uint16_t)tok[i];
            assert_int_equal(fwrite(&v, 2, 1, f), 1);
        } else {
            assert_int_equal(fwrite(&tok[i], 4, 1, f), 1);
        }
    }
    for (size_t i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
}

static void write_raw16(const char *name, const uint32_t *tok, size_t n) {
    FILE *f = fopen(tmp_path(name), "wb");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)tok[i];
        assert_int_equal(fwrite(&v, 2, 1, f), 1);
    }
    fclose(f);
}

static uint32_t *pattern_tokens(size_t n, uint32_t mod, uint32_t salt) {
    uint32_t *t = tu_malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)((i * 7919u + salt) % mod);
    return t;
}

static void check_read_back(const dt_dataset *ds, int shard, const uint32_t *want, size_t n) {
    assert_int_equal(dt_dataset_shard_tokens(ds, shard), n);
    int32_t *got = tu_malloc(n * sizeof *got);
    dt_dataset_read(ds, shard, 0, n, got);
    for (size_t i = 0; i < n; i++) assert_int_equal(got[i], (int32_t)want[i]);
    assert_int_equal(dt_dataset_token(ds, shard, n - 1), (int32_t)want[n - 1]);
    dt_dataset_read(ds, shard, 5, 3, got); /* an interior range */
    for (int i = 0; i < 3; i++) assert_int_equal(got[i], (int32_t)want[5 + i]);
    free(got);
}

static void test_formats_read_back_exactly(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    size_t n = 1000;
    uint32_t *t16 = pattern_tokens(n, 50257, 3);
    uint32_t *t32 = pattern_tokens(n, 100000, 11); /* beyond uint16 */
    t32[17] = 99999;
    write_llmc("v1.bin", DT_LLMC_MAGIC, 1, (int32_t)n, t16, n, 2, 0);
    write_llmc("v7.bin", DT_LLMC_MAGIC, 7, (int32_t)n, t32, n, 4, 0);
    write_raw16("nano.bin", t16, n);
    write_raw16("nano.u16", t16, n);

    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("v1.bin"), "auto", 50257), DT_OK);
    assert_int_equal(dt_dataset_num_shards(ds), 1);
    assert_int_equal(dt_dataset_shard_width(ds, 0), 2);
    assert_int_equal(dt_dataset_shard_is_raw(ds, 0), 0);
    check_read_back(ds, 0, t16, n);
    dt_dataset_close(ds);

    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("v7.bin"), "llmc", 100000), DT_OK);
    assert_int_equal(dt_dataset_shard_width(ds, 0), 4);
    check_read_back(ds, 0, t32, n);
    assert_int_equal(dt_dataset_token(ds, 0, 17), 99999);
    dt_dataset_close(ds);

    /* auto: no magic, .bin, even size => raw uint16 */
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("nano.bin"), NULL, 50257), DT_OK);
    assert_int_equal(dt_dataset_shard_is_raw(ds, 0), 1);
    assert_int_equal(dt_dataset_num_tokens(ds), n);
    check_read_back(ds, 0, t16, n);
    dt_dataset_close(ds);

    /* raw16 forced for a name auto would not take */
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("nano.u16"), "raw16", 50257), DT_OK);
    check_read_back(ds, 0, t16, n);
    dt_dataset_close(ds);

    /* all three at once through a comma list: order kept, tokens summed */
    char spec[1024];
    snprintf(spec, sizeof spec, "%s, %s,%s", tmp_path("v7.bin"), tmp_path("v1.bin"),
             tmp_path("nano.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 100000), DT_OK);
    assert_int_equal(dt_dataset_num_shards(ds), 3);
    assert_int_equal(dt_dataset_num_tokens(ds), 3 * n);
    assert_string_equal(dt_dataset_shard_path(ds, 0), tmp_path("v7.bin"));
    check_read_back(ds, 0, t32, n);
    check_read_back(ds, 1, t16, n);
    check_read_back(ds, 2, t16, n);
    dt_dataset_close(ds);
    free(t16);
    free(t32);
}

static void test_glob_sorted_and_lists(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    const char *names[3] = {"shard_002.bin", "shard_000.bin", "shard_010.bin"}; /* written unsorted */
    const int first_tok[3] = {2, 0, 10};
    for (int i = 0; i < 3; i++) {
        uint32_t *t = pattern_tokens(50, 50257, 1);
        t[0] = (uint32_t)first_tok[i];
        write_llmc(names[i], DT_LLMC_MAGIC, 1, 50, t, 50, 2, 0);
        free(t);
    }
    write_raw16("other.txt", (const uint32_t[]){1, 2}, 2); /* not matched by the glob */
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("shard_*.bin"), "auto", 50257), DT_OK);
    assert_int_equal(dt_dataset_num_shards(ds), 3);
    const int want[3] = {0, 2, 10};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "shard_%03d.bin", want[i]);
        assert_string_equal(dt_dataset_shard_path(ds, i), tmp_path(name));
        assert_int_equal(dt_dataset_token(ds, i, 0), want[i]);
    }
    assert_int_equal(dt_dataset_num_tokens(ds), 150);
    dt_dataset_close(ds);

    /* Entries keep their order; a glob entry is sorted inside itself. */
    char spec[1024];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("shard_010.bin"), tmp_path("shard_00?.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 50257), DT_OK);
    assert_int_equal(dt_dataset_num_shards(ds), 3);
    assert_int_equal(dt_dataset_token(ds, 0, 0), 10);
    assert_int_equal(dt_dataset_token(ds, 1, 0), 0);
    assert_int_equal(dt_dataset_token(ds, 2, 0), 2);
    dt_dataset_close(ds);

    /* A file named twice would be read twice per epoch. */
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("shard_*.bin"), tmp_path("shard_002.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 50257), DT_ERR_CONFIG);
    assert_null(ds);
    assert_non_null(strstr(ctx.err, "shard_002.bin: listed twice"));
}

/* Opens `name` (in the temp dir) and expects `code` with both substrings in the message,
 * which must also name the file. */
static void expect_fail(const char *name, const char *format, int vocab, dt_status code,
                        const char *why1, const char *why2) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds = (dt_dataset *)&ctx; /* must be reset to NULL */
    const char *path = tmp_path(name);
    dt_status st = dt_dataset_open(&ctx, &ds, path, format, vocab);
    if (st != code || !strstr(ctx.err, path) || !strstr(ctx.err, why1) ||
        (why2 && !strstr(ctx.err, why2)))
        fail_msg("%s: got status %d message '%s'", name, (int)st, ctx.err);
    assert_null(ds);
}

static void write_text(const char *name, const char *text) {
    FILE *f = fopen(tmp_path(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static void test_malformed_files_refused(void **state) {
    (void)state;
    dt_ctx ctx0;
    dt_ctx_init(&ctx0);
    dt_dataset *ds0;
    uint32_t *t = pattern_tokens(100, 50257, 5);
    write_llmc("badmagic.bin", 12345, 1, 100, t, 100, 2, 0);
    expect_fail("badmagic.bin", "llmc", 50257, DT_ERR_FORMAT, "bad magic 12345", "20240520");
    /* auto: the rest of the header is a consistent llm.c header => not silently raw */
    expect_fail("badmagic.bin", "auto", 50257, DT_ERR_FORMAT, "bad magic 12345",
                "not read as raw uint16");
    write_raw16("plain.dat", t, 100);
    expect_fail("plain.dat", "auto", 50257, DT_ERR_FORMAT, "bad magic", "does not end in .bin");
    write_raw16("odd.bin", t, 100);
    assert_int_equal(truncate(tmp_path("odd.bin"), 199), 0);
    expect_fail("odd.bin", "auto", 50257, DT_ERR_FORMAT, "odd size (199 bytes)", NULL);
    expect_fail("odd.bin", "raw16", 50257, DT_ERR_FORMAT, "raw uint16 file has an odd size", NULL);

    write_llmc("v3.bin", DT_LLMC_MAGIC, 3, 100, t, 100, 2, 0);
    expect_fail("v3.bin", "auto", 50257, DT_ERR_FORMAT, "unknown llm.c version 3", NULL);

    write_llmc("trunc.bin", DT_LLMC_MAGIC, 1, 100, t, 99, 2, 0);
    expect_fail("trunc.bin", "auto", 50257, DT_ERR_FORMAT, "size mismatch: the header says 100 tokens",
                "(truncated)");
    write_llmc("extra.bin", DT_LLMC_MAGIC, 7, 100, t, 100, 4, 6);
    expect_fail("extra.bin", "auto", 50257, DT_ERR_FORMAT, "size mismatch", "(6 extra bytes)");
    write_llmc("hdronly.bin", DT_LLMC_MAGIC, 1, 0, t, 0, 2, 0);
    expect_fail("hdronly.bin", "auto", 50257, DT_ERR_FORMAT, "empty shard (the header says 0 tokens)", NULL);
    write_raw16("empty.bin", t, 0);
    expect_fail("empty.bin", "auto", 50257, DT_ERR_FORMAT, "empty file (0 bytes, 0 tokens)", NULL);
    FILE *f = fopen(tmp_path("shorthdr.bin"), "wb");
    int32_t m = DT_LLMC_MAGIC;
    fwrite(&m, 4, 1, f);
    fclose(f);
    expect_fail("shorthdr.bin", "auto", 50257, DT_ERR_FORMAT, "shorter than the 1024-byte llm.c header", NULL);

    /* The first bad token is reported: index and value. */
    t[77] = 50257;
    t[90] = 60000;
    write_llmc("badtok.bin", DT_LLMC_MAGIC, 1, 100, t, 100, 2, 0);
    expect_fail("badtok.bin", "auto", 50257, DT_ERR_FORMAT, "token 50257 at index 77 is >= vocab size 50257", NULL);
    expect_fail("badtok.bin", "auto", 1000, DT_ERR_FORMAT, "vocab size 1000", NULL);
    write_llmc("badtok7.bin", DT_LLMC_MAGIC, 7, 100, t, 100, 4, 0);
    expect_fail("badtok7.bin", "auto", 60000, DT_ERR_FORMAT, "token 60000 at index 90", NULL);
    free(t);

    /* A text file is not tokens, whatever the format says: refused naming dtrain prepare
     * (ASCII with an even size, as raw16 would take it; odd-size UTF-8; forced raw16/llmc). */
    write_text("corpus.bin", "The quick brown fox jumps over the lazy dog.\nAgain: the quick brown fox\n");
    expect_fail("corpus.bin", "auto", 50304, DT_ERR_FORMAT,
                "this is a text file, not tokens (72 bytes of printable UTF-8, 2 lines)",
                "dtrain prepare --out PREFIX");
    expect_fail("corpus.bin", "raw16", 50304, DT_ERR_FORMAT, "this is a text file, not tokens", NULL);
    expect_fail("corpus.bin", "llmc", 50304, DT_ERR_FORMAT, "this is a text file, not tokens", NULL);
    write_text("utf8.bin", "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xf0\x9f\x99\x82\n");
    expect_fail("utf8.bin", "auto", 50304, DT_ERR_FORMAT, "this is a text file, not tokens", "1 line)");
    /* Token ids whose bytes are all printable except one: still tokens (no false alarm). */
    uint32_t pr[64];
    for (int i = 0; i < 64; i++) pr[i] = 0x4141u + (uint32_t)i;
    pr[40] = 0x0a00u | 'A'; /* a newline high byte is fine; a low byte of 0x01 is not */
    pr[50] = 0x4101u;
    write_raw16("printable.bin", pr, 64);
    assert_int_equal(dt_dataset_open(&ctx0, &ds0, tmp_path("printable.bin"), "auto", 50304), DT_OK);
    dt_dataset_close(ds0);
    /* raw16 forced on an llm.c shard: the header is named, not its bytes as token ids. */
    write_llmc("hdr.bin", DT_LLMC_MAGIC, 1, 64, pr, 64, 2, 0);
    expect_fail("hdr.bin", "raw16", 256, DT_ERR_FORMAT, "hdr.bin has an llm.c shard header",
                "use data.format=llmc (or auto)");
    /* A raw16 file with an id past the vocabulary: the message asks whether it is a token file. */
    write_raw16("big.bin", (const uint32_t[]){1, 2, 999, 3}, 4);
    expect_fail("big.bin", "auto", 256, DT_ERR_FORMAT, "token 999 at index 2 is >= vocab size 256",
                "read as raw uint16: is it a token file");

    /* Unreadable paths. */
    expect_fail("missing.bin", "auto", 50257, DT_ERR_IO, "cannot open", "No such file");
    assert_int_equal(mkdir(tmp_path("adir.bin"), 0700), 0);
    expect_fail("adir.bin", "auto", 50257, DT_ERR_IO, "not a regular file", NULL);
    if (geteuid() != 0) { /* root reads mode-000 files anyway */
        write_raw16("noperm.bin", (const uint32_t[]){1, 2}, 2);
        chmod(tmp_path("noperm.bin"), 0);
        expect_fail("noperm.bin", "auto", 50257, DT_ERR_IO, "cannot open", "Permission denied");
    }

    /* Pattern without a match, bad arguments. */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("nothing_*.bin"), "auto", 50257), DT_ERR_IO);
    assert_non_null(strstr(ctx.err, tmp_path("nothing_*.bin")));
    assert_non_null(strstr(ctx.err, "no file matches"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, tmp_path("v3.bin"), "llm", 50257), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "data format 'llm' is unknown"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, " , ", "auto", 50257), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "names no file"));

    /* In a list, the failing file is the one named, after good ones were opened. */
    uint32_t good[20] = {0};
    write_llmc("good.bin", DT_LLMC_MAGIC, 1, 20, good, 20, 2, 0);
    char spec[1024];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("good.bin"), tmp_path("trunc.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 50257), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, tmp_path("trunc.bin")));
    assert_null(strstr(ctx.err, "good.bin"));
}

static void test_too_short_for_one_sample(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    uint32_t t[40] = {0};
    write_llmc("long.bin", DT_LLMC_MAGIC, 1, 40, t, 40, 2, 0);
    write_llmc("short.bin", DT_LLMC_MAGIC, 1, 16, t, 16, 2, 0);
    char spec[1024];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("long.bin"), tmp_path("short.bin"));
    dt_dataset *ds;
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 50257), DT_OK);
    assert_int_equal(dt_dataset_check_seq_len(&ctx, ds, 15), DT_OK); /* 16 tokens = 1 sample */
    assert_int_equal(dt_dataset_check_seq_len(&ctx, ds, 16), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, tmp_path("short.bin")));
    assert_non_null(strstr(ctx.err, "16 tokens, too few for one sample of T=16 (needs at least 17 tokens)"));
    /* The sampler refuses the same way. */
    dt_sampler *s = (dt_sampler *)&ctx;
    assert_int_equal(dt_sampler_init(&ctx, &s, ds, 32, 1, 1), DT_ERR_FORMAT);
    assert_null(s);
    assert_non_null(strstr(ctx.err, "short.bin: 16 tokens"));
    assert_non_null(strstr(ctx.err, "needs at least 33 tokens"));
    dt_dataset_close(ds);
}

/* Validation is chunked and parallel; the first bad token in file order must be named even
 * when a later chunk or shard also holds one. */
static void test_parallel_scan_reports_first_bad_token(void **state) {
    (void)state;
    size_t n = ((size_t)1 << 22) + 1000; /* two scan chunks */
    uint32_t *t = pattern_tokens(n, 1000, 0);
    t[((size_t)1 << 22) + 500] = 1000;
    t[n - 1] = 4000;
    write_raw16("big_a.bin", t, n);
    t[((size_t)1 << 22) + 500] = 0;
    t[n - 1] = 0;
    t[3] = 2000;
    write_raw16("big_b.bin", t, n);
    free(t);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    char spec[1024];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("big_a.bin"), tmp_path("big_b.bin"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "raw16", 1000), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, tmp_path("big_a.bin")));
    assert_non_null(strstr(ctx.err, "token 1000 at index 4194804 is >= vocab size 1000"));
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "raw16", 4001), DT_OK);
    assert_int_equal(dt_dataset_num_tokens(ds), 2 * n);
    assert_int_equal(dt_dataset_token(ds, 1, 3), 2000);
    dt_dataset_close(ds);
    unlink(tmp_path("big_a.bin"));
    unlink(tmp_path("big_b.bin"));
}

static int setup(void **state) {
    (void)state;
    return tu_mkdtemp(g_dir, sizeof g_dir, "test_shard");
}

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(g_dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_read_back_exactly),
        cmocka_unit_test(test_glob_sorted_and_lists),
        cmocka_unit_test(test_malformed_files_refused),
        cmocka_unit_test(test_too_short_for_one_sample),
        cmocka_unit_test(test_parallel_scan_reports_first_bad_token),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
