#include "ckpt/safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A growable string for the JSON header. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if (b->p && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t cap = (b->cap ? b->cap * 2 : 1024) + (size_t)n;
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
}

/* JSON string body with quotes and backslashes escaped (names are ASCII identifiers). */
static void sb_str(sbuf *b, const char *s) {
    sb_put(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sb_put(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) sb_put(b, "\\u%04x", (unsigned char)*s);
        else sb_put(b, "%c", *s);
    }
    sb_put(b, "\"");
}

static size_t entry_bytes(const dt_st_entry *e) {
    size_t n = 4; /* both dtypes are 4 bytes */
    for (int d = 0; d < e->ndim; d++) n *= (size_t)e->shape[d];
    return n;
}

dt_status dt_st_write(dt_ctx *ctx, const char *path, const dt_st_entry *e, int n,
                      const char *const *meta) {
    return dt_st_write_info(ctx, path, e, n, meta, NULL);
}

dt_status dt_st_write_info(dt_ctx *ctx, const char *path, const dt_st_entry *e, int n,
                           const char *const *meta, dt_io_info *info) {
    sbuf h = {0};
    sb_put(&h, "{");
    if (meta && meta[0]) {
        sb_put(&h, "\"__metadata__\":{");
        for (int i = 0; meta[i] && meta[i + 1]; i += 2) {
            if (i) sb_put(&h, ",");
            sb_str(&h, meta[i]);
            sb_put(&h, ":");
            sb_str(&h, meta[i + 1]);
        }
        sb_put(&h, "}");
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || (meta && meta[0])) sb_put(&h, ",");
        sb_str(&h, e[i].name);
        sb_put(&h, ":{\"dtype\":\"%s\",\"shape\":[", e[i].dtype == DT_ST_F32 ? "F32" : "I32");
        for (int d = 0; d < e[i].ndim; d++) sb_put(&h, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        size_t nb = entry_bytes(&e[i]);
        sb_put(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        off += nb;
    }
    sb_put(&h, "}");
    /* Pad the header with spaces to 8 bytes so the data is aligned (allowed by the format). */
    while (!h.oom && h.len % 8) sb_put(&h, " ");
    if (h.oom) {
        free(h.p);
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot build safetensors header", path);
    }

    dt_io_file f;
    dt_status st = dt_io_open(ctx, &f, path);
    if (st != DT_OK) goto done;
    uint64_t hlen = h.len; /* little-endian host (x86-64) */
    st = dt_io_write(ctx, &f, &hlen, 8);
    if (st == DT_OK) st = dt_io_write(ctx, &f, h.p, h.len);
    for (int i = 0; i < n && st == DT_OK; i++) st = dt_io_write(ctx, &f, e[i].data, entry_bytes(&e[i]));
    if (st == DT_OK) st = dt_io_commit(ctx, &f, info);
done:
    free(h.p);
    return st;
}
