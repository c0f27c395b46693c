/* dtrain train: the training loop with progress lines and an optional weights file. */
#include <stdio.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "cli/cli.h"
#include "core/log.h"
#include "core/timer.h"

typedef struct train_flags {
    const char *save_weights;
    int print_config, help;
} train_flags;

static int train_flag(dt_ctx *ctx, void *ud, int argc, char **argv, int *i) {
    train_flags *f = ud;
    if (strcmp(argv[*i], "--help") == 0 || strcmp(argv[*i], "-h") == 0) return f->help = 1;
    if (strcmp(argv[*i], "--print-config") == 0) return f->print_config = 1;
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

/* Writes every parameter tensor (vocabulary padding excluded) as safetensors. */
static dt_status save_weights(dt_ctx *ctx, const dt_gpt2 *m, const char *path) {
    int n = 0, cap = DT_GPT2_NPARAMS * (m->cfg.n_layer + 1);
    dt_st_entry e[cap];
    char names[cap][96];
    for (int id = 0; id < DT_GPT2_NPARAMS; id++) {
        const dt_tensor_info *t = &m->tensors[id];
        int copies = t->group == DT_PG_LAYER ? m->cfg.n_layer : 1;
        for (int l = 0; l < copies; l++, n++) {
            dt_gpt2_tensor_name(m, (dt_gpt2_param_id)id, l, names[n], sizeof names[n]);
            int64_t rows = id == DT_GPT2_P_WTE ? m->cfg.vocab : (int64_t)t->rows;
            e[n] = (dt_st_entry){names[n], DT_ST_F32, t->rows == 1 ? 1 : 2,
                                 {t->rows == 1 ? (int64_t)t->cols : rows, (int64_t)t->cols},
                                 dt_gpt2_tensor(m, m->params, (dt_gpt2_param_id)id, l)};
        }
    }
    return dt_st_write(ctx, path, e, n, NULL);
}

int dt_cmd_train(dt_ctx *ctx, int argc, char **argv) {
    dt_run_cfg cfg;
    dt_run_cfg_defaults(&cfg);
    train_flags fl = {0};
    dt_status st = dt_cli_parse_run(ctx, "train", argc, argv, &cfg, train_flag, &fl);
    if (fl.help) {
        printf("usage: dtrain train [--set KEY=VALUE ...] [--print-config] [--save-weights FILE]\n\n");
        dt_cli_print_config_help();
        return DT_EXIT_OK;
    }
    if (st != DT_OK) return dt_cli_exit_code(st);
    if (fl.print_config) {
        dt_cfg_print(stdout, &cfg);
        return DT_EXIT_OK;
    }
    dt_trainer tr;
    st = dt_trainer_init(ctx, &tr, &cfg.train);
    if (st != DT_OK) return dt_cli_exit_code(st);
    const dt_train_cfg *c = &cfg.train;
    dt_log_info(ctx, "model %s: %d layers, d_model %d, %d heads, vocab %d (padded %d), %.2fM params",
                c->preset[0] ? c->preset : "custom", tr.model.cfg.n_layer, tr.model.cfg.d_model,
                tr.model.cfg.n_head, tr.model.cfg.vocab, tr.model.cfg.vocab_padded,
                (double)dt_gpt2_num_params(&tr.model.cfg) / 1e6);
    dt_log_info(ctx, "batch %d x %d tokens x %d accumulation, %ld steps, data %s",
                c->micro_batch, c->seq_len, c->accum, c->steps,
                c->data_path ? c->data_path : "synthetic");
    double tokens = (double)c->micro_batch * c->seq_len * c->accum;
    for (long s = 0; s < c->steps && st == DT_OK; s++) {
        dt_step_stats ss;
        st = dt_trainer_step(ctx, &tr, &ss);
        if (st == DT_OK && ((s + 1) % c->log_every == 0 || s + 1 == c->steps))
            dt_log_info(ctx, "step %ld/%ld | loss %.9g | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s",
                        s + 1, c->steps, (double)ss.loss, (double)ss.lr, (double)ss.grad_norm,
                        ss.seconds * 1e3, tokens / ss.seconds);
    }
    if (st == DT_OK && fl.save_weights) st = save_weights(ctx, &tr.model, fl.save_weights);
    dt_trainer_free(&tr);
    return dt_cli_exit_code(st);
}
