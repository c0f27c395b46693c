#include "data/shard.h"
#include "data/shard_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tokens are read straight from the mapping; a big-endian host would need byte swaps. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shard files are little-endian");

typedef unsigned long long ull; /* for printf of 64-bit counts */

/* ---- spec -> ordered list of paths ---- */

typedef struct path_list {
    char **v;
    int n, cap;
} path_list;

static void path_list_free(path_list *pl) {
    for (int i = 0; i < pl->n; i++) free(pl->v[i]);
    free(pl->v);
    memset(pl, 0, sizeof *pl);
}

static dt_status path_list_add(dt_ctx *ctx, path_list *pl, const char *path) {
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 16;
        char **v = realloc(pl->v, (size_t)cap * sizeof *v);
        if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the list of data files");
        pl->v = v;
        pl->cap = cap;
    }
    if (!(pl->v[pl->n] = strdup(path)))
        return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the list of data files");
    pl->n++;
    return DT_OK;
}

/* Byte-wise, so the shard order does not depend on the locale glob(3) would collate with. */
static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file listed twice would be sampled twice per epoch, breaking exactly-once. */
static dt_status check_duplicates(dt_ctx *ctx, const path_list *pl, const char *spec) {
    char **sorted = malloc((size_t)pl->n * sizeof *sorted);
    if (!sorted) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the list of data files");
    memcpy(sorted, pl->v, (size_t)pl->n * sizeof *sorted);
    qsort(sorted, (size_t)pl->n, sizeof *sorted, cmp_str);
    dt_status st = DT_OK;
    for (int i = 1; i < pl->n; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s: listed twice in data spec '%s'", sorted[i], spec);
            break;
        }
    free(sorted);
    return st;
}

static dt_status expand_spec(dt_ctx *ctx, const char *spec, path_list *pl) {
    dt_status st = DT_OK;
    glob_t g;
    int have_glob = 0;
    char *copy = strdup(spec), *save = NULL;
    if (!copy) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the list of data files");
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ') item++;
        size_t len = strlen(item);
        while (len > 0 && item[len - 1] == ' ') item[--len] = 0;
        if (len == 0) continue;
        if (!strpbrk(item, "*?[")) {
            /* A plain path: a missing file is reported by open() with its errno. */
            DT_CHECK_GOTO(path_list_add(ctx, pl, item));
            continue;
        }
        int rc = glob(item, 0, NULL, &g);
        have_glob = 1;
        if (rc == GLOB_NOMATCH) {
            st = dt_fail(ctx, DT_ERR_IO, "data pattern '%s': no file matches", item);
            goto fail;
        }
        if (rc != 0) {
            st = dt_fail(ctx, rc == GLOB_NOSPACE ? DT_ERR_NOMEM : DT_ERR_IO,
                         "data pattern '%s': %s", item,
                         rc == GLOB_NOSPACE ? "out of memory while matching" : "cannot read a directory");
            goto fail;
        }
        int first = pl->n;
        for (size_t i = 0; i < g.gl_pathc; i++) DT_CHECK_GOTO(path_list_add(ctx, pl, g.gl_pathv[i]));
        qsort(pl->v + first, (size_t)(pl->n - first), sizeof *pl->v, cmp_str);
        globfree(&g);
        have_glob = 0;
    }
    if (pl->n == 0) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "data spec '%s' names no file", spec);
        goto fail;
    }
    DT_CHECK_GOTO(check_duplicates(ctx, pl, spec));
fail:
    if (have_glob) globfree(&g);
    free(copy);
    return st;
}

/* ---- one shard ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Version and token count consistent with the size: an llm.c shard even if the magic is not. */
static int looks_like_llmc(const int32_t *h, uint64_t size) {
    int w = h[1] == 1 ? 2 : h[1] == 7 ? 4 : 0;
    return w && size >= DT_LLMC_HEADER_BYTES &&
           size == DT_LLMC_HEADER_BYTES + (uint64_t)(uint32_t)h[2] * (uint64_t)w;
}

#define TEXT_SAMPLE ((uint64_t)1 << 16) /* bytes looked at by looks_like_text */

