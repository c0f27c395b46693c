#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void dt_ctx_init(dt_ctx *ctx) {
    memset(ctx, 0, sizeof *ctx);
    ctx->world = 1;
    ctx->log_level = 1;
    if (gethostname(ctx->host, sizeof ctx->host - 1) != 0) strcpy(ctx->host, "localhost");
}

dt_status dt_fail(dt_ctx *ctx, dt_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    ctx->where[0] = 0;
    return code;
}

void dt_ctx_trace(dt_ctx *ctx, const char *file, int line) {
    /* Keep only the innermost site: the message itself names what went wrong. */
    if (ctx->where[0]) return;
    const char *base = strrchr(file, '/');
    snprintf(ctx->where, sizeof ctx->where, "%s:%d", base ? base + 1 : file, line);
}

const char *dt_status_name(dt_status s) {
    switch (s) {
    case DT_OK: return "ok";
    case DT_ERR_CONFIG: return "config error";
    case DT_ERR_IO: return "I/O error";
    case DT_ERR_FORMAT: return "format error";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_BACKEND: return "backend error";
    case DT_ERR_NUMERIC: return "numeric error";
    case DT_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

void dt_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "dtrain: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
