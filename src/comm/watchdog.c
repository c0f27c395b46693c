/* The collective watchdog (comm.h): a ring of the last collectives of this rank, its record
 * file for the others (rankrec.h), and a thread that notices one blocking for too long and
 * names the ranks that never entered it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "comm/rankrec.h"

#define WD_RING 64

typedef struct wd_rec {
    uint64_t seq;
    const char *op;
    int group;
    int peer;    /* point-to-point: the peer's world rank; -1: a collective */
    int relaxed; /* entered while relaxed: the warm bound applies */
    size_t bytes;
    double t0, t1; /* monotonic seconds (durations, timeouts); t1 = 0 while in flight */
    double w0;     /* wall clock at the start (epoch seconds: dumps, records) */
} wd_rec;

typedef struct dt_watchdog {
    pthread_mutex_t mu;
    wd_rec ring[WD_RING];
    uint64_t seq;        /* collectives started */
    double last_end;     /* monotonic time the last collective finished (or the watchdog started) */
    double timeout;      /* in force for non-relaxed collectives (auto: recomputed) */
    int auto_mode, measuring, armed, relax;
    double slowest;      /* auto: slowest non-relaxed collective since measuring began */
    pthread_t th;
    int live, stop, outside_dumped;
    int fired; /* this rank's watchdog dumped a blocked operation and is exiting: the record stays on it */
    int rank, world;
    dt_rankrec *rec;
} dt_watchdog;

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Durations and timeouts: immune to clock steps (NTP, a manual date). */
static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *group_name(int g) {
    return g == DT_GROUP_WORLD ? "world" : g == DT_GROUP_NODE ? "node" : g == DT_GROUP_CROSS ? "cross" : "split";
}

static dt_watchdog *wd_get(dt_comm *c) {
    if (!c->wd) {
        dt_watchdog *w = calloc(1, sizeof *w);
        if (!w) return NULL;
        pthread_mutex_init(&w->mu, NULL);
        w->rank = c->rank[DT_GROUP_WORLD];
        w->world = c->size[DT_GROUP_WORLD];
        w->last_end = mono();
        if (w->world > 1) w->rec = dt_rankrec_open(getenv("DTRAIN_RUN_DIR"), w->rank, w->world);
        c->wd = w;
    }
    return c->wd;
}

/* The bound of one collective (caller holds the lock). */
static double limit_of(const dt_watchdog *w, const wd_rec *r) {
    return w->auto_mode && r->relaxed ? DT_WATCHDOG_WARM_S : w->timeout;
}

int dt_wd_begin(dt_comm *c, const char *op, dt_group g, size_t bytes, int peer) {
    dt_watchdog *w = wd_get(c);
    if (!w) return -1;
    pthread_mutex_lock(&w->mu);
    int slot = (int)(w->seq % WD_RING);
    double t = mono(), tw = wall();
    w->ring[slot] = (wd_rec){++w->seq, op, (int)g, peer, w->relax > 0, bytes, t, 0.0, tw};
    if (!w->fired) dt_rankrec_enter(w->rec, w->seq, op, peer, tw);
    pthread_mutex_unlock(&w->mu);
    return slot;
}

void dt_wd_end(dt_comm *c, int slot) {
    dt_watchdog *w = c->wd;
    if (!w || slot < 0) return;
    pthread_mutex_lock(&w->mu);
    double t = mono();
    wd_rec *r = &w->ring[slot];
    r->t1 = t;
    w->last_end = t;
    w->outside_dumped = 0;
    /* once fired, the record keeps the blocked operation the dump names until the exit: the
     * supervisor's chain of waits reads it (an operation that completes during the grace
     * period would otherwise leave the rank "in no operation" and cut the chain) */
    if (!w->fired) dt_rankrec_leave(w->rec, r->seq, r->w0 + (t - r->t0));
    if (w->auto_mode && w->measuring && !r->relaxed && t - r->t0 > w->slowest) {
        w->slowest = t - r->t0;
        if (!w->armed) goto out; /* measured now, used once armed */
        double to = DT_WATCHDOG_MULT * w->slowest;
        w->timeout = to < DT_WATCHDOG_FLOOR_S ? DT_WATCHDOG_FLOOR_S : to > DT_WATCHDOG_WARM_S ? DT_WATCHDOG_WARM_S : to;
    }
out:
    pthread_mutex_unlock(&w->mu);
}

