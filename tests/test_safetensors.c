/* safetensors writer and bounds-checked reader: a round trip, then every kind of damage to
 * a file (truncation, a huge header length, a header that is not JSON or not an object,
 * offsets outside the data, a size that disagrees with the shape, a bad dtype, two tensors
 * sharing bytes, a name given twice) is refused
 * with a message naming the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "testutil.h"

static char dir[64];

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(dir);
}

static int setup(void **state) {
    (void)state;
    return tu_mkdtemp(dir, sizeof dir, "test_st");
}

static void test_round_trip(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3] = {7, -8, 9};
    dt_st_entry e[] = {{"a.weight", DT_ST_F32, 2, {2, 3}, a}, {"ids", DT_ST_I32, 1, {3}, b}};
    const char *meta[] = {"step", "12", "note", "quote \" and \\", NULL};
    char path[128];
    snprintf(path, sizeof path, "%s/ok.safetensors", dir);
    assert_int_equal(dt_st_write(&ctx, path, e, 2, meta), DT_OK);
    dt_st_file *f;
    assert_int_equal(dt_st_open(&ctx, path, &f), DT_OK);
    assert_int_equal(dt_st_count(f), 2);
    const dt_st_tensor *t = dt_st_find(f, "a.weight");
    assert_non_null(t);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    assert_memory_equal(t->data, a, sizeof a);
    t = dt_st_find(f, "ids");
    assert_int_equal(t->dtype, DT_ST_I32);
    assert_memory_equal(t->data, b, sizeof b);
    assert_string_equal(dt_st_meta(f, "step"), "12");
    assert_string_equal(dt_st_meta(f, "note"), "quote \" and \\");
    assert_null(dt_st_meta(f, "missing"));
    assert_null(dt_st_find(f, "nope"));
    dt_st_close(f);
    assert_int_equal(access(path, F_OK), 0);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0); /* no temporary left behind */
}

/* Writes raw bytes: u64 header length, header text, then `data_len` data bytes. */
static const char *write_raw(const char *name, uint64_t hlen, const char *hdr, size_t data_len) {
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(&hlen, 8, 1, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < data_len; i++) fputc(0, f);
    fclose(f);
    return path;
}

static void expect_refused(const char *path, const char *needle) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_st_file *f = NULL;
    dt_status st = dt_st_open(&ctx, path, &f);
    printf("  %s\n", ctx.err);
    assert_int_not_equal(st, DT_OK);
    assert_null(f);
    assert_non_null(strstr(ctx.err, path));
    if (!strstr(ctx.err, needle)) fail_msg("'%s' lacks '%s'", ctx.err, needle);
}

static void test_damage_is_refused(void **state) {
    (void)state;
    const char *good = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_refused(write_raw("short", 3, "", 0), "exceeds the file");
    expect_refused(write_raw("hlen", 1u << 20, good, 8), "exceeds the file");
    expect_refused(write_raw("notjson", 9, "{not json", 8), "not a JSON object");
    expect_refused(write_raw("array", 2, "[]", 8), "not a JSON object");
    expect_refused(write_raw("trunc", strlen(good), good, 4), "outside");
    const char *sz = "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
    expect_refused(write_raw("size", strlen(sz), sz, 8), "elements");
    const char *dt = "{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
    expect_refused(write_raw("dtype", strlen(dt), dt, 8), "dtype");
    const char *neg = "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}";
    expect_refused(write_raw("neg", strlen(neg), neg, 8), "dimension");
    const char *rev = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}";
    expect_refused(write_raw("rev", strlen(rev), rev, 8), "outside");
    const char *ovl = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    expect_refused(write_raw("overlap", strlen(ovl), ovl, 12), "overlap");
    const char *dup = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    expect_refused(write_raw("dup", strlen(dup), dup, 8), "appears twice");
    const char *meta = "{\"__metadata__\":{\"a\":3}}";
    expect_refused(write_raw("meta", strlen(meta), meta, 0), "metadata");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    expect_refused(missing, "cannot open");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_damage_is_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
