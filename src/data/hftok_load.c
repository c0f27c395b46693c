/* hftok_load.c - reads a Hugging Face tokenizer.json (through cJSON) into the tables of
 * hftok.h, refusing what dtrain does not implement with one line naming the file and key. */
#include "data/hftok.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Split patterns dtrain implements, as they appear in the files (after JSON unescaping). */
static const char LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char METASPACE[] = "\xE2\x96\x81"; /* "▁" */

typedef struct loader {
    dt_ctx *ctx;
    const char *path;
    dt_hftok *h;
    const cJSON *vocab, *added;
    uint8_t *in_vocab; /* (n) the id is a model.vocab token (hashed; merges may use it) */
} loader;

static dt_status bad(const loader *L, const char *fmt, const char *key, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, what);
    return dt_fail(L->ctx, DT_ERR_FORMAT, "%s: %s: %s", L->path, key, msg);
}

static const char *type_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int is_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static int is_null(const cJSON *o) { return !o || cJSON_IsNull(o); }

/* A token string as bytes: byte-level vocabulary strings through GPT-2's alphabet, anything
 * else as its UTF-8. -1 (with the code point) when a byte-level string leaves the alphabet. */
static int token_bytes(int bytelevel, const char *s, uint8_t *dst, size_t *n, uint32_t *badcp) {
    size_t len = strlen(s), k = 0;
    if (!bytelevel) {
        memcpy(dst, s, len);
        *n = len;
        return 0;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t m = dt_bpe_utf8_decode((const uint8_t *)s + i, len - i, &cp);
        int b = m ? dt_bpe_cp_to_byte(cp) : -1;
        if (b < 0) {
            *badcp = m ? cp : (uint8_t)s[i];
            return -1;
        }
        dst[k++] = (uint8_t)b;
        i += m;
    }
    *n = k;
    return 0;
}

