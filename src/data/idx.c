/* IDX image files (the MNIST layout), plain or gzip'd, and their labels files: one shard of
 * an image dataset (see shard.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/shard.h"
#include "data/shard_impl.h"

typedef unsigned long long ull; /* for printf of 64-bit counts */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

#define IDX_IMAGES_MAGIC 0x00000803u /* uint8 data, 3 dimensions (N, H, W) */
#define IDX_LABELS_MAGIC 0x00000801u /* uint8 data, 1 dimension (N) */
#define IDX_IMAGES_NAME "images-idx3"
#define IDX_LABELS_NAME "labels-idx1"

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int is_gzip(const unsigned char *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Header size and total size an IDX header describes; 0 if the sizes overflow. */
static uint64_t idx_want(const uint32_t *dims, int ndim) {
    uint64_t want = 4 + 4 * (uint64_t)ndim, prod = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(prod, (uint64_t)dims[i], &prod)) return 0;
    if (__builtin_add_overflow(want, prod, &want) || want >= SIZE_MAX) return 0;
    return want;
}

/* zlib's message for the stream's error, NULL if none. gzerror prefixes it with the path,
 * which our messages already name. */
static const char *gz_why(gzFile gz, const char *path) {
    int err;
    const char *msg = gzerror(gz, &err);
    if (err == Z_OK) return NULL;
    if (!msg || !*msg) return "unknown zlib error";
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

/* Inflates the rest of a gzip IDX file whose header (hdr bytes) is already in `head`: the
 * buffer grows as data arrives, so a damaged header that claims terabytes allocates only
 * what the stream holds. *b takes the buffer (want bytes, header included).
 * The reads ask for one byte more than the header says: a read that stops exactly at the
 * last data byte leaves the gzip trailer unchecked, and zlib's next gzread then reports a
 * clean end even when the trailer is cut short. */
static dt_status gz_read_rest(dt_ctx *ctx, gzFile gz, const char *path, const char *who,
                              const unsigned char *head, size_t hdr, size_t want, blob *b) {
    size_t lim = want + 1, step = (size_t)16 << 20;
    size_t cap = lim < step ? lim : step, got = hdr;
    unsigned char *buf = malloc(cap);
    if (!buf) return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate %llu bytes", who, (ull)cap);
    memcpy(buf, head, hdr);
    while (got < lim) {
        if (got == cap) {
            size_t ncap = cap > lim / 2 ? lim : 2 * cap;
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate %llu bytes", who, (ull)ncap);
            }
            buf = nb;
            cap = ncap;
        }
        size_t ask = cap - got < ((size_t)1 << 30) ? cap - got : ((size_t)1 << 30);
        int r = gzread(gz, buf + got, (unsigned)ask);
        if (r <= 0) break;
        got += (size_t)r;
    }
    const char *why = gz_why(gz, path);
    dt_status st = DT_OK;
    if (why)
        st = dt_fail(ctx, DT_ERR_FORMAT,
                     "%s: gzip data damaged or truncated after %llu of the %llu bytes the IDX "
                     "header says (zlib: %s)",
                     who, (ull)(got < want ? got : want), (ull)want, why);
    else if (got > want)
        st = dt_fail(ctx, DT_ERR_FORMAT,
                     "%s: size mismatch: the IDX header says %llu bytes but the file "
                     "decompresses to more (extra bytes)",
                     who, (ull)want);
    else if (got < want)
        st = dt_fail(ctx, DT_ERR_FORMAT,
                     "%s: size mismatch: the IDX header says %llu bytes but the file "
                     "decompresses to %llu (truncated)",
                     who, (ull)want, (ull)got);
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    b->p = buf;
    b->n = want;
    b->mapped = 0;
    return DT_OK;
}

/* Loads one IDX file (plain or gzip) whose magic must be `magic` (uint8, ndim = its low
 * byte) into *b and its dimensions into dims; checks every size against the header. */
