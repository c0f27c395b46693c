/* LLaMA (and Mistral, Mixtral) Hugging Face config.json: read into a model config (RoPE
 * scaling, mixture of experts) and written back (llama_impl.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/hf_json.h"
#include "model/llama/llama_impl.h"
#include "model/rope.h"

/* config.json's rope_scaling (null, absent, or an object with rope_type, or the older key
 * type) -> the model.rope_* fields; c->context must hold max_position_embeddings (yarn's
 * original context when the object names none). Keys the rule does not read are refused. */
static dt_status hf_read_rope_scaling(dt_ctx *ctx, const dt_hf_json *j, dt_model_config *c) {
    dt_hf_json r;
    char pre[32];
    int found;
    DT_CHECK(dt_hf_json_object(ctx, j, "rope_scaling", &r, pre, sizeof pre, &found));
    if (!found) return DT_OK;
    const char *type, *old;
    DT_CHECK(dt_hf_json_string(ctx, &r, "rope_type", &type));
    DT_CHECK(dt_hf_json_string(ctx, &r, "type", &old));
    if (type && old && strcmp(type, old))
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: rope_scaling.rope_type '%s' and rope_scaling.type '%s' differ",
                       j->path, type, old);
    if (!type) type = old;
    if (!type)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: rope_scaling names no rope_type (nor type)", j->path);
    char key[4200];
    snprintf(key, sizeof key, "%s: rope_scaling.rope_type", j->path);
    int rule = DT_ROPE_NONE;
    if (strcmp(type, "default") != 0) { /* transformers' name of plain RoPE */
        if (strcmp(type, "dynamic") && (!strcmp(type, "none") || dt_rope_scaling_parse(ctx, key, type, &rule) != DT_OK))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' is not supported (dtrain computes default, linear, llama3 "
                           "and yarn)", key, type);
        DT_CHECK(dt_rope_scaling_parse(ctx, key, type, &rule)); /* dynamic: its own line */
    }
    static const char *const known[][6] = {
        {NULL},
        {"factor", NULL},
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", NULL},
        {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "truncate"},
    };
    for (int i = 0; dt_hf_json_key(&r, i); i++) {
        const char *k = dt_hf_json_key(&r, i);
        int ok = !strcmp(k, "rope_type") || !strcmp(k, "type");
        for (int n = 0; n < 6 && known[rule][n]; n++) ok |= !strcmp(k, known[rule][n]);
        if (!ok)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: rope_scaling.%s is not supported with rope_type %s (dtrain "
                           "does not compute it)", j->path, k, type);
    }
    c->rope_scaling = rule;
    if (rule == DT_ROPE_NONE) return DT_OK;
    static const char *const required[][4] = {
        {NULL},
        {"factor", NULL},
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
        {"factor", NULL},
    };
    for (int n = 0; n < 4 && required[rule][n]; n++)
        if (!dt_hf_json_has(&r, required[rule][n]))
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: rope_scaling.%s is missing (rope_type %s needs it)", j->path,
                           required[rule][n], type);
    DT_CHECK(dt_hf_json_float(ctx, &r, "factor", 0.0, &c->rope_factor));
    if (rule == DT_ROPE_LINEAR) return DT_OK;
    DT_CHECK(dt_hf_json_int(ctx, &r, "original_max_position_embeddings", c->context, &c->rope_original_context));
    if (rule == DT_ROPE_LLAMA3) {
        DT_CHECK(dt_hf_json_float(ctx, &r, "low_freq_factor", 0.0, &c->rope_low_freq_factor));
        DT_CHECK(dt_hf_json_float(ctx, &r, "high_freq_factor", 0.0, &c->rope_high_freq_factor));
        return DT_OK;
    }
    int truncate;
    DT_CHECK(dt_hf_json_bool(ctx, &r, "truncate", 1, &truncate));
    if (!truncate)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: rope_scaling.truncate false is not supported (dtrain rounds YaRN's "
                       "correction range to whole dimensions)", j->path);
    DT_CHECK(dt_hf_json_float(ctx, &r, "beta_fast", 0.0, &c->rope_beta_fast));
    DT_CHECK(dt_hf_json_float(ctx, &r, "beta_slow", 0.0, &c->rope_beta_slow));
    DT_CHECK(dt_hf_json_float(ctx, &r, "attention_factor", 0.0, &c->rope_attention_factor));
    return DT_OK;
}

