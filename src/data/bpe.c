/* bpe.c - GPT-2 byte-level BPE: vocabulary loading, the pre-tokenizer, rank-ordered merging
 * and the per-thread piece cache. The behaviour to reproduce is the npm package
 * gpt-3-encoder 1.1.4 (the reference of tests/run_bpe_parity.sh), id for id. */
#include "data/bpe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/unicode_tables.h"

/* ------------------------------------------------------------------ byte alphabet */

/* GPT-2 writes every byte as a printable code point (its bytes_to_unicode): the printable
 * Latin-1 bytes stand for themselves, the 68 others move to U+0100.. in byte order. */
static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x121 + (b - 0x7F);
    return 0x143; /* 0xAD, the soft hyphen */
}

/* Inverse of byte_to_cp; -1 for a code point outside the 256-symbol alphabet. */
static int cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ------------------------------------------------------------ UTF-8 and classes */

/* Length of the strictly valid UTF-8 sequence (no overlong forms, surrogates or values past
 * U+10FFFF) at s[0..n), with its code point in *cp; 0 if s does not start with one. A
 * sequence never contains an ASCII byte and starts at a non-continuation byte, so a forward
 * decoder that takes invalid bytes one at a time is back in step after any ASCII byte. */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    uint32_t v;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0Fu;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07u;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    v = (v << 6) | (s[1] & 0x3Fu);
    for (size_t k = 2; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[k] & 0x3Fu);
    }
    *cp = v;
    return len;
}

/* The regex's classes: \p{L}, \p{N}, JS \s, and everything else ([^\s\p{L}\p{N}]). */
enum { CL_L, CL_N, CL_S, CL_P };

static inline int ascii_class(uint8_t c) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CL_L;
    if (c >= '0' && c <= '9') return CL_N;
    if (c == ' ' || (c >= 9 && c <= 13)) return CL_S;
    return CL_P;
}

static int in_ranges(const dt_uni_range *r, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp > r[mid].hi) lo = mid + 1;
        else if (cp < r[mid].lo) hi = mid;
        else return 1;
    }
    return 0;
}

static int cp_class(uint32_t cp) {
    if (cp < 0x80) return ascii_class((uint8_t)cp);
    if (in_ranges(dt_uni_letter, DT_UNI_LETTER_N, cp)) return CL_L;
    if (in_ranges(dt_uni_number, DT_UNI_NUMBER_N, cp)) return CL_N;
    if (in_ranges(dt_uni_space, DT_UNI_SPACE_N, cp)) return CL_S;
    return CL_P;
}

/* Class of the code point at s[i] (i < end); *next is the offset after it. Invalid UTF-8 is
 * kept byte by byte as CL_P (the reference would have seen U+FFFD, also CL_P, but a byte
 * tokenizer can keep the bytes, so decode(encode(x)) == x for any input). */
static inline int class_at(const uint8_t *s, size_t i, size_t end, size_t *next) {
    uint32_t cp;
    if (s[i] < 0x80) {
        *next = i + 1;
        return ascii_class(s[i]);
    }
    size_t m = utf8_decode(s + i, end - i, &cp);
    *next = i + (m ? m : 1);
    return m ? cp_class(cp) : CL_P;
}

/* Class of the code point that ends at s[end) as the forward decoder splits the text; s[end]
 * must be ASCII so that no sequence runs across it. */
static int class_ending_at(const uint8_t *s, size_t end) {
    size_t st = end - 1;
    uint32_t cp;
    if (s[st] < 0x80) return ascii_class(s[st]);
    while (st > 0 && end - st < 4 && (s[st] & 0xC0) == 0x80) st--;
    size_t m = utf8_decode(s + st, end - st, &cp);
    return m == end - st && m > 1 ? cp_class(cp) : CL_P;
}

/* ------------------------------------------------------------------ pre-tokenizer */

static size_t run_end(const uint8_t *s, size_t p, size_t end, int k) {
    size_t q;
    while (p < end && class_at(s, p, end, &q) == k) p = q;
    return p;
}

/* End of the piece starting at s[i] (i < end): the match at i of
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with JS semantics (first alternative that matches; the contractions are lower case only).
 * Every code point starts some alternative, so the matches tile the text. */
