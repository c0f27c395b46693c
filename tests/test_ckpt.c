/* Checkpoints: a save/load round trip is bitwise; a crash at every I/O point of a save
 * (SIGKILL in a forked child) leaves either the previous or the new checkpoint loadable,
 * never a broken one; ENOSPC/EIO at every point leaves the previous one newest and training
 * able to go on; every random bit flip in every file type is detected and the previous
 * checkpoint is used; truncated, missing and unlisted files are reported naming the file;
 * optimizer shards written by one world size load into another (resharding), refusing
 * missing or overlapping shards; the manifest parser refuses malformed manifests; the lock on
 * a checkpoint directory is refused while another process holds it (naming it), accepted by
 * the holder's token (the supervisor's), taken over after its holder is killed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/lock.h"
#include "ckpt/safetensors.h"
#include "train/trainer.h"
#include "testutil.h"

static char dir[64];

static int setup(void **state) {
    (void)state;
    return tu_mkdtemp(dir, sizeof dir, "test_ckpt");
}
static int teardown(void **state) {
    (void)state;
    unsetenv("DTRAIN_CKPT_FAULT");
    dt_io_fault_reset(0);
    return tu_rmtree(dir);
}

typedef struct fixture {
    dt_trainer tr;
    dt_ckpt_saver *sv;
    dt_shard_piece pieces[64];
    char root[128];
} fixture;

static void fx_init(fixture *f, dt_ctx *ctx, const char *sub, int async, int max_failures) {
    dt_train_cfg c;
    dt_train_cfg_defaults(&c);
    c.steps = 100;
    c.sched.total = 100;
    assert_int_equal(dt_trainer_init(ctx, &f->tr, &c, NULL), DT_OK);
    snprintf(f->root, sizeof f->root, "%s/%s", dir, sub);
    size_t shard;
    dt_parallel_shard(f->tr.par, &shard);
    dt_shard_piece save[64];
    int ns = dt_parallel_save_pieces(f->tr.par, save);
    dt_parallel_pieces(f->tr.par, f->pieces);
    dt_ckpt_saver_cfg sc = {f->root, &f->tr.model, "byte", "model:\n  preset: \"gpt2-tiny\"\n", 0, 1,
                            save, ns, shard, "ddp", 0, async, max_failures, NULL, 0, NULL, 0};
    assert_int_equal(dt_ckpt_saver_init(ctx, &f->sv, &sc), DT_OK);
}

static void fx_free(fixture *f) {
    dt_ckpt_saver_free(f->sv);
    dt_trainer_free(&f->tr);
}

static void fx_steps(dt_ctx *ctx, fixture *f, int n) {
    for (int i = 0; i < n; i++) {
        dt_step_stats ss;
        assert_int_equal(dt_trainer_step(ctx, &f->tr, &ss), DT_OK);
    }
}

/* Stages and commits the trainer's current state; returns whether it committed. */
static int fx_save(dt_ctx *ctx, fixture *f) {
    dt_ckpt_trainer tj;
    memset(&tj, 0, sizeof tj);
    tj.step = f->tr.step;
    tj.tokens_seen = 256.0 * (double)f->tr.step;
    tj.seed = f->tr.cfg.seed;
    tj.world = 1;
    tj.micro_batch = f->tr.cfg.micro_batch;
    tj.accum = 1;
    tj.seq_len = f->tr.cfg.seq_len;
    snprintf(tj.strategy, sizeof tj.strategy, "ddp");
    float *mom, *var;
    dt_parallel_moments(f->tr.par, &mom, &var);
    assert_int_equal(dt_ckpt_saver_stage(ctx, f->sv, f->tr.model.ps.params, mom, var, &tj), DT_OK);
    int done = 0;
    assert_int_equal(dt_ckpt_saver_commit(ctx, f->sv, f->tr.comm, &done), DT_OK);
    return done;
}

/* n more steps, then a save that must commit. */
static void fx_step_save(dt_ctx *ctx, fixture *f, int n) {
    fx_steps(ctx, f, n);
    assert_int_equal(fx_save(ctx, f), 1);
}

