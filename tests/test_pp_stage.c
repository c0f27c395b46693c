/* Pipeline stages inside the model (model.h dt_model_opts.pp_l0/pp_l1, dt_model_stage_buf;
 * ARCHITECTURE decision 74), without communication: the stages of one model run in one
 * process, each stage's output copied into the next one's input and each input gradient back,
 * against the whole model.
 *   - a stage's store holds its layers only (PRE tensors on the first stage, POST on the last)
 *     and each tensor starts as the whole model's copy of that layer (bitwise);
 *   - 2 and 3 stages give bitwise the whole model's loss and every gradient, for llama (untied
 *     head, grouped-query attention) and vit, in fp32 and bf16, with activation checkpointing
 *     (the recomputed layers are the model's, whatever the cut);
 *   - three micro-batches in flight on the first stage (gpipe's order: F0 F1 F2 B0 B1 B2, each
 *     with its own activations, dt_model_use_acts) accumulate the gradients of F0 B0 F1 B1 F2 B2
 *     bitwise;
 *   - two backward passes swapped on the first stage (a wrong schedule) change the gradients:
 *     the comparison can fail;
 *   - zb-h1's split backward (decisions 79, 81): B0 B1 W0 B2 W1 W2 with the douts placed by
 *     dt_model_defer_plan gives the plain backward's losses, gradients and input gradients
 *     bitwise, for llama, gpt2 and vit, fp32 and bf16, a whole model, a first and a last stage,
 *     with full and selective activation checkpointing (the recomputed layers defer nothing);
 *     no placed dout overlaps another or a deferred GEMM's input; the fallback is 0 floats but
 *     for vit's last stage (its head's B x classes douts, 16-aligned); a dout placed over a
 *     live span (the top layer's q|k|v) changes the gradients: the comparison can fail;
 *   - the same under tensor parallelism's blocks mode (tp 2, both shards in one process; each
 *     shard's GEMMs deferred, a fused projection's columns at their stride) for llama, gpt2 and
 *     vit, fp32 and bf16, with checkpointing and with sequence parallelism (the column-parallel
 *     inputs gathered again at W), and for a mixture of experts (mixtral-tiny, fp32: the
 *     experts' douts and gathered inputs in blocks of the plan; decision 84);
 *   - a layer range outside the model is refused naming the key (a tied head over stages runs
 *     through the trainer: tests/test_pp.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "testutil.h"

enum { B = 2, MB = 3 };
static const char *g_preset = "llama-tiny";
static int T = 32;

static dt_model_config cfg(int layers) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, g_preset, &c), DT_OK);
    c.n_layer = layers;
    if (!strcmp(g_preset, "llama-tiny")) c.untied = 1, c.vocab = 250;
    return c;
}

static int g_v = 0, g_stride = 0, g_every = 2; /* an interleaved stage's chunks (make) */
static int g_tp = 0, g_sp = 0; /* tensor parallelism's blocks mode (every shard here), sequence parallelism */

static void make(dt_model *m, dt_alloc *al, int layers, int l0, int l1, dt_dtype compute, dt_recompute rc) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c = cfg(layers);
    dt_model_opts o = {rc, g_every, compute, 0, 0, {0}, g_tp, g_tp, 0, g_sp, l0, l1, g_v, g_stride, 0, 0, 0, 0, 0, 0};
    dt_alloc_init(al);
    dt_status st = dt_model_init_opts(&ctx, m, &c, &o, al, B, T, DT_SLAB_PARAMS | DT_SLAB_GRADS);
    if (st != DT_OK) fail_msg("init: %s", ctx.err);
    dt_model_init_weights(m, 1234);
    dt_params_zero_grad(&m->ps);
}

static void batch(int k, int32_t *in, int32_t *tg) {
    if (!strcmp(g_preset, "vit-tiny")) {
        for (int i = 0; i < B * T; i++)
            in[i] = (int32_t)((i * 37 + 11 + 5 * k) % 256), tg[i] = (int32_t)(((i / T) * 3 + k) % 10);
        return;
    }
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 37 + 11 + 13 * k) % 250);
        tg[i] = i % 29 == 3 ? -1 : (int32_t)((i * 53 + 7 + k) % 250);
    }
}

