/* Checkpoint save (staging, background write, cross-rank commit) and load (find the newest
 * intact step, read it back with resharding). */
#include "ckpt/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_io.h"
#include "ckpt/model_file.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"

#define TRAINER_JSON "trainer.json"
#define MODEL_FILE "model.safetensors"

struct dt_ckpt_saver {
    dt_ckpt_saver_cfg cfg;
    char *dir, *tokenizer, *config_yaml, *strategy;
    dt_shard_piece *pieces;       /* save pieces, local = offset in the rank's moments */
    size_t save_n;                /* floats written: the pieces' total */
    int owner;                    /* writes an optimizer file */
    dt_gpt2 view;                 /* the model's shape, reading the staged parameters */
    float *st_params, *st_mom, *st_var;
    dt_ckpt_trainer tj;
    char step_dir[4200];
    /* the write job */
    pthread_t th;
    int th_live, pending;
    int th_live_hint;             /* the job runs on its own thread (trace thread id 2) */
    pthread_mutex_t mu;
    int done;
    dt_ctx jctx;                  /* the job's messages */
    dt_status jst;
    dt_io_info model_info, trainer_info, optim_info;
    double job_s;
    /* stats */
    double stage_s, wait_s, write_s, bytes;
    int committed, failed, consecutive;
};

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

static char *trainer_json(const dt_ckpt_trainer *t, const char *config_yaml, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fprintf(f, "{\n  \"format\": \"dtrain-trainer\",\n  \"version\": 1,\n  \"dtrain_version\": \"%s\",\n",
            DT_VERSION);
    fprintf(f, "  \"step\": %ld,\n  \"tokens_seen\": %.17g,\n  \"seed\": \"%" PRIu64 "\",\n", t->step,
            t->tokens_seen, t->seed);
    fprintf(f, "  \"rng\": {\"kind\": \"counter\", \"seed\": \"%" PRIu64 "\", \"counter\": %ld},\n", t->seed, t->step);
    fprintf(f, "  \"world\": %d,\n  \"strategy\": \"%s\",\n  \"hybrid\": %d,\n", t->world, t->strategy, t->hybrid);
    fprintf(f, "  \"micro_batch\": %d,\n  \"grad_accum\": %d,\n  \"seq_len\": %d,\n", t->micro_batch, t->accum,
            t->seq_len);
    fprintf(f, "  \"loss\": %.9g,\n  \"train_seconds\": %.6f,\n", t->loss, t->train_seconds);
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
    double step, tok, world, mb, acc, T, hyb, loss = 0, secs = 0, v;
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
    if (bad) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' missing or invalid", path, bad);
    } else {
        j_num(r, "loss", -1e30, 1e30, &loss);
        j_num(r, "train_seconds", 0, 1e15, &secs);
        out->step = (long)step;
        out->tokens_seen = tok;
        out->world = (int)world;
        out->micro_batch = (int)mb;
        out->accum = (int)acc;
        out->seq_len = (int)T;
        out->hybrid = (int)hyb;
        out->loss = loss;
        out->train_seconds = secs;
        snprintf(out->strategy, sizeof out->strategy, "%s", strat->valuestring);
    }
    cJSON_Delete(r);
    return st;
}

/* ---- saving */

/* A forked child (the crash tests) must not enter OpenMP: the parent's thread pool does not
 * exist there and libgomp would wait for it forever. */
static int in_forked_child;
static void mark_child(void) { in_forked_child = 1; }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(NULL, NULL, mark_child); }

/* memcpy on the OpenMP threads, in 1 MiB blocks: the staging copy is what the training
 * loop pays for an asynchronous save. */
static void par_copy(float *dst, const float *src, size_t n) {
    const size_t blk = 1u << 18; /* floats */
    long nb = (long)((n + blk - 1) / blk);
    if (in_forked_child) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
#pragma omp parallel for schedule(static)
    for (long b = 0; b < nb; b++) {
        size_t lo = (size_t)b * blk, len = n - lo < blk ? n - lo : blk;
        memcpy(dst + lo, src + lo, len * sizeof(float));
    }
}

/* Allocates a staging buffer and touches every page, so the first save does not pay the
 * page faults inside the training loop. */
static float *staging_alloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (p) memset(p, 0, n * sizeof(float));
    return p;
}

static char *dup_str(const char *s) { return strdup(s ? s : ""); }

