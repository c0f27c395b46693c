/* dtrain - distributed training for transformer language models. Subcommand dispatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/log.h"
#include "ops/backend.h"
#include "ops/cpu/isa.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain <command> [flags]\n"
            "\n"
            "commands:\n"
            "  train    train a model: GPT-2 or LLaMA (YAML config and/or --set flags)\n"
            "  eval     validation loss and perplexity of a checkpoint\n"
            "  sample   generate text from a checkpoint\n"
            "  prepare  tokenize text files into token shards (byte or GPT-2 BPE)\n"
            "  bench    benchmark training: step time, tokens/s, MFU, per-kernel breakdown\n"
            "  bench peak   measure the fp32 matmul peak that MFU is relative to\n"
            "  bench comm   collective bandwidth (algbw/busbw as nccl-tests), data checked\n"
            "  config   show the resolved configuration (config show), list keys (config keys)\n"
            "  launch   run a command on N ranks under mpirun (dtrain launch -n 4 -- train cfg.yaml)\n"
            "  report   benchmark results (bench --json) -> one HTML page: charts, tables, advice\n"
            "  plan     predict memory, step time, MFU, scaling and cost on other hardware\n"
            "  ckpt     model files: export --hf (Hugging Face), import-llmc (llm.c .bin)\n"
            "\n"
            "  dtrain <command> --help   flags of a command\n"
            "  dtrain --version\n"
            "\n"
            "exit codes: 0 success, 1 runtime failure, 2 usage or configuration error\n");
}

/* A rank started by `dtrain launch --hosts` (DTRAIN_LAUNCH_ID set, forwarded by mpirun) tells
 * the launcher that its process runs: one line on stderr, which the launcher takes out of
 * mpirun's output (src/launch/launch_impl.h). It is written before anything else, so even a
 * subcommand that never starts MPI (or fails at once) counts as started. */
static void report_started(void) {
    const char *id = getenv("DTRAIN_LAUNCH_ID"), *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!id || !*id || !rank || !*rank) return;
    char line[160];
    int n = snprintf(line, sizeof line, "dtrain-launch-started %.60s %.12s\n", id, rank);
    if (n > 0 && (size_t)n < sizeof line && write(STDERR_FILENO, line, (size_t)n) < 0) {
        /* the launcher is gone; nothing to tell */
    }
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    report_started();
    if (argc < 2) {
        usage(stderr);
        return DT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return DT_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("dtrain %s\n", DT_VERSION);
        return DT_EXIT_OK;
    }
    /* The compute backend (DTRAIN_BACKEND, ops/backend.h) and the CPU kernel path (cpuid,
     * DTRAIN_ISA) are fixed before any kernel or oneDNN call. */
    if (dt_backend_init(&ctx) != DT_OK || dt_isa_init(&ctx) != DT_OK) {
        dt_log_error(&ctx, "%s", ctx.err);
        return DT_EXIT_USAGE;
    }
    int rc;
    if (strcmp(cmd, "train") == 0)
        rc = dt_cmd_train(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "bench") == 0)
        rc = dt_cmd_bench(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "config") == 0)
        rc = dt_cmd_config(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "prepare") == 0)
        rc = dt_cmd_prepare(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "eval") == 0)
        rc = dt_cmd_eval(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "sample") == 0)
        rc = dt_cmd_sample(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "launch") == 0)
        rc = dt_cmd_launch(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "report") == 0)
        rc = dt_cmd_report(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "plan") == 0)
        rc = dt_cmd_plan(&ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "ckpt") == 0)
        rc = dt_cmd_ckpt(&ctx, argc - 2, argv + 2);
    else {
        dt_log_error(&ctx, "dtrain: unknown command '%s' (see dtrain --help)", cmd);
        return DT_EXIT_USAGE;
    }
    if (rc != DT_EXIT_OK && ctx.err[0]) { /* commands that printed their own usage set no message */
        /* DTRAIN_DEBUG=1 adds the source site of the failure. */
        const char *dbg = getenv("DTRAIN_DEBUG");
        if (dbg && *dbg && *dbg != '0' && ctx.where[0])
            dt_log_error(&ctx, "%s (at %s)", ctx.err, ctx.where);
        else
            dt_log_error(&ctx, "%s", ctx.err);
    }
    return rc;
}
