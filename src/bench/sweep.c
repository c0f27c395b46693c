#include "bench/sweep.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const struct {
    const char *name, *key;
} short_names[] = {
    {"world", ""},
    {"strategy", "parallel.strategy"},
    {"micro_batch", "training.micro_batch"},
    {"bucket_mb", "parallel.bucket_mb"},
    {"batch", "training.batch"},
    {"accum", "training.grad_accum"},
    {"overlap", "parallel.overlap"},
};

dt_status dt_sweep_add_axis(dt_ctx *ctx, dt_sweep *sw, const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: expected NAME=V1,V2,... (got '%s')", spec);
    if (sw->nax == DT_SWEEP_MAX_AXES)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: at most %d axes", DT_SWEEP_MAX_AXES);
    dt_sweep_axis *a = &sw->ax[sw->nax];
    memset(a, 0, sizeof *a);
    if ((size_t)(eq - spec) >= sizeof a->name)
        return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: name too long in '%s'", spec);
    memcpy(a->name, spec, (size_t)(eq - spec));
    for (int i = 0; i < sw->nax; i++)
        if (!strcmp(sw->ax[i].name, a->name))
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: %s swept twice", a->name);
    int known = 0;
    for (size_t i = 0; i < sizeof short_names / sizeof short_names[0]; i++)
        if (!strcmp(a->name, short_names[i].name)) {
            snprintf(a->key, sizeof a->key, "%s", short_names[i].key);
            known = 1;
        }
    if (!known) {
        if (!strchr(a->name, '.'))
            return dt_fail(ctx, DT_ERR_CONFIG,
                           "dtrain bench --sweep: unknown axis '%s' (world, strategy, micro_batch, bucket_mb, batch, "
                           "accum, overlap, or a section.key)", a->name);
        memcpy(a->key, a->name, sizeof a->key); /* same size, NUL-terminated */
    }
    for (const char *v = eq + 1; *v;) {
        size_t len = strcspn(v, ",");
        if (len == 0 || len >= sizeof a->values[0] || a->n == DT_SWEEP_MAX_VALUES)
            return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: bad value list in '%s' (at most %d values)", spec,
                           DT_SWEEP_MAX_VALUES);
        memcpy(a->values[a->n], v, len);
        if (!a->key[0]) { /* world */
            char *end;
            long w = strtol(a->values[a->n], &end, 10);
            if (*end || w < 1 || w > 4096)
                return dt_fail(ctx, DT_ERR_CONFIG, "dtrain bench --sweep: world values must be integers in [1, 4096] (got '%s')",
                               a->values[a->n]);
        }
        a->n++;
        v += len + (v[len] == ',');
    }
    sw->nax++;
    return DT_OK;
}

int dt_sweep_count(const dt_sweep *sw) {
    int n = 1;
    for (int i = 0; i < sw->nax; i++) n *= sw->ax[i].n;
    return n;
}

/* Value index of axis a at point i (the last axis varies fastest). */
static int value_of(const dt_sweep *sw, int i, int a) {
    for (int b = sw->nax - 1; b > a; b--) i /= sw->ax[b].n;
    return i % sw->ax[a].n;
}

int dt_sweep_world(const dt_sweep *sw, int i) {
    for (int a = 0; a < sw->nax; a++)
        if (!sw->ax[a].key[0]) return atoi(sw->ax[a].values[value_of(sw, i, a)]);
    return 1;
}

void dt_sweep_point_id(const dt_sweep *sw, int i, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int a = 0; a < sw->nax && len < n; a++) {
        const char *name = strrchr(sw->ax[a].name, '.');
        name = name ? name + 1 : sw->ax[a].name;
        len += (size_t)snprintf(buf + len, n - len, "%s%s%s", a ? "-" : "", name, sw->ax[a].values[value_of(sw, i, a)]);
    }
    for (char *p = buf; *p; p++) /* a file-name-safe id */
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
            *p = '_';
}

cJSON *dt_sweep_point_json(const dt_sweep *sw, int i) {
    cJSON *o = cJSON_CreateObject();
    for (int a = 0; a < sw->nax; a++) {
        const char *v = sw->ax[a].values[value_of(sw, i, a)];
        char *end;
        double d = strtod(v, &end);
        cJSON_AddItemToObject(o, sw->ax[a].name, *end ? cJSON_CreateString(v) : cJSON_CreateNumber(d));
    }
    return o;
}

void dt_sweep_point_args(const dt_sweep *sw, int i, char **argv, int *n, char (*store)[128]) {
    for (int a = 0; a < sw->nax; a++) {
        if (!sw->ax[a].key[0]) continue;
        snprintf(store[a], 128, "%s=%s", sw->ax[a].key, sw->ax[a].values[value_of(sw, i, a)]);
        argv[(*n)++] = "--set";
        argv[(*n)++] = store[a];
    }
}

dt_status dt_sweep_spawn(dt_ctx *ctx, char *const *argv, const char *log, int *code) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return dt_fail(ctx, DT_ERR_IO, "bench --sweep: fork failed: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        fprintf(stderr, "bench --sweep: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int status;
    pid_t r;
    while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r < 0) return dt_fail(ctx, DT_ERR_IO, "bench --sweep: waitpid failed: %s", strerror(errno));
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return DT_OK;
}

static double tokens_per_s(const cJSON *o) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, "summary");
    x = cJSON_GetObjectItemCaseSensitive(x, "tokens_per_s");
    x = cJSON_GetObjectItemCaseSensitive(x, "mean");
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

void dt_sweep_efficiency(const dt_sweep *sw, cJSON **points, int n) {
    for (int i = 0; i < n; i++) {
        if (!points[i]) continue;
        cJSON *s = cJSON_GetObjectItemCaseSensitive(points[i], "sweep");
        const cJSON *par = cJSON_GetObjectItemCaseSensitive(points[i], "parallel");
        int strong = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(par, "fixed_global_batch"));
        int W = dt_sweep_world(sw, i), ref = -1;
        for (int j = 0; j < n && ref < 0; j++) { /* world 1, every other axis equal */
            if (!points[j] || dt_sweep_world(sw, j) != 1) continue;
            int same = 1;
            for (int a = 0; a < sw->nax; a++)
                if (sw->ax[a].key[0] && value_of(sw, i, a) != value_of(sw, j, a)) same = 0;
            if (same) ref = j;
        }
        double t1 = ref >= 0 ? tokens_per_s(points[ref]) : 0, tw = tokens_per_s(points[i]);
        cJSON *eff = t1 > 0 ? cJSON_CreateNumber(tw / (W * t1)) : cJSON_CreateNull();
        cJSON_AddItemToObject(s, "weak_efficiency", strong ? cJSON_CreateNull() : eff);
        cJSON_AddItemToObject(s, "strong_efficiency", strong ? eff : cJSON_CreateNull());
        char id[256];
        if (ref >= 0) dt_sweep_point_id(sw, ref, id, sizeof id);
        cJSON_AddItemToObject(s, "reference", ref >= 0 ? cJSON_CreateString(id) : cJSON_CreateNull());
    }
}
