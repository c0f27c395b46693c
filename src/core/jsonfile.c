/* JSON files (core/jsonfile.h). */
#include "core/jsonfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_json_write(dt_ctx *ctx, const char *path, const cJSON *obj) {
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: path too long", path);
    char *text = cJSON_Print(obj);
    if (!text) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory printing JSON", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(text);
        return dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    free(text);
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return dt_fail(ctx, DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return DT_OK;
}

dt_status dt_json_read(dt_ctx *ctx, const char *path, cJSON **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    char chunk[65536];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + got + 1 > cap) {
            cap = 2 * (len + got + 1);
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
            }
            text = t;
        }
        memcpy(text + len, chunk, got);
        len += got;
    }
    fclose(f);
    if (!text) return dt_fail(ctx, DT_ERR_FORMAT, "%s: empty file", path);
    text[len] = 0;
    *out = cJSON_Parse(text);
    free(text);
    if (!*out) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON", path);
    return DT_OK;
}
