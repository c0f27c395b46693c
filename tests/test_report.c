/* dtrain report, piece by piece: number formatting, axis ticks, scaling efficiency against
 * hand computations from the fixture files, the recommendation rules (with and without a
 * memory budget, a broken loss hash, partial data), schema errors naming file and key, and
 * the page itself (marks drawn = marks declared, empty charts replaced by a note, strings
 * escaped, nothing external). Fixtures: tests/data/report (make_fixtures.py, report_fixtures.h);
 * tensor-parallel runs: test_report_tp.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "report/svg.h"
#include "testutil.h"

#include "report_fixtures.h"

static const dt_rep_rec *rec_of(const dt_report *r, dt_rep_topic topic, dt_rep_level level) {
    for (int i = 0; i < r->nrec; i++)
        if (r->rec[i].topic == topic && r->rec[i].level == level) return &r->rec[i];
    return NULL;
}

static void expect_rec(const dt_report *r, dt_rep_topic topic, dt_rep_level level, const char *text) {
    const dt_rep_rec *x = rec_of(r, topic, level);
    if (!x) {
        for (int i = 0; i < r->nrec; i++) fprintf(stderr, "  rec %d/%d: %s\n", r->rec[i].topic, r->rec[i].level, r->rec[i].text);
        fail_msg("no recommendation of topic %d level %d", topic, level);
    }
    if (text && !strstr(x->text, text)) fail_msg("'%s' not in: %s", text, x->text);
}

/* ---- formatting and ticks ---------------------------------------------------------- */

static void test_fmt_num(void **state) {
    (void)state;
    static const struct {
        double v;
        const char *s;
    } cases[] = {{0, "0"},         {12, "12"},        {0.5, "0.5"},     {12.5, "12.5"},  {1234567, "1.23M"},
                 {999.96, "1k"},   {11482.3, "11.5k"}, {-1500, "-1.5k"}, {0.0123, "0.0123"}, {2.5e9, "2.5G"},
                 {100000, "100k"}, {NAN, "n/a"}};
    char b[32];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dt_report_fmt_num(b, sizeof b, cases[i].v);
        if (strcmp(b, cases[i].s)) fail_msg("fmt_num(%g) = '%s', want '%s'", cases[i].v, b, cases[i].s);
    }
    static const struct {
        double v;
        const char *s;
    } bytes[] = {{100, "100 B"},          {1536, "1.5 KiB"},        {3 << 20, "3 MiB"}, {1023.9 * 1024, "1 MiB"},
                 {662.4 * 1048576, "662 MiB"}, {1.5 * 1073741824.0, "1.5 GiB"}, {0, "0 B"}};
    for (size_t i = 0; i < sizeof bytes / sizeof *bytes; i++) {
        dt_report_fmt_bytes(b, sizeof b, bytes[i].v);
        if (strcmp(b, bytes[i].s)) fail_msg("fmt_bytes(%g) = '%s', want '%s'", bytes[i].v, b, bytes[i].s);
    }
}

static void test_ticks_linear(void **state) {
    (void)state;
    double t[32];
    int n = dt_svg_ticks(0, 11482, 6, t, 32);
    const double want[] = {0, 2500, 5000, 7500, 10000, 12500};
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) assert_true(t[i] == want[i]);
    /* exact decimal steps: 0.3 is 0.3, not 0.30000000000000004 */
    n = dt_svg_ticks(0, 0.3, 4, t, 32);
    assert_int_equal(n, 4);
    assert_true(t[3] == 0.3 && t[1] == 0.1);
    /* a narrow range (loss curves): covers the data, step 0.005 */
    n = dt_svg_ticks(5.5515, 5.5841, 6, t, 32);
    assert_true(n >= 5 && n <= 9);
    assert_true(t[0] <= 5.5515 && t[n - 1] >= 5.5841);
    assert_true(fabs((t[1] - t[0]) - 0.005) < 1e-12);
    /* a single value is widened, never a zero-width axis */
    n = dt_svg_ticks(5, 5, 5, t, 32);
    assert_true(n >= 2 && t[0] < 5 && t[n - 1] > 5);
    /* reversed bounds and negative values */
    n = dt_svg_ticks(10, -10, 5, t, 32);
    assert_true(n >= 3 && t[0] <= -10 && t[n - 1] >= 10);
    assert_int_equal(dt_svg_ticks(NAN, 1, 5, t, 32), 0);
}

