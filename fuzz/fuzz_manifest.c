/* The checkpoint manifest parser (dt_manifest_parse) on arbitrary text. A manifest ends
 * with its own checksum, which random mutations would always break: when bit 0 of byte 0 is
 * set, the harness appends a correct trailer (, "manifest_xxh3": "<xxh3 of the text>"}\n)
 * to the rest of the input, so the parser behind the check is fuzzed too. If it accepts the
 * input, every file name must be a plain name (no '/', not "." or ".."), unique, found by
 * dt_manifest_find, and every size below 2^62. */
#include <inttypes.h>
#include <string.h>

#include "ckpt/ckpt_io.h"
#include "ckpt/manifest.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dt_ctx ctx;
    static int init;
    if (!init) dt_ctx_init(&ctx), init = 1;
    ctx.err[0] = 0;
    if (size < 1) return 0;
    size_t n = size - 1, len = n;
    char *text = malloc(n + 64);
    FZ_CHECK(text != NULL);
    memcpy(text, data + 1, n);
    if (data[0] & 1)
        len += (size_t)snprintf(text + n, 64, ", \"manifest_xxh3\": \"%016" PRIx64 "\"}\n",
                                dt_xxh3(text, n));
    dt_manifest m;
    memset(&m, 0, sizeof m);
    dt_status st = dt_manifest_parse(&ctx, text, len, "fuzz/MANIFEST.json", &m);
    free(text);
    if (st != DT_OK) {
        fz_note(ctx.err);
        FZ_CHECK(strstr(ctx.err, "fuzz/MANIFEST.json") == ctx.err && !strchr(ctx.err, '\n'));
        dt_manifest_free(&m);
        return 0;
    }
    fz_note(NULL);
    FZ_CHECK(m.nfiles >= 0 && m.nfiles <= DT_MANIFEST_MAX_FILES);
    for (int i = 0; i < m.nfiles; i++) {
        const dt_manifest_file *f = &m.files[i];
        FZ_CHECK(memchr(f->name, 0, sizeof f->name) != NULL);
        FZ_CHECK(f->name[0] && !strchr(f->name, '/') && strcmp(f->name, ".") && strcmp(f->name, ".."));
        FZ_CHECK(f->size < ((uint64_t)1 << 62));
        FZ_CHECK(dt_manifest_find(&m, f->name) == f); /* unique: the first match is itself */
    }
    dt_manifest_free(&m);
    return 0;
}