/* Hugging Face config.json -> config (src/ckpt/hf_import.c calls it by model_type). */
dt_status dt_llama_hf_read(dt_ctx *ctx, const dt_hf_json *j, dt_model_config *c) {
    DT_CHECK(dt_hf_json_int(ctx, j, "hidden_size", -1, &c->d_model));
    DT_CHECK(dt_hf_json_int(ctx, j, "intermediate_size", -1, &c->d_ff));
    DT_CHECK(dt_hf_json_int(ctx, j, "num_hidden_layers", -1, &c->n_layer));
    DT_CHECK(dt_hf_json_int(ctx, j, "num_attention_heads", -1, &c->n_head));
    DT_CHECK(dt_hf_json_int(ctx, j, "num_key_value_heads", c->n_head, &c->n_kv_head));
    DT_CHECK(dt_hf_json_int(ctx, j, "vocab_size", -1, &c->vocab));
    DT_CHECK(dt_hf_json_int(ctx, j, "max_position_embeddings", 2048, &c->context));
    DT_CHECK(dt_hf_json_float(ctx, j, "rms_norm_eps", 1e-6, &c->norm_eps)); /* LlamaConfig's default */
    DT_CHECK(dt_hf_json_float(ctx, j, "rope_theta", 10000.0, &c->rope_theta));
    int tied, bias = 0, mlp_bias = 0, head_dim, window;
    DT_CHECK(dt_hf_json_bool(ctx, j, "tie_word_embeddings", 0, &tied));
    c->untied = !tied;
    DT_CHECK(dt_hf_json_bool(ctx, j, "attention_bias", 0, &bias));
    DT_CHECK(dt_hf_json_bool(ctx, j, "mlp_bias", 0, &mlp_bias));
    if (bias || mlp_bias)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: %s: true is not supported (dtrain's LLaMA has no biases)",
                       j->path, bias ? "attention_bias" : "mlp_bias");
    static const char *const silu[] = {"silu", NULL};
    DT_CHECK(dt_hf_json_want(ctx, j, "hidden_act", silu));
    DT_CHECK(hf_read_rope_scaling(ctx, j, c));
    DT_CHECK(dt_hf_json_int(ctx, j, "head_dim", c->n_head ? (long)(c->d_model / c->n_head) : 0, &head_dim));
    if (c->n_head < 1 || head_dim * c->n_head != c->d_model)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: head_dim %d x num_attention_heads %d differs from hidden_size %d "
                       "(not supported)", j->path, head_dim, c->n_head, c->d_model);
    DT_CHECK(dt_hf_json_int(ctx, j, "sliding_window", 0, &window));
    if (window > 0 && window < c->context) c->context = window; /* longer sequences would differ */
    const char *type;
    DT_CHECK(dt_hf_json_string(ctx, j, "model_type", &type));
    if (type && !strcmp(type, "mixtral")) { /* MixtralConfig (moe.h): intermediate_size is the experts' */
        DT_CHECK(dt_hf_json_int(ctx, j, "num_local_experts", 8, &c->n_experts));
        DT_CHECK(dt_hf_json_int(ctx, j, "num_experts_per_tok", 2, &c->experts_topk));
        c->expert_d_ff = c->d_ff, c->d_ff = 0;
        float jitter;
        DT_CHECK(dt_hf_json_float(ctx, j, "router_jitter_noise", 0.0, &jitter));
        if (jitter != 0.0f)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: router_jitter_noise %g is not supported (dtrain's router has no "
                           "noise)", j->path, (double)jitter);
        if (c->n_experts < 1)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: num_local_experts must be >= 1 (got %d)", j->path, c->n_experts);
    }
    return DT_OK;
}

