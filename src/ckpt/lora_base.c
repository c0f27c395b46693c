/* A LoRA run's frozen base from a dtrain model file, tensor by tensor (lora_base.h). */
#include "ckpt/lora_base.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf_import.h"
#include "ckpt/interop.h"
#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
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
        char have[256], want[256];
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
            size_t e = ti->rows * ti->cols, stored = s->nbytes / sizeof(float);
            const dt_nf4 *q = dt_lora_nf4(m, id, l);
            float *dst = q ? calloc(e, sizeof(float)) : dt_params_tensor(&m->base, m->base.params, id, l);
            if (!dst) {
                st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory reading '%s'", file, name);
                break;
            }
            memcpy(dst, s->data, stored * sizeof(float));
            if (!q) {
                memset(dst + stored, 0, (e - stored) * sizeof(float)); /* vocabulary padding */
            } else {
                st = dt_nf4_quantize(ctx, name, (dt_nf4 *)q, dst, e);
                free(dst);
            }
        }
    }
    dt_params_free(&full);
    dt_st_close(f);
    if (st == DT_OK) *done = 1;
    return st;
}