static size_t next_piece(const uint8_t *s, size_t i, size_t end) {
    size_t p, q;
    if (s[i] == '\'' && i + 1 < end) {
        uint8_t d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
        if (i + 2 < end && (((d == 'r' || d == 'v') && s[i + 2] == 'e') ||
                            (d == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    int k = class_at(s, i, end, &p);
    if (s[i] == ' ' && p < end) { /* " ?" takes the space when a non-space run follows */
        int k1 = class_at(s, p, end, &q);
        if (k1 != CL_S) k = k1, p = q;
    }
    if (k != CL_S) return run_end(s, p, end, k);
    /* \s+(?!\S) backs off one code point when non-space follows, unless the run is one
     * code point long: then \s+ takes it. */
    size_t last = i;
    while (p < end && class_at(s, p, end, &q) == CL_S) last = p, p = q;
    return (p == end || last == i) ? p : last;
}

size_t dt_bpe_piece_end(const uint8_t *text, size_t i, size_t len) {
    return next_piece(text, i, len);
}

/* Why these points are safe: let s[p-1] be one whitespace character other than ' ' with
 * non-whitespace on both sides. No alternative but the two \s+ ones can contain it (" ?"
 * takes only U+0020), and no whitespace match can reach back over the non-space before it,
 * so a piece starts at p-1; \s+(?!\S) fails there (one character, non-space follows) and
 * \s+ takes exactly it, so a piece starts at p. Cut at p, the left text ends with that lone
 * character, which \s+(?!\S) now takes alone, and no earlier match looked past p-1 (every
 * attempt reading s[p-1] fails on it). The right text is scanned from a piece start with no
 * lookbehind. A single '\n' between lines is the common case; after a run of two or more
 * whitespace characters the lookahead makes the cut unsafe. */
size_t dt_bpe_next_split(const uint8_t *s, size_t len, size_t from) {
    size_t q;
    for (size_t p = from < 2 ? 2 : from; p < len; p++) {
        if (s[p - 1] < 9 || s[p - 1] > 13) continue;
        if (class_at(s, p, len, &q) != CL_S && class_ending_at(s, p - 1) != CL_S) return p;
    }
    return len;
}

/* ------------------------------------------------------------------ vocabulary */

#define MERGE_EMPTY UINT64_MAX

struct dt_bpe {
    int n;              /* tokens */
    int eot;            /* id of "<|endoftext|>" or -1 */
    uint8_t *blob;      /* the bytes of all tokens */
    uint32_t *off, *len; /* (n) where token id's bytes are in blob */
    uint8_t *self;      /* (n) 1 if merging the token's own bytes gives just the token */
    int32_t byte_id[256];
    int32_t *tslot;     /* open addressing over token bytes: id, or -1 when empty */
    size_t tmask;
    uint64_t *mkey;     /* merges: (first id << 32 | second id), or MERGE_EMPTY */
    uint32_t *mrank;    /* rank = order in vocab.bpe */
    int32_t *mres;      /* id of the merged token */
    size_t mmask;
};

int dt_bpe_vocab(const dt_bpe *v) { return v->n; }
int dt_bpe_eot(const dt_bpe *v) { return v->eot; }

const uint8_t *dt_bpe_token(const dt_bpe *v, int id, size_t *len) {
    *len = v->len[id];
    return v->blob + v->off[id];
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w);
}

static size_t pow2_at_least(size_t x) {
    size_t c = 16;
    while (c < x) c *= 2;
    return c;
}

/* Id of the token with bytes b[0..n) (h = hash_bytes(b, n)), or -1. */
static int token_find(const dt_bpe *v, const uint8_t *b, size_t n, uint64_t h) {
    for (size_t i = h & v->tmask;; i = (i + 1) & v->tmask) {
        int32_t id = v->tslot[i];
        if (id < 0) return -1;
        if (v->len[id] == n && memcmp(v->blob + v->off[id], b, n) == 0) return id;
    }
}

static inline int merge_find(const dt_bpe *v, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *res) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = mix64(key) & v->mmask;; i = (i + 1) & v->mmask) {
        if (v->mkey[i] == key) {
            *rank = v->mrank[i];
            *res = v->mres[i];
            return 1;
        }
        if (v->mkey[i] == MERGE_EMPTY) return 0;
    }
}

/* ------------------------------------------------------------------ encoder state */

typedef struct cache_slot {
    uint64_t h;
    uint32_t koff, klen; /* klen 0: empty (one-byte pieces are never cached) */
    uint32_t voff, vlen;
} cache_slot;

/* Pieces longer than this are rare and would only fill the cache. */
#define CACHE_MAX_PIECE 256
/* The cache starts over past this many keys or bytes of keys: memory stays bounded on
 * huge inputs whose vocabulary of pieces keeps growing. */
#define CACHE_MAX_ENTRIES (1u << 20)
#define CACHE_MAX_KEY_BYTES (32u << 20)

struct dt_bpe_state {
    const dt_bpe *v;
    /* merge scratch for one piece, `cap` symbols */
    int32_t *sym, *nxt, *prv, *merged;
    uint64_t *heap; /* 3 * cap: (rank << 32 | left node) */
    size_t cap;
    /* piece -> ids cache */
    cache_slot *slots;
    size_t nslots, nused;
    uint8_t *kbuf;
    size_t klen, kcap;
    int32_t *vbuf;
    size_t vlen, vcap;
};

dt_bpe_state *dt_bpe_state_new(const dt_bpe *v) {
    dt_bpe_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->v = v;
    return st;
}

void dt_bpe_state_free(dt_bpe_state *st) {
    if (!st) return;
    free(st->sym), free(st->nxt), free(st->prv), free(st->merged), free(st->heap);
    free(st->slots), free(st->kbuf), free(st->vbuf);
    free(st);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static inline int ids_push(dt_ids *out, int32_t id) {
    if (out->n == out->cap && grow((void **)&out->v, &out->cap, out->n + 1, sizeof(int32_t)))
        return -1;
    out->v[out->n++] = id;
    return 0;
}

static int scratch_reserve(dt_bpe_state *st, size_t n) {
    if (n <= st->cap) return 0;
    size_t c = pow2_at_least(n);
    int32_t *a = realloc(st->sym, c * sizeof *a);
    if (a) st->sym = a;
    int32_t *b = realloc(st->nxt, c * sizeof *b);
    if (b) st->nxt = b;
    int32_t *d = realloc(st->prv, c * sizeof *d);
    if (d) st->prv = d;
    int32_t *e = realloc(st->merged, c * sizeof *e);
    if (e) st->merged = e;
    uint64_t *h = realloc(st->heap, 3 * c * sizeof *h);
    if (h) st->heap = h;
    if (!a || !b || !d || !e || !h) return -1;
    st->cap = c;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t x) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > x) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], x = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static void push_pair(const dt_bpe_state *st, uint64_t *heap, size_t *nh, int32_t left) {
    uint32_t rank;
    int32_t res;
    int32_t right = st->nxt[left];
    if (right >= 0 && merge_find(st->v, st->sym[left], st->sym[right], &rank, &res))
        heap_push(heap, nh, (uint64_t)rank << 32 | (uint32_t)left);
}

