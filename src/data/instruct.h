/* instruct.h - instruction data (`dtrain prepare --instruct`): JSONL examples -> token shards
 * with a loss mask beside them (shard.h), so that training counts the loss on the response
 * tokens only.
 *
 * Each line of a JSONL file is one example (blank lines are skipped):
 *   {"prompt": "...", "response": "..."}
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 * (a messages example needs at least one assistant turn). The template lays it out as text;
 * every piece is tokenized on its own and the pieces are concatenated:
 *   plain   prompt, response, separator; messages: each turn's content, non-assistant turns
 *           followed by "\n", each assistant turn by the separator
 *   chatml  "<|im_start|>ROLE\n" CONTENT "<|im_end|>\n" per turn (prompt/response = a user
 *           and an assistant turn), then the separator
 * The separator is the tokenizer's end-of-text token, or "\n" (byte tokenizer). Counted
 * (mask 1): the assistant's content and what closes it ("<|im_end|>\n" in chatml, the
 * separator in plain); everything else is 0 (a tokenizer with a beginning-of-text token, hf,
 * starts each example with it, not counted). Examples are packed back to back into one
 * stream (a T+1 window may hold the end of one example and the start of the next, as in
 * packed fine-tuning); every round(1 / val_fraction)-th example goes to validation.
 *
 *   dt_instruct_cfg c = {.tok = tok, .inputs = files, .n_inputs = 1, .tmpl = DT_TEMPLATE_CHATML,
 *                        .val_fraction = 0.05, .shard_tokens = 100000000, .out_prefix = "data/sft"};
 *   dt_instruct_stats s; DT_CHECK(dt_instruct_prepare(ctx, &c, &s));
 *   // data/sft_train_000000.bin + data/sft_train_000000.bin.mask, data/sft_val_...
 */
#ifndef DT_INSTRUCT_H
#define DT_INSTRUCT_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "data/tokenizer.h"

typedef enum dt_chat_template { DT_TEMPLATE_PLAIN, DT_TEMPLATE_CHATML } dt_chat_template;

/* "plain" / "chatml" -> 0 and *t, else -1. */
int dt_chat_template_parse(const char *name, dt_chat_template *t);

typedef struct dt_instruct_cfg {
    const dt_tokenizer *tok;
    const char *const *inputs; /* JSONL paths; "-" = standard input */
    int n_inputs;
    dt_chat_template tmpl;
    double val_fraction;   /* share of examples for validation; 0 = none */
    uint64_t shard_tokens; /* maximum tokens per shard file */
    const char *out_prefix;
} dt_instruct_cfg;

typedef struct dt_instruct_stats {
    uint64_t examples, val_examples;
    uint64_t train_tokens, val_tokens, train_counted, val_counted;
    int train_shards, val_shards;
} dt_instruct_stats;

dt_status dt_instruct_prepare(dt_ctx *ctx, const dt_instruct_cfg *c, dt_instruct_stats *out);

/* One example (a parsed JSONL line) -> tokens and their mask, appended to the growing arrays
 * *ids / *mask of *n elements (capacity *cap). `where` ("file:line") names it in errors. */
dt_status dt_instruct_encode(dt_ctx *ctx, const dt_tokenizer *tok, dt_chat_template tmpl, const cJSON *ex,
                             const char *where, int32_t **ids, uint8_t **mask, size_t *n, size_t *cap);

/* Writes a loss-mask file (shard.h's format) for n tokens: tmp file, fsync, rename. */
dt_status dt_mask_write(dt_ctx *ctx, const char *path, const uint8_t *mask, uint64_t n);

#endif