/* The loaded state of step_dir equals params/mom/var. */
static void expect_state(dt_ctx *ctx, fixture *f, const char *step_dir, const float *params, const float *mom,
                         const float *var) {
    size_t n = f->tr.model.ps.n_params, shard;
    dt_parallel_shard(f->tr.par, &shard);
    float *p = tu_malloc(n * 4), *m = tu_malloc(shard * 4), *v = tu_malloc(shard * 4);
    assert_int_equal(dt_ckpt_load_params(ctx, step_dir, &f->tr.model, p), DT_OK);
    assert_int_equal(dt_ckpt_load_moments(ctx, step_dir, n, f->pieces, f->tr.model.ps.n_units, m, v), DT_OK);
    assert_memory_equal(p, params, n * 4);
    assert_memory_equal(m, mom, shard * 4);
    assert_memory_equal(v, var, shard * 4);
    free(p);
    free(m);
    free(v);
}

static void test_round_trip(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    fixture f;
    fx_init(&f, &ctx, "rt", 1, 3);
    fx_step_save(&ctx, &f, 3);
    char found[4400];
    assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
    assert_non_null(strstr(found, "step-00000003"));
    float *mom, *var;
    dt_parallel_moments(f.tr.par, &mom, &var);
    expect_state(&ctx, &f, found, f.tr.model.ps.params, mom, var);
    dt_ckpt_trainer tj;
    assert_int_equal(dt_ckpt_read_trainer(&ctx, found, &tj), DT_OK);
    assert_int_equal(tj.step, 3);
    assert_int_equal(tj.seed, f.tr.cfg.seed);
    assert_string_equal(tj.strategy, "ddp");
    /* keep_last = 0 keeps all; `latest` names the new step */
    fx_step_save(&ctx, &f, 1);
    char latest[256], line[64] = "";
    snprintf(latest, sizeof latest, "%s/latest", f.root);
    FILE *lf = fopen(latest, "r");
    assert_non_null(lf);
    assert_non_null(fgets(line, sizeof line, lf));
    fclose(lf);
    assert_string_equal(line, "step-00000004\n");
    fx_free(&f);
}

/* Number of I/O points one save + commit passes. */
static long points_of_save(dt_ctx *ctx, fixture *f) {
    long p0 = dt_io_points();
    fx_save(ctx, f);
    return dt_io_points() - p0;
}

static void test_crash_every_point(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    fixture f;
    fx_init(&f, &ctx, "crash", 1, 1000);
    fx_step_save(&ctx, &f, 2); /* step 2: the previous checkpoint */
    size_t n = f.tr.model.ps.n_params, shard;
    dt_parallel_shard(f.tr.par, &shard);
    float *mom, *var;
    dt_parallel_moments(f.tr.par, &mom, &var);
    float *p2 = tu_malloc(n * 4), *m2 = tu_malloc(shard * 4), *v2 = tu_malloc(shard * 4);
    memcpy(p2, f.tr.model.ps.params, n * 4);
    memcpy(m2, mom, shard * 4);
    memcpy(v2, var, shard * 4);
    fx_steps(&ctx, &f, 2); /* state of step 4 */
    char d4[256];
    snprintf(d4, sizeof d4, "%s/step-00000004", f.root);
    long P = points_of_save(&ctx, &f);
    assert_true(P >= 15);
    tu_rmtree(d4);
    int switched_at = -1;
    for (long k = 1; k <= P; k++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char spec[32];
            snprintf(spec, sizeof spec, "crash@%ld", k);
            setenv("DTRAIN_CKPT_FAULT", spec, 1);
            dt_io_fault_reset(0);
            fx_save(&ctx, &f);
            _exit(0); /* not reached: the k-th point kills the process */
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        char found[4400];
        assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
        int is4 = strstr(found, "step-00000004") != NULL;
        if (is4) expect_state(&ctx, &f, found, f.tr.model.ps.params, mom, var);
        else expect_state(&ctx, &f, found, p2, m2, v2);
        /* once the manifest is in place the new checkpoint stays the newest */
        if (is4 && switched_at < 0) switched_at = (int)k;
        if (switched_at >= 0) assert_true(is4);
        tu_rmtree(d4);
    }
    printf("a save passes %ld I/O points; a crash at point %d or later keeps the new checkpoint, earlier ones the "
           "previous\n", P, switched_at);
    /* The manifest's rename is among the last points: most crashes keep step 2. */
    assert_true(switched_at > (int)P / 2);
    assert_true(switched_at <= (int)P);
    free(p2);
    free(m2);
    free(v2);
    fx_free(&f);
}

