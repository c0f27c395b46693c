/* dtrain ckpt SUBCOMMAND: tools for model files and checkpoints. Each subcommand is one row
 * of the table below: name, usage line, summary, handler. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_io.h"
#include "ckpt/interop.h"
#include "ckpt/lock.h"
#include "ckpt/lora_merge.h"
#include "ckpt/model_file.h"
#include "ckpt/peft.h"
#include "cli/cli.h"
#include "train/config_yaml.h"

typedef struct ckpt_cmd {
    const char *name;
    const char *usage; /* arguments after the name */
    const char *summary;
    int (*run)(dt_ctx *ctx, int argc, char **argv); /* argv[0] = first argument after the name */
} ckpt_cmd;

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static int usage_error(dt_ctx *ctx, const char *msg) {
    dt_fail(ctx, DT_ERR_CONFIG, "dtrain ckpt %s (see dtrain ckpt --help)", msg);
    return DT_EXIT_USAGE;
}

/* A command that writes into an existing OUT_DIR locks it as a training run locks its
 * checkpoint.dir (ckpt/lock.h): refused (status 2) while another run writes there. A missing
 * OUT_DIR is no run's (every writer creates its directory when it locks it), and a refused
 * command creates none. Reading SRC needs no lock. */
static dt_status lock_out(dt_ctx *ctx, const char *sub, const char *out_dir, dt_ckpt_lock **lock) {
    struct stat sb;
    *lock = NULL;
    if (stat(out_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return DT_OK;
    char label[64], cmd[64];
    snprintf(label, sizeof label, "dtrain ckpt %s: ", sub);
    snprintf(cmd, sizeof cmd, "dtrain ckpt %s", sub);
    return dt_ckpt_lock_acquire(ctx, out_dir, label, cmd, lock);
}

static int export_locked(dt_ctx *ctx, int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[0], "--peft")) {
        dt_status st = dt_peft_export(ctx, argv[1], argv[2]);
        if (st == DT_OK)
            printf("exported %s -> %s/adapter_model.safetensors, %s/adapter_config.json (PEFT LoRA layout)\n",
                   argv[1], argv[2], argv[2]);
        return st == DT_OK ? DT_EXIT_OK : DT_EXIT_FAIL;
    }
    if (argc != 3 || strcmp(argv[0], "--hf"))
        return usage_error(ctx, "export: expected --hf SRC OUT_DIR or --peft SRC OUT_DIR");
    dt_status st = dt_hf_export(ctx, argv[1], argv[2]);
    if (st == DT_OK)
        printf("exported %s -> %s/model.safetensors, %s/config.json (Hugging Face layout)\n",
               argv[1], argv[2], argv[2]);
    return st == DT_OK ? DT_EXIT_OK : DT_EXIT_FAIL;
}

static int cmd_export(dt_ctx *ctx, int argc, char **argv) {
    dt_ckpt_lock *lock = NULL;
    if (argc == 3 && (!strcmp(argv[0], "--peft") || !strcmp(argv[0], "--hf"))) {
        dt_status lst = lock_out(ctx, "export", argv[2], &lock);
        if (lst != DT_OK) return dt_cli_exit_code(lst);
    }
    int rc = export_locked(ctx, argc, argv);
    dt_ckpt_lock_release(lock);
    return rc;
}

/* The run's model.init_from and lora.base_dtype, from the configuration trainer.json stores
 * (dt_lora_run_base_fn: the keys are the config layer's, not ckpt/'s). */
static dt_status run_base(dt_ctx *ctx, const char *step_dir, char *init_from, size_t n, int *nf4) {
    char path[4400], name[4500];
    snprintf(path, sizeof path, "%s/trainer.json", step_dir);
    char *buf;
    size_t len;
    DT_CHECK(dt_io_read_small(ctx, path, 16u << 20, &buf, &len));
    cJSON *r = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *cf = r ? cJSON_GetObjectItemCaseSensitive(r, "config") : NULL;
    if (!cJSON_IsString(cf) || !cf->valuestring[0]) {
        cJSON_Delete(r);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: no stored configuration ('config'): give the base with --base PATH",
                       path);
    }
    dt_run_cfg c;
    dt_run_cfg_defaults(&c);
    snprintf(name, sizeof name, "%s (config)", path);
    dt_status st = dt_cfg_load_yaml_text(ctx, &c, name, cf->valuestring);
    cJSON_Delete(r);
    DT_CHECK(st);
    snprintf(init_from, n, "%s", c.init_from);
    *nf4 = !strcmp(c.lora_base, "nf4");
    return DT_OK;
}

