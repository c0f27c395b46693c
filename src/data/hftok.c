/* hftok.c - encoding and decoding with a Hugging Face tokenizer.json BPE model (hftok.h):
 * added tokens cut out first, then the byte-level pieces of bpe.c or the SentencePiece
 * symbols, merged by bpe.c's rank-ordered merging. The behaviour to reproduce is the npm
 * packages llama3-tokenizer-js (byte-level) and llama-tokenizer-js / mistral-tokenizer-js
 * (SentencePiece), id for id (tests/run_hftok_parity.sh). */
#include "data/hftok.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t METASPACE[3] = {0xE2, 0x96, 0x81}; /* "▁" */
static const uint8_t REPLACEMENT[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */

/* ------------------------------------------------------------------ input text */

/* Bytes of the maximal invalid subsequence at s[0..n) where no valid sequence starts: a
 * lead byte with the continuation bytes that could still have completed it, else 1 byte
 * (Unicode's "maximal subpart" rule, which TextDecoder and Python follow). */
static size_t invalid_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi)
        for (k++; k < len && k < n && (s[k] & 0xC0) == 0x80; k++) {}
    return k;
}

/* The text with each invalid subsequence replaced by U+FFFD: s itself when it is valid UTF-8,
 * else a malloc'ed copy left in *copy. NULL when out of memory. */
static const uint8_t *sanitize(const uint8_t *s, size_t n, uint8_t **copy, size_t *outn) {
    size_t i = 0, nbad = 0;
    uint32_t cp;
    *copy = NULL;
    *outn = n;
    for (size_t m; i < n; i += m) {
        if (s[i] < 0x80) {
            m = 1;
            continue;
        }
        if (!(m = dt_bpe_utf8_decode(s + i, n - i, &cp))) {
            nbad++;
            m = invalid_len(s + i, n - i);
        }
    }
    if (!nbad) return s;
    uint8_t *d = malloc(n + 3 * nbad + 1);
    if (!d) return NULL;
    size_t w = 0;
    for (i = 0; i < n;) {
        size_t m = s[i] < 0x80 ? 1 : dt_bpe_utf8_decode(s + i, n - i, &cp);
        if (m) {
            memcpy(d + w, s + i, m);
            w += m, i += m;
        } else {
            memcpy(d + w, REPLACEMENT, 3);
            w += 3, i += invalid_len(s + i, n - i);
        }
    }
    *copy = d;
    *outn = w;
    return d;
}

/* Length of the longest added token at s[i..n), or 0; its id in *id. */
static size_t added_at(const dt_hftok *h, const uint8_t *s, size_t i, size_t n, int32_t *id) {
    const dt_bpe *v = h->bpe;
    uint8_t c = s[i];
    if (!(h->first_byte[c >> 5] >> (c & 31) & 1)) return 0;
    for (size_t k = 0; k < h->n_added; k++) { /* longest first */
        int32_t t = h->added_ids[k];
        size_t l = v->len[t];
        if (l <= n - i && v->blob[v->off[t]] == c && !memcmp(v->blob + v->off[t], s + i, l)) {
            *id = t;
            return l;
        }
    }
    return 0;
}

static int push(dt_ids *out, int32_t id) {
    if (out->n == out->cap && dt_bpe_grow((void **)&out->v, &out->cap, out->n + 1, sizeof(int32_t)))
        return -1;
    out->v[out->n++] = id;
    return 0;
}

/* ------------------------------------------------------------------ the two kinds */

static int bytelevel_text(const dt_hftok *h, dt_bpe_state *st, const uint8_t *s, size_t n,
                          dt_ids *out) {
    for (size_t i = 0; i < n;) {
        size_t j = h->pre == DT_HF_PRE_LLAMA3 ? dt_bpe_piece_end_llama3(s, i, n) : dt_bpe_piece_end(s, i, n);
        if (dt_bpe_encode_piece(st, s + i, j - i, out)) return -1;
        i = j;
    }
    return 0;
}

/* The symbols of one code point c[0..m) after sym[*k]: its token, else its byte tokens, else
 * unk (consecutive unknowns fused into one with fuse_unk). */
static void spm_symbol(const dt_hftok *h, const uint8_t *c, size_t m, int32_t *sym, size_t *k,
                       int *prev_unk) {
    const dt_bpe *v = h->bpe;
    int id = dt_bpe_token_find(v, c, m, dt_bpe_hash_bytes(c, m));
    if (id >= 0) {
        sym[(*k)++] = id;
        *prev_unk = 0;
    } else if (h->byte_fallback) {
        for (size_t b = 0; b < m; b++) sym[(*k)++] = v->byte_id[c[b]];
        *prev_unk = 0;
    } else if (h->unk >= 0) {
        if (!(h->fuse_unk && *prev_unk)) sym[(*k)++] = h->unk;
        *prev_unk = 1;
    }
}