static void test_enospc_every_point(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    fixture f;
    fx_init(&f, &ctx, "enospc", 1, 1000000);
    fx_step_save(&ctx, &f, 1);
    fx_steps(&ctx, &f, 1);
    long P = points_of_save(&ctx, &f); /* step 2 committed */
    /* What step 2 saved, to find it intact after every failed save of step 3. */
    size_t n = f.tr.model.ps.n_params, shard;
    dt_parallel_shard(f.tr.par, &shard);
    float *mom, *var;
    dt_parallel_moments(f.tr.par, &mom, &var);
    float *p2 = tu_malloc(n * 4), *m2 = tu_malloc(shard * 4), *v2 = tu_malloc(shard * 4);
    memcpy(p2, f.tr.model.ps.params, n * 4);
    memcpy(m2, mom, shard * 4);
    memcpy(v2, var, shard * 4);
    char d2[256], d3[256];
    snprintf(d2, sizeof d2, "%s/step-00000002", f.root);
    snprintf(d3, sizeof d3, "%s/step-00000003", f.root);
    fx_steps(&ctx, &f, 1);
    for (int kind = 0; kind < 2; kind++)
        for (long k = 1; k <= P; k++) {
            char spec[32];
            snprintf(spec, sizeof spec, "%s@%ld", kind ? "eio" : "enospc", k);
            setenv("DTRAIN_CKPT_FAULT", spec, 1);
            dt_io_fault_reset(0);
            int committed = fx_save(&ctx, &f); /* step 3: fails at point k, training goes on */
            /* The fault came (a save that passed fewer than k points proves nothing), and it
             * failed the save: every error, up to the last fsync of `latest`, undoes the step. */
            if (dt_io_fault_fired() != 1) fail_msg("%s: the injected fault did not fire", spec);
            if (committed) fail_msg("%s: the save committed although the injected error fired", spec);
            char found[4400];
            assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
            assert_non_null(strstr(found, "step-00000002"));
            struct stat sb;
            assert_int_not_equal(stat(d3, &sb), 0); /* the failed save left nothing */
            assert_int_equal(stat(d2, &sb), 0);
        }
    printf("%ld I/O points x ENOSPC, EIO: every fault fired and failed its save\n", P);
    /* After 2P failed saves step 2 is the newest, its checksums hold and its tensors are
     * bitwise what was saved. */
    char found[4400];
    assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
    assert_non_null(strstr(found, "step-00000002"));
    expect_state(&ctx, &f, d2, p2, m2, v2);
    unsetenv("DTRAIN_CKPT_FAULT");
    dt_io_fault_reset(0);
    assert_int_equal(fx_save(&ctx, &f), 1);
    assert_int_equal(dt_io_fault_fired(), 0);
    free(p2);
    free(m2);
    free(v2);
    fx_free(&f);
    /* Consecutive failures beyond checkpoint.max_failures stop training with a message. */
    fx_init(&f, &ctx, "enospc2", 0, 2);
    fx_steps(&ctx, &f, 1);
    setenv("DTRAIN_CKPT_FAULT", "enospc@1", 1);
    dt_io_fault_reset(0);
    assert_int_equal(fx_save(&ctx, &f), 0);
    assert_int_equal(dt_io_fault_fired(), 1);
    dt_io_fault_reset(0);
    dt_ckpt_trainer tj;
    memset(&tj, 0, sizeof tj);
    tj.step = 1;
    tj.world = 1;
    snprintf(tj.strategy, sizeof tj.strategy, "ddp");
    dt_parallel_moments(f.tr.par, &mom, &var);
    assert_int_equal(dt_ckpt_saver_stage(&ctx, f.sv, f.tr.model.ps.params, mom, var, &tj), DT_OK);
    assert_int_equal(dt_ckpt_saver_commit(&ctx, f.sv, f.tr.comm, NULL), DT_ERR_IO);
    assert_int_equal(dt_io_fault_fired(), 1);
    assert_non_null(strstr(ctx.err, "consecutive"));
    unsetenv("DTRAIN_CKPT_FAULT");
    dt_io_fault_reset(0);
    fx_free(&f);
}

