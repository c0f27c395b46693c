/* Model weights to and from llm.c (GPT-2) and Hugging Face files (see interop.h). */
#include "ckpt/interop.h"
#include "ckpt/hf_import.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "ops/ops.h"

/* Both formats are little-endian; values are read straight from the mapping. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "model files are little-endian");

typedef unsigned long long ull; /* for printf of 64-bit counts */

/* The family's tensor table for config c (offsets unset; rows of the embedding padded). */
static int table_of(const dt_model_config *c, dt_tensor_info *t) { return dt_model_tensors(c, t); }

static int copies_of(const dt_tensor_info *t, const dt_model_config *c) {
    return t->group == DT_PG_LAYER ? c->n_layer : 1;
}

/* ------------------------------------------------------------------ llm.c model files */

/* llm.c's tensors come in the order of dtrain's GPT-2 parameter table (wte, wpe, ln1w, ...,
 * lnfb), each kind for all layers at once; wte (the table's first row) has Vp rows. The
 * config read from the header has no family: llm.c files are GPT-2 ("" = gpt2). */
typedef struct llmc_file {
    void *map;
    size_t size;
    dt_model_config cfg;
    int vp;    /* padded vocabulary rows of wte in the file */
    int width; /* bytes per value: 4 (fp32, version 3) or 2 (bf16, version 5) */
    const unsigned char *data;
} llmc_file;

static void llmc_close(llmc_file *f) {
    if (f->map) munmap(f->map, f->size);
    memset(f, 0, sizeof *f);
}

/* Header fields: index into the 256 ints, name, bounds (dtrain's config limits). */
static const struct {
    int index;
    const char *name;
    long lo, hi;
} llmc_fields[] = {
    {2, "max_seq_len", 1, 65536}, {3, "vocab_size", 1, 1 << 24}, {4, "num_layers", 1, 1024},
    {5, "num_heads", 1, 65536},   {6, "channels", 1, 65536},      {7, "padded_vocab_size", 1, 1 << 25},
};

static dt_status llmc_parse(dt_ctx *ctx, const char *path, llmc_file *f) {
    const unsigned char *p = f->map;
    int32_t h[8];
    if (f->size < DT_LLMC_MODEL_HEADER_BYTES)
        return dt_fail(ctx, DT_ERR_FORMAT,
                       "%s: %llu bytes, shorter than the %d-byte llm.c model header (truncated?)",
                       path, (ull)f->size, DT_LLMC_MODEL_HEADER_BYTES);
    memcpy(h, p, sizeof h);
    if (h[0] != DT_LLMC_MODEL_MAGIC) {
        if (h[0] == 20240520)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: an llm.c token shard, not a model file", path);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: bad magic %d (expected %d for an llm.c model file)",
                       path, h[0], DT_LLMC_MODEL_MAGIC);
    }
    if (h[1] != 3 && h[1] != 5)
        return dt_fail(ctx, DT_ERR_FORMAT,
                       "%s: unknown llm.c model version %d (3 = fp32, 5 = bf16, both with a padded "
                       "vocabulary)",
                       path, h[1]);
    for (size_t i = 0; i < sizeof llmc_fields / sizeof llmc_fields[0]; i++) {
        long v = h[llmc_fields[i].index];
        if (v < llmc_fields[i].lo || v > llmc_fields[i].hi)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: header field %s = %ld is outside [%ld, %ld]",
                           path, llmc_fields[i].name, v, llmc_fields[i].lo, llmc_fields[i].hi);
    }
    dt_model_config c = {.n_layer = h[4], .d_model = h[6], .n_head = h[5], .vocab = h[3], .context = h[2]};
    f->vp = h[7];
    f->width = h[1] == 3 ? 4 : 2;
    if (f->vp < c.vocab)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: padded_vocab_size %d is smaller than vocab_size %d",
                       path, f->vp, c.vocab);
    if (c.n_head > c.d_model || c.d_model % c.n_head)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: num_heads %d does not divide channels %d", path,
                       c.n_head, c.d_model);
    dt_status st = dt_model_config_validate(ctx, &c);
    if (st != DT_OK) { /* cannot happen after the checks above; keep the file in the message */
        char msg[DT_ERRMSG_MAX];
        snprintf(msg, sizeof msg, "%s", ctx->err);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: %s", path, msg);
    }
    /* Every factor is bounded above, so this sum stays far below 2^63. */
    dt_tensor_info ps[DT_MODEL_MAX_TENSORS];
    int nt = table_of(&c, ps);
    ps[0].rows = (size_t)f->vp;
    uint64_t values = 0;
    for (int id = 0; id < nt; id++)
        values += (uint64_t)copies_of(&ps[id], &c) * ps[id].rows * ps[id].cols;
    uint64_t want = DT_LLMC_MODEL_HEADER_BYTES + values * (uint64_t)f->width;
    if ((uint64_t)f->size != want) {
        char why[48];
        if ((uint64_t)f->size < want)
            snprintf(why, sizeof why, "truncated");
        else
            snprintf(why, sizeof why, "%llu extra bytes", (ull)((uint64_t)f->size - want));
        return dt_fail(ctx, DT_ERR_FORMAT,
                       "%s: size mismatch: the header (%d layers, channels %d, padded vocab %d, "
                       "context %d, %s) needs %llu bytes but the file has %llu (%s)",
                       path, c.n_layer, c.d_model, f->vp, c.context, f->width == 4 ? "fp32" : "bf16",
                       (ull)want, (ull)f->size, why);
    }
    f->cfg = c;
    f->data = p + DT_LLMC_MODEL_HEADER_BYTES;
    return DT_OK;
}