/* The whole model: F B per micro-batch, gradients accumulated. */
static void run_whole(dt_model *m, float *loss) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    for (int k = 0; k < MB; k++) {
        int32_t in[B * 64], tg[B * 64];
        batch(k, in, tg);
        assert_int_equal(dt_model_forward(&ctx, m, in, tg, &loss[k]), DT_OK);
        dt_model_backward(m, 0.5f);
    }
}

/* Stages s[0..n): the first keeps every micro-batch's activations (F0 F1 F2 then B0 B1 B2, or
 * B0 B2 B1 when `swap`: with two, swapped sums would still be equal, a + b = b + a); the others
 * run F B per micro-batch. */
static void run_stages(dt_model *s, int n, float *loss, int swap) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    size_t na = s[0].n_acts, nf = dt_model_stage_floats(&s[0]);
    float *slab[MB];
    slab[0] = s[0].acts;
    for (int k = 1; k < MB; k++) slab[k] = tu_malloc(na * sizeof(float));
    float *dinput[MB];
    int32_t in[MB][B * 64], tg[MB][B * 64];
    for (int k = 0; k < MB; k++) {
        batch(k, in[k], tg[k]);
        dt_model_use_acts(&s[0], slab[k]);
        assert_int_equal(dt_model_forward(&ctx, &s[0], in[k], tg[k], NULL), DT_OK);
    }
    for (int k = 0; k < MB; k++) {
        dt_model_use_acts(&s[0], slab[k]);
        const float *x = dt_model_stage_buf(&s[0], DT_STAGE_OUT);
        for (int j = 1; j < n; j++) {
            memcpy(dt_model_stage_buf(&s[j], DT_STAGE_IN), x, nf * sizeof(float));
            float l = -1.0f;
            assert_int_equal(dt_model_forward(&ctx, &s[j], in[k], tg[k], &l), DT_OK);
            if (j == n - 1) loss[k] = l;
            x = dt_model_stage_buf(&s[j], DT_STAGE_OUT);
        }
        for (int j = n - 1; j >= 1; j--) {
            dt_model_backward(&s[j], 0.5f);
            float *dst = j > 1 ? dt_model_stage_buf(&s[j - 1], DT_STAGE_DOUT) : NULL;
            if (dst) memcpy(dst, dt_model_stage_buf(&s[j], DT_STAGE_DIN), nf * sizeof(float));
        }
        dinput[k] = tu_malloc(nf * sizeof(float));
        memcpy(dinput[k], dt_model_stage_buf(&s[1], DT_STAGE_DIN), nf * sizeof(float));
    }
    for (int i = 0; i < MB; i++) {
        int k = swap && i > 0 ? MB - i : i;
        dt_model_use_acts(&s[0], slab[k]);
        s[0].has_targets = 1; /* the runtime's per-micro-batch state */
        memcpy(dt_model_stage_buf(&s[0], DT_STAGE_DOUT), dinput[k], nf * sizeof(float));
        dt_model_backward(&s[0], 0.5f);
    }
    dt_model_use_acts(&s[0], slab[0]);
    for (int k = 0; k < MB; k++) free(dinput[k]);
    for (int k = 1; k < MB; k++) free(slab[k]);
}

/* Every tensor of stage s against the whole model's copy of its layer; returns the elements
 * compared, fails on the first difference. With `expect_diff` returns the differing count
 * instead of failing. */
static size_t compare_store(const dt_model *s, const dt_model *w, int grads, int expect_diff) {
    size_t n = 0, diff = 0;
    for (int id = 0; id < s->ps.n_tensors; id++) {
        const dt_tensor_info *t = &s->ps.tensors[id];
        if (dt_tensor_absent(t)) continue;
        assert_int_equal((int)(t->rows * t->cols), (int)(w->ps.tensors[id].rows * w->ps.tensors[id].cols));
        for (int l = 0; l < dt_params_copies(&s->ps, id); l++) {
            const float *a = dt_params_tensor(&s->ps, grads ? s->ps.grads : s->ps.params, id, l);
            const float *b = dt_params_tensor(&w->ps, grads ? w->ps.grads : w->ps.params, id, dt_params_layer(&s->ps, l));
            size_t len = t->rows * t->cols;
            for (size_t i = 0; i < len; i++) assert_true(isfinite(a[i]));
            if (memcmp(a, b, len * sizeof(float))) {
                char name[128];
                dt_params_name(&s->ps, id, l, name, sizeof name);
                if (!expect_diff) fail_msg("%s of %s differs from the whole model's", grads ? "gradient" : "weight", name);
                for (size_t i = 0; i < len; i++) diff += a[i] != b[i];
            }
            n += len;
        }
    }
    return expect_diff ? diff : n;
}

