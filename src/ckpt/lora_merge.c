/* A LoRA checkpoint folded into its base, out as a Hugging Face model (lora_merge.h). */
#include "ckpt/lora_merge.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/interop.h"
#include "ckpt/lora_base.h"
#include "ckpt/model_file.h"
#include "model/lora.h"
#include "ops/ops.h"

/* full (the family's layout) = m's base, NF4 tensors dequantized; a base held in tensor-parallel
 * shards (the blocks mode: every shard) laid out canonically, each shard's NF4 tensor its own. */
static dt_status copy_base(dt_ctx *ctx, const dt_model *m, dt_params *full) {
    for (int id = 0; id < full->n_tensors; id++) {
        const dt_tensor_info *bt = &m->base.tensors[id];
        size_t e = full->tensors[id].rows * full->tensors[id].cols;
        for (int l = 0; l < dt_params_copies(full, id); l++) {
            float *dst = dt_params_tensor(full, full->params, id, l);
            const dt_nf4 *q = dt_lora_nf4(m, id, l);
            if (!(bt->tp_k > 1 && bt->split)) {
                if (q) dt_nf4_dequantize(dst, q, 0, e);
                else dt_copy(dst, dt_params_tensor(&m->base, m->base.params, id, l), e * sizeof(float));
                continue;
            }
            const size_t real = bt->g_file_rows * bt->g_cols; /* vocabulary padding: left out */
            const size_t sl = q ? q->n : dt_tensor_shard_len(bt);
            float *buf = malloc(sl * sizeof(float));
            if (!buf) return dt_fail(ctx, DT_ERR_NOMEM, "merge: out of memory");
            for (int j = 0; j < bt->tp_nb; j++) {
                if (q) dt_nf4_dequantize(buf, dt_lora_nf4_sh(m, id, l, j), 0, sl);
                else dt_copy(buf, dt_params_tensor(&m->base, m->base.params, id, l) + (size_t)j * sl, sl * sizeof(float));
                for (size_t i = 0; i < sl; i++) {
                    int sh;
                    size_t gi = dt_params_global_index(bt, (size_t)j * sl + i, &sh);
                    if (gi < real && gi < e) dst[gi] = buf[i];
                }
            }
            free(buf);
        }
    }
    return DT_OK;
}

/* W[row0 + j, c] += s sum_k B[j, k] A[k, c] for every site and layer (double sums). */
static int fold(const dt_model *m, const dt_params *aps, dt_params *full) {
    const int r = m->opts.lora.rank;
    const double s = m->lora_scale;
    int n = 0;
    for (int i = 0; i < m->n_sites; i++) {
        const dt_lora_site *site = &m->sites[i];
        const size_t C = full->tensors[site->id].cols;
        for (int l = 0; l < dt_params_copies(full, site->id); l++, n++) {
            float *W = dt_params_tensor(full, full->params, site->id, l) + site->row0 * C;
            const float *A = dt_params_tensor(aps, aps->params, m->site_a[i], l);     /* r x C */
            const float *B = dt_params_tensor(aps, aps->params, m->site_a[i] + 1, l); /* rows x r */
            dt_lowrank_merge(W, A, B, (float)s, (int)site->rows, (int)C, r);
        }
    }
    return n;
}

