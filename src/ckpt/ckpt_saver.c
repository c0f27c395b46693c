/* The checkpoint saver: staging buffers, the background write, the cross-rank commit
 * (manifest last), pruning (checkpoint.h). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_impl.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/model_file.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/trace.h"
#include "ops/ops.h"

struct dt_ckpt_saver {
    dt_ckpt_saver_cfg cfg;
    char *dir, *tokenizer, *config_yaml, *strategy;
    dt_shard_piece *pieces;       /* save pieces, local = offset in the rank's moments */
    size_t save_n;                /* floats written: the pieces' total */
    int owner;                    /* writes an optimizer file */
    dt_model view;                 /* the model's shape, reading the staged parameters */
    float *st_params, *st_mom, *st_var;
    float *st_res;                /* Top-K's residual (cfg.residual_n floats) */
    float *st_age;                /* Top-K's element ages (cfg.age_n floats) */
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
    double stage_s, wait_s, commit_s, write_s, bytes;
    int committed, failed, consecutive;
};

/* ---- saving */

/* The staging copy is the backend's (ops.h dt_copy: the CPU backend copies large blocks on
 * its threads, which is what the training loop pays for an asynchronous save). */
static void par_copy(float *dst, const float *src, size_t n) { dt_copy(dst, src, n * sizeof(float)); }

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
    s->owner = s->save_n > 0 || cfg->residual_n > 0; /* a residual is this rank's alone */
    s->view = *cfg->model;
    s->jctx = *ctx;
    if (cfg->rank == 0) s->st_params = staging_alloc(s->view.ps.n_params);
    if (s->owner) {
        s->st_mom = staging_alloc(s->save_n);
        s->st_var = staging_alloc(s->save_n);
    }
    if (cfg->residual_n) s->st_res = staging_alloc(cfg->residual_n);
    if (cfg->residual_n && cfg->age_n) s->st_age = staging_alloc(cfg->age_n);
    if ((cfg->rank == 0 && !s->st_params) || (s->owner && (!s->st_mom || !s->st_var)) ||
        (cfg->residual_n && !s->st_res) || (cfg->residual_n && cfg->age_n && !s->st_age)) {
        size_t mib = ((cfg->rank == 0 ? s->view.ps.n_params : 0) + 2 * s->save_n + cfg->residual_n + cfg->age_n) *
                         sizeof(float) >> 20;
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
    free(s->st_res);
    free(s->st_age);
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
    snprintf(v[3], 32, "%zu", s->view.ps.n_params);
    snprintf(v[4], 32, "%zu", s->save_n);
    const char *meta[] = {"format", "dtrain-optim", "optimizer", "adamw", "step", v[0], "rank", v[1],
                          "world", v[2], "n_params", v[3], "shard", v[4], "strategy", s->strategy,
                          "pieces", pieces, NULL};
    dt_st_entry e[4] = {{"exp_avg", DT_ST_F32, 1, {(int64_t)s->save_n}, s->st_mom},
                        {"exp_avg_sq", DT_ST_F32, 1, {(int64_t)s->save_n}, s->st_var},
                        {"compression_residual", DT_ST_F32, 1, {(int64_t)s->cfg.residual_n}, s->st_res},
                        {"compression_age", DT_ST_F32, 1, {(int64_t)s->cfg.age_n}, s->st_age}};
    int ne = !s->cfg.residual_n ? 2 : s->st_age ? 4 : 3;
    dt_status st = dt_st_write_info(ctx, path, e, ne, meta, &s->optim_info);
    free(pieces);
    return st;
}

/* The write job: this rank's files of the staged step. */
static dt_status write_files(dt_ctx *ctx, dt_ckpt_saver *s) {
    DT_CHECK(dt_io_mkdirs(ctx, s->step_dir));
    if (s->cfg.rank == 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/" MODEL_FILE, s->step_dir);
        s->view.ps.params = s->st_params;
        DT_CHECK(dt_model_file_save_info(ctx, &s->view, path, s->tokenizer, s->tj.step, &s->model_info));
        size_t len;
        char *js = dt_ckpt_trainer_json(&s->tj, s->config_yaml, &len);
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
        par_copy(s->st_params, full, s->view.ps.n_params);
    }
    if (s->owner) {
        size_t off = 0;
        for (int i = 0; i < s->cfg.npieces; i++) {
            par_copy(s->st_mom + off, mom + s->pieces[i].local, s->pieces[i].n);
            par_copy(s->st_var + off, var + s->pieces[i].local, s->pieces[i].n);
            off += s->pieces[i].n;
        }
        if (s->cfg.residual_n) par_copy(s->st_res, s->cfg.residual, s->cfg.residual_n);
        if (s->st_age) par_copy(s->st_age, s->cfg.age, s->cfg.age_n);
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

/* Keeps the newest keep_last committed checkpoints; removes older ones and incomplete
 * directories (debris of crashed saves) other than the current step's. */
static void prune(dt_ckpt_saver *s, long current) {
    long *steps;
    int n = dt_ckpt_list_steps(s->dir, &steps), kept = 0;
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
    double t_commit = dt_now(); /* from here on: the exchange and (rank 0) the manifest */
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
    s->commit_s += dt_now() - t_commit;
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

void dt_ckpt_saver_stats(const dt_ckpt_saver *s, double *stage_s, double *wait_s, double *commit_s, int *committed,
                         int *failed, double *write_s, double *bytes) {
    *stage_s = s->stage_s;
    *wait_s = s->wait_s;
    *commit_s = s->commit_s;
    *committed = s->committed;
    *failed = s->failed;
    *write_s = s->write_s;
    *bytes = s->bytes;
}
