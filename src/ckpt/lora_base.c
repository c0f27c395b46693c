/* A LoRA run's frozen base from a dtrain model file, tensor by tensor (lora_base.h). */
#include "ckpt/lora_base.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_import.h"
#include "ckpt/interop.h"
#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "core/log.h"
#include "model/lora.h"
#include "ops/ops.h"

static int is_llmc_file(const char *path) {
    int32_t magic = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    if (read(fd, &magic, sizeof magic) != (ssize_t)sizeof magic) magic = 0;
    close(fd);
    return magic == DT_LLMC_MODEL_MAGIC;
}

dt_status dt_lora_base_stream(dt_ctx *ctx, dt_model *m, const char *path, int *done) {
    *done = 0;
    if (dt_hf_is_dir(path)) return DT_OK;
    char file[4200];
    DT_CHECK(dt_ckpt_resolve(ctx, path, file, sizeof file));
    if (is_llmc_file(file)) return DT_OK;
    dt_model_config c;
    char tok[32];
    DT_CHECK(dt_model_file_config(ctx, file, &c, tok, sizeof tok));
    if (!dt_model_config_equal(&c, &m->cfg)) {
        char have[400], want[400];
        dt_model_describe(&c, have, sizeof have);
        dt_model_describe(&m->cfg, want, sizeof want);
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: model shape (%s) differs from the configured one (%s)", file, have,
                       want);
    }
    dt_st_file *f;
    DT_CHECK(dt_st_open(ctx, file, &f));
    dt_alloc a;
    dt_alloc_init(&a);
    dt_params full; /* the family's layout: names and shapes */
    dt_tensor_info t[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(&m->cfg, t);
    dt_status st = dt_params_init(ctx, &full, t, n, m->cfg.n_layer, &a, 0);
    for (int id = 0; id < n && st == DT_OK; id++) {
        const dt_tensor_info *ti = &full.tensors[id];
        for (int l = 0; l < dt_params_copies(&full, id) && st == DT_OK; l++) {
            char name[DT_ST_NAME_MAX];
            dt_params_name(&full, id, l, name, sizeof name);
            const dt_st_tensor *s = dt_st_find(f, name);
            int ndim = ti->rows == 1 ? 1 : 2;
            int ok = s && s->dtype == DT_ST_F32 && s->ndim == ndim &&
                     (ndim == 1 ? s->shape[0] == (int64_t)ti->cols
                                : s->shape[0] == (int64_t)ti->file_rows && s->shape[1] == (int64_t)ti->cols);
            if (!ok) {
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' is %s", file, name,
                             s ? "of the wrong dtype or shape" : "missing");
                break;
            }
            const int hl = dt_lora_base_layer(m, id, l); /* a pipeline stage: its own layers only */
            if (hl < 0) continue;
            size_t e = ti->rows * ti->cols, stored = s->nbytes / sizeof(float);
            /* the base's own place when it holds the tensor whole in fp32; else a copy, set from
             * (quantized, or cut into the tensor-parallel shards held) */
            const dt_tensor_info *bt = &m->base.tensors[id];
            const int whole = !dt_lora_nf4(m, id, hl) && !(bt->tp_k > 1 && bt->split);
            float *dst = whole ? dt_params_tensor(&m->base, m->base.params, id, hl) : calloc(e, sizeof(float));
            if (!dst) {
                st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory reading '%s'", file, name);
                break;
            }
            dt_copy(dst, s->data, stored * sizeof(float));
            dt_fill(dst + stored, 0, (e - stored) * sizeof(float)); /* vocabulary padding */
            if (!whole) {
                st = dt_lora_set_base_tensor(ctx, m, id, hl, dst);
                free(dst);
            }
        }
    }
    dt_params_free(&full);
    dt_st_close(f);
    if (st == DT_OK) *done = 1;
    return st;
}