/* 1 when the file's first TEXT_SAMPLE bytes read as text: valid UTF-8 (a sequence cut by the
 * sample's end allowed), no NUL and no control byte but tab, newline, carriage return and
 * form feed; *lines: the newlines among them. Token files fail this within a few bytes: a
 * uint16 id below 8192 has a control byte as its high byte, and a stream of larger ids
 * whose every byte is printable is not what a tokenizer writes. */
static int looks_like_text(const unsigned char *p, uint64_t size, uint64_t *lines) {
    uint64_t n = size < TEXT_SAMPLE ? size : TEXT_SAMPLE;
    *lines = 0;
    for (uint64_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c < 0x80) {
            if (c == '\n')
                ++*lines;
            else if (c == 0x7f || (c < 0x20 && c != '\t' && c != '\r' && c != '\f'))
                return 0;
            i++;
            continue;
        }
        int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len) return 0;
        for (int k = 1; k < len; k++) {
            if (i + (uint64_t)k >= n) return n < size; /* cut by the sample's end: text so far */
            if ((p[i + (uint64_t)k] & 0xc0) != 0x80) return 0;
        }
        i += (uint64_t)len;
    }
    return 1;
}

static dt_status refuse_text(dt_ctx *ctx, const char *path, uint64_t size, uint64_t lines) {
    return dt_fail(ctx, DT_ERR_FORMAT,
                   "%s: this is a text file, not tokens (%s%llu bytes of printable UTF-8, %llu line%s); "
                   "tokenize it first: dtrain prepare --out PREFIX %s, then train on PREFIX_train_*.bin",
                   path, size > TEXT_SAMPLE ? "the first " : "", (ull)(size < TEXT_SAMPLE ? size : TEXT_SAMPLE),
                   (ull)lines, lines == 1 ? "" : "s", path);
}

static dt_status shard_parse(dt_ctx *ctx, dt_shard *sh, shard_format fmt) {
    const char *path = sh->path;
    const unsigned char *p = sh->map;
    uint64_t size = sh->map_bytes;
    int32_t h[3] = {0, 0, 0};
    memcpy(h, p, size < sizeof h ? (size_t)size : sizeof h);
    int has_magic = size >= 4 && h[0] == DT_LLMC_MAGIC;
    /* A text file (the corpus itself, not its tokens) read as uint16 would train on pairs of
     * characters without a word: refused under any token format. */
    uint64_t lines;
    if (!has_magic && looks_like_text(p, size, &lines)) return refuse_text(ctx, path, size, lines);
    /* data.format=raw16 on an llm.c shard would read its header as 512 tokens. */
    if (fmt == FMT_RAW16 && has_magic && size >= DT_LLMC_HEADER_BYTES && (h[1] == 1 || h[1] == 7))
        return dt_fail(ctx, DT_ERR_FORMAT, "%s has an llm.c shard header (magic %d, version %d); use "
                       "data.format=llmc (or auto), not raw16", path, DT_LLMC_MAGIC, h[1]);

    if (fmt == FMT_AUTO) {
        if (has_magic) {
            fmt = FMT_LLMC;
        } else if (looks_like_llmc(h, size)) {
            return dt_fail(ctx, DT_ERR_FORMAT,
                           "%s: bad magic %d (expected %d); the rest of the header is an llm.c "
                           "header, so it is not read as raw uint16",
                           path, h[0], DT_LLMC_MAGIC);
        } else if (!ends_with(path, ".bin")) {
            return dt_fail(ctx, DT_ERR_FORMAT,
                           "%s: bad magic %d (expected %d) and the name does not end in .bin, so "
                           "it is not read as raw uint16 either (format raw16 forces that)",
                           path, h[0], DT_LLMC_MAGIC);
        } else if (size % 2) {
            return dt_fail(ctx, DT_ERR_FORMAT,
                           "%s: bad magic %d (expected %d) and an odd size (%llu bytes), so not "
                           "raw uint16 either",
                           path, h[0], DT_LLMC_MAGIC, (ull)size);
        } else {
            fmt = FMT_RAW16;
        }
    }

    if (fmt == FMT_RAW16) {
        if (size % 2)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: raw uint16 file has an odd size (%llu bytes)",
                           path, (ull)size);
        sh->raw = 1;
        sh->width = 2;
        sh->tok = p;
        sh->n = size / 2;
        return DT_OK;
    }

    if (!has_magic) {
        if (size < 4)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: %llu bytes, shorter than the %d-byte llm.c header",
                           path, (ull)size, DT_LLMC_HEADER_BYTES);
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: bad magic %d (expected %d for an llm.c shard)",
                       path, h[0], DT_LLMC_MAGIC);
    }
    if (size < DT_LLMC_HEADER_BYTES)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: %llu bytes, shorter than the %d-byte llm.c header",
                       path, (ull)size, DT_LLMC_HEADER_BYTES);
    if (h[1] != 1 && h[1] != 7)
        return dt_fail(ctx, DT_ERR_FORMAT,
                       "%s: unknown llm.c version %d (1 = uint16 tokens, 7 = uint32 tokens)", path,
                       h[1]);
    int width = h[1] == 1 ? 2 : 4;
    uint64_t n = (uint32_t)h[2]; /* llm.c writes an int32; counts up to 2^32-1 are accepted */
    if (n == 0)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: empty shard (the header says 0 tokens)", path);
    uint64_t want = DT_LLMC_HEADER_BYTES + n * (uint64_t)width;
    if (size != want) {
        char why[64];
        if (size < want)
            snprintf(why, sizeof why, "truncated");
        else
            snprintf(why, sizeof why, "%llu extra bytes", (ull)(size - want));
        return dt_fail(ctx, DT_ERR_FORMAT,
                       "%s: size mismatch: the header says %llu tokens (%llu bytes with the "
                       "header) but the file has %llu bytes (%s)",
                       path, (ull)n, (ull)want, (ull)size, why);
    }
    sh->raw = 0;
    sh->width = width;
    sh->tok = p + DT_LLMC_HEADER_BYTES;
    sh->n = n;
    return DT_OK;
}