/* The kind and pre-tokenizer from pre_tokenizer and normalizer. */
static dt_status read_kind(loader *L, const cJSON *root) {
    dt_hftok *h = L->h;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const char *pt = is_null(pre) ? NULL : type_of(pre);
    if (!is_null(pre) && !pt) return bad(L, "%s", "pre_tokenizer", "not an object with a \"type\"");
    if (pt && (!strcmp(pt, "ByteLevel") || !strcmp(pt, "Sequence"))) {
        h->kind = DT_HF_BYTELEVEL;
        if (!is_null(norm)) return bad(L, "%s", "normalizer", "a byte-level model with a normalizer is not supported");
        const cJSON *bl = pre, *split = NULL;
        if (!strcmp(pt, "Sequence")) {
            const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
            const char *t0 = cJSON_GetArraySize(seq) == 2 ? type_of(cJSON_GetArrayItem(seq, 0)) : NULL;
            const char *t1 = t0 ? type_of(cJSON_GetArrayItem(seq, 1)) : NULL;
            if (!t0 || !t1 || strcmp(t0, "Split") || strcmp(t1, "ByteLevel"))
                return bad(L, "%s", "pre_tokenizer.pretokenizers",
                           "dtrain implements the sequence [Split, ByteLevel] only");
            split = cJSON_GetArrayItem(seq, 0);
            bl = cJSON_GetArrayItem(seq, 1);
        }
        if (is_true(bl, "add_prefix_space"))
            return bad(L, "%s", "pre_tokenizer.add_prefix_space", "true is not supported");
        const char *pat = GPT2_PATTERN;
        if (split) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(split, "pattern");
            const cJSON *re = cJSON_GetObjectItemCaseSensitive(p, "Regex");
            const cJSON *beh = cJSON_GetObjectItemCaseSensitive(split, "behavior");
            if (!cJSON_IsString(re))
                return bad(L, "%s", "pre_tokenizer Split.pattern", "not a {\"Regex\": ...} object");
            if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || is_true(split, "invert"))
                return bad(L, "%s", "pre_tokenizer Split.behavior", "only \"Isolated\" without invert is supported");
            if (is_true(bl, "use_regex"))
                return bad(L, "%s", "pre_tokenizer ByteLevel.use_regex", "true after a Split is not supported");
            pat = re->valuestring;
        } else if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(bl, "use_regex"))) {
            return bad(L, "%s", "pre_tokenizer.use_regex", "false (no pattern at all) is not supported");
        }
        if (!strcmp(pat, LLAMA3_PATTERN)) h->pre = DT_HF_PRE_LLAMA3;
        else if (!strcmp(pat, GPT2_PATTERN)) h->pre = DT_HF_PRE_GPT2;
        else return bad(L, "%s", "pre_tokenizer Split.pattern", "not one dtrain implements (GPT-2's or Llama 3's)");
        return DT_OK;
    }
    h->kind = DT_HF_SENTENCEPIECE;
    if (pt && !strcmp(pt, "Metaspace")) {
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(pre, "replacement");
        const cJSON *sch = cJSON_GetObjectItemCaseSensitive(pre, "prepend_scheme");
        if (!cJSON_IsString(rep) || strcmp(rep->valuestring, METASPACE))
            return bad(L, "%s", "pre_tokenizer.replacement", "only \"\xE2\x96\x81\" is supported");
        if (is_true(pre, "split"))
            return bad(L, "%s", "pre_tokenizer.split", "true is not supported (Metaspace without split only)");
        if (!is_null(norm)) return bad(L, "%s", "normalizer", "a normalizer with a Metaspace pre-tokenizer is not supported");
        h->prepend = is_true(pre, "add_prefix_space") ? DT_HF_PREPEND_ALWAYS : DT_HF_PREPEND_NEVER;
        if (cJSON_IsString(sch))
            h->prepend = !strcmp(sch->valuestring, "always") ? DT_HF_PREPEND_ALWAYS
                       : !strcmp(sch->valuestring, "first")  ? DT_HF_PREPEND_FIRST
                       : !strcmp(sch->valuestring, "never")  ? DT_HF_PREPEND_NEVER : -1;
        if (h->prepend < 0) return bad(L, "%s", "pre_tokenizer.prepend_scheme", "not always, first or never");
        return DT_OK;
    }
    if (pt) return bad(L, "pre_tokenizer type \"%s\" is not supported (ByteLevel, Split + ByteLevel, Metaspace or null)",
                       "pre_tokenizer", pt);
    /* No pre-tokenizer: SentencePiece as a normalizer, [Prepend "▁"], Replace " " -> "▁". */
    const char *nt = is_null(norm) ? NULL : type_of(norm);
    const cJSON *list = nt && !strcmp(nt, "Sequence") ? cJSON_GetObjectItemCaseSensitive(norm, "normalizers") : NULL;
    int n = list ? cJSON_GetArraySize(list) : nt ? 1 : 0, replace = 0;
    h->prepend = DT_HF_PREPEND_NEVER;
    for (int i = 0; i < n; i++) {
        const cJSON *x = list ? cJSON_GetArrayItem(list, i) : norm;
        const char *t = type_of(x);
        const cJSON *pre_s = cJSON_GetObjectItemCaseSensitive(x, "prepend");
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(x, "pattern"), "String");
        const cJSON *con = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (t && !strcmp(t, "Prepend") && i == 0 && cJSON_IsString(pre_s) && !strcmp(pre_s->valuestring, METASPACE)) {
            h->prepend = DT_HF_PREPEND_ALWAYS;
        } else if (t && !strcmp(t, "Replace") && !replace && cJSON_IsString(pat) && !strcmp(pat->valuestring, " ") &&
                   cJSON_IsString(con) && !strcmp(con->valuestring, METASPACE)) {
            replace = 1;
        } else {
            return bad(L, "normalizer %s is not supported (SentencePiece's Prepend \"\xE2\x96\x81\" and Replace \" \" "
                       "-> \"\xE2\x96\x81\" only)", "normalizer", t ? t : "(no type)");
        }
    }
    if (!replace)
        return bad(L, "%s", "pre_tokenizer", "null without a Replace \" \" -> \"\xE2\x96\x81\" normalizer is not a "
                   "model dtrain implements (byte-level or SentencePiece BPE)");
    return DT_OK;
}

