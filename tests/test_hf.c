/* Hugging Face directories: export -> import round trip bitwise for GPT-2 (Conv1D
 * transposes) and LLaMA (tied and untied heads, multi-query, each RoPE scaling rule),
 * config.json refusals naming
 * the key, sharded checkpoints through model.safetensors.index.json, a shard path that
 * leaves the directory, a missing tensor. (F16/BF16 files and the independent PyTorch
 * forward are in tests/test_interop.sh.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hf_import.h"
#include "ckpt/interop.h"
#include "ckpt/model_file.h"
#include "ckpt/safetensors.h"
#include "model/model.h"
#include "testutil.h"

static void make_model(dt_ctx *ctx, dt_alloc *a, dt_model *m, dt_model_config c, uint64_t seed) {
    assert_int_equal(dt_model_init(ctx, m, &c, a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    dt_model_init_weights(m, seed);
    /* Make every tensor distinct (norm weights start at 1, biases at 0). */
    for (size_t i = 0; i < m->ps.n_params; i++) m->ps.params[i] += 1e-3f * (float)(i % 97);
    /* ... except vocabulary padding, which files do not hold and loads zero. */
    for (int id = 0; id < m->ps.n_tensors; id++) {
        const dt_tensor_info *t = &m->ps.tensors[id];
        if (t->rows == t->file_rows) continue;
        float *p = dt_params_tensor(&m->ps, m->ps.params, id, 0);
        memset(p + t->file_rows * t->cols, 0, (t->rows - t->file_rows) * t->cols * sizeof(float));
    }
}

static void round_trip(dt_model_config c, const char *label) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    dt_alloc a;
    dt_alloc_init(&a);
    char dir[256], file[300], out[300];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "hf"), 0);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    dt_model m, back;
    make_model(&ctx, &a, &m, c, 7);
    assert_int_equal(dt_model_file_save(&ctx, &m, file, "byte", 0), DT_OK);
    if (dt_hf_export(&ctx, file, out) != DT_OK) fail_msg("%s: export: %s", label, ctx.err);
    assert_true(dt_hf_is_dir(out));
    dt_model_config got;
    char tok[16];
    if (dt_model_import_config(&ctx, out, &got, tok, sizeof tok) != DT_OK) fail_msg("%s: %s", label, ctx.err);
    assert_true(dt_model_config_equal(&got, &m.cfg));
    assert_string_equal(tok, "byte");
    assert_int_equal(dt_model_init(&ctx, &back, &got, &a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    for (size_t i = 0; i < back.ps.n_params; i++) back.ps.params[i] = 12345.0f; /* padding must be zeroed */
    if (dt_model_import(&ctx, &back, out) != DT_OK) fail_msg("%s: import: %s", label, ctx.err);
    assert_int_equal(back.ps.n_params, m.ps.n_params);
    assert_memory_equal(back.ps.params, m.ps.params, m.ps.n_params * sizeof(float));
    printf("  %s: %zu parameters, export -> import bitwise\n", label, m.ps.n_params);
    /* Another configuration is refused, naming both. */
    dt_model other;
    dt_model_config c2 = m.cfg;
    c2.n_layer++;
    assert_int_equal(dt_model_init(&ctx, &other, &c2, &a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    assert_int_equal(dt_model_import(&ctx, &other, out), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "differs"));
    dt_model_free(&other);
    dt_model_free(&back);
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
}

static void test_export_import_round_trip(void **state) {
    (void)state;
    round_trip((dt_model_config){.n_layer = 2, .d_model = 48, .n_head = 4, .vocab = 300, .context = 32},
               "gpt2");
    round_trip((dt_model_config){.family = "llama", .n_layer = 2, .d_model = 48, .n_head = 4, .n_kv_head = 2,
                                 .d_ff = 72, .vocab = 300, .context = 32, .untied = 1, .rope_theta = 500.0f},
               "llama untied GQA");
    round_trip((dt_model_config){.family = "llama", .n_layer = 3, .d_model = 32, .n_head = 4, .n_kv_head = 1,
                                 .vocab = 260, .context = 16, .norm_eps = 1e-6f},
               "llama tied MQA");
    /* RoPE scaling: the model file and config.json carry the rule and its parameters. */
    const dt_model_config l = {.family = "llama", .n_layer = 1, .d_model = 32, .n_head = 4, .vocab = 100,
                               .context = 256, .rope_theta = 500000.0f};
    dt_model_config s = l;
    s.rope_scaling = 1, s.rope_factor = 2.5f;
    round_trip(s, "llama linear x2.5");
    s = l;
    s.rope_scaling = 2, s.rope_factor = 8.0f, s.rope_low_freq_factor = 1.0f, s.rope_high_freq_factor = 4.0f;
    s.rope_original_context = 64;
    round_trip(s, "llama llama3 (8, 1, 4, 64)");
    s = l;
    s.rope_scaling = 3, s.rope_factor = 4.0f, s.rope_original_context = 64;
    round_trip(s, "llama yarn x4 (default betas, attention factor)");
    s.rope_beta_fast = 24.0f, s.rope_beta_slow = 1.5f, s.rope_attention_factor = 0.110000014f;
    round_trip(s, "llama yarn x4 (betas 24/1.5, attention factor 0.110000014: 9 digits)");
}

/* config.json text for a tiny LLaMA with one extra member (a JSON fragment or ""). */
static const char *llama_json(char *buf, size_t n, const char *extra) {
    snprintf(buf, n,
             "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 64, "
             "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
             "\"vocab_size\": 100, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05%s%s}",
             extra[0] ? ", " : "", extra);
    return buf;
}

static void expect_refused(const char *dir, const char *extra, const char *key) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char buf[1024];
    tu_write_file(dir, "config.json", llama_json(buf, sizeof buf, extra));
    dt_model_config c;
    assert_int_not_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_OK);
    printf("  refused: %s\n", ctx.err);
    if (!strstr(ctx.err, key)) fail_msg("'%s' does not name %s", ctx.err, key);
    assert_null(strchr(ctx.err, '\n'));
}