static int read_file(const char *p, unsigned char **buf, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc(*n);
    size_t r = fread(*buf, 1, *n, f);
    fclose(f);
    return r == *n ? 0 : -1;
}

static void write_file(const char *p, const unsigned char *buf, size_t n) {
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

static void test_bit_flips_and_damage(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    fixture f;
    fx_init(&f, &ctx, "flip", 1, 3);
    fx_step_save(&ctx, &f, 1);
    fx_step_save(&ctx, &f, 1);
    char d2[256];
    snprintf(d2, sizeof d2, "%s/step-00000002", f.root);
    static const char *const files[] = {"model.safetensors", "optim-rank0-of-1.safetensors", "trainer.json",
                                        "MANIFEST.json"};
    uint64_t rng = 12345;
    int flips = 0, detected = 0;
    for (int fi = 0; fi < 4; fi++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", d2, files[fi]);
        unsigned char *orig;
        size_t n;
        assert_int_equal(read_file(p, &orig, &n), 0);
        for (int t = 0; t < 40; t++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t off = (size_t)(rng >> 17) % n;
            int bit = (int)(rng >> 60) & 7;
            orig[off] ^= (unsigned char)(1u << bit);
            write_file(p, orig, n);
            flips++;
            if (dt_ckpt_verify(&ctx, d2, NULL) != DT_OK) {
                detected++;
                char found[4400];
                assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
                assert_non_null(strstr(found, "step-00000001"));
            }
            orig[off] ^= (unsigned char)(1u << bit);
        }
        write_file(p, orig, n);
        free(orig);
        assert_int_equal(dt_ckpt_verify(&ctx, d2, NULL), DT_OK);
    }
    printf("%d of %d random bit flips detected\n", detected, flips);
    assert_int_equal(detected, flips); /* 100% */
    /* truncation, a missing file, a missing manifest: named in the message */
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", d2);
    unsigned char *buf;
    size_t n;
    assert_int_equal(read_file(p, &buf, &n), 0);
    write_file(p, buf, n / 2);
    assert_int_not_equal(dt_ckpt_verify(&ctx, d2, NULL), DT_OK);
    assert_non_null(strstr(ctx.err, "model.safetensors"));
    assert_non_null(strstr(ctx.err, "size"));
    write_file(p, buf, n);
    free(buf);
    snprintf(p, sizeof p, "%s/optim-rank0-of-1.safetensors", d2);
    assert_int_equal(read_file(p, &buf, &n), 0);
    unlink(p);
    assert_int_not_equal(dt_ckpt_verify(&ctx, d2, NULL), DT_OK);
    assert_non_null(strstr(ctx.err, "optim-rank0-of-1.safetensors"));
    write_file(p, buf, n);
    free(buf);
    snprintf(p, sizeof p, "%s/MANIFEST.json", d2);
    assert_int_equal(read_file(p, &buf, &n), 0);
    unlink(p);
    assert_int_not_equal(dt_ckpt_verify(&ctx, d2, NULL), DT_OK);
    assert_non_null(strstr(ctx.err, "MANIFEST.json"));
    char found[4400];
    assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
    assert_non_null(strstr(found, "step-00000001"));
    write_file(p, buf, n);
    free(buf);
    assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
    assert_non_null(strstr(found, "step-00000002"));
    /* nothing intact at all: one clear error */
    char empty[256];
    snprintf(empty, sizeof empty, "%s/none", dir);
    mkdir(empty, 0755);
    assert_int_equal(dt_ckpt_find(&ctx, empty, found, sizeof found), DT_ERR_IO);
    assert_non_null(strstr(ctx.err, "no checkpoint"));
    fx_free(&f);
}

/* Optimizer files of a "world 2" layout (two files, pieces per unit) load into one rank's
 * single piece and into a 3-way split; a missing file or a duplicated piece is refused. */
static void write_optim(dt_ctx *ctx, const char *d, const char *name, const dt_shard_piece *pc, int np,
                        const float *mom, const float *var, size_t shard, size_t n_params, dt_io_info *info) {
    char path[512], pieces[1024] = "", v[2][32];
    size_t len = 0;
    for (int i = 0; i < np; i++)
        len += (size_t)snprintf(pieces + len, sizeof pieces - len, "%s%zu:%zu:%zu", i ? "," : "", pc[i].global,
                                pc[i].local, pc[i].n);
    snprintf(v[0], 32, "%zu", n_params);
    snprintf(v[1], 32, "%zu", shard);
    const char *meta[] = {"format", "dtrain-optim", "n_params", v[0], "shard", v[1], "pieces", pieces, NULL};
    dt_st_entry e[2] = {{"exp_avg", DT_ST_F32, 1, {(int64_t)shard}, mom},
                        {"exp_avg_sq", DT_ST_F32, 1, {(int64_t)shard}, var}};
    snprintf(path, sizeof path, "%s/%s", d, name);
    assert_int_equal(dt_st_write_info(ctx, path, e, 2, meta, info), DT_OK);
}

/* A step whose checksums all match but whose model file lacks a tensor (a writer that wrote
 * too little, then a valid manifest): verify refuses it and dt_ckpt_find falls back to the
 * previous step, as for any damaged checkpoint. */
static void test_missing_tensor_is_damage(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    fixture f;
    fx_init(&f, &ctx, "missing", 0, 3);
    fx_step_save(&ctx, &f, 2);
    fx_step_save(&ctx, &f, 1);
    char d[256], model[320], tmp[340];
    snprintf(d, sizeof d, "%s/step-00000003", f.root);
    snprintf(model, sizeof model, "%s/model.safetensors", d);
    snprintf(tmp, sizeof tmp, "%s.new", model);
    assert_int_equal(dt_ckpt_verify(&ctx, d, NULL), DT_OK);
    dt_st_file *sf;
    assert_int_equal(dt_st_open(&ctx, model, &sf), DT_OK);
    int n = dt_st_count(sf), k = 0;
    dt_st_entry *e = calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = dt_st_at(sf, i);
        if (i == 1) continue; /* drop one tensor */
        e[k] = (dt_st_entry){t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(e[k].shape, t->shape, sizeof t->shape);
        k++;
    }
    static const char *keys[] = {"format", "n_layer", "d_model", "n_head", "vocab", "context", "step", "tokenizer"};
    const char *meta[17];
    for (int i = 0; i < 8; i++) meta[2 * i] = keys[i], meta[2 * i + 1] = dt_st_meta(sf, keys[i]);
    meta[16] = NULL;
    dt_io_info info;
    assert_int_equal(dt_st_write_info(&ctx, tmp, e, k, meta, &info), DT_OK);
    dt_st_close(sf);
    free(e);
    assert_int_equal(rename(tmp, model), 0);
    dt_manifest man;
    assert_int_equal(dt_manifest_read(&ctx, d, &man), DT_OK);
    dt_manifest_file *mf = (dt_manifest_file *)dt_manifest_find(&man, "model.safetensors");
    assert_non_null(mf);
    mf->size = info.size, mf->xxh3 = info.xxh3;
    assert_int_equal(dt_manifest_write(&ctx, d, &man), DT_OK);
    dt_manifest_free(&man);
    assert_int_equal(dt_ckpt_verify(&ctx, d, NULL), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "a tensor is missing"));
    char found[4400];
    assert_int_equal(dt_ckpt_find(&ctx, f.root, found, sizeof found), DT_OK);
    assert_non_null(strstr(found, "step-00000002"));
    fx_free(&f);
}

