#include "core/trace.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

typedef struct trace_event {
    long long ts, end; /* nanoseconds after the origin: children end inside their parents exactly */
    int tid;
    char cat[12];
    char name[52];
} trace_event;

/* The process-wide recorder (decision 19): events appended under a mutex; a handful per
 * layer and step, so contention is negligible next to the work they time. */
static struct {
    atomic_int on;
    double origin;
    pthread_mutex_t mu;
    trace_event *ev;
    long n, cap;
    char label[64]; /* dt_trace_set_label */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int my_tid = DT_TRACE_TID_MAIN;

void dt_trace_enable(double origin) {
    pthread_mutex_lock(&rec.mu);
    rec.origin = origin;
    pthread_mutex_unlock(&rec.mu);
    atomic_store(&rec.on, 1);
}

void dt_trace_disable(void) { atomic_store(&rec.on, 0); }

int dt_trace_enabled(void) { return atomic_load_explicit(&rec.on, memory_order_relaxed); }

void dt_trace_reset(void) {
    pthread_mutex_lock(&rec.mu);
    free(rec.ev);
    rec.ev = NULL;
    rec.n = rec.cap = 0;
    rec.label[0] = 0;
    pthread_mutex_unlock(&rec.mu);
}

void dt_trace_set_label(const char *fmt, ...) {
    char buf[sizeof rec.label] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&rec.mu);
    memcpy(rec.label, buf, sizeof buf);
    pthread_mutex_unlock(&rec.mu);
}

void dt_trace_set_thread(int tid) { my_tid = tid; }

double dt_trace_begin(void) { return dt_trace_enabled() ? dt_now() : 0.0; }

void dt_trace_end(double t0, const char *cat, const char *fmt, ...) {
    if (t0 == 0.0 || !dt_trace_enabled()) return;
    double t1 = dt_now();
    trace_event e;
    e.tid = my_tid;
    snprintf(e.cat, sizeof e.cat, "%s", cat);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.name, sizeof e.name, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&rec.mu);
    e.ts = llround((t0 - rec.origin) * 1e9);
    e.end = llround((t1 - rec.origin) * 1e9);
    if (e.ts < 0) e.ts = 0;
    if (e.end < e.ts) e.end = e.ts;
    if (rec.n == rec.cap) { /* on failure the event is dropped: tracing never fails a run */
        long cap = rec.cap ? 2 * rec.cap : 4096;
        trace_event *ev = realloc(rec.ev, (size_t)cap * sizeof *ev);
        if (ev) {
            rec.ev = ev;
            rec.cap = cap;
        }
    }
    if (rec.n < rec.cap) rec.ev[rec.n++] = e;
    pthread_mutex_unlock(&rec.mu);
}

long dt_trace_count(void) {
    pthread_mutex_lock(&rec.mu);
    long n = rec.n;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

/* Names come from format strings of our own; escape anyway so the file is always JSON. */
static void put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

dt_status dt_trace_write_events(dt_ctx *ctx, FILE *f, int pid) {
    pthread_mutex_lock(&rec.mu);
    char pname[96];
    if (rec.label[0]) snprintf(pname, sizeof pname, "rank %d (%s)", pid, rec.label);
    else snprintf(pname, sizeof pname, "rank %d", pid);
    fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":", pid);
    put_json_string(f, pname);
    fputs("}},\n", f);
    fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}},\n",
            pid, pid);
    fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"main\"}},\n",
            pid, DT_TRACE_TID_MAIN);
    fprintf(f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"comm\"}}",
            pid, DT_TRACE_TID_COMM);
    for (long i = 0; i < rec.n; i++) {
        const trace_event *e = &rec.ev[i];
        long long d = e->end - e->ts;
        fprintf(f, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%lld.%03lld,\"dur\":%lld.%03lld,\"cat\":", pid,
                e->tid, e->ts / 1000, e->ts % 1000, d / 1000, d % 1000);
        put_json_string(f, e->cat);
        fputs(",\"name\":", f);
        put_json_string(f, e->name);
        fputc('}', f);
    }
    pthread_mutex_unlock(&rec.mu);
    if (ferror(f)) return dt_fail(ctx, DT_ERR_IO, "trace: write failed");
    return DT_OK;
}