/* Maps `path` read-only into *b. Messages start with `who` (the path, or "images: labels
 * file labels" for a labels file, so that both are named). */
dt_status dt_shard_file_map(dt_ctx *ctx, const char *path, const char *who, blob *b) {
    dt_status st = DT_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dt_fail(ctx, DT_ERR_IO, "%s: cannot open: %s", who, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot stat: %s", who, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot read: not a regular file", who);
        goto fail;
    }
    if (sb.st_size == 0) {
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: empty file (0 bytes, 0 tokens)", who);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        st = dt_fail(ctx, DT_ERR_IO, "%s: cannot mmap %llu bytes: %s", who, (ull)sb.st_size,
                     strerror(errno));
        goto fail;
    }
    b->p = map;
    b->n = (size_t)sb.st_size;
    b->mapped = 1;
fail:
    close(fd); /* the mapping keeps the file */
    return st;
}

void dt_shard_blob_free(blob *b) {
    if (b->mapped)
        munmap(b->p, b->n);
    else
        free(b->p);
    memset(b, 0, sizeof *b);
}

/* Parses sh->path as `fmt`. Mappings and buffers, once made, are released by the dataset's
 * close. */
static dt_status shard_open(dt_ctx *ctx, dt_shard *sh, shard_format fmt) {
    if (fmt == FMT_AUTO && dt_idx_detect(sh->path)) fmt = FMT_IDX;
    if (fmt == FMT_IDX) return dt_idx_open(ctx, sh);
    blob m = {0};
    DT_CHECK(dt_shard_file_map(ctx, sh->path, sh->path, &m));
    sh->map = m.p;
    sh->map_bytes = m.n;
    return shard_parse(ctx, sh, fmt);
}

/* ---- token validation ---- */

#define SCAN_CHUNK ((uint64_t)1 << 22) /* tokens per parallel work item */
#define SCAN_NONE UINT64_MAX

typedef struct scan_item {
    int shard;
    uint64_t start, len;
} scan_item;