/* Writes the ring, oldest first (caller holds the lock). */
static void dump(dt_watchdog *w, FILE *f, const char *state, const wd_rec *stuck, double now) {
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(f, "rank %d of %d on %s (pid %d): state %s; ", w->rank, w->world, host, (int)getpid(), state);
    if (stuck && stuck->peer >= 0)
        fprintf(f, "point-to-point #%llu %s (%s group, %zu bytes, peer rank %d) blocked for %.1f s\n",
                (unsigned long long)stuck->seq, stuck->op, group_name(stuck->group), stuck->bytes, stuck->peer,
                now - stuck->t0);
    else if (stuck)
        fprintf(f, "collective #%llu %s (%s group, %zu bytes) blocked for %.1f s\n", (unsigned long long)stuck->seq,
                stuck->op, group_name(stuck->group), stuck->bytes, now - stuck->t0);
    else
        fprintf(f, "not in a collective for %.1f s; last finished #%llu\n", now - w->last_end,
                (unsigned long long)w->seq);
    uint64_t first = w->seq > WD_RING ? w->seq - WD_RING + 1 : 1, from = w->seq > 8 ? w->seq - 7 : 1;
    if (from < first) from = first;
    for (uint64_t s = from; s <= w->seq; s++) {
        const wd_rec *r = &w->ring[(s - 1) % WD_RING];
        char peer[24] = "";
        if (r->peer >= 0) snprintf(peer, sizeof peer, " peer %d", r->peer);
        if (r->t1 > 0)
            fprintf(f, "  #%llu %s %s %zu B%s started %.6f took %.3f ms\n", (unsigned long long)r->seq, r->op,
                    group_name(r->group), r->bytes, peer, r->w0, 1e3 * (r->t1 - r->t0));
        else
            fprintf(f, "  #%llu %s %s %zu B%s started %.6f IN FLIGHT %.1f s\n", (unsigned long long)r->seq, r->op,
                    group_name(r->group), r->bytes, peer, r->w0, now - r->t0);
    }
}

/* A process state that cannot make progress. */
static int dead_state(const char *s) {
    return !strncmp(s, "stopped", 7) || !strncmp(s, "D-state", 7) || !strcmp(s, "zombie") || !strcmp(s, "gone");
}

/* One culprit: a line to `f` ("culprit rank=R pid=P last=E age=A host=H op=O state=S", S last:
 * it may hold spaces) and a clause appended to msg (found: clauses before it). */
static void name_culprit(FILE *f, char *msg, size_t n, size_t *len, int found, int r, int have,
                         const dt_rankrec_info *in, const char *state, uint64_t seq, double now) {
    double age = have && in->entered ? now - in->t_entered : 0.0;
    if (f)
        fprintf(f, "culprit rank=%d pid=%d last=%llu age=%.1f host=%s op=%s state=%s\n", r, have ? in->pid : 0,
                have ? (unsigned long long)in->entered : 0ULL, age, have ? in->host : "?",
                have && in->entered ? in->op : "-", state);
    if (*len >= n) return;
    if (!have)
        *len += (size_t)snprintf(msg + *len, n - *len, "%srank %d (no record: no collective yet)", found ? "; " : "", r);
    else
        *len += (size_t)snprintf(msg + *len, n - *len, "%srank %d on %s (pid %d, %s): %s #%llu %s %.1f s ago%s",
                                 found ? "; " : "", r, in->host, in->pid, state,
                                 seq && in->entered >= seq ? "inside it too, entered as" : "last entered",
                                 (unsigned long long)in->entered, in->entered ? in->op : "(none)", age,
                                 in->left == in->entered ? " and left it" : ", still inside");
    if (*len > n) *len = n;
}

/* The ranks holding up collective `seq`, from their record files, strongest evidence first:
 * ranks whose process cannot run (stopped, D-state, zombie, gone: visible on this machine
 * only), else ranks outside every collective short of #seq (computing, or stuck in the
 * kernel), else ranks without a record (none yet, or a run directory they cannot reach),
 * else ranks still inside an earlier collective (waiting on someone themselves). One line
 * each to `f` and a sentence to `msg`. Returns how many. */
static int culprits(const dt_watchdog *w, uint64_t seq, double now, FILE *f, char *msg, size_t n) {
    const char *dir = getenv("DTRAIN_RUN_DIR");
    int found = 0;
    size_t len = 0;
    msg[0] = 0;
    if (!dir || !*dir) return 0;
    for (int level = 0; level < 4 && !found; level++)
        for (int r = 0; r < w->world; r++) {
            if (r == w->rank) continue;
            dt_rankrec_info in;
            int have = dt_rankrec_read(dir, r, &in) == 0;
            const char *state = have ? dt_rankrec_state(&in) : "no record";
            int behind = have && in.entered < seq;
            /* "gone" inside #seq is a rank whose own watchdog fired first and exited. */
            int dead = have && dead_state(state) && (behind || strcmp(state, "gone"));
            int cls = dead ? 0 : behind && in.left == in.entered ? 1 : !have ? 2 : behind ? 3 : -1;
            if (cls != level) continue;
            name_culprit(f, msg, n, &len, found, r, have, &in, state, seq, now);
            found++;
        }
    return found;
}

