/* tokenizer.c - the dt_tokenizer handle: the byte tokenizer, the GPT-2 BPE of bpe.c and the
 * tokenizer.json models of hftok.c, with their parallel driver. */
#include "data/tokenizer.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "data/hftok.h"

struct dt_tokenizer {
    const char *name;
    dt_bpe *bpe;  /* the vocabulary (GPT-2's, or hf's tables); NULL: the byte tokenizer */
    dt_hftok *hf; /* a tokenizer.json model, or NULL */
};

/* Fewer bytes than this per thread do not pay for starting it. */
#define DT_TOK_MIN_CHUNK ((size_t)128 << 10)
/* Chunks per thread: enough for dynamic scheduling to even out uneven text. */
#define DT_TOK_CHUNKS_PER_THREAD 4

dt_status dt_tokenizer_open_byte(dt_ctx *ctx, dt_tokenizer **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
    (*out)->name = "byte";
    return DT_OK;
}

dt_status dt_tokenizer_open_gpt2(dt_ctx *ctx, const char *encoder_json, const char *vocab_bpe,
                                 dt_tokenizer **out) {
    dt_bpe *v;
    *out = NULL;
    DT_CHECK(dt_bpe_load(ctx, encoder_json, vocab_bpe, &v));
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        dt_bpe_free(v);
        return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->name = "gpt2";
    t->bpe = v;
    *out = t;
    return DT_OK;
}

dt_status dt_tokenizer_open_hf(dt_ctx *ctx, const char *tokenizer_json, dt_tokenizer **out) {
    dt_hftok *h;
    *out = NULL;
    DT_CHECK(dt_hftok_load(ctx, tokenizer_json, &h));
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        dt_hftok_free(h);
        return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->name = "hf";
    t->hf = h;
    t->bpe = h->bpe;
    *out = t;
    return DT_OK;
}

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    if (t->hf) dt_hftok_free(t->hf);
    else dt_bpe_free(t->bpe);
    free(t);
}

const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->name; }
int dt_tokenizer_vocab(const dt_tokenizer *t) { return t->bpe ? dt_bpe_vocab(t->bpe) : 256; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->bpe ? dt_bpe_eot(t->bpe) : -1; }
int dt_tokenizer_bos(const dt_tokenizer *t) { return t->hf ? t->hf->bos : -1; }

const char *dt_tokenizer_kind(const dt_tokenizer *t) {
    if (!t->hf) return t->name;
    return t->hf->kind == DT_HF_SENTENCEPIECE ? "sentencepiece BPE"
         : t->hf->pre == DT_HF_PRE_LLAMA3      ? "byte-level BPE, Llama 3 pattern"
                                               : "byte-level BPE, GPT-2 pattern";
}

/* Encodes one chunk of the text (at_start: it starts the text). 0, or -1 when out of memory. */
static int encode_chunk(const dt_tokenizer *t, dt_bpe_state *st, const char *s, size_t n, int at_start,
                        dt_ids *out) {
    return t->hf ? dt_hftok_encode(t->hf, st, s, n, at_start, out)
                 : dt_bpe_encode(st, (const uint8_t *)s, n, out);
}

static size_t next_split(const dt_tokenizer *t, const char *s, size_t n, size_t from) {
    return t->hf ? dt_hftok_next_split(t->hf, s, n, from)
                 : dt_bpe_next_split((const uint8_t *)s, n, from);
}

static dt_status encode_bytes(dt_ctx *ctx, const char *text, size_t len, int32_t **ids,
                              size_t *n) {
    int32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory for %zu ids", len);
    for (size_t i = 0; i < len; i++) v[i] = (uint8_t)text[i];
    *ids = v;
    *n = len;
    return DT_OK;
}

/* Hands the ids over, trimmed to size (the encoder over-allocates as it grows). */
static void take_ids(dt_ids *d, int32_t **ids, size_t *n) {
    int32_t *v = realloc(d->v, (d->n ? d->n : 1) * sizeof *v);
    *ids = v ? v : d->v;
    *n = d->n;
}

dt_status dt_tokenizer_encode(dt_ctx *ctx, const dt_tokenizer *t, const char *text, size_t len,
                              int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!t->bpe) return encode_bytes(ctx, text, len, ids, n);
    dt_bpe_state *st = dt_bpe_state_new(t->bpe);
    dt_ids d = {0};
    if (!st || encode_chunk(t, st, text, len, 1, &d) != 0) {
        dt_bpe_state_free(st);
        free(d.v);
        return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
    }
    dt_bpe_state_free(st);
    take_ids(&d, ids, n);
    return DT_OK;
}

