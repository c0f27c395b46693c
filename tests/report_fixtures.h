/* report_fixtures.h - what the report's unit tests share (test_report.c, test_report_tp.c):
 * the fixture files of tests/data/report (make_fixtures.py), loading them with an optional
 * edit, the page in memory, and a plan file of the fixtures' job. */
#ifndef DT_REPORT_FIXTURES_H
#define DT_REPORT_FIXTURES_H

#include <cjson/cJSON.h>

#include "report/report.h"

/* The file's text (free it); fails the test when unreadable. */
char *slurp(const char *path);
/* DT_REPORT_FIXTURES/set/name (one of 4 rotating buffers). */
const char *fixture(const char *set, const char *name);
/* The report's HTML page, in memory: *html (free it). */
void page(const dt_report *r, char **html);
/* The full fixture set, with an optional edit applied to the file named `edit_name`. */
dt_report *load_full(const char *edit_name, void (*edit)(cJSON *));
/* The run loaded from `file`; fails the test when there is none. */
const dt_rep_train *by_file(const dt_report *r, const char *file);
/* A plan layout object as dtrain plan --json writes it. */
cJSON *plan_layout(const char *name, const char *strategy, int dp, int tp, double step_s, double mem_total);
/* A plan of bench-small on 2 devices (the fixtures' shape: micro-batch 8 x 256, fp32): DDP
 * at 1.1x the measured ddp-w2 step and 0.9x its memory, ZeRO-3 at 0.8x zero3-w2's step, and
 * a tensor-parallel layout (ddp dp1 tp2); `drop`: a key taken out of the first layout. */
char *plan_text(const char *drop);

#endif