dt_status dt_lora_base_load(dt_ctx *ctx, dt_model *m, const char *path) {
    int done;
    DT_CHECK(dt_lora_base_stream(ctx, m, path, &done));
    if (done) {
        dt_log_info(ctx, "frozen base from %s (read tensor by tensor)", path);
        return DT_OK;
    }
    /* other formats (Hugging Face, llm.c): the whole model imported once, then set */
    float *full = calloc(dt_lora_full_floats(m), sizeof(float));
    if (!full) return dt_fail(ctx, DT_ERR_NOMEM, "model.init_from: out of memory");
    dt_model view = *m; /* the family's layout, reading the full copy */
    view.lora = 0;
    dt_alloc a;
    dt_alloc_init(&a);
    dt_tensor_info table[DT_MODEL_MAX_TENSORS];
    int n = dt_model_tensors(&m->cfg, table);
    dt_status st = dt_params_init(ctx, &view.ps, table, n, m->cfg.n_layer, &a, 0);
    if (st == DT_OK) {
        view.ps.params = full;
        st = dt_model_import(ctx, &view, path);
        view.ps.params = NULL;
        dt_params_free(&view.ps);
    }
    if (st == DT_OK) st = dt_lora_set_base(ctx, m, full);
    free(full);
    if (st == DT_OK) dt_log_info(ctx, "frozen base from %s", path);
    return st;
}

dt_status dt_lora_check_resume(dt_ctx *ctx, const char *dir, const dt_ckpt_trainer *tj, const dt_model *m,
                               uint64_t base_hash, uint64_t base_fp) {
    const dt_lora_cfg *lo = &m->opts.lora;
    if (tj->lora != m->lora)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: written by a %s run, this run is %s", dir,
                       tj->lora ? "LoRA (adapters only)" : "full-training", m->lora ? "LoRA (lora.rank > 0)" : "not");
    if (!m->lora) return DT_OK;
    const double alpha = lo->alpha > 0.0f ? lo->alpha : (float)lo->rank;
    if (tj->lora_rank != lo->rank || tj->lora_targets != lo->targets || (float)tj->lora_alpha != (float)alpha) {
        char a[64], b[64];
        dt_lora_targets_str(tj->lora_targets, a, sizeof a);
        dt_lora_targets_str(lo->targets, b, sizeof b);
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: written with lora.rank %d, lora.alpha %g and lora.targets %s, this run "
                       "has %d, %g and %s", dir, tj->lora_rank, tj->lora_alpha, a, lo->rank, alpha, b);
    }
    const int tp = dt_tp_size(&m->opts), tj_tp = tj->tp > 1 ? tj->tp : 1;
    if (tj->lora_base_fp && base_fp) { /* an fp32 base: the layout-free fingerprint decides */
        if (tj->lora_base_fp == base_fp) return DT_OK;
        return dt_fail(ctx, DT_ERR_CONFIG, "%s/trainer.json: its adapters were trained on another base model (base "
                       "fingerprint %016llx, this run's %016llx): use the model.init_from and training.seed of that run",
                       dir, (unsigned long long)tj->lora_base_fp, (unsigned long long)base_fp);
    }
    if (tj->lora_base != base_hash && tp != tj_tp) /* the hash is of the base's shards (lora.h) */
        return dt_fail(ctx, DT_ERR_CONFIG, "%s/trainer.json: written by a LoRA run with parallel.tp=%d, this run has "
                       "parallel.tp=%d: its base is known only by the hash of its %d shards (an NF4 base is quantized "
                       "shard by shard), so it resumes with parallel.tp=%d (a TP group or parallel.tp_blocks)", dir,
                       tj_tp, tp, tj_tp, tj_tp);
    if (tj->lora_base != base_hash)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s/trainer.json: its adapters were trained on another base model (base "
                       "XXH3 %016llx, this run's base %016llx): use the model.init_from, lora.base_dtype and "
                       "training.seed of that run", dir, (unsigned long long)tj->lora_base,
                       (unsigned long long)base_hash);
    return DT_OK;
}
