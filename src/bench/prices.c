#include "bench/prices.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "train/config_yaml.h"

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }
static unsigned long line_of(const yaml_node_t *n) { return (unsigned long)n->start_mark.line + 1; }

/* A price: a non-negative number, or (spot only) null / ~. */
static dt_status price_value(dt_ctx *ctx, const char *path, const yaml_node_t *v, const char *key,
                             int nullable, double *out) {
    if (v->type == YAML_SCALAR_NODE) {
        const char *s = scalar(v);
        if (nullable && v->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            (!*s || !strcmp(s, "null") || !strcmp(s, "~"))) {
            *out = -1;
            return DT_OK;
        }
        char *end;
        double d = strtod(s, &end);
        if (end != s && !*end && d >= 0 && isfinite(d)) {
            *out = d;
            return DT_OK;
        }
    }
    return dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a price in USD per hour (a number >= 0%s)", path,
                   line_of(v), key, nullable ? " or null" : "");
}

static dt_status string_value(dt_ctx *ctx, const char *path, const yaml_node_t *v, const char *key, char *dst,
                              size_t n) {
    if (v->type != YAML_SCALAR_NODE)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a string", path, line_of(v), key);
    snprintf(dst, n, "%s", scalar(v));
    return DT_OK;
}

static dt_status load_instance(dt_ctx *ctx, const char *path, yaml_document_t *doc, const yaml_node_t *k,
                               const yaml_node_t *v, dt_price *p) {
    char key[160];
    memset(p, 0, sizeof *p);
    p->on_demand = p->spot = -1;
    snprintf(p->name, sizeof p->name, "%s", scalar(k));
    if (v->type != YAML_MAPPING_NODE)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instances.%s must be a mapping (on_demand:, spot:, ...)", path,
                       line_of(v), p->name);
    for (yaml_node_pair_t *q = v->data.mapping.pairs.start; q < v->data.mapping.pairs.top; q++) {
        yaml_node_t *fk = yaml_document_get_node(doc, q->key), *fv = yaml_document_get_node(doc, q->value);
        const char *f = fk->type == YAML_SCALAR_NODE ? scalar(fk) : "?";
        snprintf(key, sizeof key, "instances.%s.%s", p->name, f);
        if (!strcmp(f, "on_demand")) DT_CHECK(price_value(ctx, path, fv, key, 0, &p->on_demand));
        else if (!strcmp(f, "spot")) DT_CHECK(price_value(ctx, path, fv, key, 1, &p->spot));
        else if (!strcmp(f, "provider")) DT_CHECK(string_value(ctx, path, fv, key, p->provider, sizeof p->provider));
        else if (!strcmp(f, "hardware")) DT_CHECK(string_value(ctx, path, fv, key, p->hardware, sizeof p->hardware));
        else
            return dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s: unknown key (provider, hardware, on_demand, spot)", path,
                           line_of(fk), key);
    }
    if (p->on_demand < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instances.%s.on_demand is missing", path, line_of(v), p->name);
    return DT_OK;
}

dt_status dt_prices_load(dt_ctx *ctx, const char *path, dt_price_table *t) {
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    snprintf(t->currency, sizeof t->currency, "USD");
    yaml_document_t doc;
    dt_status st = DT_OK;
    DT_CHECK(dt_yaml_load_file(ctx, path, "price table", &doc));
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: expected a mapping with an 'instances' key", path,
                     root ? line_of(root) : 1ul);
        goto done;
    }
    for (yaml_node_pair_t *sp = root->data.mapping.pairs.start; sp < root->data.mapping.pairs.top; sp++) {
        yaml_node_t *k = yaml_document_get_node(&doc, sp->key), *v = yaml_document_get_node(&doc, sp->value);
        const char *key = k->type == YAML_SCALAR_NODE ? scalar(k) : "?";
        if (!strcmp(key, "date")) st = string_value(ctx, path, v, key, t->date, sizeof t->date);
        else if (!strcmp(key, "source")) st = string_value(ctx, path, v, key, t->source, sizeof t->source);
        else if (!strcmp(key, "currency")) st = string_value(ctx, path, v, key, t->currency, sizeof t->currency);
        else if (!strcmp(key, "instances")) {
            if (v->type != YAML_MAPPING_NODE) {
                st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instances must be a mapping of instance name -> prices",
                             path, line_of(v));
                goto done;
            }
            int n = (int)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
            t->p = calloc((size_t)(n > 0 ? n : 1), sizeof *t->p);
            if (!t->p) {
                st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            for (yaml_node_pair_t *q = v->data.mapping.pairs.start; q < v->data.mapping.pairs.top && st == DT_OK; q++) {
                yaml_node_t *ik = yaml_document_get_node(&doc, q->key), *iv = yaml_document_get_node(&doc, q->value);
                if (ik->type != YAML_SCALAR_NODE) {
                    st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instance names must be plain words", path, line_of(ik));
                    break;
                }
                for (int i = 0; i < t->n && st == DT_OK; i++)
                    if (!strcmp(t->p[i].name, scalar(ik)))
                        st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instances.%s is listed twice", path, line_of(ik),
                                     scalar(ik));
                if (st == DT_OK) st = load_instance(ctx, path, &doc, ik, iv, &t->p[t->n]);
                if (st == DT_OK) t->n++;
            }
        } else
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s: unknown key (date, source, currency, instances)", path,
                         line_of(k), key);
        if (st != DT_OK) goto done;
    }
    if (t->n == 0) st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: instances: no instance listed", path, line_of(root));
