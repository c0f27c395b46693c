/* Instruction data: JSONL examples -> token shards + loss masks (instruct.h). */
#include "data/instruct.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/prepare.h"
#include "data/shard.h"

int dt_chat_template_parse(const char *name, dt_chat_template *t) {
    if (!strcmp(name, "plain")) *t = DT_TEMPLATE_PLAIN;
    else if (!strcmp(name, "chatml")) *t = DT_TEMPLATE_CHATML;
    else return -1;
    return 0;
}

/* Appends n tokens, each with mask value `counted`. */
static dt_status append(dt_ctx *ctx, const int32_t *src, size_t k, int counted, int32_t **ids, uint8_t **mask,
                        size_t *n, size_t *cap) {
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *n + k) c *= 2;
        int32_t *ni = realloc(*ids, c * sizeof *ni);
        if (ni) *ids = ni;
        uint8_t *nm = ni ? realloc(*mask, c) : NULL;
        if (!ni || !nm) return dt_fail(ctx, DT_ERR_NOMEM, "prepare --instruct: out of memory");
        *mask = nm;
        *cap = c;
    }
    memcpy(*ids + *n, src, k * sizeof *src);
    memset(*mask + *n, counted ? 1 : 0, k);
    *n += k;
    return DT_OK;
}

/* Tokenizes one piece of text and appends it. */
static dt_status piece(dt_ctx *ctx, const dt_tokenizer *tok, const char *text, int counted, int32_t **ids,
                       uint8_t **mask, size_t *n, size_t *cap) {
    size_t len = strlen(text);
    if (len == 0) return DT_OK;
    int32_t *t;
    size_t k;
    DT_CHECK(dt_tokenizer_encode(ctx, tok, text, len, &t, &k));
    dt_status st = append(ctx, t, k, counted, ids, mask, n, cap);
    free(t);
    return st;
}

/* A string member of an object, or a failure naming it. */
static dt_status str_member(dt_ctx *ctx, const cJSON *o, const char *key, const char *where, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: key '%s' must be a string", where, key);
    *out = v->valuestring;
    return DT_OK;
}

/* One turn: its header and content under the template; counted when it is the assistant's. */
static dt_status turn(dt_ctx *ctx, const dt_tokenizer *tok, dt_chat_template tmpl, const char *role, const char *content,
                      int32_t sep, int32_t **ids, uint8_t **mask, size_t *n, size_t *cap) {
    const int asst = !strcmp(role, "assistant");
    if (tmpl == DT_TEMPLATE_CHATML) {
        char head[64];
        snprintf(head, sizeof head, "<|im_start|>%s\n", role);
        DT_CHECK(piece(ctx, tok, head, 0, ids, mask, n, cap));
        DT_CHECK(piece(ctx, tok, content, asst, ids, mask, n, cap));
        return piece(ctx, tok, "<|im_end|>\n", asst, ids, mask, n, cap);
    }
    DT_CHECK(piece(ctx, tok, content, asst, ids, mask, n, cap));
    if (asst) return append(ctx, &sep, 1, 1, ids, mask, n, cap);
    return piece(ctx, tok, "\n", 0, ids, mask, n, cap);
}