static void check_cut(const int *first, int n, dt_dtype compute, dt_recompute rc) {
    const int L = first[n];
    dt_alloc aw, as[4];
    dt_model w, s[4];
    make(&w, &aw, L, 0, 0, compute, rc);
    for (int j = 0; j < n; j++) make(&s[j], &as[j], L, first[j], first[j + 1], compute, rc);
    /* the stores: layers and ends of their own, each tensor the whole model's */
    size_t held = 0;
    for (int j = 0; j < n; j++) {
        assert_int_equal(s[j].ps.n_layer, first[j + 1] - first[j]);
        held += compare_store(&s[j], &w, 0, 0);
        assert_true(s[j].ps.n_params < w.ps.n_params);
    }
    assert_int_equal((int)held, (int)w.ps.n_params); /* every tensor held by exactly one stage */
    float lw[MB], ls[MB];
    run_whole(&w, lw);
    run_stages(s, n, ls, 0);
    for (int k = 0; k < MB; k++) {
        assert_true(isfinite(lw[k]));
        if (memcmp(&lw[k], &ls[k], sizeof(float))) fail_msg("micro-batch %d: loss %.9g vs the whole model's %.9g", k, ls[k], lw[k]);
    }
    size_t g = 0;
    double sq = 0;
    for (int j = 0; j < n; j++) g += compare_store(&s[j], &w, 1, 0);
    for (size_t i = 0; i < w.ps.n_params; i++) sq += (double)w.ps.grads[i] * w.ps.grads[i];
    assert_true(sq > 0 && isfinite(sq));
    printf("    %s cut", g_preset);
    for (int j = 0; j <= n; j++) printf(" %d", first[j]);
    printf(" (%s, %s): losses and %zu gradient elements bitwise\n", dt_dtype_name(compute), dt_recompute_name(rc), g);
    /* a wrong schedule: the first stage's two backward passes swapped */
    for (int j = 0; j < n; j++) dt_params_zero_grad(&s[j].ps);
    run_stages(s, n, ls, 1);
    size_t d = compare_store(&s[0], &w, 1, 1);
    printf("    backward passes 0 2 1 on stage 0: %zu gradient elements differ\n", d);
    assert_true(d > 0);
    for (int j = 0; j < n; j++) dt_model_free(&s[j]);
    dt_model_free(&w);
}

/* Interleaved stages (model.h pp_v): pp processes each holding v chunks of n layers, virtual
 * stage j = c pp + r being chunk c of process r; each (micro-batch, virtual stage) with its own
 * activations. Micro-batch by micro-batch through the virtual stages and back. */
