/* The safetensors reader on arbitrary bytes (dt_st_open_mem: the input is the file). If it
 * accepts the input, every tensor must lie inside the data section, hold exactly
 * 4 x prod(shape) bytes and be found by name; every byte is read (ASan checks the bounds). */
#include <string.h>

#include "ckpt/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dt_ctx ctx;
    static int init;
    if (!init) dt_ctx_init(&ctx), init = 1;
    ctx.err[0] = 0;
    dt_st_file *f;
    if (dt_st_open_mem(&ctx, "fuzz.safetensors", data, size, &f) != DT_OK) {
        fz_note(ctx.err);
        FZ_CHECK(strstr(ctx.err, "fuzz.safetensors") == ctx.err); /* one line naming the file */
        FZ_CHECK(!strchr(ctx.err, '\n'));
        return 0;
    }
    fz_note(NULL);
    volatile unsigned sum = 0;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_at(f, i);
        const uint8_t *p = t->data;
        FZ_CHECK(p >= data + 8 && p <= data + size && t->nbytes <= (size_t)(data + size - p));
        FZ_CHECK(t->ndim >= 0 && t->ndim <= DT_ST_MAXDIM);
        size_t elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            FZ_CHECK(t->shape[d] >= 0);
            elems *= (size_t)t->shape[d];
        }
        FZ_CHECK(t->nbytes == elems * dt_st_dtype_size(t->dtype));
        uint64_t hlen;
        memcpy(&hlen, data, 8);
        FZ_CHECK((size_t)(p - (data + 8 + hlen)) % dt_st_dtype_size(t->dtype) == 0); /* element-aligned */
        for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
        FZ_CHECK(dt_st_find(f, t->name) != NULL);
    }
    FZ_CHECK(dt_st_at(f, -1) == NULL && dt_st_at(f, dt_st_count(f)) == NULL);
    const char *keys[] = {"format", "n_layer", "step", ""};
    for (int k = 0; k < 4; k++) {
        const char *v = dt_st_meta(f, keys[k]);
        if (v) sum += (unsigned)strlen(v);
    }
    (void)sum;
    dt_st_close(f);
    return 0;
}
