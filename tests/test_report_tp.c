/* dtrain report on tensor-parallel runs (decision 71): the layout (parallel.tp, parallel.dp,
 * sequence parallelism) and the TP collectives (summary.tp_comm_s, tp_bytes_step) of a bench
 * file in the labels, the runs table's layout column and the tensor-parallelism table; a TP run
 * beside the plan layout of its tp and dp; files without the keys; bad values naming the key.
 * Fixtures: tests/data/report (report_fixtures.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "report_fixtures.h"
#include "testutil.h"

/* ddp-w2-bk4 as a tensor-parallel run: tp 2 x dp 1 (sequence parallel when tp_sp), 4 ms of TP
 * collectives per step moving 3 MiB. */
static int tp_sp;
static void e_tp(cJSON *r) {
    cJSON *p = cJSON_GetObjectItem(r, "parallel"), *s = cJSON_GetObjectItem(r, "summary");
    cJSON_AddNumberToObject(p, "tp", 2);
    cJSON_AddNumberToObject(p, "dp", 1);
    cJSON_AddBoolToObject(cJSON_GetObjectItem(r, "config"), "parallel.sequence_parallel", tp_sp);
    cJSON_AddNumberToObject(s, "tp_comm_s", 0.004);
    cJSON_AddNumberToObject(s, "tp_bytes_step", 3145728);
}
static const char *tp_bad_key;
static cJSON *tp_bad_value;
static void e_tp_bad(cJSON *r) {
    e_tp(r);
    const char *dot = strchr(tp_bad_key, '.');
    char obj[32];
    snprintf(obj, sizeof obj, "%.*s", (int)(dot - tp_bad_key), tp_bad_key);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, obj), dot + 1, cJSON_Duplicate(tp_bad_value, 1));
}

static void test_tp_layout(void **state) {
    (void)state;
    /* The layout and the TP collectives of a bench file: read, labelled, in the runs table's
     * layout column and the tensor-parallelism table; files without the keys (earlier
     * versions) read as every rank data-parallel with no TP traffic, and show no TP table. */
    dt_report *r = load_full(NULL, NULL);
    dt_report_analyze(r, 0);
    const dt_rep_train *d = by_file(r, "ddp-w2.json");
    assert_int_equal(d->tp, 1);
    assert_int_equal(d->dp, 2);
    assert_int_equal(d->sp, 0);
    assert_true(d->tp_comm_s == 0 && d->tp_bytes_step == 0);
    char *html;
    page(r, &html);
    assert_non_null(strstr(html, "<th>ranks</th><th class=\"l\">layout</th>"));
    assert_non_null(strstr(html, "<td class=\"l\">dp 2</td>"));
    assert_null(strstr(html, "<table id=\"tp\">"));
    free(html);
    dt_report_free(r);
    for (tp_sp = 0; tp_sp < 2; tp_sp++) {
        r = load_full("ddp-w2-bk4.json", e_tp);
        dt_report_analyze(r, 0);
        const dt_rep_train *t = by_file(r, "ddp-w2-bk4.json");
        assert_int_equal(t->tp, 2);
        assert_int_equal(t->dp, 1);
        assert_int_equal(t->sp, tp_sp);
        assert_true(t->tp_comm_s == 0.004 && t->tp_bytes_step == 3145728);
        assert_non_null(strstr(t->label, tp_sp ? " x2 tp2 sp mb8" : " x2 tp2 mb8"));
        page(r, &html);
        const char *tab = strstr(html, "<table id=\"tp\">"), *end = tab ? strstr(tab, "</table>") : NULL;
        assert_true(tab && end);
        char want[256], pct[32];
        snprintf(pct, sizeof pct, "%.1f%%", 100 * 0.004 / t->step_s.mean);
        snprintf(want, sizeof want,
                 "<td class=\"l\">tp 2 x dp 1%s</td><td>2</td><td>1</td><td>%s</td><td class=\"l\">none (ddp)</td>"
                 "<td>3 MiB</td><td>4.000</td><td>%s</td>",
                 tp_sp ? ", sequence parallel" : "", tp_sp ? "on" : "off", pct);
        const char *row = strstr(tab, want);
        if (!row || row > end) fail_msg("'%s' not in the TP table", want);
        /* one row: the only TP run */
        int rows = 0;
        for (const char *x = tab; (x = strstr(x, "<tr><td")) && x < end; x++) rows++;
        assert_int_equal(rows, 1);
        assert_non_null(strstr(html, tp_sp ? "<td class=\"l\">tp 2 x dp 1, sequence parallel</td><td class=\"l\">ddp</td>"
                                           : "<td class=\"l\">tp 2 x dp 1</td><td class=\"l\">ddp</td>"));
        free(html);
        /* plans: the TP run is described by the plan's tp 2 layout (sequence parallelism: only
           by a plan of a sequence-parallel job), no longer by the DDP dp 2 one */
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        for (int psp = 0; psp < 2; psp++) {
            dt_report *q = load_full("ddp-w2-bk4.json", e_tp);
            char *pt = plan_text(NULL);
            cJSON *pj = cJSON_Parse(pt);
            free(pt);
            cJSON_AddBoolToObject(cJSON_GetObjectItem(pj, "job"), "sequence_parallel", psp);
            pt = cJSON_PrintUnformatted(pj);
            cJSON_Delete(pj);
            if (dt_report_add_text(&ctx, q, "plan.json", pt) != DT_OK) fail_msg("%s", ctx.err);
            free(pt);
            assert_int_equal(q->plan[0].sp, psp);
            dt_report_analyze(q, 0);
            dt_rep_plan_match mt[16];
            int n = dt_report_match_plans(q, mt, 16), found = -1;
            for (int i = 0; i < n; i++)
                if (!strcmp(q->train[mt[i].train].file, "ddp-w2-bk4.json")) found = mt[i].layout;
            assert_int_equal(found, psp == tp_sp ? 2 : -1);
            dt_report_free(q);
        }
        dt_report_free(r);
    }
    /* a mistyped or impossible value: one line naming the file and the key */
    static const struct {
        const char *key, *value, *text;
    } bad[] = {{"parallel.tp", "\"2\"", "'parallel.tp' must be a number"},
               {"parallel.tp", "0", "'parallel.tp' must be >= 1"},
               {"parallel.dp", "1.5", "'parallel.dp' must be an integer"},
               {"summary.tp_comm_s", "null", "'summary.tp_comm_s' must be a number"},
               {"summary.tp_bytes_step", "-1", "'summary.tp_bytes_step' must be >= 0"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dt_ctx ctx;
        dt_ctx_init(&ctx);
        dt_report *b = dt_report_new();
        char *text = slurp(fixture("full", "ddp-w1.json"));
        cJSON *root = cJSON_Parse(text);
        tp_bad_key = bad[i].key, tp_bad_value = cJSON_Parse(bad[i].value);
        e_tp_bad(root);
        cJSON_Delete(tp_bad_value);
        char *bt = cJSON_PrintUnformatted(root);
        assert_int_not_equal(dt_report_add_text(&ctx, b, "results/tp.json", bt), DT_OK);
        if (!strstr(ctx.err, "results/tp.json") || !strstr(ctx.err, bad[i].text))
            fail_msg("'%s' not in '%s'", bad[i].text, ctx.err);
        free(bt);
        free(text);
        cJSON_Delete(root);
        dt_report_free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
