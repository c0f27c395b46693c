/* prices.h - the price table of `dtrain bench --prices FILE` (configs/prices.yaml) and the
 * cost of a measured run on each instance type.
 *
 *   dt_price_table t; DT_CHECK(dt_prices_load(ctx, "configs/prices.yaml", &t));
 *   cJSON *cost; DT_CHECK(dt_prices_cost(ctx, &t, "p4d.24xlarge", &in, &cost));
 *   dt_prices_free(&t);
 *
 * File format (YAML): `date`, `source`, `currency` (strings) and `instances`, a mapping from
 * instance name to {provider, hardware (strings), on_demand, spot (USD per hour, spot may be
 * null)}. Any other key, a missing on_demand or a negative price is refused naming
 * file:line and the key.
 */
#ifndef DT_PRICES_H
#define DT_PRICES_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "core/status.h"

typedef struct dt_price {
    char name[64], provider[32], hardware[128];
    double on_demand, spot; /* $/hour; spot < 0: none */
} dt_price;

typedef struct dt_price_table {
    char path[256], date[32], source[256], currency[8];
    dt_price *p;
    int n;
} dt_price_table;

dt_status dt_prices_load(dt_ctx *ctx, const char *path, dt_price_table *t);
void dt_prices_free(dt_price_table *t);

/* What a run measured: global rates, the nodes it ran on, and the tokens to train (0 = no
 * time-to-train columns). */
typedef struct dt_cost_input {
    double samples_per_s, tokens_per_s;
    int nodes;
    double train_tokens;
} dt_cost_input;

/* One cost row per instance (instance NULL or "all": every one) as a JSON array of
 * {instance, nodes, price_hour, spot_hour, usd_per_1k_samples, usd_per_1b_tokens,
 *  hours_to_train, usd_to_train, spot_usd_to_train}; an instance the table lacks fails. */
dt_status dt_prices_cost(dt_ctx *ctx, const dt_price_table *t, const char *instance, const dt_cost_input *in,
                         cJSON **out);
/* The cost rows as a fixed-width table. */
void dt_prices_print(FILE *f, const dt_price_table *t, const cJSON *rows, double train_tokens);

#endif
