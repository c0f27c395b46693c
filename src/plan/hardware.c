/* The hardware catalog (hardware.h): configs/hardware.yaml read with libyaml. */
#include "plan/hardware.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "train/config_yaml.h"

const char *const dt_hw_prec_names[DT_HW_NPREC] = {"fp32", "tf32", "bf16", "fp16", "fp8"};

typedef struct ld {
    dt_ctx *ctx;
    const char *path;
    yaml_document_t *doc;
} ld;

static const char *sc(const yaml_node_t *n) { return n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : "?"; }
static unsigned long line_of(const yaml_node_t *n) { return (unsigned long)n->start_mark.line + 1; }
static yaml_node_t *node(ld *L, int i) { return yaml_document_get_node(L->doc, i); }

static dt_status num(ld *L, const yaml_node_t *v, const char *key, double lo, double hi, double *out) {
    if (v->type == YAML_SCALAR_NODE) {
        char *end;
        double d = strtod(sc(v), &end);
        if (end != sc(v) && !*end && isfinite(d) && d >= lo && d <= hi) {
            *out = d;
            return DT_OK;
        }
    }
    return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a number in [%g, %g] (got '%s')", L->path, line_of(v),
                   key, lo, hi, sc(v));
}

static dt_status str(ld *L, const yaml_node_t *v, const char *key, char *dst, size_t n) {
    if (v->type != YAML_SCALAR_NODE || !*sc(v))
        return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a non-empty string", L->path, line_of(v), key);
    if (strlen(sc(v)) >= n)
        return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s is longer than %zu characters", L->path, line_of(v), key, n - 1);
    snprintf(dst, n, "%s", sc(v));
    return DT_OK;
}

static dt_status mapping(ld *L, const yaml_node_t *v, const char *key) {
    if (v->type == YAML_MAPPING_NODE) return DT_OK;
    return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a mapping", L->path, line_of(v), key);
}

