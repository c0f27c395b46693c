#include "train/keys.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum key_type { K_INT, K_LONG, K_FLOAT, K_STR, K_U64 } key_type;

typedef struct key_def {
    const char *key;
    key_type type;
    size_t off;   /* offset in dt_run_cfg */
    size_t size;  /* for strings */
    int model_ix; /* index into model_set, or -1 */
    const char *help;
} key_def;

#define OFF(field) offsetof(dt_run_cfg, field)
static const key_def keys[] = {
    {"model.preset", K_STR, OFF(train.preset), sizeof(((dt_train_cfg *)0)->preset), -1,
     "gpt2-tiny | bench-small | gpt2 | gpt2-medium | gpt2-large | gpt2-xl ('' = custom)"},
    {"model.n_layer", K_INT, OFF(train.model.n_layer), 0, 0, "transformer blocks"},
    {"model.d_model", K_INT, OFF(train.model.d_model), 0, 1, "embedding width"},
    {"model.n_head", K_INT, OFF(train.model.n_head), 0, 2, "attention heads (divides d_model)"},
    {"model.vocab_size", K_INT, OFF(train.model.vocab), 0, 3, "vocabulary (padded to 128 internally)"},
    {"model.context", K_INT, OFF(train.model.context), 0, 4, "maximum sequence length"},
    {"training.micro_batch", K_INT, OFF(train.micro_batch), 0, -1, "sequences per micro-step"},
    {"training.seq_len", K_INT, OFF(train.seq_len), 0, -1, "tokens per sequence (<= model.context)"},
    {"training.grad_accum", K_INT, OFF(train.accum), 0, -1, "micro-steps per optimizer step"},
    {"training.steps", K_LONG, OFF(train.steps), 0, -1, "optimizer steps"},
    {"training.seed", K_U64, OFF(train.seed), 0, -1, "seed of init and synthetic data"},
    {"training.log_every", K_INT, OFF(train.log_every), 0, -1, "log a line every N steps"},
    {"data.train", K_STR, OFF(data_path), sizeof(((dt_run_cfg *)0)->data_path), -1,
     "llm.c token shard ('' = synthetic random tokens)"},
    {"optimizer.lr", K_FLOAT, OFF(train.sched.lr), 0, -1, "peak learning rate"},
    {"optimizer.beta1", K_FLOAT, OFF(train.adamw.beta1), 0, -1, "AdamW beta1"},
    {"optimizer.beta2", K_FLOAT, OFF(train.adamw.beta2), 0, -1, "AdamW beta2"},
    {"optimizer.eps", K_FLOAT, OFF(train.adamw.eps), 0, -1, "AdamW epsilon"},
    {"optimizer.weight_decay", K_FLOAT, OFF(train.adamw.weight_decay), 0, -1,
     "decoupled weight decay (2-D weights only)"},
    {"optimizer.grad_clip", K_FLOAT, OFF(train.clip), 0, -1, "global grad-norm clip (0 = off)"},
    {"schedule.kind", K_STR, 0, 0, -1, "constant | cosine | linear"},
    {"schedule.warmup", K_LONG, OFF(train.sched.warmup), 0, -1, "linear warm-up steps"},
    {"schedule.decay_steps", K_LONG, OFF(train.sched.total), 0, -1,
     "step at which decay reaches min_lr (default: training.steps)"},
    {"schedule.min_lr", K_FLOAT, OFF(train.sched.min_lr), 0, -1, "final learning rate"},
    {"runtime.threads", K_INT, OFF(threads), 0, -1, "OpenMP threads (0 = OMP_NUM_THREADS or all cores)"},
};
#undef OFF
#define NKEYS (sizeof keys / sizeof keys[0])

void dt_run_cfg_defaults(dt_run_cfg *c) {
    memset(c, 0, sizeof *c);
    dt_train_cfg_defaults(&c->train);
}

/* Levenshtein distance, for "did you mean". */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

static const char *closest_key(const char *key) {
    const char *best = keys[0].key;
    int bd = 1 << 30;
    for (size_t i = 0; i < NKEYS; i++) {
        int d = edit_distance(key, keys[i].key);
        /* A bare name ("n_layer") matches its section's key too. */
        const char *dot = strchr(keys[i].key, '.');
        if (dot && strcmp(dot + 1, key) == 0) d = 0;
        if (d < bd) {
            bd = d;
            best = keys[i].key;
        }
    }
    return best;
}

dt_status dt_cfg_set(dt_ctx *ctx, dt_run_cfg *c, const char *key, const char *value) {
    const key_def *k = NULL;
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].key, key) == 0) k = &keys[i];
    if (!k)
        return dt_fail(ctx, DT_ERR_CONFIG, "unknown key '%s' (did you mean '%s'?)", key,
                       closest_key(key));
    char *end = NULL;
    void *dst = (char *)c + k->off;
    errno = 0;
    switch (k->type) {
    case K_INT:
    case K_LONG: {
        long v = strtol(value, &end, 10);
        if (end == value || *end || errno == ERANGE || (k->type == K_INT && (v < INT_MIN || v > INT_MAX)))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected an integer, got '%s'", key, value);
        if (k->type == K_INT) *(int *)dst = (int)v;
        else *(long *)dst = v;
        break;
    }
    case K_U64: {
        if (value[0] == '-')
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a non-negative integer, got '%s'", key, value);
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || errno == ERANGE)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a non-negative integer, got '%s'", key, value);
        *(uint64_t *)dst = (uint64_t)v;
        break;
    }
    case K_FLOAT: {
        float v = strtof(value, &end);
        if (end == value || *end || errno == ERANGE || !isfinite(v))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a number, got '%s'", key, value);
        *(float *)dst = v;
        break;
    }
    case K_STR:
        if (strcmp(key, "schedule.kind") == 0) return dt_lr_schedule_parse(ctx, value, &c->train.sched.kind);
        if (strlen(value) >= k->size)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: value longer than %zu characters", key, k->size - 1);
        strcpy((char *)dst, value);
        break;
    }
    if (k->model_ix >= 0) c->model_set[k->model_ix] = 1;
    if (strcmp(key, "schedule.decay_steps") == 0) c->decay_steps_set = 1;
    return DT_OK;
}

