/* The trace file: every rank writes FILE.rank<N>.part, rank 0 merges them into FILE. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "train/trace_file.h"
#include "core/log.h"
#include "core/trace.h"

dt_status dt_trace_write_merged(dt_ctx *ctx, dt_comm *comm, const char *path) {
    int rank = dt_comm_rank(comm, DT_GROUP_WORLD), world = dt_comm_size(comm, DT_GROUP_WORLD);
    char part[4200];
    snprintf(part, sizeof part, "%s.rank%d.part", path, rank);
    FILE *f = fopen(part, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", part, strerror(errno));
    dt_status st = dt_trace_write_events(ctx, f, rank);
    if (fclose(f) != 0 && st == DT_OK) st = dt_fail(ctx, DT_ERR_IO, "%s: write failed", part);
    DT_CHECK(st);
    DT_CHECK(dt_comm_barrier(ctx, comm, DT_GROUP_WORLD));
    if (rank != 0) return DT_OK;
    FILE *out = fopen(path, "w");
    if (!out) return dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"dtrain %s\",\"ranks\":%d},\n"
                 "\"traceEvents\":[\n", DT_VERSION, world);
    int missing = 0;
    for (int r = 0; r < world; r++) {
        snprintf(part, sizeof part, "%s.rank%d.part", path, r);
        FILE *in = fopen(part, "r");
        if (!in) { /* another node's file system: its part stays there */
            missing++;
            continue;
        }
        if (r > 0) fputs(",\n", out);
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        fclose(in);
        remove(part);
    }
    fputs("\n]}\n", out);
    if (fclose(out) != 0) return dt_fail(ctx, DT_ERR_IO, "%s: write failed", path);
    if (missing)
        dt_log_warn(ctx, "trace: %d rank(s) wrote their part on another file system (%s.rank<N>.part); "
                         "%s holds the others", missing, path, path);
    return DT_OK;
}

