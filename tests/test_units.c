/* The unit hooks contract (model.h) under sub-layer units (params.h), for every family and
 * activation checkpointing mode, with hooks that hold units the way ZeRO-3 does at its
 * strictest:
 *  - need_params(u) makes u's parameters readable and every other unit's NaN (the contract:
 *    unit_params[u] is valid only until the next need_params of another unit), so a read of a
 *    unit that was not announced, or of one announced before the last other announcement,
 *    turns the loss or a gradient into NaN;
 *  - a unit's gradients reach the slab only between its grads_begin and grads_end (before and
 *    after they go to a scratch sink that is thrown away);
 * and the loss and every gradient are then bitwise those of a run without hooks. Also:
 * begin/end pairs do not nest, the backward ends units in strictly decreasing order, each unit
 * exactly once; the forward announces the layer units in increasing order; and every `next`
 * names the unit announced after it (the ZeRO-3 prefetch is never wasted). */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "model/model.h"

typedef struct rec {
    dt_model *m;
    float *poison, *sink; /* NaN-filled, scratch: unit-sized */
    int cur;              /* the unit announced last (-1: none) */
    int expect;           /* its `next` (-1: none) */
    int open;             /* the unit between grads_begin and grads_end (-1: none) */
    int last_end;         /* the unit ended last in this backward (n_units: none) */
    int last_layer_need;  /* the highest layer unit announced in this forward (-1: none) */
    int bwd;              /* the backward runs */
    int *ended;           /* per unit: grads_end calls */
    int bad_next, bad_order, bad_nest, needs;
} rec;

static int is_layer_unit(const dt_params *ps, int u) { return u >= ps->n_pre_units && u < DT_UNIT_POST0(ps); }

static void r_need(void *ud, int u, int next, int flags) {
    (void)flags;
    rec *r = ud;
    dt_params *ps = &r->m->ps;
    r->needs++;
    if (u != r->cur) {
        if (r->expect >= 0 && r->expect != u) {
            if (r->bad_next++ < 5) printf("    need %d after %d, whose next was %d\n", u, r->cur, r->expect);
        }
        for (int v = 0; v < ps->n_units; v++) ps->unit_params[v] = r->poison;
        ps->unit_params[u] = ps->params + ps->unit_lo[u];
        r->cur = u;
    }
    r->expect = next;
    if (!r->bwd && is_layer_unit(ps, u)) {
        if (u < r->last_layer_need) r->bad_order++;
        r->last_layer_need = u;
    }
}

static void r_begin(void *ud, int u) {
    rec *r = ud;
    dt_params *ps = &r->m->ps;
    if (r->open >= 0) r->bad_nest++;
    if (u >= r->last_end) r->bad_order++;
    ps->unit_grads[u] = ps->grads + ps->unit_lo[u];
    r->open = u;
}

static void r_end(void *ud, int u) {
    rec *r = ud;
    dt_params *ps = &r->m->ps;
    if (r->open != u) r->bad_nest++;
    ps->unit_grads[u] = r->sink;
    r->open = -1;
    r->last_end = u;
    r->ended[u]++;
}

static dt_model_config family(const char *f, int untied) {
    if (!strcmp(f, "llama"))
        return (dt_model_config){.family = "llama", .n_layer = 3, .d_model = 32, .n_head = 4, .n_kv_head = 2,
                                 .d_ff = 64, .vocab = 300, .context = 16, .untied = untied};
    if (!strcmp(f, "vit"))
        return (dt_model_config){.family = "vit", .n_layer = 3, .d_model = 32, .n_head = 4, .d_ff = 64,
                                 .image_size = 8, .patch_size = 4, .n_classes = 5};
    return (dt_model_config){.n_layer = 3, .d_model = 32, .n_head = 4, .vocab = 300, .context = 16};
}

/* One forward + backward of cfg under o; with hooks (rec r) or without. Returns the loss and
 * a copy of the gradient slab in *g. */