static void test_config_json(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char dir[256], buf[1024];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "hfcfg"), 0);
    tu_write_file(dir, "config.json", llama_json(buf, sizeof buf, "\"sliding_window\": 16"));
    dt_model_config c;
    assert_int_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_OK);
    assert_string_equal(c.family, "llama");
    assert_int_equal(c.n_kv_head, 2);
    assert_int_equal(c.d_ff, 64);
    assert_int_equal(c.untied, 1); /* LlamaConfig: tie_word_embeddings defaults to false */
    assert_true(c.rope_theta == 10000.0f && c.norm_eps == 1e-5f);
    assert_int_equal(c.context, 16); /* the sliding window bounds the sequence */
    expect_refused(dir, "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0}", "rope_scaling.low_freq_factor");
    expect_refused(dir, "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}", "rope_scaling.rope_type");
    expect_refused(dir, "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": \"2\"}", "rope_scaling.factor");
    expect_refused(dir, "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"beta_fast\": 8}",
                   "rope_scaling.beta_fast");
    tu_write_file(dir, "config.json",
                  llama_json(buf, sizeof buf,
                             "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
                             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8}"));
    assert_int_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_OK);
    assert_int_equal(c.rope_scaling, 2);
    assert_true(c.rope_factor == 32.0f && c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    assert_int_equal(c.rope_original_context, 8);
    assert_int_equal(c.context, 64);
    expect_refused(dir, "\"attention_bias\": true", "attention_bias");
    expect_refused(dir, "\"hidden_act\": \"gelu\"", "hidden_act");
    expect_refused(dir, "\"head_dim\": 16", "head_dim");
    tu_write_file(dir, "config.json",
                  "{\"model_type\": \"mistral\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                  "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 3, "
                  "\"vocab_size\": 100}");
    assert_int_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_ERR_CONFIG);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "n_kv_head"));
    tu_write_file(dir, "config.json", "{\"model_type\": \"bert\"}");
    assert_int_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_ERR_CONFIG);
    assert_non_null(strstr(ctx.err, "model_type 'bert'"));
    tu_write_file(dir, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 32}");
    assert_int_not_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_OK);
    assert_non_null(strstr(ctx.err, "intermediate_size"));
    tu_write_file(dir, "config.json", "{not json");
    assert_int_equal(dt_hf_config(&ctx, dir, &c, NULL, 0), DT_ERR_FORMAT);
}

static void test_sharded_and_damaged(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    ctx.log_level = 0;
    dt_alloc a;
    dt_alloc_init(&a);
    char dir[256], file[300], hf[300], path[400];
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "hfsh"), 0);
    dt_model_config c = {.family = "llama", .n_layer = 2, .d_model = 32, .n_head = 4, .n_kv_head = 2,
                         .vocab = 100, .context = 16, .untied = 1};
    dt_model m, back;
    make_model(&ctx, &a, &m, c, 3);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    assert_int_equal(dt_model_file_save(&ctx, &m, file, "", 0), DT_OK);
    assert_int_equal(dt_hf_export(&ctx, file, hf), DT_OK);
    /* Split the export into two shards named by an index, as HF writes large models. */
    dt_st_file *f;
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    assert_int_equal(dt_st_open(&ctx, path, &f), DT_OK);
    int n = dt_st_count(f), half = n / 2;
    dt_st_entry *e = tu_malloc((size_t)n * sizeof *e);
    char index[8192];
    size_t len = (size_t)snprintf(index, sizeof index, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = dt_st_at(f, i);
        e[i] = (dt_st_entry){t->name, t->dtype, t->ndim, {t->shape[0], t->shape[1]}, t->data};
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"",
                                i ? ", " : "", t->name, i < half ? 1 : 2);
    }
    snprintf(index + len, sizeof index - len, "}}");
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", hf);
    assert_int_equal(dt_st_write(&ctx, path, e, half, NULL), DT_OK);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", hf);
    assert_int_equal(dt_st_write(&ctx, path, e + half, n - half, NULL), DT_OK);
    dt_st_close(f);
    free(e);
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    assert_int_equal(unlink(path), 0);
    tu_write_file(hf, "model.safetensors.index.json", index);
    assert_int_equal(dt_model_init(&ctx, &back, &m.cfg, &a, 1, 8, DT_SLAB_PARAMS), DT_OK);
    if (dt_model_import(&ctx, &back, hf) != DT_OK) fail_msg("sharded import: %s", ctx.err);
    assert_memory_equal(back.ps.params, m.ps.params, m.ps.n_params * sizeof(float));
    printf("  2 shards through model.safetensors.index.json: bitwise\n");
    /* A shard that would be read from outside the directory is refused. */
    tu_write_file(hf, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"../model-00001-of-00002.safetensors\"}}");
    assert_int_equal(dt_model_import(&ctx, &back, hf), DT_ERR_FORMAT);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "not a file name"));
    /* An index naming only the first shard: the second half of the tensors is missing. */
    tu_write_file(hf, "model.safetensors.index.json",
                  "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(dt_model_import(&ctx, &back, hf), DT_ERR_FORMAT);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "is missing"));
    dt_model_free(&back);
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_import_round_trip),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_sharded_and_damaged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