static dt_status idx_load(dt_ctx *ctx, const char *path, const char *who, uint32_t magic,
                          blob *b, uint32_t *dims) {
    dt_status st = DT_OK;
    int ndim = (int)(magic & 0xff);
    size_t hdr = 4 + 4 * (size_t)ndim;
    const char *what = ndim == 3 ? "images (N, H, W)" : "labels (N)";
    unsigned char head[16];
    blob m = {0};
    gzFile gz = NULL;
    DT_CHECK(dt_shard_file_map(ctx, path, who, &m));
    int gzipped = is_gzip(m.p, m.n);
    size_t have;
    if (gzipped) {
        dt_shard_blob_free(&m);
        if (!(gz = gzopen(path, "rb"))) {
            st = dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", who, strerror(errno));
            goto fail;
        }
        gzbuffer(gz, 1 << 17);
        int r = gzread(gz, head, (unsigned)hdr);
        have = r > 0 ? (size_t)r : 0;
        const char *why = gz_why(gz, path);
        if (why && have < hdr) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: gzip data damaged or truncated (zlib: %s)", who, why);
            goto fail;
        }
    } else {
        have = m.n < hdr ? m.n : hdr;
        memcpy(head, m.p, have);
    }
    if (have >= 4 && be32(head) != magic) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: bad magic 0x%08x (expected 0x%08x: IDX uint8 %s)", who,
                     be32(head), magic, what);
        goto fail;
    }
    if (have < hdr) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: truncated: %llu bytes%s, shorter than the %llu-byte IDX header",
                     who, (ull)have, gzipped ? " after decompression" : "", (ull)hdr);
        goto fail;
    }
    for (int i = 0; i < ndim; i++) dims[i] = be32(head + 4 + 4 * i);
    if (dims[0] == 0) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: empty: the IDX header says 0 %s", who,
                     ndim == 3 ? "images" : "labels");
        goto fail;
    }
    if (ndim == 3 && (dims[1] == 0 || dims[2] == 0 || (uint64_t)dims[1] * dims[2] >= INT_MAX)) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: image size %ux%u in the IDX header is not usable "
                     "(each side >= 1, at most %d pixels)", who, dims[1], dims[2], INT_MAX - 1);
        goto fail;
    }
    uint64_t want = idx_want(dims, ndim);
    if (want == 0) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: the IDX header's dimensions overflow a size", who);
        goto fail;
    }
    if (gzipped) {
        DT_CHECK_GOTO(gz_read_rest(ctx, gz, path, who, head, hdr, (size_t)want, b));
    } else {
        if (m.n != want) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: size mismatch: the IDX header says %u %s (%llu bytes with the "
                         "header) but the file has %llu bytes (%s)",
                         who, dims[0], ndim == 3 ? "images" : "labels", (ull)want, (ull)m.n,
                         m.n < want ? "truncated" : "extra bytes");
            goto fail;
        }
        *b = m;
        memset(&m, 0, sizeof m);
    }
fail:
    if (gz) gzclose(gz);
    dt_shard_blob_free(&m);
    return st;
}

/* auto: an IDX images file is named *idx3-ubyte*, or starts (after gunzip) with the IDX
 * images magic. A plain file named *.bin must also have the size its header says: a raw
 * uint16 shard whose first tokens happen to be 0, 776 stays raw. */
int dt_idx_detect(const char *path) {
    if (strstr(base_name(path), "idx3-ubyte")) return 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    unsigned char h[16];
    ssize_t n = pread(fd, h, sizeof h, 0);
    int yes = 0;
    if (n >= 4 && be32(h) == IDX_IMAGES_MAGIC) {
        struct stat sb;
        uint32_t dims[3] = {n >= 16 ? be32(h + 4) : 0, n >= 16 ? be32(h + 8) : 0, n >= 16 ? be32(h + 12) : 0};
        yes = !ends_with(path, ".bin") ||
              (n == 16 && fstat(fd, &sb) == 0 && idx_want(dims, 3) == (uint64_t)sb.st_size);
    } else if (n >= 2 && is_gzip(h, (size_t)n)) {
        gzFile gz = gzdopen(fd, "rb");
        if (gz) {
            fd = -1; /* gzclose closes it */
            yes = gzread(gz, h, 4) == 4 && be32(h) == IDX_IMAGES_MAGIC;
            gzclose(gz);
        }
    }
    if (fd >= 0) close(fd);
    return yes;
}

/* An IDX images file and its labels file (the name with images-idx3 -> labels-idx1). */
dt_status dt_idx_open(dt_ctx *ctx, dt_shard *sh) {
    dt_status st = DT_OK;
    char *who = NULL;
    uint32_t dims[3], ldims[1];
    DT_CHECK(idx_load(ctx, sh->path, sh->path, IDX_IMAGES_MAGIC, &sh->img, dims));
    const char *base = base_name(sh->path);
    const char *at = strstr(base, IDX_IMAGES_NAME);
    if (!at)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "%s: IDX images file without '" IDX_IMAGES_NAME "' in its name, so its "
                       "labels file (the same name with '" IDX_LABELS_NAME "') cannot be found",
                       sh->path);
    size_t len = strlen(sh->path), off = (size_t)(at - sh->path);
    if (!(sh->labels_path = malloc(len + 1)))
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate the labels path", sh->path);
    memcpy(sh->labels_path, sh->path, len + 1);
    memcpy(sh->labels_path + off, IDX_LABELS_NAME, strlen(IDX_LABELS_NAME));

    if (asprintf(&who, "%s: labels file %s", sh->path, sh->labels_path) < 0) {
        who = NULL;
        return dt_fail(ctx, DT_ERR_NOMEM, "%s: cannot allocate the labels path", sh->path);
    }
    DT_CHECK_GOTO(idx_load(ctx, sh->labels_path, who, IDX_LABELS_MAGIC, &sh->lab, ldims));
    if (ldims[0] != dims[0]) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: %u images but its labels file %s has %u labels",
                     sh->path, dims[0], sh->labels_path, ldims[0]);
        goto fail;
    }
    sh->h = (int)dims[1];
    sh->w = (int)dims[2];
    sh->rec_len = sh->h * sh->w + 1;
    sh->n_rec = dims[0];
    sh->n = sh->n_rec * (uint64_t)sh->rec_len;
    sh->width = 1;
    sh->raw = 0;
    sh->pix = sh->img.p + 16;
    sh->labels = sh->lab.p + 8;
fail:
    free(who);
    return st;
}

