/* LoRA adapters in PEFT's layout (peft.h). */
#include "ckpt/peft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/checkpoint.h"
#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "model/lora.h"

/* PEFT's module name of each target (target_modules), by family. */
static const char *peft_module(const char *family, int t) {
    static const char *const llama[DT_LORA_NTARGETS] = {"q_proj", "k_proj",    "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj", "w1",     "w2",     "w3"};
    return !strcmp(family, "llama") ? llama[t] : NULL;
}

static dt_status write_config(dt_ctx *ctx, const char *path, const dt_model_config *c, const dt_ckpt_trainer *tj) {
    FILE *f = fopen(path, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": null,\n");
    fprintf(f, "  \"r\": %d,\n  \"lora_alpha\": %.9g,\n  \"lora_dropout\": %.7g,\n  \"bias\": \"none\",\n", tj->lora_rank,
            tj->lora_alpha, tj->lora_dropout);
    fprintf(f, "  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n  \"use_rslora\": false,\n"
               "  \"modules_to_save\": null,\n  \"target_modules\": [");
    int n = 0;
    for (int t = 0; t < DT_LORA_NTARGETS; t++)
        if (tj->lora_targets >> t & 1u) fprintf(f, "%s\"%s\"", n++ ? ", " : "", peft_module(c->family, t));
    fprintf(f, "]\n}\n");
    if (fclose(f) != 0) return dt_fail(ctx, DT_ERR_IO, "%s: %s", path, strerror(errno));
    return DT_OK;
}

dt_status dt_peft_export(dt_ctx *ctx, const char *src, const char *out_dir) {
    char step_dir[4200], path[4400];
    DT_CHECK(dt_ckpt_find(ctx, src, step_dir, sizeof step_dir));
    dt_ckpt_trainer tj;
    DT_CHECK(dt_ckpt_read_trainer(ctx, step_dir, &tj));
    if (!tj.lora)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: not a LoRA checkpoint (trainer.json has no lora_base): --peft exports "
                       "adapters; a whole model goes out with --hf", step_dir);
    snprintf(path, sizeof path, "%s/model.safetensors", step_dir);
    dt_model_config c;
    char tok[32];
    DT_CHECK(dt_model_file_config(ctx, path, &c, tok, sizeof tok));
    DT_CHECK(dt_model_config_validate(ctx, &c));
    dt_lora_cfg lora = {tj.lora_rank, (float)tj.lora_alpha, 0.0f, tj.lora_targets, 0, 0};
    DT_CHECK(dt_lora_validate(ctx, &c, &lora));
    if (!peft_module(c.family, 0))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s adapters have no PEFT layout (gpt2's q, k, v adapt row blocks of "
                       "one c_attn module)", step_dir, c.family);
    dt_alloc al;
    dt_alloc_init(&al);
    dt_model view;
    memset(&view, 0, sizeof view);
    view.cfg = c;
    view.opts.lora = lora; /* the checkpoint's canonical (unsplit) adapters, whatever tp trained them */
    DT_CHECK(dt_lora_adapters_init(ctx, &view.ps, &c, &view.opts, &al, DT_SLAB_PARAMS));
    dt_status st = dt_ckpt_load_params(ctx, step_dir, &view, view.ps.params);
    int n = 0;
    dt_st_entry *e = NULL;
    char(*names)[DT_ST_NAME_MAX] = NULL;
    if (st == DT_OK) {
        n = dt_model_file_entry_count(&view);
        e = calloc((size_t)n, sizeof *e);
        names = calloc((size_t)n, sizeof *names);
        if (!e || !names) st = dt_fail(ctx, DT_ERR_NOMEM, "export --peft: out of memory");
    }
    if (st == DT_OK) {
        dt_model_file_entries(&view, view.ps.params, "", e, names);
        int k = 0; /* the same tensors under their PEFT (external) names */
        for (int id = 0; id < view.ps.n_tensors; id++)
            for (int l = 0; l < dt_params_copies(&view.ps, id); l++, k++) {
                dt_params_ext_name(&view.ps, id, l, names[k], DT_ST_NAME_MAX);
                e[k].name = names[k];
                e[k].ndim = 2; /* a rank-1 lora_A is still a matrix */
                e[k].shape[0] = (int64_t)view.ps.tensors[id].rows;
                e[k].shape[1] = (int64_t)view.ps.tensors[id].cols;
            }
        if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) st = dt_fail(ctx, DT_ERR_IO, "%s: %s", out_dir, strerror(errno));
    }
    if (st == DT_OK) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
        const char *meta[] = {"format", "pt", NULL};
        st = dt_st_write(ctx, path, e, n, meta);
    }
    if (st == DT_OK) {
        snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
        st = write_config(ctx, path, &c, &tj);
    }
    free(e);
    free(names);
    dt_params_free(&view.ps);
    return st;
}