static void test_ticks_log2(void **state) {
    (void)state;
    double t[32];
    int n = dt_svg_ticks_log2(1024, 64 << 20, 8, t, 32);
    assert_true(n >= 2 && n <= 8);
    assert_true(t[0] <= 1024 && t[n - 1] >= (64 << 20));
    for (int i = 0; i < n; i++) {
        int e;
        assert_true(frexp(t[i], &e) == 0.5); /* a power of two */
        if (i) assert_true(t[i] > t[i - 1]);
    }
    n = dt_svg_ticks_log2(1, 2, 8, t, 32);
    assert_int_equal(n, 2);
    assert_true(t[0] == 1 && t[1] == 2);
    n = dt_svg_ticks_log2(1, 1, 8, t, 32); /* one world size */
    assert_true(n >= 2 && t[0] <= 1 && t[n - 1] >= 1);
    assert_int_equal(dt_svg_ticks_log2(0, 8, 8, t, 32), 0);
}

/* ---- efficiency ------------------------------------------------------------------- */

static void test_efficiency(void **state) {
    (void)state;
    dt_report *r = load_full(NULL, NULL);
    dt_report_analyze(r, 0);
    assert_int_equal(r->ntrain, 7);
    assert_int_equal(r->ncomm, 1);
    const dt_rep_train *w1 = by_file(r, "ddp-w1.json"), *w1a = by_file(r, "ddp-w1-acc2.json");
    /* weak: same per-rank batch (mb8 x 1), one rank -> two ranks */
    const char *two[] = {"ddp-w2.json", "zero1-w2.json", "zero3-w2.json", "ddp-w2-bk4.json"};
    for (int i = 0; i < 4; i++) {
        const dt_rep_train *t = by_file(r, two[i]);
        double want = t->tokens_per_s.mean / (2 * w1->tokens_per_s.mean);
        assert_true(fabs(t->weak_calc - want) < 1e-12);
        assert_string_equal(r->train[t->weak_base].file, "ddp-w1.json");
        /* strong: the global batch 16 of one rank with 2 accumulation steps */
        want = t->tokens_per_s.mean / (2 * w1a->tokens_per_s.mean);
        assert_true(fabs(t->strong_calc - want) < 1e-12);
        assert_string_equal(r->train[t->strong_base].file, "ddp-w1-acc2.json");
        assert_true(t->weak_calc > 0.8 && t->weak_calc < 1.0);
    }
    /* micro-batch 4 x accum 2 at 2 ranks: no 1-rank run of that per-rank shape (weak) */
    const dt_rep_train *mb4 = by_file(r, "ddp-w2-mb4.json");
    assert_true(isnan(mb4->weak_calc));
    assert_int_equal(mb4->weak_base, -1);
    assert_true(isfinite(mb4->strong_calc));
    assert_true(isnan(w1->weak_calc) && isnan(w1->strong_calc)); /* the baseline itself */
    dt_report_free(r);
}

/* ---- recommendations ------------------------------------------------------------- */

static void test_recommend_no_budget(void **state) {
    (void)state;
    dt_report *r = load_full(NULL, NULL);
    dt_report_analyze(r, 0);
    /* ZeRO-1 is within noise of DDP (1.1% slower) and saves its optimizer half: 114 MiB */
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "Use zero1 at 2 ranks");
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "114 MiB/rank");
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "zero3 saves 220 MiB/rank (33%) at 12.4% lower");
    /* 25 MiB buckets beat 4 MiB by more than noise */
    expect_rec(r, DT_REP_TOPIC_BUCKET, DT_REP_RECOMMEND, "Use 25 MiB buckets");
    expect_rec(r, DT_REP_TOPIC_BUCKET, DT_REP_RECOMMEND, "4.4% more throughput");
    /* micro-batch 8 x 1 vs 4 x 2 at the same global batch: 8.1% faster for 96 MiB */
    expect_rec(r, DT_REP_TOPIC_MICROBATCH, DT_REP_RECOMMEND, "Use micro-batch 8 with 1 accumulation");
    expect_rec(r, DT_REP_TOPIC_MICROBATCH, DT_REP_RECOMMEND, "96 MiB/rank more memory");
    /* loss hashes: the bitwise-equal runs agree; mb4 differs only by rounding -> info */
    assert_null(rec_of(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING));
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_INFO, "agree to 3.0e-08");
    assert_null(rec_of(r, DT_REP_TOPIC_STRATEGY, DT_REP_NODATA));
    dt_report_free(r);
}

