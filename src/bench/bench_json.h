/* bench_json.h - the results of `dtrain bench` as JSON (schema "dtrain-bench/1", every key
 * in docs/FORMATS.md "Bench results (JSON)") and CSV rows, for `dtrain report` and scripts.
 *
 *   cJSON *o = dt_bench_json_train(&suite, &cfg, argc, argv, peak_source, threads);
 *   cJSON_AddItemToObject(o, "cost", dt_prices_cost_json(...));
 *   DT_CHECK(dt_bench_json_write(ctx, "results/run.json", o));
 *   cJSON_Delete(o);
 */
#ifndef DT_BENCH_JSON_H
#define DT_BENCH_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "bench/bench.h"
#include "train/keys.h"

#define DT_BENCH_SCHEMA "dtrain-bench/1"

/* "environment": host, CPU model, cores, threads per rank, ranks, nodes, MPI, oneDNN, compiler. */
cJSON *dt_bench_json_env(int ranks, int nodes, int threads);
/* "config": every configuration key ("section.key", as `dtrain config show`) with its value. */
cJSON *dt_bench_json_config(const dt_run_cfg *cfg);
/* The object of one training benchmark ("kind": "train"), without "cost". */
cJSON *dt_bench_json_train(const dt_bench_suite *s, const dt_run_cfg *cfg, int argc, char **argv,
                           const char *peak_source, int threads);
/* "pipeline" (parallel.pp > 1; bench_pp.c): the schedule, every rank's columns, the replay. */
cJSON *dt_bench_pp_json(const dt_bench_suite *s);
/* The current UTC time as ISO-8601 ("2025-01-31T12:00:00Z"). */
void dt_bench_iso_date(char *buf, size_t n);

/* Writes obj (indented) to path via a temporary file and rename. */
dt_status dt_bench_json_write(dt_ctx *ctx, const char *path, const cJSON *obj);
/* Reads and parses a JSON file. */
dt_status dt_bench_json_read(dt_ctx *ctx, const char *path, cJSON **out);

/* CSV: one row per run / sweep point, the columns of dt_bench_csv_header. */
void dt_bench_csv_header(FILE *f);
void dt_bench_csv_row(FILE *f, const cJSON *run);

#endif