/* Each key k and value v of mapping m (break leaves only the inner one-pass loop: use goto). */
#define FOR_PAIRS(L, m, k, v)                                                                         \
    for (yaml_node_pair_t *k##_p = (m)->data.mapping.pairs.start; k##_p < (m)->data.mapping.pairs.top; k##_p++) \
        for (yaml_node_t *k = node(L, k##_p->key), *v = node(L, k##_p->value), *k##_1 = k; k##_1; k##_1 = NULL)

static dt_status load_accel(ld *L, const yaml_node_t *kn, const yaml_node_t *m, dt_hw_accel *a) {
    dt_ctx *ctx = L->ctx; /* for DT_CHECK */
    char key[160];
    memset(a, 0, sizeof *a);
    a->gemm_eff = -1;
    DT_CHECK(str(L, kn, "accelerators.<name>", a->key, sizeof a->key));
    snprintf(key, sizeof key, "accelerators.%s", a->key);
    DT_CHECK(mapping(L, m, key));
    int have_mem = 0;
    FOR_PAIRS(L, m, k, v) {
        const char *f = sc(k);
        snprintf(key, sizeof key, "accelerators.%s.%s", a->key, f);
        if (!strcmp(f, "name")) DT_CHECK(str(L, v, key, a->name, sizeof a->name));
        else if (!strcmp(f, "kind")) {
            DT_CHECK(str(L, v, key, a->kind, sizeof a->kind));
            if (strcmp(a->kind, "gpu") && strcmp(a->kind, "cpu"))
                return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s must be gpu or cpu (got '%s')", L->path, line_of(v),
                               key, a->kind);
        } else if (!strcmp(f, "peak_tflops")) {
            DT_CHECK(mapping(L, v, key));
            FOR_PAIRS(L, v, pk, pv) {
                int i = 0;
                while (i < DT_HW_NPREC && strcmp(sc(pk), dt_hw_prec_names[i])) i++;
                if (i == DT_HW_NPREC)
                    return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s.%s: unknown dtype (fp32, tf32, bf16, fp16, fp8)",
                                   L->path, line_of(pk), key, sc(pk));
                char k2[200];
                snprintf(k2, sizeof k2, "%s.%s", key, sc(pk));
                DT_CHECK(num(L, pv, k2, 1e-6, 1e6, &a->peak_tflops[i]));
            }
        } else if (!strcmp(f, "memory_gib") || !strcmp(f, "memory_gb")) {
            double g;
            DT_CHECK(num(L, v, key, 1e-3, 1e6, &g));
            a->memory_bytes = g * (f[8] == 'i' ? 1073741824.0 : 1e9);
            have_mem = 1;
        } else if (!strcmp(f, "memory_bw_gbs")) DT_CHECK(num(L, v, key, 1e-3, 1e7, &a->memory_bw_gbs));
        else if (!strcmp(f, "step_overhead_us")) DT_CHECK(num(L, v, key, 0, 1e7, &a->step_overhead_us));
        else if (!strcmp(f, "collective_call_us")) DT_CHECK(num(L, v, key, 0, 1e7, &a->collective_call_us));
        else if (!strcmp(f, "optimizer_bw_gbs")) DT_CHECK(num(L, v, key, 0, 1e7, &a->optimizer_bw_gbs));
        else if (!strcmp(f, "idle_speedup")) DT_CHECK(num(L, v, key, 1, 4096, &a->idle_speedup));
        else if (!strcmp(f, "devices_per_node") || !strcmp(f, "nics_per_node") || !strcmp(f, "machine_ranks")) {
            double d;
            DT_CHECK(num(L, v, key, f[0] == 'n' ? 0 : 1, f[0] == 'm' ? 1048576 : 4096, &d));
            if (d != floor(d))
                return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s must be a whole number", L->path, line_of(v), key);
            *(f[0] == 'd' ? &a->devices_per_node : f[0] == 'n' ? &a->nics_per_node : &a->machine_ranks) = (int)d;
        } else if (!strcmp(f, "intra_node")) DT_CHECK(str(L, v, key, a->intra, sizeof a->intra));
        else if (!strcmp(f, "inter_node")) DT_CHECK(str(L, v, key, a->inter, sizeof a->inter));
        else if (!strcmp(f, "tp_link")) DT_CHECK(str(L, v, key, a->tp_link, sizeof a->tp_link));
        else if (!strcmp(f, "pp_link")) DT_CHECK(str(L, v, key, a->pp_link, sizeof a->pp_link));
        else if (!strcmp(f, "same_compute_as")) DT_CHECK(str(L, v, key, a->same_compute_as, sizeof a->same_compute_as));
        else if (!strcmp(f, "ep_link")) DT_CHECK(str(L, v, key, a->ep_link, sizeof a->ep_link));
        else if (!strcmp(f, "pp_inter_link")) DT_CHECK(str(L, v, key, a->pp_inter_link, sizeof a->pp_inter_link));
        else if (!strcmp(f, "ep_inter_link")) DT_CHECK(str(L, v, key, a->ep_inter_link, sizeof a->ep_inter_link));
        else
            return dt_fail(L->ctx, DT_ERR_CONFIG,
                           "%s:%lu: %s: unknown key (name, kind, peak_tflops, memory_gib|memory_gb, memory_bw_gbs, "
                           "devices_per_node, intra_node, inter_node, tp_link, pp_link, ep_link, pp_inter_link, "
                           "ep_inter_link, nics_per_node, step_overhead_us, collective_call_us, optimizer_bw_gbs, "
                           "same_compute_as, idle_speedup, machine_ranks)",
                           L->path, line_of(k), key);
    }
    const char *miss = !a->name[0] ? "name" : !have_mem ? "memory_gib" : !a->devices_per_node ? "devices_per_node"
                       : !a->intra[0] ? "intra_node" : !a->inter[0] ? "inter_node" : NULL;
    if (!miss) {
        int any = 0;
        for (int i = 0; i < DT_HW_NPREC; i++) any |= a->peak_tflops[i] > 0;
        if (!any) miss = "peak_tflops";
    }
    if (miss) return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: accelerators.%s.%s is missing", L->path, line_of(m), a->key, miss);
    if (!a->kind[0]) snprintf(a->kind, sizeof a->kind, "gpu");
    if (a->nics_per_node == 0) a->nics_per_node = 1;
    return DT_OK;
}

static dt_status load_link(ld *L, const yaml_node_t *kn, const yaml_node_t *m, dt_hw_link *l) {
    dt_ctx *ctx = L->ctx; /* for DT_CHECK */
    char key[160];
    memset(l, 0, sizeof *l);
    l->eff = -1, l->bw_gbs = -1, l->latency_us = -1;
    DT_CHECK(str(L, kn, "links.<name>", l->key, sizeof l->key));
    snprintf(key, sizeof key, "links.%s", l->key);
    DT_CHECK(mapping(L, m, key));
    FOR_PAIRS(L, m, k, v) {
        const char *f = sc(k);
        snprintf(key, sizeof key, "links.%s.%s", l->key, f);
        if (!strcmp(f, "name")) DT_CHECK(str(L, v, key, l->name, sizeof l->name));
        else if (!strcmp(f, "bw_gbs")) DT_CHECK(num(L, v, key, 1e-6, 1e6, &l->bw_gbs));
        else if (!strcmp(f, "latency_us")) DT_CHECK(num(L, v, key, 0, 1e7, &l->latency_us));
        else
            return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s: unknown key (name, bw_gbs, latency_us)", L->path,
                           line_of(k), key);
    }
    const char *miss = l->bw_gbs < 0 ? "bw_gbs" : l->latency_us < 0 ? "latency_us" : NULL;
    if (miss) return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: links.%s.%s is missing", L->path, line_of(m), l->key, miss);
    if (!l->name[0]) snprintf(l->name, sizeof l->name, "%s", l->key);
    return DT_OK;
}