static void test_reshard_moments(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    enum { N = 1000 };
    float *gm = tu_malloc(N * 4), *gv = tu_malloc(N * 4);
    for (int i = 0; i < N; i++) gm[i] = (float)i, gv[i] = (float)(N - i) * 0.5f;
    char d[256];
    snprintf(d, sizeof d, "%s/reshard", dir);
    mkdir(d, 0755);
    /* two "units" [0,400) and [400,1000), each split in halves: rank 0 holds the first halves */
    dt_shard_piece r0[2] = {{0, 0, 200}, {400, 200, 300}}, r1[2] = {{200, 0, 200}, {700, 200, 300}};
    float m0[500], v0[500], m1[500], v1[500];
    for (int k = 0; k < 2; k++) {
        memcpy(m0 + r0[k].local, gm + r0[k].global, r0[k].n * 4);
        memcpy(v0 + r0[k].local, gv + r0[k].global, r0[k].n * 4);
        memcpy(m1 + r1[k].local, gm + r1[k].global, r1[k].n * 4);
        memcpy(v1 + r1[k].local, gv + r1[k].global, r1[k].n * 4);
    }
    dt_manifest man = {5, 2, "zero1", 3, NULL};
    man.files = calloc(3, sizeof *man.files);
    dt_io_info i0, i1;
    write_optim(&ctx, d, "optim-rank0-of-2.safetensors", r0, 2, m0, v0, 500, N, &i0);
    write_optim(&ctx, d, "optim-rank1-of-2.safetensors", r1, 2, m1, v1, 500, N, &i1);
    snprintf(man.files[0].name, DT_MANIFEST_NAME_MAX, "optim-rank0-of-2.safetensors");
    man.files[0].size = i0.size, man.files[0].xxh3 = i0.xxh3;
    snprintf(man.files[1].name, DT_MANIFEST_NAME_MAX, "optim-rank1-of-2.safetensors");
    man.files[1].size = i1.size, man.files[1].xxh3 = i1.xxh3;
    man.nfiles = 2;
    assert_int_equal(dt_manifest_write(&ctx, d, &man), DT_OK);
    /* one rank, everything */
    float *m = tu_malloc(N * 4), *v = tu_malloc(N * 4);
    dt_shard_piece all[2] = {{0, 0, 400}, {400, 400, 600}};
    assert_int_equal(dt_ckpt_load_moments(&ctx, d, N, all, 2, m, v), DT_OK);
    assert_memory_equal(m, gm, N * 4);
    assert_memory_equal(v, gv, N * 4);
    /* a 3-way split that cuts across the saved pieces */
    dt_shard_piece mid[2] = {{133, 0, 267}, {600, 267, 200}};
    memset(m, 0, N * 4);
    assert_int_equal(dt_ckpt_load_moments(&ctx, d, N, mid, 2, m, v), DT_OK);
    assert_memory_equal(m, gm + 133, 267 * 4);
    assert_memory_equal(m + 267, gm + 600, 200 * 4);
    /* rank 1's file missing from the manifest: part of my piece is not covered */
    man.nfiles = 1;
    assert_int_equal(dt_manifest_write(&ctx, d, &man), DT_OK);
    assert_int_equal(dt_ckpt_load_moments(&ctx, d, N, all, 2, m, v), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "missing shard"));
    /* the same file listed under two names: overlapping */
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/optim-rank0-of-2.safetensors", d);
    snprintf(b, sizeof b, "%s/optim-rank9-of-2.safetensors", d);
    assert_int_equal(link(a, b), 0);
    man.files[1] = man.files[0];
    snprintf(man.files[1].name, DT_MANIFEST_NAME_MAX, "optim-rank9-of-2.safetensors");
    man.nfiles = 2;
    assert_int_equal(dt_manifest_write(&ctx, d, &man), DT_OK);
    dt_shard_piece first[1] = {{0, 0, 200}};
    assert_int_equal(dt_ckpt_load_moments(&ctx, d, N, first, 1, m, v), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "overlapping"));
    /* written for another model size */
    assert_int_equal(dt_ckpt_load_moments(&ctx, d, N + 1, first, 1, m, v), DT_ERR_FORMAT);
    free(man.files);
    free(gm);
    free(gv);
    free(m);
    free(v);
}

