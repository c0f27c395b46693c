/* dtrain ckpt verify / info: what is in a checkpoint directory and whether it is intact. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/checkpoint.h"
#include "ckpt/model_file.h"
#include "cli/cli.h"

static int is_step_dir(const char *d) {
    char p[4400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/" DT_MANIFEST_NAME, d);
    if (stat(p, &sb) == 0) return 1;
    const char *base = strrchr(d, '/');
    base = base ? base + 1 : d;
    return strncmp(base, "step-", 5) == 0;
}

static int cmp_str_desc(const void *a, const void *b) { return -strcmp(*(char *const *)a, *(char *const *)b); }

/* Checks one step directory or every step-* directory of a checkpoint root. */
int dt_cmd_ckpt_verify(dt_ctx *ctx, int argc, char **argv) {
    if (argc != 1) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain ckpt verify: expected one directory");
        return DT_EXIT_USAGE;
    }
    const char *dir = argv[0];
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        dt_fail(ctx, DT_ERR_IO, "%s: not a directory", dir);
        return DT_EXIT_FAIL;
    }
    if (is_step_dir(dir)) {
        dt_manifest m;
        if (dt_ckpt_verify(ctx, dir, &m) != DT_OK) {
            printf("DAMAGED %s: %s\n", dir, ctx->err);
            return DT_EXIT_FAIL;
        }
        printf("ok      %s: step %ld, %d files, every size and XXH3 checksum matches\n", dir, m.step, m.nfiles);
        dt_manifest_free(&m);
        return DT_EXIT_OK;
    }
    DIR *d = opendir(dir);
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 4096)
        if (!strncmp(e->d_name, "step-", 5)) names[n++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str_desc);
    int bad = 0, newest = -1;
    long latest = dt_ckpt_latest_step(dir);
    for (int i = 0; i < n; i++) {
        char p[4400];
        long step = strtol(names[i] + 5, NULL, 10);
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (dt_ckpt_verify(ctx, p, NULL) == DT_OK) {
            if (latest >= 0 && step > latest) {
                printf("ok      %s (ignored: newer than latest, step-%08ld)\n", p, latest);
            } else {
                printf("ok      %s\n", p);
                if (newest < 0) newest = i;
            }
        } else {
            printf("DAMAGED %s: %s\n", p, ctx->err);
            bad++;
        }
    }
    char found[4400];
    if (newest >= 0 && dt_ckpt_find_quiet(ctx, dir, 1, found, sizeof found) == DT_OK)
        printf("newest intact checkpoint: %s (what --resume latest, eval, sample and export load)\n", found);
    for (int i = 0; i < n; i++) free(names[i]);
    if (n == 0 || newest < 0) {
        dt_fail(ctx, DT_ERR_IO, "%s: no intact checkpoint (%d step directories)", dir, n);
        return DT_EXIT_FAIL;
    }
    if (bad) {
        dt_fail(ctx, DT_ERR_FORMAT, "%s: %d of %d step directories are incomplete or damaged", dir, bad, n);
        return DT_EXIT_FAIL;
    }
    return DT_EXIT_OK;
}

int dt_cmd_ckpt_info(dt_ctx *ctx, int argc, char **argv) {
    if (argc != 1) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain ckpt info: expected one directory");
        return DT_EXIT_USAGE;
    }
    char step[4400];
    if (dt_ckpt_find(ctx, argv[0], step, sizeof step) != DT_OK) return DT_EXIT_FAIL;
    dt_manifest m;
    dt_ckpt_trainer tj;
    if (dt_ckpt_verify(ctx, step, &m) != DT_OK) return DT_EXIT_FAIL;
    if (dt_ckpt_read_trainer(ctx, step, &tj) != DT_OK) {
        dt_manifest_free(&m);
        return DT_EXIT_FAIL;
    }
    char model[4500], tok[32] = "";
    dt_model_config c;
    snprintf(model, sizeof model, "%s/model.safetensors", step);
    if (dt_model_file_config(ctx, model, &c, tok, sizeof tok) != DT_OK) {
        dt_manifest_free(&m);
        return DT_EXIT_FAIL;
    }
    printf("checkpoint   %s (intact: every checksum matches)\n", step);
    printf("step         %ld\n", tj.step);
    printf("tokens seen  %.0f\n", tj.tokens_seen);
    printf("last loss    %.6f\n", tj.loss);
    printf("trained for  %.1f s\n", tj.train_seconds);
    printf("model        %d layers, d_model %d, %d heads, vocab %d, context %d (%.2fM parameters), tokenizer %s\n",
           c.n_layer, c.d_model, c.n_head, c.vocab, c.context, (double)dt_model_num_params(&c) / 1e6,
           tok[0] ? tok : "-");
    printf("written by   %d rank(s), %s%s, micro-batch %d x %d tokens, %d accumulation step(s)\n", tj.world,
           tj.strategy, tj.hybrid ? " (hybrid)" : "", tj.micro_batch, tj.seq_len, tj.accum);
    printf("seed         %" PRIu64 "\n", tj.seed);
    if (tj.has_sampler)
        printf("data cursor  %" PRIu64 " samples consumed (epoch %" PRIu64 " of %" PRIu64 " samples, %s)\n",
               tj.sampler.cursor, tj.sampler.n_samples ? tj.sampler.cursor / tj.sampler.n_samples : 0,
               tj.sampler.n_samples, tj.sampler.shuffle ? "shuffled" : "in order");
    else
        printf("data         synthetic\n");
    double total = 0;
    printf("files\n");
    for (int i = 0; i < m.nfiles; i++) {
        printf("  %-40s %12" PRIu64 " bytes  xxh3 %016" PRIx64 "\n", m.files[i].name, m.files[i].size, m.files[i].xxh3);
        total += (double)m.files[i].size;
    }
    printf("  %-40s %12.0f bytes\n", "total", total);
    dt_manifest_free(&m);
    return DT_EXIT_OK;
}