/* A point-to-point wait: the chain of waits from this rank through its peer, rank to rank
 * (rankrec.h dt_rankrec_chain, live process states), to the rank at its end, which is the
 * culprit: in no operation, or unable to run (stopped, D-state, zombie, killed). When the end
 * waits in a collective, the collective's culprits (as culprits() finds them for the end's
 * collective) are named, the end itself when there are none; a cycle (a deadlock: nobody
 * stopped) names nobody. A line "chain R0 R1 ... end=E" to `f` after the culprit lines, the
 * chain and the culprits to `msg`. Returns how many culprits. */
static int chain_culprits(const dt_watchdog *w, const wd_rec *stuck, double now, FILE *f, char *msg, size_t n) {
    const char *dir = getenv("DTRAIN_RUN_DIR");
    msg[0] = 0;
    if (!dir || !*dir || w->world < 2) return 0;
    int chain[64];
    dt_chain_end end;
    chain[0] = w->rank, chain[1] = stuck->peer;
    int len = dt_rankrec_chain(dir, w->world, NULL, 1, chain, 2, w->world < 64 ? w->world : 64, &end);
    size_t l = (size_t)snprintf(msg, n, "chain of waits: ");
    for (int i = 0; i < len && l < n; i++) l += (size_t)snprintf(msg + l, n - l, "%srank %d", i ? " -> " : "", chain[i]);
    if (l < n) l += (size_t)snprintf(msg + l, n - l, " (%s); ", dt_chain_end_name(end));
    if (l > n) l = n;
    const int e = chain[len - 1];
    dt_rankrec_info in;
    int have = dt_rankrec_read(dir, e, &in) == 0, found = 0;
    if (end == DT_CHAIN_COLLECTIVE && have) {
        char sub[1024];
        found = culprits(w, in.entered, now, f, sub, sizeof sub);
        if (found && l < n) l += (size_t)snprintf(msg + l, n - l, "rank %d waits in collective #%llu %s, held up by: %s",
                                                  e, (unsigned long long)in.entered, in.op, sub);
    }
    if (end == DT_CHAIN_CYCLE) {
        if (l < n) snprintf(msg + l, n - l, "the ranks wait on each other: a deadlock, nobody outside it");
    } else if (!found) {
        if (l < n) l += (size_t)snprintf(msg + l, n - l, "at its end: ");
        if (l > n) l = n;
        name_culprit(f, msg, n, &l, 0, e, have, &in, have ? dt_rankrec_state(&in) : "no record", 0, now);
        found = 1;
    }
    if (f) {
        fprintf(f, "chain");
        for (int i = 0; i < len; i++) fprintf(f, " %d", chain[i]);
        fprintf(f, " end=%s\n", end == DT_CHAIN_DEAD ? "dead" : end == DT_CHAIN_OUTSIDE ? "outside"
                                 : end == DT_CHAIN_COLLECTIVE ? "collective" : end == DT_CHAIN_CYCLE ? "cycle"
                                 : end == DT_CHAIN_NORECORD ? "norecord" : "long");
    }
    return found;
}

/* The culprits of a stuck operation: along the chain of waits for a point-to-point one, the
 * ranks that never entered for a collective. */
static int stuck_culprits(const dt_watchdog *w, const wd_rec *stuck, double now, FILE *f, char *msg, size_t n) {
    return stuck->peer >= 0 ? chain_culprits(w, stuck, now, f, msg, n) : culprits(w, stuck->seq, now, f, msg, n);
}

