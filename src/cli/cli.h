/* cli.h - shared pieces of the subcommands. Only src/cli may exit the process.
 * Exit codes: 0 success, 1 runtime failure (I/O, numerics, data), 2 usage or configuration
 * error (bad flag, key or value). */
#ifndef DT_CLI_H
#define DT_CLI_H

#include "comm/comm.h"
#include "core/status.h"
#include "train/keys.h"

#define DT_EXIT_OK 0
#define DT_EXIT_FAIL 1
#define DT_EXIT_USAGE 2

/* A subcommand's own flag handler: returns 1 if it consumed argv[*i] (and maybe the next
 * argument, advancing *i), 0 if the flag is not its own, -1 on a bad value (ctx->err set). */
typedef int (*dt_cli_flag_fn)(dt_ctx *ctx, void *ud, int argc, char **argv, int *i);

/* Parses configuration flags (--set key=value, --section.key[=]value, the short aliases)
 * and the subcommand's own flags, then finishes the configuration and applies threads. */
dt_status dt_cli_parse_run(dt_ctx *ctx, const char *cmd, int argc, char **argv, dt_run_cfg *cfg,
                           dt_cli_flag_fn own, void *ud);

/* After dt_comm_init: only rank 0 logs info lines; OpenMP threads default to the cores of
 * this node divided by its ranks (unless runtime.threads or OMP_NUM_THREADS say otherwise). */
void dt_cli_rank_setup(dt_ctx *ctx, dt_comm *comm, const dt_run_cfg *cfg);
/* Ends a multi-rank run: on failure this rank prints its error and aborts the whole job (no
 * rank is left waiting in a collective); on success the communicator is finalised. */
/* Starts the communicator after the command's setup (parsing, validation) returned `setup`.
 * Under MPI every rank learns whether any rank's setup failed: the lowest failing rank
 * prints its message, all ranks wait for that and return the most severe status (the error
 * is printed once, not once per rank). On failure the communicator is freed. */
dt_status dt_cli_comm_init(dt_ctx *ctx, dt_comm **comm, dt_status setup);
/* The same for a process mesh whose groups communicate from two threads at once (comm.h
 * dt_comm_init_concurrent) when `concurrent`. */
dt_status dt_cli_comm_init_mesh(dt_ctx *ctx, dt_comm **comm, dt_status setup, int concurrent);
/* parallel.layout: auto (layout_auto.c): rank 0 plans the job on parallel.layout_hardware and
 * every rank takes the fastest fitting layout dtrain can run into cfg (parallel.tp, strategy,
 * hybrid; training.batch kept); an explicit parallel.tp / strategy stays. Before
 * dt_cfg_apply_world; nothing without it. */
dt_status dt_cli_layout_auto(dt_ctx *ctx, dt_run_cfg *cfg, dt_comm *comm);
/* The ranks agree on an outcome (st) of each: the lowest failing rank prints its message,
 * every rank returns the most severe status (ctx->err cleared: it was printed once). */
dt_status dt_cli_agree(dt_ctx *ctx, dt_comm *comm, dt_status st);
void dt_cli_finish_ranks(dt_ctx *ctx, dt_comm *comm, dt_status st);

/* Maps a status to an exit code. */
int dt_cli_exit_code(dt_status s);

/* Help text for the configuration flags. */
void dt_cli_print_config_help(void);

int dt_cmd_train(dt_ctx *ctx, int argc, char **argv);
/* checkpoint.dir of `dtrain train ARGS` (argv[0] = the first argument after "train"), parsed
 * as dt_cmd_train parses it; "" when none is set. An error for arguments train refuses. */
dt_status dt_cli_train_ckpt_dir(dt_ctx *ctx, int argc, char **argv, char *out, size_t n);
int dt_cmd_bench(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_config(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_prepare(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_eval(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_sample(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_launch(dt_ctx *ctx, int argc, char **argv);
/* dtrain ckpt verify / info (cmd_ckpt_inspect.c) */
int dt_cmd_ckpt_verify(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_ckpt_info(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_report(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_ckpt(dt_ctx *ctx, int argc, char **argv);
int dt_cmd_plan(dt_ctx *ctx, int argc, char **argv);
/* dtrain plan --calibrate FILE [--ranks R] [--nodes M [--hosts LIST]] [--comm-fit F]
 * [--comm-max-bytes B]: runs dtrain bench (every other flag of argv is its) and dtrain bench
 * comm --fit, and writes the catalog entry cpu-calibrated (cmd_plan_cal.c). */
dt_status dt_plan_calibrate(dt_ctx *ctx, int argc, char **argv);

#endif