static dt_status llmc_open(dt_ctx *ctx, const char *path, llmc_file *f) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    dt_status st = DT_OK;
    if (fstat(fd, &sb) != 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: not a regular file", path);
    } else if (sb.st_size < DT_LLMC_MODEL_HEADER_BYTES) {
        st = dt_fail(ctx, DT_ERR_FORMAT,
                     "%s: %lld bytes, shorter than the %d-byte llm.c model header (truncated?)",
                     path, (long long)sb.st_size, DT_LLMC_MODEL_HEADER_BYTES);
    } else {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            st = dt_fail(ctx, DT_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        } else {
            f->map = map;
            f->size = (size_t)sb.st_size;
            st = llmc_parse(ctx, path, f);
        }
    }
    close(fd);
    if (st != DT_OK) llmc_close(f);
    return st;
}

dt_status dt_llmc_model_config(dt_ctx *ctx, const char *path, dt_model_config *out) {
    llmc_file f;
    DT_CHECK(llmc_open(ctx, path, &f));
    *out = f.cfg;
    llmc_close(&f);
    return DT_OK;
}

/* bf16 -> fp32 is exact: the bf16 bits are the top half of the float's. */
static void widen_bf16(float *dst, const unsigned char *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[2 * i] << 16 | (uint32_t)src[2 * i + 1] << 24;
        memcpy(&dst[i], &u, 4);
    }
}

dt_status dt_llmc_model_load(dt_ctx *ctx, dt_model *m, const char *path) {
    if (!m->ps.params)
        return dt_fail(ctx, DT_ERR_INTERNAL, "%s: the model has no parameter slab to load into", path);
    llmc_file f;
    DT_CHECK(llmc_open(ctx, path, &f));
    if (!dt_model_config_equal(&f.cfg, &m->cfg)) {
        char have[400], want[400];
        dt_model_describe(&f.cfg, have, sizeof have);
        dt_model_describe(&m->cfg, want, sizeof want);
        dt_status st = dt_fail(ctx, DT_ERR_CONFIG, "%s: model shape (%s) differs from the configured one (%s)",
                               path, have, want);
        llmc_close(&f);
        return st;
    }
    const dt_params *ps = &m->ps;
    const unsigned char *src = f.data;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            size_t in_file = (id == 0 ? (size_t)f.vp : t->rows) * t->cols;
            /* wte: the file's padding rows are dropped, dtrain's are zeroed. */
            size_t n = t->file_rows * t->cols;
            float *dst = dt_params_tensor(ps, ps->params, id, l);
            if (f.width == 4)
                dt_copy(dst, src, n * 4);
            else
                widen_bf16(dst, src, n);
            dt_fill(dst + n, 0, (t->rows * t->cols - n) * sizeof(float));
            src += in_file * (size_t)f.width;
        }
    }
    llmc_close(&f);
    return DT_OK;
}

