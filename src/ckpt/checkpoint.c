/* Checkpoints: trainer.json, the step directories, and reading (verify, find the newest
 * intact step, load with resharding). Writing is ckpt_saver.c. */
#include "ckpt/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_impl.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/model_file.h"
#include "core/log.h"
#include "model/lora.h"
#include "ops/cpu/isa.h"
#include "ops/ops.h"

/* ---- trainer.json */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

char *dt_ckpt_trainer_json(const dt_ckpt_trainer *t, const char *config_yaml, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fprintf(f, "{\n  \"format\": \"dtrain-trainer\",\n  \"version\": 1,\n  \"dtrain_version\": \"%s\",\n",
            DT_VERSION);
    fprintf(f, "  \"kernel_isa\": \"%s\",\n  \"cpu_flags\": \"%s\",\n", dt_isa_name(dt_isa_active()),
            dt_isa_cpu_flags());
    fprintf(f, "  \"step\": %ld,\n  \"tokens_seen\": %.17g,\n  \"seed\": \"%" PRIu64 "\",\n", t->step,
            t->tokens_seen, t->seed);
    fprintf(f, "  \"rng\": {\"kind\": \"counter\", \"seed\": \"%" PRIu64 "\", \"counter\": %ld},\n", t->seed, t->step);
    fprintf(f, "  \"world\": %d,\n  \"strategy\": \"%s\",\n  \"hybrid\": %d,\n", t->world, t->strategy, t->hybrid);
    fprintf(f, "  \"tp\": %d,\n", t->tp > 1 ? t->tp : 1);
    fprintf(f, "  \"micro_batch\": %d,\n  \"grad_accum\": %d,\n  \"seq_len\": %d,\n", t->micro_batch, t->accum,
            t->seq_len);
    fprintf(f, "  \"loss\": %.9g,\n  \"train_seconds\": %.6f,\n", t->loss, t->train_seconds);
    fprintf(f, "  \"precision\": \"%s\",\n  \"loss_scale\": {\"scale\": %.9g, \"good_steps\": %ld, \"overflows\": %ld},\n",
            t->precision[0] ? t->precision : "fp32", t->loss_scale, t->loss_scale_good, t->overflows);
    if (t->lora) {
        char tg[64];
        dt_lora_targets_str(t->lora_targets, tg, sizeof tg);
        fprintf(f, "  \"lora_base\": \"xxh3:%016" PRIx64 "\",\n  \"lora_rank\": %d,\n  \"lora_alpha\": %.9g,\n"
                "  \"lora_targets\": \"%s\",\n  \"lora_dropout\": %.9g,\n", t->lora_base, t->lora_rank, t->lora_alpha, tg,
                t->lora_dropout);
        if (t->lora_base_fp) fprintf(f, "  \"lora_base_fp\": \"%016" PRIx64 "\",\n", t->lora_base_fp);
    }
    if (t->has_sampler)
        fprintf(f,
                "  \"data\": {\"cursor\": \"%" PRIu64 "\", \"seed\": \"%" PRIu64 "\", \"shuffle\": %d, \"seq_len\": %d, "
                "\"samples\": \"%" PRIu64 "\", \"layout\": \"%016" PRIx64 "\"},\n",
                t->sampler.cursor, t->sampler.seed, t->sampler.shuffle, t->sampler.T, t->sampler.n_samples,
                t->sampler.layout);
    else
        fputs("  \"data\": null,\n", f);
    fputs("  \"config\": ", f);
    json_str(f, config_yaml ? config_yaml : "");
    fputs("\n}\n", f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int j_num(const cJSON *o, const char *k, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return 0;
    *out = v->valuedouble;
    return 1;
}

/* An integral JSON number in [lo, hi]. */
static int j_int(const cJSON *o, const char *k, double lo, double hi, double *out) {
    return j_num(o, k, lo, hi, out) && *out == (double)(int64_t)*out;
}

/* A uint64 stored as a decimal (or, with hex = 1, hexadecimal) string. */
static int j_u64(const cJSON *o, const char *k, int hex, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(v) || !v->valuestring[0] || v->valuestring[0] == '-') return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v->valuestring, &end, hex ? 16 : 10);
    if (*end || errno) return 0;
    *out = x;
    return 1;
}

dt_status dt_ckpt_read_trainer(dt_ctx *ctx, const char *step_dir, dt_ckpt_trainer *out) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" TRAINER_JSON, step_dir);
    memset(out, 0, sizeof *out);
    char *buf;
    size_t n;
    DT_CHECK(dt_io_read_small(ctx, path, 16u << 20, &buf, &n));
    dt_status st = dt_ckpt_parse_trainer(ctx, buf, n, path, out);
    free(buf);
    return st;
}

