#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static void vlog(const dt_ctx *ctx, FILE *f, const char *level, const char *fmt, va_list ap) {
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One fprintf per line so lines from concurrent ranks do not interleave mid-line. */
    fprintf(f, "%s:%d %s%s\n", ctx->host, ctx->rank, level, line);
    fflush(f);
}

#define DT_LOG_FN(name, min_level, stream, tag)                                          \
    void name(const dt_ctx *ctx, const char *fmt, ...) {                                 \
        if (ctx->log_level < (min_level)) return;                                        \
        va_list ap;                                                                      \
        va_start(ap, fmt);                                                               \
        vlog(ctx, stream, tag, fmt, ap);                                                 \
        va_end(ap);                                                                      \
    }

DT_LOG_FN(dt_log_error, 0, stderr, "error: ")
DT_LOG_FN(dt_log_warn, 0, stderr, "warning: ")
DT_LOG_FN(dt_log_info, 1, stdout, "")
DT_LOG_FN(dt_log_note, 1, stderr, "")
DT_LOG_FN(dt_log_debug, 2, stdout, "debug: ")
