/* dtrain train: parse the configuration, run the training (src/train/run.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/lock.h"
#include "cli/cli.h"
#include "model/model.h"
#include "core/log.h"
#include "train/preempt.h"
#include "train/run.h"

typedef struct train_flags {
    const char *save_weights;
    const char *resume;
    int print_config, help;
} train_flags;

static int train_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    train_flags *f = ud;
    if (strcmp(argv[*i], "--help") == 0 || strcmp(argv[*i], "-h") == 0) return f->help = 1;
    if (strcmp(argv[*i], "--print-config") == 0) return f->print_config = 1;
    if (strcmp(argv[*i], "--resume") == 0) {
        /* An optional value: the next argument unless it is a flag or the YAML file. */
        const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
        size_t n = v ? strlen(v) : 0;
        int yaml = n > 5 && (!strcmp(v + n - 5, ".yaml") || (n > 4 && !strcmp(v + n - 4, ".yml")));
        if (v && v[0] != '-' && !yaml) {
            f->resume = v;
            ++*i;
        } else {
            f->resume = "latest";
        }
        return 1;
    }
    if (strncmp(argv[*i], "--resume=", 9) == 0) {
        f->resume = argv[*i] + 9;
        return 1;
    }
    if (strcmp(argv[*i], "--save-weights") == 0) {
        if (*i + 1 >= argc) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain train: --save-weights needs a file name");
            return -1;
        }
        f->save_weights = argv[++*i];
        return 1;
    }
    return 0;
}

int dt_cmd_train(dt_ctx *ctx, int argc, char **argv) {
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    train_flags fl = {0};
    dt_status st = dt_cli_parse_run(ctx, "train", argc, argv, &cfg, train_flag, &fl);
    if (fl.help) {
        printf("usage: dtrain train [CONFIG.yaml] [--set KEY=VALUE ...] [--print-config]\n"
               "                    [--save-weights FILE] [--resume [latest|auto|DIR]]\n\n"
               "--resume continues from checkpoint.dir's newest intact checkpoint (latest, the default),\n"
               "from it or from scratch if there is none (auto), or from DIR (a checkpoint directory or\n"
               "one step-NNNNNNNN directory); the world size and strategy may differ from the saving run.\n"
               "checkpoint.dir is locked while the run writes it (checkpoint.dir/.lock): a second run on it\n"
               "exits with status 2 naming the first's pid and host.\n"
               "SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) checkpoints at the next step boundary and exits with\n"
               "status 0; a second SIGINT stops at once (status 130).\n\n"
               "Trains a model as configured (file first, then flags in order). Logs a line per\n"
               "logging.every steps (a live status line on a terminal) and writes one JSON object per\n"
               "logged step and evaluation to logging.metrics.\n\n"
               "Presets (model.preset): %s\n\n", dt_model_preset_list());
        dt_cli_print_config_help();
        return DT_EXIT_OK;
    }
    if (st == DT_OK && fl.resume) {
        if (strlen(fl.resume) >= sizeof cfg.resume) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain train: --resume path too long");
            return DT_EXIT_USAGE;
        }
        snprintf(cfg.resume, sizeof cfg.resume, "%s", fl.resume);
        st = dt_cfg_check_resume(ctx, &cfg);
    }

    /* Under mpirun a configuration error goes through dt_cli_comm_init (below): one rank prints it. */
    int under_mpi = dt_comm_launched_by_mpi();
    if (st != DT_OK && (!under_mpi || fl.print_config)) return dt_cli_exit_code(st);
    if (fl.print_config) {
        dt_cfg_print(stdout, &cfg);
        return DT_EXIT_OK;
    }
    /* The writer of checkpoint.dir (rank 0: manifests, `latest`, pruning) locks it first of
     * all, so a second run on it is refused at once, before any work or any write; the other
     * ranks learn of a refusal through dt_cli_comm_init. */
    dt_ckpt_lock *lock = NULL;
    int env_rank = dt_comm_env_rank();
    if (st == DT_OK && cfg.ckpt_dir[0] && env_rank == 0)
        st = dt_ckpt_lock_acquire(ctx, cfg.ckpt_dir, "checkpoint.dir ", "dtrain train", &lock);
    if (st != DT_OK && !under_mpi) return dt_cli_exit_code(st);
    /* Before MPI starts its threads: SIGTERM/SIGUSR1 go to one sigwait thread only. */
    if (st == DT_OK && dt_preempt_setup() != 0)
        dt_log_warn(ctx, "cannot start the preemption signal thread: SIGTERM ends the run");
    dt_comm *comm;
    /* tensor-parallel ranks run their TP collectives, pipeline stages their transfers, expert-
     * parallel ranks their all-to-alls, beside the gradient buckets' thread */
    st = dt_cli_comm_init_mesh(ctx, &comm, st,
                               st == DT_OK && ((cfg.tp > 1 && !cfg.tp_blocks) || (cfg.pp > 1 && !cfg.pp_blocks) || cfg.ep > 1 ||
                                               !strcmp(cfg.layout, "auto")));
    if (st == DT_OK && cfg.ckpt_dir[0] && env_rank < 0) { /* the rank is known only now */
        dt_status lst = DT_OK;
        if (dt_comm_rank(comm, DT_GROUP_WORLD) == 0)
            lst = dt_ckpt_lock_acquire(ctx, cfg.ckpt_dir, "checkpoint.dir ", "dtrain train", &lock);
        if ((st = dt_cli_agree(ctx, comm, lst)) != DT_OK) {
            dt_ckpt_lock_release(lock);
            dt_comm_free(comm);
        }
    }
    if (st != DT_OK) {
        dt_ckpt_lock_release(lock);
        return dt_cli_exit_code(st);
    }
    dt_cli_rank_setup(ctx, comm, &cfg);
    st = dt_cli_layout_auto(ctx, &cfg, comm);
    if (st == DT_OK) st = dt_cfg_apply_world(ctx, &cfg, dt_comm_size(comm, DT_GROUP_WORLD));
    if (st != DT_OK) { /* the same on every rank (one configuration, one world): rank 0 says it once */
        if (dt_comm_rank(comm, DT_GROUP_WORLD) != 0) ctx->err[0] = 0;
        dt_ckpt_lock_release(lock);
        dt_comm_free(comm);
        return dt_cli_exit_code(st);
    }
    st = dt_train_run(ctx, comm, &cfg, fl.save_weights);
    /* Released before the ranks finish: a failure aborts the job (MPI_Abort) in there. */
    dt_ckpt_lock_release(lock);
    dt_cli_finish_ranks(ctx, comm, st);
    return dt_cli_exit_code(st);
}

dt_status dt_cli_train_ckpt_dir(dt_ctx *ctx, int argc, char **argv, char *out, size_t n) {
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    train_flags fl = {0};
    out[0] = 0;
    DT_CHECK(dt_cli_parse_run(ctx, "train", argc, argv, &cfg, train_flag, &fl));
    if (strlen(cfg.ckpt_dir) >= n) return dt_fail(ctx, DT_ERR_CONFIG, "checkpoint.dir: path too long");
    snprintf(out, n, "%s", cfg.ckpt_dir);
    return DT_OK;
}