static void test_recommend_budget(void **state) {
    (void)state;
    dt_report *r = load_full(NULL, NULL);
    /* 1 GiB: DDP's 662 MiB is 65% of it -> DDP */
    dt_report_analyze(r, 1024.0 * 1048576);
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "Use DDP at 2 ranks");
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "65% of the 1 GiB budget");
    /* 600 MiB: DDP does not fit; ZeRO-1 (548 MiB) is the fastest that does */
    dt_report_analyze(r, 600.0 * 1048576);
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "Use zero1 at 2 ranks: DDP's peak of 662 MiB/rank");
    /* 500 MiB: only ZeRO-3 (442 MiB) fits */
    dt_report_analyze(r, 500.0 * 1048576);
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_RECOMMEND, "Use zero3");
    /* 300 MiB: nothing fits -> a warning, not a recommendation */
    dt_report_analyze(r, 300.0 * 1048576);
    expect_rec(r, DT_REP_TOPIC_STRATEGY, DT_REP_WARNING, "No measured strategy fits the 300 MiB budget");
    expect_rec(r, DT_REP_TOPIC_MICROBATCH, DT_REP_WARNING, "No measured micro-batch fits");
    dt_report_free(r);
}

/* zero3-w2 diverges from DDP at measured step 7 */
static void break_zero3_loss(cJSON *root) {
    cJSON *runs = cJSON_GetObjectItem(root, "runs");
    cJSON *run;
    cJSON_ArrayForEach(run, runs) {
        cJSON *loss = cJSON_GetObjectItem(run, "loss");
        cJSON_ReplaceItemInArray(loss, 6, cJSON_CreateNumber(cJSON_GetArrayItem(loss, 6)->valuedouble + 0.01));
        cJSON_ReplaceItemInObject(run, "loss_hash", cJSON_CreateString("deadbeefdeadbeef"));
    }
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "summary"), "loss_hash", cJSON_CreateString("deadbeefdeadbeef"));
}

/* a repeat with another hash: not deterministic */
static void break_repeat(cJSON *root) {
    cJSON *run = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "runs"), 2);
    cJSON_ReplaceItemInObject(run, "loss_hash", cJSON_CreateString("0123456789abcdef"));
}

static void test_loss_mismatch(void **state) {
    (void)state;
    dt_report *r = load_full("zero3-w2.json", break_zero3_loss);
    dt_report_analyze(r, 0);
    const dt_rep_train *z3 = by_file(r, "zero3-w2.json");
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING, "Loss mismatch");
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING, z3->label);
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING, "at measured step 7");
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING, "deadbeefdeadbeef");
    dt_report_free(r);
    r = load_full("ddp-w2.json", break_repeat);
    dt_report_analyze(r, 0);
    expect_rec(r, DT_REP_TOPIC_LOSS, DT_REP_WARNING, "is not deterministic: repeat 3");
    dt_report_free(r);
}