static void dump_file(dt_watchdog *w, const char *state, const wd_rec *stuck, double now, double nowall) {
    const char *dir = getenv("DTRAIN_RUN_DIR");
    if (!dir || !*dir) return;
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/watchdog-rank%d.txt", dir, w->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    /* First line, for the supervisor: rank state seq op; then the culprits, then the ring. */
    fprintf(f, "dtrain-watchdog rank=%d state=%s seq=%llu op=%s time=%.3f peer=%d\n", w->rank, state,
            (unsigned long long)(stuck ? stuck->seq : w->seq), stuck ? stuck->op : "-", nowall,
            stuck ? stuck->peer : -1);
    if (stuck) {
        char msg[16];
        stuck_culprits(w, stuck, nowall, f, msg, sizeof msg);
    }
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
        double now = mono(), nowall = wall();
        const wd_rec *stuck = NULL;
        for (int i = 0; i < WD_RING; i++) {
            const wd_rec *r = &w->ring[i];
            if (r->seq && r->t1 == 0 && now - r->t0 >= limit_of(w, r) && (!stuck || r->seq < stuck->seq)) stuck = r;
        }
        if (stuck) {
            char who[2048];
            int n = stuck_culprits(w, stuck, nowall, NULL, who, sizeof who);
            fprintf(stderr, "watchdog: ");
            dump(w, stderr, "blocked", stuck, now);
            if (stuck->peer >= 0 && who[0])
                fprintf(stderr, "watchdog: rank %d waits in #%llu %s on rank %d; %s\n", w->rank,
                        (unsigned long long)stuck->seq, stuck->op, stuck->peer, who);
            else if (n)
                fprintf(stderr, "watchdog: rank %d waits in collective #%llu (%s) for %d rank(s) that cannot take part: %s\n",
                        w->rank, (unsigned long long)stuck->seq, stuck->op, n, who);
            dump_file(w, "blocked", stuck, now, nowall);
            fflush(stderr);
            w->fired = 1;
            double lim = limit_of(w, stuck);
            pthread_mutex_unlock(&w->mu);
            /* The other blocked ranks' watchdogs fire within a tick of this one: give them
             * that long to dump (the culprits come from the records, not from dumps). */
            usleep((useconds_t)((tick * 1.5 > 0.5 ? tick * 1.5 : 0.5) * 1e6));
            fprintf(stderr, "watchdog: rank %d: collective timeout (fault.collective_timeout: %.1f s%s); exiting with "
                    "status %d\n", w->rank, lim, w->auto_mode ? ", auto" : "", DT_EXIT_HANG);
            fflush(stderr);
            _exit(DT_EXIT_HANG);
        }
        int in_flight = 0;
        for (int i = 0; i < WD_RING; i++) in_flight |= w->ring[i].seq && w->ring[i].t1 == 0;
        if (!in_flight && !w->outside_dumped && now - w->last_end >= w->timeout) {
            dump_file(w, "outside", NULL, now, nowall);
            w->outside_dumped = 1;
        }
        pthread_mutex_unlock(&w->mu);
    }
}

void dt_comm_set_watchdog(dt_comm *c, double timeout_s) {
    dt_watchdog *w = wd_get(c);
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->auto_mode = timeout_s < 0;
    w->timeout = w->auto_mode ? DT_WATCHDOG_WARM_S : timeout_s;
    w->measuring = w->armed = 0, w->slowest = 0;
    w->last_end = mono();
    int start = (w->auto_mode || timeout_s > 0) && !w->live && c->size[DT_GROUP_WORLD] > 1;
    pthread_mutex_unlock(&w->mu);
    if (start && pthread_create(&w->th, NULL, wd_main, w) == 0) w->live = 1;
}

void dt_comm_watchdog_arm(dt_comm *c) {
    dt_watchdog *w = c->wd;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    if (w->auto_mode && !w->measuring) {
        w->measuring = 1; /* the first call: measure (the start-up collectives are behind us) */
        w->slowest = 0;
    } else if (w->auto_mode && !w->armed) {
        w->armed = 1;     /* the second: the measured slowest sets the timeout */
        double to = DT_WATCHDOG_MULT * w->slowest;
        w->timeout = to < DT_WATCHDOG_FLOOR_S ? DT_WATCHDOG_FLOOR_S : to > DT_WATCHDOG_WARM_S ? DT_WATCHDOG_WARM_S : to;
    }
    pthread_mutex_unlock(&w->mu);
}

void dt_comm_watchdog_relax(dt_comm *c, int on) {
    dt_watchdog *w = wd_get(c);
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->relax += on ? 1 : -1;
    if (w->relax < 0) w->relax = 0;
    pthread_mutex_unlock(&w->mu);
}

double dt_comm_watchdog_timeout(const dt_comm *c, double *slowest_s) {
    dt_watchdog *w = c->wd;
    if (slowest_s) *slowest_s = 0;
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    double t = w->live ? w->timeout : 0;
    if (slowest_s) *slowest_s = w->slowest;
    pthread_mutex_unlock(&w->mu);
    return t;
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
    dt_rankrec_close(w->rec);
    pthread_mutex_destroy(&w->mu);
    free(w);
    c->wd = NULL;
}