/* Index of the first token >= vocab in [start, start+len), or SCAN_NONE. A max pass first:
 * it streams without branches, and the search runs only on a chunk known to be bad. */
static uint64_t scan_chunk(const dt_shard *sh, uint64_t start, uint64_t len, uint32_t vocab) {
    uint32_t mx = 0;
    if (sh->width == 2) {
        const uint16_t *t = (const uint16_t *)(const void *)sh->tok + start;
        for (uint64_t i = 0; i < len; i++) mx = t[i] > mx ? t[i] : mx;
        if (mx < vocab) return SCAN_NONE;
        for (uint64_t i = 0; i < len; i++)
            if (t[i] >= vocab) return start + i;
    } else {
        const uint32_t *t = (const uint32_t *)(const void *)sh->tok + start;
        for (uint64_t i = 0; i < len; i++) mx = t[i] > mx ? t[i] : mx;
        if (mx < vocab) return SCAN_NONE;
        for (uint64_t i = 0; i < len; i++)
            if (t[i] >= vocab) return start + i;
    }
    return SCAN_NONE;
}

static dt_status scan_tokens(dt_ctx *ctx, const dt_dataset *ds) {
    dt_status st = DT_OK;
    uint32_t vocab = (uint32_t)ds->vocab;
    long n_items = 0;
    for (int s = 0; s < ds->n_shards; s++) {
        const dt_shard *sh = &ds->shards[s];
        if (sh->width == 2 && vocab > 0xffff) continue; /* every uint16 is a valid token */
        n_items += (long)((sh->n + SCAN_CHUNK - 1) / SCAN_CHUNK);
    }
    if (n_items == 0) return DT_OK;
    scan_item *items = malloc((size_t)n_items * sizeof *items);
    uint64_t *bad = malloc((size_t)n_items * sizeof *bad);
    if (!items || !bad) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the token scan of '%s'", ds->spec);
        goto fail;
    }
    long j = 0;
    for (int s = 0; s < ds->n_shards; s++) {
        const dt_shard *sh = &ds->shards[s];
        if (sh->width == 2 && vocab > 0xffff) continue;
        for (uint64_t a = 0; a < sh->n; a += SCAN_CHUNK, j++) {
            items[j].shard = s;
            items[j].start = a;
            items[j].len = sh->n - a < SCAN_CHUNK ? sh->n - a : SCAN_CHUNK;
        }
    }
    /* Each item writes its own slot; the first bad token is then picked in file order, so
     * the message does not depend on thread timing. */
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < n_items; i++)
        bad[i] = scan_chunk(&ds->shards[items[i].shard], items[i].start, items[i].len, vocab);
    for (long i = 0; i < n_items; i++) {
        if (bad[i] == SCAN_NONE) continue;
        const dt_shard *sh = &ds->shards[items[i].shard];
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: token %u at index %llu is >= vocab size %d%s",
                     sh->path, (unsigned)dt_dataset_token(ds, items[i].shard, bad[i]),
                     (ull)bad[i], ds->vocab,
                     sh->raw ? " (the file has no llm.c header and is read as raw uint16: is it a token file "
                               "written by dtrain prepare, for this model's vocabulary?)" : "");
        break;
    }
fail:
    free(items);
    free(bad);
    return st;
}

/* Image datasets: every pixel and label is a token, so each must be < vocab; with
 * vocab >= 256 every uint8 is. Sequential: images are small next to token corpora. */
static dt_status scan_records(dt_ctx *ctx, const dt_dataset *ds) {
    if (ds->vocab >= 256) return DT_OK;
    for (int s = 0; s < ds->n_shards; s++) {
        const dt_shard *sh = &ds->shards[s];
        size_t hw = (size_t)sh->rec_len - 1;
        for (uint64_t r = 0; r < sh->n_rec; r++) {
            const unsigned char *p = sh->pix + r * hw;
            for (size_t i = 0; i < hw; i++)
                if (p[i] >= ds->vocab)
                    return dt_fail(ctx, DT_ERR_FORMAT,
                                   "%s: pixel value %u (image %llu, pixel %llu) is >= vocab size "
                                   "%d (pixels are 0..255: an image dataset wants vocab >= 256)",
                                   sh->path, p[i], (ull)r, (ull)i, ds->vocab);
            if (sh->labels[r] >= ds->vocab)
                return dt_fail(ctx, DT_ERR_FORMAT,
                               "%s: labels file %s: label %u at index %llu is >= vocab size %d",
                               sh->path, sh->labels_path, sh->labels[r], (ull)r, ds->vocab);
        }
    }
    return DT_OK;
}

