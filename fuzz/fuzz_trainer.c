/* The checkpoint's trainer.json parser (dt_ckpt_parse_trainer) on arbitrary text. A refusal
 * must be one line naming the file; an accepted state must be in range (step >= 0, world
 * >= 1, batch shape >= 1, a short lowercase strategy name, a sampler state only with a
 * "data" object). */
#include <string.h>

#include "ckpt/checkpoint.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dt_ctx ctx;
    static int init;
    if (!init) dt_ctx_init(&ctx), init = 1;
    ctx.err[0] = 0;
    dt_ckpt_trainer t;
    dt_status st = dt_ckpt_parse_trainer(&ctx, (const char *)data, size, "fuzz/trainer.json", &t);
    if (st != DT_OK) {
        fz_note(ctx.err);
        FZ_CHECK(strstr(ctx.err, "fuzz/trainer.json") == ctx.err && !strchr(ctx.err, '\n'));
        return 0;
    }
    fz_note(NULL);
    FZ_CHECK(t.step >= 0 && t.world >= 1 && t.micro_batch >= 1 && t.accum >= 1 && t.seq_len >= 1);
    FZ_CHECK(t.hybrid == 0 || t.hybrid == 1);
    FZ_CHECK(memchr(t.strategy, 0, sizeof t.strategy) != NULL);
    for (const char *p = t.strategy; *p; p++) FZ_CHECK((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_');
    if (t.has_sampler) FZ_CHECK(t.sampler.T >= 1 && (t.sampler.shuffle == 0 || t.sampler.shuffle == 1));
    return 0;
}
