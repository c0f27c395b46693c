#include "data/prepare.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/timer.h"
#include "data/shard.h"

static int omp_default_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

typedef struct doc {
    const char *text;
    size_t len;
} doc;

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static int buf_add(buf *b, const void *src, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static dt_status read_input(dt_ctx *ctx, const char *path, buf *all) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char chunk[1 << 16];
    size_t n;
    dt_status st = DT_OK;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_add(all, chunk, n)) {
            st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory reading the input", path);
            break;
        }
    if (st == DT_OK && ferror(f)) st = dt_fail(ctx, DT_ERR_IO, "%s: read error: %s", path, strerror(errno));
    if (f != stdin) fclose(f);
    return st;
}

dt_status dt_read_text(dt_ctx *ctx, const char *path, char **text, size_t *len) {
    buf b = {0};
    dt_status st = read_input(ctx, path, &b);
    if (st == DT_OK && !b.p && buf_add(&b, "", 0)) st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    if (st != DT_OK) {
        free(b.p);
        return st;
    }
    *text = b.p;
    *len = b.len;
    return DT_OK;
}

/* Splits text into documents at lines equal to sep (the separator lines are dropped);
 * empty documents are skipped. Appends to *docs. */
static dt_status split_docs(dt_ctx *ctx, const char *text, size_t len, const char *sep, doc **docs,
                            size_t *n, size_t *cap) {
    size_t seplen = sep ? strlen(sep) : 0, start = 0, i = 0;
    for (;;) {
        size_t end = len, next = len;
        if (sep) {
            /* Find the next line equal to sep, at i (a line start). */
            while (i < len) {
                const char *nl = memchr(text + i, '\n', len - i);
                size_t line_end = nl ? (size_t)(nl - text) : len;
                size_t l = line_end - i;
                if (l > 0 && text[line_end - 1] == '\r') l--;
                if (l == seplen && memcmp(text + i, sep, seplen) == 0) {
                    end = i;
                    next = nl ? line_end + 1 : len;
                    i = next;
                    break;
                }
                i = nl ? line_end + 1 : len;
            }
        }
        if (end > start) {
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 1024;
                doc *d = realloc(*docs, *cap * sizeof *d);
                if (!d) return dt_fail(ctx, DT_ERR_NOMEM, "prepare: out of memory");
                *docs = d;
            }
            (*docs)[(*n)++] = (doc){text + start, end - start};
        }
        if (next >= len) break;
        start = next;
    }
    return DT_OK;
}

dt_status dt_file_write_atomic(dt_ctx *ctx, const char *path, const void *head, size_t head_bytes, const void *body,
                               size_t body_bytes) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    int bad = fwrite(head, 1, head_bytes, f) != head_bytes || (body_bytes && fwrite(body, 1, body_bytes, f) != body_bytes);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        dt_status st = dt_fail(ctx, DT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return DT_OK;
}

dt_status dt_shard_write(dt_ctx *ctx, const char *path, const int32_t *tokens, uint64_t n, int vocab) {
    if (n > INT32_MAX) return dt_fail(ctx, DT_ERR_CONFIG, "%s: %llu tokens exceed a shard's limit", path,
                                      (unsigned long long)n);
    int32_t hdr[DT_LLMC_HEADER_INTS] = {DT_LLMC_MAGIC, vocab <= 65536 ? 1 : 7, (int32_t)n};
    if (hdr[1] == 7) return dt_file_write_atomic(ctx, path, hdr, sizeof hdr, tokens, n * 4);
    uint16_t *t16 = malloc(n * 2 + 1);
    if (!t16) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n; i++) t16[i] = (uint16_t)tokens[i];
    dt_status st = dt_file_write_atomic(ctx, path, hdr, sizeof hdr, t16, n * 2);
    free(t16);
    return st;
}

static dt_status write_split(dt_ctx *ctx, const dt_prepare_cfg *p, const char *split,
                             const int32_t *tok, uint64_t n, int *shards) {
    *shards = 0;
    for (uint64_t i = 0; i < n; i += p->shard_tokens) {
        uint64_t m = n - i < p->shard_tokens ? n - i : p->shard_tokens;
        char path[4200];
        snprintf(path, sizeof path, "%s_%s_%06d.bin", p->out_prefix, split, *shards);
        DT_CHECK(dt_shard_write(ctx, path, tok + i, m, dt_tokenizer_vocab(p->tok)));
        (*shards)++;
    }
    return DT_OK;
}