dt_status dt_ckpt_saver_init(dt_ctx *ctx, dt_ckpt_saver **out, const dt_ckpt_saver_cfg *cfg) {
    dt_ckpt_saver *s = calloc(1, sizeof *s);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    s->cfg = *cfg;
    s->dir = dup_str(cfg->dir);
    s->tokenizer = dup_str(cfg->tokenizer);
    s->config_yaml = dup_str(cfg->config_yaml);
    s->strategy = dup_str(cfg->strategy);
    s->pieces = malloc((size_t)(cfg->npieces ? cfg->npieces : 1) * sizeof *s->pieces);
    pthread_mutex_init(&s->mu, NULL);
    if (!s->dir || !s->tokenizer || !s->config_yaml || !s->strategy || !s->pieces) {
        dt_ckpt_saver_free(s);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    }
    memcpy(s->pieces, cfg->pieces, (size_t)cfg->npieces * sizeof *s->pieces);
    for (int i = 0; i < cfg->npieces; i++) {
        if (cfg->pieces[i].local + cfg->pieces[i].n > cfg->shard) {
            dt_ckpt_saver_free(s);
            return dt_fail(ctx, DT_ERR_INTERNAL, "checkpoint: save piece %d outside the moments", i);
        }
        s->save_n += cfg->pieces[i].n;
    }
    s->owner = s->save_n > 0;
    s->view = *cfg->model;
    s->jctx = *ctx;
    pthread_once(&atfork_once, register_atfork);
    if (cfg->rank == 0) s->st_params = staging_alloc(s->view.n_params);
    if (s->owner) {
        s->st_mom = staging_alloc(s->save_n);
        s->st_var = staging_alloc(s->save_n);
    }
    if ((cfg->rank == 0 && !s->st_params) || (s->owner && (!s->st_mom || !s->st_var))) {
        size_t mib = ((cfg->rank == 0 ? s->view.n_params : 0) + 2 * s->save_n) * sizeof(float) >> 20;
        dt_ckpt_saver_free(s);
        return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory for the staging buffers (%zu MiB)", mib);
    }
    dt_status st = dt_io_mkdirs(ctx, s->dir);
    if (st != DT_OK) {
        dt_ckpt_saver_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

static void join_job(dt_ckpt_saver *s) {
    if (s->th_live) pthread_join(s->th, NULL);
    s->th_live = 0;
}

void dt_ckpt_saver_free(dt_ckpt_saver *s) {
    if (!s) return;
    join_job(s);
    pthread_mutex_destroy(&s->mu);
    free(s->st_params);
    free(s->st_mom);
    free(s->st_var);
    free(s->pieces);
    free(s->dir);
    free(s->tokenizer);
    free(s->config_yaml);
    free(s->strategy);
    free(s);
}

static dt_status write_optim(dt_ctx *ctx, dt_ckpt_saver *s) {
    char path[4400], name[96];
    snprintf(name, sizeof name, "optim-rank%d-of-%d.safetensors", s->cfg.rank, s->cfg.world);
    snprintf(path, sizeof path, "%s/%s", s->step_dir, name);
    /* "global:local:count,..." for each piece */
    size_t cap = 64 + (size_t)s->cfg.npieces * 64, len = 0;
    char *pieces = malloc(cap);
    if (!pieces) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    pieces[0] = 0;
    for (int i = 0, off = 0; i < s->cfg.npieces; i++) { /* staged back to back */
        len += (size_t)snprintf(pieces + len, cap - len, "%s%zu:%d:%zu", i ? "," : "", s->pieces[i].global,
                                off, s->pieces[i].n);
        off += (int)s->pieces[i].n;
    }
    char v[5][32];
    snprintf(v[0], 32, "%ld", s->tj.step);
    snprintf(v[1], 32, "%d", s->cfg.rank);
    snprintf(v[2], 32, "%d", s->cfg.world);
    snprintf(v[3], 32, "%zu", s->view.n_params);
    snprintf(v[4], 32, "%zu", s->save_n);
    const char *meta[] = {"format", "dtrain-optim", "optimizer", "adamw", "step", v[0], "rank", v[1],
                          "world", v[2], "n_params", v[3], "shard", v[4], "strategy", s->strategy,
                          "pieces", pieces, NULL};
    dt_st_entry e[2] = {{"exp_avg", DT_ST_F32, 1, {(int64_t)s->save_n}, s->st_mom},
                        {"exp_avg_sq", DT_ST_F32, 1, {(int64_t)s->save_n}, s->st_var}};
    dt_status st = dt_st_write_info(ctx, path, e, 2, meta, &s->optim_info);
    free(pieces);
    return st;
}

/* The write job: this rank's files of the staged step. */
static dt_status write_files(dt_ctx *ctx, dt_ckpt_saver *s) {
    DT_CHECK(dt_io_mkdirs(ctx, s->step_dir));
    if (s->cfg.rank == 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/" MODEL_FILE, s->step_dir);
        s->view.params = s->st_params;
        DT_CHECK(dt_model_file_save_info(ctx, &s->view, path, s->tokenizer, s->tj.step, &s->model_info));
        size_t len;
        char *js = trainer_json(&s->tj, s->config_yaml, &len);
        if (!js) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", TRAINER_JSON);
        snprintf(path, sizeof path, "%s/" TRAINER_JSON, s->step_dir);
        dt_status st = dt_io_write_file(ctx, path, js, len, &s->trainer_info);
        free(js);
        DT_CHECK(st);
    }
    if (s->owner) DT_CHECK(write_optim(ctx, s));
    return DT_OK;
}

static void *job_main(void *arg) {
    dt_ckpt_saver *s = arg;
    double t0 = dt_now(), tt;
    if (s->th_live_hint) dt_trace_set_thread(2);
    tt = dt_trace_begin();
    dt_status st = write_files(&s->jctx, s);
    dt_trace_end(tt, "ckpt", "checkpoint write step %ld", s->tj.step);
    pthread_mutex_lock(&s->mu);
    s->jst = st;
    s->job_s = dt_now() - t0;
    s->done = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}


dt_status dt_ckpt_saver_stage(dt_ctx *ctx, dt_ckpt_saver *s, const float *full, const float *mom,
                              const float *var, const dt_ckpt_trainer *tj) {
    if (s->pending) return dt_fail(ctx, DT_ERR_INTERNAL, "checkpoint: previous save not committed");
    double t0 = dt_now();
    s->tj = *tj;
    snprintf(s->step_dir, sizeof s->step_dir, "%s/step-%08ld", s->dir, tj->step);
    if (s->cfg.rank == 0) {
        /* A directory of this step left by an earlier incarnation loses its manifest first:
         * while it is rewritten it must not look complete. */
        char man[4400];
        snprintf(man, sizeof man, "%s/" DT_MANIFEST_NAME, s->step_dir);
        if (unlink(man) == 0) dt_io_fsync_dir(ctx, s->step_dir);
        par_copy(s->st_params, full, s->view.n_params);
    }
    if (s->owner) {
        size_t off = 0;
        for (int i = 0; i < s->cfg.npieces; i++) {
            par_copy(s->st_mom + off, mom + s->pieces[i].local, s->pieces[i].n);
            par_copy(s->st_var + off, var + s->pieces[i].local, s->pieces[i].n);
            off += s->pieces[i].n;
        }
    }
    s->stage_s += dt_now() - t0;
    s->done = 0;
    s->jst = DT_OK;
    s->pending = 1;
    memset(&s->model_info, 0, sizeof s->model_info);
    memset(&s->optim_info, 0, sizeof s->optim_info);
    memset(&s->trainer_info, 0, sizeof s->trainer_info);
    s->jctx = *ctx;
    s->th_live_hint = s->cfg.async;
    if (s->cfg.async && pthread_create(&s->th, NULL, job_main, s) == 0) {
        s->th_live = 1;
        return DT_OK;
    }
    s->th_live_hint = 0;
    job_main(s); /* synchronous (or no thread could be started) */
    return DT_OK;
}

int dt_ckpt_saver_pending(const dt_ckpt_saver *s) { return s->pending; }

int dt_ckpt_saver_done(dt_ckpt_saver *s) {
    pthread_mutex_lock(&s->mu);
    int d = s->done;
    pthread_mutex_unlock(&s->mu);
    return d;
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
static int list_steps(const char *root, long **out) {
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

/* Keeps the newest keep_last committed checkpoints; removes older ones and incomplete
 * directories (debris of crashed saves) other than the current step's. */
static void prune(dt_ckpt_saver *s, long current) {
    long *steps;
    int n = list_steps(s->dir, &steps), kept = 0;
    for (int i = 0; i < n; i++) {
        char d[4200], man[4400];
        snprintf(d, sizeof d, "%s/step-%08ld", s->dir, steps[i]);
        snprintf(man, sizeof man, "%s/" DT_MANIFEST_NAME, d);
        struct stat sb;
        int complete = stat(man, &sb) == 0;
        if (steps[i] == current) {
            kept++;
            continue;
        }
        if (complete && steps[i] > current) continue; /* a newer run's: not ours to judge */
        if (complete && (s->cfg.keep_last <= 0 || kept < s->cfg.keep_last)) {
            kept++;
            continue;
        }
        if (!complete && steps[i] > current) continue;
        unlink(man); /* invisible first, then removed */
        dt_io_remove_dir(d);
    }
    free(steps);
}

/* Rank 0: manifest of the staged step from every rank's results; then `latest`. */
static dt_status commit_dir(dt_ctx *ctx, dt_ckpt_saver *s, const int64_t *recs) {
    int W = s->cfg.world, n = 2;
    dt_manifest m = {s->tj.step, W, "", 0, NULL};
    snprintf(m.strategy, sizeof m.strategy, "%s", s->strategy);
    m.files = calloc((size_t)W + 2, sizeof *m.files);
    if (!m.files) return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    snprintf(m.files[0].name, DT_MANIFEST_NAME_MAX, MODEL_FILE);
    m.files[0].size = s->model_info.size;
    m.files[0].xxh3 = s->model_info.xxh3;
    snprintf(m.files[1].name, DT_MANIFEST_NAME_MAX, TRAINER_JSON);
    m.files[1].size = s->trainer_info.size;
    m.files[1].xxh3 = s->trainer_info.xxh3;
    for (int r = 0; r < W; r++) {
        if (!recs[4 * r + 1]) continue;
        snprintf(m.files[n].name, DT_MANIFEST_NAME_MAX, "optim-rank%d-of-%d.safetensors", r, W);
        m.files[n].size = (uint64_t)recs[4 * r + 2];
        m.files[n].xxh3 = (uint64_t)recs[4 * r + 3];
        n++;
    }
    m.nfiles = n;
    /* Files of an earlier incarnation that this save did not write are removed: the
     * directory holds exactly what the manifest lists. */
    DIR *d = opendir(s->step_dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.' || dt_manifest_find(&m, e->d_name)) continue;
            char p[4608];
            snprintf(p, sizeof p, "%s/%s", s->step_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    dt_status st = dt_io_fsync_dir(ctx, s->step_dir);
    if (st == DT_OK) st = dt_manifest_write(ctx, s->step_dir, &m);
    free(m.files);
    DT_CHECK(st);
    DT_CHECK(dt_io_fsync_dir(ctx, s->dir)); /* the step directory's own entry */
    char latest[4400], line[64];
    snprintf(latest, sizeof latest, "%s/latest", s->dir);
    int len = snprintf(line, sizeof line, "step-%08ld\n", s->tj.step);
    DT_CHECK(dt_io_write_file(ctx, latest, line, (size_t)len, NULL));
    DT_CHECK(dt_io_fsync_dir(ctx, s->dir));
    prune(s, s->tj.step);
    return DT_OK;
}

dt_status dt_ckpt_saver_commit(dt_ctx *ctx, dt_ckpt_saver *s, dt_comm *comm, int *committed) {
    if (committed) *committed = 0;
    if (!s->pending) return DT_OK;
    double t0 = dt_now();
    join_job(s);
    double waited = dt_now() - t0;
    s->wait_s += waited;
    if (waited > 0.01 && s->cfg.async)
        dt_log_info(ctx, "checkpoint: waited %.2f s for the write of step %ld to finish", waited, s->tj.step);
    s->pending = 0;
    int W = s->cfg.world;
    int64_t *recs = calloc((size_t)W * 4 + 1, sizeof *recs);
    if (!recs) return dt_fail(ctx, DT_ERR_NOMEM, "checkpoint: out of memory");
    int r = s->cfg.rank;
    recs[4 * r] = s->jst == DT_OK ? 1 : -1;
    recs[4 * r + 1] = s->owner;
    recs[4 * r + 2] = (int64_t)s->optim_info.size;
    recs[4 * r + 3] = (int64_t)s->optim_info.xxh3;
    if (s->jst != DT_OK)
        dt_log_error(ctx, "checkpoint step %ld: %s", s->tj.step, s->jctx.err);
    dt_status st = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, recs, (size_t)W * 4, DT_I64, DT_SUM);
    if (st != DT_OK) {
        free(recs);
        return st;
    }
    int bad = 0;
    char who[256] = "";
    for (int i = 0; i < W; i++)
        if (recs[4 * i] != 1) {
            size_t l = strlen(who);
            if (l < sizeof who - 16) snprintf(who + l, sizeof who - l, "%s%d", bad ? "," : "", i);
            bad++;
        }
    int64_t ok = 0;
    if (r == 0) {
        if (!bad) {
            st = commit_dir(ctx, s, recs);
            if (st == DT_OK) ok = 1;
            else dt_log_error(ctx, "checkpoint step %ld: %s", s->tj.step, ctx->err);
        }
        if (!ok) {
            char man[4400];
            snprintf(man, sizeof man, "%s/" DT_MANIFEST_NAME, s->step_dir);
            unlink(man);
            dt_io_remove_dir(s->step_dir);
        }
    }
    free(recs);
    /* Every rank learns the outcome (the same failure count everywhere). */
    DT_CHECK(dt_comm_broadcast(ctx, comm, DT_GROUP_WORLD, &ok, sizeof ok, 0));
    double bytes = (double)(s->model_info.size + s->trainer_info.size + s->optim_info.size);
    if (ok) {
        s->committed++;
        s->consecutive = 0;
        s->write_s += s->job_s;
        s->bytes += bytes;
        if (committed) *committed = 1;
        return DT_OK;
    }
    s->failed++;
    s->consecutive++;
    if (r == 0)
        dt_log_warn(ctx, "checkpoint step %ld was NOT saved (%s%s); the previous checkpoint stays the newest, "
                    "training goes on (%d consecutive failure%s of %d allowed)",
                    s->tj.step, bad ? "failed on rank " : "commit failed", who, s->consecutive,
                    s->consecutive == 1 ? "" : "s", s->cfg.max_failures);
    if (s->consecutive >= s->cfg.max_failures)
        return dt_fail(ctx, DT_ERR_IO, "checkpoint: %d consecutive saves failed (last: step %ld); stopping",
                       s->consecutive, s->tj.step);
    return DT_OK;
}

void dt_ckpt_saver_stats(const dt_ckpt_saver *s, double *stage_s, double *wait_s, int *committed,
                         int *failed, double *write_s, double *bytes) {
    *stage_s = s->stage_s;
    *wait_s = s->wait_s;
    *committed = s->committed;
    *failed = s->failed;
    *write_s = s->write_s;
    *bytes = s->bytes;
}

/* ---- reading */

dt_status dt_ckpt_verify(dt_ctx *ctx, const char *step_dir, dt_manifest *out) {
    dt_manifest m;
    DT_CHECK(dt_manifest_read(ctx, step_dir, &m));
    dt_status st = dt_manifest_verify_files(ctx, step_dir, &m);
    if (st == DT_OK && (!dt_manifest_find(&m, MODEL_FILE) || !dt_manifest_find(&m, TRAINER_JSON)))
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s/" DT_MANIFEST_NAME ": does not list " MODEL_FILE " and " TRAINER_JSON,
                     step_dir);
    if (st == DT_OK) {
        dt_ckpt_trainer tj;
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
        if (st == DT_OK) dt_st_close(f);
    }
    if (st == DT_OK && out) *out = m;
    else dt_manifest_free(&m);
    return st;
}

dt_status dt_ckpt_find(dt_ctx *ctx, const char *root, char *out, size_t out_size) {
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
    long *steps;
    int n = list_steps(root, &steps);
    for (int i = 0; i < n; i++) {
        char d[4200];
        snprintf(d, sizeof d, "%s/step-%08ld", root, steps[i]);
        if (dt_ckpt_verify(ctx, d, NULL) == DT_OK) {
            snprintf(out, out_size, "%s", d);
            free(steps);
            return DT_OK;
        }
        dt_log_warn(ctx, "skipping checkpoint %s: %s; trying the previous one", d, ctx->err);
    }
    free(steps);
    return dt_fail(ctx, DT_ERR_IO, "%s: no checkpoint (%s)", root,
                   n ? "every step directory is incomplete or damaged" : "no step-* directory");
}

dt_status dt_ckpt_load_params(dt_ctx *ctx, const char *step_dir, const dt_gpt2 *model, float *full) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" MODEL_FILE, step_dir);
    dt_gpt2 view = *model;
    view.params = full;
    memset(full, 0, model->n_params * sizeof(float));
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
                memcpy(mom + dst, (const float *)a->data + src, (hi - lo) * sizeof(float));
                memcpy(var + dst, (const float *)b->data + src, (hi - lo) * sizeof(float));
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
