#include "ckpt/manifest.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_io.h"

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= DT_MANIFEST_NAME_MAX || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return 0;
    return 1;
}

/* An integer-valued JSON number in [lo, hi]. */
static int get_int(const cJSON *o, const char *key, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    /* Range first: casting a double beyond int64 is undefined (found by fuzz/fuzz_manifest). */
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return 0;
    *out = v->valuedouble;
    return 1;
}

#define SELF_KEY ", \"manifest_xxh3\": \""

/* The manifest's last key checksums every byte before it, so a flipped bit anywhere in the
 * manifest - even in whitespace - is detected, not only in the files it lists. */
static dt_status check_self(dt_ctx *ctx, const char *text, size_t len, const char *origin) {
    size_t kl = strlen(SELF_KEY);
    /* the trailer is exactly: SELF_KEY 16-hex "}\n */
    if (len < kl + 19) return dt_fail(ctx, DT_ERR_FORMAT, "%s: too short for a manifest", origin);
    size_t pos = len - (kl + 19);
    if (memcmp(text + pos, SELF_KEY, kl) != 0 || memcmp(text + len - 3, "\"}\n", 3) != 0)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: the manifest's own checksum (key 'manifest_xxh3', last) is missing",
                       origin);
    char hex[17];
    memcpy(hex, text + pos + kl, 16);
    hex[16] = 0;
    char *end;
    unsigned long long want = strtoull(hex, &end, 16);
    if (*end || hex[0] == '-' || hex[0] == '+' || hex[0] == ' ')
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'manifest_xxh3' is not 16 hex digits", origin);
    if ((uint64_t)want != dt_xxh3(text, pos))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: the manifest's own checksum does not match (corrupted)", origin);
    return DT_OK;
}

dt_status dt_manifest_parse(dt_ctx *ctx, const char *text, size_t len, const char *origin,
                            dt_manifest *out) {
    memset(out, 0, sizeof *out);
    DT_CHECK(check_self(ctx, text, len, origin));
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON", origin);
    dt_status st = DT_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(root, "checksum");
    const cJSON *strat = cJSON_GetObjectItemCaseSensitive(root, "strategy");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    double version = 0, step = 0, world = 0;
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dtrain-checkpoint")) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: not a dtrain checkpoint manifest (key 'format')", origin);
    } else if (!get_int(root, "version", 1, 1, &version)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'version' missing or unsupported (this dtrain reads 1)", origin);
    } else if (!get_int(root, "step", 0, 1e15, &step) || !get_int(root, "world", 1, 1e7, &world)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'step' or 'world' missing or out of range", origin);
    } else if (!cJSON_IsString(sum) || strcmp(sum->valuestring, "xxh3-64")) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'checksum' must be \"xxh3-64\"", origin);
    } else if (!cJSON_IsString(strat) || strlen(strat->valuestring) >= sizeof out->strategy) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'strategy' missing or too long", origin);
    } else if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) < 1 ||
               cJSON_GetArraySize(files) > DT_MANIFEST_MAX_FILES) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'files' must be a non-empty list", origin);
    }
    if (st != DT_OK) goto done;
    out->step = (long)step;
    out->world = (int)world;
    snprintf(out->strategy, sizeof out->strategy, "%s", strat->valuestring);
    int n = cJSON_GetArraySize(files);
    out->files = calloc((size_t)n, sizeof *out->files);
    if (!out->files) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", origin);
        goto done;
    }
    int i = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(f, "xxh3");
        double size;
        char *end = NULL;
        if (!cJSON_IsString(name) || !valid_name(name->valuestring)) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: files[%d].name missing or not a plain file name", origin, i);
            break;
        }
        if (!get_int(f, "size", 0, 4.0e18, &size)) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: files[%d].size missing or out of range", origin, i);
            break;
        }
        unsigned long long hv = 0;
        if (cJSON_IsString(h) && strlen(h->valuestring) == 16 && strspn(h->valuestring, "0123456789abcdef") == 16)
            hv = strtoull(h->valuestring, &end, 16);
        if (!end || *end) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: files[%d].xxh3 must be 16 hex digits", origin, i);
            break;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(out->files[k].name, name->valuestring)) {
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: file '%s' is listed twice", origin, name->valuestring);
                break;
            }
        if (st != DT_OK) break;
        snprintf(out->files[i].name, sizeof out->files[i].name, "%s", name->valuestring);
        out->files[i].size = (uint64_t)size;
        out->files[i].xxh3 = hv;
        i++;
    }
    out->nfiles = i;
