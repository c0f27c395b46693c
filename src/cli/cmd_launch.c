/* dtrain launch: run a dtrain subcommand on N ranks under Open MPI's mpirun, with the flags
 * chosen for this machine (src/launch/launch.h, docs/launch.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/lock.h"
#include "cli/cli.h"
#include "launch/launch.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain launch -n N [--hostfile F | --hosts h1:2,h2:2] [--ranks-per-node K]\n"
            "                     [--simulate-nodes M] [--mpirun PATH] [--connect-timeout S] [--dry-run]\n"
            "                     [--max-restarts K [--backoff S] [--backoff-max S] [--grace S] [--run-dir D]\n"
            "                      [--min-ranks K]]\n"
            "                     -- <dtrain subcommand and its flags>\n"
            "\n"
            "Runs N ranks of this dtrain under Open MPI's mpirun: --allow-run-as-root for root,\n"
            "--oversubscribe and no binding when a machine gets more ranks than cores, else each\n"
            "rank bound to cores/ranks-per-node cores, OMP_NUM_THREADS = cores / ranks per node\n"
            "(unless set), DTRAIN_* variables forwarded to every rank.\n"
            "  --hosts LIST        hosts and slots, as mpirun --host (a host without :K has 1 slot)\n"
            "  --hostfile F        Open MPI hostfile (host [slots=K] [max_slots=K] per line)\n"
            "  --ranks-per-node K  K ranks on each node (mpirun --map-by ppr:K:node)\n"
            "  --simulate-nodes M  split the ranks of this machine into M nodes (DTRAIN_NODE_ID)\n"
            "  --mpirun PATH       the mpirun to use (default: mpirun from PATH)\n"
            "  --connect-timeout S with --hosts/--hostfile: every rank must have started within S seconds\n"
            "                      (default 30; 0 = no limit), else the job is stopped and the host that\n"
            "                      did not answer is named; ssh gets ConnectTimeout=S, BatchMode=yes and\n"
            "                      ServerAliveInterval=15 (after your own plm_rsh_args)\n"
            "  --dry-run           print the mpirun command line instead of running it\n"
            "  --max-restarts K    supervise: when a rank fails, is killed or hangs (collective watchdog),\n"
            "                      report which rank and how, and restart up to K times (train resumes\n"
            "                      from the newest intact checkpoint); SIGTERM/SIGUSR1 to launch = preemption:\n"
            "                      every rank checkpoints at the next step and exits 0, no restart\n"
            "  --backoff S         seconds before a restart (default 1), doubled per failure within 60 s\n"
            "  --backoff-max S     cap of the backoff (default 30)\n"
            "  --grace S           seconds a preempted job gets before SIGTERM (default 30)\n"
            "  --run-dir D         where ranks leave watchdog dumps (default ./.dtrain-run-PID, removed)\n"
            "  --min-ranks K       elastic (with --hosts): before a restart, probe every host; continue on\n"
            "                      the hosts that answer as long as they hold >= K ranks (train resumes\n"
            "                      resharded; set training.batch to keep the global batch)\n"
            "\n"
            "example: dtrain launch -n 4 --simulate-nodes 2 -- train cfg.yaml\n"
            "exit code: mpirun's (128 + signal if it was killed); 2 for a usage error; 1 when a remote\n"
            "start-up passed --connect-timeout\n");
}

/* Positive integer flag value, or 0 with ctx->err set. */
static int int_value(dt_ctx *ctx, const char *flag, const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 1 || v > 1000000) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: %s expects a positive integer, got '%s'", flag, s);
        return 0;
    }
    return (int)v;
}

