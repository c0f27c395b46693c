/* Instruction data and the loss mask: the cross-entropy kernels skip a negative target (every
 * ISA path), the model's loss is the mean over the counted targets and its gradient the sum
 * of the parts of complementary masks, JSONL examples lay out as the templates say with the
 * mask on the assistant's tokens, and mask files are read, checked and applied by the
 * dataset and the sampler (targets -1, counts over every rank's rows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#include "data/instruct.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "model/model.h"
#include "ops/ops.h"
#include "ops/ops_ref.h"

/* ---- the kernels ---- */

static void ce_case(void) {
    enum { N = 9, V = 50, Vp = 64 };
    float x[N * Vp], loss[N], lse[N], d[N * Vp], loss_m[N], lse_m[N], d_m[N * Vp];
    int32_t tg[N], tg_m[N];
    tu_fill_uniform(x, N * Vp, 3.0f, 11);
    for (int n = 0; n < N; n++) tg[n] = (n * 7) % V, tg_m[n] = n % 3 == 1 ? -1 : tg[n];
    dt_crossentropy_forward(loss, lse, x, tg, N, V, Vp);
    dt_crossentropy_forward(loss_m, lse_m, x, tg_m, N, V, Vp);
    dt_crossentropy_backward(d, x, lse, tg, 0.25f, N, V, Vp);
    dt_crossentropy_backward(d_m, x, lse_m, tg_m, 0.25f, N, V, Vp);
    for (int n = 0; n < N; n++) {
        if (tg_m[n] < 0) { /* not counted: no loss, no gradient */
            assert_true(loss_m[n] == 0.0f);
            for (int v = 0; v < Vp; v++) assert_true(d_m[n * Vp + v] == 0.0f);
        } else { /* counted rows: the bits of the unmasked call */
            assert_memory_equal(&loss_m[n], &loss[n], sizeof(float));
            assert_memory_equal(d_m + n * Vp, d + n * Vp, Vp * sizeof(float));
        }
    }
    double xd[N * Vp], ld[N], lsed[N], dd[N * Vp];
    tu_to_double(xd, x, N * Vp);
    dt_ref_crossentropy_forward(ld, lsed, xd, tg_m, N, V, Vp);
    dt_ref_crossentropy_backward(dd, xd, lsed, tg_m, 0.25, N, V, Vp);
    tu_report("masked cross-entropy loss vs double", tu_rel_err(loss_m, ld, N), 1e-5);
    tu_report("masked cross-entropy dlogits vs double", tu_rel_err(d_m, dd, N * Vp), 1e-5);
}

static void test_crossentropy_mask(void **state) {
    (void)state;
    tu_each_isa(ce_case);
}

/* ---- the model ---- */

static float forward_loss(dt_model *m, const int32_t *in, const int32_t *tg) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    float l = NAN;
    assert_int_equal(dt_model_forward(&ctx, m, in, tg, &l), DT_OK);
    return l;
}

static void grads_of(dt_model *m, const int32_t *in, const int32_t *tg, float *out) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    memset(m->ps.grads, 0, m->ps.n_params * sizeof(float));
    float l;
    assert_int_equal(dt_model_forward(&ctx, m, in, tg, &l), DT_OK);
    dt_model_backward(m, 1.0f);
    memcpy(out, m->ps.grads, m->ps.n_params * sizeof(float));
}

/* The masked loss is the mean of the counted rows' own losses (each taken from a forward that
 * counts that row alone, so the same bits); complementary masks' gradients add up to the
 * unmasked one (each is scale / N per counted row); nothing counted: zero gradient. */
static void mask_case(const char *preset_family, dt_model_config c) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    enum { B = 2, T = 8, N = B * T };
    dt_model m;
    assert_int_equal(dt_model_init(&ctx, &m, &c, &a, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&m, 3);
    int32_t in[N], tg[N], one[N], msk[N], rest[N], none[N];
    for (int i = 0; i < N; i++) in[i] = (i * 13 + 5) % c.vocab, tg[i] = (i * 29 + 1) % c.vocab;
    double sum = 0;
    int cnt = 0;
    for (int i = 0; i < N; i++) {
        int counted = i % 3 != 0;
        msk[i] = counted ? tg[i] : -1;
        rest[i] = counted ? -1 : tg[i];
        none[i] = -1;
        if (!counted) continue;
        for (int j = 0; j < N; j++) one[j] = j == i ? tg[i] : -1;
        sum += forward_loss(&m, in, one);
        cnt++;
    }
    float lm = forward_loss(&m, in, msk), want = (float)(sum / cnt);
    printf("  %s: masked loss %.7f, mean of the %d counted rows' losses %.7f\n", preset_family, lm, cnt, want);
    assert_memory_equal(&lm, &want, sizeof lm);
    assert_true(forward_loss(&m, in, none) == 0.0f);
    size_t P = m.ps.n_params;
    float *gf = tu_malloc(P * 4), *gm = tu_malloc(P * 4), *gr = tu_malloc(P * 4), *g0 = tu_malloc(P * 4);
    double *sumd = tu_malloc(P * 8);
    grads_of(&m, in, tg, gf);
    grads_of(&m, in, msk, gm);
    grads_of(&m, in, rest, gr);
    grads_of(&m, in, none, g0);
    for (size_t i = 0; i < P; i++) sumd[i] = (double)gm[i] + gr[i];
    double e = tu_rel_err(gf, sumd, P);
    char what[96];
    snprintf(what, sizeof what, "%s: grad(mask) + grad(complement) vs grad(all)", preset_family);
    tu_report(what, e, 1e-5);
    for (size_t i = 0; i < P; i++) assert_true(g0[i] == 0.0f);
    double diff = 0;
    for (size_t i = 0; i < P; i++) diff = tu_worse(diff, fabs((double)gm[i] - gf[i]));
    assert_true(diff > 1e-6); /* the mask changed something */
    free(gf), free(gm), free(gr), free(g0), free(sumd);
    dt_model_free(&m);
}