/* efficiency: {gemm: {default: x, <accel>: y}, link: {default: x, <link>: y}} */
static dt_status load_eff(ld *L, const yaml_node_t *m, dt_hw_catalog *c) {
    dt_ctx *ctx = L->ctx; /* for DT_CHECK */
    DT_CHECK(mapping(L, m, "efficiency"));
    FOR_PAIRS(L, m, k, v) {
        int gemm = !strcmp(sc(k), "gemm");
        if (!gemm && strcmp(sc(k), "link"))
            return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: efficiency.%s: unknown key (gemm, link)", L->path,
                           line_of(k), sc(k));
        char key[160];
        snprintf(key, sizeof key, "efficiency.%s", sc(k));
        DT_CHECK(mapping(L, v, key));
        FOR_PAIRS(L, v, ek, ev) {
            double e;
            snprintf(key, sizeof key, "efficiency.%s.%s", gemm ? "gemm" : "link", sc(ek));
            DT_CHECK(num(L, ev, key, 0.01, 1.0, &e));
            if (!strcmp(sc(ek), "default")) {
                *(gemm ? &c->gemm_default : &c->link_default) = e;
                continue;
            }
            int found = 0;
            if (gemm) {
                for (int i = 0; i < c->n_acc; i++)
                    if (!strcmp(c->acc[i].key, sc(ek))) c->acc[i].gemm_eff = e, found = 1;
            } else {
                for (int i = 0; i < c->n_link; i++)
                    if (!strcmp(c->link[i].key, sc(ek))) c->link[i].eff = e, found = 1;
            }
            if (!found)
                return dt_fail(L->ctx, DT_ERR_CONFIG, "%s:%lu: %s: no such %s in the catalog", L->path, line_of(ek), key,
                               gemm ? "accelerator" : "link");
        }
    }
    return DT_OK;
}

