/* rope_dump - the RoPE frequencies dtrain computes for a model, for tests/ref/rope_scaling_ref.py.
 *
 *   rope_dump [--set KEY=VALUE]...   a run's model, through the config keys (dt_cfg_set,
 *                                    dt_cfg_finish: presets, defaults, validation)
 *   rope_dump --hf DIR               a Hugging Face directory's config.json (dt_hf_config)
 *
 * Prints "hs N", "scale S" (the cos/sin scale), then "inv I F" for each of the hs/2
 * frequencies (model/rope.h's double table), every number with 17 significant digits; and
 * "kernel I F" for the float values the kernel takes. A refused config: its one-line message
 * on stderr, exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hf_import.h"
#include "model/rope.h"
#include "train/keys.h"

static int dump(const dt_model_config *c) {
    const int hs = c->d_model / c->n_head;
    double *inv = malloc((size_t)hs * sizeof(double));
    float *kinv = malloc((size_t)hs * sizeof(float)), kscale;
    if (!inv || !kinv) return 1;
    const double scale = dt_rope_freqs(c, hs, inv);
    dt_rope_kernel_freqs(c, hs, kinv, &kscale);
    printf("rule %s\nhs %d\nscale %.17g\nkernel_scale %.9g\n", dt_rope_scaling_names[c->rope_scaling], hs, scale,
           (double)kscale);
    for (int i = 0; i < hs / 2; i++) printf("inv %d %.17g\n", i, inv[i]);
    for (int i = 0; i < hs / 2; i++) printf("kernel %d %.9g\n", i, (double)kinv[i]);
    free(inv);
    free(kinv);
    return 0;
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    if (argc == 3 && !strcmp(argv[1], "--hf")) {
        dt_model_config c;
        if (dt_hf_config(&ctx, argv[2], &c, NULL, 0) != DT_OK) {
            fprintf(stderr, "%s\n", ctx.err);
            return 2;
        }
        return dump(&c);
    }
    static dt_run_cfg rc;
    dt_run_cfg_defaults(&rc);
    for (int i = 1; i < argc; i++) {
        char *eq = i + 1 < argc && !strcmp(argv[i], "--set") ? strchr(argv[i + 1], '=') : NULL;
        if (!eq) {
            fprintf(stderr, "usage: rope_dump [--set KEY=VALUE]... | --hf DIR\n");
            return 2;
        }
        *eq = 0;
        if (dt_cfg_set(&ctx, &rc, argv[i + 1], eq + 1) != DT_OK) {
            fprintf(stderr, "%s\n", ctx.err);
            return 2;
        }
        i++;
    }
    if (dt_cfg_finish(&ctx, &rc) != DT_OK) {
        fprintf(stderr, "%s\n", ctx.err);
        return 2;
    }
    return dump(&rc.train.model);
}
