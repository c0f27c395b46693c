/* hf_json.h - typed reads of a Hugging Face config.json, for the families' hf_read_config
 * (src/ckpt/hf_import.c parses the file and calls the family whose model_type it names).
 * Every failure names the file and the key in one line.
 *
 *   DT_CHECK(dt_hf_json_int(ctx, j, "hidden_size", -1, &c->d_model));    // required
 *   DT_CHECK(dt_hf_json_float(ctx, j, "rope_theta", 10000.0, &c->rope_theta));
 */
#ifndef DT_HF_JSON_H
#define DT_HF_JSON_H

#include "core/status.h"

/* A parsed config.json (root: a cJSON object) and its path for messages; prefix (NULL: none)
 * goes before every key named in messages: "rope_scaling." for the keys of that object. */
struct dt_hf_json {
    const char *path;
    const void *root;
    const char *prefix;
};
typedef struct dt_hf_json dt_hf_json;

/* An integer key: *out = its value; when absent (or null) def, or refused when def < 0. */
dt_status dt_hf_json_int(dt_ctx *ctx, const dt_hf_json *j, const char *key, long def, int *out);
/* A finite number (def when absent). */
dt_status dt_hf_json_float(dt_ctx *ctx, const dt_hf_json *j, const char *key, double def, float *out);
/* true or false (def when absent). */
dt_status dt_hf_json_bool(dt_ctx *ctx, const dt_hf_json *j, const char *key, int def, int *out);
/* When present, a string among `allowed` (NULL-terminated); refused naming allowed[0]. */
dt_status dt_hf_json_want(dt_ctx *ctx, const dt_hf_json *j, const char *key, const char *const *allowed);
/* 1 when the key is present and not null. */
int dt_hf_json_has(const dt_hf_json *j, const char *key);
/* When present, a string: *out = its text (valid while j is), else NULL. */
dt_status dt_hf_json_string(dt_ctx *ctx, const dt_hf_json *j, const char *key, const char **out);
/* The object under key as *sub, whose messages name "key.<its key>" (prefix: room for them,
 * n bytes): refused (one line) when present, not null and not an object; *found = 0 when
 * absent or null. */
dt_status dt_hf_json_object(dt_ctx *ctx, const dt_hf_json *j, const char *key, dt_hf_json *sub, char *prefix,
                            size_t n, int *found);
/* The name of j's i-th key (NULL past the last). */
const char *dt_hf_json_key(const dt_hf_json *j, int i);

#endif
