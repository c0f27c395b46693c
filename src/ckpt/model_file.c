#include "ckpt/model_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "core/log.h"

int dt_model_file_entries(const dt_gpt2 *m, float *base, const char *prefix, dt_st_entry *e,
                          char (*names)[DT_ST_NAME_MAX]) {
    int n = 0;
    for (int id = 0; id < DT_GPT2_NPARAMS; id++) {
        const dt_tensor_info *t = &m->tensors[id];
        int copies = t->group == DT_PG_LAYER ? m->cfg.n_layer : 1;
        for (int l = 0; l < copies; l++, n++) {
            char nm[DT_ST_NAME_MAX];
            dt_gpt2_tensor_name(m, (dt_gpt2_param_id)id, l, nm, sizeof nm);
            snprintf(names[n], DT_ST_NAME_MAX, "%s%s", prefix, nm);
            int64_t rows = id == DT_GPT2_P_WTE ? m->cfg.vocab : (int64_t)t->rows; /* unpadded */
            e[n] = (dt_st_entry){names[n], DT_ST_F32, t->rows == 1 ? 1 : 2,
                                 {t->rows == 1 ? (int64_t)t->cols : rows, (int64_t)t->cols},
                                 dt_gpt2_tensor(m, base, (dt_gpt2_param_id)id, l)};
        }
    }
    return n;
}

/* The entries of every parameter tensor of m->params, in newly allocated arrays. */
static dt_status param_entries(dt_ctx *ctx, const dt_gpt2 *m, const char *path, dt_st_entry **e,
                               char (**names)[DT_ST_NAME_MAX], int *n) {
    int cap = DT_GPT2_NPARAMS * (m->cfg.n_layer + 1);
    *e = malloc((size_t)cap * sizeof **e);
    *names = malloc((size_t)cap * sizeof **names);
    if (!*e || !*names) {
        free(*e);
        free(*names);
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    }
    *n = dt_model_file_entries(m, m->params, "", *e, *names);
    return DT_OK;
}

dt_status dt_model_file_save(dt_ctx *ctx, const dt_gpt2 *m, const char *path,
                             const char *tokenizer, long step) {
    return dt_model_file_save_info(ctx, m, path, tokenizer, step, NULL);
}

dt_status dt_model_file_save_info(dt_ctx *ctx, const dt_gpt2 *m, const char *path,
                                  const char *tokenizer, long step, dt_io_info *info) {
    dt_st_entry *e;
    char(*names)[DT_ST_NAME_MAX];
    int n;
    DT_CHECK(param_entries(ctx, m, path, &e, &names, &n));
    char v[6][32];
    snprintf(v[0], 32, "%d", m->cfg.n_layer);
    snprintf(v[1], 32, "%d", m->cfg.d_model);
    snprintf(v[2], 32, "%d", m->cfg.n_head);
    snprintf(v[3], 32, "%d", m->cfg.vocab);
    snprintf(v[4], 32, "%d", m->cfg.context);
    snprintf(v[5], 32, "%ld", step);
    const char *meta[] = {"format", "dtrain-gpt2", "n_layer", v[0], "d_model", v[1],
                          "n_head", v[2], "vocab", v[3], "context", v[4], "step", v[5],
                          "tokenizer", tokenizer ? tokenizer : "", NULL};
    dt_status st = dt_st_write_info(ctx, path, e, n, meta, info);
    free(e);
    free(names);
    return st;
}

static dt_status meta_int(dt_ctx *ctx, const dt_st_file *f, const char *path, const char *key, int *out) {
    const char *v = dt_st_meta(f, key);
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || end == v || x < 1 || x > (1L << 30))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata '%s' missing or not a positive integer", path, key);
    *out = (int)x;
    return DT_OK;
}

static dt_status read_config(dt_ctx *ctx, const dt_st_file *f, const char *path, dt_gpt2_config *c) {
    const char *fmt = dt_st_meta(f, "format");
    if (!fmt || strcmp(fmt, "dtrain-gpt2"))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a dtrain GPT-2 model file (metadata format %s)",
                       path, fmt ? "is not dtrain-gpt2" : "missing"); /* not echoed: one line */
    memset(c, 0, sizeof *c);
    DT_CHECK(meta_int(ctx, f, path, "n_layer", &c->n_layer));
    DT_CHECK(meta_int(ctx, f, path, "d_model", &c->d_model));
    DT_CHECK(meta_int(ctx, f, path, "n_head", &c->n_head));
    DT_CHECK(meta_int(ctx, f, path, "vocab", &c->vocab));
    DT_CHECK(meta_int(ctx, f, path, "context", &c->context));
    dt_status st = dt_gpt2_config_validate(ctx, c);
    if (st != DT_OK) {
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", ctx->err);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: %s", path, msg);
    }
    return DT_OK;
}

dt_status dt_model_file_config(dt_ctx *ctx, const char *path, dt_gpt2_config *cfg,
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

dt_status dt_model_file_load(dt_ctx *ctx, dt_gpt2 *m, const char *path) {
    dt_st_file *f;
    DT_CHECK(dt_st_open(ctx, path, &f));
    dt_gpt2_config c;
    dt_status st = read_config(ctx, f, path, &c);
    if (st != DT_OK) goto done;
    if (c.n_layer != m->cfg.n_layer || c.d_model != m->cfg.d_model || c.n_head != m->cfg.n_head ||
        c.vocab != m->cfg.vocab || c.context != m->cfg.context) {
        st = dt_fail(ctx, DT_ERR_CONFIG,
                     "%s: model shape (layers %d, d_model %d, heads %d, vocab %d, context %d) differs "
                     "from the configured one (%d, %d, %d, %d, %d)",
                     path, c.n_layer, c.d_model, c.n_head, c.vocab, c.context, m->cfg.n_layer,
                     m->cfg.d_model, m->cfg.n_head, m->cfg.vocab, m->cfg.context);
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
    dt_log_note(ctx, "loading %s (checksums verified)", step_dir);
    snprintf(out, out_size, "%s/model.safetensors", step_dir);
    return DT_OK;
}
