/* The collective watchdog (comm.h): a ring of the last collectives of this rank and a thread
 * that notices one blocking for too long. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

#define WD_RING 64

typedef struct wd_rec {
    uint64_t seq;
    const char *op;
    int group;
    size_t bytes;
    double t0, t1; /* wall clock (epoch seconds); t1 = 0 while in flight */
} wd_rec;

typedef struct dt_watchdog {
    pthread_mutex_t mu;
    wd_rec ring[WD_RING];
    uint64_t seq;        /* collectives started */
    double last_end;     /* wall time the last collective finished (or the watchdog started) */
    double timeout;
    pthread_t th;
    int live, stop, outside_dumped;
    int rank, world;
} dt_watchdog;

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *group_name(int g) {
    return g == DT_GROUP_WORLD ? "world" : g == DT_GROUP_NODE ? "node" : g == DT_GROUP_CROSS ? "cross" : "?";
}

static dt_watchdog *wd_get(dt_comm *c) {
    if (!c->wd) {
        dt_watchdog *w = calloc(1, sizeof *w);
        if (!w) return NULL;
        pthread_mutex_init(&w->mu, NULL);
        w->rank = c->rank[DT_GROUP_WORLD];
        w->world = c->size[DT_GROUP_WORLD];
        w->last_end = wall();
        c->wd = w;
    }
    return c->wd;
}

int dt_wd_begin(dt_comm *c, const char *op, dt_group g, size_t bytes) {
    dt_watchdog *w = wd_get(c);
    if (!w) return -1;
    pthread_mutex_lock(&w->mu);
    int slot = (int)(w->seq % WD_RING);
    w->ring[slot] = (wd_rec){++w->seq, op, (int)g, bytes, wall(), 0.0};
    pthread_mutex_unlock(&w->mu);
    return slot;
}

void dt_wd_end(dt_comm *c, int slot) {
    dt_watchdog *w = c->wd;
    if (!w || slot < 0) return;
    pthread_mutex_lock(&w->mu);
    double t = wall();
    w->ring[slot].t1 = t;
    w->last_end = t;
    w->outside_dumped = 0;
    pthread_mutex_unlock(&w->mu);
}

/* Writes the ring, oldest first (caller holds the lock). */
static void dump(dt_watchdog *w, FILE *f, const char *state, const wd_rec *stuck, double now) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(f, "rank %d of %d on %s (pid %d): state %s; ", w->rank, w->world, host, (int)getpid(), state);
    if (stuck)
        fprintf(f, "collective #%llu %s (%s group, %zu bytes) blocked for %.1f s\n", (unsigned long long)stuck->seq,
                stuck->op, group_name(stuck->group), stuck->bytes, now - stuck->t0);
    else
        fprintf(f, "not in a collective for %.1f s; last finished #%llu\n", now - w->last_end,
                (unsigned long long)w->seq);
    uint64_t first = w->seq > WD_RING ? w->seq - WD_RING + 1 : 1, from = w->seq > 8 ? w->seq - 7 : 1;
    if (from < first) from = first;
    for (uint64_t s = from; s <= w->seq; s++) {
        const wd_rec *r = &w->ring[(s - 1) % WD_RING];
        if (r->t1 > 0)
            fprintf(f, "  #%llu %s %s %zu B started %.6f took %.3f ms\n", (unsigned long long)r->seq, r->op,
                    group_name(r->group), r->bytes, r->t0, 1e3 * (r->t1 - r->t0));
        else
            fprintf(f, "  #%llu %s %s %zu B started %.6f IN FLIGHT %.1f s\n", (unsigned long long)r->seq, r->op,
                    group_name(r->group), r->bytes, r->t0, now - r->t0);
    }
}

static void dump_file(dt_watchdog *w, const char *state, const wd_rec *stuck, double now) {
    const char *dir = getenv("DTRAIN_RUN_DIR");
    if (!dir || !*dir) return;
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/watchdog-rank%d.txt", dir, w->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    /* First line, for the supervisor: rank state seq op */
    fprintf(f, "dtrain-watchdog rank=%d state=%s seq=%llu op=%s\n", w->rank, state,
            (unsigned long long)(stuck ? stuck->seq : w->seq), stuck ? stuck->op : "-");
    dump(w, f, state, stuck, now);
    fclose(f);
    rename(tmp, path);
}

static void *wd_main(void *arg) {
    dt_watchdog *w = arg;
    for (;;) {
        double tick = w->timeout / 10;
        tick = tick < 0.05 ? 0.05 : tick > 1.0 ? 1.0 : tick;
        usleep((useconds_t)(tick * 1e6));
        pthread_mutex_lock(&w->mu);
        if (w->stop) {
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        double now = wall();
        const wd_rec *stuck = NULL;
        for (int i = 0; i < WD_RING; i++) {
            const wd_rec *r = &w->ring[i];
            if (r->seq && r->t1 == 0 && now - r->t0 >= w->timeout && (!stuck || r->seq < stuck->seq)) stuck = r;
        }
        if (stuck) {
            fprintf(stderr, "watchdog: ");
            dump(w, stderr, "blocked", stuck, now);
            dump_file(w, "blocked", stuck, now);
            fflush(stderr);
            double grace = w->timeout / 4 < 2.0 ? 2.0 : w->timeout / 4 > 15.0 ? 15.0 : w->timeout / 4;
            pthread_mutex_unlock(&w->mu);
            usleep((useconds_t)(grace * 1e6)); /* the other ranks' watchdogs dump too */
            fprintf(stderr, "watchdog: rank %d: collective timeout (fault.collective_timeout = %.0f s); exiting with "
                    "status %d\n", w->rank, w->timeout, DT_EXIT_HANG);
            fflush(stderr);
            _exit(DT_EXIT_HANG);
        }
        int in_flight = 0;
        for (int i = 0; i < WD_RING; i++) in_flight |= w->ring[i].seq && w->ring[i].t1 == 0;
        if (!in_flight && !w->outside_dumped && now - w->last_end >= w->timeout) {
            dump_file(w, "outside", NULL, now);
            w->outside_dumped = 1;
        }
        pthread_mutex_unlock(&w->mu);
    }
}

void dt_comm_set_watchdog(dt_comm *c, double timeout_s) {
    dt_watchdog *w = wd_get(c);
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->timeout = timeout_s;
    w->last_end = wall();
    int start = timeout_s > 0 && !w->live && c->size[DT_GROUP_WORLD] > 1;
    pthread_mutex_unlock(&w->mu);
    if (start && pthread_create(&w->th, NULL, wd_main, w) == 0) w->live = 1;
}

void dt_wd_free(dt_comm *c) {
    dt_watchdog *w = c->wd;
    if (!w) return;
    if (w->live) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
    c->wd = NULL;
}