static void test_partial_data(void **state) {
    (void)state;
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    const char *p = fixture("partial", "only-w1.json");
    dt_report *r;
    assert_int_equal(dt_report_load(&ctx, &p, 1, &r), DT_OK);
    dt_report_analyze(r, 0);
    /* one run at one rank: every topic says there is not enough data */
    for (int t = 0; t < DT_REP_TOPIC_N; t++) expect_rec(r, (dt_rep_topic)t, DT_REP_NODATA, "o");
    assert_int_equal(r->nrec, DT_REP_TOPIC_N);
    assert_true(isnan(r->train[0].mfu.mean));
    /* the page: only the throughput chart draws; the others carry a note */
    char *html;
    page(r, &html);
    int figs = 0, notes = 0, svgs = 0;
    for (const char *s = html; (s = strstr(s, "<figure")); s++) figs++;
    for (const char *s = html; (s = strstr(s, "class=\"note\">No data:")); s++) notes++;
    for (const char *s = html; (s = strstr(s, "<svg")); s++) svgs++;
    assert_int_equal(figs, 6);
    assert_int_equal(svgs, 1);
    assert_int_equal(notes, 5);
    assert_non_null(strstr(html, "id=\"chart-throughput\""));
    free(html);
    dt_report_free(r);
}

/* ---- schema errors --------------------------------------------------------------- */

static void del_path(cJSON *root, const char *a, const char *b, const char *c) {
    cJSON *o = root;
    if (b) o = cJSON_GetObjectItem(o, a);
    if (c) o = cJSON_GetObjectItem(o, b);
    cJSON_DeleteItemFromObject(o, c ? c : b ? b : a);
}
static void e_idle(cJSON *r) { del_path(r, "summary", "breakdown_s", "idle"); }
static void e_world(cJSON *r) { del_path(r, "parallel", "world", NULL); }
static void e_rss(cJSON *r) { cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "memory"), 1), "rss"); }
static void e_loss(cJSON *r) {
    cJSON *loss = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "runs"), 0), "loss");
    cJSON_ReplaceItemInArray(loss, 2, cJSON_CreateString("nan"));
}
static void e_kind(cJSON *r) { cJSON_ReplaceItemInObject(r, "kind", cJSON_CreateString("trian")); }
static void e_comm(cJSON *r) {
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "rows"), 3), "busbw_gbs");
}
static void e_strategy(cJSON *r) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "parallel"), "strategy", cJSON_CreateNumber(3));
}
static void e_sweep(cJSON *r) {
    cJSON *s = cJSON_AddObjectToObject(r, "sweep");
    cJSON_AddStringToObject(s, "id", "x");
    cJSON_AddStringToObject(s, "weak_efficiency", "high");
}

static void expect_bad(const char *file, void (*edit)(cJSON *), const char *key) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char *text = slurp(fixture("full", file));
    cJSON *root = cJSON_Parse(text);
    edit(root);
    free(text);
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    dt_report *r = dt_report_new();
    dt_status st = dt_report_add_text(&ctx, r, "results/x.json", text);
    free(text);
    dt_report_free(r);
    assert_int_equal(st, DT_ERR_FORMAT);
    if (!strstr(ctx.err, "results/x.json") || !strstr(ctx.err, key))
        fail_msg("message '%s' should name results/x.json and %s", ctx.err, key);
    assert_null(strchr(ctx.err, '\n'));
}

static void test_schema_errors(void **state) {
    (void)state;
    expect_bad("ddp-w2.json", e_idle, "'summary.breakdown_s.idle' is missing");
    expect_bad("ddp-w2.json", e_world, "'parallel.world' is missing");
    expect_bad("ddp-w2.json", e_rss, "'memory[1].rss' is missing");
    expect_bad("ddp-w2.json", e_loss, "'runs[0].loss[2]' must be a number");
    expect_bad("ddp-w2.json", e_kind, "'kind' is 'trian'");
    expect_bad("ddp-w2.json", e_strategy, "'parallel.strategy' must be a string");
    expect_bad("ddp-w2.json", e_sweep, "'sweep.weak_efficiency' must be a number");
    expect_bad("comm-w2.json", e_comm, "'rows[3].busbw_gbs' is missing");
    /* the committed bad files, through the file loader */
    static const struct {
        const char *file, *text;
    } files[] = {{"not-json.json", "not valid JSON"},
                 {"wrong-schema.json", "expected 'dtrain-bench/1'"},
                 {"missing-key.json", "'summary.tokens_per_s.mean' is missing"},
                 {"wrong-type.json", "'parallel.world' must be a number"},
                 {"no-such-file.json", "cannot open"}};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        const char *paths[2] = {fixture("full", "ddp-w1.json"), fixture("bad", files[i].file)};
        dt_report *r = (dt_report *)1;
        assert_true(dt_report_load(&ctx, paths, 2, &r) != DT_OK);
        assert_null(r);
        if (!strstr(ctx.err, files[i].file) || !strstr(ctx.err, files[i].text))
            fail_msg("message '%s' should name %s and say %s", ctx.err, files[i].file, files[i].text);
    }
}

