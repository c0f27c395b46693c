/* dtrain sample CKPT: generate text from a saved model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf_import.h"
#include "ckpt/model_file.h"
#include "cli/cli.h"
#include "data/tokenizer.h"
#include "model/generate.h"

static void usage(FILE *f) {
    fprintf(f, "usage: dtrain sample CHECKPOINT [--prompt TEXT] [--max-tokens N] [--temperature F]\n"
               "                    [--top-k K] [--seed S] [--gpt2-encoder FILE --gpt2-merges FILE]\n"
               "                    [--hf-tokenizer FILE]\n\n"
               "Generates from a model.safetensors file, a step directory or a checkpoint directory\n"
               "(its latest step), with the tokenizer recorded in the model file. --hf-tokenizer\n"
               "(a tokenizer.json) is needed for models prepared with one, and used for a Hugging\n"
               "Face directory's own tokenizer.json without it; the prompt then starts with the\n"
               "beginning-of-text token. Temperature 0 is greedy; top-k 0 samples from the whole\n"
               "vocabulary. Defaults: prompt \"\\n\", 200 tokens, temperature 0.8, top-k 40, seed 1.\n");
}

typedef struct stream_state {
    dt_tokenizer *tok;
    int stop;
} stream_state;

static dt_status stream_token(dt_ctx *ctx, void *ud, int32_t token) {
    stream_state *ss = ud;
    if (token == ss->stop) return DT_OK; /* the end-of-text token is not printed */
    char *text = NULL;
    size_t n = 0;
    DT_CHECK(dt_tokenizer_decode_more(ctx, ss->tok, &token, 1, &text, &n)); /* after the prompt */
    fwrite(text, 1, n, stdout);
    fflush(stdout);
    free(text);
    return DT_OK;
}

