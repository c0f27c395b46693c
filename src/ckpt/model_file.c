#include "ckpt/model_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "core/log.h"

int dt_model_file_entries(const dt_model *m, float *base, const char *prefix, dt_st_entry *e,
                          char (*names)[DT_ST_NAME_MAX]) {
    const dt_params *ps = &m->ps;
    int n = 0;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        for (int l = 0; l < dt_params_copies(ps, id); l++, n++) {
            char nm[DT_ST_NAME_MAX];
            dt_params_name(ps, id, l, nm, sizeof nm);
            snprintf(names[n], DT_ST_NAME_MAX, "%s%s", prefix, nm);
            e[n] = (dt_st_entry){names[n], DT_ST_F32, t->rows == 1 ? 1 : 2,
                                 {t->rows == 1 ? (int64_t)t->cols : (int64_t)t->file_rows, (int64_t)t->cols},
                                 dt_params_tensor(ps, base, id, l)};
        }
    }
    return n;
}

int dt_model_file_entry_count(const dt_model *m) {
    int n = 0;
    for (int id = 0; id < m->ps.n_tensors; id++) n += dt_params_copies(&m->ps, id);
    return n;
}

/* The entries of every parameter tensor of m->ps.params, in newly allocated arrays. */
static dt_status param_entries(dt_ctx *ctx, const dt_model *m, const char *path, dt_st_entry **e,
                               char (**names)[DT_ST_NAME_MAX], int *n) {
    int cap = dt_model_file_entry_count(m);
    *e = malloc((size_t)cap * sizeof **e);
    *names = malloc((size_t)cap * sizeof **names);
    if (!*e || !*names) {
        free(*e);
        free(*names);
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    }
    *n = dt_model_file_entries(m, m->ps.params, "", *e, *names);
    return DT_OK;
}

dt_status dt_model_file_save(dt_ctx *ctx, const dt_model *m, const char *path,
                             const char *tokenizer, long step) {
    return dt_model_file_save_info(ctx, m, path, tokenizer, step, NULL);
}

#define MAX_META 24

dt_status dt_model_file_save_info(dt_ctx *ctx, const dt_model *m, const char *path,
                                  const char *tokenizer, long step, dt_io_info *info) {
    dt_st_entry *e;
    char(*names)[DT_ST_NAME_MAX];
    int n;
    DT_CHECK(param_entries(ctx, m, path, &e, &names, &n));
    /* format, the family's config fields in its order, step, tokenizer. */
    char v[MAX_META][32];
    const char *meta[2 * MAX_META + 1];
    int k = 0, nv = 0;
    meta[k++] = "format";
    meta[k++] = m->fam->file_format;
    for (int i = 0; m->fam->file_fields[i] && nv < MAX_META - 1; i++)
        for (int j = 0; j < dt_model_cfg_nfields; j++) {
            const dt_cfg_field *f = &dt_model_cfg_fields[j];
            const double x = dt_model_cfg_get(&m->cfg, f);
            if (strcmp(f->name, m->fam->file_fields[i]) || (f->optional && x == 0.0)) continue;
            if (f->names)
                snprintf(v[nv], 32, "%s", f->names[(int)x]);
            else
                snprintf(v[nv], 32, f->type == DT_CFG_INT ? "%.0f" : "%.9g", x);
            meta[k++] = f->name;
            meta[k++] = v[nv++];
        }
    snprintf(v[nv], 32, "%ld", step);
    meta[k++] = "step";
    meta[k++] = v[nv++];
    meta[k++] = "tokenizer";
    meta[k++] = tokenizer ? tokenizer : "";
    meta[k] = NULL;
    dt_status st = dt_st_write_info(ctx, path, e, n, meta, info);
    free(e);
    free(names);
    return st;
}

static dt_status meta_field(dt_ctx *ctx, const dt_st_file *f, const char *path, const dt_cfg_field *fd,
                            dt_model_config *c) {
    const char *v = dt_st_meta(f, fd->name);
    if (!v && fd->optional) return DT_OK; /* written only when not 0 (model.h) */
    if (v && fd->names) {
        for (int i = 0; fd->names[i]; i++)
            if (!strcmp(v, fd->names[i])) {
                dt_model_cfg_set(c, fd, i);
                return DT_OK;
            }
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata '%s' is '%.40s', not a name this dtrain knows", path,
                       fd->name, v);
    }
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || *end || end == v || !(x >= 0 && x <= (double)(1L << 30)) ||
        (fd->type == DT_CFG_INT && x != (double)(long)x))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata '%s' missing or not a non-negative %s", path,
                       fd->name, fd->type == DT_CFG_INT ? "integer" : "number");
    dt_model_cfg_set(c, fd, x);
    return DT_OK;
}

