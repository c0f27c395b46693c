/* rankrec.h - per-rank collective records that other processes read without the rank's help.
 *
 * Every rank of a launched job (DTRAIN_RUN_DIR set by `dtrain launch`) maps a small file
 * RUN_DIR/rank<r>.rec and, on each collective it enters and leaves, stores the sequence
 * number, the operation and the time into it: plain memory stores into a shared mapping (no
 * system call on the hot path). A rank that cannot speak (stopped, stuck in the kernel, on a
 * dead link) leaves its last record behind, so the watchdog of a rank blocked in collective
 * #S, and the supervisor after the job ended, can name the ranks that never entered #S, their
 * host and pid, what they last did and when, and - when that pid is visible here (the same
 * kernel and pid namespace: one machine, simulated hosts included) - its process state.
 *
 *   dt_rankrec *me = dt_rankrec_open(getenv("DTRAIN_RUN_DIR"), rank, world);   // NULL: none
 *   dt_rankrec_enter(me, seq, "allreduce", -1, t);  ...  dt_rankrec_leave(me, seq, t);
 *
 * A point-to-point operation (send, receive, the wait on a non-blocking one) records its
 * peer's world rank, so a rank blocked in one points at the rank it waits on; following those
 * pointers from rank to rank (dt_rankrec_chain) finds the end of a chain of waits - the stage
 * of a pipeline that stopped while its neighbours wait on it, and theirs on them.
 *   dt_rankrec_info peer;
 *   if (dt_rankrec_read(dir, 1, &peer) == 0) printf("%s\n", dt_rankrec_state(&peer));
 */
#ifndef DT_RANKREC_H
#define DT_RANKREC_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt_rankrec dt_rankrec;

/* A snapshot of one rank's record. */
typedef struct dt_rankrec_info {
    int rank, world, pid;
    char host[64];
    char boot[40], pidns[40]; /* where the pid is meaningful: boot id and pid namespace */
    uint64_t entered, left;   /* last collective entered / left (0 = none yet) */
    char op[24];              /* the operation of `entered` */
    int peer;                 /* its peer's world rank when point-to-point, else -1 */
    double t_entered, t_left; /* wall clock, epoch seconds */
} dt_rankrec_info;

/* Creates or reuses DIR/rank<r>.rec, fills the identity part, maps it. NULL when dir is
 * NULL/empty or the file cannot be made (the job then runs without records). */
dt_rankrec *dt_rankrec_open(const char *dir, int rank, int world);
void dt_rankrec_close(dt_rankrec *r);
/* Hot path: stores only. */
void dt_rankrec_enter(dt_rankrec *r, uint64_t seq, const char *op, int peer, double t);
void dt_rankrec_leave(dt_rankrec *r, uint64_t seq, double t);

/* Reads rank's record from DIR: 0 on success, -1 if missing or malformed. */
int dt_rankrec_read(const char *dir, int rank, dt_rankrec_info *out);
/* The process state of the record's pid as seen from here: "running", "sleeping",
 * "stopped", "D-state (uninterruptible)", "zombie", "gone", or "not visible from here"
 * (another machine or pid namespace). */
const char *dt_rankrec_state(const dt_rankrec_info *in);

/* A record inside an operation it has not left (a blocked rank, or one that exited in it). */
int dt_rankrec_inside(const dt_rankrec_info *in);

/* How a chain of point-to-point waits ends (dt_rankrec_chain). */
typedef enum dt_chain_end {
    DT_CHAIN_OUTSIDE,    /* the end rank is in no operation: computing, stopped or dead outside */
    DT_CHAIN_DEAD,       /* its process cannot run: stopped, D-state, zombie, or gone */
    DT_CHAIN_COLLECTIVE, /* it waits inside a collective (the collective report takes over) */
    DT_CHAIN_NORECORD,   /* it has no record (yet, or none reachable) */
    DT_CHAIN_STOP,       /* a rank the caller flagged (stop[r]) */
    DT_CHAIN_CYCLE,      /* it waits on a rank already in the chain: a deadlock, nobody stopped */
    DT_CHAIN_LONG        /* max ranks without an end */
} dt_chain_end;

/* Follows a chain of point-to-point waits. chain[0..n-1] is given (n >= 1; chain[n-1] is the
 * rank examined next, e.g. {me, my peer}); each examined rank that is inside a point-to-point
 * operation and can run is followed to its record's peer, until one ends the chain: it is
 * chain[ret-1], and *end says why. live: judge process states (dt_rankrec_state) as now - a
 * stopped/D-state/zombie process ends the chain even inside an operation, a gone one too unless
 * its own watchdog fired (DIR/watchdog-rank<r>.txt says blocked: it timed out waiting and
 * exited, its record still says on whom); not live (after the job): records only. stop
 * (optional, world entries): ranks at which the chain ends. Returns the chain's length. */
int dt_rankrec_chain(const char *dir, int world, const unsigned char *stop, int live, int *chain, int n, int max,
                     dt_chain_end *end);
/* "stopped" etc. for DT_CHAIN_* (a word for messages). */
const char *dt_chain_end_name(dt_chain_end e);

#endif
