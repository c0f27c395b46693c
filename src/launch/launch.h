/* launch.h - turns "N ranks of this dtrain, optionally on these hosts" into an Open MPI
 * mpirun command line, and runs it. Used by `dtrain launch`; `mpirun -n N dtrain ...` keeps
 * working without it: this module only chooses the flags a user would otherwise have to
 * know (root, oversubscription, binding, OpenMP threads per rank, simulated nodes).
 *
 *   dt_launch_cfg cfg = {.nranks = 4, .simulate_nodes = 2, .argc = n, .argv = args};
 *   int code;
 *   dt_status st = dt_launch_run(ctx, &cfg, &code);     // plans, runs, waits
 *   // or: dt_launch_job job; DT_CHECK(dt_launch_init(ctx, &cfg, &job));
 *   //     dt_launch_print(&job, stdout); dt_launch_free(&job);
 *
 * Placement rules (docs/launch.md):
 *  - ranks per node: --ranks-per-node K when given; else on --hosts/--hostfile the most
 *    ranks any host gets when mpirun fills slots in order; else N (all on this machine,
 *    simulated nodes included: they share this machine's cores).
 *  - cores = CPUs this process may run on (sched_getaffinity); remote hosts are assumed to
 *    have as many (homogeneous cluster).
 *  - ranks per node > cores: --oversubscribe --bind-to none (pinning several busy ranks to
 *    one core would serialise them behind each other; the scheduler does better).
 *    Otherwise --map-by slot:PE=c --bind-to core (ppr:K:node:PE=c with K) with
 *    c = cores / ranks per node: each rank owns c cores for its c OpenMP threads, so the
 *    threads of different ranks never share a core and caches stay warm.
 *  - OMP_NUM_THREADS = max(1, cores / ranks per node), unless already set (then forwarded).
 *  - --simulate-nodes M: consecutive near-equal blocks of ranks, one MPMD app context each
 *    with -x DTRAIN_NODE_ID=node<i>.
 *  - every DTRAIN_* variable of the caller's environment is forwarded (-x NAME), so remote
 *    ranks see what local ones see.
 *  - remote launches (--hosts/--hostfile) whose rsh agent is ssh: --mca plm_rsh_args with
 *    "-o ConnectTimeout=T -o BatchMode=yes -o ServerAliveInterval=15" after the user's own
 *    plm_rsh_args (environment or MCA parameter file), so ssh never waits for a password or
 *    a host key answer, gives up on a host that does not answer, and notices a dead link. ssh
 *    takes the first value of an option, so the user's own -o settings win. Another agent
 *    (rsh, a site's wrapper) gets nothing added.
 */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H

#include <stdio.h>

#include "core/status.h"

/* What the user asked for. Strings are borrowed; they must outlive the job. */
typedef struct dt_launch_cfg {
    int nranks;             /* -n: total ranks, >= 1 */
    const char *hosts;      /* --hosts "h1:2,h2:2" (slots default to 1, as in mpirun); or NULL */
    const char *hostfile;   /* --hostfile path (Open MPI format); or NULL */
    int ranks_per_node;     /* --ranks-per-node; 0 = derived */
    int simulate_nodes;     /* --simulate-nodes; 0 = off */
    const char *mpirun;     /* --mpirun path or name; NULL = "mpirun" from PATH */
    const char *program;    /* NULL = this executable (/proc/self/exe) */
    int cpus;               /* 0 = sched_getaffinity; tests set it to get fixed output */
    int connect_timeout;    /* --connect-timeout: seconds a remote start-up may take (ssh's
                               ConnectTimeout, the launcher's deadline); 0 = no limit */
    const char *startup_dir; /* set by the launcher: ssh's LocalCommand marks hosts here
                               (launch_impl.h); NULL = no marks (--dry-run) */
    int argc;               /* the dtrain subcommand and its arguments (after "--") */
    char **argv;
} dt_launch_cfg;