/* 1 for an integer id in [0, 2^24) (ids past that are refused as unsupported). */
static int good_id(const cJSON *x) {
    return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < (double)(1 << 24) &&
           x->valuedouble == (double)(int)x->valuedouble;
}

/* Counts the ids (max + 1) of model.vocab and added_tokens. */
static dt_status count_ids(loader *L, int *n) {
    long top = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, L->vocab) {
        if (!good_id(e))
            return bad(L, "the id of \"%.60s\" is not an integer in [0, 2^24)", "model.vocab", e->string);
        if (e->valuedouble > top) top = (long)e->valuedouble;
    }
    int i = 0;
    cJSON_ArrayForEach(e, L->added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        char key[64];
        snprintf(key, sizeof key, "added_tokens[%d]", i++);
        if (!good_id(id)) return bad(L, "%s", key, "\"id\" is not an integer in [0, 2^24)");
        if (!cJSON_IsString(c) || !c->valuestring[0]) return bad(L, "%s", key, "\"content\" is not a non-empty string");
        if (is_true(e, "lstrip") || is_true(e, "rstrip") || is_true(e, "single_word"))
            return bad(L, "%s", key, "lstrip, rstrip and single_word must be false (not supported)");
        if (id->valuedouble > top) top = (long)id->valuedouble;
    }
    if (top < 0) return bad(L, "%s", "model.vocab", "no tokens");
    *n = (int)top + 1;
    return DT_OK;
}

/* Token bytes of every id into the blob; ids missing from both lists are refused. */
static dt_status fill_tokens(loader *L) {
    dt_hftok *h = L->h;
    dt_bpe *v = h->bpe;
    int byte = h->kind == DT_HF_BYTELEVEL;
    size_t total = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, L->vocab) total += strlen(e->string);
    cJSON_ArrayForEach(e, L->added) total += strlen(cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring);
    v->blob = malloc(total + 1);
    v->off = malloc((size_t)v->n * sizeof *v->off);
    v->len = calloc((size_t)v->n, sizeof *v->len);
    v->self = calloc((size_t)v->n, 1);
    L->in_vocab = calloc((size_t)v->n, 1);
    h->added = calloc((size_t)v->n, 1);
    uint8_t *have = calloc((size_t)v->n, 1);
    dt_status st = DT_OK;
    if (!v->blob || !v->off || !v->len || !v->self || !L->in_vocab || !h->added || !have) {
        free(have);
        return dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory for %d tokens", L->path, v->n);
    }
    size_t at = 0;
    cJSON_ArrayForEach(e, L->vocab) {
        int id = (int)e->valuedouble;
        size_t n;
        uint32_t cp;
        if (have[id]) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.vocab: id %d is given to two tokens (\"%.60s\")",
                         L->path, id, e->string);
            goto done;
        }
        if (token_bytes(byte, e->string, v->blob + at, &n, &cp)) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.vocab: token \"%.60s\" contains U+%04X, which is not "
                         "one of the 256 byte-level symbols", L->path, e->string, cp);
            goto done;
        }
        if (n == 0) {
            st = bad(L, "%s", "model.vocab", "a token is empty");
            goto done;
        }
        have[id] = L->in_vocab[id] = 1;
        v->off[id] = (uint32_t)at, v->len[id] = (uint32_t)n;
        at += n;
    }
    int i = 0;
    cJSON_ArrayForEach(e, L->added) {
        int id = (int)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        size_t n = strlen(c);
        i++;
        if (h->added[id]) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: added_tokens[%d]: id %d is added twice", L->path, i - 1, id);
            goto done;
        }
        if (L->in_vocab[id] && (v->len[id] != n || memcmp(v->blob + v->off[id], c, n))) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: added_tokens[%d]: \"%.60s\" has id %d, which model.vocab gives "
                         "to another token", L->path, i - 1, c, id);
            goto done;
        }
        h->added[id] = 1;
        have[id] = 1;
        memcpy(v->blob + at, c, n);
        v->off[id] = (uint32_t)at, v->len[id] = (uint32_t)n;
        at += n;
    }
    for (int id = 0; id < v->n; id++)
        if (!have[id]) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.vocab: no token has id %d (ids must run 0..%d, "
                         "with added_tokens)", L->path, id, v->n - 1);
            goto done;
        }
