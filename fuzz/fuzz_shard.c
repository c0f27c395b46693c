/* The token-shard reader (dt_dataset_open) on one file. Byte 0 picks the format (bits 0-1:
 * auto, llmc, raw16, auto) and the name (bit 2: ".bin" or ".tok"); bytes 1-2 the vocabulary
 * (bit 3 of byte 0: above 65535, where uint16 shards skip the scan); the rest is the file.
 * If the reader accepts it, the token count must match the file size, and every token must
 * be < vocab, through both read paths. */
#include <string.h>

#include "data/shard.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dt_ctx ctx;
    static int init;
    if (!init) dt_ctx_init(&ctx), init = 1;
    if (size < 3) return 0;
    static const char *const formats[] = {"auto", "llmc", "raw16", NULL};
    const char *format = formats[data[0] & 3];
    int vocab = 1 + (data[1] | data[2] << 8) + (data[0] & 8 ? 65536 : 0);
    const char *path = fz_write_file(data + 3, size - 3, data[0] & 4 ? ".bin" : ".tok");
    size_t fsize = size - 3;
    ctx.err[0] = 0;
    dt_dataset *ds;
    if (dt_dataset_open(&ctx, &ds, path, format, vocab) != DT_OK) {
        fz_note(ctx.err);
        FZ_CHECK(ds == NULL);
        FZ_CHECK(strstr(ctx.err, path) == ctx.err && !strchr(ctx.err, '\n'));
        return 0;
    }
    fz_note(NULL);
    FZ_CHECK(dt_dataset_num_shards(ds) == 1);
    uint64_t n = dt_dataset_shard_tokens(ds, 0);
    int w = dt_dataset_shard_width(ds, 0);
    FZ_CHECK(n > 0 || dt_dataset_shard_is_raw(ds, 0));
    if (dt_dataset_shard_is_raw(ds, 0))
        FZ_CHECK(w == 2 && n * 2 == fsize);
    else
        FZ_CHECK((w == 2 || w == 4) && DT_LLMC_HEADER_BYTES + n * (uint64_t)w == fsize);
    FZ_CHECK(dt_dataset_num_tokens(ds) == n);
    int32_t buf[256];
    for (uint64_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? (size_t)(n - i) : 256;
        dt_dataset_read(ds, 0, i, k, buf);
        for (size_t j = 0; j < k; j++) FZ_CHECK(buf[j] >= 0 && buf[j] < vocab);
        FZ_CHECK(dt_dataset_token(ds, 0, i) == buf[0]);
    }
    if (dt_dataset_check_seq_len(&ctx, ds, 1) == DT_OK) FZ_CHECK(n >= 2);
    dt_dataset_close(ds);
    return 0;
}