/* SentencePiece BPE of one text segment: "▁" first when prepend, " " -> "▁", merges over the
 * whole segment, in runs ending at '\n' when no merge can join a '\n' to anything (nl_cut),
 * which bounds the scratch memory by the longest line. */
static int spm_text(const dt_hftok *h, dt_bpe_state *st, const uint8_t *s, size_t n, int prepend,
                    dt_ids *out) {
    int prev_unk = 0;
    for (size_t i = 0; i < n || prepend;) {
        const uint8_t *nl = h->nl_cut ? memchr(s + i, '\n', n - i) : NULL;
        size_t end = nl ? (size_t)(nl - s) + 1 : n, k = 0;
        int32_t *sym = dt_bpe_syms(st, end - i + 1);
        if (!sym) return -1;
        if (prepend) spm_symbol(h, METASPACE, 3, sym, &k, &prev_unk), prepend = 0;
        while (i < end) {
            uint32_t cp;
            size_t m = s[i] < 0x80 ? 1 : dt_bpe_utf8_decode(s + i, n - i, &cp);
            if (s[i] == ' ') spm_symbol(h, METASPACE, 3, sym, &k, &prev_unk);
            else spm_symbol(h, s + i, m, sym, &k, &prev_unk);
            i += m;
        }
        if (dt_bpe_merge_syms(st, k, out)) return -1;
    }
    return 0;
}

int dt_hftok_encode(const dt_hftok *h, dt_bpe_state *st, const char *text, size_t len,
                    int at_start, dt_ids *out) {
    uint8_t *copy;
    size_t n;
    const uint8_t *s = sanitize((const uint8_t *)text, len, &copy, &n);
    if (!s) return -1;
    int rc = 0;
    size_t seg = 0;
    for (size_t i = 0; rc == 0;) {
        int32_t id = -1;
        size_t l = i < n && h->n_added ? added_at(h, s, i, n, &id) : 0;
        if (i < n && !l) {
            i++;
            continue;
        }
        if (i > seg) { /* the text before the added token (or the end) */
            if (h->kind == DT_HF_BYTELEVEL) {
                rc = bytelevel_text(h, st, s + seg, i - seg, out);
            } else {
                int pre = (h->prepend == DT_HF_PREPEND_ALWAYS && (seg > 0 || at_start)) ||
                          (h->prepend == DT_HF_PREPEND_FIRST && seg == 0 && at_start);
                rc = spm_text(h, st, s + seg, i - seg, pre, out);
            }
        }
        if (i == n || rc) break;
        rc = push(out, id);
        seg = i += l;
    }
    free(copy);
    return rc;
}

size_t dt_hftok_next_split(const dt_hftok *h, const char *text, size_t len, size_t from) {
    const uint8_t *s = (const uint8_t *)text;
    if (!h->nl_cut) return len;
    if (h->kind == DT_HF_BYTELEVEL)
        return h->pre == DT_HF_PRE_LLAMA3 ? dt_bpe_next_split_llama3(s, len, from)
                                          : dt_bpe_next_split(s, len, from);
    /* SentencePiece: right after a '\n', which no merge joins (a run of spm_text ends there) */
    if (from < 1) from = 1;
    if (from > len) return len;
    const uint8_t *nl = memchr(s + from - 1, '\n', len - (from - 1));
    return nl && (size_t)(nl - s) + 1 < len ? (size_t)(nl - s) + 1 : len;
}

size_t dt_hftok_decode(const dt_hftok *h, const int32_t *ids, size_t n, int at_start, char *out) {
    const dt_bpe *v = h->bpe;
    int spm = h->kind == DT_HF_SENTENCEPIECE;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const uint8_t *b = v->blob + v->off[id];
        size_t l = v->len[id];
        if (!spm || h->added[id]) {
            if (out) memcpy(out + w, b, l);
            w += l;
        } else if (h->byte_of[id] >= 0) {
            if (out) out[w] = (char)h->byte_of[id];
            w++;
        } else {
            for (size_t k = 0; k < l;) {
                int meta = k + 3 <= l && !memcmp(b + k, METASPACE, 3);
                if (out) out[w] = meta ? ' ' : (char)b[k];
                w++;
                k += meta ? 3 : 1;
            }
        }
    }
    /* The decoder's Strip: the space the normalizer put before the text. */
    if (out && spm && at_start && h->prepend != DT_HF_PREPEND_NEVER && w > 0 && out[0] == ' ') {
        memmove(out, out + 1, w - 1);
        w--;
    }
    return w;
}