done:
    free(have);
    return st;
}

static int find(const dt_bpe *v, const char *s, size_t n) {
    return dt_bpe_token_find(v, (const uint8_t *)s, n, dt_bpe_hash_bytes((const uint8_t *)s, n));
}

/* The hash of model.vocab tokens, the byte tokens, unk, bos, eos and the added-token index. */
static dt_status index_all(loader *L, const cJSON *model, const cJSON *root) {
    dt_hftok *h = L->h;
    dt_bpe *v = h->bpe;
    uint8_t *skip = malloc((size_t)v->n);
    int dup, first;
    if (!skip) return dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory", L->path);
    for (int id = 0; id < v->n; id++) skip[id] = !L->in_vocab[id];
    int rc = dt_bpe_index_tokens(v, skip, &dup, &first);
    free(skip);
    if (rc) return dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory", L->path);
    if (dup >= 0)
        return dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.vocab: ids %d and %d are the same token", L->path, first, dup);
    h->byte_fallback = is_true(model, "byte_fallback");
    h->fuse_unk = is_true(model, "fuse_unk");
    char name[8];
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (h->kind == DT_HF_BYTELEVEL) {
            v->byte_id[b] = dt_bpe_token_find(v, &byte, 1, dt_bpe_hash_bytes(&byte, 1));
            if (v->byte_id[b] < 0)
                return dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.vocab: no token for byte 0x%02X", L->path, b);
            v->self[v->byte_id[b]] = 1;
        } else {
            snprintf(name, sizeof name, "<0x%02X>", b);
            v->byte_id[b] = find(v, name, 6);
            if (v->byte_id[b] < 0 && h->byte_fallback)
                return dt_fail(L->ctx, DT_ERR_FORMAT, "%s: model.byte_fallback is true but model.vocab has no "
                               "token %s", L->path, name);
        }
    }
    if (h->kind == DT_HF_SENTENCEPIECE) {
        if (!(h->byte_of = malloc((size_t)v->n * sizeof *h->byte_of)))
            return dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory", L->path);
        for (int id = 0; id < v->n; id++) h->byte_of[id] = -1;
        for (int b = 0; b < 256; b++)
            if (v->byte_id[b] >= 0) h->byte_of[v->byte_id[b]] = (int16_t)b;
        h->space_id = find(v, METASPACE, 3);
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    h->unk = -1;
    if (cJSON_IsString(unk) && (h->unk = find(v, unk->valuestring, strlen(unk->valuestring))) < 0)
        return bad(L, "\"%.60s\" is not a token of model.vocab", "model.unk_token", unk->valuestring);
    /* bos: the special token the post-processor's single template starts with. */
    h->bos = -1;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor"), *tp = NULL;
    const char *ppt = is_null(pp) ? NULL : type_of(pp);
    if (ppt && !strcmp(ppt, "TemplateProcessing")) tp = pp;
    if (ppt && !strcmp(ppt, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
            if (type_of(x) && !strcmp(type_of(x), "TemplateProcessing")) tp = x;
    }
    const cJSON *single = tp ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tp, "single"), 0) : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(single, "SpecialToken"), "id");
    if (cJSON_IsString(sp)) {
        for (int id = 0; id < v->n && h->bos < 0; id++)
            if (v->len[id] == strlen(sp->valuestring) && !memcmp(v->blob + v->off[id], sp->valuestring, v->len[id]))
                h->bos = id;
        if (h->bos < 0) return bad(L, "\"%.60s\" is not a token", "post_processor.single[0].SpecialToken.id", sp->valuestring);
    }
    /* eos: the end-of-text token by its usual names (tokenizer.json does not mark it). */
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>"};
    h->eos = -1;
    for (size_t k = 0; k < sizeof eos_names / sizeof *eos_names && h->eos < 0; k++)
        for (int id = 0; id < v->n && h->eos < 0; id++)
            if (v->len[id] == strlen(eos_names[k]) && !memcmp(v->blob + v->off[id], eos_names[k], v->len[id]))
                h->eos = id;
    v->eot = h->eos;
    /* Added tokens, longest first, for leftmost-longest matching. */
    for (int id = 0; id < v->n; id++) h->n_added += h->added[id];
    if (!(h->added_ids = malloc((h->n_added ? h->n_added : 1) * sizeof *h->added_ids)))
        return dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory", L->path);
    size_t k = 0;
    for (int id = 0; id < v->n; id++)
        if (h->added[id]) {
            size_t j = k++;
            while (j > 0 && v->len[h->added_ids[j - 1]] < v->len[id]) h->added_ids[j] = h->added_ids[j - 1], j--;
            h->added_ids[j] = id;
            uint8_t c0 = v->blob[v->off[id]];
            h->first_byte[c0 >> 5] |= 1u << (c0 & 31);
            for (uint32_t b = 0; b < v->len[id]; b++) /* never cut: a split point could be inside */
                if (v->blob[v->off[id] + b] >= 9 && v->blob[v->off[id] + b] <= 13) h->nl_cut = -1;
        }
    return DT_OK;
}