dt_status dt_prepare(dt_ctx *ctx, const dt_prepare_cfg *p, dt_prepare_stats *out) {
    memset(out, 0, sizeof *out);
    if (p->n_inputs < 1) return dt_fail(ctx, DT_ERR_CONFIG, "prepare: no input files (use - for stdin)");
    if (!(p->val_fraction >= 0 && p->val_fraction < 1))
        return dt_fail(ctx, DT_ERR_CONFIG, "prepare: --val-fraction must be in [0, 1) (got %g)", p->val_fraction);
    if (p->shard_tokens < 1) return dt_fail(ctx, DT_ERR_CONFIG, "prepare: --shard-tokens must be >= 1");
    buf *texts = calloc((size_t)p->n_inputs, sizeof *texts);
    doc *docs = NULL;
    size_t ndocs = 0, cap = 0;
    int32_t **ids = NULL, *train = NULL, *val = NULL;
    size_t *nids = NULL;
    dt_status st = DT_OK;
    if (!texts) return dt_fail(ctx, DT_ERR_NOMEM, "prepare: out of memory");
    for (int i = 0; i < p->n_inputs; i++) {
        DT_CHECK_GOTO(read_input(ctx, p->inputs[i], &texts[i]));
        out->bytes += texts[i].len;
        DT_CHECK_GOTO(split_docs(ctx, texts[i].p, texts[i].len, p->doc_sep, &docs, &ndocs, &cap));
    }
    if (ndocs == 0) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "prepare: the input holds no text");
        goto fail;
    }
    ids = calloc(ndocs, sizeof *ids);
    nids = calloc(ndocs, sizeof *nids);
    if (!ids || !nids) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "prepare: out of memory");
        goto fail;
    }
    /* Many documents: one per thread at a time. Few (big) documents: split each. */
    double t0 = dt_now();
    int threads = p->threads;
    int failed = 0;
    if (ndocs >= 64) {
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads > 0 ? threads : omp_default_threads())
        for (size_t d = 0; d < ndocs; d++) {
            dt_ctx local = *ctx;
            if (!failed && dt_tokenizer_encode(&local, p->tok, docs[d].text, docs[d].len, &ids[d], &nids[d]) != DT_OK)
#pragma omp critical
            {
                if (!failed) {
                    failed = 1;
                    *ctx = local;
                }
            }
        }
    } else {
        for (size_t d = 0; d < ndocs && !failed; d++)
            failed = dt_tokenizer_encode_parallel(ctx, p->tok, docs[d].text, docs[d].len, threads,
                                                  &ids[d], &nids[d]) != DT_OK;
    }
    out->tokenize_seconds = dt_now() - t0;
    if (failed) {
        st = DT_ERR_FORMAT;
        goto fail;
    }
    /* Concatenate: each document ends with the end-of-text token, or "\n" (byte), and starts
     * with the beginning-of-text token when the tokenizer has one (hf). */
    int eot = dt_tokenizer_eot(p->tok), bos = dt_tokenizer_bos(p->tok);
    int32_t sep = eot >= 0 ? eot : '\n';
    uint64_t extra = 1 + (bos >= 0);
    size_t every = p->val_fraction > 0 ? (size_t)llround(1.0 / p->val_fraction) : 0;
    uint64_t ntrain = 0, nval = 0;
    for (size_t d = 0; d < ndocs; d++) {
        int is_val = every > 0 && d % every == every - 1;
        *(is_val ? &nval : &ntrain) += nids[d] + extra;
    }
    train = malloc((ntrain + 1) * sizeof *train);
    val = malloc((nval + 1) * sizeof *val);
    if (!train || !val) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "prepare: out of memory");
        goto fail;
    }
    ntrain = nval = 0;
    for (size_t d = 0; d < ndocs; d++) {
        int is_val = every > 0 && d % every == every - 1;
        int32_t *dst = is_val ? val : train;
        uint64_t *n = is_val ? &nval : &ntrain;
        if (bos >= 0) dst[(*n)++] = bos;
        memcpy(dst + *n, ids[d], nids[d] * sizeof *dst);
        *n += nids[d];
        dst[(*n)++] = sep;
        out->val_docs += (uint64_t)is_val;
    }
    out->docs = ndocs;
    out->train_tokens = ntrain;
    out->val_tokens = nval;
    DT_CHECK_GOTO(write_split(ctx, p, "train", train, ntrain, &out->train_shards));
    if (nval > 0) DT_CHECK_GOTO(write_split(ctx, p, "val", val, nval, &out->val_shards));
fail:
    for (int i = 0; i < p->n_inputs; i++) free(texts[i].p);
    free(texts);
    if (ids)
        for (size_t d = 0; d < ndocs; d++) free(ids[d]);
    free(ids);
    free(nids);
    free(docs);
    free(train);
    free(val);
    return st;
}