dt_status dt_ckpt_parse_trainer(dt_ctx *ctx, const char *text, size_t n, const char *path, dt_ckpt_trainer *out) {
    memset(out, 0, sizeof *out);
    cJSON *r = cJSON_ParseWithLength(text, n);
    if (!r) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON", path);
    dt_status st = DT_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(r, "format");
    const cJSON *strat = cJSON_GetObjectItemCaseSensitive(r, "strategy");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(r, "data");
    double step = 0, tok = 0, world = 0, mb = 0, acc = 0, T = 0, hyb = 0, loss = 0, secs = 0, v;
    const char *bad = NULL;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dtrain-trainer")) bad = "format";
    else if (!j_int(r, "version", 1, 1, &v)) bad = "version";
    else if (!j_int(r, "step", 0, 1e15, &step)) bad = "step";
    else if (!j_num(r, "tokens_seen", 0, 1e30, &tok)) bad = "tokens_seen";
    else if (!j_u64(r, "seed", 0, &out->seed)) bad = "seed";
    else if (!j_int(r, "world", 1, 1e7, &world)) bad = "world";
    else if (!j_int(r, "micro_batch", 1, 1e9, &mb)) bad = "micro_batch";
    else if (!j_int(r, "grad_accum", 1, 1e9, &acc)) bad = "grad_accum";
    else if (!j_int(r, "seq_len", 1, 1e9, &T)) bad = "seq_len";
    else if (!j_int(r, "hybrid", 0, 1, &hyb)) bad = "hybrid";
    else if (!cJSON_IsString(strat) || strlen(strat->valuestring) >= sizeof out->strategy ||
             strspn(strat->valuestring, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(strat->valuestring))
        bad = "strategy";
    else if (!cJSON_IsNull(data) && !cJSON_IsObject(data)) bad = "data";
    if (!bad && cJSON_IsObject(data)) {
        double sh, dT;
        if (!j_u64(data, "cursor", 0, &out->sampler.cursor) || !j_u64(data, "seed", 0, &out->sampler.seed) ||
            !j_int(data, "shuffle", 0, 1, &sh) || !j_int(data, "seq_len", 1, 1e9, &dT) ||
            !j_u64(data, "samples", 0, &out->sampler.n_samples) || !j_u64(data, "layout", 1, &out->sampler.layout))
            bad = "data";
        else {
            out->has_sampler = 1;
            out->sampler.shuffle = (int32_t)sh;
            out->sampler.T = (int32_t)dT;
        }
    }
    /* LoRA runs: the reference to their frozen base */
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(r, "lora_base");
    unsigned long long lh;
    char tail;
    if (cJSON_IsString(lb) && strlen(lb->valuestring) == 21 && sscanf(lb->valuestring, "xxh3:%16llx%c", &lh, &tail) == 1) {
        out->lora = 1;
        out->lora_base = (uint64_t)lh;
    } else if (lb && !bad) {
        bad = "lora_base";
    }
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(r, "lora_base_fp"); /* absent before it existed: none */
    if (out->lora && lf && !bad) {
        if (cJSON_IsString(lf) && strlen(lf->valuestring) == 16 && sscanf(lf->valuestring, "%16llx%c", &lh, &tail) == 1)
            out->lora_base_fp = (uint64_t)lh;
        else
            bad = "lora_base_fp";
    }
    if (out->lora && !bad) {
        const cJSON *tg = cJSON_GetObjectItemCaseSensitive(r, "lora_targets");
        double rk;
        dt_ctx quiet;
        dt_ctx_init(&quiet);
        if (!j_int(r, "lora_rank", 1, 1024, &rk)) bad = "lora_rank";
        else if (!j_num(r, "lora_alpha", 0, 1e6, &out->lora_alpha)) bad = "lora_alpha";
        else if (!cJSON_IsString(tg) || dt_lora_parse_targets(&quiet, tg->valuestring, &out->lora_targets) != DT_OK)
            bad = "lora_targets";
        else if (cJSON_GetObjectItemCaseSensitive(r, "lora_dropout") && /* absent before dropout: 0 */
                 !j_num(r, "lora_dropout", 0, 0.999999999, &out->lora_dropout))
            bad = "lora_dropout";
        else out->lora_rank = (int)rk;
    }
    if (bad) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' missing or invalid", path, bad);
    } else {
        j_num(r, "loss", -1e30, 1e30, &loss);
        j_num(r, "train_seconds", 0, 1e15, &secs);
        /* Absent in checkpoints written before mixed precision: fp32, no scaling. */
        const cJSON *prec = cJSON_GetObjectItemCaseSensitive(r, "precision");
        snprintf(out->precision, sizeof out->precision, "%s", cJSON_IsString(prec) ? prec->valuestring : "fp32");
        const cJSON *ls = cJSON_GetObjectItemCaseSensitive(r, "loss_scale");
        double sc = 1, good = 0, ovf = 0;
        if (cJSON_IsObject(ls)) {
            j_num(ls, "scale", 1e-30, 1e38, &sc);
            j_num(ls, "good_steps", 0, 1e15, &good);
            j_num(ls, "overflows", 0, 1e15, &ovf);
        }
        out->loss_scale = sc;
        out->loss_scale_good = (long)good;
        out->overflows = (long)ovf;
        out->step = (long)step;
        out->tokens_seen = tok;
        out->world = (int)world;
        out->micro_batch = (int)mb;
        out->accum = (int)acc;
        out->seq_len = (int)T;
        out->hybrid = (int)hyb;
        double tp = 1;
        out->tp = j_int(r, "tp", 1, 1e6, &tp) ? (int)tp : 1; /* absent before tensor parallelism: 1 */
        out->loss = loss;
        out->train_seconds = secs;
        snprintf(out->strategy, sizeof out->strategy, "%s", strat->valuestring);
    }
    cJSON_Delete(r);
    return st;
}