static void check_interleaved(int pp, int v, int n, dt_dtype compute, dt_recompute rc) {
    const int L = pp * v * n;
    dt_alloc aw, as[4];
    dt_model w, s[4];
    g_v = 0, g_stride = 0, g_every = 1;
    make(&w, &aw, L, 0, 0, compute, rc);
    g_v = v, g_stride = pp * n;
    for (int r = 0; r < pp; r++) make(&s[r], &as[r], L, r * n, (r + 1) * n, compute, rc);
    g_v = 0, g_stride = 0, g_every = 2;
    size_t held = 0;
    for (int r = 0; r < pp; r++) {
        assert_int_equal(s[r].ps.n_layer, v * n);
        held += compare_store(&s[r], &w, 0, 0);
    }
    assert_int_equal((int)held, (int)w.ps.n_params);
    float lw[MB], ls[MB];
    run_whole(&w, lw);
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    const int V = pp * v;
    float *sets[16][MB], *own[4];
    for (int r = 0; r < pp; r++) own[r] = s[r].acts;
    for (int j = 0; j < V; j++)
        for (int k = 0; k < MB; k++) sets[j][k] = tu_malloc(s[j % pp].n_acts * sizeof(float));
    for (int k = 0; k < MB; k++) {
        int32_t in[B * 64], tg[B * 64];
        batch(k, in, tg);
        const float *x = NULL;
        for (int j = 0; j < V; j++) {
            dt_model *m = &s[j % pp];
            dt_model_set_chunk(m, j / pp);
            dt_model_use_acts(m, sets[j][k]);
            const size_t nf = dt_model_stage_floats(m);
            if (j > 0) memcpy(dt_model_stage_buf(m, DT_STAGE_IN), x, nf * sizeof(float));
            float l = -1.0f;
            assert_int_equal(dt_model_forward(&ctx, m, in, tg, &l), DT_OK);
            if (j == V - 1) ls[k] = l;
            x = dt_model_stage_buf(m, DT_STAGE_OUT);
        }
        const float *dx = NULL;
        for (int j = V - 1; j >= 0; j--) {
            dt_model *m = &s[j % pp];
            dt_model_set_chunk(m, j / pp);
            dt_model_use_acts(m, sets[j][k]);
            const size_t nf = dt_model_stage_floats(m);
            if (j < V - 1) memcpy(dt_model_stage_buf(m, DT_STAGE_DOUT), dx, nf * sizeof(float));
            m->has_targets = 1;
            dt_model_backward(m, 0.5f);
            dx = dt_model_stage_buf(m, DT_STAGE_DIN);
        }
    }
    for (int k = 0; k < MB; k++)
        if (memcmp(&lw[k], &ls[k], sizeof(float))) fail_msg("micro-batch %d: loss %.9g vs the whole model's %.9g", k, ls[k], lw[k]);
    size_t g = 0;
    for (int r = 0; r < pp; r++) g += compare_store(&s[r], &w, 1, 0);
    printf("    %s interleaved pp %d x v %d chunks of %d layer(s) (%s, %s): losses and %zu gradient elements bitwise\n",
           g_preset, pp, v, n, dt_dtype_name(compute), dt_recompute_name(rc), g);
    for (int r = 0; r < pp; r++) {
        dt_model_set_chunk(&s[r], 0);
        dt_model_use_acts(&s[r], own[r]);
    }
    for (int j = 0; j < V; j++)
        for (int k = 0; k < MB; k++) free(sets[j][k]);
    for (int r = 0; r < pp; r++) dt_model_free(&s[r]);
    dt_model_free(&w);
}

static void test_stages_bitwise(void **state) {
    g_preset = *state;
    T = strcmp(g_preset, "vit-tiny") ? 32 : 64;
    static const int two[] = {0, 1, 3}, two_b[] = {0, 2, 3}, three[] = {0, 1, 2, 3};
    check_cut(two, 2, DT_F32, DT_RECOMPUTE_NONE);
    check_cut(two_b, 2, DT_F32, DT_RECOMPUTE_NONE);
    check_cut(three, 3, DT_F32, DT_RECOMPUTE_NONE);
    check_cut(two, 2, DT_BF16, DT_RECOMPUTE_NONE);
    check_cut(three, 3, DT_F32, DT_RECOMPUTE_FULL);
    check_cut(two_b, 2, DT_BF16, DT_RECOMPUTE_SELECTIVE);
    check_interleaved(2, 2, 1, DT_F32, DT_RECOMPUTE_NONE);
    check_interleaved(2, 3, 1, DT_F32, DT_RECOMPUTE_NONE);
    check_interleaved(2, 2, 2, DT_BF16, DT_RECOMPUTE_FULL);
    check_interleaved(3, 2, 1, DT_F32, DT_RECOMPUTE_SELECTIVE);
}

/* ---- zb-h1 (model.h wdefer; ARCHITECTURE decisions 79, 81): the backward as B (input
 * gradients, the matmuls' douts placed by dt_model_defer_plan into activations made dead)
 * and W (the deferred weight GEMMs), in zb-h1's order B0 B1 W0 B2 W1 W2, against the plain
 * backward of the same model: the same losses, gradients and input gradient, bitwise. */

/* A stage's input and output gradient when it has neighbours (the same for both models). */
static void fill_stage(dt_model *m, dt_stage_buf which, int k) {
    float *x = dt_model_stage_buf(m, which);
    const size_t n = dt_model_stage_floats(m);
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)((i * 7 + 3 * (size_t)k) % 23) - 11) * (which == DT_STAGE_IN ? 0.05f : 1e-3f);
}

/* Whether [a, a + na) and [b, b + nb) (bytes) overlap. */
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    const char *x = a, *y = b;
    return x < y + nb && y < x + na;
}

/* Runs the micro-batches through m (zb: B and W apart, placed as `place`), leaving the losses
 * and each micro-batch's input gradient (a stage that is not the first); returns the douts
 * found over another or over a deferred GEMM's input, after each B. */
