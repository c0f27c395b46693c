/* The alpha-beta cost model of the collectives (comm_fit.h). */
#include "comm/comm_fit.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/jsonfile.h"

/* Weighted least squares of t = a + b x with weights 1 / t^2 over n points; a >= 0. */
static void fit_line(const double *x, const double *t, int n, double *a, double *b) {
    double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (t[i] * t[i]);
        sw += w, sx += w * x[i], sxx += w * x[i] * x[i], st += w * t[i], sxt += w * x[i] * t[i];
    }
    double det = sw * sxx - sx * sx;
    *a = det != 0 ? (sxx * st - sx * sxt) / det : 0.0;
    *b = det != 0 ? (sw * sxt - sx * st) / det : (sxx > 0 ? sxt / sxx : 0.0);
    if (*a < 0 || !isfinite(*a)) { /* through the origin */
        *a = 0;
        *b = sxx > 0 ? sxt / sxx : 0.0;
    }
    if (*b < 0) *b = 0;
}

/* A row's group: "world" when absent. */
static const char *row_group(const cJSON *r) {
    const cJSON *g = cJSON_GetObjectItem(r, "group");
    return cJSON_IsString(g) ? g->valuestring : "world";
}

dt_status dt_comm_fit_rows(dt_ctx *ctx, const cJSON *rows, int ranks, int nodes, dt_comm_fit *out) {
    memset(out, 0, sizeof *out);
    out->ranks = ranks, out->nodes = nodes;
    int nrows = cJSON_GetArraySize(rows);
    double x[256], t[256];
    for (int i = 0; i < nrows; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const cJSON *op = cJSON_GetObjectItem(r, "op");
        if (!cJSON_IsString(op)) return dt_fail(ctx, DT_ERR_FORMAT, "comm fit: row %d has no op", i);
        const char *grp = row_group(r);
        if (strcmp(grp, "world") && strcmp(grp, "node") && strcmp(grp, "cross"))
            return dt_fail(ctx, DT_ERR_FORMAT, "comm fit: row %d: group '%s' is not world, node or cross", i, grp);
        int seen = 0;
        for (int k = 0; k < out->n && !seen; k++)
            seen = !strcmp(out->line[k].op, op->valuestring) && !strcmp(out->line[k].group, grp);
        if (seen) continue;
        /* every row of this (group, op), by size range: latency-bound, cache-resident, memory-
         * or network-bound */
        static const double edge[] = {0, DT_COMM_FIT_SPLIT, DT_COMM_FIT_SPLIT2, INFINITY};
        for (int range = 0; range < 3; range++) {
            int n = 0;
            for (int k = i; k < nrows && n < 256; k++) {
                const cJSON *rk = cJSON_GetArrayItem(rows, k);
                const cJSON *ok = cJSON_GetObjectItem(rk, "op");
                if (!cJSON_IsString(ok) || strcmp(ok->valuestring, op->valuestring) || strcmp(row_group(rk), grp)) continue;
                double b = cJSON_GetNumberValue(cJSON_GetObjectItem(rk, "bytes"));
                double us = cJSON_GetNumberValue(cJSON_GetObjectItem(rk, "time_us"));
                if (!(b > 0) || !(us > 0))
                    return dt_fail(ctx, DT_ERR_FORMAT, "comm fit: row %d (%s) needs bytes and time_us > 0", k, ok->valuestring);
                if (b < edge[range] || b >= edge[range + 1]) continue;
                x[n] = b, t[n] = us, n++;
            }
            if (n == 0) continue;
            if (out->n >= DT_COMM_FIT_MAX) return dt_fail(ctx, DT_ERR_FORMAT, "comm fit: more than %d lines", DT_COMM_FIT_MAX);
            dt_comm_fit_line *l = &out->line[out->n++];
            snprintf(l->op, sizeof l->op, "%s", op->valuestring);
            snprintf(l->group, sizeof l->group, "%s", grp);
            l->n = n;
            l->lo = l->hi = x[0];
            for (int k = 0; k < n; k++) l->lo = fmin(l->lo, x[k]), l->hi = fmax(l->hi, x[k]);
            if (n == 1) l->alpha_us = 0, l->beta_us_per_b = t[0] / x[0];
            else fit_line(x, t, n, &l->alpha_us, &l->beta_us_per_b);
            for (int k = 0; k < n; k++)
                l->max_rel_err = fmax(l->max_rel_err, fabs(dt_comm_fit_predict_us(l, x[k]) - t[k]) / t[k]);
        }
    }
    if (out->n == 0) return dt_fail(ctx, DT_ERR_FORMAT, "comm fit: no rows to fit");
    return DT_OK;
}

const dt_comm_fit_line *dt_comm_fit_find_in(const dt_comm_fit *f, const char *group, const char *op, double bytes) {
    const dt_comm_fit_line *best = NULL;
    double dist = INFINITY;
    for (int k = 0; k < f->n; k++) {
        const dt_comm_fit_line *l = &f->line[k];
        if (strcmp(l->op, op) || strcmp(l->group[0] ? l->group : "world", group)) continue; /* unset: the world */
        double d = bytes < l->lo ? l->lo - bytes : bytes > l->hi ? bytes - l->hi : 0.0;
        if (d < dist) dist = d, best = l;
    }
    return best;
}

const dt_comm_fit_line *dt_comm_fit_find(const dt_comm_fit *f, const char *op, double bytes) {
    return dt_comm_fit_find_in(f, "world", op, bytes);
}
double dt_comm_fit_predict_us(const dt_comm_fit_line *l, double bytes) { return l->alpha_us + l->beta_us_per_b * bytes; }

