/* Hugging Face model directories in (see hf_import.h). */
#include "ckpt/hf_import.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_io.h"
#include "ckpt/safetensors.h"
#include "model/hf_json.h"
#include "ops/ops.h"

#define HF_MAX_SHARDS 256

static int exists(const char *dir, const char *name) {
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat s;
    return stat(p, &s) == 0;
}

int dt_hf_is_dir(const char *path) {
    struct stat s;
    if (stat(path, &s) != 0 || !S_ISDIR(s.st_mode)) return 0;
    /* A dtrain checkpoint (or step) directory is read by dt_ckpt_resolve, even when an
     * export left a config.json beside it. */
    return exists(path, "config.json") && !exists(path, "latest") && !exists(path, "MANIFEST.json") &&
           !exists(path, "trainer.json");
}

/* ------------------------------------------------------------------ config.json */

dt_status dt_hf_config(dt_ctx *ctx, const char *dir, dt_model_config *out, char *tokenizer,
                       size_t tokenizer_size) {
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t n;
    DT_CHECK(dt_io_read_small(ctx, path, 4u << 20, &text, &n));
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    dt_hf_json j = {path, root, NULL};
    memset(out, 0, sizeof *out);
    dt_status st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    const dt_model_family *fam = NULL;
    char known[128] = "";
    size_t kl = 0;
    for (int i = 0; dt_model_families[i]; i++)
        for (int k = 0; dt_model_families[i]->hf_model_types && dt_model_families[i]->hf_model_types[k]; k++) {
            if (!strcmp(type, dt_model_families[i]->hf_model_types[k])) fam = dt_model_families[i];
            if (kl < sizeof known - 1)
                kl += (size_t)snprintf(known + kl, sizeof known - kl, "%s%s", kl ? ", " : "",
                                       dt_model_families[i]->hf_model_types[k]);
            if (kl > sizeof known - 1) kl = sizeof known - 1;
        }
    if (fam) {
        snprintf(out->family, sizeof out->family, "%s", fam->name);
        st = fam->hf_read_config(ctx, &j, out);
    } else {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s: model_type '%s' is not supported (%s)", path, type, known);
    }
    if (st == DT_OK && tokenizer) {
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "dtrain_tokenizer");
        snprintf(tokenizer, tokenizer_size, "%s",
                 cJSON_IsString(tk) ? tk->valuestring : out->vocab == 50257 ? "gpt2" : "");
    }
    cJSON_Delete(root);
    if (st != DT_OK) return st;
    /* The family's own rules, in the file's terms. */
    st = dt_model_config_validate(ctx, out);
    if (st != DT_OK) {
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", ctx->err);
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s", path, msg);
    }
    return DT_OK;
}

/* ------------------------------------------------------------------ tensors */

typedef struct hf_files {
    int n;
    char names[HF_MAX_SHARDS][256];
    dt_st_file *f[HF_MAX_SHARDS];
} hf_files;

static void files_close(hf_files *h) {
    for (int i = 0; i < h->n; i++) dt_st_close(h->f[i]);
    h->n = 0;
}

/* Opens model.safetensors, or every shard the index names (file names only: no '/'). */
static dt_status files_open(dt_ctx *ctx, const char *dir, hf_files *h) {
    memset(h, 0, sizeof *h);
    char path[4600];
    if (exists(dir, "model.safetensors")) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        snprintf(h->names[0], sizeof h->names[0], "model.safetensors");
        DT_CHECK(dt_st_open(ctx, path, &h->f[0]));
        h->n = 1;
        return DT_OK;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!exists(dir, "model.safetensors.index.json"))
        return dt_fail(ctx, DT_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json", dir);
    char *text;
    size_t n;
    DT_CHECK(dt_io_read_small(ctx, path, 64u << 20, &text, &n));
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    dt_status st = DT_OK;
    if (!cJSON_IsObject(map)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: no weight_map object", path);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0] ||
            strlen(e->valuestring) >= sizeof h->names[0] || !strcmp(e->valuestring, "..")) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name in the directory",
                         path, e->string);
            goto done;
        }
        int k = 0;
        while (k < h->n && strcmp(h->names[k], e->valuestring)) k++;
        if (k < h->n) continue;
        if (h->n == HF_MAX_SHARDS) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: more than %d shard files", path, HF_MAX_SHARDS);
            goto done;
        }
        snprintf(h->names[h->n], sizeof h->names[0], "%s", e->valuestring);
        char shard[4600];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        st = dt_st_open(ctx, shard, &h->f[h->n]);
        if (st != DT_OK) goto done;
        h->n++;
    }