dt_status dt_cfg_finish(dt_ctx *ctx, dt_run_cfg *c) {
    dt_train_cfg *t = &c->train;
    if (t->preset[0]) {
        dt_gpt2_config p, user = t->model;
        DT_CHECK(dt_gpt2_config_preset(ctx, t->preset, &p));
        int *fields[5] = {&p.n_layer, &p.d_model, &p.n_head, &p.vocab, &p.context};
        int ufields[5] = {user.n_layer, user.d_model, user.n_head, user.vocab, user.context};
        int preset_context = p.context;
        for (int i = 0; i < 5; i++)
            if (c->model_set[i]) *fields[i] = ufields[i];
        if (p.context > preset_context)
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "model.context (%d) exceeds the maximum %d of preset %s", p.context,
                           preset_context, t->preset);
        t->model = p;
    }
    DT_CHECK(dt_gpt2_config_validate(ctx, &t->model));
    if (t->micro_batch < 1 || t->micro_batch > 65536)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.micro_batch must be in [1, 65536] (got %d)", t->micro_batch);
    if (t->seq_len < 1 || t->seq_len > t->model.context)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.seq_len must be in [1, model.context=%d] (got %d)",
                       t->model.context, t->seq_len);
    if (t->log_every < 1)
        return dt_fail(ctx, DT_ERR_CONFIG, "training.log_every must be >= 1 (got %d)", t->log_every);
    if (c->threads < 0 || c->threads > 4096)
        return dt_fail(ctx, DT_ERR_CONFIG, "runtime.threads must be in [0, 4096] (got %d)", c->threads);
    if (!c->decay_steps_set) t->sched.total = t->steps;
    t->data_path = c->data_path[0] ? c->data_path : NULL;
    return dt_train_cfg_validate(ctx, t);
}

void dt_cfg_print_keys(FILE *f) {
    dt_run_cfg d;
    dt_run_cfg_defaults(&d);
    for (size_t i = 0; i < NKEYS; i++) {
        char def[64] = "";
        const void *p = (const char *)&d + keys[i].off;
        switch (keys[i].type) {
        case K_INT: snprintf(def, sizeof def, "%d", *(const int *)p); break;
        case K_LONG: snprintf(def, sizeof def, "%ld", *(const long *)p); break;
        case K_U64: snprintf(def, sizeof def, "%llu", (unsigned long long)*(const uint64_t *)p); break;
        case K_FLOAT: snprintf(def, sizeof def, "%g", (double)*(const float *)p); break;
        case K_STR:
            snprintf(def, sizeof def, "'%s'", strcmp(keys[i].key, "schedule.kind") == 0
                                               ? dt_sched_kind_name(d.train.sched.kind)
                                               : (const char *)p);
            break;
        }
        fprintf(f, "  %-24s %-12s %s\n", keys[i].key, def, keys[i].help);
    }
}

void dt_cfg_print(FILE *f, const dt_run_cfg *c) {
    const dt_train_cfg *t = &c->train;
    fprintf(f, "model.preset: '%s'\nmodel.n_layer: %d\nmodel.d_model: %d\nmodel.n_head: %d\n"
               "model.vocab_size: %d\nmodel.context: %d\n",
            t->preset, t->model.n_layer, t->model.d_model, t->model.n_head, t->model.vocab,
            t->model.context);
    fprintf(f, "training.micro_batch: %d\ntraining.seq_len: %d\ntraining.grad_accum: %d\n"
               "training.steps: %ld\ntraining.seed: %llu\ntraining.log_every: %d\n",
            t->micro_batch, t->seq_len, t->accum, t->steps, (unsigned long long)t->seed, t->log_every);
    fprintf(f, "data.train: '%s'\n", c->data_path);
    fprintf(f, "optimizer.lr: %g\noptimizer.beta1: %g\noptimizer.beta2: %g\noptimizer.eps: %g\n"
               "optimizer.weight_decay: %g\noptimizer.grad_clip: %g\n",
            (double)t->sched.lr, (double)t->adamw.beta1, (double)t->adamw.beta2,
            (double)t->adamw.eps, (double)t->adamw.weight_decay, (double)t->clip);
    fprintf(f, "schedule.kind: %s\nschedule.warmup: %ld\nschedule.decay_steps: %ld\nschedule.min_lr: %g\n",
            dt_sched_kind_name(t->sched.kind), t->sched.warmup, t->sched.total, (double)t->sched.min_lr);
    fprintf(f, "runtime.threads: %d\n", c->threads);
}