/* model.merges: "a b" strings or [a, b] pairs, rank = position. */
static dt_status read_merges(loader *L, const cJSON *merges) {
    dt_hftok *h = L->h;
    dt_bpe *v = h->bpe;
    int byte = h->kind == DT_HF_BYTELEVEL, n = cJSON_GetArraySize(merges);
    size_t cap = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const cJSON *p0 = cJSON_GetArrayItem(e, 0);
        size_t l = cJSON_IsString(e) ? strlen(e->valuestring) : cJSON_IsString(p0) ? strlen(p0->valuestring) : 0;
        const cJSON *p1 = cJSON_GetArrayItem(e, 1);
        l += cJSON_IsString(p1) ? strlen(p1->valuestring) : 0;
        if (l > cap) cap = l;
    }
    uint8_t *buf = malloc(2 * cap + 2);
    char *tmp = malloc(cap + 2);
    dt_status st = DT_OK;
    if (!buf || !tmp || dt_bpe_merges_alloc(v, (size_t)n)) {
        st = dt_fail(L->ctx, DT_ERR_NOMEM, "%s: out of memory for %d merges", L->path, n);
        goto done;
    }
    int nl = -1; /* the symbol of '\n' (sentencepiece) */
    if (h->kind == DT_HF_SENTENCEPIECE) {
        nl = find(v, "\n", 1);
        if (nl < 0) nl = h->byte_fallback ? v->byte_id['\n'] : h->fuse_unk ? -1 : h->unk;
    }
    int nl_merges = 0, i = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        char key[64];
        snprintf(key, sizeof key, "model.merges[%d]", i);
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = bad(L, "\"%.60s\" is not two tokens separated by one space", key, e->valuestring);
                goto done;
            }
            memcpy(tmp, e->valuestring, (size_t)(sp - e->valuestring));
            tmp[sp - e->valuestring] = 0;
            a = tmp, b = sp + 1;
        } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring, b = cJSON_GetArrayItem(e, 1)->valuestring;
        } else {
            st = bad(L, "%s", key, "not a string \"a b\" or a pair [\"a\", \"b\"]");
            goto done;
        }
        size_t na, nb;
        uint32_t cp, rank;
        int ida = -1, idb = -1;
        if (!token_bytes(byte, a, buf, &na, &cp)) ida = dt_bpe_token_find(v, buf, na, dt_bpe_hash_bytes(buf, na));
        if (!token_bytes(byte, b, buf + na, &nb, &cp)) idb = dt_bpe_token_find(v, buf + na, nb, dt_bpe_hash_bytes(buf + na, nb));
        if (ida < 0 || idb < 0) {
            st = bad(L, "\"%.60s\" is not a token of model.vocab", key, ida < 0 ? a : b);
            goto done;
        }
        int res = dt_bpe_token_find(v, buf, na + nb, dt_bpe_hash_bytes(buf, na + nb));
        if (res < 0) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: %s: the merged token \"%.40s%.40s\" is not in model.vocab",
                         L->path, key, a, b);
            goto done;
        }
        if (dt_bpe_merge_add(v, ida, idb, res, (uint32_t)i, &rank)) {
            st = dt_fail(L->ctx, DT_ERR_FORMAT, "%s: %s: repeats model.merges[%u]", L->path, key, rank);
            goto done;
        }
        nl_merges += nl >= 0 && (ida == nl || idb == nl);
        i++;
    }
    if (h->nl_cut == 0)
        h->nl_cut = h->kind == DT_HF_BYTELEVEL || (nl >= 0 && nl_merges == 0);
    if (h->nl_cut < 0) h->nl_cut = 0;