/* Body + the self-checksum trailer, as the writer does. */
static char *with_self(const char *body) {
    size_t n = strlen(body);
    char *s = tu_malloc(n + 64);
    snprintf(s, n + 64, "%s, \"manifest_xxh3\": \"%016llx\"}\n", body, (unsigned long long)dt_xxh3(body, n));
    return s;
}

static void test_manifest_parse(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_manifest m;
    const char *head = "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": 7, \"world\": 2, "
                       "\"strategy\": \"zero3\", \"checksum\": \"xxh3-64\", \"files\": [";
    char body[1024];
    snprintf(body, sizeof body, "%s{\"name\": \"a.bin\", \"size\": 10, \"xxh3\": \"00000000000000ff\"}]", head);
    char *ok = with_self(body);
    assert_int_equal(dt_manifest_parse(&ctx, ok, strlen(ok), "M", &m), DT_OK);
    assert_int_equal(m.step, 7);
    assert_int_equal(m.world, 2);
    assert_int_equal(m.nfiles, 1);
    assert_int_equal(m.files[0].xxh3, 0xff);
    dt_manifest_free(&m);
    /* a changed byte anywhere breaks the self-checksum */
    ok[5] ^= 1;
    assert_int_equal(dt_manifest_parse(&ctx, ok, strlen(ok), "M", &m), DT_ERR_FORMAT);
    assert_non_null(strstr(ctx.err, "M:"));
    free(ok);
    static const char *const bad_files[] = {
        "{\"name\": \"../x\", \"size\": 1, \"xxh3\": \"0000000000000001\"}",
        "{\"name\": \"a/b\", \"size\": 1, \"xxh3\": \"0000000000000001\"}",
        "{\"name\": \"a\", \"size\": -1, \"xxh3\": \"0000000000000001\"}",
        "{\"name\": \"a\", \"size\": 1.5, \"xxh3\": \"0000000000000001\"}",
        "{\"name\": \"a\", \"size\": 1, \"xxh3\": \"xyz\"}",
        "{\"name\": \"a\", \"size\": 1}",
        "{\"name\": \"a\", \"size\": 1, \"xxh3\": \"0000000000000001\"}, {\"name\": \"a\", \"size\": 1, \"xxh3\": \"0000000000000001\"}",
        "7",
    };
    for (size_t i = 0; i < sizeof bad_files / sizeof *bad_files; i++) {
        snprintf(body, sizeof body, "%s%s]", head, bad_files[i]);
        char *t = with_self(body);
        assert_int_equal(dt_manifest_parse(&ctx, t, strlen(t), "M", &m), DT_ERR_FORMAT);
        free(t);
    }
    static const char *const bad_heads[] = {
        "{\"format\": \"other\", \"version\": 1, \"step\": 1, \"world\": 1, \"strategy\": \"ddp\", \"checksum\": \"xxh3-64\", \"files\": []",
        "{\"format\": \"dtrain-checkpoint\", \"version\": 2, \"step\": 1, \"world\": 1, \"strategy\": \"ddp\", \"checksum\": \"xxh3-64\", \"files\": [{}]",
        "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"world\": 1, \"strategy\": \"ddp\", \"checksum\": \"xxh3-64\", \"files\": [{}]",
        "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": 1, \"world\": 1, \"strategy\": \"ddp\", \"checksum\": \"crc32\", \"files\": [{}]",
        "[1, 2",
    };
    for (size_t i = 0; i < sizeof bad_heads / sizeof *bad_heads; i++) {
        char *t = with_self(bad_heads[i]);
        assert_int_equal(dt_manifest_parse(&ctx, t, strlen(t), "M", &m), DT_ERR_FORMAT);
        free(t);
    }
    assert_int_equal(dt_manifest_parse(&ctx, "", 0, "M", &m), DT_ERR_FORMAT);
}