static int parse_step_name(const char *name, long *step) {
    if (strncmp(name, "step-", 5) != 0) return 0;
    const char *p = name + 5;
    size_t n = strlen(p);
    if (n < 8 || n > 15) return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9') return 0;
    *step = strtol(p, NULL, 10);
    return 1;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* Step numbers of the step-* directories under root, newest first (caller frees). */
int dt_ckpt_list_steps(const char *root, long **out) {
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step;
        if (!parse_step_name(e->d_name, &step)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            long *v = realloc(*out, (size_t)cap * sizeof *v);
            if (!v) break;
            *out = v;
        }
        (*out)[n++] = step;
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof **out, cmp_long_desc);
    return n;
}

/* ---- reading */

/* The model file holds every tensor of the model its metadata describes: checksums only
 * prove the bytes are the ones written, not that the writer wrote everything. The element
 * count is checked here; names and shapes when the file is loaded. */
static dt_status check_model_complete(dt_ctx *ctx, const char *path, dt_st_file *f, const dt_ckpt_trainer *tj) {
    dt_model_config c;
    char tok[32];
    dt_status st = dt_model_file_config(ctx, path, &c, tok, sizeof tok);
    if (st != DT_OK) {
        dt_st_close(f);
        return st;
    }
    size_t have = 0;
    for (int i = 0; i < dt_st_count(f); i++) have += dt_st_at(f, i)->nbytes / 4;
    size_t want = dt_model_num_params(&c);
    if (tj->lora) { /* a LoRA run's file holds its adapters */
        dt_lora_cfg lora = {tj->lora_rank, 0.0f, 0.0f, tj->lora_targets, 0, 0};
        st = dt_model_config_validate(ctx, &c);
        if (st == DT_OK) st = dt_lora_validate(ctx, &c, &lora);
        if (st != DT_OK) {
            dt_st_close(f);
            return st;
        }
        want = dt_lora_num_params(&c, &lora);
    }
    if (have != want) {
        int count = dt_st_count(f);
        dt_st_close(f);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: %zu parameters in %d tensors, the model it describes has %zu: "
                       "a tensor is missing or extra", path, have, count, want);
    }
    return DT_OK;
}

dt_status dt_ckpt_verify(dt_ctx *ctx, const char *step_dir, dt_manifest *out) {
    dt_manifest m;
    DT_CHECK(dt_manifest_read(ctx, step_dir, &m));
    dt_status st = dt_manifest_verify_files(ctx, step_dir, &m);
    if (st == DT_OK && (!dt_manifest_find(&m, MODEL_FILE) || !dt_manifest_find(&m, TRAINER_JSON)))
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s/" DT_MANIFEST_NAME ": does not list " MODEL_FILE " and " TRAINER_JSON,
                     step_dir);
    dt_ckpt_trainer tj;
    memset(&tj, 0, sizeof tj);
    if (st == DT_OK) {
        st = dt_ckpt_read_trainer(ctx, step_dir, &tj);
        if (st == DT_OK && tj.step != m.step)
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s/" TRAINER_JSON ": step %ld, the manifest says %ld", step_dir,
                         tj.step, m.step);
    }
    for (int i = 0; i < m.nfiles && st == DT_OK; i++) {
        size_t l = strlen(m.files[i].name);
        if (l < 12 || strcmp(m.files[i].name + l - 12, ".safetensors")) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", step_dir, m.files[i].name);
        dt_st_file *f;
        st = dt_st_open(ctx, p, &f);
        if (st == DT_OK && !strcmp(m.files[i].name, MODEL_FILE)) st = check_model_complete(ctx, p, f, &tj);
        if (st == DT_OK) dt_st_close(f);
    }
    if (st == DT_OK && out) *out = m;
    else dt_manifest_free(&m);
    return st;
}