/* ---- the page ---------------------------------------------------------------------- */

static void evil_host(cJSON *root) {
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(root, "environment"), "host",
                              cJSON_CreateString("<script>alert(1)</script>&\"x\""));
}

/* The DDP 2-rank run was run in bf16 with selective checkpointing every 2nd layer, bf16
 * gradients and Top-K 5%. */
static void e_precision(cJSON *r) {
    cJSON *c = cJSON_GetObjectItem(r, "config");
    cJSON_DeleteItemFromObject(c, "training.precision");
    cJSON_AddStringToObject(c, "training.precision", "bf16");
    cJSON_DeleteItemFromObject(c, "memory.activation_checkpointing");
    cJSON_AddStringToObject(c, "memory.activation_checkpointing", "selective");
    cJSON_DeleteItemFromObject(c, "memory.activation_checkpointing_every");
    cJSON_AddNumberToObject(c, "memory.activation_checkpointing_every", 2);
    cJSON_DeleteItemFromObject(c, "parallel.grad_dtype");
    cJSON_AddStringToObject(c, "parallel.grad_dtype", "bf16");
    cJSON_DeleteItemFromObject(c, "parallel.compression");
    cJSON_AddStringToObject(c, "parallel.compression", "topk");
    cJSON_DeleteItemFromObject(c, "parallel.compression_ratio");
    cJSON_AddNumberToObject(c, "parallel.compression_ratio", 0.05);
}

static void test_precision_column(void **state) {
    (void)state;
    /* A run's precision, checkpointing and gradient dtype come from its config; files without
     * those keys (earlier versions) read as fp32. */
    dt_report *r = load_full("ddp-w2.json", e_precision);
    assert_string_equal(by_file(r, "ddp-w2.json")->precision, "bf16, ckpt selective/2, grads bf16, top-k 5%");
    assert_string_equal(by_file(r, "ddp-w1.json")->precision, "fp32");
    char *html;
    page(r, &html);
    assert_non_null(strstr(html, "<th class=\"l\">precision</th>"));
    assert_non_null(strstr(html, "bf16, ckpt selective/2, grads bf16"));
    free(html);
    dt_report_free(r);
}

/* Every rank's memory entry of the DDP 1-rank run gets "plan" = its tracked total + 0.5 MiB. */
static void e_plan(cJSON *r) {
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(r, "memory")) {
        double t = 0;
        for (int k = 0; k < DT_REP_MEM_N; k++) {
            cJSON *v = cJSON_GetObjectItem(e, dt_rep_mem_keys[k]);
            if (v) t += v->valuedouble;
        }
        cJSON_AddNumberToObject(e, "plan", t + 524288.0);
    }
}

static void test_memory_plan_column(void **state) {
    (void)state;
    /* The runs table has a memory-plan column: the plan where the file has one, "-" where
     * it is older than the plan. */
    dt_report *r = load_full("ddp-w1.json", e_plan);
    const dt_rep_train *t = by_file(r, "ddp-w1.json");
    assert_true(dt_report_peak_plan(t) == dt_report_peak_bytes(t, 0) + 524288.0);
    assert_true(dt_report_peak_plan(by_file(r, "ddp-w2.json")) == -1);
    char *html;
    page(r, &html);
    char want[64], got[32];
    dt_report_fmt_bytes(got, sizeof got, dt_report_peak_plan(t));
    snprintf(want, sizeof want, "<td>%s</td>", got);
    assert_non_null(strstr(html, "<th>memory plan</th>"));
    assert_non_null(strstr(html, want));
    assert_non_null(strstr(html, "<td>-</td>"));
    free(html);
    dt_report_free(r);
}