dt_status dt_hw_load(dt_ctx *ctx, const char *path, dt_hw_catalog *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    c->gemm_default = 0.6, c->link_default = 0.8;
    yaml_document_t doc;
    DT_CHECK(dt_yaml_load_file(ctx, path, "hardware catalog", &doc));
    ld L = {ctx, path, &doc};
    dt_status st = DT_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc), *eff = NULL, *acc = NULL, *links = NULL;
    if (!root || root->type != YAML_MAPPING_NODE) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s: expected a mapping with accelerators, links, efficiency", path);
        goto done;
    }
    FOR_PAIRS(&L, root, k, v) {
        if (!strcmp(sc(k), "accelerators")) acc = v;
        else if (!strcmp(sc(k), "links")) links = v;
        else if (!strcmp(sc(k), "efficiency")) eff = v;
        else {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: %s: unknown key (accelerators, links, efficiency)", path,
                         line_of(k), sc(k));
            goto done;
        }
    }
    if (!acc || !links) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s: %s is missing", path, !acc ? "accelerators" : "links");
        goto done;
    }
    if ((st = mapping(&L, acc, "accelerators")) || (st = mapping(&L, links, "links"))) goto done;
    c->acc = calloc((size_t)(acc->data.mapping.pairs.top - acc->data.mapping.pairs.start) + 1, sizeof *c->acc);
    c->link = calloc((size_t)(links->data.mapping.pairs.top - links->data.mapping.pairs.start) + 1, sizeof *c->link);
    if (!c->acc || !c->link) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    FOR_PAIRS(&L, links, k, v) {
        if ((st = load_link(&L, k, v, &c->link[c->n_link]))) goto done;
        if (dt_hw_link_find(c, c->link[c->n_link].key)) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: links.%s is listed twice", path, line_of(k), sc(k));
            goto done;
        }
        c->n_link++;
    }
    FOR_PAIRS(&L, acc, k, v) {
        dt_hw_accel *a = &c->acc[c->n_acc];
        if ((st = load_accel(&L, k, v, a))) goto done;
        for (int i = 0; i < c->n_acc; i++)
            if (!strcasecmp(c->acc[i].key, a->key)) {
                st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: accelerators.%s is listed twice", path, line_of(k), a->key);
                goto done;
            }
        const char *bad = !dt_hw_link_find(c, a->intra)                   ? a->intra
                          : !dt_hw_link_find(c, a->inter)                   ? a->inter
                          : a->tp_link[0] && !dt_hw_link_find(c, a->tp_link) ? a->tp_link
                          : a->pp_link[0] && !dt_hw_link_find(c, a->pp_link) ? a->pp_link
                          : a->ep_link[0] && !dt_hw_link_find(c, a->ep_link) ? a->ep_link
                          : a->pp_inter_link[0] && !dt_hw_link_find(c, a->pp_inter_link) ? a->pp_inter_link
                          : a->ep_inter_link[0] && !dt_hw_link_find(c, a->ep_inter_link) ? a->ep_inter_link
                                                                             : NULL;
        if (bad) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s:%lu: accelerators.%s: link '%s' is not under links", path, line_of(v),
                         a->key, bad);
            goto done;
        }
        c->n_acc++;
    }
    if (c->n_acc == 0) {
        st = dt_fail(ctx, DT_ERR_CONFIG, "%s: accelerators: none listed", path);
        goto done;
    }
    /* same_compute_as names another entry with the same peaks on every dtype (the same die and clocks) */
    for (int i = 0; i < c->n_acc; i++) {
        dt_hw_accel *a = &c->acc[i];
        a->compute_twin = -1;
        if (!a->same_compute_as[0]) continue;
        for (int j = 0; j < c->n_acc; j++)
            if (j != i && !strcasecmp(c->acc[j].key, a->same_compute_as)) a->compute_twin = j;
        if (a->compute_twin < 0) {
            st = dt_fail(ctx, DT_ERR_CONFIG, "%s: accelerators.%s.same_compute_as: '%s' is not another entry under accelerators",
                         path, a->key, a->same_compute_as);
            goto done;
        }
        const dt_hw_accel *t = &c->acc[a->compute_twin];
        for (int p = 0; p < DT_HW_NPREC; p++)
            if (a->peak_tflops[p] != t->peak_tflops[p]) {
                st = dt_fail(ctx, DT_ERR_CONFIG,
                             "%s: accelerators.%s.same_compute_as: %s's peak_tflops.%s is %g, this entry's %g (the same "
                             "compute has the same peaks)", path, a->key, t->key, dt_hw_prec_names[p], t->peak_tflops[p],
                             a->peak_tflops[p]);
                goto done;
            }
    }
    if (eff && (st = load_eff(&L, eff, c))) goto done;
    for (int i = 0; i < c->n_acc; i++)
        if (c->acc[i].gemm_eff < 0) c->acc[i].gemm_eff = c->gemm_default;
    for (int i = 0; i < c->n_link; i++)
        if (c->link[i].eff < 0) c->link[i].eff = c->link_default;