/* BPE of one piece, appended to out. The reference repeatedly takes the lowest-ranked
 * adjacent pair and merges all its occurrences left to right in one pass; a heap keyed by
 * (rank, position) does the same in O(n log n): one round pops every entry of the lowest
 * rank in text order, and the pairs that round creates enter the heap only after it, as in
 * the reference's next pass. Entries made stale by earlier merges are recognised because a
 * rank names exactly one pair. */
static int bpe_merge(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out) {
    if (scratch_reserve(st, n)) return -1;
    int32_t *sym = st->sym, *nxt = st->nxt, *prv = st->prv;
    uint64_t *heap = st->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = st->v->byte_id[b[i]];
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(st, heap, &nh, (int32_t)i);
    while (nh > 0) {
        uint32_t r = (uint32_t)(heap[0] >> 32), r2;
        size_t nm = 0;
        while (nh > 0 && (uint32_t)(heap[0] >> 32) == r) {
            int32_t i = (int32_t)(uint32_t)heap_pop(heap, &nh), j, res;
            if (sym[i] < 0 || (j = nxt[i]) < 0) continue;
            if (!merge_find(st->v, sym[i], sym[j], &r2, &res) || r2 != r) continue;
            sym[i] = res;
            sym[j] = -1;
            nxt[i] = nxt[j];
            if (nxt[j] >= 0) prv[nxt[j]] = i;
            st->merged[nm++] = i;
        }
        for (size_t k = 0; k < nm; k++) {
            int32_t i = st->merged[k];
            if (prv[i] >= 0) push_pair(st, heap, &nh, prv[i]);
            push_pair(st, heap, &nh, i);
        }
    }
    for (int32_t i = 0; i >= 0; i = nxt[i]) /* node 0 is never merged away */
        if (ids_push(out, sym[i])) return -1;
    return 0;
}

static const cache_slot *cache_find(const dt_bpe_state *st, const uint8_t *b, size_t n,
                                    uint64_t h) {
    if (!st->nslots) return NULL;
    for (size_t i = h & (st->nslots - 1);; i = (i + 1) & (st->nslots - 1)) {
        const cache_slot *c = &st->slots[i];
        if (!c->klen) return NULL;
        if (c->h == h && c->klen == n && memcmp(st->kbuf + c->koff, b, n) == 0) return c;
    }
}