static int cmd_merge(dt_ctx *ctx, int argc, char **argv) {
    const char *base = NULL;
    if (argc == 4 && !strcmp(argv[2], "--base")) base = argv[3];
    else if (argc != 2) return usage_error(ctx, "merge: expected SRC OUT_DIR [--base PATH]");
    dt_lora_merge_info info;
    dt_ckpt_lock *lock = NULL;
    dt_status st = lock_out(ctx, "merge", argv[1], &lock);
    if (st != DT_OK) return dt_cli_exit_code(st);
    st = dt_lora_merge(ctx, argv[0], argv[1], base, run_base, &info);
    dt_ckpt_lock_release(lock);
    if (st == DT_OK)
        printf("merged %s (%d adapted projections) into %s (%s, XXH3 %016llx): %zu parameters -> %s/model.safetensors, "
               "%s/config.json (Hugging Face layout)\n",
               info.step_dir, info.sites, info.base[0] ? info.base : "the base drawn from training.seed",
               info.nf4 ? "NF4, dequantized" : "fp32", (unsigned long long)info.base_hash, info.params, argv[1],
               argv[1]);
    return st == DT_OK ? DT_EXIT_OK : DT_EXIT_FAIL;
}

static int cmd_import_llmc(dt_ctx *ctx, int argc, char **argv) {
    if (argc != 2) return usage_error(ctx, "import-llmc: expected FILE.bin OUT.safetensors");
    dt_model_config c;
    dt_status st = dt_llmc_model_config(ctx, argv[0], &c);
    if (st != DT_OK) return DT_EXIT_FAIL;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    st = dt_model_init(ctx, &m, &c, &alloc, 1, 1, DT_SLAB_PARAMS);
    if (st != DT_OK) return DT_EXIT_FAIL;
    st = dt_llmc_model_load(ctx, &m, argv[0]);
    if (st == DT_OK) st = dt_model_file_save(ctx, &m, argv[1], c.vocab == 50257 ? "gpt2" : "", 0);
    if (st == DT_OK)
        printf("imported %s (%d layers, d_model %d, %d heads, vocab %d, context %d, %zu parameters) "
               "-> %s\n",
               argv[0], c.n_layer, c.d_model, c.n_head, c.vocab, c.context, dt_model_num_params(&c),
               argv[1]);
    dt_model_free(&m);
    return st == DT_OK ? DT_EXIT_OK : DT_EXIT_FAIL;
}

static const ckpt_cmd ckpt_cmds[] = {
    {"verify", "DIR",
     "check every file, size and XXH3 checksum of a step directory, or of every step of a checkpoint directory",
     dt_cmd_ckpt_verify},
    {"info", "DIR", "what a checkpoint holds: step, data cursor, model shape, writer, files", dt_cmd_ckpt_info},
    {"export", "--hf SRC OUT_DIR | --peft SRC OUT_DIR",
     "write OUT_DIR/model.safetensors + config.json in Hugging Face layout (GPT2LMHeadModel, LlamaForCausalLM); "
     "--peft: a LoRA checkpoint's adapters as adapter_model.safetensors + adapter_config.json (PEFT, LLaMA)",
     cmd_export},
    {"merge", "SRC OUT_DIR [--base PATH]",
     "fold a LoRA checkpoint's adapters into its base (W + alpha/rank B A; an NF4 base dequantized) and write the "
     "whole model as OUT_DIR/model.safetensors + config.json (Hugging Face layout); the base is the run's "
     "model.init_from (or PATH, or drawn from training.seed) and must match trainer.json's lora_base",
     cmd_merge},
    {"import-llmc", "FILE.bin OUT.safetensors",
     "convert an llm.c model file (fp32 or bf16) to a dtrain model file", cmd_import_llmc},
};
#define N_CKPT_CMDS ((int)(sizeof ckpt_cmds / sizeof ckpt_cmds[0]))

static void ckpt_usage(FILE *f) {
    fprintf(f, "usage: dtrain ckpt <subcommand> ...\n\n");
    for (int i = 0; i < N_CKPT_CMDS; i++)
        fprintf(f, "  dtrain ckpt %s %s\n      %s\n", ckpt_cmds[i].name, ckpt_cmds[i].usage,
                ckpt_cmds[i].summary);
    fprintf(f, "\nSRC is a model.safetensors file, a step directory or a checkpoint directory\n"
               "(its latest step).\n");
}

int dt_cmd_ckpt(dt_ctx *ctx, int argc, char **argv) {
    if (argc > 0 && is_help(argv[0])) {
        ckpt_usage(stdout);
        return DT_EXIT_OK;
    }
    if (argc == 0) {
        ckpt_usage(stderr);
        return usage_error(ctx, "needs a subcommand");
    }
    for (int i = 0; i < N_CKPT_CMDS; i++) {
        if (strcmp(argv[0], ckpt_cmds[i].name)) continue;
        if (argc > 1 && is_help(argv[1])) {
            printf("usage: dtrain ckpt %s %s\n  %s\n", ckpt_cmds[i].name, ckpt_cmds[i].usage,
                   ckpt_cmds[i].summary);
            return DT_EXIT_OK;
        }
        return ckpt_cmds[i].run(ctx, argc - 1, argv + 1);
    }
    dt_fail(ctx, DT_ERR_CONFIG, "dtrain ckpt: unknown subcommand '%s'", argv[0]);
    ckpt_usage(stderr);
    return DT_EXIT_USAGE;
}
