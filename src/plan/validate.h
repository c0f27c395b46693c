/* validate.h - `dtrain plan --validate FILE.csv [--fit]`: the planner against published runs
 * (bench/planner/published_runs.csv). For each row: predicted vs published TFLOP/s per GPU,
 * step time and memory, the relative errors, and flags for claims the model calls impossible
 * (implied MFU above the peak, memory that cannot fit) with the arithmetic. --fit chooses one
 * GEMM efficiency per GPU type (not per row) minimising the median absolute relative error of
 * TFLOP/s per GPU over that type's fitting rows, and reports the in-sample, held-out and
 * leave-one-source-out errors (ARCHITECTURE decision 65).
 *
 * CSV: a header line naming the columns (any order; docs/planner.md lists them), empty =
 * unknown; fields may be double-quoted. Every row names its source; the optional split column
 * (fit|heldout) holds a source (the id's prefix before the first '-') out whole. A row whose
 * model or layout is incomplete is reported and skipped, not fatal; a malformed file (no
 * header, a row with the wrong field count, an empty source, a bad or mixed split) is refused
 * naming file:line (and the field). */
#ifndef DT_PLAN_VALIDATE_H
#define DT_PLAN_VALIDATE_H

#include <stdio.h>

#include "plan/hardware.h"

dt_status dt_plan_validate(dt_ctx *ctx, const dt_hw_catalog *cat, const char *csv, int fit, int json, FILE *out);
/* Splits one CSV line into at most max fields (in place; quotes removed, "" -> "); returns the count. */
int dt_csv_split(char *line, char **fields, int max);
/* Median of |x[i]| (x is reordered). */
double dt_median_abs(double *x, int n);

#endif