/* ---- loss masks (shard.h) ---- */

/* Maps PATH.mask when it exists and checks it against the shard: 0 = no mask file. */
static dt_status mask_open(dt_ctx *ctx, dt_shard *sh, int *found) {
    char path[4200];
    snprintf(path, sizeof path, "%s.mask", sh->path);
    *found = access(path, F_OK) == 0;
    if (!*found) return DT_OK;
    DT_CHECK(dt_shard_file_map(ctx, path, path, &sh->maskb));
    const unsigned char *p = sh->maskb.p;
    int32_t hdr[3] = {0, 0, 0};
    if (sh->maskb.n >= DT_LLMC_HEADER_BYTES) memcpy(hdr, p, sizeof hdr);
    if (sh->maskb.n < DT_LLMC_HEADER_BYTES || hdr[0] != DT_MASK_MAGIC)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a loss mask (bad magic or shorter than its %d-byte header)", path,
                       DT_LLMC_HEADER_BYTES);
    if (hdr[1] != 1) return dt_fail(ctx, DT_ERR_FORMAT, "%s: loss mask version %d is not supported (1)", path, hdr[1]);
    if ((uint64_t)(uint32_t)hdr[2] != sh->n || sh->maskb.n != DT_LLMC_HEADER_BYTES + sh->n)
        return dt_fail(ctx, DT_ERR_FORMAT, "%s: holds %llu mask bytes (header says %d) for the %llu tokens of %s", path,
                       (ull)(sh->maskb.n - DT_LLMC_HEADER_BYTES), hdr[2], (ull)sh->n, sh->path);
    sh->mask = p + DT_LLMC_HEADER_BYTES;
    for (uint64_t i = 0; i < sh->n; i++)
        if (sh->mask[i] > 1)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: byte %llu is %u, not 0 or 1", path, (ull)i, sh->mask[i]);
    return DT_OK;
}

/* ---- the dataset ---- */