static dt_status read_config(dt_ctx *ctx, const dt_st_file *f, const char *path, dt_model_config *c) {
    const char *fmt = dt_st_meta(f, "format");
    const dt_model_family *fam = NULL;
    for (int i = 0; fmt && dt_model_families[i]; i++)
        if (!strcmp(fmt, dt_model_families[i]->file_format)) fam = dt_model_families[i];
    if (!fam)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a dtrain model file (metadata format %s)", path,
                       fmt ? "names no known model family" : "missing"); /* not echoed: one line */
    memset(c, 0, sizeof *c);
    snprintf(c->family, sizeof c->family, "%s", fam->name);
    for (int i = 0; fam->file_fields[i]; i++)
        for (int j = 0; j < dt_model_cfg_nfields; j++)
            if (!strcmp(dt_model_cfg_fields[j].name, fam->file_fields[i]))
                DT_CHECK(meta_field(ctx, f, path, &dt_model_cfg_fields[j], c));
    dt_status st = dt_model_config_validate(ctx, c);
    if (st != DT_OK) {
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", ctx->err);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: %s", path, msg);
    }
    return DT_OK;
}

dt_status dt_model_file_config(dt_ctx *ctx, const char *path, dt_model_config *cfg,
                               char *tokenizer, size_t tokenizer_size) {
    dt_st_file *f;
    DT_CHECK(dt_st_open(ctx, path, &f));
    dt_status st = read_config(ctx, f, path, cfg);
    if (st == DT_OK && tokenizer) {
        const char *t = dt_st_meta(f, "tokenizer");
        snprintf(tokenizer, tokenizer_size, "%s", t ? t : "");
    }
    dt_st_close(f);
    return st;
}

dt_status dt_model_file_load(dt_ctx *ctx, dt_model *m, const char *path) {
    dt_st_file *f;
    DT_CHECK(dt_st_open(ctx, path, &f));
    dt_model_config c;
    dt_status st = read_config(ctx, f, path, &c);
    if (st != DT_OK) goto done;
    if (!dt_model_config_equal(&c, &m->cfg)) {
        char have[400], want[400];
        dt_model_describe(&c, have, sizeof have);
        dt_model_describe(&m->cfg, want, sizeof want);
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s: model shape (%s) differs from the configured one (%s)", path,
                     have, want);
        goto done;
    }
    dt_st_entry *e;
    char(*names)[DT_ST_NAME_MAX];
    int n;
    st = param_entries(ctx, m, path, &e, &names, &n);
    if (st != DT_OK) goto done;
    for (int i = 0; i < n && st == DT_OK; i++) {
        const dt_st_tensor *t = dt_st_find(f, e[i].name);
        if (!t) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' is missing", path, e[i].name);
            break;
        }
        int same = t->dtype == DT_ST_F32 && t->ndim == e[i].ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == e[i].shape[d];
        if (!same) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' has the wrong dtype or shape", path, e[i].name);
            break;
        }
        memcpy((void *)e[i].data, t->data, t->nbytes);
    }
    free(e);
    free(names);
done:
    dt_st_close(f);
    return st;
}

dt_status dt_ckpt_resolve(dt_ctx *ctx, const char *path, char *out, size_t out_size) {
    struct stat sb;
    if (stat(path, &sb) != 0) return dt_fail(ctx, DT_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode)) {
        snprintf(out, out_size, "%s", path);
        return DT_OK;
    }
    char buf[4200], man[4200];
    snprintf(buf, sizeof buf, "%s/model.safetensors", path);
    snprintf(man, sizeof man, "%s/" DT_MANIFEST_NAME, path);
    if (stat(man, &sb) != 0 && stat(buf, &sb) == 0) { /* a plain model folder */
        snprintf(out, out_size, "%s", buf);
        return DT_OK;
    }
    /* A checkpoint (a step directory or the checkpoint.dir above them): only a verified step
     * is read, the same one --resume would load, and the command says which. */
    char step_dir[4200];
    DT_CHECK(dt_ckpt_find(ctx, path, step_dir, sizeof step_dir));
    dt_ckpt_trainer tj;
    DT_CHECK(dt_ckpt_read_trainer(ctx, step_dir, &tj));
    if (tj.lora)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: a LoRA checkpoint (lora.rank %d) holds only adapters, not a whole "
                       "model (dtrain ckpt merge folds them into their base)", step_dir, tj.lora_rank);
    dt_log_note(ctx, "loading %s (checksums verified)", step_dir);
    snprintf(out, out_size, "%s/model.safetensors", step_dir);
    return DT_OK;
}