/* The shortest decimal that reads back as the same float (1e-05, not 9.99999975e-06). */
static void short_float(char *buf, size_t n, float v) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, n, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) return;
    }
}

/* config.json's rope_scaling for c: null or the object transformers reads. */
static void hf_rope_scaling(const dt_model_config *c, char *buf, size_t n) {
    char f[32], a[32], b[32], d[64];
    short_float(f, sizeof f, c->rope_factor);
    switch ((dt_rope_scaling)c->rope_scaling) {
    case DT_ROPE_NONE:
        snprintf(buf, n, "null");
        return;
    case DT_ROPE_LINEAR:
        snprintf(buf, n, "{\"rope_type\": \"linear\", \"factor\": %s}", f);
        return;
    case DT_ROPE_LLAMA3:
        short_float(a, sizeof a, c->rope_low_freq_factor);
        short_float(b, sizeof b, c->rope_high_freq_factor);
        snprintf(buf, n,
                 "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, "
                 "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %d}",
                 f, a, b, c->rope_original_context);
        return;
    case DT_ROPE_YARN:
        short_float(a, sizeof a, c->rope_beta_fast);
        short_float(b, sizeof b, c->rope_beta_slow);
        if (c->rope_attention_factor != 0.0f) {
            d[0] = ',', d[1] = ' ';
            snprintf(d + 2, sizeof d - 2, "\"attention_factor\": ");
            short_float(d + strlen(d), sizeof d - strlen(d), c->rope_attention_factor);
        } else {
            d[0] = 0;
        }
        snprintf(buf, n,
                 "{\"rope_type\": \"yarn\", \"factor\": %s, \"original_max_position_embeddings\": %d, "
                 "\"beta_fast\": %s, \"beta_slow\": %s%s}",
                 f, c->rope_original_context, a, b, d);
        return;
    }
    snprintf(buf, n, "null");
}

int dt_llama_hf_config(const dt_model_config *c, char *buf, size_t n) {
    char eps[32], theta[32], scaling[512];
    short_float(eps, sizeof eps, c->norm_eps);
    short_float(theta, sizeof theta, c->rope_theta);
    hf_rope_scaling(c, scaling, sizeof scaling);
    if (c->n_experts) /* MixtralConfig: no sliding window, the router's training keys off */
        return snprintf(buf, n,
                        "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
                        "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
                        "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
                        "  \"num_local_experts\": %d,\n  \"num_experts_per_tok\": %d,\n"
                        "  \"router_jitter_noise\": 0.0,\n  \"output_router_logits\": false,\n"
                        "  \"max_position_embeddings\": %d,\n  \"sliding_window\": null,\n  \"rms_norm_eps\": %s,\n"
                        "  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n  \"hidden_act\": \"silu\",\n"
                        "  \"tie_word_embeddings\": %s",
                        c->vocab, c->d_model, c->expert_d_ff, c->n_layer, c->n_head, c->n_kv_head,
                        c->d_model / c->n_head, c->n_experts, c->experts_topk, c->context, eps, theta, scaling,
                        c->untied ? "false" : "true");
    return snprintf(buf, n,
                    "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
                    "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
                    "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
                    "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n"
                    "  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n  \"hidden_act\": \"silu\",\n"
                    "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
                    "  \"tie_word_embeddings\": %s",
                    c->vocab, c->d_model, c->d_ff, c->n_layer, c->n_head, c->n_kv_head,
                    c->d_model / c->n_head, c->context, eps, theta, scaling,
                    c->untied ? "false" : "true");
}

void dt_llama_hf_identity(const dt_model_config *c, const char **arch, const char **type) {
    *arch = c->n_experts ? "MixtralForCausalLM" : "LlamaForCausalLM";
    *type = c->n_experts ? "mixtral" : "llama";
}

