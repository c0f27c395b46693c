/* bpe_encode.c - encodes a text file with dtrain's tokenizer, for the parity test
 * (tests/run_bpe_parity.sh) and throughput measurements.
 *
 *   bpe_encode [-t THREADS] [-r REPEATS] [-c] [-d DECODED] DIR INPUT OUTPUT
 *   bpe_encode -p INPUT OUTPUT       the pre-tokenizer's pieces: byte lengths, one per line
 *
 * DIR holds encoder.json and vocab.bpe ("byte": the byte tokenizer; a path ending in .json:
 * a Hugging Face tokenizer.json, for tests/run_hftok_parity.sh). -d writes
 * decode(encode(text)) to DECODED. THREADS 0 (default)
 * uses dt_tokenizer_encode, N >= 1 dt_tokenizer_encode_parallel on N threads. The ids go to
 * OUTPUT one per line ("-": not written); -c checks decode(encode(text)) == text. A
 * throughput table goes to stdout (best of REPEATS runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "core/timer.h"
#include "data/bpe.h"
#include "data/tokenizer.h"

static int die(const dt_ctx *ctx, const char *what) {
    fprintf(stderr, "bpe_encode: %s%s%s\n", what, ctx ? ": " : "", ctx ? ctx->err : "");
    return 1;
}

static char *read_all(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)*size + 1);
    if (text && fread(text, 1, (size_t)*size, f) != (size_t)*size) {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

static int write_pieces(const char *input, const char *output) {
    long size;
    char *text = read_all(input, &size);
    FILE *o = fopen(output, "w");
    if (!text || !o) return die(NULL, "cannot read the input or write the output");
    for (size_t i = 0, j; i < (size_t)size; i = j) {
        j = dt_bpe_piece_end((const uint8_t *)text, i, (size_t)size);
        fprintf(o, "%zu\n", j - i);
    }
    free(text);
    return fclose(o) != 0;
}

#define USAGE "usage: bpe_encode [-t THREADS] [-r REPEATS] [-c] [-d DECODED] DIR INPUT OUTPUT | -p INPUT OUTPUT"

int main(int argc, char **argv) {
    int threads = 0, repeats = 1, check = 0, pieces = 0, opt;
    const char *decoded = NULL;
    while ((opt = getopt(argc, argv, "t:r:cpd:")) != -1) {
        if (opt == 't') threads = atoi(optarg);
        else if (opt == 'd') decoded = optarg;
        else if (opt == 'r') repeats = atoi(optarg);
        else if (opt == 'c') check = 1;
        else if (opt == 'p') pieces = 1;
        else return die(NULL, USAGE);
    }
    if (pieces && argc - optind == 2) return write_pieces(argv[optind], argv[optind + 1]);
    if (argc - optind != 3 || repeats < 1) return die(NULL, USAGE);
    const char *dir = argv[optind], *input = argv[optind + 1], *output = argv[optind + 2];

    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *tok;
    size_t dl = strlen(dir);
    if (strcmp(dir, "byte") == 0) {
        if (dt_tokenizer_open_byte(&ctx, &tok) != DT_OK) return die(&ctx, "open");
    } else if (dl > 5 && strcmp(dir + dl - 5, ".json") == 0) {
        if (dt_tokenizer_open_hf(&ctx, dir, &tok) != DT_OK) return die(&ctx, "open");
    } else {
        char ej[4096], vb[4096];
        snprintf(ej, sizeof ej, "%s/encoder.json", dir);
        snprintf(vb, sizeof vb, "%s/vocab.bpe", dir);
        if (dt_tokenizer_open_gpt2(&ctx, ej, vb, &tok) != DT_OK) return die(&ctx, "open");
    }

    long size;
    char *text = read_all(input, &size);
    if (!text) return die(NULL, input);

    int32_t *ids = NULL;
    size_t n = 0;
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        free(ids);
        double t0 = dt_now();
        dt_status st = threads == 0
            ? dt_tokenizer_encode(&ctx, tok, text, (size_t)size, &ids, &n)
            : dt_tokenizer_encode_parallel(&ctx, tok, text, (size_t)size, threads, &ids, &n);
        double dt = dt_now() - t0;
        if (st != DT_OK) return die(&ctx, "encode");
        if (dt < best) best = dt;
    }
    printf("# %-9s %7s %12s %10s %9s %12s %8s\n", "tokenizer", "threads", "bytes", "tokens",
           "seconds", "tokens/s", "MB/s");
    printf("  %-9s %7d %12ld %10zu %9.3f %12.0f %8.2f\n", dt_tokenizer_name(tok), threads, size, n,
           best, (double)n / best, (double)size / best / 1e6);

    if (check) {
        char *back;
        size_t blen;
        if (dt_tokenizer_decode(&ctx, tok, ids, n, &back, &blen) != DT_OK) return die(&ctx, "decode");
        if (blen != (size_t)size || memcmp(back, text, blen) != 0) {
            size_t i = 0;
            while (i < blen && i < (size_t)size && back[i] == text[i]) i++;
            fprintf(stderr, "bpe_encode: decode(encode(text)) differs from text at byte %zu "
                            "(lengths %zu vs %ld)\n", i, blen, size);
            return 1;
        }
        free(back);
        printf("# decode(encode(text)) == text: ok\n");
    }
    if (decoded) {
        char *back;
        size_t blen;
        if (dt_tokenizer_decode(&ctx, tok, ids, n, &back, &blen) != DT_OK) return die(&ctx, "decode");
        FILE *o = fopen(decoded, "wb");
        if (!o || fwrite(back, 1, blen, o) != blen || fclose(o) != 0) return die(NULL, decoded);
        free(back);
    }
    if (strcmp(output, "-") != 0) {
        FILE *o = fopen(output, "w");
        if (!o) return die(NULL, output);
        for (size_t i = 0; i < n; i++) fprintf(o, "%d\n", ids[i]);
        if (fclose(o) != 0) return die(NULL, output);
    }
    free(ids);
    free(text);
    dt_tokenizer_free(tok);
    return 0;
}
