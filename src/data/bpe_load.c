/* bpe_load.c - loads and validates OpenAI's encoder.json (through a small JSON parser) and
 * vocab.bpe into the BPE tables of bpe.h; the encoder is bpe.c. */
#include "data/bpe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int dt_bpe_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ------------------------------------------------------------------ loading */

dt_status dt_bpe_read_file(dt_ctx *ctx, const char *path, uint8_t **buf, size_t *n) {
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
            size_t m = dt_bpe_utf8_decode(p->s + p->i, p->n - p->i, &cp);
            if (!m) return jfail(p, "invalid UTF-8");
            p->i += m;
        }
        int b = dt_bpe_cp_to_byte(cp);
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
            if (ne == cap && dt_bpe_grow((void **)&e, &cap, ne + 1, sizeof *e)) {
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
    v->tmask = dt_bpe_pow2_at_least(2 * ne) - 1;
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
        uint64_t h = dt_bpe_hash_bytes(v->blob + x->off, x->len);
        int old = dt_bpe_token_find(v, v->blob + x->off, x->len, h);
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
        v->byte_id[b] = dt_bpe_token_find(v, &byte, 1, dt_bpe_hash_bytes(&byte, 1));
        if (v->byte_id[b] < 0) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: no token for byte 0x%02X (\"%s\")", path, b,
                         show(t1, sizeof t1, &byte, 1));
            goto done;
        }
        v->self[v->byte_id[b]] = 1;
    }
    static const char eot[] = "<|endoftext|>";
    v->eot = dt_bpe_token_find(v, (const uint8_t *)eot, sizeof eot - 1,
                               dt_bpe_hash_bytes((const uint8_t *)eot, sizeof eot - 1));
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
        size_t m = dt_bpe_utf8_decode(s + i, n - i, &cp);
        int b = m ? dt_bpe_cp_to_byte(cp) : -1;
        if (b < 0) return -1;
        bytes[k++] = (uint8_t)b;
        i += m;
    }
    *nb = k;
    return dt_bpe_token_find(v, bytes, k, dt_bpe_hash_bytes(bytes, k));
}

static int is_blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* vocab.bpe: a "#version" line, then one merge "a b" per line; rank = order. */
static dt_status parse_merges(dt_ctx *ctx, const char *path, const char *enc_path,
                              const uint8_t *s, size_t n, dt_bpe *v) {
    char t1[64], t2[64];
    size_t nlines = 1;
    for (size_t i = 0; i < n; i++) nlines += s[i] == '\n';
    uint8_t *buf = malloc(2 * n + 2); /* two parts' bytes, then the pair's bytes */
    dt_status st = DT_OK;
    if (dt_bpe_merges_alloc(v, nlines) || !buf) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
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
        int idr = dt_bpe_token_find(v, buf, na + nb, dt_bpe_hash_bytes(buf, na + nb));
        if (idr < 0) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: line %d: the merged token \"%s\" is not a token of %s", path,
                         line, show(t1, sizeof t1, buf, na + nb), enc_path);
            goto done;
        }
        uint32_t rank;
        int32_t res;
        if (dt_bpe_merge_find(v, ida, idb, &rank, &res)) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: line %d: merge \"%s %s\" repeats line %u",
                         path, line, show(t1, sizeof t1, buf, na),
                         show(t2, sizeof t2, buf + na, nb), rank + 2);
            goto done;
        }
        dt_bpe_merge_add(v, ida, idb, idr, (uint32_t)(line - 2), &rank);
    }
done:
    free(buf);
    return st;
}

int dt_bpe_merges_alloc(dt_bpe *v, size_t n) {
    v->mmask = dt_bpe_pow2_at_least(2 * n) - 1;
    v->mkey = malloc((v->mmask + 1) * sizeof *v->mkey);
    v->mrank = malloc((v->mmask + 1) * sizeof *v->mrank);
    v->mres = malloc((v->mmask + 1) * sizeof *v->mres);
    if (!v->mkey || !v->mrank || !v->mres) return -1;
    memset(v->mkey, 0xff, (v->mmask + 1) * sizeof *v->mkey);
    return 0;
}

int dt_bpe_merge_add(dt_bpe *v, int32_t a, int32_t b, int32_t res, uint32_t rank,
                     uint32_t *old_rank) {
    int32_t old_res;
    if (dt_bpe_merge_find(v, a, b, old_rank, &old_res)) return 1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = dt_bpe_mix64(key) & v->mmask;
    while (v->mkey[h] != DT_BPE_MERGE_EMPTY) h = (h + 1) & v->mmask;
    v->mkey[h] = key;
    v->mrank[h] = rank;
    v->mres[h] = res;
    return 0;
}

int dt_bpe_index_tokens(dt_bpe *v, const uint8_t *skip, int *dup, int *first) {
    *dup = *first = -1;
    v->tmask = dt_bpe_pow2_at_least(2 * (size_t)v->n) - 1;
    if (!(v->tslot = malloc((v->tmask + 1) * sizeof *v->tslot))) return -1;
    memset(v->tslot, 0xff, (v->tmask + 1) * sizeof *v->tslot);
    for (int id = 0; id < v->n; id++) {
        if (skip && skip[id]) continue;
        const uint8_t *b = v->blob + v->off[id];
        uint64_t h = dt_bpe_hash_bytes(b, v->len[id]);
        int old = dt_bpe_token_find(v, b, v->len[id], h);
        if (old >= 0) {
            *dup = id, *first = old;
            return 0;
        }
        size_t i = h & v->tmask;
        while (v->tslot[i] >= 0) i = (i + 1) & v->tmask;
        v->tslot[i] = id;
    }
    return 0;
}

/* self[id]: does merging the token's own bytes give back just the token? Then a piece equal
 * to a token is that token without running BPE (not always so: "<|endoftext|>" is not). */
dt_status dt_bpe_mark_self(dt_ctx *ctx, dt_bpe *v) {
    dt_bpe_state *st = dt_bpe_state_new(v);
    dt_ids ids = {0};
    dt_status s = DT_OK;
    for (int id = 0; st && id < v->n; id++) {
        if (v->len[id] < 2) continue;
        ids.n = 0;
        if (dt_bpe_merge(st, v->blob + v->off[id], v->len[id], &ids)) goto nomem;
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
    DT_CHECK_GOTO(dt_bpe_read_file(ctx, encoder_json, &ej, &nej));
    jparse p = {ctx, encoder_json, ej, nej, 0};
    DT_CHECK_GOTO(parse_encoder(&p, v, &e, &ne));
    DT_CHECK_GOTO(index_tokens(ctx, encoder_json, ej, v, e, ne));
    DT_CHECK_GOTO(dt_bpe_read_file(ctx, vocab_bpe, &vb, &nvb));
    DT_CHECK_GOTO(parse_merges(ctx, vocab_bpe, encoder_json, vb, nvb, v));
    DT_CHECK_GOTO(dt_bpe_mark_self(ctx, v));
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