done:
    yaml_document_delete(&doc);
    if (st != DT_OK) dt_hw_free(c);
    return st;
}

void dt_hw_free(dt_hw_catalog *c) {
    free(c->acc);
    free(c->link);
    c->acc = NULL, c->link = NULL;
    c->n_acc = c->n_link = 0;
}

const dt_hw_link *dt_hw_link_find(const dt_hw_catalog *c, const char *key) {
    for (int i = 0; i < c->n_link; i++)
        if (!strcmp(c->link[i].key, key)) return &c->link[i];
    return NULL;
}

const dt_hw_link *dt_hw_tp_link(const dt_hw_catalog *c, const dt_hw_accel *a) {
    const dt_hw_link *l = a->tp_link[0] ? dt_hw_link_find(c, a->tp_link) : NULL;
    return l ? l : dt_hw_link_find(c, a->intra);
}

const dt_hw_link *dt_hw_pp_link(const dt_hw_catalog *c, const dt_hw_accel *a) {
    const dt_hw_link *l = a->pp_link[0] ? dt_hw_link_find(c, a->pp_link) : NULL;
    return l ? l : dt_hw_link_find(c, a->intra);
}

const dt_hw_link *dt_hw_ep_link(const dt_hw_catalog *c, const dt_hw_accel *a) {
    const dt_hw_link *l = a->ep_link[0] ? dt_hw_link_find(c, a->ep_link) : NULL;
    return l ? l : dt_hw_link_find(c, a->intra);
}

const dt_hw_link *dt_hw_pp_inter_link(const dt_hw_catalog *c, const dt_hw_accel *a) {
    const dt_hw_link *l = a->pp_inter_link[0] ? dt_hw_link_find(c, a->pp_inter_link) : NULL;
    return l ? l : dt_hw_link_find(c, a->inter);
}

const dt_hw_link *dt_hw_ep_inter_link(const dt_hw_catalog *c, const dt_hw_accel *a) {
    const dt_hw_link *l = a->ep_inter_link[0] ? dt_hw_link_find(c, a->ep_inter_link) : NULL;
    return l ? l : dt_hw_link_find(c, a->inter);
}

int dt_hw_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return (int)(la > lb ? la : lb);
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

const char *dt_hw_closest(const char *s, const char *const *cands, int n) {
    const char *best = NULL;
    int bd = 1 << 30, lim = (int)strlen(s) / 3;
    if (lim < 2) lim = 2;
    for (int i = 0; i < n; i++) {
        int d = dt_hw_edit_distance(s, cands[i]);
        if (d < bd) bd = d, best = cands[i];
    }
    return bd <= lim ? best : NULL;
}

dt_status dt_hw_find(dt_ctx *ctx, const dt_hw_catalog *c, const char *key, const dt_hw_accel **out) {
    const char *names[256];
    int n = 0;
    for (int i = 0; i < c->n_acc; i++) {
        if (!strcasecmp(c->acc[i].key, key)) {
            *out = &c->acc[i];
            return DT_OK;
        }
        if (n < 256) names[n++] = c->acc[i].key;
    }
    char known[1024] = "";
    for (int i = 0; i < n; i++) snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", names[i]);
    const char *near = dt_hw_closest(key, names, n);
    if (near)
        return dt_fail(ctx, DT_ERR_CONFIG, "--hardware %s: not in %s (did you mean %s? known: %s)", key, c->path, near, known);
    return dt_fail(ctx, DT_ERR_CONFIG, "--hardware %s: not in %s (known: %s)", key, c->path, known);
}

double dt_hw_peak(const dt_hw_accel *a, dt_dtype compute) {
    return compute == DT_BF16 ? a->peak_tflops[DT_HW_BF16]
           : compute == DT_F16 ? a->peak_tflops[DT_HW_FP16]
                               : a->peak_tflops[DT_HW_FP32];
}