/* A LoRA bench file: 24576 trainable (adapter) parameters of the model's, rank 16, NF4 base. */
static void e_lora(cJSON *r) {
    cJSON *m = cJSON_GetObjectItem(r, "model");
    cJSON_AddNumberToObject(m, "trainable_params", 24576);
    cJSON *l = cJSON_AddObjectToObject(m, "lora");
    cJSON_AddNumberToObject(l, "rank", 16);
    cJSON_AddNumberToObject(l, "alpha", 32);
    cJSON_AddStringToObject(l, "targets", "q,k,v,o,gate,up,down");
    cJSON_AddStringToObject(l, "base_dtype", "nf4");
}

static void e_bad_trainable(cJSON *r) { cJSON_AddStringToObject(cJSON_GetObjectItem(r, "model"), "trainable_params", "x"); }

static void test_trainable_column(void **state) {
    (void)state;
    /* The runs table shows the trainable parameters: a LoRA run's adapters with its rank and
     * base dtype; files without model.trainable_params (full training, earlier versions)
     * train every parameter. */
    dt_report *r = load_full("ddp-w2.json", e_lora);
    const dt_rep_train *lo = by_file(r, "ddp-w2.json"), *full = by_file(r, "ddp-w1.json");
    assert_true(lo->trainable == 24576.0);
    assert_string_equal(lo->lora, "LoRA r16, nf4");
    assert_true(full->trainable == full->params);
    assert_string_equal(full->lora, "");
    char *html;
    page(r, &html);
    char want[96], n[32];
    dt_report_fmt_num(n, sizeof n, 24576.0);
    snprintf(want, sizeof want, "<td>%s (LoRA r16, nf4)</td>", n);
    assert_non_null(strstr(html, "<th>params</th><th>trainable params</th>"));
    assert_non_null(strstr(html, want));
    free(html);
    dt_report_free(r);
    /* a malformed value is refused naming the file and key */
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_report *b = dt_report_new();
    char *text = slurp(fixture("full", "ddp-w1.json"));
    cJSON *root = cJSON_Parse(text);
    e_bad_trainable(root);
    char *bad = cJSON_PrintUnformatted(root);
    assert_int_not_equal(dt_report_add_text(&ctx, b, "results/x.json", bad), DT_OK);
    assert_non_null(strstr(ctx.err, "results/x.json"));
    assert_non_null(strstr(ctx.err, "'model.trainable_params' must be a number"));
    free(bad);
    free(text);
    cJSON_Delete(root);
    dt_report_free(b);
}