static void cache_clear(dt_bpe_state *st) {
    if (st->slots) memset(st->slots, 0, st->nslots * sizeof *st->slots);
    st->nused = st->klen = st->vlen = 0;
}

/* Best effort: when memory is short the piece is simply not cached. */
static void cache_put(dt_bpe_state *st, const uint8_t *b, size_t n, uint64_t h,
                      const int32_t *ids, size_t nids) {
    if (st->nused + 1 > CACHE_MAX_ENTRIES || st->klen + n > CACHE_MAX_KEY_BYTES) cache_clear(st);
    if (2 * (st->nused + 1) > st->nslots) {
        size_t ns = st->nslots ? 2 * st->nslots : 4096;
        /* Not calloc: its untouched pages would map the zero page on our first read, and
         * the later write's copy-on-write fault flushes the TLB of every thread. */
        cache_slot *s = malloc(ns * sizeof *s);
        if (!s) return;
        memset(s, 0, ns * sizeof *s);
        for (size_t k = 0; k < st->nslots; k++) {
            if (!st->slots[k].klen) continue;
            size_t i = st->slots[k].h & (ns - 1);
            while (s[i].klen) i = (i + 1) & (ns - 1);
            s[i] = st->slots[k];
        }
        free(st->slots);
        st->slots = s;
        st->nslots = ns;
    }
    if (grow((void **)&st->kbuf, &st->kcap, st->klen + n, 1) ||
        grow((void **)&st->vbuf, &st->vcap, st->vlen + nids, sizeof(int32_t)))
        return;
    size_t i = h & (st->nslots - 1);
    while (st->slots[i].klen) i = (i + 1) & (st->nslots - 1);
    st->slots[i] = (cache_slot){h, (uint32_t)st->klen, (uint32_t)n, (uint32_t)st->vlen,
                                (uint32_t)nids};
    memcpy(st->kbuf + st->klen, b, n);
    memcpy(st->vbuf + st->vlen, ids, nids * sizeof *ids);
    st->klen += n;
    st->vlen += nids;
    st->nused++;
}

static int encode_piece(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out) {
    const dt_bpe *v = st->v;
    if (n == 1) return ids_push(out, v->byte_id[b[0]]);
    uint64_t h = hash_bytes(b, n);
    int id = token_find(v, b, n, h);
    if (id >= 0 && v->self[id]) return ids_push(out, id); /* most pieces: a whole token */
    const cache_slot *c = n <= CACHE_MAX_PIECE ? cache_find(st, b, n, h) : NULL;
    if (c) {
        if (grow((void **)&out->v, &out->cap, out->n + c->vlen, sizeof(int32_t))) return -1;
        memcpy(out->v + out->n, st->vbuf + c->voff, c->vlen * sizeof(int32_t));
        out->n += c->vlen;
        return 0;
    }
    size_t n0 = out->n;
    if (bpe_merge(st, b, n, out)) return -1;
    if (n <= CACHE_MAX_PIECE) cache_put(st, b, n, h, out->v + n0, out->n - n0);
    return 0;
}

int dt_bpe_encode(dt_bpe_state *st, const uint8_t *text, size_t len, dt_ids *out) {
    /* A piece of k bytes gives at most k ids: with cap - n >= len this never reallocates. */
    if (grow((void **)&out->v, &out->cap, out->n + (len ? len / 4 + 1 : 0), sizeof(int32_t)))
        return -1;
    for (size_t i = 0; i < len;) {
        size_t j = next_piece(text, i, len);
        if (encode_piece(st, text + i, j - i, out)) return -1;
        i = j;
    }
    return 0;
}

/* ------------------------------------------------------------------ loading */

static dt_status read_file(dt_ctx *ctx, const char *path, uint8_t **buf, size_t *n) {
    dt_status st = DT_OK;
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
    }
    if (!(*buf = malloc((size_t)size + 1))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate %ld bytes", path, size);
        goto fail;
    }
    if (fread(*buf, 1, (size_t)size, f) != (size_t)size || ferror(f)) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot read: %s", path,
                     errno ? strerror(errno) : "short read");
        goto fail;
    }
    (*buf)[size] = 0;
    *n = (size_t)size;
    fclose(f);
    return DT_OK;
fail:
    free(*buf);
    *buf = NULL;
    fclose(f);
    return st;
}

static int line_of(const uint8_t *s, size_t i) {
    int line = 1;
    for (size_t k = 0; k < i; k++) line += s[k] == '\n';
    return line;
}

/* A token as it is written in the files (its bytes mapped to the alphabet), shortened, for
 * messages. */
