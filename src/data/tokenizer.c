/* tokenizer.c - the dt_tokenizer handle: the byte tokenizer, and the GPT-2 BPE of bpe.c with
 * its parallel driver. */
#include "data/tokenizer.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"

struct dt_tokenizer {
    const char *name;
    dt_bpe *bpe; /* NULL: the byte tokenizer */
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

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    dt_bpe_free(t->bpe);
    free(t);
}

const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->name; }
int dt_tokenizer_vocab(const dt_tokenizer *t) { return t->bpe ? dt_bpe_vocab(t->bpe) : 256; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->bpe ? dt_bpe_eot(t->bpe) : -1; }

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
    if (!st || dt_bpe_encode(st, (const uint8_t *)text, len, &d) != 0) {
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
    const uint8_t *s = (const uint8_t *)text;
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
        size_t p = dt_bpe_next_split(s, len, target > cut[nc] ? target : cut[nc] + 1);
        if (p >= len) break;
        cut[++nc] = p;
    }
    cut[++nc] = len;
    if (nc < 2) { /* no safe cut point */
        st = dt_tokenizer_encode(ctx, t, text, len, ids, n);
        goto done;
    }
    for (size_t k = 0; k < nc; k++) part[k] = (dt_ids){v + cut[k], 0, cut[k + 1] - cut[k]};
#pragma omp parallel num_threads(nthreads)
    {
        dt_bpe_state *bs = dt_bpe_state_new(t->bpe); /* its own cache: no locking */
#pragma omp for schedule(dynamic, 1)
        for (long k = 0; k < (long)nc; k++)
            bad[k] = !bs || dt_bpe_encode(bs, s + cut[k], cut[k + 1] - cut[k], &part[k]) != 0;
        dt_bpe_state_free(bs);
    }
    /* Close the gaps, in order: chunk k's destination ends before chunk k+1's ids start. */
    size_t total = 0;
    for (size_t k = 0; k < nc; k++) {
        if (bad[k]) {
            st = dt_fail(ctx, DT_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
            goto done;
        }
        memmove(v + total, part[k].v, part[k].n * sizeof *v);
        total += part[k].n;
    }
    dt_ids d = {v, total, len};
    take_ids(&d, ids, n);
    v = NULL;
done:
    free(v);
    free(part);
    free(bad);
    free(cut);
    return st;
}

dt_status dt_tokenizer_decode(dt_ctx *ctx, const dt_tokenizer *t, const int32_t *ids, size_t n,
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