int dt_cmd_sample(dt_ctx *ctx, int argc, char **argv) {
    if (argc < 1 || !strncmp(argv[0], "-", 1)) {
        usage(argc < 1 ? stderr : stdout);
        return argc < 1 || (strcmp(argv[0], "--help") && strcmp(argv[0], "-h")) ? DT_EXIT_USAGE : DT_EXIT_OK;
    }
    const char *prompt = "\n", *enc = NULL, *merges = NULL, *hfjson = NULL;
    dt_gen_cfg g = {.max_new = 200, .temperature = 0.8f, .top_k = 40, .seed = 1, .stop = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return DT_EXIT_OK;
        }
        if (i + 1 >= argc) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s needs a value", a);
            return DT_EXIT_USAGE;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--gpt2-encoder")) enc = v;
        else if (!strcmp(a, "--gpt2-merges")) merges = v;
        else if (!strcmp(a, "--hf-tokenizer")) hfjson = v;
        else if (!strcmp(a, "--max-tokens")) g.max_new = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--temperature")) g.temperature = strtof(v, &end);
        else if (!strcmp(a, "--top-k")) g.top_k = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--seed")) g.seed = strtoull(v, &end, 10);
        else {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: unknown flag '%s' (see dtrain sample --help)", a);
            return DT_EXIT_USAGE;
        }
        if (end && (*end || end == v)) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s expects a number, got '%s'", a, v);
            return DT_EXIT_USAGE;
        }
    }
    const char *bad = g.max_new < 1 || g.max_new > 100000 ? "--max-tokens must be in [1, 100000]"
                      : !(g.temperature >= 0)                ? "--temperature must be >= 0"
                      : g.top_k < 0                          ? "--top-k must be >= 0"
                                                             : NULL;
    if (bad) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s", bad);
        return DT_EXIT_USAGE;
    }
    char path[4200], tokname[32];
    dt_model_config mc;
    const int hf = dt_hf_is_dir(argv[0]); /* a Hugging Face directory, or dtrain's files */
    dt_status st = hf ? (snprintf(path, sizeof path, "%s", argv[0]), DT_OK)
                      : dt_ckpt_resolve(ctx, argv[0], path, sizeof path);
    if (st == DT_OK)
        st = hf ? dt_hf_config(ctx, path, &mc, tokname, sizeof tokname)
                : dt_model_file_config(ctx, path, &mc, tokname, sizeof tokname);
    if (st != DT_OK) return dt_cli_exit_code(st);
    if (mc.n_classes > 0) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s is a %s image classifier; sample generates text from a "
                "language model (use dtrain eval for its accuracy)", path, mc.family);
        return DT_EXIT_USAGE;
    }
    dt_tokenizer *tok = NULL;
    char own[4300];
    snprintf(own, sizeof own, "%s/tokenizer.json", path);
    if (!hfjson && hf && (!tokname[0] || !strcmp(tokname, "hf")) && access(own, R_OK) == 0)
        hfjson = own; /* a Hugging Face directory's own tokenizer */
    if (hfjson) {
        st = dt_tokenizer_open_hf(ctx, hfjson, &tok);
    } else if (!strcmp(tokname, "hf")) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s uses a tokenizer.json (hf) tokenizer: give --hf-tokenizer FILE", path);
        return DT_EXIT_USAGE;
    } else if (!strcmp(tokname, "gpt2")) {
        if (!enc || !merges) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: %s uses the gpt2 tokenizer: give --gpt2-encoder and --gpt2-merges", path);
            return DT_EXIT_USAGE;
        }
        st = dt_tokenizer_open_gpt2(ctx, enc, merges, &tok);
    } else {
        st = dt_tokenizer_open_byte(ctx, &tok);
    }
    /* The tokenizer's files are given on the command line: refusing one is a usage error. */
    if (st != DT_OK) return st == DT_ERR_NOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
    /* Before anything is printed: a tokenizer larger than the model has ids it has no rows
     * for; a smaller one cannot decode what the model may sample. Smaller is fine for the
     * model's own kind of tokenizer (byte data under a larger vocabulary; padding) and within
     * the padding to a multiple of 128 (a GPT-2 tokenizer.json on a 50304-row model); anything
     * else is another model's tokenizer (a Llama-2 tokenizer.json, 32000 ids, on a GPT-2
     * model, 50257), which would print garbage, then fail on an id out of its range. */
    int tv = dt_tokenizer_vocab(tok);
    int own_kind = tokname[0] && !strcmp(tokname, dt_tokenizer_name(tok));
    if (tv > mc.vocab || (mc.vocab > (tv + 127) / 128 * 128 && !own_kind)) {
        char why[160];
        if (tv > mc.vocab)
            snprintf(why, sizeof why, "its ids %d..%d have no row in the model", mc.vocab, tv - 1);
        else
            snprintf(why, sizeof why, "the model would sample ids %d..%d that it cannot decode", tv, mc.vocab - 1);
        const char *file = hfjson ? hfjson : enc; /* NULL: the built-in byte tokenizer */
        char desc[4400];
        if (file)
            snprintf(desc, sizeof desc, "%s (%s, %d ids)", file, dt_tokenizer_name(tok), tv);
        else
            snprintf(desc, sizeof desc, "%s (%d ids)", dt_tokenizer_name(tok), tv);
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain sample: tokenizer %s does not fit the model's vocabulary of %d in %s "
                "(%s)%s%s%s", desc, mc.vocab, path, why, tokname[0] ? "; the model was trained with the " : "",
                tokname, tokname[0] ? " tokenizer" : "");
        dt_tokenizer_free(tok);
        return DT_EXIT_USAGE;
    }
    g.vocab_limit = tv; /* ids past the tokenizer's (padding, unused rows) are not sampled */
    g.stop = dt_tokenizer_eot(tok);
    int32_t *ids = NULL, *out = malloc((size_t)g.max_new * sizeof *out);
    size_t nids = 0;
    int nout = 0, have_model = 0;
    dt_alloc alloc;
    dt_alloc_init(&alloc);
    dt_model m;
    st = out ? dt_tokenizer_encode(ctx, tok, prompt, strlen(prompt), &ids, &nids)
             : dt_fail(ctx, DT_ERR_NOMEM, "sample: out of memory");
    int bos = dt_tokenizer_bos(tok); /* documents were prepared as [bos] text eot */
    if (st == DT_OK && bos >= 0) {
        int32_t *w = realloc(ids, (nids + 1) * sizeof *w);
        if (!w) {
            st = dt_fail(ctx, DT_ERR_NOMEM, "sample: out of memory");
        } else {
            memmove(w + 1, w, nids * sizeof *w);
            w[0] = bos;
            ids = w;
            nids++;
        }
    }
    int window = (int)nids + g.max_new < mc.context ? (int)nids + g.max_new : mc.context;
    if (st == DT_OK) st = dt_model_init(ctx, &m, &mc, &alloc, 1, window, DT_SLAB_PARAMS);
    have_model = st == DT_OK;
    if (st == DT_OK) st = hf ? dt_hf_load(ctx, &m, path) : dt_model_file_load(ctx, &m, path);
    if (st == DT_OK) st = dt_params_check_finite(ctx, &m.ps, m.ps.params, path, hf);
    /* The text is written as it is generated, token by token (bytes: a character split
     * across tokens comes out whole once its last byte is written). */
    stream_state ss = {tok, g.stop};
    g.on_token = stream_token;
    g.on_token_ud = &ss;
    if (st == DT_OK) {
        fwrite(prompt, 1, strlen(prompt), stdout);
        fflush(stdout);
        st = dt_generate(ctx, &m, ids, (int)nids, &g, out, &nout);
        fputc('\n', stdout);
    }
    free(ids);
    free(out);
    if (have_model) dt_model_free(&m);
    dt_tokenizer_free(tok);
    return dt_cli_exit_code(st);
}
