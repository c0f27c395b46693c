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
 *   dt_rankrec_enter(me, seq, "allreduce", t);  ...  dt_rankrec_leave(me, seq, t);
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
    double t_entered, t_left; /* wall clock, epoch seconds */
} dt_rankrec_info;

/* Creates or reuses DIR/rank<r>.rec, fills the identity part, maps it. NULL when dir is
 * NULL/empty or the file cannot be made (the job then runs without records). */
dt_rankrec *dt_rankrec_open(const char *dir, int rank, int world);
void dt_rankrec_close(dt_rankrec *r);
/* Hot path: stores only. */
void dt_rankrec_enter(dt_rankrec *r, uint64_t seq, const char *op, double t);
void dt_rankrec_leave(dt_rankrec *r, uint64_t seq, double t);

/* Reads rank's record from DIR: 0 on success, -1 if missing or malformed. */
int dt_rankrec_read(const char *dir, int rank, dt_rankrec_info *out);
/* The process state of the record's pid as seen from here: "running", "sleeping",
 * "stopped", "D-state (uninterruptible)", "zombie", "gone", or "not visible from here"
 * (another machine or pid namespace). */
const char *dt_rankrec_state(const dt_rankrec_info *in);

#endif
