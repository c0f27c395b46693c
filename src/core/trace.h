/* trace.h - a timeline of what each thread did, written as Chrome trace JSON ("X" complete
 * events: pid = rank, tid = thread) for Perfetto or chrome://tracing.
 *
 * One recorder per process (see docs/ARCHITECTURE.md, decision 19): events come from code
 * that has no context to carry one (kernel hooks, the communication thread), and recording
 * never changes a result. While disabled, dt_trace_begin/dt_trace_end cost one load each.
 *
 *   dt_trace_enable(dt_now());                    // origin: ts 0 (call after a barrier)
 *   double t0 = dt_trace_begin();
 *   ... work ...
 *   dt_trace_end(t0, "fwd", "forward layer %d", l);   // one event [t0, now) on this thread
 *   dt_trace_disable();
 *   DT_CHECK(dt_trace_write(ctx, "trace.rank0.json", rank));
 *   dt_trace_reset();                             // forget the events
 */
#ifndef DT_TRACE_H
#define DT_TRACE_H

#include <stdio.h>

#include "core/status.h"

/* Threads: the main thread records as tid 0, the communication thread as tid 1. */
#define DT_TRACE_TID_MAIN 0
#define DT_TRACE_TID_COMM 1

/* Starts recording; timestamps are microseconds after `origin` (a dt_now() value). */
void dt_trace_enable(double origin);
/* Stops recording (events are kept until dt_trace_reset). */
void dt_trace_disable(void);
int dt_trace_enabled(void);
/* Drops every recorded event. */
void dt_trace_reset(void);
/* Sets the tid the calling thread records under (default DT_TRACE_TID_MAIN). */
void dt_trace_set_thread(int tid);

/* Start time of an event (dt_now()), or 0 without reading the clock when disabled. */
double dt_trace_begin(void);
/* Records one complete event from t0 (a dt_trace_begin value) to now, on the calling thread.
 * cat is a short category ("fwd", "bwd", "comm", "optim", "data", "ckpt", "step"); the name
 * is formatted only when recording. No-op when disabled or when t0 is 0. */
void dt_trace_end(double t0, const char *cat, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Names this process's row beyond its rank: process_name becomes "rank N (LABEL)" (e.g. a
 * pipeline stage, so the trace shows the usual pipeline picture row by row). Kept until
 * dt_trace_reset; "" or NULL: none. */
void dt_trace_set_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Number of events recorded. */
long dt_trace_count(void);

/* Writes this process's events as the body of a traceEvents array (comma-separated JSON
 * objects, no brackets), plus metadata naming process `pid` ("rank N") and its threads. */
dt_status dt_trace_write_events(dt_ctx *ctx, FILE *f, int pid);

#endif