dt_status dt_tokenizer_encode_parallel(dt_ctx *ctx, const dt_tokenizer *t, const char *text,
                                       size_t len, int nthreads, int32_t **ids, size_t *n) {
    if (nthreads <= 0) nthreads = omp_get_max_threads();
    size_t want = len / DT_TOK_MIN_CHUNK;
    if (want > (size_t)nthreads * DT_TOK_CHUNKS_PER_THREAD)
        want = (size_t)nthreads * DT_TOK_CHUNKS_PER_THREAD;
    if (!t->bpe || nthreads < 2 || want < 2) return dt_tokenizer_encode(ctx, t, text, len, ids, n);

    *ids = NULL;
    *n = 0;
    dt_status st = DT_OK;
    size_t *cut = malloc((want + 1) * sizeof *cut), nc = 0;
    dt_ids *part = calloc(want, sizeof *part);
    int *bad = calloc(want, sizeof *bad);
    /* A chunk of k bytes gives at most k ids, so chunk k can write in place at its byte
     * offset: no buffer grows (growing means mremap, whose TLB shootdowns stall the other
     * threads), and only the pages written are touched. */
    int32_t *v = malloc(len * sizeof *v);
    if (!cut || !part || !bad || !v) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory for %zu ids", len);
        goto done;
    }
    cut[0] = 0;
    for (size_t k = 1; k < want; k++) {
        size_t target = k * (len / want);
        size_t p = next_split(t, text, len, target > cut[nc] ? target : cut[nc] + 1);
        if (p >= len) break;
        cut[++nc] = p;
    }
    cut[++nc] = len;
    if (nc < 2) { /* no safe cut point */
        st = dt_tokenizer_encode(ctx, t, text, len, ids, n);
        goto done;
    }
    /* hf: a chunk may give more ids than bytes ("▁" before a one-byte text), so its ids grow
     * in their own arrays. */
    for (size_t k = 0; k < nc && !t->hf; k++) part[k] = (dt_ids){v + cut[k], 0, cut[k + 1] - cut[k]};
#pragma omp parallel num_threads(nthreads)
    {
        dt_bpe_state *bs = dt_bpe_state_new(t->bpe); /* its own cache: no locking */
#pragma omp for schedule(dynamic, 1)
        for (long k = 0; k < (long)nc; k++)
            bad[k] = !bs || encode_chunk(t, bs, text + cut[k], cut[k + 1] - cut[k], k == 0, &part[k]) != 0;
        dt_bpe_state_free(bs);
    }
    /* Close the gaps, in order: chunk k's destination ends before chunk k+1's ids start. */
    size_t total = 0;
    for (size_t k = 0; k < nc; k++) {
        if (bad[k]) {
            st = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
            goto done;
        }
        total += part[k].n;
    }
    if (t->hf && total > len) {
        int32_t *w = realloc(v, total * sizeof *v);
        if (!w) {
            st = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory for %zu ids", total);
            goto done;
        }
        v = w;
    }
    total = 0;
    for (size_t k = 0; k < nc; k++) {
        memmove(v + total, part[k].v, part[k].n * sizeof *v);
        total += part[k].n;
    }
    dt_ids d = {v, total, len};
    take_ids(&d, ids, n);
    v = NULL;
done:
    free(v);
    for (size_t k = 0; t->hf && part && k < want; k++) free(part[k].v);
    free(part);
    free(bad);
    free(cut);
    return st;
}

static dt_status decode(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n, int at_start,
                        char **text, size_t *len) {
    int vocab = dt_tokenizer_vocab(t);
    size_t total = 0, tl;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return dt_fail(ctx, DT_ERR_FORMAT,
                           "%s tokenizer: token id %d at index %zu is out of range 0..%d",
                           t->name, ids[i], i, vocab - 1);
        total += t->bpe ? (dt_bpe_token(t->bpe, ids[i], &tl), tl) : 1;
    }
    char *out = malloc(total + 1);
    if (!out) return dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", total);
    if (t->hf) {
        total = dt_hftok_decode(t->hf, ids, n, at_start, out);
        out[total] = 0;
        *text = out;
        *len = total;
        return DT_OK;
    }
    char *w = out;
    for (size_t i = 0; i < n; i++) {
        if (!t->bpe) {
            *w++ = (char)(uint8_t)ids[i];
            continue;
        }
        const uint8_t *b = dt_bpe_token(t->bpe, ids[i], &tl);
        memcpy(w, b, tl);
        w += tl;
    }
    *w = 0;
    *text = out;
    *len = total;
    return DT_OK;
}

dt_status dt_tokenizer_decode(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n,
                              char **text, size_t *len) {
    return decode(ctx, t, ids, n, 1, text, len);
}

dt_status dt_tokenizer_decode_more(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n,
                                   char **text, size_t *len) {
    return decode(ctx, t, ids, n, 0, text, len);
}
