/* launch_impl.h - what launch.c (dtrain launch) and supervise.c (--max-restarts) share:
 * the job's processes, the start-up watch and the filter for mpirun's stderr (proc.c).
 *
 * The job's processes. mpirun starts in a process group of its own, but what it starts does
 * not all stay there: Open MPI puts every ssh it runs into a group of its own (setpgid), and
 * when mpirun dies first that ssh is re-parented to init and lives on. So the launcher makes
 * itself the sub-reaper of its descendants (PR_SET_CHILD_SUBREAPER: an orphan becomes our
 * child, not init's) and, on every way out, ends the whole tree below it from /proc:
 *
 *   dt_proc_become_reaper();                      // once, before mpirun starts
 *   ... run mpirun (own process group) ...
 *   dt_proc_kill_tree(mpirun_pid, 2.0, &st, &reaped);   // TERM, up to 2 s, KILL, reap
 *
 * The start-up watch (remote launches, --connect-timeout T > 0). Every rank of the job writes
 * one line to stderr as soon as its process runs (cli/main.c):
 *     dtrain-launch-started <DTRAIN_LAUNCH_ID> <rank>
 * which the launcher takes out of mpirun's stderr; the start-up is over when all N ranks have
 * said so. Open MPI starts no rank before the daemon of every host has called back, so a host
 * that never answers holds up every rank, and the ranks alone cannot say which host it was:
 * ssh can. When the rsh agent is ssh, its LocalCommand (run on this machine once the session
 * to a host is authenticated) touches DIR/up-<host>.up; the hosts without that file, and not
 * this machine, are the ones that did not answer. Without ssh (another agent), the hosts of
 * the ranks that did not report are named. */
#ifndef DT_LAUNCH_IMPL_H
#define DT_LAUNCH_IMPL_H

#include <sys/types.h>

#include "launch/launch.h"

void dt_proc_become_reaper(void);
/* Ends every descendant of this process (and process group `pid`, when pid > 0): SIGTERM,
 * up to `grace` seconds for them to exit, then SIGKILL, reaping our children (bounded: 5 s
 * after the SIGKILL at most). When `pid` is reaped here its wait status goes to *status and
 * *reaped is set. Returns how many processes were signalled. */
int dt_proc_kill_tree(pid_t pid, double grace, int *status, int *reaped);
/* Reaps finished children other than mpirun without blocking (re-parented orphans). */
void dt_proc_reap_orphans(pid_t keep);

double dt_launch_now(void); /* CLOCK_MONOTONIC seconds */

typedef struct dt_startup {
    char id[48];        /* DTRAIN_LAUNCH_ID of this launcher */
    char dir[256];      /* ssh marks (LocalCommand) and its script; "" when none */
    int timeout;        /* seconds; 0 = no deadline */
    int nranks, nseen;
    unsigned char *seen;
    double t0, deadline; /* monotonic; deadline 0 = none */
    const dt_launch_job *job; /* of the current attempt */
    unsigned char *named;     /* per host: a line of mpirun's stderr (ssh's error) named it */
} dt_startup;

/* Arms the watch for cfg (remote: cfg->hosts or cfg->hostfile with connect_timeout > 0):
 * sets DTRAIN_LAUNCH_ID (forwarded to the ranks like every DTRAIN_* variable) and, for ssh
 * marks, makes the directory. *cfg_out = cfg with startup_dir set. A zeroed su (nothing
 * armed) is the result when there is no deadline. */
dt_status dt_startup_begin(dt_ctx *ctx, dt_startup *su, const dt_launch_cfg *cfg, dt_launch_cfg *cfg_out);
/* Before each mpirun start: forgets the ranks and marks of a previous attempt, links the
 * job's hosts to the mark script; deadline = now + timeout. */
dt_status dt_startup_reset(dt_ctx *ctx, dt_startup *su, const dt_launch_job *job);
/* Whether the watch is armed and not all ranks have started yet. */
int dt_startup_pending(const dt_startup *su);
/* A line of mpirun's stderr: 1 if it was a start-up report (consumed: not to be printed).
 * Other lines during the start-up are searched for the hosts' names (ssh's errors). */
int dt_startup_line(dt_startup *su, const char *line, int scan_names);
/* Whether a line frames one of Open MPI's banners (74 dashes): they name hosts of their own
 * ("target node: h1"), so names are looked for outside them only. */
int dt_launch_is_frame(const char *line);
/* One sentence naming the hosts that did not answer (or whose ranks did not start), "within
 * T s (--connect-timeout)" when the deadline passed; "" when it cannot name one. */
void dt_startup_describe(const dt_startup *su, const dt_launch_job *job, int deadline_passed, char *buf,
                         size_t n);
/* Removes the marks directory. */
void dt_startup_end(dt_startup *su);

/* mpirun's stderr, line by line (plain `dtrain launch`): start-up reports are taken out, and
 * once a rank has printed its own error line ("host:rank error: ..."), mpirun's banners that
 * follow (dash-framed blocks: "Primary job terminated normally ...", "mpirun detected that one
 * or more processes exited with non-zero status ...", "MPI_ABORT was invoked ...") and its
 * one-line sequels ("1 more process has sent help message ...") are dropped:
 * the rank's line says what went wrong, and the exit status is passed on. During a watched
 * start-up every banner ("ORTE was unable to reliably start one or more daemons", ...) is held
 * back (`held`): when the start-up fails the launcher names the host instead, or prints them
 * when it cannot; once every rank has started they are printed. */
typedef struct dt_errfilter {
    char buf[8192];
    size_t n;
    int rank_error;   /* a rank's "error:" line passed */
    int in_block;     /* inside a dash-framed block: collected in blk */
    char *blk;
    size_t blen, bcap;
    double blk_t;     /* when the block began */
    char *held;       /* the daemon-start banner, held back */
    size_t hlen, hcap;
    int fd_out;       /* where lines go (STDERR_FILENO) */
} dt_errfilter;

/* Reads what is there on fd. Returns 0 at end of file. */
int dt_errfilter_pump(dt_errfilter *f, int fd, dt_startup *su);
/* Every loop turn: a block open for 2 s is not a banner, it is passed on; held banners are
 * printed once the start-up is over. */
void dt_errfilter_tick(dt_errfilter *f, const dt_startup *su);
/* At the end: what is left (a partial line, an unclosed block); the held banner too unless
 * drop_held. */
void dt_errfilter_finish(dt_errfilter *f, int drop_held);

#endif
