/* status.h - error codes, the per-process context, and the error-propagation macros.
 *
 * Library code never exits: a runtime failure returns a negative dt_status and stores a
 * one-line message in the context; callers propagate it with DT_CHECK, which appends the
 * call site so the trail can be read back. Programming bugs use DT_ASSERT (aborts).
 *
 *   dt_ctx ctx; dt_ctx_init(&ctx);
 *   if (n <= 0) return dt_fail(&ctx, DT_ERR_CONFIG, "model.n_layer must be > 0 (got %d)", n);
 */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#include <stddef.h>

typedef enum dt_status {
    DT_OK = 0,
    DT_ERR_CONFIG = -1,  /* bad configuration key / value / flag */
    DT_ERR_IO = -2,      /* file system failure */
    DT_ERR_FORMAT = -3,  /* malformed file contents */
    DT_ERR_NOMEM = -4,   /* allocation failed */
    DT_ERR_BACKEND = -5, /* oneDNN / MPI / ... returned an error */
    DT_ERR_NUMERIC = -6, /* NaN/Inf where it must not be */
    DT_ERR_INTERNAL = -7,
} dt_status;

#define DT_ERRMSG_MAX 1024

/* Process context: identity for log lines and the last error message. Passed explicitly. */
typedef struct dt_ctx {
    int rank, world;
    char host[64];
    int log_level;          /* 0 = errors only, 1 = info, 2 = debug */
    char err[DT_ERRMSG_MAX]; /* message of the last failure: one line for the user */
    char where[128];         /* innermost DT_CHECK site of that failure, for debugging */
} dt_ctx;

void dt_ctx_init(dt_ctx *ctx);

/* Records a formatted message in ctx and returns code (so `return dt_fail(...)` reads well). */
dt_status dt_fail(dt_ctx *ctx, dt_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the innermost DT_CHECK site of the current failure in ctx->where. */
void dt_ctx_trace(dt_ctx *ctx, const char *file, int line);

const char *dt_status_name(dt_status s);

/* Propagates a failure; expects a `dt_ctx *ctx` in scope. */
#define DT_CHECK(expr)                                                                   \
    do {                                                                                 \
        dt_status dt_s_ = (expr);                                                        \
        if (dt_s_ != DT_OK) {                                                            \
            dt_ctx_trace(ctx, __FILE__, __LINE__);                                       \
            return dt_s_;                                                                \
        }                                                                                \
    } while (0)

/* Same, for functions that own resources: jumps to `fail` with `st` set. */
#define DT_CHECK_GOTO(expr)                                                              \
    do {                                                                                 \
        st = (expr);                                                                     \
        if (st != DT_OK) {                                                               \
            dt_ctx_trace(ctx, __FILE__, __LINE__);                                       \
            goto fail;                                                                   \
        }                                                                                \
    } while (0)

void dt_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define DT_ASSERT(x) ((x) ? (void)0 : dt_assert_fail(#x, __FILE__, __LINE__))

#endif