dt_status dt_dataset_open(dt_ctx *ctx, dt_dataset **out, const char *spec, const char *format,
                          int vocab) {
    dt_status st = DT_OK;
    path_list pl = {0};
    dt_dataset *ds = NULL;
    *out = NULL;
    if (!spec || !*spec)
        return dt_fail(ctx, DT_ERR_CONFIG, "data spec is empty: name a shard file, glob or comma list");
    shard_format fmt;
    if (!format || strcmp(format, "auto") == 0)
        fmt = FMT_AUTO;
    else if (strcmp(format, "llmc") == 0)
        fmt = FMT_LLMC;
    else if (strcmp(format, "raw16") == 0)
        fmt = FMT_RAW16;
    else if (strcmp(format, "idx") == 0)
        fmt = FMT_IDX;
    else
        return dt_fail(ctx, DT_ERR_CONFIG, "data format '%s' is unknown (auto, llmc, raw16 or idx)",
                       format);
    if (vocab <= 0) return dt_fail(ctx, DT_ERR_CONFIG, "vocab size must be > 0 (got %d)", vocab);

    if (!(ds = calloc(1, sizeof *ds)) || !(ds->spec = strdup(spec))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate dataset '%s'", spec);
        goto fail;
    }
    ds->vocab = vocab;
    DT_CHECK_GOTO(expand_spec(ctx, spec, &pl));
    if (!(ds->shards = calloc((size_t)pl.n, sizeof *ds->shards))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate dataset '%s'", spec);
        goto fail;
    }
    ds->n_shards = pl.n;
    for (int i = 0; i < pl.n; i++) { /* the dataset takes the path strings */
        ds->shards[i].path = pl.v[i];
        pl.v[i] = NULL;
    }
    for (int i = 0; i < ds->n_shards; i++) {
        const dt_shard *sh = &ds->shards[i], *first = &ds->shards[0];
        DT_CHECK_GOTO(shard_open(ctx, &ds->shards[i], fmt));
        if (i > 0 && (sh->rec_len > 0) != (first->rec_len > 0)) {
            st = dt_fail(ctx, DT_ERR_CONFIG,
                         "%s: %s, but %s is %s; a dataset holds one kind of file",
                         sh->path, sh->rec_len ? "an IDX images file" : "a token shard",
                         first->path, first->rec_len ? "an IDX images file" : "a token shard");
            goto fail;
        }
        if (i > 0 && (sh->h != first->h || sh->w != first->w)) {
            st = dt_fail(ctx, DT_ERR_FORMAT,
                         "%s: %dx%d images, but %s has %dx%d; a dataset holds one image size",
                         sh->path, sh->h, sh->w, first->path, first->h, first->w);
            goto fail;
        }
        ds->n_tokens += sh->n;
        ds->n_rec += sh->n_rec;
    }
    ds->rec_len = ds->shards[0].rec_len;
    ds->h = ds->shards[0].h;
    ds->w = ds->shards[0].w;
    for (int i = 0; i < ds->n_shards && !ds->rec_len; i++) {
        int found;
        DT_CHECK_GOTO(mask_open(ctx, &ds->shards[i], &found));
        if (i > 0 && found != ds->has_mask) {
            const dt_shard *with = &ds->shards[found ? i : 0], *without = &ds->shards[found ? 0 : i];
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s has no loss mask (%s.mask) but %s has one: give every shard its mask or none",
                         without->path, without->path, with->path);
            goto fail;
        }
        ds->has_mask = found;
    }
    DT_CHECK_GOTO(ds->rec_len ? scan_records(ctx, ds) : scan_tokens(ctx, ds));
    path_list_free(&pl);
    *out = ds;
    return DT_OK;
fail:
    path_list_free(&pl);
    dt_dataset_close(ds);
    return st;
}

void dt_dataset_close(dt_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->n_shards; i++) {
        if (ds->shards[i].map) munmap(ds->shards[i].map, ds->shards[i].map_bytes);
        dt_shard_blob_free(&ds->shards[i].img);
        dt_shard_blob_free(&ds->shards[i].lab);
        dt_shard_blob_free(&ds->shards[i].maskb);
        free(ds->shards[i].labels_path);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    free(ds->spec);
    free(ds);
}

dt_status dt_dataset_check_seq_len(dt_ctx *ctx, const dt_dataset *ds, int T) {
    if (ds->rec_len && T != ds->rec_len - 1)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "'%s' holds %dx%d images: training.seq_len must be %d (the pixels of one "
                       "image; its label is the target), got %d",
                       ds->spec, ds->h, ds->w, ds->rec_len - 1, T);
    if (T <= 0) return dt_fail(ctx, DT_ERR_CONFIG, "sequence length T must be > 0 (got %d)", T);
    for (int i = 0; i < ds->n_shards; i++)
        if (ds->shards[i].n < (uint64_t)T + 1)
            return dt_fail(ctx, DT_ERR_FORMAT,
                           "%s: %llu tokens, too few for one sample of T=%d (needs at least %llu "
                           "tokens)",
                           ds->shards[i].path, (ull)ds->shards[i].n, T, (ull)T + 1);
    return DT_OK;
}

int dt_dataset_num_shards(const dt_dataset *ds) { return ds->n_shards; }
uint64_t dt_dataset_num_tokens(const dt_dataset *ds) { return ds->n_tokens; }
int dt_dataset_vocab(const dt_dataset *ds) { return ds->vocab; }
const char *dt_dataset_spec(const dt_dataset *ds) { return ds->spec; }
int dt_dataset_record_len(const dt_dataset *ds) { return ds->rec_len; }
uint64_t dt_dataset_num_records(const dt_dataset *ds) { return ds->n_rec; }