static int run_zb(dt_model *m, int zb, const dt_wdefer_place *place, int items, size_t fb, float *loss,
                   float *din[MB]) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    const int first = dt_stage_first(&m->opts), last = dt_stage_last(&m->cfg, &m->opts);
    const size_t nf = dt_model_stage_floats(m);
    float *slab[MB];
    dt_wdefer d[MB];
    slab[0] = m->acts;
    for (int k = 0; k < MB; k++) {
        if (k > 0) slab[k] = tu_malloc(m->n_acts * sizeof(float));
        const int gemms = dt_model_defer_gemms(m, items);
        d[k] = (dt_wdefer){fb ? tu_malloc(fb * sizeof(float)) : NULL, place, tu_malloc((size_t)gemms * sizeof(dt_wdefer_item)),
                           0, gemms, 0, items, NULL, NULL};
    }
    int32_t in[MB][B * 64], tg[MB][B * 64];
    int bad = 0;
    for (int k = 0; k < MB; k++) {
        batch(k, in[k], tg[k]);
        dt_model_use_acts(m, slab[k]);
        if (!first) fill_stage(m, DT_STAGE_IN, k);
        loss[k] = -1.0f;
        assert_int_equal(dt_model_forward(&ctx, m, in[k], tg[k], &loss[k]), DT_OK);
    }
    static const int order[] = {'B', 0, 'B', 1, 'W', 0, 'B', 2, 'W', 1, 'W', 2}; /* zb-h1's, pp 2 stage 0 */
    for (int i = 0; i < 2 * 2 * MB; i += 2) {
        const int k = order[i + 1];
        dt_model_use_acts(m, slab[k]);
        if (order[i] == 'W') {
            if (zb) dt_model_weight_pass(m, &d[k]);
            continue;
        }
        m->has_targets = 1;
        if (!last) fill_stage(m, DT_STAGE_DOUT, k);
        m->wdefer = zb ? &d[k] : NULL;
        dt_model_backward(m, 0.5f);
        m->wdefer = NULL;
        if (!first) memcpy(din[k], dt_model_stage_buf(m, DT_STAGE_DIN), nf * sizeof(float));
        if (!zb) continue;
        assert_int_equal(d[k].nd, items); /* every place of the plan taken, in its order */
        for (int a = 0; a < d[k].n; a++) { /* no dout over another, or over what W reads */
            const dt_wdefer_item *x = &d[k].items[a];
            /* a dout's bytes (its columns of ld-wide rows: a fused projection's tensors share rows) */
            const size_t xn = ((size_t)(x->N - 1) * x->ld + x->OC) * 4;
            for (int b = 0; b < d[k].n; b++) {
                const dt_wdefer_item *y = &d[k].items[b];
                const size_t xb = (size_t)y->N * y->C * (y->xh ? 2 : 4), yn = ((size_t)(y->N - 1) * y->ld + y->OC) * 4;
                /* a gathered input (sequence parallelism) is a working buffer, gathered again at W */
                if (!y->gsrc) bad += overlaps(x->dout, xn, y->xh ? (const void *)y->xh : y->x, xb);
                else bad += overlaps(x->dout, xn, y->gsrc, xb); /* the rows gathered (blocks mode: all) */
                bad += x->di != y->di && overlaps(x->dout, xn, y->dout, yn);
            }
        }
    }
    dt_model_use_acts(m, slab[0]);
    for (int k = 0; k < MB; k++) {
        if (k > 0) free(slab[k]);
        free(d[k].buf), free(d[k].items);
    }
    return bad;
}

