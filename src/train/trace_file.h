/* trace_file.h - writes the recorded trace events (core/trace.h) of every rank into one
 * Chrome-trace JSON file: each rank writes FILE.rank<N>.part, then rank 0 merges them (the
 * ranks must share a file system). Used by `dtrain train` (logging.trace) and `dtrain bench
 * --trace`; every rank calls it.
 *
 *   DT_CHECK(dt_trace_write_merged(ctx, comm, "trace.json"));
 */
#ifndef DT_TRACE_FILE_H
#define DT_TRACE_FILE_H

#include "comm/comm.h"
#include "core/status.h"

dt_status dt_trace_write_merged(dt_ctx *ctx, dt_comm *comm, const char *path);

#endif