int dt_cmd_launch(dt_ctx *ctx, int argc, char **argv) {
    dt_launch_cfg cfg = {0};
    cfg.connect_timeout = 30;
    dt_supervise_cfg sv = {-1, 1.0, 30.0, 30.0, NULL, 0};
    int dry = 0, have_n = 0, sep = -1;
    for (int i = 0; i < argc && sep < 0; i++) {
        char *a = argv[i], *eq = NULL, flag[64];
        if (!strcmp(a, "--")) {
            sep = i;
            break;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DT_EXIT_OK;
        }
        if (!strcmp(a, "--dry-run")) {
            dry = 1;
            continue;
        }
        if (a[0] != '-') {
            dt_fail(ctx, DT_ERR_CONFIG,
                    "dtrain launch: missing '--' before the dtrain subcommand '%s' (dtrain launch -n N -- %s ...)",
                    a, a);
            return DT_EXIT_USAGE;
        }
        /* --flag=value or --flag value */
        snprintf(flag, sizeof flag, "%s", a);
        if (a[1] == '-' && (eq = strchr(a, '=')) && (size_t)(eq - a) < sizeof flag) flag[eq - a] = 0;
        int known = !strcmp(flag, "-n") || !strcmp(flag, "-np") || !strcmp(flag, "--np") ||
                    !strcmp(flag, "--hosts") || !strcmp(flag, "--hostfile") ||
                    !strcmp(flag, "--ranks-per-node") || !strcmp(flag, "--simulate-nodes") ||
                    !strcmp(flag, "--mpirun") || !strcmp(flag, "--max-restarts") ||
                    !strcmp(flag, "--backoff") || !strcmp(flag, "--backoff-max") || !strcmp(flag, "--grace") ||
                    !strcmp(flag, "--run-dir") || !strcmp(flag, "--min-ranks") || !strcmp(flag, "--connect-timeout");
        if (!known) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: unknown flag '%s' (see dtrain launch --help)", a);
            return DT_EXIT_USAGE;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc || !strcmp(argv[i + 1], "--")) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: %s needs a value", flag);
                return DT_EXIT_USAGE;
            }
            val = argv[++i];
        }
        if (!strcmp(flag, "--max-restarts") || !strcmp(flag, "--backoff") || !strcmp(flag, "--backoff-max") ||
            !strcmp(flag, "--grace")) {
            char *end;
            double v = strtod(val, &end);
            int is_int = !strcmp(flag, "--max-restarts");
            if (!*val || *end || !(v >= 0 && v <= 1e6) || (is_int && v != (double)(int)v)) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: %s expects a %s, got '%s'", flag,
                        is_int ? "non-negative integer" : "number of seconds >= 0", val);
                return DT_EXIT_USAGE;
            }
            if (is_int) sv.max_restarts = (int)v;
            else if (!strcmp(flag, "--backoff")) sv.backoff = v;
            else if (!strcmp(flag, "--backoff-max")) sv.backoff_max = v;
            else sv.grace = v;
            continue;
        }
        if (!strcmp(flag, "--connect-timeout")) {
            char *end;
            long v = strtol(val, &end, 10);
            if (!*val || *end || *val == '-' || *val == '+' || v < 0 || v > 86400) {
                dt_fail(ctx, DT_ERR_CONFIG,
                        "dtrain launch: --connect-timeout expects whole seconds from 0 (no limit) to 86400, got '%s'",
                        val);
                return DT_EXIT_USAGE;
            }
            cfg.connect_timeout = (int)v;
            continue;
        }
        if (!strcmp(flag, "--run-dir")) {
            sv.run_dir = val;
            continue;
        }
        if (!strcmp(flag, "--min-ranks")) {
            int v = int_value(ctx, flag, val);
            if (!v) return DT_EXIT_USAGE;
            sv.min_ranks = v;
            continue;
        }
        if (!strcmp(flag, "--hosts")) cfg.hosts = val;
        else if (!strcmp(flag, "--hostfile")) cfg.hostfile = val;
        else if (!strcmp(flag, "--mpirun")) cfg.mpirun = val;
        else {
            int v = int_value(ctx, flag, val);
            if (!v) return DT_EXIT_USAGE;
            if (!strcmp(flag, "--ranks-per-node")) cfg.ranks_per_node = v;
            else if (!strcmp(flag, "--simulate-nodes")) cfg.simulate_nodes = v;
            else {
                cfg.nranks = v;
                have_n = 1;
            }
        }
    }
    if (!have_n) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: -n N (the number of ranks) is required");
        return DT_EXIT_USAGE;
    }
    if (sep < 0) {
        dt_fail(ctx, DT_ERR_CONFIG,
                "dtrain launch: missing '--' before the dtrain subcommand (dtrain launch -n N -- train cfg.yaml)");
        return DT_EXIT_USAGE;
    }
    cfg.argc = argc - sep - 1;
    cfg.argv = argv + sep + 1;

    if (sv.min_ranks > 0 && (sv.max_restarts < 0 || !cfg.hosts || sv.min_ranks > cfg.nranks)) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain launch: --min-ranks %d needs --max-restarts and --hosts, and at most -n %d",
                sv.min_ranks, cfg.nranks);
        return DT_EXIT_USAGE;
    }
    if (sv.max_restarts >= 0 && !dry) {
        /* The supervisor holds the lock on train's checkpoint.dir across its restarts; the
         * ranks accept it by its token (ckpt/lock.h). Arguments train refuses are left to the
         * first attempt to report (status 2: not restarted). */
        dt_ckpt_lock *lock = NULL;
        char ckdir[DT_PATH_MAX];
        dt_ctx pctx;
        dt_ctx_init(&pctx);
        if (cfg.argc > 0 && !strcmp(cfg.argv[0], "train") &&
            dt_cli_train_ckpt_dir(&pctx, cfg.argc - 1, cfg.argv + 1, ckdir, sizeof ckdir) == DT_OK && ckdir[0]) {
            dt_status lst = dt_ckpt_lock_acquire(ctx, ckdir, "checkpoint.dir ", "dtrain launch (supervisor)", &lock);
            if (lst != DT_OK) return dt_cli_exit_code(lst);
            if (!dt_ckpt_lock_inherited(lock)) setenv(DT_CKPT_LOCK_ENV, dt_ckpt_lock_token(lock), 1);
            fprintf(stderr, "dtrain launch: holding the lock on checkpoint.dir %s across restarts\n", ckdir);
        }
        int code = 0;
        dt_status sst = dt_launch_supervise(ctx, &cfg, &sv, &code);
        dt_ckpt_lock_release(lock);
        if (sst != DT_OK) return dt_cli_exit_code(sst);
        if (code != 0) dt_fail(ctx, DT_ERR_BACKEND, "dtrain launch: the job exited with status %d", code);
        return code;
    }
    if (dry) {
        dt_launch_job job;
        dt_status st = dt_launch_init(ctx, &cfg, &job);
        if (st != DT_OK) return dt_cli_exit_code(st);
        dt_launch_print(&job, stdout);
        dt_launch_free(&job);
        return DT_EXIT_OK;
    }
    int code = 0;
    dt_status st = dt_launch_run(ctx, &cfg, &code);
    /* A failed start-up sets the status (1, or 128 + the signal that stopped it). */
    if (st != DT_OK) return code > 0 ? code : dt_cli_exit_code(st);
    if (code == 0 && dt_launch_preempted())
        fprintf(stderr, "dtrain launch: preempted by a signal: the ranks were asked to checkpoint and stop "
                        "(SIGUSR1), and the job ended cleanly\n");
    /* 128 + sig: mpirun itself was killed, or it passes on a rank's death by that signal. */
    if (code > 128 && code < 128 + 65)
        dt_fail(ctx, DT_ERR_BACKEND, "dtrain launch: mpirun exited with status %d (signal %d, %s)", code,
                code - 128, strsignal(code - 128));
    else if (code != 0 && !dt_launch_rank_error()) /* else a rank has said what went wrong */
        dt_fail(ctx, DT_ERR_BACKEND, "dtrain launch: mpirun exited with status %d", code);
    return code;
}