/* Layers [l0, l1) of a model of `layers` (0, 0: the whole model). */
static void check_zb(int layers, int l0, int l1, dt_dtype compute, dt_recompute rc) {
    dt_alloc aw, az;
    dt_model w, z;
    make(&w, &aw, layers, l0, l1, compute, rc);
    make(&z, &az, layers, l0, l1, compute, rc);
    int items = 0;
    const size_t fb = dt_model_defer_plan(&z, NULL, &items);
    dt_wdefer_place *place = tu_malloc((size_t)(items + 1) * sizeof *place);
    int again = -1;
    assert_int_equal((int)dt_model_defer_plan(&z, place, &again), (int)fb);
    assert_int_equal(again, items);
    /* the stated bound (decision 81): nothing beside the activations but vit's head douts */
    const int last = dt_stage_last(&z.cfg, &z.opts), vit = !strcmp(g_preset, "vit-tiny");
    const size_t bound = vit && last ? ((size_t)B * z.cfg.n_classes + 15) / 16 * 16 : 0;
    /* experts (decision 84): blocks of B T k rows that the layer's dead spans do not all take */
    if (!z.cfg.n_experts && fb != bound) fail_msg("%s: the douts' fallback is %zu floats, not %zu", g_preset, fb, bound);
    const size_t nf = dt_model_stage_floats(&z);
    float lw[MB], lz[MB], *dw[MB], *dz[MB];
    for (int k = 0; k < MB; k++) dw[k] = tu_malloc(nf * sizeof(float)), dz[k] = tu_malloc(nf * sizeof(float));
    run_zb(&w, 0, NULL, 0, 0, lw, dw);
    assert_int_equal(run_zb(&z, 1, place, items, fb, lz, dz), 0);
    const int first = dt_stage_first(&z.opts);
    for (int k = 0; k < MB; k++) {
        assert_true(isfinite(lw[k]));
        if (memcmp(&lw[k], &lz[k], sizeof(float))) fail_msg("micro-batch %d: loss %.9g vs %.9g", k, lz[k], lw[k]);
        if (!first && memcmp(dw[k], dz[k], nf * sizeof(float))) fail_msg("micro-batch %d: the input gradient differs", k);
    }
    assert_int_equal((int)w.ps.n_params, (int)z.ps.n_params);
    double sq = 0;
    for (size_t i = 0; i < w.ps.n_params; i++) {
        assert_true(isfinite(z.ps.grads[i]));
        sq += (double)w.ps.grads[i] * w.ps.grads[i];
    }
    assert_true(sq > 0);
    if (memcmp(w.ps.grads, z.ps.grads, w.ps.n_params * sizeof(float))) fail_msg("%s: B + W's gradients differ", g_preset);
    int placed = 0;
    for (int i = 0; i < items; i++) placed += place[i].layer >= 0;
    printf("    %s layers [%d, %d) of %d (%s, %s every %d, tp %d%s): B0 B1 W0 B2 W1 W2 == the plain backward, bitwise; "
           "%d of %d douts in dead activations, fallback %zu floats\n", g_preset, l0, l1 ? l1 : layers, layers,
           dt_dtype_name(compute), dt_recompute_name(rc), g_every, g_tp ? g_tp : 1, g_sp ? " sp" : "", placed, items, fb);
    /* a wrong placement: the top layer's first dout over its q|k|v, which the attention's
     * backward still reads - the comparison fails (when the top layer defers: it does not
     * recompute its forward) */
    const int L = dt_stage_layers(&z.cfg, &z.opts) - 1;
    size_t dn[DT_DEFER_MAX];
    const int top = z.fam->defer_douts(&z, L + 1, dn); /* past the head's (a fallback's, experts': too) */
    if (dt_model_recomputes(&z.opts, L)) {
        for (int k = 0; k < MB; k++) free(dw[k]), free(dz[k]);
        free(place);
        dt_model_free(&w);
        dt_model_free(&z);
        return;
    }
    dt_act_span sp[DT_DEFER_MAX];
    const int ns = z.fam->defer_spans(&z, L, sp);
    const int last_dout = z.fam->defer_douts(&z, L, dn) - 1; /* q|k|v's: it frees q|k|v */
    int live = -1;
    for (int j = 0; j < ns; j++)
        if (sp[j].from == last_dout && sp[j].n >= place[top].n && live < 0) live = j; /* q|k|v: its dout's place too */
    assert_true(live >= 0);
    place[top].layer = L, place[top].span = live, place[top].off = 0;
    dt_params_zero_grad(&z.ps);
    const int bad = run_zb(&z, 1, place, items, fb, lz, dz);
    size_t diff = 0;
    for (size_t i = 0; i < w.ps.n_params; i++) diff += w.ps.grads[i] != z.ps.grads[i];
    printf("    the top layer's first dout placed over its live q|k|v: %zu gradient elements differ, %d overlaps found\n",
           diff, bad);
    /* experts: the plan puts q|k|v's dout in a larger span freed before, so no other dout meets
     * the moved one - the attention's read of q|k|v (no GEMM input) shows in the gradients */
    assert_true(diff > 0 && (bad > 0 || z.cfg.n_experts));
    for (int k = 0; k < MB; k++) free(dw[k]), free(dz[k]);
    free(place);
    dt_model_free(&w);
    dt_model_free(&z);
}