done:
    cJSON_Delete(root);
    if (st != DT_OK) files_close(h);
    return st;
}

/* The tensor `name` (or "transformer." + name, for GPT-2 files written with the prefix). */
static const dt_st_tensor *files_find(const hf_files *h, const char *name, int *file) {
    char alt[300];
    snprintf(alt, sizeof alt, "transformer.%s", name);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < h->n; i++) {
            const dt_st_tensor *t = dt_st_find(h->f[i], pass ? alt : name);
            if (t) {
                *file = i;
                return t;
            }
        }
    return NULL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | (m << 13); /* inf, nan */
    else if (e)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else if (!m)
        bits = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400)) m <<= 1, e--;
        bits = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Element i of t as float (exact for every dtype read). */
static float value_at(const dt_st_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data;
    float f;
    uint16_t h;
    uint32_t bits;
    switch (t->dtype) {
    case DT_ST_F32: memcpy(&f, p + 4 * i, 4); return f;
    case DT_ST_F16: memcpy(&h, p + 2 * i, 2); return half_to_float(h);
    case DT_ST_BF16:
        memcpy(&h, p + 2 * i, 2);
        bits = (uint32_t)h << 16;
        memcpy(&f, &bits, 4);
        return f;
    case DT_ST_I32: break;
    }
    return NAN;
}

dt_status dt_hf_load(dt_ctx *ctx, dt_model *m, const char *dir) {
    if (!m->ps.params)
        return dt_fail(ctx, DT_ERR_INTERNAL, "%s: the model has no parameter slab to load into", dir);
    hf_files h;
    DT_CHECK(files_open(ctx, dir, &h));
    const dt_params *ps = &m->ps;
    dt_status st = DT_OK;
    for (int id = 0; id < ps->n_tensors && st == DT_OK; id++) {
        const dt_tensor_info *ti = &ps->tensors[id];
        for (int l = 0; l < dt_params_copies(ps, id) && st == DT_OK; l++) {
            char name[256];
            dt_params_ext_name(ps, id, l, name, sizeof name);
            int fi = 0;
            const dt_st_tensor *t = files_find(&h, name, &fi);
            /* The file's shape: (cols, rows) where the format stores the transpose. */
            int64_t r = (int64_t)ti->file_rows, c = (int64_t)ti->cols;
            int64_t want0 = ti->ext_transpose ? c : r, want1 = ti->ext_transpose ? r : c;
            int ndim = ti->rows == 1 ? 1 : 2;
            if (!t) {
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' is missing", dir, name);
                break;
            }
            if (t->dtype == DT_ST_I32 || t->ndim != ndim ||
                (ndim == 1 ? t->shape[0] != c : t->shape[0] != want0 || t->shape[1] != want1)) {
                st = dt_fail(ctx, DT_ERR_FORMAT,
                             "%s/%s: tensor '%s' has shape [%lld%s%lld] %s; the model needs [%lld, %lld] float",
                             dir, h.names[fi], name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                             t->ndim > 1 ? (long long)t->shape[1] : 0LL,
                             t->dtype == DT_ST_I32 ? "I32" : "", (long long)(ndim == 1 ? 1 : want0),
                             (long long)(ndim == 1 ? c : want1));
                break;
            }
            float *dst = dt_params_tensor(ps, ps->params, id, l);
            if (ti->ext_transpose) {
                for (int64_t i = 0; i < r; i++)
                    for (int64_t j = 0; j < c; j++) dst[i * c + j] = value_at(t, (size_t)(j * r + i));
            } else if (t->dtype == DT_ST_F32) {
                dt_copy(dst, t->data, (size_t)(r * c) * sizeof(float));
            } else if ((uintptr_t)t->data % 2 == 0) {
                /* F16/BF16: the vectorised, threaded exact widening (ops.h), not element by
                 * element: a 7B model's 14 GB widen in seconds. */
                dt_from_lowp(t->dtype == DT_ST_F16 ? DT_F16 : DT_BF16, dst, (const uint16_t *)t->data,
                             (size_t)(r * c));
            } else {
                for (size_t i = 0; i < (size_t)(r * c); i++) dst[i] = value_at(t, i);
            }
            dt_fill(dst + r * c, 0, (ti->rows - ti->file_rows) * ti->cols * sizeof(float));
        }
    }
    files_close(&h);
    return st;
}