static const char *show(char *buf, size_t cap, const uint8_t *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_to_cp(b[i]);
        if (k + 6 > cap) { /* keeps room for "..." and the NUL */
            memcpy(buf + k, "...", 3);
            k += 3;
            break;
        }
        if (cp < 0x80) {
            buf[k++] = (char)cp;
        } else { /* the alphabet stays below U+0800: two bytes */
            buf[k++] = (char)(0xC0 | (cp >> 6));
            buf[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    buf[k] = 0;
    return buf;
}

typedef struct jparse {
    dt_ctx *ctx;
    const char *path;
    const uint8_t *s;
    size_t n, i;
} jparse;

static dt_status jfail(const jparse *p, const char *what) {
    size_t col = 1;
    for (size_t k = p->i; k > 0 && p->s[k - 1] != '\n'; k--) col++;
    return dt_fail(p->ctx, DT_ERR_FORMAT, "%s: not valid JSON: %s at line %d, column %zu",
                   p->path, what, line_of(p->s, p->i), col);
}

static void jws(jparse *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int jhex4(jparse *p, uint32_t *v) {
    *v = 0;
    if (p->n - p->i < 4) return -1;
    for (int k = 0; k < 4; k++) {
        uint8_t c = p->s[p->i++];
        int d = c >= '0' && c <= '9' ? c - '0'
              : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

#define NO_CP UINT32_MAX

/* Parses the string at p->i (a '"') and writes the bytes its code points stand for to dst;
 * *bad gets the first code point outside the alphabet, or NO_CP. */
static dt_status jstring(jparse *p, uint8_t *dst, size_t *dlen, uint32_t *bad) {
    size_t k = 0;
    *bad = NO_CP;
    p->i++;
    for (;;) {
        uint32_t cp;
        if (p->i >= p->n) return jfail(p, "unterminated string");
        uint8_t c = p->s[p->i];
        if (c == '"') break;
        if (c < 0x20) return jfail(p, "control character in a string");
        if (c == '\\') {
            if (p->i + 1 >= p->n) return jfail(p, "unterminated string");
            uint8_t e = p->s[p->i + 1];
            p->i += 2;
            switch (e) {
            case '"': case '\\': case '/': cp = e; break;
            case 'b': cp = 8; break;
            case 'f': cp = 12; break;
            case 'n': cp = 10; break;
            case 'r': cp = 13; break;
            case 't': cp = 9; break;
            case 'u': {
                uint32_t lo;
                if (jhex4(p, &cp)) return jfail(p, "bad \\u escape");
                /* A surrogate pair is one code point; a lone surrogate is left as it is and
                 * refused below, as no byte stands for it. */
                if (cp >= 0xD800 && cp <= 0xDBFF && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
                    p->s[p->i + 1] == 'u') {
                    size_t save = p->i;
                    p->i += 2;
                    if (jhex4(p, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF)
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    else
                        p->i = save;
                }
                break;
            }
            default: p->i -= 2; return jfail(p, "bad escape");
            }
        } else {
            size_t m = utf8_decode(p->s + p->i, p->n - p->i, &cp);
            if (!m) return jfail(p, "invalid UTF-8");
            p->i += m;
        }
        int b = cp_to_byte(cp);
        if (b < 0) {
            if (*bad == NO_CP) *bad = cp;
        } else {
            dst[k++] = (uint8_t)b;
        }
    }
    p->i++;
    *dlen = k;
    return DT_OK;
}

/* A JSON number at p->i, as a double. */
static dt_status jnumber(jparse *p, double *val) {
    const uint8_t *s = p->s;
    size_t i = p->i, st = i;
#define DIGIT(k) ((k) < p->n && s[k] >= '0' && s[k] <= '9')
    if (i < p->n && s[i] == '-') i++;
    if (i < p->n && s[i] == '0') i++;
    else if (DIGIT(i)) while (DIGIT(i)) i++;
    else return jfail(p, "bad number");
    if (i < p->n && s[i] == '.') {
        if (!DIGIT(i + 1)) return p->i = i, jfail(p, "bad number");
        for (i++; DIGIT(i); i++) {}
    }
    if (i < p->n && (s[i] | 0x20) == 'e') {
        i++;
        if (i < p->n && (s[i] == '+' || s[i] == '-')) i++;
        if (!DIGIT(i)) return p->i = i, jfail(p, "bad number");
        while (DIGIT(i)) i++;
    }
#undef DIGIT
    char tmp[64];
    if (i - st >= sizeof tmp) {
        *val = HUGE_VAL; /* far out of any id range, and not worth parsing */
    } else {
        memcpy(tmp, s + st, i - st);
        tmp[i - st] = 0;
        *val = strtod(tmp, NULL);
    }
    p->i = i;
    return DT_OK;
}

typedef struct jentry {
    size_t at;          /* offset of the key in the file, for messages */
    uint32_t off, len;  /* token bytes in the blob */
    int32_t id;
} jentry;

/* Parses encoder.json ({"token": id, ...}) into v->blob and the entries, in file order. */
static dt_status parse_encoder(jparse *p, dt_bpe *v, jentry **out, size_t *nout) {
    dt_ctx *ctx = p->ctx; /* for DT_CHECK_GOTO */
    dt_status st = DT_OK;
    jentry *e = NULL;
    size_t ne = 0, cap = 0, blen = 0;
    char tb[64];
    if (!(v->blob = malloc(p->n + 1)))
        return dt_fail(p->ctx, DT_ERR_NOMEM, "%s: cannot allocate %zu bytes", p->path, p->n);
    jws(p);
    if (p->i >= p->n) return jfail(p, "empty file");
    if (p->s[p->i] != '{') {
        if (p->s[p->i] && strchr("[\"-0123456789tfn", p->s[p->i]))
            return dt_fail(p->ctx, DT_ERR_FORMAT,
                           "%s: not a JSON object of token -> id (the top-level value is %s)",
                           p->path, p->s[p->i] == '[' ? "an array" : "not an object");
        return jfail(p, "unexpected character");
    }
    p->i++;
    jws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
    } else {
        for (;;) {
            size_t at = p->i, klen = 0;
            uint32_t bad;
            double val = NAN;
            jws(p);
            if (p->i >= p->n || p->s[p->i] != '"') {
                st = jfail(p, "expected a string key");
                goto fail;
            }
            at = p->i;
            DT_CHECK_GOTO(jstring(p, v->blob + blen, &klen, &bad));
            if (bad != NO_CP) {
                st = dt_fail(p->ctx, DT_ERR_FORMAT,
                             "%s: the token at line %d contains U+%04X, which is not one of "
                             "the 256 GPT-2 byte symbols", p->path, line_of(p->s, at), bad);
                goto fail;
            }
            jws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                st = jfail(p, "expected ':'");
                goto fail;
            }
            p->i++;
            jws(p);
            if (p->i < p->n && (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))) {
                DT_CHECK_GOTO(jnumber(p, &val));
            } else if (p->i < p->n && p->s[p->i] && strchr("\"{[tfn", p->s[p->i])) {
                val = NAN;
            } else {
                st = jfail(p, "expected a value");
                goto fail;
            }
            if (val != floor(val)) { /* also NaN: a string, object, array, bool or null */
                st = dt_fail(p->ctx, DT_ERR_FORMAT,
                             "%s: the id of token \"%s\" (line %d) is not an integer", p->path,
                             show(tb, sizeof tb, v->blob + blen, klen), line_of(p->s, at));
                goto fail;
            }
            if (val < 0 || val > INT32_MAX) {
                st = dt_fail(p->ctx, DT_ERR_FORMAT,
                             "%s: the id %.0f of token \"%s\" (line %d) is out of range", p->path,
                             val, show(tb, sizeof tb, v->blob + blen, klen), line_of(p->s, at));
                goto fail;
            }
            if (klen == 0) {
                st = dt_fail(p->ctx, DT_ERR_FORMAT, "%s: the token at line %d is empty",
                             p->path, line_of(p->s, at));
                goto fail;
            }
            if (ne == cap && grow((void **)&e, &cap, ne + 1, sizeof *e)) {
                st = dt_fail(p->ctx, DT_ERR_NOMEM, "%s: out of memory", p->path);
                goto fail;
            }
            e[ne++] = (jentry){at, (uint32_t)blen, (uint32_t)klen, (int32_t)val};
            blen += klen;
            jws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                break;
            }
            st = jfail(p, "expected ',' or '}'");
            goto fail;
        }
    }
    jws(p);
    if (p->i != p->n) {
        st = jfail(p, "text after the object");
        goto fail;
    }
    if (ne == 0) {
        st = dt_fail(p->ctx, DT_ERR_FORMAT, "%s: the object has no tokens", p->path);
        goto fail;
    }
    *out = e;
    *nout = ne;
    return DT_OK;
fail:
    free(e);
    return st;
}

/* Ids, the token hash, the byte tokens and "<|endoftext|>" from the parsed entries. */
static dt_status index_tokens(dt_ctx *ctx, const char *path, const uint8_t *file, dt_bpe *v,
                              const jentry *e, size_t ne) {
    char t1[64], t2[64];
    if (ne > INT32_MAX) return dt_fail(ctx, DT_ERR_FORMAT, "%s: too many tokens", path);
    v->n = (int)ne;
    v->off = malloc(ne * sizeof *v->off);
    v->len = malloc(ne * sizeof *v->len);
    v->self = calloc(ne, 1);
    v->tmask = pow2_at_least(2 * ne) - 1;
    v->tslot = malloc((v->tmask + 1) * sizeof *v->tslot);
    int32_t *who = malloc(ne * sizeof *who); /* id -> entry */
    dt_status st = DT_OK;
    if (!v->off || !v->len || !v->self || !v->tslot || !who) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory for %zu tokens", path, ne);
        goto done;
    }
    memset(who, 0xff, ne * sizeof *who);
    memset(v->tslot, 0xff, (v->tmask + 1) * sizeof *v->tslot);
    for (size_t k = 0; k < ne; k++) {
        const jentry *x = &e[k];
        if ((size_t)x->id >= ne) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: the id %d of token \"%s\" (line %d) is out of range 0..%zu",
                         path, x->id, show(t1, sizeof t1, v->blob + x->off, x->len),
                         line_of(file, x->at), ne - 1);
            goto done;
        }
        if (who[x->id] >= 0) {
            const jentry *y = &e[who[x->id]];
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: duplicate id %d: tokens \"%s\" (line %d) and \"%s\" (line %d)",
                         path, x->id, show(t1, sizeof t1, v->blob + y->off, y->len),
                         line_of(file, y->at), show(t2, sizeof t2, v->blob + x->off, x->len),
                         line_of(file, x->at));
            goto done;
        }
        who[x->id] = (int32_t)k;
        v->off[x->id] = x->off;
        v->len[x->id] = x->len;
        uint64_t h = hash_bytes(v->blob + x->off, x->len);
        int old = token_find(v, v->blob + x->off, x->len, h);
        if (old >= 0) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: token \"%s\" appears twice (lines %d and %d)",
                         path, show(t1, sizeof t1, v->blob + x->off, x->len),
                         line_of(file, e[who[old]].at), line_of(file, x->at));
            goto done;
        }
        size_t i = h & v->tmask;
        while (v->tslot[i] >= 0) i = (i + 1) & v->tmask;
        v->tslot[i] = x->id;
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        v->byte_id[b] = token_find(v, &byte, 1, hash_bytes(&byte, 1));
        if (v->byte_id[b] < 0) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: no token for byte 0x%02X (\"%s\")", path, b,
                         show(t1, sizeof t1, &byte, 1));
            goto done;
        }
        v->self[v->byte_id[b]] = 1;
    }
    static const char eot[] = "<|endoftext|>";
    v->eot = token_find(v, (const uint8_t *)eot, sizeof eot - 1,
                        hash_bytes((const uint8_t *)eot, sizeof eot - 1));