static void test_zb_placement(void **state) {
    g_preset = *state;
    T = strcmp(g_preset, "vit-tiny") ? 32 : 64;
    check_zb(3, 0, 0, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(3, 0, 0, DT_BF16, DT_RECOMPUTE_NONE);
    check_zb(3, 0, 2, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(3, 1, 3, DT_BF16, DT_RECOMPUTE_NONE);
    /* activation checkpointing: the recomputed layers' weight gradients in B (every 2: layers
     * 0 and 2 recompute; every 1: all, W keeps only vit's head and patch embedding) */
    check_zb(4, 0, 0, DT_F32, DT_RECOMPUTE_FULL);
    check_zb(4, 0, 2, DT_BF16, DT_RECOMPUTE_SELECTIVE);
    check_zb(4, 2, 4, DT_F32, DT_RECOMPUTE_SELECTIVE);
    g_every = 1;
    check_zb(3, 0, 0, DT_BF16, DT_RECOMPUTE_FULL);
    g_every = 2;
}

/* Tensor parallelism (decision 84), its blocks mode: one process holds both shards, each
 * shard's GEMMs deferred alone (a row-parallel GEMM's one dout for both, a fused projection's
 * columns at their stride); with sequence parallelism the column-parallel inputs are gathered
 * again at W. */
static void test_zb_tp(void **state) {
    g_preset = *state;
    T = strcmp(g_preset, "vit-tiny") ? 32 : 64;
    g_tp = 2;
    check_zb(3, 0, 0, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(3, 1, 3, DT_BF16, DT_RECOMPUTE_NONE);
    check_zb(4, 0, 2, DT_F32, DT_RECOMPUTE_FULL);
    g_sp = 1;
    check_zb(3, 0, 2, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(3, 1, 3, DT_BF16, DT_RECOMPUTE_NONE);
    g_tp = g_sp = 0;
}

/* A mixture of experts (decision 84; fp32): each expert's douts and gathered input in blocks of
 * the plan, its GEMMs and the router's deferred. */
static void test_zb_moe(void **state) {
    (void)state;
    g_preset = "mixtral-tiny";
    T = 32;
    check_zb(3, 0, 0, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(3, 1, 3, DT_F32, DT_RECOMPUTE_NONE);
    check_zb(4, 0, 2, DT_F32, DT_RECOMPUTE_FULL);
}

static void expect_refused(const char *preset, int untied, int l0, int l1, const char *key, const char *what) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    dt_model_config c;
    assert_int_equal(dt_model_preset(&ctx, preset, &c), DT_OK);
    c.n_layer = 3;
    c.untied = untied;
    dt_model_opts o = {DT_RECOMPUTE_NONE, 1, DT_F32, 0, 0, {0}, 0, 0, 0, 0, l0, l1, 0, 0, 0, 0, 0, 0, 0, 0};
    dt_alloc al;
    dt_alloc_init(&al);
    dt_model m;
    dt_status st = dt_model_init_opts(&ctx, &m, &c, &o, &al, B, 32, DT_SLAB_PARAMS | DT_SLAB_GRADS);
    assert_int_not_equal(st, DT_OK);
    printf("    refused: %s\n", ctx.err);
    assert_non_null(strstr(ctx.err, key));
    assert_non_null(strstr(ctx.err, what));
    assert_int_equal((int)al.total_cur, 0);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused("llama-tiny", 1, 2, 5, "parallel.pp", "not inside");
    expect_refused("llama-tiny", 1, 2, 2, "parallel.pp", "not inside");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_stages_bitwise, (void *)"llama-tiny"),
        cmocka_unit_test_prestate(test_stages_bitwise, (void *)"vit-tiny"),
        cmocka_unit_test_prestate(test_zb_placement, (void *)"llama-tiny"),
        cmocka_unit_test_prestate(test_zb_placement, (void *)"gpt2-tiny"),
        cmocka_unit_test_prestate(test_zb_placement, (void *)"vit-tiny"),
        cmocka_unit_test_prestate(test_zb_tp, (void *)"llama-tiny"),
        cmocka_unit_test_prestate(test_zb_tp, (void *)"gpt2-tiny"),
        cmocka_unit_test_prestate(test_zb_tp, (void *)"vit-tiny"),
        cmocka_unit_test(test_zb_moe),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