/* The planned job: the mpirun argv and the numbers it was derived from. */
typedef struct dt_launch_job {
    int nodes;          /* hosts, simulated nodes, or 1 */
    int ranks_per_node; /* most ranks on one physical machine */
    int cpus;           /* cores per machine the plan assumed */
    int threads;        /* OMP_NUM_THREADS per rank (0 = the user's value is forwarded) */
    int oversubscribed; /* more ranks than cores on a machine: no binding */
    int argc;
    char **argv;        /* NULL-terminated; argv[0] is the resolved mpirun path */
    /* For the start-up watch (launch_impl.h): */
    int nranks;
    int nhosts;         /* --hosts/--hostfile hosts in order (0: a local launch) */
    char **hosts;
    int *host_ranks;    /* ranks mpirun places on each host (by slot, or K per node) */
    int connect_timeout;
    int ssh_marks;      /* ssh's LocalCommand marks the hosts it reached (cfg->startup_dir) */
} dt_launch_job;

/* Validates cfg and builds the mpirun command line. Errors are DT_ERR_CONFIG with one line
 * naming the flag (or file:line of the hostfile); job is untouched on failure. */
dt_status dt_launch_init(dt_ctx *ctx, const dt_launch_cfg *cfg, dt_launch_job *job);
/* Frees what dt_launch_init allocated; a zeroed job is fine. */
void dt_launch_free(dt_launch_job *job);
/* Writes the command line as one shell-quoted line (with a newline) to f. */
void dt_launch_print(const dt_launch_job *job, FILE *f);
/* Plans the job (dt_launch_init), runs mpirun in a process group of its own and waits for
 * it. The first SIGINT/SIGTERM sent to this process by another process is passed to mpirun
 * as SIGUSR1 (a preemption request: dtrain's ranks checkpoint and exit 0), a second one as it
 * is (mpirun aborts the job; if it has not ended 10 s later, the launcher ends it); a
 * terminal's ^C is passed on as it is; SIGHUP becomes SIGTERM. A remote launch whose ranks
 * have not all started within cfg->connect_timeout seconds is stopped, with one error naming
 * the host(s) that did not answer; a signal before the ranks have started stops it at once
 * (there is nothing to checkpoint). On every way out, whatever mpirun left behind (an ssh,
 * a rank) is ended: SIGTERM, SIGKILL 2 s later (0.5 s once mpirun has exited). mpirun's stderr passes through the launcher,
 * which drops the start-up reports and, after a rank's own error line, mpirun's abort banners.
 * *exit_code = mpirun's exit status, 128 + signal if it was killed. Returns an error when the
 * plan is refused, mpirun could not be started, or the start-up failed (the message names
 * the host). */
dt_status dt_launch_run(dt_ctx *ctx, const dt_launch_cfg *cfg, int *exit_code);
/* Whether dt_launch_run turned a signal into a preemption request (SIGUSR1 to mpirun). */
int dt_launch_preempted(void);
/* Whether a rank printed its own error line during dt_launch_run (mpirun's banners after it
 * were dropped; the caller need not repeat mpirun's exit status either). */
int dt_launch_rank_error(void);

/* The supervisor (dtrain launch --max-restarts K): runs the job; when it fails (a rank
 * exits non-zero, is killed, the collective watchdog fires, or a remote start-up passes
 * --connect-timeout: the host that did not answer is named) it logs which rank failed
 * and how, waits a backoff, and runs it again - for `train` with "--resume auto" appended,
 * so it continues from the newest intact checkpoint - up to K times. SIGTERM, SIGUSR1 or
 * SIGINT to the supervisor is a preemption: SIGUSR1 goes to every rank (checkpoint at the
 * next step boundary, exit 0), the job gets `grace` seconds (a second signal: none), then
 * SIGTERM and SIGKILL; it is not restarted. mpirun runs in its own process group, so a
 * terminal's ^C or timeout(1) reaches the supervisor only. Ranks get DTRAIN_RUN_DIR (watchdog dumps) and
 * DTRAIN_RESTART (the attempt number). mpirun's output passes through, line by line. */
typedef struct dt_supervise_cfg {
    int max_restarts;    /* restarts allowed after the first attempt */
    double backoff;      /* seconds before the first restart, doubled per quick failure */
    double backoff_max;  /* cap of the backoff */
    double grace;        /* seconds from a preemption signal to SIGTERM */
    const char *run_dir; /* NULL: .dtrain-run-<pid> in the working directory (removed at the end) */
    int min_ranks;       /* elastic (cfg->hosts): before a restart, drop the hosts that do not
                            answer a probe; go on while >= min_ranks ranks remain (0 = off) */
} dt_supervise_cfg;

dt_status dt_launch_supervise(dt_ctx *ctx, const dt_launch_cfg *cfg, const dt_supervise_cfg *sc,
                              int *exit_code);

#endif