/* ------------------------------------------------------------------ import dispatch */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* An llm.c model file: its magic, or a .bin name on something that does not start like a
 * safetensors file (u64 header length, then '{'), so a damaged llm.c file gets llm.c's
 * message. Everything else is read as a dtrain model file. */
static int is_llmc(const char *path) {
    unsigned char h[9] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, h, sizeof h) != (ssize_t)sizeof h) memset(h, 0, sizeof h);
        close(fd);
    }
    int32_t magic;
    memcpy(&magic, h, 4);
    if (magic == DT_LLMC_MODEL_MAGIC) return 1;
    return h[8] != '{' && ends_with(path, ".bin");
}

dt_status dt_model_import_config(dt_ctx *ctx, const char *path, dt_model_config *out,
                                 char *tokenizer, size_t tokenizer_size) {
    if (dt_hf_is_dir(path)) return dt_hf_config(ctx, path, out, tokenizer, tokenizer_size);
    char file[4200];
    DT_CHECK(dt_ckpt_resolve(ctx, path, file, sizeof file));
    if (!is_llmc(file)) return dt_model_file_config(ctx, file, out, tokenizer, tokenizer_size);
    DT_CHECK(dt_llmc_model_config(ctx, file, out));
    /* llm.c trains with the GPT-2 tokenizer; another vocabulary means an unknown one. */
    if (tokenizer) snprintf(tokenizer, tokenizer_size, "%s", out->vocab == 50257 ? "gpt2" : "");
    return DT_OK;
}

dt_status dt_model_import(dt_ctx *ctx, dt_model *m, const char *path) {
    if (dt_hf_is_dir(path)) {
        dt_model_config c;
        DT_CHECK(dt_hf_config(ctx, path, &c, NULL, 0));
        if (!dt_model_config_equal(&c, &m->cfg)) {
            char have[400], want[400];
            dt_model_describe(&c, have, sizeof have);
            dt_model_describe(&m->cfg, want, sizeof want);
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: model (%s) differs from the configured one (%s)", path,
                           have, want);
        }
        DT_CHECK(dt_hf_load(ctx, m, path));
        return dt_params_check_finite(ctx, &m->ps, m->ps.params, path, 1);
    }
    char file[4200];
    DT_CHECK(dt_ckpt_resolve(ctx, path, file, sizeof file));
    if (!m->ps.params)
        return dt_fail(ctx, DT_ERR_INTERNAL, "%s: the model has no parameter slab to load into", file);
    DT_CHECK(is_llmc(file) ? dt_llmc_model_load(ctx, m, file) : dt_model_file_load(ctx, m, file));
    /* NaN/Inf weights would be reported at step 1 as a divergence ("lower optimizer.lr"). */
    return dt_params_check_finite(ctx, &m->ps, m->ps.params, file, 0);
}

/* ------------------------------------------------------------------ Hugging Face export */

/* dst (cols x rows) = src (rows x cols) transposed, in 32 x 32 tiles. */
static void transpose(float *dst, const float *src, size_t rows, size_t cols) {
    for (size_t i0 = 0; i0 < rows; i0 += 32)
        for (size_t j0 = 0; j0 < cols; j0 += 32)
            for (size_t i = i0; i < rows && i < i0 + 32; i++)
                for (size_t j = j0; j < cols && j < j0 + 32; j++) dst[j * rows + i] = src[i * cols + j];
}

static dt_status mkdir_p(dt_ctx *ctx, const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return dt_fail(ctx, DT_ERR_IO, "%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char keep = *p;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return dt_fail(ctx, DT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = keep;
        if (!keep) return DT_OK;
    }
}

static dt_status write_config_json(dt_ctx *ctx, const char *dir, const dt_model_config *c,
                                   const char *tokenizer) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    /* The GPT-2 tokenizer's <|endoftext|> (50256) is both bos and eos; other tokenizers
     * have none transformers would know. */
    const char *eot = !strcmp(tokenizer, "gpt2") && c->vocab > 50256 ? "50256" : "null";
    const dt_model_family *fam = dt_model_family_of(c);
    char body[2048];
    fam->hf_config(c, body, sizeof body);
    const char *arch = fam->hf_architecture, *type = fam->hf_model_type;
    if (fam->hf_identity) fam->hf_identity(c, &arch, &type);
    int bad = fprintf(f,
                      "{\n"
                      "  \"architectures\": [\"%s\"],\n"
                      "  \"model_type\": \"%s\",\n"
                      "%s,\n"
                      "  \"initializer_range\": 0.02,\n"
                      "  \"use_cache\": true,\n"
                      "  \"torch_dtype\": \"float32\",\n"
                      "  \"bos_token_id\": %s,\n"
                      "  \"eos_token_id\": %s,\n"
                      "  \"dtrain_tokenizer\": \"%s\"\n"
                      "}\n",
                      arch, type, body, eot, eot,
                      !strcmp(tokenizer, "gpt2") || !strcmp(tokenizer, "byte") || !strcmp(tokenizer, "hf")
                          ? tokenizer : "") < 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        dt_status st = dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return DT_OK;
}

