#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli/cli.h"
#include "core/log.h"
#include "train/config_yaml.h"

static const struct {
    const char *flag, *key;
} aliases[] = {
    {"--model", "model.preset"},    {"--steps", "training.steps"},
    {"--batch", "training.micro_batch"}, {"--seq", "training.seq_len"},
    {"--accum", "training.grad_accum"}, {"--lr", "optimizer.lr"},
    {"--seed", "training.seed"},    {"--threads", "runtime.threads"},
    {"--data", "data.train"},       {"--schedule", "schedule.kind"},
    {"--warmup", "schedule.warmup"},
};

void dt_cli_print_config_help(void) {
    printf("Configuration (--set KEY=VALUE, or --KEY VALUE, e.g. --model.n_layer 4):\n");
    dt_cfg_print_keys(stdout);
    printf("Short aliases:");
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        printf("%s %s=%s", i % 4 ? "," : "\n ", aliases[i].flag, aliases[i].key);
    printf("\n");
}

int dt_cli_exit_code(dt_status s) {
    if (s == DT_OK) return DT_EXIT_OK;
    return s == DT_ERR_CONFIG ? DT_EXIT_USAGE : DT_EXIT_FAIL;
}

/* Value of a flag given as "--flag=value" or "--flag value". */
static dt_status flag_value(dt_ctx *ctx, const char *cmd, int argc, char **argv, int *i,
                            const char *eq, const char **out) {
    if (eq) {
        *out = eq + 1;
        return DT_OK;
    }
    if (*i + 1 >= argc)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: flag %s needs a value", cmd, argv[*i]);
    /* `--lr --steps 3` must not take "--steps" as the learning rate (negative numbers have
     * one dash; a value that starts with two is the next flag). */
    if (!strncmp(argv[*i + 1], "--", 2))
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: flag %s needs a value (got the flag '%s'; write %s=VALUE "
                       "for a value that starts with --)", cmd, argv[*i], argv[*i + 1], argv[*i]);
    *out = argv[++*i];
    return DT_OK;
}

dt_status dt_cli_parse_run(dt_ctx *ctx, const char *cmd, int argc, char **argv, dt_run_cfg *cfg,
                           dt_cli_flag_fn own, void *ud) {
    /* A YAML file (the one positional argument) applies first; flags override it, in order. */
    const char *pending_key[256], *pending_val[256];
    char key_buf[256][128];
    int npending = 0;
    const char *config_path = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (own) {
            int r = own(ctx, ud, argc, argv, &i);
            if (r < 0) return DT_ERR_CONFIG;
            if (r > 0) continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (config_path)
                return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: unexpected argument '%s' (config is '%s')",
                               cmd, a, config_path);
            config_path = a;
            continue;
        }
        if (npending == 256) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: too many flags", cmd);
        const char *eq = strchr(a, '=');
        char name[128];
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        if (len >= sizeof name) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: flag too long", cmd);
        memcpy(name, a, len);
        name[len] = 0;
        const char *val = NULL;
        if (strcmp(name, "--set") == 0) {
            DT_CHECK(flag_value(ctx, cmd, argc, argv, &i, eq, &val));
            const char *e2 = strchr(val, '=');
            size_t kl = e2 ? (size_t)(e2 - val) : 0;
            if (!e2) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: --set expects KEY=VALUE, got '%s'", cmd, val);
            if (kl >= sizeof key_buf[0]) return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: key too long", cmd);
            memcpy(key_buf[npending], val, kl);
            key_buf[npending][kl] = 0;
            pending_key[npending] = key_buf[npending];
            pending_val[npending++] = e2 + 1;
            continue;
        }
        const char *key = NULL;
        for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++)
            if (strcmp(name, aliases[k].flag) == 0) key = aliases[k].key;
        if (!key && strchr(name, '.')) key = name + 2;
        if (!key)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain %s: unknown flag '%s' (see dtrain %s --help)",
                           cmd, name, cmd);
        DT_CHECK(flag_value(ctx, cmd, argc, argv, &i, eq, &val));
        snprintf(key_buf[npending], sizeof key_buf[0], "%s", key);
        pending_key[npending] = key_buf[npending];
        pending_val[npending++] = val;
    }
    if (config_path) DT_CHECK(dt_cfg_load_yaml(ctx, cfg, config_path));
    for (int i = 0; i < npending; i++) DT_CHECK(dt_cfg_set(ctx, cfg, pending_key[i], pending_val[i]));
    DT_CHECK(dt_cfg_finish(ctx, cfg));
#ifdef _OPENMP
    if (cfg->threads > 0) omp_set_num_threads(cfg->threads);
#endif
    return DT_OK;
}

void dt_cli_rank_setup(dt_ctx *ctx, dt_comm *comm, const dt_run_cfg *cfg) {
    if (dt_comm_rank(comm, DT_GROUP_WORLD) != 0) ctx->log_level = 0;
#ifdef _OPENMP
    int per_node = dt_comm_size(comm, DT_GROUP_NODE);
    if (cfg->threads == 0 && !getenv("OMP_NUM_THREADS") && per_node > 1) {
        int cores = omp_get_num_procs() / per_node;
        omp_set_num_threads(cores > 0 ? cores : 1);
    }
#else
    (void)cfg;
#endif
}

dt_status dt_cli_agree(dt_ctx *ctx, dt_comm *comm, dt_status st) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    if (world == 1) return st;
    /* MIN of both: the lowest failing rank, and the most severe status (codes are < 0). */
    int64_t v[2] = {st != DT_OK ? rank : world, st};
    dt_status cst = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, v, 2, DT_I64, DT_MIN);
    if (cst != DT_OK) return cst;
    if (v[0] == world) return DT_OK;
    /* The lowest failing rank prints now, and nobody exits before it has: mpirun ends the
     * whole job as soon as one rank exits non-zero. */
    if (rank == v[0]) dt_log_error(ctx, "%s", ctx->err);
    if ((cst = dt_comm_barrier(ctx, comm, DT_GROUP_WORLD)) != DT_OK) return cst;
    ctx->err[0] = 0; /* printed once, above; every rank exits with that rank's status */
    return (dt_status)v[1];
}

dt_status dt_cli_comm_init(dt_ctx *ctx, dt_comm **comm, dt_status setup) {
    return dt_cli_comm_init_mesh(ctx, comm, setup, 0);
}

dt_status dt_cli_comm_init_mesh(dt_ctx *ctx, dt_comm **comm, dt_status setup, int concurrent) {
    char err[sizeof ctx->err];
    memcpy(err, ctx->err, sizeof err); /* the setup's message survives the communicator's start */
    DT_CHECK(concurrent && dt_comm_launched_by_mpi() ? dt_comm_init_concurrent(ctx, comm) : dt_comm_init(ctx, comm));
    memcpy(ctx->err, err, sizeof err);
    dt_status st = dt_cli_agree(ctx, *comm, setup);
    if (st != DT_OK) {
        dt_comm_free(*comm);
        *comm = NULL;
    }
    return st;
}

void dt_cli_finish_ranks(dt_ctx *ctx, dt_comm *comm, dt_status st) {
    if (st != DT_OK && dt_comm_size(comm, DT_GROUP_WORLD) > 1) {
        dt_log_error(ctx, "%s", ctx->err);
        dt_log_error(ctx, "rank %d failed: aborting all %d ranks", ctx->rank, dt_comm_size(comm, DT_GROUP_WORLD));
        dt_comm_abort(comm, dt_cli_exit_code(st));
    }
    dt_comm_free(comm);
}
