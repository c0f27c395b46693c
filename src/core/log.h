/* log.h - rank-aware logging. Every line from a rank starts with "host:rank".
 *
 *   dt_log_info(ctx, "step %d loss %.4f", step, loss);   // printed when log_level >= 1
 *   dt_log_error(ctx, "%s", ctx->err);                   // always printed, to stderr
 */
#ifndef DT_LOG_H
#define DT_LOG_H

#include "core/status.h"

void dt_log_error(const dt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_log_warn(const dt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_log_info(const dt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Information about what a command reads, on stderr (its stdout may be data, e.g. sample). */
void dt_log_note(const dt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_log_debug(const dt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
