/* dtrain eval CKPT: validation loss and perplexity of a saved model. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/hf_import.h"
#include "ckpt/model_file.h"
#include "cli/cli.h"
#include "core/log.h"
#include "data/shard.h"
#include "train/run.h"

static int eval_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    (void)ctx, (void)argc;
    if (!strcmp(argv[*i], "--help") || !strcmp(argv[*i], "-h")) return *(int *)ud = 1;
    return 0;
}

int dt_cmd_eval(dt_ctx *ctx, int argc, char **argv) {
    char path[4200];
    int help = argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    if (!help && (argc == 0 || argv[0][0] == '-')) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain eval: the first argument must be the CHECKPOINT%s%s%s (see dtrain eval --help)",
                argc ? ", got '" : "", argc ? argv[0] : "", argc ? "'" : "");
        return DT_EXIT_USAGE;
    }
    if (help) {
        printf("usage: dtrain eval CHECKPOINT --data.val FILES [--batch B] [--seq T]\n"
               "                  [--set training.eval_batches=N] [--set data.format=...]\n\n"
               "CHECKPOINT is a model.safetensors file, a step directory, a checkpoint directory\n"
               "(its latest step) or a Hugging Face model directory (config.json + safetensors). Prints the mean loss and perplexity over the first N batches of\n"
               "the validation set (all complete batches with N = 0).\n");
        return DT_EXIT_OK;
    }
    /* A Hugging Face directory, or a dtrain model file / step / checkpoint. */
    const int hf = dt_hf_is_dir(argv[0]);
    dt_status st = hf ? (snprintf(path, sizeof path, "%s", argv[0]), DT_OK)
                      : dt_ckpt_resolve(ctx, argv[0], path, sizeof path);
    if (st != DT_OK) return dt_cli_exit_code(st);
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    dt_model_config mc;
    char tok[32];
    st = hf ? dt_hf_config(ctx, path, &mc, tok, sizeof tok) : dt_model_file_config(ctx, path, &mc, tok, sizeof tok);
    if (st != DT_OK) return dt_cli_exit_code(st);
    /* The model's shape comes from the file; the flags choose data and batch. */
    cfg.train.preset[0] = 0;
    cfg.train.model = mc;
    cfg.train.seq_len = mc.context < 256 || mc.n_classes > 0 ? mc.context : 256; /* vit: one image */
    int hflag = 0;
    st = dt_cli_parse_run(ctx, "eval", argc - 1, argv + 1, &cfg, eval_flag, &hflag);
    if (st != DT_OK) return dt_cli_exit_code(st);
    if (!cfg.data_val[0]) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain eval: give the validation data with --data.val FILES");
        return DT_EXIT_USAGE;
    }
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    dt_dataset *ds = NULL;
    dt_val_loader *vl = NULL;
    int have_model = 0;
    double loss = 0, tokens = 0;
    st = dt_model_init(ctx, &m, &mc, &alloc, cfg.train.micro_batch, cfg.train.seq_len, DT_SLAB_PARAMS);
    have_model = st == DT_OK;
    if (st == DT_OK) st = hf ? dt_hf_load(ctx, &m, path) : dt_model_file_load(ctx, &m, path);
    /* Damaged weights are named at load, not reported as a diverged validation loss. */
    if (st == DT_OK) st = dt_params_check_finite(ctx, &m.ps, m.ps.params, path, hf);
    if (st == DT_OK) st = dt_dataset_open(ctx, &ds, cfg.data_val, cfg.data_format, mc.vocab);
    if (st == DT_OK) st = dt_data_check_model(ctx, ds, &mc, "data.val");
    if (st == DT_OK) st = dt_dataset_check_seq_len(ctx, ds, cfg.train.seq_len);
    if (st == DT_OK)
        st = dt_val_loader_init(ctx, &vl, ds, cfg.train.seq_len, 1, 0, cfg.train.micro_batch,
                                (uint64_t)cfg.eval_batches);
    double acc = NAN;
    if (st == DT_OK) st = dt_eval_loss(ctx, &m, vl, &loss, &tokens, &acc, NULL);
    if (st == DT_OK && !isnan(acc)) {
        printf("# %-40s %-10s %-12s %-12s\n", "checkpoint", "images", "val_loss", "accuracy_%");
        printf("  %-40s %-10.0f %-12.6f %-12.2f\n", path, tokens / mc.context, loss, 100.0 * acc);
    } else if (st == DT_OK) {
        printf("# %-40s %-10s %-12s %-12s\n", "checkpoint", "tokens", "val_loss", "perplexity");
        printf("  %-40s %-10.0f %-12.6f %-12.4f\n", path, tokens, loss, exp(loss));
    }
    dt_val_loader_free(vl);
    dt_dataset_close(ds);
    if (have_model) dt_model_free(&m);
    return dt_cli_exit_code(st);
}