done:
    cJSON_Delete(root);
    if (st != DT_OK) dt_manifest_free(out);
    return st;
}

dt_status dt_manifest_read(dt_ctx *ctx, const char *dir, dt_manifest *out) {
    char path[4400];
    snprintf(path, sizeof path, "%s/" DT_MANIFEST_NAME, dir);
    memset(out, 0, sizeof *out);
    char *buf;
    size_t n;
    if (dt_io_read_small(ctx, path, 16u << 20, &buf, &n) != DT_OK) {
        char why[DT_ERRMSG_MAX];
        snprintf(why, sizeof why, "%s", ctx->err);
        return dt_fail(ctx, DT_ERR_IO, "%s (an incomplete or damaged checkpoint)", why);
    }
    dt_status st = dt_manifest_parse(ctx, buf, n, path, out);
    free(buf);
    return st;
}

dt_status dt_manifest_verify_files(dt_ctx *ctx, const char *dir, const dt_manifest *m) {
    for (int i = 0; i < m->nfiles; i++) {
        const dt_manifest_file *f = &m->files[i];
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        dt_io_info info;
        if (dt_io_hash_file(ctx, path, &info) != DT_OK) {
            char why[DT_ERRMSG_MAX];
            snprintf(why, sizeof why, "%s", ctx->err);
            return dt_fail(ctx, DT_ERR_FORMAT, "%s (listed in the manifest)", why);
        }
        if (info.size != f->size)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: size %" PRIu64 " bytes, the manifest says %" PRIu64
                           " (truncated or overwritten)", path, info.size, f->size);
        if (info.xxh3 != f->xxh3)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: checksum %016" PRIx64 " does not match the manifest's %016" PRIx64
                           " (corrupted)", path, info.xxh3, f->xxh3);
    }
    return DT_OK;
}

dt_status dt_manifest_write(dt_ctx *ctx, const char *dir, const dt_manifest *m) {
    size_t cap = 256 + (size_t)m->nfiles * 200;
    char *buf = malloc(cap);
    if (!buf) return dt_fail(ctx, DT_ERR_NOMEM, "manifest: out of memory");
    size_t len = (size_t)snprintf(buf, cap,
                                  "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": %ld, "
                                  "\"world\": %d, \"strategy\": \"%s\", \"checksum\": \"xxh3-64\",\n \"files\": [",
                                  m->step, m->world, m->strategy);
    for (int i = 0; i < m->nfiles; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s\n  {\"name\": \"%s\", \"size\": %" PRIu64 ", \"xxh3\": \"%016" PRIx64 "\"}",
                                i ? "," : "", m->files[i].name, m->files[i].size, m->files[i].xxh3);
    len += (size_t)snprintf(buf + len, cap - len, "]");
    uint64_t self = dt_xxh3(buf, len);
    len += (size_t)snprintf(buf + len, cap - len, SELF_KEY "%016" PRIx64 "\"}\n", self);
    char path[4400];
    snprintf(path, sizeof path, "%s/" DT_MANIFEST_NAME, dir);
    dt_status st = dt_io_write_file(ctx, path, buf, len, NULL);
    free(buf);
    DT_CHECK(st);
    return dt_io_fsync_dir(ctx, dir);
}

const dt_manifest_file *dt_manifest_find(const dt_manifest *m, const char *name) {
    for (int i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].name, name)) return &m->files[i];
    return NULL;
}

void dt_manifest_free(dt_manifest *m) {
    free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}