/* The lock file's fields. */
static dt_ckpt_lock_info lock_file(const char *d) {
    char p[256], text[4096] = "";
    snprintf(p, sizeof p, "%s/" DT_CKPT_LOCK_NAME, d);
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    dt_ckpt_lock_info in;
    dt_ckpt_lock_parse(text, n, &in);
    return in;
}

static void test_lock(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_ckpt_lock_info in;
    const char *t = "dtrain-lock 1\nhost: h1\npid: 77\nstarted: 2026-01-01T00:00:00+0000\ncommand: dtrain train\n"
                    "token: 00000000000000ab\n";
    assert_int_equal(dt_ckpt_lock_parse(t, strlen(t), &in), 1);
    assert_string_equal(in.host, "h1");
    assert_int_equal(in.pid, 77);
    assert_string_equal(in.command, "dtrain train");
    assert_string_equal(in.token, "00000000000000ab");
    assert_int_equal(dt_ckpt_lock_parse("", 0, &in), 0);
    assert_int_equal(dt_ckpt_lock_parse("host: h\n", 8, &in), 0); /* no pid */

    char d[128], p[160];
    snprintf(d, sizeof d, "%s/lockdir/sub", dir);
    snprintf(p, sizeof p, "%s/" DT_CKPT_LOCK_NAME, d);
    unsetenv(DT_CKPT_LOCK_ENV);
    dt_ckpt_lock *a, *b;
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &a), DT_OK); /* creates d */
    in = lock_file(d);
    assert_int_equal(in.pid, (long)getpid());
    assert_string_equal(in.host, ctx.host);
    assert_string_equal(in.token, dt_ckpt_lock_token(a));
    /* a second lock of this process would release the first when closed: refused */
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &b), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "locked by this process already"));
    dt_ckpt_lock_release(a);
    assert_int_not_equal(access(p, F_OK), 0); /* a clean release leaves no file */

    /* another process holds it */
    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dt_ckpt_lock *c;
        char ok = dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "dtrain train", &c) == DT_OK ? 'y' : 'n';
        if (write(up[1], &ok, 1) != 1) _exit(1);
        char x;
        if (read(down[0], &x, 1) < 0) _exit(1); /* hold until the parent says so, or kills us */
        _exit(0);
    }
    char ok = 0;
    assert_int_equal(read(up[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    char want[128];
    snprintf(want, sizeof want, "is in use by dtrain train pid %ld on host %s (started ", (long)pid, ctx.host);
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &b), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, want));
    assert_non_null(strstr(ctx.err, "two runs must not share a checkpoint directory"));
    /* its token in DTRAIN_CKPT_LOCK: accepted as the supervisor's, holding nothing */
    in = lock_file(d);
    setenv(DT_CKPT_LOCK_ENV, "0123456789abcdef", 1);
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &b), DT_ERR_CONFIG);
    setenv(DT_CKPT_LOCK_ENV, in.token, 1);
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &b), DT_OK);
    assert_int_equal(dt_ckpt_lock_inherited(b), 1);
    assert_string_equal(dt_ckpt_lock_token(b), "");
    dt_ckpt_lock_release(b);
    unsetenv(DT_CKPT_LOCK_ENV);
    assert_int_equal(lock_file(d).pid, (long)pid); /* still the holder's */
    /* the holder killed: its file stays, its fcntl lock goes; taken over */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(up[0]), close(up[1]), close(down[0]), close(down[1]);
    assert_int_equal(lock_file(d).pid, (long)pid);
    assert_int_equal(dt_ckpt_lock_acquire(&ctx, d, "checkpoint.dir ", "test", &a), DT_OK);
    assert_int_equal(dt_ckpt_lock_inherited(a), 0);
    in = lock_file(d);
    assert_int_equal(in.pid, (long)getpid());
    assert_string_equal(in.command, "test");
    dt_ckpt_lock_release(a);
    assert_int_not_equal(access(p, F_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_parse),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_crash_every_point),
        cmocka_unit_test(test_enospc_every_point),
        cmocka_unit_test(test_bit_flips_and_damage),
        cmocka_unit_test(test_missing_tensor_is_damage),
        cmocka_unit_test(test_reshard_moments),
        cmocka_unit_test(test_lock),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
