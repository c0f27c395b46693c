#include "data/tokens.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

#define DT_RNG_STREAM_DATA 0xda7aULL

dt_status dt_tokens_open(dt_ctx *ctx, dt_tokens *s, const char *path, int vocab, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->seed = seed;
    if (!path) return DT_OK;
    dt_status st = DT_OK;
    FILE *f = fopen(path, "rb");
    void *raw = NULL;
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    int32_t hdr[DT_SHARD_HEADER_INTS];
    if (fread(hdr, sizeof hdr, 1, f) != 1) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: shorter than the 1024-byte shard header", path);
        goto fail;
    }
    if (hdr[0] != DT_SHARD_MAGIC) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: bad magic %d (expected %d)", path, hdr[0],
                     DT_SHARD_MAGIC);
        goto fail;
    }
    if (hdr[1] != 1 && hdr[1] != 7) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: unsupported version %d (1 = uint16, 7 = uint32)",
                     path, hdr[1]);
        goto fail;
    }
    size_t width = hdr[1] == 1 ? 2 : 4;
    if (hdr[2] <= 1) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: header says %d tokens (need at least 2)", path, hdr[2]);
        goto fail;
    }
    size_t n = (size_t)(uint32_t)hdr[2];
    if (fseek(f, 0, SEEK_END) != 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot seek: %s", path, strerror(errno));
        goto fail;
    }
    long size = ftell(f);
    if (size < 0 || (size_t)size != sizeof hdr + n * width) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: size %ld bytes disagrees with header (%zu tokens of %zu bytes)",
                     path, size, n, width);
        goto fail;
    }
    fseek(f, (long)sizeof hdr, SEEK_SET);
    raw = malloc(n * width);
    s->tok = malloc(n * sizeof(int32_t));
    if (!raw || !s->tok) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate %zu tokens", path, n);
        goto fail;
    }
    if (fread(raw, width, n, f) != n) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: short read", path);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t t = width == 2 ? ((uint16_t *)raw)[i] : ((uint32_t *)raw)[i];
        if (t >= (uint32_t)vocab) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: token %u at index %zu is >= vocab size %d",
                         path, t, i, vocab);
            goto fail;
        }
        s->tok[i] = (int32_t)t;
    }
    s->n = n;
    free(raw);
    fclose(f);
    return DT_OK;
fail:
    free(raw);
    free(s->tok);
    s->tok = NULL;
    fclose(f);
    return st;
}

void dt_tokens_close(dt_tokens *s) {
    free(s->tok);
    memset(s, 0, sizeof *s);
}

void dt_tokens_batch(const dt_tokens *s, uint64_t k, int B, int T, int32_t *inputs,
                     int32_t *targets) {
    for (int b = 0; b < B; b++) {
        uint64_t row = k * (uint64_t)B + (uint64_t)b;
        if (!s->tok) {
            for (int t = 0; t <= T; t++) {
                int32_t v = (int32_t)dt_rng_below(s->seed, DT_RNG_STREAM_DATA,
                                                  row * (uint64_t)(T + 1) + t, (uint64_t)s->vocab);
                if (t < T) inputs[b * T + t] = v;
                if (t > 0) targets[b * T + t - 1] = v;
            }
            continue;
        }
        /* Consecutive windows of T+1 tokens, wrapping around the file. */
        size_t windows = s->n > (size_t)T ? (s->n - 1) / (size_t)T : 1;
        size_t start = (size_t)(row % windows) * (size_t)T;
        for (int t = 0; t < T; t++) {
            inputs[b * T + t] = s->tok[(start + t) % s->n];
            targets[b * T + t] = s->tok[(start + t + 1) % s->n];
        }
    }
}