done:
    free(who);
    return st;
}

/* One merge part: the bytes its code points stand for, looked up in the encoder. */
static int merge_part(const dt_bpe *v, const uint8_t *s, size_t n, uint8_t *bytes,
                      size_t *nb) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t m = utf8_decode(s + i, n - i, &cp);
        int b = m ? cp_to_byte(cp) : -1;
        if (b < 0) return -1;
        bytes[k++] = (uint8_t)b;
        i += m;
    }
    *nb = k;
    return token_find(v, bytes, k, hash_bytes(bytes, k));
}

static int is_blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* vocab.bpe: a "#version" line, then one merge "a b" per line; rank = order. */
static dt_status parse_merges(dt_ctx *ctx, const char *path, const char *enc_path,
                              const uint8_t *s, size_t n, dt_bpe *v) {
    char t1[64], t2[64];
    size_t nlines = 1;
    for (size_t i = 0; i < n; i++) nlines += s[i] == '\n';
    v->mmask = pow2_at_least(2 * nlines) - 1;
    v->mkey = malloc((v->mmask + 1) * sizeof *v->mkey);
    v->mrank = malloc((v->mmask + 1) * sizeof *v->mrank);
    v->mres = malloc((v->mmask + 1) * sizeof *v->mres);
    uint8_t *buf = malloc(2 * n + 2); /* two parts' bytes, then the pair's bytes */
    dt_status st = DT_OK;
    if (!v->mkey || !v->mrank || !v->mres || !buf) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memset(v->mkey, 0xff, (v->mmask + 1) * sizeof *v->mkey);
    if (n == 0 || s[0] != '#') {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: line 1 is not the \"#version\" header", path);
        goto done;
    }
    size_t i = 0;
    while (i < n && s[i] != '\n') i++;
    for (int line = 2; i < n; line++) {
        size_t a = i + 1, e = a;
        while (e < n && s[e] != '\n') e++;
        i = e;
        if (a == n) break; /* the final newline */
        size_t ps[3], pe[3], np = 0;
        for (size_t k = a; k < e;) {
            while (k < e && is_blank(s[k])) k++;
            if (k == e) break;
            if (np < 3) ps[np] = k;
            while (k < e && !is_blank(s[k])) k++;
            if (np < 3) pe[np] = k;
            np++;
        }
        if (np != 2) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: line %d: a merge must be two tokens separated by a space "
                         "(this line has %zu)", path, line, np);
            goto done;
        }
        size_t na, nb;
        int ida = merge_part(v, s + ps[0], pe[0] - ps[0], buf, &na);
        int idb = merge_part(v, s + ps[1], pe[1] - ps[1], buf + na, &nb);
        for (int k = 0; k < 2; k++) {
            if ((k == 0 ? ida : idb) >= 0) continue;
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: line %d: \"%.*s\" is not a token of %s", path,
                         line, (int)(pe[k] - ps[k] > 48 ? 48 : pe[k] - ps[k]), s + ps[k],
                         enc_path);
            goto done;
        }
        int idr = token_find(v, buf, na + nb, hash_bytes(buf, na + nb));
        if (idr < 0) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: line %d: the merged token \"%s\" is not a token of %s", path,
                         line, show(t1, sizeof t1, buf, na + nb), enc_path);
            goto done;
        }
        uint32_t rank;
        int32_t res;
        if (merge_find(v, ida, idb, &rank, &res)) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: line %d: merge \"%s %s\" repeats line %u",
                         path, line, show(t1, sizeof t1, buf, na),
                         show(t2, sizeof t2, buf + na, nb), rank + 2);
            goto done;
        }
        uint64_t key = (uint64_t)(uint32_t)ida << 32 | (uint32_t)idb;
        size_t h = mix64(key) & v->mmask;
        while (v->mkey[h] != MERGE_EMPTY) h = (h + 1) & v->mmask;
        v->mkey[h] = key;
        v->mrank[h] = (uint32_t)(line - 2);
        v->mres[h] = idr;
    }
