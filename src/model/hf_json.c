/* Reading config.json keys for the families' Hugging Face import (see hf_json.h). */
#include "model/hf_json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define PRE(j) ((j)->prefix ? (j)->prefix : "")

/* An integer key: *out = its value (def when absent and def >= 0; absent and def < 0:
 * refused). */
dt_status dt_hf_json_int(dt_ctx *ctx, const dt_hf_json *j, const char *key, long def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' is missing", j->path, PRE(j), key);
        *out = (int)def;
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 2147483647.0)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' must be a non-negative integer", j->path, PRE(j),
                       key);
    *out = (int)v->valuedouble;
    return DT_OK;
}

dt_status dt_hf_json_float(dt_ctx *ctx, const dt_hf_json *j, const char *key, double def, float *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = (float)def;
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' must be a number", j->path, PRE(j), key);
    *out = (float)v->valuedouble;
    return DT_OK;
}

/* A boolean key (def when absent). */
dt_status dt_hf_json_bool(dt_ctx *ctx, const dt_hf_json *j, const char *key, int def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return DT_OK;
    }
    if (!cJSON_IsBool(v)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' must be true or false", j->path, PRE(j), key);
    *out = cJSON_IsTrue(v);
    return DT_OK;
}

/* A string key that, when present, must be one of `allowed` (NULL-terminated). */
dt_status dt_hf_json_want(dt_ctx *ctx, const dt_hf_json *j, const char *key, const char *const *allowed) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) return DT_OK;
    for (int i = 0; cJSON_IsString(v) && allowed[i]; i++)
        if (!strcmp(v->valuestring, allowed[i])) return DT_OK;
    return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s%s '%s' is not supported (dtrain computes %s)", j->path, PRE(j),
                   key, cJSON_IsString(v) ? v->valuestring : "?", allowed[0]);
}

int dt_hf_json_has(const dt_hf_json *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    return v && !cJSON_IsNull(v);
}

dt_status dt_hf_json_string(dt_ctx *ctx, const dt_hf_json *j, const char *key, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return DT_OK;
    if (!cJSON_IsString(v)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' must be a string", j->path, PRE(j), key);
    *out = v->valuestring;
    return DT_OK;
}

dt_status dt_hf_json_object(dt_ctx *ctx, const dt_hf_json *j, const char *key, dt_hf_json *sub, char *prefix,
                            size_t n, int *found) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    *found = 0;
    if (!v || cJSON_IsNull(v)) return DT_OK;
    if (!cJSON_IsObject(v))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s%s' must be an object or null", j->path, PRE(j), key);
    snprintf(prefix, n, "%s%s.", PRE(j), key);
    *sub = (dt_hf_json){j->path, v, prefix};
    *found = 1;
    return DT_OK;
}

const char *dt_hf_json_key(const dt_hf_json *j, int i) {
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, (const cJSON *)j->root) {
        if (k++ == i) return e->string;
    }
    return NULL;
}
