/* Reading safetensors files with full bounds checking (see safetensors.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"

#define DT_ST_MAX_HEADER (64u << 20)

struct dt_st_file {
    void *map;                 /* the mapping of dt_st_open; NULL for dt_st_open_mem */
    const unsigned char *base; /* the file's bytes */
    size_t size;
    cJSON *header;
    dt_st_tensor *t;
    int n;
};

void dt_st_close(dt_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->size);
    cJSON_Delete(f->header);
    free(f->t);
    free(f);
}

static dt_status parse_entry(dt_ctx *ctx, const char *path, const cJSON *e, const char *data,
                             size_t data_len, dt_st_tensor *t) {
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    t->name = e->string;
    static const char *const names[] = {"F32", "I32", "F16", "BF16"};
    int dt = -1;
    for (int i = 0; i < 4 && cJSON_IsString(dtype); i++)
        if (!strcmp(dtype->valuestring, names[i])) dt = i;
    if (dt < 0)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': dtype must be F32, I32, F16 or BF16", path, t->name);
    t->dtype = (dt_st_dtype)dt;
    const size_t esize = dt_st_dtype_size(t->dtype);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > DT_ST_MAXDIM)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': bad shape", path, t->name);
    t->ndim = cJSON_GetArraySize(shape);
    size_t elems = 1;
    for (int d = 0; d < t->ndim; d++) {
        const cJSON *s = cJSON_GetArrayItem(shape, d);
        if (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble > 1e15 ||
            s->valuedouble != (double)(int64_t)s->valuedouble)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': bad dimension %d", path, t->name, d);
        t->shape[d] = (int64_t)s->valuedouble;
        if (t->shape[d] && elems > SIZE_MAX / esize / (size_t)t->shape[d])
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, t->name);
        elems *= (size_t)t->shape[d];
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !cJSON_IsNumber(cJSON_GetArrayItem(offs, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(offs, 1)))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", path, t->name);
    double b = cJSON_GetArrayItem(offs, 0)->valuedouble, en = cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (!(b >= 0 && en >= b && en <= (double)data_len) || b != (double)(size_t)b || en != (double)(size_t)en)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the %zu data bytes",
                       path, t->name, b, en, data_len);
    t->nbytes = (size_t)en - (size_t)b;
    if (t->nbytes != elems * esize)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': %zu data bytes for %zu elements", path,
                       t->name, t->nbytes, elems);
    if (((size_t)b) % esize)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s': misaligned data offset", path, t->name);
    t->data = data + (size_t)b;
    return DT_OK;
}

size_t dt_st_dtype_size(dt_st_dtype d) { return d == DT_ST_F16 || d == DT_ST_BF16 ? 2 : 4; }

/* Names are echoed in messages, which must stay one line: no control characters. */
static int printable(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 0;
    return 1;
}

static int cmp_by_offset(const void *a, const void *b) {
    const dt_st_tensor *x = *(const dt_st_tensor *const *)a, *y = *(const dt_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* No two tensors may share bytes (a crafted header could alias one tensor onto another) and
 * no name may appear twice (JSON allows it; which one a reader takes is undefined). */
static dt_status check_disjoint(dt_ctx *ctx, const char *path, dt_st_file *f) {
    if (f->n < 2) return DT_OK;
    const dt_st_tensor **v = malloc((size_t)f->n * sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < f->n; i++) v[i] = &f->t[i];
    qsort(v, (size_t)f->n, sizeof *v, cmp_by_offset);
    dt_status st = DT_OK;
    for (int i = 1; i < f->n && st == DT_OK; i++)
        if (v[i - 1]->nbytes && v[i]->nbytes && (const char *)v[i - 1]->data + v[i - 1]->nbytes > (const char *)v[i]->data)
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets)", path, v[i - 1]->name,
                         v[i]->name);
    free(v);
    for (int i = 0; i < f->n && st == DT_OK; i++)
        for (int j = i + 1; j < f->n && st == DT_OK; j++)
            if (!strcmp(f->t[i].name, f->t[j].name))
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor '%s' appears twice", path, f->t[i].name);
    return st;
}

/* Checks the header of f->base[0, f->size) and fills f->t. `path` names it in messages. */
static dt_status st_parse(dt_ctx *ctx, const char *path, dt_st_file *f) {
    dt_status st = DT_OK;
    char *hdr = NULL;
    if (f->size < 8)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: too short for a safetensors file (%zu bytes)", path,
                       f->size);
    uint64_t hlen;
    memcpy(&hlen, f->base, 8);
    if (hlen > f->size - 8 || hlen > DT_ST_MAX_HEADER)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes): truncated?",
                       path, (unsigned long long)hlen, f->size);
    hdr = malloc(hlen + 1);
    if (!hdr) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    memcpy(hdr, f->base + 8, hlen);
    hdr[hlen] = 0;
    f->header = cJSON_Parse(hdr);
    free(hdr);
    if (!cJSON_IsObject(f->header))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: header is not a JSON object", path);
    int n = cJSON_GetArraySize(f->header);
    f->t = calloc((size_t)(n > 0 ? n : 1), sizeof *f->t);
    if (!f->t) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    const char *data = (const char *)f->base + 8 + hlen;
    size_t data_len = f->size - 8 - hlen;
    const cJSON *e;
    cJSON_ArrayForEach(e, f->header) {
        if (!printable(e->string))
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: a tensor name contains control characters", path);
        if (!strcmp(e->string, "__metadata__")) {
            const cJSON *m;
            if (!cJSON_IsObject(e))
                return dt_fail(ctx, DT_ERR_FORMAT, "%s: __metadata__ is not an object", path);
            cJSON_ArrayForEach(m, e) {
                if (!printable(m->string))
                    return dt_fail(ctx, DT_ERR_FORMAT, "%s: a metadata key contains control characters", path);
                if (!cJSON_IsString(m))
                    return dt_fail(ctx, DT_ERR_FORMAT, "%s: metadata '%s' is not a string", path, m->string);
            }
            continue;
        }
        if (!cJSON_IsObject(e))
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: entry '%s' is not an object", path, e->string);
        st = parse_entry(ctx, path, e, data, data_len, &f->t[f->n]);
        if (st != DT_OK) return st;
        f->n++;
    }
    return check_disjoint(ctx, path, f);
}

dt_status dt_st_open(dt_ctx *ctx, const char *path, dt_st_file **out) {
    *out = NULL;
    dt_status st = DT_OK;
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (sb.st_size < 8) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: too short for a safetensors file (%lld bytes)", path,
                     (long long)sb.st_size);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        goto fail;
    }
    f->map = map;
    f->base = map;
    f->size = (size_t)sb.st_size;
    DT_CHECK_GOTO(st_parse(ctx, path, f));
    close(fd);
    *out = f;
    return DT_OK;
fail:
    if (fd >= 0) close(fd);
    dt_st_close(f);
    return st;
}

dt_status dt_st_open_mem(dt_ctx *ctx, const char *name, const void *data, size_t size,
                         dt_st_file **out) {
    *out = NULL;
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f) return dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", name);
    f->base = data;
    f->size = size;
    dt_status st = st_parse(ctx, name, f);
    if (st != DT_OK) {
        dt_st_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

int dt_st_count(const dt_st_file *f) { return f->n; }

const dt_st_tensor *dt_st_at(const dt_st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

const char *dt_st_meta(const dt_st_file *f, const char *key) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
    const cJSON *v = m ? cJSON_GetObjectItemCaseSensitive(m, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