done:
    free(buf);
    return st;
}

/* self[id]: does merging the token's own bytes give back just the token? Then a piece equal
 * to a token is that token without running BPE (not always so: "<|endoftext|>" is not). */
static dt_status mark_self_tokens(dt_ctx *ctx, dt_bpe *v) {
    dt_bpe_state *st = dt_bpe_state_new(v);
    dt_ids ids = {0};
    dt_status s = DT_OK;
    for (int id = 0; st && id < v->n; id++) {
        if (v->len[id] < 2) continue;
        ids.n = 0;
        if (bpe_merge(st, v->blob + v->off[id], v->len[id], &ids)) goto nomem;
        v->self[id] = ids.n == 1 && ids.v[0] == id;
    }
    if (!st) goto nomem;
    goto done;
nomem:
    s = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(ids.v);
    dt_bpe_state_free(st);
    return s;
}

dt_status dt_bpe_load(dt_ctx *ctx, const char *encoder_json, const char *vocab_bpe,
                      dt_bpe **out) {
    dt_status st = DT_OK;
    uint8_t *ej = NULL, *vb = NULL;
    size_t nej = 0, nvb = 0, ne = 0;
    jentry *e = NULL;
    *out = NULL;
    dt_bpe *v = calloc(1, sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
    DT_CHECK_GOTO(read_file(ctx, encoder_json, &ej, &nej));
    jparse p = {ctx, encoder_json, ej, nej, 0};
    DT_CHECK_GOTO(parse_encoder(&p, v, &e, &ne));
    DT_CHECK_GOTO(index_tokens(ctx, encoder_json, ej, v, e, ne));
    DT_CHECK_GOTO(read_file(ctx, vocab_bpe, &vb, &nvb));
    DT_CHECK_GOTO(parse_merges(ctx, vocab_bpe, encoder_json, vb, nvb, v));
    DT_CHECK_GOTO(mark_self_tokens(ctx, v));
    *out = v;
    v = NULL;
fail:
    free(e);
    free(ej);
    free(vb);
    dt_bpe_free(v);
    return st;
}

void dt_bpe_free(dt_bpe *v) {
    if (!v) return;
    free(v->blob), free(v->off), free(v->len), free(v->self), free(v->tslot);
    free(v->mkey), free(v->mrank), free(v->mres);
    free(v);
}