dt_status dt_instruct_encode(dt_ctx *ctx, const dt_tokenizer *tok, dt_chat_template tmpl, const cJSON *ex,
                             const char *where, int32_t **ids, uint8_t **mask, size_t *n, size_t *cap) {
    const int eot = dt_tokenizer_eot(tok);
    const int32_t sep = eot >= 0 ? eot : '\n';
    if (!cJSON_IsObject(ex)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not a JSON object", where);
    const int32_t bos = dt_tokenizer_bos(tok); /* a released model's examples start with it */
    if (bos >= 0) DT_CHECK(append(ctx, &bos, 1, 0, ids, mask, n, cap));
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(ex, "messages");
    if (msgs) {
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'messages' must be a non-empty array", where);
        int assistants = 0;
        for (int i = 0; i < cJSON_GetArraySize(msgs); i++) {
            const cJSON *m = cJSON_GetArrayItem(msgs, i);
            char w[600];
            snprintf(w, sizeof w, "%s: messages[%d]", where, i);
            if (!cJSON_IsObject(m)) return dt_fail(ctx, DT_ERR_FORMAT, "%s: not an object", w);
            const char *role = NULL, *content = NULL;
            DT_CHECK(str_member(ctx, m, "role", w, &role));
            DT_CHECK(str_member(ctx, m, "content", w, &content));
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
                return dt_fail(ctx, DT_ERR_FORMAT, "%s: role '%s' is not system, user or assistant", w, role);
            assistants += !strcmp(role, "assistant");
        }
        if (!assistants) return dt_fail(ctx, DT_ERR_FORMAT, "%s: no assistant message (nothing to train on)", where);
        for (int i = 0; i < cJSON_GetArraySize(msgs); i++) {
            const cJSON *m = cJSON_GetArrayItem(msgs, i);
            DT_CHECK(turn(ctx, tok, tmpl, cJSON_GetObjectItem(m, "role")->valuestring,
                          cJSON_GetObjectItem(m, "content")->valuestring, sep, ids, mask, n, cap));
        }
    } else {
        const char *prompt = NULL, *response = NULL;
        DT_CHECK(str_member(ctx, ex, "prompt", where, &prompt));
        DT_CHECK(str_member(ctx, ex, "response", where, &response));
        if (tmpl == DT_TEMPLATE_CHATML) {
            DT_CHECK(turn(ctx, tok, tmpl, "user", prompt, sep, ids, mask, n, cap));
            DT_CHECK(turn(ctx, tok, tmpl, "assistant", response, sep, ids, mask, n, cap));
        } else {
            DT_CHECK(piece(ctx, tok, prompt, 0, ids, mask, n, cap));
            DT_CHECK(piece(ctx, tok, response, 1, ids, mask, n, cap));
            return append(ctx, &sep, 1, 1, ids, mask, n, cap);
        }
    }
    /* chatml: the end of the example closes with the separator, not counted */
    return tmpl == DT_TEMPLATE_CHATML ? append(ctx, &sep, 1, 0, ids, mask, n, cap) : DT_OK;
}

dt_status dt_mask_write(dt_ctx *ctx, const char *path, const uint8_t *mask, uint64_t n) {
    if (n > INT32_MAX) return dt_fail(ctx, DT_ERR_CONFIG, "%s: %llu tokens exceed a shard's limit", path, (unsigned long long)n);
    int32_t hdr[DT_LLMC_HEADER_INTS] = {DT_MASK_MAGIC, 1, (int32_t)n};
    return dt_file_write_atomic(ctx, path, hdr, sizeof hdr, mask, n);
}

/* A split's stream cut into shards, each with its mask beside it. */
typedef struct stream {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap;
} stream;

static dt_status write_stream(dt_ctx *ctx, const dt_instruct_cfg *c, const char *split, const stream *s, int *shards) {
    *shards = 0;
    for (uint64_t i = 0; i < s->n; i += c->shard_tokens) {
        uint64_t m = s->n - i < c->shard_tokens ? s->n - i : c->shard_tokens;
        char path[4200], mpath[4300];
        snprintf(path, sizeof path, "%s_%s_%06d.bin", c->out_prefix, split, *shards);
        snprintf(mpath, sizeof mpath, "%s.mask", path);
        /* the mask first: a shard is never left without the mask it needs */
        DT_CHECK(dt_mask_write(ctx, mpath, s->mask + i, m));
        DT_CHECK(dt_shard_write(ctx, path, s->ids + i, m, dt_tokenizer_vocab(c->tok)));
        (*shards)++;
    }
    return DT_OK;
}

dt_status dt_instruct_prepare(dt_ctx *ctx, const dt_instruct_cfg *c, dt_instruct_stats *out) {
    memset(out, 0, sizeof *out);
    if (c->n_inputs < 1) return dt_fail(ctx, DT_ERR_CONFIG, "prepare --instruct: no input files (use - for stdin)");
    if (!(c->val_fraction >= 0 && c->val_fraction < 1))
        return dt_fail(ctx, DT_ERR_CONFIG, "prepare: --val-fraction must be in [0, 1) (got %g)", c->val_fraction);
    if (c->shard_tokens < 1) return dt_fail(ctx, DT_ERR_CONFIG, "prepare: --shard-tokens must be >= 1");
    const uint64_t every = c->val_fraction > 0 ? (uint64_t)llround(1.0 / c->val_fraction) : 0;
    stream sp[2] = {{0}}; /* train, val */
    dt_status st = DT_OK;
    for (int f = 0; f < c->n_inputs && st == DT_OK; f++) {
        char *text;
        size_t len;
        DT_CHECK_GOTO(dt_read_text(ctx, c->inputs[f], &text, &len));
        char *line = text;
        for (long ln = 1; st == DT_OK && line < text + len; ln++) {
            char *nl = memchr(line, '\n', (size_t)(text + len - line));
            if (nl) *nl = 0;
            const char *p = line;
            while (*p == ' ' || *p == '\t' || *p == '\r') p++;
            if (*p) {
                char where[4200];
                snprintf(where, sizeof where, "%s:%ld", c->inputs[f], ln);
                cJSON *ex = cJSON_ParseWithOpts(p, NULL, 1);
                if (!ex) {
                    st = dt_fail(ctx, DT_ERR_FORMAT, "%s: not valid JSON", where);
                } else {
                    const int val = every > 0 && out->examples % every == every - 1;
                    stream *s = &sp[val];
                    st = dt_instruct_encode(ctx, c->tok, c->tmpl, ex, where, &s->ids, &s->mask, &s->n, &s->cap);
                    out->examples++;
                    out->val_examples += (uint64_t)val;
                    cJSON_Delete(ex);
                }
            }
            line = nl ? nl + 1 : text + len;
        }
        free(text);
    }
    if (st == DT_OK && out->examples == 0) st = dt_fail(ctx, DT_ERR_FORMAT, "prepare --instruct: the input holds no example");
    if (st != DT_OK) goto fail;
    out->train_tokens = sp[0].n, out->val_tokens = sp[1].n;
    for (size_t i = 0; i < sp[0].n; i++) out->train_counted += sp[0].mask[i];
    for (size_t i = 0; i < sp[1].n; i++) out->val_counted += sp[1].mask[i];
    DT_CHECK_GOTO(write_stream(ctx, c, "train", &sp[0], &out->train_shards));
    if (sp[1].n > 0) DT_CHECK_GOTO(write_stream(ctx, c, "val", &sp[1], &out->val_shards));
fail:
    for (int i = 0; i < 2; i++) free(sp[i].ids), free(sp[i].mask);
    return st;
}