done:
    free(buf);
    free(tmp);
    return st;
}

dt_status dt_hftok_load(dt_ctx *ctx, const char *path, dt_hftok **out) {
    dt_status st = DT_OK;
    uint8_t *text = NULL;
    size_t n = 0;
    cJSON *root = NULL;
    *out = NULL;
    dt_hftok *h = calloc(1, sizeof *h);
    loader L = {ctx, path, h, NULL, NULL, NULL};
    if (!h || !(h->bpe = calloc(1, sizeof *h->bpe))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    DT_CHECK_GOTO(dt_bpe_read_file(ctx, path, &text, &n));
    if (!(root = cJSON_ParseWithLength((const char *)text, n))) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= (const char *)text && at <= (const char *)text + n ? (size_t)(at - (const char *)text) : 0;
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", path, off);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: not a tokenizer.json (the top-level value is not an object)", path);
        goto fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: model: missing or not an object", path);
        goto fail;
    }
    const char *mt = type_of(model);
    if (mt && strcmp(mt, "BPE")) {
        st = bad(&L, "\"%s\" is not supported (dtrain reads BPE models)", "model.type", mt);
        goto fail;
    }
    L.vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    L.added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(L.vocab)) {
        st = bad(&L, "%s", "model.vocab", "missing or not an object of token -> id");
        goto fail;
    }
    if (!cJSON_IsArray(merges)) {
        st = bad(&L, "%s", "model.merges", "missing or not an array");
        goto fail;
    }
    if (!is_null(L.added) && !cJSON_IsArray(L.added)) {
        st = bad(&L, "%s", "added_tokens", "not an array");
        goto fail;
    }
    static const char *const unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, unsupported[k]);
        if (!is_null(x) && !(cJSON_IsString(x) && !x->valuestring[0])) {
            char key[64];
            snprintf(key, sizeof key, "model.%s", unsupported[k]);
            st = bad(&L, "%s", key, "not supported (must be null)");
            goto fail;
        }
    }
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null(drop) && !(cJSON_IsNumber(drop) && drop->valuedouble == 0)) {
        st = bad(&L, "%s", "model.dropout", "BPE dropout is not supported (must be null)");
        goto fail;
    }
    h->bpe->strict = 1;
    DT_CHECK_GOTO(read_kind(&L, root));
    DT_CHECK_GOTO(count_ids(&L, &h->bpe->n));
    DT_CHECK_GOTO(fill_tokens(&L));
    DT_CHECK_GOTO(index_all(&L, model, root));
    DT_CHECK_GOTO(read_merges(&L, merges));
    if (h->kind == DT_HF_BYTELEVEL) {
        if (is_true(model, "ignore_merges"))
            memset(h->bpe->self, 1, (size_t)h->bpe->n);
        else
            DT_CHECK_GOTO(dt_bpe_mark_self(ctx, h->bpe));
        for (int id = 0; id < h->bpe->n; id++) /* added tokens are never pieces */
            if (!L.in_vocab[id]) h->bpe->self[id] = 0;
    }
    *out = h;
    h = NULL;
fail:
    cJSON_Delete(root);
    free(text);
    free(L.in_vocab);
    dt_hftok_free(h);
    return st;
}

void dt_hftok_free(dt_hftok *h) {
    if (!h) return;
    dt_bpe_free(h->bpe);
    free(h->byte_of);
    free(h->added);
    free(h->added_ids);
    free(h);
}