static void test_html(void **state) {
    (void)state;
    dt_report *r = load_full("ddp-w1.json", evil_host);
    dt_report_analyze(r, 0);
    char *html;
    page(r, &html);
    /* every chart drew, and each declares as many marks as it has elements of class mark */
    static const char *const charts[] = {"throughput", "efficiency", "breakdown", "memory", "loss", "busbw"};
    for (size_t i = 0; i < sizeof charts / sizeof *charts; i++) {
        char id[64];
        snprintf(id, sizeof id, "id=\"chart-%s\"", charts[i]);
        const char *fig = strstr(html, id), *end = fig ? strstr(fig, "</figure>") : NULL;
        assert_non_null(fig);
        assert_non_null(end);
        const char *svg = strstr(fig, "data-marks=\"");
        assert_true(svg && svg < end);
        int declared = atoi(svg + 12), counted = 0;
        for (const char *s = fig; (s = strstr(s, "class=\"mark")) && s < end; s++) counted++;
        if (declared <= 0 || declared != counted) fail_msg("chart %s: declared %d marks, has %d", charts[i], declared, counted);
    }
    /* memory: 12 ranks x 5 kinds + 12 RSS markers; busbw: 4 ops x 9 sizes */
    assert_non_null(strstr(html, "id=\"chart-memory\"><figcaption>Peak memory per rank by kind</figcaption><svg"));
    assert_non_null(strstr(strstr(html, "id=\"chart-memory\""), "data-marks=\"72\""));
    assert_non_null(strstr(strstr(html, "id=\"chart-busbw\""), "data-marks=\"36\""));
    /* strings from files are escaped; nothing is fetched from anywhere */
    assert_null(strstr(html, "<script"));
    assert_non_null(strstr(html, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;x&quot;"));
    assert_null(strstr(html, "http:"));
    assert_null(strstr(html, "https:"));
    assert_null(strstr(html, "nan"));
    assert_null(strstr(html, "inf\""));
    /* tables: one row per run, the cost table, the environment */
    assert_non_null(strstr(html, "<table id=\"runs\">"));
    assert_non_null(strstr(html, "<table id=\"cost\">"));
    assert_non_null(strstr(html, "c7i.metal-48xl"));
    assert_non_null(strstr(html, "<table id=\"environment\">"));
    free(html);
    dt_report_free(r);
}

/* ---- plans beside measured runs ------------------------------------------------------ */

static void test_plans(void **state) {
    (void)state;
    dt_report *r = load_full(NULL, NULL);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    char *t = plan_text(NULL);
    if (dt_report_add_text(&ctx, r, "plan.json", t) != DT_OK) fail_msg("%s", ctx.err);
    free(t);
    assert_int_equal(r->nplan, 1);
    assert_int_equal(r->plan[0].nlay, 3);
    assert_true(r->plan[0].lay[1].fastest && !r->plan[0].lay[0].fastest && !r->plan[0].lay[0].cheapest);
    assert_true(isnan(r->plan[0].lay[0].scaling_eff));
    assert_true(fabs(r->plan[0].lay[0].overhead_s - 0.11 * 0.35675003978912795) < 1e-15);
    dt_report_analyze(r, 0);
    /* the 2-rank DDP and ZeRO-3 runs match their layouts; the bucket / micro-batch variants of
     * ddp-w2 match the DDP layout only where their shape is the plan's */
    dt_rep_plan_match mt[16];
    int n = dt_report_match_plans(r, mt, 16), ddp = -1, z3 = -1;
    for (int i = 0; i < n; i++) {
        const dt_rep_train *x = &r->train[mt[i].train];
        assert_int_equal(x->world, 2);
        assert_int_equal(x->micro_batch, 8);
        assert_string_equal(x->strategy, r->plan[0].lay[mt[i].layout].strategy);
        assert_int_not_equal(mt[i].layout, 2);
        if (!strcmp(x->file, "ddp-w2.json")) ddp = i;
        if (!strcmp(x->file, "zero3-w2.json")) z3 = i;
    }
    assert_true(ddp >= 0 && z3 >= 0);
    assert_true(fabs(mt[ddp].step_err - 0.1) < 1e-9);
    assert_true(fabs(mt[ddp].mem_err - (0.9 * 694005760.0 / dt_report_peak_bytes(&r->train[mt[ddp].train], 0) - 1)) < 1e-9);
    assert_true(fabs(mt[z3].step_err + 0.2) < 1e-9);
    char *html;
    page(r, &html);
    assert_non_null(strstr(html, ", 1 plan(s)"));
    const char *tab = strstr(html, "<table id=\"plan-vs-measured\">");
    assert_non_null(tab);
    assert_non_null(strstr(tab, "<td>+10.0%</td>"));
    assert_non_null(strstr(tab, "<td>-20.0%</td>"));
    assert_non_null(strstr(html, "<table id=\"plan-1\">"));
    assert_non_null(strstr(html, "fastest measured"));
    assert_non_null(strstr(html, "<th>overhead ms</th>"));
    assert_non_null(strstr(html, "<th>optimizer ms</th>"));
    /* the chart: 4 segments (compute, exposed comm, overhead, optimizer) + 1 measured marker per
       matched run */
    const char *fig = strstr(html, "id=\"chart-plans\""), *end = fig ? strstr(fig, "</figure>") : NULL;
    assert_true(fig && end);
    const char *svg = strstr(fig, "data-marks=\"");
    assert_true(svg && svg < end);
    int declared = atoi(svg + 12), counted = 0;
    for (const char *s = fig; (s = strstr(s, "class=\"mark")) && s < end; s++) counted++;
    assert_int_equal(declared, 5 * n);
    assert_int_equal(counted, declared);
    free(html);
    dt_report_free(r);
    /* bad plan files: one line naming the file and the key */
    static const struct {
        const char *drop, *text;
    } bad[] = {{"step_s", "plan.json: key 'layouts[0].step_s' is missing"},
               {"memory_bytes", "plan.json: key 'layouts[0].memory_bytes' is missing"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dt_report *q = dt_report_new();
        t = plan_text(bad[i].drop);
        assert_true(dt_report_add_text(&ctx, q, "plan.json", t) != DT_OK);
        if (!strstr(ctx.err, bad[i].text)) fail_msg("'%s' not in '%s'", bad[i].text, ctx.err);
        free(t);
        dt_report_free(q);
    }
    /* a plan written before the fixed cost: no overhead_s, read as 0 */
    dt_report *q = dt_report_new();
    t = plan_text("overhead_s");
    if (dt_report_add_text(&ctx, q, "plan.json", t) != DT_OK) fail_msg("%s", ctx.err);
    assert_true(q->plan[0].lay[0].overhead_s == 0 && q->plan[0].lay[1].overhead_s > 0);
    free(t);
    dt_report_free(q);
    /* nor the optimizer step: read as 0 */
    q = dt_report_new();
    t = plan_text("optimizer_s");
    if (dt_report_add_text(&ctx, q, "plan.json", t) != DT_OK) fail_msg("%s", ctx.err);
    assert_true(q->plan[0].lay[0].optimizer_s == 0 && q->plan[0].lay[1].optimizer_s > 0);
    assert_true(fabs(q->plan[0].lay[1].compute_s + q->plan[0].lay[1].comm_exposed_s + q->plan[0].lay[1].overhead_s +
                     q->plan[0].lay[1].optimizer_s - q->plan[0].lay[1].step_s) < 1e-12);
    free(t);
    dt_report_free(q);
    /* a time-sliced pipeline's gain (sliced_s < 0, decision 95) beyond its bubble comes off the
       compute: every term >= 0, their sum the step */
    q = dt_report_new();
    t = plan_text(NULL);
    cJSON *pj = cJSON_Parse(t), *l0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pj, "layouts"), 0);
    double st0 = cJSON_GetObjectItemCaseSensitive(l0, "step_s")->valuedouble;
    cJSON_ReplaceItemInObject(l0, "step_s", cJSON_CreateNumber(0.9 * st0));
    cJSON_AddNumberToObject(l0, "sliced_s", -0.1 * st0);
    char *t2 = cJSON_PrintUnformatted(pj);
    if (dt_report_add_text(&ctx, q, "plan.json", t2) != DT_OK) fail_msg("%s", ctx.err);
    const dt_rep_plan_layout *sl = &q->plan[0].lay[0];
    assert_true(sl->bubble_s == 0 && fabs(sl->compute_s - 0.5 * st0) < 1e-12);
    assert_true(fabs(sl->compute_s + sl->recompute_s + sl->bubble_s + sl->comm_exposed_s + sl->overhead_s +
                     sl->optimizer_s - sl->step_s) < 1e-12);
    free(t), free(t2), cJSON_Delete(pj);
    dt_report_free(q);
    q = dt_report_new();
    assert_true(dt_report_add_text(&ctx, q, "p.json", "{\"schema\":\"dtrain-plan/1\",\"kind\":\"train\"}") != DT_OK);
    assert_non_null(strstr(ctx.err, "p.json: key 'kind' is 'train', expected 'plan'"));
    dt_report_free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmt_num),         cmocka_unit_test(test_ticks_linear),
        cmocka_unit_test(test_ticks_log2),      cmocka_unit_test(test_efficiency),
        cmocka_unit_test(test_recommend_no_budget), cmocka_unit_test(test_recommend_budget),
        cmocka_unit_test(test_loss_mismatch),   cmocka_unit_test(test_partial_data),
        cmocka_unit_test(test_schema_errors),   cmocka_unit_test(test_html), cmocka_unit_test(test_memory_plan_column),
        cmocka_unit_test(test_precision_column), cmocka_unit_test(test_plans), cmocka_unit_test(test_trainable_column),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