static void test_model_loss_mask(void **state) {
    (void)state;
    dt_model_config g = {.n_layer = 2, .d_model = 32, .n_head = 4, .vocab = 70, .context = 16};
    mask_case("gpt2", g);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config l;
    assert_int_equal(dt_model_preset(&ctx, "llama-tiny", &l), DT_OK);
    l.n_layer = 2, l.vocab = 90, l.context = 16;
    mask_case("llama", l);
}

/* ---- examples -> tokens + mask (byte tokenizer: a token is a byte) ---- */

static void encode(const dt_tokenizer *tok, dt_chat_template t, const char *json, char *text, char *counted) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *ex = cJSON_Parse(json);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(dt_instruct_encode(&ctx, tok, t, ex, "x.jsonl:1", &ids, &mask, &n, &cap), DT_OK);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        text[i] = (char)ids[i];
        if (mask[i]) counted[k++] = (char)ids[i];
    }
    text[n] = 0, counted[k] = 0;
    free(ids), free(mask);
    cJSON_Delete(ex);
}

static void refuse(const dt_tokenizer *tok, const char *json, const char *msg) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    cJSON *ex = cJSON_Parse(json);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(dt_instruct_encode(&ctx, tok, DT_TEMPLATE_CHATML, ex, "x.jsonl:7", &ids, &mask, &n, &cap),
                     DT_ERR_FORMAT);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, "x.jsonl:7"));
    assert_non_null(strstr(ctx.err, msg));
    free(ids), free(mask);
    cJSON_Delete(ex);
}