dt_status dt_hf_export(dt_ctx *ctx, const char *src, const char *out_dir) {
    char path[4200], out[4200], tok[32];
    dt_model_config c;
    DT_CHECK(dt_ckpt_resolve(ctx, src, path, sizeof path));
    DT_CHECK(dt_model_file_config(ctx, path, &c, tok, sizeof tok));
    if (!dt_model_family_of(&c)->hf_architecture)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: a %s model has no Hugging Face export", path, c.family);
    if (snprintf(out, sizeof out, "%s/model.safetensors", out_dir) >= (int)sizeof out)
        return dt_fail(ctx, DT_ERR_IO, "%s: path too long", out_dir);
    dt_tensor_info ps[DT_MODEL_MAX_TENSORS];
    int nt = table_of(&c, ps);
    int n = 0;
    size_t tfloats = 0; /* floats of the transposed copies */
    for (int id = 0; id < nt; id++) {
        n += copies_of(&ps[id], &c);
        if (ps[id].ext_transpose) tfloats += (size_t)copies_of(&ps[id], &c) * ps[id].file_rows * ps[id].cols;
    }
    dt_status st = DT_OK;
    dt_st_file *f = NULL;
    dt_st_entry *e = malloc((size_t)n * sizeof *e);
    char(*names)[DT_ST_NAME_MAX] = malloc((size_t)n * sizeof *names);
    float *tbuf = malloc((tfloats ? tfloats : 1) * sizeof(float));
    if (!e || !names || !tbuf) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory for the export of %s", out, path);
        goto fail;
    }
    DT_CHECK_GOTO(dt_st_open(ctx, path, &f));
    float *tnext = tbuf;
    int k = 0;
    for (int id = 0; id < nt; id++) {
        const dt_tensor_info *p = &ps[id];
        for (int l = 0; l < copies_of(p, &c); l++, k++) {
            char own[DT_ST_NAME_MAX];
            const char *ext = p->ext_name ? p->ext_name : p->name;
            snprintf(own, sizeof own, p->name, l); /* names without "%d" ignore the layer */
            snprintf(names[k], DT_ST_NAME_MAX, ext, l);
            const dt_st_tensor *t = dt_st_find(f, own);
            int ndim = p->rows == 1 ? 1 : 2;
            int64_t r = (int64_t)p->file_rows, cl = (int64_t)p->cols;
            if (!t || t->dtype != DT_ST_F32 || t->ndim != ndim ||
                (ndim == 1 ? t->shape[0] != cl : t->shape[0] != r || t->shape[1] != cl)) {
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' is %s", path, own,
                             t ? "not F32 of the model's shape" : "missing");
                goto fail;
            }
            if (p->ext_transpose) {
                transpose(tnext, t->data, p->file_rows, p->cols);
                e[k] = (dt_st_entry){names[k], DT_ST_F32, 2, {cl, r}, tnext};
                tnext += p->file_rows * p->cols;
            } else {
                e[k] = (dt_st_entry){names[k], DT_ST_F32, ndim, {ndim == 1 ? cl : r, cl}, t->data};
            }
        }
    }
    DT_CHECK_GOTO(mkdir_p(ctx, out_dir));
    /* transformers refuses safetensors files whose metadata lacks format = pt. */
    const char *meta[] = {"format", "pt", NULL};
    DT_CHECK_GOTO(dt_st_write(ctx, out, e, n, meta));
    DT_CHECK_GOTO(write_config_json(ctx, out_dir, &c, tok));
fail:
    dt_st_close(f);
    free(e);
    free(names);
    free(tbuf);
    return st;
}