done:
    yaml_document_delete(&doc);
    if (st != DT_OK) dt_prices_free(t);
    return st;
}

void dt_prices_free(dt_price_table *t) {
    free(t->p);
    t->p = NULL;
    t->n = 0;
}

static void num_or_null(cJSON *o, const char *k, double v, int ok) {
    if (ok && isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

dt_status dt_prices_cost(dt_ctx *ctx, const dt_price_table *t, const char *instance, const dt_cost_input *in,
                         cJSON **out) {
    int all = !instance || !*instance || !strcmp(instance, "all"), found = 0;
    *out = cJSON_CreateArray();
    int nodes = in->nodes > 0 ? in->nodes : 1;
    for (int i = 0; i < t->n; i++) {
        const dt_price *p = &t->p[i];
        if (!all && strcmp(p->name, instance)) continue;
        found = 1;
        /* The run's nodes each rent one instance: dollars per second of the whole job. */
        double hour = p->on_demand * nodes, spot = p->spot * nodes, ok = in->samples_per_s > 0;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "instance", p->name);
        cJSON_AddNumberToObject(o, "nodes", nodes);
        cJSON_AddNumberToObject(o, "price_hour", p->on_demand);
        num_or_null(o, "spot_hour", p->spot, p->spot >= 0);
        num_or_null(o, "usd_per_1k_samples", hour / 3600 * 1000 / in->samples_per_s, ok);
        num_or_null(o, "usd_per_1b_tokens", hour / 3600 * 1e9 / in->tokens_per_s, ok);
        num_or_null(o, "spot_usd_per_1b_tokens", spot / 3600 * 1e9 / in->tokens_per_s, ok && p->spot >= 0);
        double hours = in->train_tokens / in->tokens_per_s / 3600;
        num_or_null(o, "hours_to_train", hours, ok && in->train_tokens > 0);
        num_or_null(o, "usd_to_train", hours * hour, ok && in->train_tokens > 0);
        num_or_null(o, "spot_usd_to_train", hours * spot, ok && in->train_tokens > 0 && p->spot >= 0);
        cJSON_AddItemToArray(*out, o);
    }
    if (!found) {
        char known[1024] = "";
        for (int i = 0; i < t->n; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", t->p[i].name);
        cJSON_Delete(*out);
        *out = NULL;
        return dt_fail(ctx, DT_ERR_CONFIG, "--instance %s: not in %s (known: %s)", instance, t->path, known);
    }
    return DT_OK;
}

static void cell(FILE *f, const cJSON *o, const char *k, const char *fmt) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (cJSON_IsNumber(x)) fprintf(f, fmt, x->valuedouble);
    else fprintf(f, " %12s", "-");
}

void dt_prices_print(FILE *f, const dt_price_table *t, const cJSON *rows, double train_tokens) {
    fprintf(f, "# cost at the measured throughput (%s, prices of %s: %s)%s\n", t->currency,
            t->date[0] ? t->date : "undated", t->path, train_tokens > 0 ? "" : "; --train-tokens N adds time to train");
    if (train_tokens > 0) fprintf(f, "# training %.4g tokens\n", train_tokens);
    fprintf(f, "# %-16s %5s %12s %12s %12s %12s %12s %12s %12s\n", "instance", "nodes", "$/hour", "spot_$/hour",
            "$/1K_samples", "$/1B_tokens", "hours", "$_to_train", "spot_$");
    const cJSON *o;
    cJSON_ArrayForEach(o, rows) {
        fprintf(f, "  %-16s %5d", cJSON_GetObjectItemCaseSensitive(o, "instance")->valuestring,
                cJSON_GetObjectItemCaseSensitive(o, "nodes")->valueint);
        cell(f, o, "price_hour", " %12.3f");
        cell(f, o, "spot_hour", " %12.3f");
        cell(f, o, "usd_per_1k_samples", " %12.4g");
        cell(f, o, "usd_per_1b_tokens", " %12.4g");
        cell(f, o, "hours_to_train", " %12.4g");
        cell(f, o, "usd_to_train", " %12.4g");
        cell(f, o, "spot_usd_to_train", " %12.4g");
        fputc('\n', f);
    }
}