static void test_templates(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_tokenizer *tok;
    assert_int_equal(dt_tokenizer_open_byte(&ctx, &tok), DT_OK);
    char text[512], counted[512];
    encode(tok, DT_TEMPLATE_PLAIN, "{\"prompt\": \"Q: 2+2?\", \"response\": \" 4\"}", text, counted);
    assert_string_equal(text, "Q: 2+2? 4\n");
    assert_string_equal(counted, " 4\n");
    encode(tok, DT_TEMPLATE_CHATML, "{\"prompt\": \"hi\", \"response\": \"yo\"}", text, counted);
    assert_string_equal(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n\n");
    assert_string_equal(counted, "yo<|im_end|>\n");
    const char *chat = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U1\"},"
                       " {\"role\": \"assistant\", \"content\": \"A1\"}, {\"role\": \"user\", \"content\": \"U2\"},"
                       " {\"role\": \"assistant\", \"content\": \"A2\"}]}";
    encode(tok, DT_TEMPLATE_CHATML, chat, text, counted);
    assert_string_equal(text, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1"
                              "<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\nA2<|im_end|>\n\n");
    assert_string_equal(counted, "A1<|im_end|>\nA2<|im_end|>\n");
    encode(tok, DT_TEMPLATE_PLAIN, chat, text, counted);
    assert_string_equal(text, "S\nU1\nA1\nU2\nA2\n");
    assert_string_equal(counted, "A1\nA2\n");
    refuse(tok, "[1, 2]", "not a JSON object");
    refuse(tok, "{\"prompt\": \"p\"}", "key 'response' must be a string");
    refuse(tok, "{\"prompt\": 3, \"response\": \"r\"}", "key 'prompt' must be a string");
    refuse(tok, "{\"messages\": []}", "key 'messages' must be a non-empty array");
    refuse(tok, "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}]}", "no assistant message");
    refuse(tok, "{\"messages\": [{\"role\": \"bot\", \"content\": \"u\"}]}", "messages[0]: role 'bot'");
    refuse(tok, "{\"messages\": [{\"role\": \"assistant\"}]}", "messages[0]: key 'content'");
    dt_chat_template t;
    assert_int_equal(dt_chat_template_parse("chatml", &t), 0);
    assert_int_equal(t, DT_TEMPLATE_CHATML);
    assert_int_equal(dt_chat_template_parse("llama", &t), -1);
    dt_tokenizer_free(tok);
}

/* ---- mask files, the dataset and the sampler ---- */

static char dir[256];

static void write_pair(const char *name, const int32_t *tok, const uint8_t *mask, uint64_t n) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char p[512], mp[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    assert_int_equal(dt_shard_write(&ctx, p, tok, n, 256), DT_OK);
    if (mask) {
        snprintf(mp, sizeof mp, "%s.mask", p);
        assert_int_equal(dt_mask_write(&ctx, mp, mask, n), DT_OK);
    }
}

static void open_fails(const char *spec, const char *msg) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    char s[512];
    snprintf(s, sizeof s, "%s/%s", dir, spec);
    assert_int_equal(dt_dataset_open(&ctx, &ds, s, "auto", 256), DT_ERR_FORMAT);
    printf("  refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, msg));
}

static void test_mask_files_and_sampler(void **state) {
    (void)state;
    assert_int_equal(tu_mkdtemp(dir, sizeof dir, "instruct"), 0);
    enum { NT = 301, T = 8 };
    int32_t tok[NT];
    uint8_t mask[NT];
    for (int i = 0; i < NT; i++) tok[i] = (i * 37) % 256, mask[i] = (uint8_t)((i / 5) % 3 != 0);
    write_pair("a_000.bin", tok, mask, NT);
    write_pair("a_001.bin", tok + 1, mask + 1, NT - 1);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_dataset *ds;
    char spec[512];
    snprintf(spec, sizeof spec, "%s/a_*.bin", dir);
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 256), DT_OK);
    assert_true(dt_dataset_has_loss_mask(ds));
    uint8_t got[40];
    dt_dataset_read_mask(ds, 1, 10, 40, got);
    assert_memory_equal(got, mask + 11, 40);
    /* the sampler: targets whose mask byte is 0 are -1; the step's count is every rank's */
    dt_sampler *s;
    assert_int_equal(dt_sampler_init(&ctx, &s, ds, T, 9, 1), DT_OK);
    const int W = 2, Bm = 3, A = 2;
    int32_t in[Bm * T], tg[Bm * T], tg_plain[Bm * T];
    for (uint64_t cursor = 0; cursor < 200; cursor += (uint64_t)W * Bm * A) {
        uint64_t brute = 0;
        for (int r = 0; r < W; r++)
            for (int k = 0; k < A; k++) {
                dt_sampler_fill(s, cursor, W, r, Bm, A, k, in, tg);
                for (int b = 0; b < Bm; b++) { /* against the shard's own bytes */
                    int shard;
                    uint64_t start;
                    dt_sampler_locate(s, dt_sampler_sample_id(s, dt_sampler_position(cursor, W, r, Bm, k, b)), &shard, &start);
                    const int32_t *tk = shard == 0 ? tok : tok + 1;
                    const uint8_t *mk = shard == 0 ? mask : mask + 1;
                    for (int t = 0; t < T; t++) {
                        tg_plain[b * T + t] = tk[start + 1 + t];
                        assert_int_equal(tg[b * T + t], mk[start + 1 + t] ? tg_plain[b * T + t] : -1);
                        brute += mk[start + 1 + t];
                    }
                }
            }
        assert_int_equal(dt_sampler_count_targets(s, cursor, W, Bm, A), brute);
    }
    dt_sampler_state st = dt_sampler_state_get(s, 0);
    dt_sampler_free(s);
    dt_dataset_close(ds);
    /* the same shards without masks: another layout (a resume across it is refused) */
    write_pair("b_000.bin", tok, NULL, NT);
    snprintf(spec, sizeof spec, "%s/b_000.bin", dir);
    assert_int_equal(dt_dataset_open(&ctx, &ds, spec, "auto", 256), DT_OK);
    assert_false(dt_dataset_has_loss_mask(ds));
    assert_int_equal(dt_sampler_init(&ctx, &s, ds, T, 9, 1), DT_OK);
    assert_int_equal(dt_sampler_count_targets(s, 0, W, Bm, A), (uint64_t)W * Bm * A * T);
    dt_sampler_state plain = dt_sampler_state_get(s, 0);
    assert_true(plain.layout != st.layout);
    dt_sampler_free(s);
    dt_dataset_close(ds);
    /* bad masks, each named */
    write_pair("c_000.bin", tok, mask, NT);
    write_pair("c_001.bin", tok, NULL, NT);
    open_fails("c_*.bin", "c_001.bin has no loss mask");
    write_pair("d_000.bin", tok, mask, NT);
    char p[512];
    snprintf(p, sizeof p, "%s/d_000.bin.mask", dir);
    assert_int_equal(dt_mask_write(&ctx, p, mask, NT - 1), DT_OK); /* one byte short */
    open_fails("d_000.bin", "mask bytes (header says 300) for the 301 tokens");
    uint8_t bad[NT];
    memcpy(bad, mask, NT);
    bad[17] = 2;
    assert_int_equal(dt_mask_write(&ctx, p, bad, NT), DT_OK);
    open_fails("d_000.bin", "byte 17 is 2, not 0 or 1");
    FILE *f = fopen(p, "r+b");
    fwrite("junk", 1, 4, f);
    fclose(f);
    open_fails("d_000.bin", "not a loss mask");
    tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crossentropy_mask),
        cmocka_unit_test(test_model_loss_mask),
        cmocka_unit_test(test_templates),
        cmocka_unit_test(test_mask_files_and_sampler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
