/* Reading config.json keys for the families' Hugging Face import (see hf_json.h). */
#include "model/hf_json.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

/* An integer key: *out = its value (def when absent and def >= 0; absent and def < 0:
 * refused). */
dt_status dt_hf_json_int(dt_ctx *ctx, const dt_hf_json *j, const char *key, long def, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) {
        if (def < 0) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' is missing", j->path, key);
        *out = (int)def;
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 2147483647.0)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' must be a non-negative integer", j->path, key);
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
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' must be a number", j->path, key);
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
    if (!cJSON_IsBool(v)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' must be true or false", j->path, key);
    *out = cJSON_IsTrue(v);
    return DT_OK;
}

/* A string key that, when present, must be one of `allowed` (NULL-terminated). */
dt_status dt_hf_json_want(dt_ctx *ctx, const dt_hf_json *j, const char *key, const char *const *allowed) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    if (!v || cJSON_IsNull(v)) return DT_OK;
    for (int i = 0; cJSON_IsString(v) && allowed[i]; i++)
        if (!strcmp(v->valuestring, allowed[i])) return DT_OK;
    return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s '%s' is not supported (dtrain computes %s)", j->path, key,
                   cJSON_IsString(v) ? v->valuestring : "?", allowed[0]);
}

int dt_hf_json_has(const dt_hf_json *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)j->root, key);
    return v && !cJSON_IsNull(v);
}