dt_status dt_lora_merge(dt_ctx *ctx, const char *src, const char *out_dir, const char *base,
                        dt_lora_run_base_fn run_base, dt_lora_merge_info *info) {
    memset(info, 0, sizeof *info);
    char step_dir[4200], path[4400], tmp[4400], tok[32];
    DT_CHECK(dt_ckpt_find(ctx, src, step_dir, sizeof step_dir));
    snprintf(info->step_dir, sizeof info->step_dir, "%s", step_dir);
    dt_ckpt_trainer tj;
    DT_CHECK(dt_ckpt_read_trainer(ctx, step_dir, &tj));
    if (!tj.lora)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s/trainer.json: not a LoRA checkpoint (no lora_base): merge folds LoRA "
                       "adapters into their base; a whole model goes out with export --hf", step_dir);
    int nf4 = 0;
    DT_CHECK(run_base(ctx, step_dir, info->base, sizeof info->base, &nf4));
    if (base) snprintf(info->base, sizeof info->base, "%s", base);
    info->nf4 = nf4;
    snprintf(path, sizeof path, "%s/model.safetensors", step_dir);
    dt_model_config c;
    DT_CHECK(dt_model_file_config(ctx, path, &c, tok, sizeof tok));
    DT_CHECK(dt_model_config_validate(ctx, &c));
    if (!dt_model_family_of(&c)->hf_architecture)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: a %s model has no Hugging Face export", path, c.family);

    dt_model_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.compute = DT_F32;
    opts.lora = (dt_lora_cfg){tj.lora_rank, (float)tj.lora_alpha, 0.0f, tj.lora_targets, nf4, info->base[0] != 0};
    /* a tensor-parallel run's base as it held it (lora.h: its hash and NF4 tensors are the
     * shards'), every shard in this process; its adapters come canonical from the file */
    if (tj.tp > 1) opts.tp = opts.tp_local = tj.tp;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m, full;
    dt_params canon; /* the adapters in the file's (unsplit) layout */
    memset(&canon, 0, sizeof canon);
    int have_m = 0, have_full = 0, have_canon = 0;
    dt_status st = dt_lora_validate(ctx, &c, &opts.lora);
    if (st == DT_OK) st = dt_model_init_opts(ctx, &m, &c, &opts, &alloc, 1, 1, DT_SLAB_PARAMS);
    have_m = st == DT_OK;
    if (st == DT_OK && tj.tp > 1) {
        dt_model_opts o1 = opts;
        o1.tp = o1.tp_local = 0;
        st = dt_lora_adapters_init(ctx, &canon, &c, &o1, &alloc, DT_SLAB_PARAMS);
        have_canon = st == DT_OK;
    }
    if (st == DT_OK) {
        if (info->base[0]) st = dt_lora_base_load(ctx, &m, info->base);
        else dt_model_init_base(&m, tj.seed);
    }
    if (st == DT_OK) {
        info->base_hash = dt_lora_base_hash(&m);
        if (info->base_hash != tj.lora_base) {
            char what[4400];
            if (info->base[0]) snprintf(what, sizeof what, "%s (lora.base_dtype %s)", info->base, nf4 ? "nf4" : "fp32");
            else snprintf(what, sizeof what, "the base drawn from training.seed %llu", (unsigned long long)tj.seed);
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s: not the base these adapters were trained on (XXH3 %016llx, %s/"
                         "trainer.json's lora_base %016llx)", what, (unsigned long long)info->base_hash, step_dir,
                         (unsigned long long)tj.lora_base);
        }
    }
    if (st == DT_OK && have_canon) {
        dt_model view = m;
        view.ps = canon;
        st = dt_ckpt_load_params(ctx, step_dir, &view, canon.params);
    } else if (st == DT_OK) {
        st = dt_ckpt_load_params(ctx, step_dir, &m, m.ps.params);
    }
    if (st == DT_OK && mkdir(out_dir, 0755) != 0 && errno != EEXIST)
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    if (st == DT_OK && access(out_dir, W_OK) != 0)
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot write there: %s", out_dir, strerror(errno));
    if (st == DT_OK) st = dt_model_init(ctx, &full, &c, &alloc, 1, 1, DT_SLAB_PARAMS);
    have_full = have_m && st == DT_OK;
    if (st == DT_OK) {
        st = copy_base(ctx, &m, &full.ps);
    }
    if (st == DT_OK) {
        info->sites = fold(&m, have_canon ? &canon : &m.ps, &full.ps);
        info->params = dt_model_num_params(&c);
        /* a dtrain model file first (next to the output), then its Hugging Face export */
        snprintf(tmp, sizeof tmp, "%s/.merge-%ld.safetensors", out_dir, (long)getpid());
        st = dt_model_file_save(ctx, &full, tmp, tok, tj.step);
        if (st == DT_OK) st = dt_hf_export(ctx, tmp, out_dir);
        unlink(tmp);
    }
    if (have_full) dt_model_free(&full);
    if (have_canon) dt_params_free(&canon);
    if (have_m) dt_model_free(&m);
    return st;
}