dt_status dt_comm_fit_save(dt_ctx *ctx, const char *path, const dt_comm_fit *f) {
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "lines");
    cJSON_AddStringToObject(o, "schema", DT_COMM_FIT_SCHEMA);
    cJSON_AddStringToObject(o, "kind", "commfit");
    cJSON_AddNumberToObject(o, "ranks", f->ranks);
    cJSON_AddNumberToObject(o, "nodes", f->nodes);
    for (int k = 0; k < f->n; k++) {
        const dt_comm_fit_line *l = &f->line[k];
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "op", l->op);
        cJSON_AddStringToObject(r, "group", l->group);
        cJSON_AddNumberToObject(r, "min_bytes", l->lo);
        cJSON_AddNumberToObject(r, "max_bytes", l->hi);
        cJSON_AddNumberToObject(r, "alpha_us", l->alpha_us);
        cJSON_AddNumberToObject(r, "beta_us_per_byte", l->beta_us_per_b);
        cJSON_AddNumberToObject(r, "bandwidth_gbs", l->beta_us_per_b > 0 ? 1e-3 / l->beta_us_per_b : 0.0);
        cJSON_AddNumberToObject(r, "max_rel_err", l->max_rel_err);
        cJSON_AddNumberToObject(r, "rows", l->n);
        cJSON_AddItemToArray(a, r);
    }
    dt_status st = dt_json_write(ctx, path, o);
    cJSON_Delete(o);
    return st;
}

dt_status dt_comm_fit_load(dt_ctx *ctx, const char *path, dt_comm_fit *f) {
    cJSON *o = NULL;
    DT_CHECK(dt_json_read(ctx, path, &o));
    memset(f, 0, sizeof *f);
    dt_status st = DT_OK;
    const cJSON *schema = cJSON_GetObjectItem(o, "schema"), *lines = cJSON_GetObjectItem(o, "lines");
    if (!cJSON_IsString(schema) || strcmp(schema->valuestring, DT_COMM_FIT_SCHEMA))
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'schema' is not '%s' (a file from dtrain bench comm --fit)", path,
                     DT_COMM_FIT_SCHEMA);
    else if (!cJSON_IsArray(lines) || cJSON_GetArraySize(lines) < 1 || cJSON_GetArraySize(lines) > DT_COMM_FIT_MAX)
        st = dt_fail(ctx, DT_ERR_FORMAT, "%s: key 'lines' must be an array of 1 to %d fits", path, DT_COMM_FIT_MAX);
    f->ranks = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "ranks"));
    f->nodes = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "nodes"));
    for (int k = 0; st == DT_OK && k < cJSON_GetArraySize(lines); k++) {
        const cJSON *r = cJSON_GetArrayItem(lines, k), *op = cJSON_GetObjectItem(r, "op");
        dt_comm_fit_line *l = &f->line[f->n++];
        static const char *const num[] = {"min_bytes", "max_bytes", "alpha_us", "beta_us_per_byte"};
        double v[4];
        for (int j = 0; j < 4 && st == DT_OK; j++) {
            const cJSON *x = cJSON_GetObjectItem(r, num[j]);
            v[j] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
            if (!(v[j] >= 0) || !isfinite(v[j]))
                st = dt_fail(ctx, DT_ERR_FORMAT, "%s: lines[%d].%s must be a number >= 0", path, k, num[j]);
        }
        if (st == DT_OK && !cJSON_IsString(op)) st = dt_fail(ctx, DT_ERR_FORMAT, "%s: lines[%d].op is missing", path, k);
        if (st != DT_OK) break;
        const cJSON *grp = cJSON_GetObjectItem(r, "group");
        if (grp && (!cJSON_IsString(grp) || (strcmp(grp->valuestring, "world") && strcmp(grp->valuestring, "node") &&
                                             strcmp(grp->valuestring, "cross")))) {
            st = dt_fail(ctx, DT_ERR_FORMAT, "%s: lines[%d].group must be world, node or cross", path, k);
            break;
        }
        snprintf(l->op, sizeof l->op, "%s", op->valuestring);
        snprintf(l->group, sizeof l->group, "%s", grp ? grp->valuestring : "world");
        l->lo = v[0], l->hi = v[1], l->alpha_us = v[2], l->beta_us_per_b = v[3];
        l->max_rel_err = cJSON_GetNumberValue(cJSON_GetObjectItem(r, "max_rel_err"));
        l->n = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "rows"));
    }
    cJSON_Delete(o);
    return st;
}

size_t dt_comm_fit_bucket_bytes(const dt_comm_fit *f) {
    const double lo = 1048576.0, hi = 64.0 * 1048576.0;
    const dt_comm_fit_line *l = dt_comm_fit_find(f, "allreduce_ordered", 4.0 * 1048576.0);
    if (!l || !(l->beta_us_per_b > 0)) return (size_t)(4.0 * 1048576.0);
    double b = 9.0 * l->alpha_us / l->beta_us_per_b;
    return (size_t)llround(fmin(hi, fmax(lo, b)));
}

int dt_comm_fit_prefers_hier(const dt_comm_fit *f, int ranks, int nodes, double bytes, double *hier_us, double *flat_us) {
    if (f->ranks != ranks || f->nodes != nodes) return -1;
    const dt_comm_fit_line *h = dt_comm_fit_find(f, "allreduce_ordered", bytes);
    const dt_comm_fit_line *fl = dt_comm_fit_find(f, "allreduce_ordered_flat", bytes);
    if (!h || !fl) return -1;
    *hier_us = dt_comm_fit_predict_us(h, bytes);
    *flat_us = dt_comm_fit_predict_us(fl, bytes);
    return *hier_us <= *flat_us;
}