int dt_dataset_image_hw(const dt_dataset *ds, int *h, int *w) {
    *h = ds->h;
    *w = ds->w;
    return ds->rec_len > 0;
}

dt_status dt_dataset_check_labels(dt_ctx *ctx, const dt_dataset *ds, int n_classes) {
    if (!ds->rec_len)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "'%s' is a token dataset: class labels exist only in image datasets "
                       "(data.format idx)",
                       ds->spec);
    if (n_classes <= 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "the number of classes must be > 0 (got %d)", n_classes);
    for (int s = 0; s < ds->n_shards; s++) {
        const dt_shard *sh = &ds->shards[s];
        for (uint64_t i = 0; i < sh->n_rec; i++)
            if (sh->labels[i] >= n_classes)
                return dt_fail(ctx, DT_ERR_FORMAT,
                               "%s: labels file %s: label %u at index %llu is >= n_classes %d",
                               sh->path, sh->labels_path, sh->labels[i], (ull)i, n_classes);
    }
    return DT_OK;
}

static const dt_shard *shard_at(const dt_dataset *ds, int shard) {
    DT_ASSERT(shard >= 0 && shard < ds->n_shards);
    return &ds->shards[shard];
}

uint64_t dt_dataset_shard_tokens(const dt_dataset *ds, int shard) { return shard_at(ds, shard)->n; }
const char *dt_dataset_shard_path(const dt_dataset *ds, int shard) { return shard_at(ds, shard)->path; }
int dt_dataset_shard_width(const dt_dataset *ds, int shard) { return shard_at(ds, shard)->width; }
int dt_dataset_shard_is_raw(const dt_dataset *ds, int shard) { return shard_at(ds, shard)->raw; }
uint64_t dt_dataset_shard_records(const dt_dataset *ds, int shard) { return shard_at(ds, shard)->n_rec; }
const char *dt_dataset_shard_labels_path(const dt_dataset *ds, int shard) {
    return shard_at(ds, shard)->labels_path;
}

int dt_dataset_label(const dt_dataset *ds, int shard, uint64_t rec) {
    const dt_shard *sh = shard_at(ds, shard);
    DT_ASSERT(rec < sh->n_rec);
    return sh->labels[rec];
}

int32_t dt_dataset_token(const dt_dataset *ds, int shard, uint64_t i) {
    int32_t v;
    dt_dataset_read(ds, shard, i, 1, &v);
    return v;
}

void dt_dataset_read(const dt_dataset *ds, int shard, uint64_t start, size_t n, int32_t *dst) {
    const dt_shard *sh = shard_at(ds, shard);
    DT_ASSERT(start <= sh->n && n <= sh->n - start);
    if (sh->rec_len) { /* record r is its h*w pixels, then its label */
        uint64_t L = (uint64_t)sh->rec_len, rec = start / L, j = start % L;
        size_t hw = (size_t)L - 1;
        while (n > 0) {
            if (j < hw) {
                size_t k = hw - (size_t)j < n ? hw - (size_t)j : n;
                const unsigned char *p = sh->pix + rec * hw + j;
                for (size_t i = 0; i < k; i++) dst[i] = p[i];
                dst += k;
                n -= k;
                j += k;
            } else {
                *dst++ = sh->labels[rec++];
                n--;
                j = 0;
            }
        }
    } else if (sh->width == 2) {
        const uint16_t *t = (const uint16_t *)(const void *)sh->tok + start;
        for (size_t i = 0; i < n; i++) dst[i] = t[i];
    } else {
        const uint32_t *t = (const uint32_t *)(const void *)sh->tok + start;
        for (size_t i = 0; i < n; i++) dst[i] = (int32_t)t[i];
    }
}

int dt_dataset_has_loss_mask(const dt_dataset *ds) { return ds->has_mask; }

void dt_dataset_read_mask(const dt_dataset *ds, int shard, uint64_t start, size_t n, uint8_t *dst) {
    const dt_shard *sh = shard_at(ds, shard);
    DT_ASSERT(start <= sh->n && n <= sh->n - start);
    if (sh->mask) memcpy(dst, sh->mask + start, n);
    else memset(dst, 1, n);
}