/* The step `latest` names (-1: no pointer, or a malformed one). */
long dt_ckpt_latest_step(const char *root) {
    char p[4400], line[64] = "";
    snprintf(p, sizeof p, "%s/latest", root);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    line[strcspn(line, "\r\n")] = 0;
    long step;
    return parse_step_name(line, &step) ? step : -1;
}

dt_status dt_ckpt_find_quiet(dt_ctx *ctx, const char *root, int quiet, char *out, size_t out_size) {
    char man[4400];
    struct stat sb;
    snprintf(man, sizeof man, "%s/" DT_MANIFEST_NAME, root);
    if (stat(man, &sb) == 0) { /* a step directory itself */
        DT_CHECK(dt_ckpt_verify(ctx, root, NULL));
        snprintf(out, out_size, "%s", root);
        return DT_OK;
    }
    if (stat(root, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_fail(ctx, DT_ERR_IO, "%s: no checkpoint (not a directory)", root);
    /* `latest` wins: steps above it belong to a run that was rolled back (resumed from an
     * older step: its lineage moved `latest`) or to a save whose commit did not finish. */
    long latest = dt_ckpt_latest_step(root);
    long *steps;
    int n = dt_ckpt_list_steps(root, &steps);
    for (int i = 0; i < n; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s/step-%08ld", root, steps[i]);
        if (latest >= 0 && steps[i] > latest) {
            if (!quiet)
                dt_log_note(ctx, "ignoring %s: newer than latest (step-%08ld), from a rolled-back run or an "
                            "unfinished save", d, latest);
            continue;
        }
        if (dt_ckpt_verify(ctx, d, NULL) == DT_OK) {
            snprintf(out, out_size, "%s", d);
            free(steps);
            return DT_OK;
        }
        if (!quiet) dt_log_warn(ctx, "skipping checkpoint %s: %s; trying the previous one", d, ctx->err);
    }
    free(steps);
    return dt_fail(ctx, DT_ERR_IO, "%s: no checkpoint (%s)", root,
                   n ? "every step directory is incomplete or damaged" : "no step-* directory");
}

dt_status dt_ckpt_find(dt_ctx *ctx, const char *root, char *out, size_t out_size) {
    return dt_ckpt_find_quiet(ctx, root, 0, out, out_size);
}

dt_status dt_ckpt_load_params(dt_ctx *ctx, const char *step_dir, const dt_model *model, float *full) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" MODEL_FILE, step_dir);
    dt_model view = *model;
    view.ps.params = full;
    dt_fill(full, 0, model->ps.n_params * sizeof(float));
    return dt_model_file_load(ctx, &view, path);
}

/* Parses "g:l:n,g:l:n,..." with every piece inside [0, n_params) and [0, shard). */
static dt_status parse_pieces(dt_ctx *ctx, const char *path, const char *s, size_t n_params, size_t shard,
                              dt_shard_piece **out, int *count) {
    *out = NULL;
    *count = 0;
    int cap = 0;
    while (s && *s) {
        unsigned long long g, l, n;
        int used = 0;
        if (sscanf(s, "%llu:%llu:%llu%n", &g, &l, &n, &used) != 3 || used == 0 || g > n_params || n > n_params - g ||
            l > shard || n > shard - l) {
            free(*out);
            *out = NULL;
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata 'pieces' is malformed or out of range", path);
        }
        if (*count == cap) {
            cap = cap ? cap * 2 : 64;
            dt_shard_piece *v = realloc(*out, (size_t)cap * sizeof *v);
            if (!v) {
                free(*out);
                *out = NULL;
                return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
            }
            *out = v;
        }
        (*out)[(*count)++] = (dt_shard_piece){g, l, n};
        s += used;
        if (*s == ',') s++;
        else if (*s) {
            free(*out);
            *out = NULL;
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata 'pieces' is malformed", path);
        }
    }
    return DT_OK;
}

dt_status dt_ckpt_load_moments(dt_ctx *ctx, const char *step_dir, size_t n_params,
                               const dt_shard_piece *mine, int nmine, float *mom, float *var) {
    dt_manifest m;
    DT_CHECK(dt_manifest_read(ctx, step_dir, &m));
    size_t *covered = calloc((size_t)(nmine ? nmine : 1), sizeof *covered);
    if (!covered) {
        dt_manifest_free(&m);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    }
    dt_status st = DT_OK;
    for (int i = 0; i < m.nfiles && st == DT_OK; i++) {
        if (strncmp(m.files[i].name, "optim-", 6) != 0) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", step_dir, m.files[i].name);
        dt_st_file *f;
        if ((st = dt_st_open(ctx, path, &f)) != DT_OK) break;
        const dt_st_tensor *a = dt_st_find(f, "exp_avg"), *b = dt_st_find(f, "exp_avg_sq");
        const char *fmt = dt_st_meta(f, "format"), *np = dt_st_meta(f, "n_params");
        dt_shard_piece *pc = NULL;
        int npc = 0;
        if (!fmt || strcmp(fmt, "dtrain-optim"))
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: not a dtrain optimizer file (metadata format)", path);
        else if (!np || strtoull(np, NULL, 10) != n_params)
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: written for %s parameters, the model has %zu", path,
                         np ? np : "an unknown number of", n_params);
        else if (!a || !b || a->dtype != DT_ST_F32 || b->dtype != DT_ST_F32 || a->ndim != 1 || b->ndim != 1 ||
                 a->shape[0] != b->shape[0])
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensors exp_avg / exp_avg_sq missing or malformed", path);
        else
            st = parse_pieces(ctx, path, dt_st_meta(f, "pieces"), n_params, (size_t)a->shape[0], &pc, &npc);
        for (int q = 0; q < npc && st == DT_OK; q++)
            for (int k = 0; k < nmine; k++) {
                size_t lo = pc[q].global > mine[k].global ? pc[q].global : mine[k].global;
                size_t hi1 = pc[q].global + pc[q].n, hi2 = mine[k].global + mine[k].n;
                size_t hi = hi1 < hi2 ? hi1 : hi2;
                if (lo >= hi) continue;
                size_t src = pc[q].local + (lo - pc[q].global), dst = mine[k].local + (lo - mine[k].global);
                dt_copy(mom + dst, (const float *)a->data + src, (hi - lo) * sizeof(float));
                dt_copy(var + dst, (const float *)b->data + src, (hi - lo) * sizeof(float));
                covered[k] += hi - lo;
            }
        free(pc);
        dt_st_close(f);
    }
    for (int k = 0; k < nmine && st == DT_OK; k++)
        if (covered[k] != mine[k].n)
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: the optimizer files cover %zu of the %zu values of parameters [%zu, %zu) (%s)", step_dir,
                         covered[k], mine[k].n, mine[k].global, mine[k].global + mine[k].n,
                         covered[k] < mine[k].n ? "missing shard" : "overlapping shards");
    free(covered);
    dt_manifest_free(&m);
    return st;
}

