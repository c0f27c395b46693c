/* Model import (dt_model_import_config + dt_model_import) on one file: llm.c model files by
 * magic or ".bin" name (bit 0 of byte 0 picks the name), dtrain model files (safetensors)
 * otherwise; the rest of the input is the file. When the shape is accepted and the file can
 * hold that many parameters (a real one must), the weights are loaded into a model of that
 * shape; the vocabulary padding rows must then be zero. */
#include <string.h>

#include "ckpt/interop.h"
#include "model/gpt2/gpt2.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dt_ctx ctx;
    static int init;
    if (!init) dt_ctx_init(&ctx), init = 1;
    if (size < 1) return 0;
    const char *path = fz_write_file(data + 1, size - 1, data[0] & 1 ? ".bin" : ".safetensors");
    ctx.err[0] = 0;
    dt_model_config c;
    char tok[16];
    if (dt_model_import_config(&ctx, path, &c, tok, sizeof tok) != DT_OK) {
        fz_note(ctx.err);
        FZ_CHECK(strstr(ctx.err, path) == ctx.err && !strchr(ctx.err, '\n'));
        return 0;
    }
    FZ_CHECK(c.n_layer >= 1 && c.d_model >= 1 && c.n_head >= 1 && c.d_model % c.n_head == 0);
    FZ_CHECK(c.vocab >= 1 && c.vocab_padded >= c.vocab && c.context >= 1);
    /* Each value takes at least 2 bytes in either format. */
    if (dt_model_num_params(&c) > (size - 1) / 2) return 0;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    if (dt_model_init(&ctx, &m, &c, &alloc, 1, 1, DT_SLAB_PARAMS) != DT_OK) return 0;
    /* NaN-free garbage first: the load must overwrite or zero every value it owns. */
    memset(m.ps.params, 0x7f, m.ps.n_params * sizeof(float));
    if (dt_model_import(&ctx, &m, path) == DT_OK) {
        fz_note(NULL);
        const float *wte = dt_params_tensor(&(&m)->ps, m.ps.params, DT_GPT2_P_WTE, 0);
        if (memcmp(data + 1, "\xc6\xd7\x34\x01", 4) == 0) /* llm.c: padding zeroed */
            for (size_t i = (size_t)c.vocab * c.d_model; i < (size_t)c.vocab_padded * c.d_model; i++)
                FZ_CHECK(wte[i] == 0.0f);
    } else {
        fz_note(ctx.err);
        FZ_CHECK(strstr(ctx.err, path) == ctx.err && !strchr(ctx.err, '\n'));
    }
    dt_model_free(&m);
    return 0;
}
