/* What the report's unit tests share (report_fixtures.h). */
#include "report_fixtures.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifndef DT_REPORT_FIXTURES
#define DT_REPORT_FIXTURES "tests/data/report"
#endif

const char *const dt_rep_fx_full_files[] = {"ddp-w1-acc2.json", "ddp-w1.json",   "ddp-w2-bk4.json", "ddp-w2-mb4.json",
                                         "ddp-w2.json",      "zero1-w2.json", "zero3-w2.json",   "comm-w2.json"};

char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = tu_malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return b;
}

const char *fixture(const char *set, const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s/%s", DT_REPORT_FIXTURES, set, name);
    return p[k];
}

void page(const dt_report *r, char **html) {
    size_t len;
    FILE *f = open_memstream(html, &len);
    dt_report_html(f, r);
    fclose(f);
}

dt_report *load_full(const char *edit_name, void (*edit)(cJSON *)) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_report *r = dt_report_new();
    assert_non_null(r);
    for (int i = 0; i < (int)(sizeof dt_rep_fx_full_files / sizeof *dt_rep_fx_full_files); i++) {
        char *text = slurp(fixture("full", dt_rep_fx_full_files[i]));
        if (edit_name && !strcmp(edit_name, dt_rep_fx_full_files[i])) {
            cJSON *root = cJSON_Parse(text);
            edit(root);
            free(text);
            text = cJSON_PrintUnformatted(root);
            cJSON_Delete(root);
        }
        dt_status st = dt_report_add_text(&ctx, r, dt_rep_fx_full_files[i], text);
        if (st != DT_OK) fail_msg("%s", ctx.err);
        free(text);
    }
    return r;
}

const dt_rep_train *by_file(const dt_report *r, const char *file) {
    for (int i = 0; i < r->ntrain; i++)
        if (!strcmp(r->train[i].file, file)) return &r->train[i];
    fail_msg("no run %s", file);
    return NULL;
}


cJSON *plan_layout(const char *name, const char *strategy, int dp, int tp, double step_s, double mem_total) {
    cJSON *l = cJSON_CreateObject(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(l, "layout", name);
    cJSON_AddStringToObject(l, "strategy", strategy);
    cJSON_AddBoolToObject(l, "hybrid", 0);
    cJSON_AddNumberToObject(l, "dp", dp);
    cJSON_AddNumberToObject(l, "tp", tp);
    cJSON_AddNumberToObject(l, "pp", 1);
    cJSON_AddNumberToObject(l, "micro_steps", 1);
    static const char *const kinds[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    for (int k = 0; k < 6; k++) cJSON_AddNumberToObject(m, kinds[k], k == 0 ? mem_total : 0);
    cJSON_AddNumberToObject(m, "total", mem_total);
    cJSON_AddItemToObject(l, "memory_bytes", m);
    cJSON_AddBoolToObject(l, "fits", 1);
    cJSON_AddNumberToObject(l, "step_s", step_s);
    cJSON_AddNumberToObject(l, "compute_s", 0.6 * step_s);
    cJSON_AddNumberToObject(l, "recompute_s", 0);
    cJSON_AddNumberToObject(l, "bubble_s", 0);
    cJSON_AddNumberToObject(l, "comm_exposed_s", 0.25 * step_s);
    cJSON_AddNumberToObject(l, "overhead_s", 0.1 * step_s); /* the calibrated fixed cost (decision 55) */
    cJSON_AddNumberToObject(l, "optimizer_s", 0.05 * step_s); /* the optimizer step (decision 56) */
    cJSON_AddNumberToObject(l, "tokens_per_s", 4096 / step_s);
    cJSON_AddNumberToObject(l, "tflops_per_gpu", 0.1);
    cJSON_AddNumberToObject(l, "mfu", 0.5);
    cJSON_AddNullToObject(l, "scaling_efficiency");
    cJSON_AddNullToObject(l, "usd_per_1k_samples");
    return l;
}

/* A plan of bench-small on 2 devices (the fixtures' shape: micro-batch 8 x 256, fp32): DDP
 * at 1.1x the measured ddp-w2 step and 0.9x its memory, ZeRO-3 at 0.8x zero3-w2's step, and
 * a tensor-parallel layout no run matches. */
char *plan_text(const char *drop) {
    cJSON *o = cJSON_CreateObject(), *job = cJSON_CreateObject(), *m = cJSON_CreateObject(),
          *e = cJSON_CreateObject(), *lays = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "schema", "dtrain-plan/1");
    cJSON_AddStringToObject(o, "kind", "plan");
    cJSON_AddStringToObject(m, "name", "bench-small");
    cJSON_AddNumberToObject(m, "n_layer", 6);
    cJSON_AddNumberToObject(m, "d_model", 384);
    cJSON_AddNumberToObject(m, "n_head", 6);
    cJSON_AddNumberToObject(m, "params", 29940480);
    cJSON_AddItemToObject(job, "model", m);
    cJSON_AddNumberToObject(job, "micro_batch", 8);
    cJSON_AddNumberToObject(job, "seq_len", 256);
    cJSON_AddNumberToObject(job, "gpus", 2);
    cJSON_AddStringToObject(job, "precision", "fp32");
    cJSON_AddStringToObject(job, "checkpointing", "none");
    cJSON_AddStringToObject(job, "hardware", "cpu-calibrated");
    cJSON_AddNumberToObject(job, "peak_tflops", 0.21);
    cJSON_AddNumberToObject(e, "gemm", 0.6);
    cJSON_AddNumberToObject(e, "intra_link", 0.8);
    cJSON_AddNumberToObject(e, "inter_link", 0.8);
    cJSON_AddItemToObject(job, "efficiency", e);
    cJSON_AddItemToObject(o, "job", job);
    cJSON_AddItemToArray(lays, plan_layout("ddp dp2 tp1 pp1 cp1 ep1", "ddp", 2, 1, 1.1 * 0.35675003978912795,
                                           0.9 * 694005760.0));
    cJSON_AddItemToArray(lays, plan_layout("zero3 dp2 tp1 pp1 cp1 ep1", "zero3", 2, 1, 0.8 * 0.4009376902897936,
                                           462870528.0));
    cJSON_AddItemToArray(lays, plan_layout("ddp dp1 tp2 pp1 cp1 ep1", "ddp", 1, 2, 0.3, 4e8));
    cJSON_AddItemToObject(o, "layouts", lays);
    cJSON_AddItemToObject(o, "fastest", plan_layout("zero3 dp2 tp1 pp1 cp1 ep1", "zero3", 2, 1, 0.3, 4e8));
    cJSON_AddNullToObject(o, "cheapest");
    if (drop) cJSON_DeleteItemFromObject(cJSON_GetArrayItem(lays, 0), drop);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return t;
}