dt_status dt_ckpt_load_residual(dt_ctx *ctx, const char *step_dir, int rank, int world, float *res, size_t n,
                                float *age, size_t age_n, int *found) {
    *found = 0;
    dt_manifest m;
    DT_CHECK(dt_manifest_read(ctx, step_dir, &m));
    char name[96];
    snprintf(name, sizeof name, "optim-rank%d-of-%d.safetensors", rank, world);
    int listed = m.world == world && dt_manifest_find(&m, name) != NULL;
    dt_manifest_free(&m);
    if (!listed) return DT_OK;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", step_dir, name);
    dt_st_file *f;
    DT_CHECK(dt_st_open(ctx, path, &f));
    const dt_st_tensor *t = dt_st_find(f, "compression_residual");
    const dt_st_tensor *a = t && age_n ? dt_st_find(f, "compression_age") : NULL;
    dt_status st = DT_OK;
    if (t && (t->dtype != DT_ST_F32 || t->ndim != 1 || (size_t)t->shape[0] != n))
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor compression_residual is malformed (expected %zu fp32 values)",
                     path, n);
    else if (a && (a->dtype != DT_ST_F32 || a->ndim != 1 || (size_t)a->shape[0] != age_n))
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor compression_age is malformed (expected %zu fp32 values)", path,
                     age_n);
    else if (t) {
        dt_copy(res, t->data, n * sizeof(float));
        if (a) dt_copy(age, a->data, age_n * sizeof(float));
        *found = 1;
    }
    dt_st_close(f);
    return st;
}