static float run(const dt_model_config *cfg, const dt_model_opts *o, rec *r, float **g, size_t *n) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_alloc a;
    dt_alloc_init(&a);
    dt_model m;
    int vit = !strcmp(cfg->family, "vit");
    int B = 2, T = vit ? 64 : 16;
    assert_int_equal(dt_model_init_opts(&ctx, &m, cfg, o, &a, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS), DT_OK);
    dt_model_init_weights(&m, 7);
    memset(m.ps.grads, 0, m.ps.n_params * sizeof(float));
    size_t bt = (size_t)B * T, mx = 0;
    int32_t *in = tu_malloc(bt * sizeof(int32_t)), *tg = tu_malloc(bt * sizeof(int32_t));
    for (size_t i = 0; i < bt; i++) in[i] = (int32_t)((i * 7 + 3) % 256), tg[i] = (int32_t)(vit ? i % 5 : (i * 11 + 1) % 300);
    for (int u = 0; u < m.ps.n_units; u++) mx = m.ps.unit_len[u] > mx ? m.ps.unit_len[u] : mx;
    if (r) {
        memset(r, 0, sizeof *r);
        r->m = &m;
        r->poison = tu_malloc(mx * sizeof(float));
        r->sink = tu_malloc(mx * sizeof(float));
        for (size_t i = 0; i < mx; i++) r->poison[i] = NAN;
        r->ended = tu_malloc((size_t)m.ps.n_units * sizeof(int));
        memset(r->ended, 0, (size_t)m.ps.n_units * sizeof(int));
        r->cur = r->expect = r->open = r->last_layer_need = -1;
        r->last_end = m.ps.n_units;
        for (int u = 0; u < m.ps.n_units; u++) m.ps.unit_params[u] = r->poison, m.ps.unit_grads[u] = r->sink;
        m.hooks = (dt_model_hooks){r, r_need, r_begin, r_end, NULL};
    }
    float loss;
    assert_int_equal(dt_model_forward(&ctx, &m, in, tg, &loss), DT_OK);
    if (r) r->bwd = 1;
    dt_model_backward(&m, 1.0f);
    *n = m.ps.n_params;
    *g = tu_malloc(*n * sizeof(float));
    memcpy(*g, m.ps.grads, *n * sizeof(float));
    if (r) {
        for (int u = 0; u < m.ps.n_units; u++)
            if (r->ended[u] != 1) {
                printf("    unit %d ended %d times\n", u, r->ended[u]);
                r->bad_order++;
            }
        assert_int_equal(m.ps.layer_units, 3);
        free(r->poison);
        free(r->sink);
        free(r->ended);
    }
    free(in);
    free(tg);
    dt_model_free(&m);
    assert_int_equal(a.total_cur, 0);
    return loss;
}

static void test_hooks_contract_with_sub_layer_units(void **state) {
    (void)state;
    static const struct { const char *f; int untied; } fams[] = {{"gpt2", 0}, {"llama", 0}, {"llama", 1}, {"vit", 0}};
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
        for (int rc = 0; rc < 3; rc++)
            for (int every = 1; every <= 2; every++) {
                if (rc == 0 && every == 2) continue;
                dt_model_config cfg = family(fams[f].f, fams[f].untied);
                dt_model_opts o = {.recompute = (dt_recompute)rc, .recompute_every = every, .compute = DT_F32};
                float *g0, *g1;
                size_t n0, n1;
                rec r;
                float l0 = run(&cfg, &o, NULL, &g0, &n0);
                float l1 = run(&cfg, &o, &r, &g1, &n1);
                int nan = 0;
                for (size_t i = 0; i < n1; i++) nan += isnan(g1[i]) != 0;
                printf("  %-5s%s %-9s every %d: %d announcements, loss %.6f, next mismatches %d, order %d, "
                       "nesting %d, NaN gradients %zu\n", fams[f].f, fams[f].untied ? " (untied)" : "",
                       dt_recompute_name(o.recompute), every, r.needs, (double)l1, r.bad_next, r.bad_order,
                       r.bad_nest, (size_t)nan);
                assert_int_equal(n0, n1);
                assert_true(memcmp(&l0, &l1, sizeof l0) == 0);
                assert_true(memcmp(g0, g1, n0 * sizeof(float)) == 0);
                assert_int_equal(r.bad_next + r.bad_order + r.bad_nest + nan, 0);
                free(g0);
                free(g1);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_contract_with_sub_layer_units),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
