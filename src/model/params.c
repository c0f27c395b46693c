/* The parameter store: layout of a family's tensor table into units, names, init, segments. */
#include "model/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

const char *dt_elem_type_name(dt_elem_type t) {
    switch (t) {
    case DT_ELEM_F32: return "f32";
    case DT_ELEM_BF16: return "bf16";
    case DT_ELEM_F16: return "f16";
    }
    return "?";
}

const char *dt_split_name(const dt_tensor_info *t) {
    if (t->split == DT_SPLIT_IN) return "row";
    if (t->split == DT_SPLIT_OUT) return t->vocab ? "vocab" : "column";
    return "replicated";
}

void dt_params_table_tp(dt_tensor_info *table, int n, int k, int nb, int first) {
    if (k <= 1) return;
    for (int i = 0; i < n; i++) {
        dt_tensor_info *t = &table[i];
        t->shard_rows = t->rows;
        if (!t->split) continue;
        t->g_rows = t->rows, t->g_cols = t->cols;
        t->g_file_rows = t->file_rows ? t->file_rows : t->rows;
        t->tp_k = k, t->tp_nb = nb, t->tp_first = first;
        if (t->split == DT_SPLIT_IN) {
            t->shard_rows = t->g_rows;
            t->rows = (size_t)nb * t->g_rows;
            t->cols = t->g_cols / (size_t)k;
            t->file_rows = t->rows;
        } else if (t->g_rows == 1) { /* a column-parallel bias: its elements */
            t->shard_rows = 1;
            t->cols = (size_t)nb * (t->g_cols / (size_t)k);
            t->file_rows = 1;
        } else {
            size_t rs = t->g_rows / (size_t)k, lo = (size_t)first * rs;
            t->shard_rows = rs;
            t->rows = (size_t)nb * rs;
            /* the real rows (vocabulary padding is the canonical tensor's tail) */
            t->file_rows = t->g_file_rows <= lo ? 0 : t->g_file_rows - lo < t->rows ? t->g_file_rows - lo : t->rows;
        }
    }
}

size_t dt_params_global_index(const dt_tensor_info *t, size_t i, int *shard) {
    *shard = 0;
    if (t->tp_k <= 1 || !t->split) return i;
    const size_t k = (size_t)t->tp_k, S = t->sections > 1 ? (size_t)t->sections : 1;
    if (t->split == DT_SPLIT_IN) {
        size_t cs = t->cols, lr = i / cs, c = i % cs, j = lr / t->g_rows, r = lr % t->g_rows;
        size_t s = (size_t)t->tp_first + j;
        *shard = (int)j;
        return r * t->g_cols + s * cs + c;
    }
    /* OUT: the split index x (a row, or a vector's element) and what follows it */
    size_t inner = t->g_rows == 1 ? 1 : t->g_cols, x = i / inner, rest = i % inner;
    size_t dim = t->g_rows == 1 ? t->g_cols : t->g_rows, per = dim / k, sec = per / S;
    size_t j = x / per, r = x % per, q = r / sec, w = r % sec, s = (size_t)t->tp_first + j;
    *shard = (int)j;
    return (q * (dim / S) + s * sec + w) * inner + rest;
}

size_t dt_params_global_run(const dt_tensor_info *t, size_t i, size_t *gi, int *shard) {
    *gi = dt_params_global_index(t, i, shard);
    if (t->tp_k <= 1 || !t->split) return t->rows * t->cols - i;
    const size_t k = (size_t)t->tp_k, S = t->sections > 1 ? (size_t)t->sections : 1;
    if (t->split == DT_SPLIT_IN) return t->cols - i % t->cols; /* to the end of the shard's row */
    size_t inner = t->g_rows == 1 ? 1 : t->g_cols, x = i / inner, rest = i % inner;
    size_t dim = t->g_rows == 1 ? t->g_cols : t->g_rows, per = dim / k, sec = per / S;
    size_t w = (x % per) % sec;
    return (sec - w) * inner - rest; /* to the end of the section's block */
}

static int cmp_run(const void *a, const void *b) {
    const dt_canon_run *x = a, *y = b;
    return x->local < y->local ? -1 : x->local > y->local;
}

dt_status dt_params_canon_runs(dt_ctx *ctx, const dt_params *ps, const dt_params *canon, dt_canon_run **out,
                               size_t *n) {
    size_t cap = 1024, cnt = 0;
    dt_canon_run *r = malloc(cap * sizeof *r);
    if (!r) return dt_fail(ctx, DT_ERR_NOMEM, "parameter runs: out of memory");
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id], *ct = &canon->tensors[id];
        const size_t len = t->rows * t->cols, real = ct->file_rows * ct->cols; /* canonical real elements */
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            const size_t base = dt_params_flat(ps, id, l), cbase = dt_params_flat(canon, id, dt_params_layer(ps, l));
            for (size_t i = 0; i < len;) {
                size_t gi;
                int sh;
                size_t run = dt_params_global_run(t, i, &gi, &sh);
                size_t m = gi >= real ? 0 : gi + run <= real ? run : real - gi;
                const int rep = !(t->tp_k > 1 && t->split);
                if (m && cnt && r[cnt - 1].local + r[cnt - 1].n == base + i && r[cnt - 1].canon + r[cnt - 1].n == cbase + gi &&
                    r[cnt - 1].replicated == rep) {
                    r[cnt - 1].n += m;
                } else if (m) {
                    if (cnt == cap) {
                        dt_canon_run *g = realloc(r, 2 * cap * sizeof *r);
                        if (!g) {
                            free(r);
                            return dt_fail(ctx, DT_ERR_NOMEM, "parameter runs: out of memory");
                        }
                        r = g, cap *= 2;
                    }
                    r[cnt++] = (dt_canon_run){base + i, cbase + gi, m, rep};
                }
                i += run;
            }
        }
    }
    qsort(r, cnt, sizeof *r, cmp_run);
    *out = r;
    *n = cnt;
    return DT_OK;
}

/* Three passes place PRE, then one layer block, then POST, each in table order. */
static void layout(dt_params *ps) {
    size_t off = 0;
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        if (g == DT_PG_LAYER) ps->layers_offset = off;
        for (int i = 0; i < ps->n_tensors; i++) {
            dt_tensor_info *t = &ps->tensors[i];
            if ((int)t->group != g) continue;
            t->offset = off;
            t->stride = 0;
            off += t->rows * t->cols;
        }
        if (g == DT_PG_LAYER) {
            ps->layer_floats = off - ps->layers_offset;
            off = ps->layers_offset + ps->layer_floats * (size_t)ps->n_layer;
        }
    }
    for (int i = 0; i < ps->n_tensors; i++)
        if (ps->tensors[i].group == DT_PG_LAYER) ps->tensors[i].stride = ps->layer_floats;
    ps->n_params = off;
}

/* A LAYER tensor that starts a unit: the layer's first tensor, and those the family marks. */
/* An expert tensor the store does not hold (another expert-parallel rank's: params.h `expert`)
 * starts no unit and belongs to none. Other empty layer tensors keep their (empty) units: a
 * LoRA base whose matmuls live elsewhere relies on the full layout's unit numbering. */
static int absent_expert(const dt_tensor_info *t) { return t->expert && dt_tensor_absent(t); }
static int table_starts_unit(const dt_tensor_info *table, int i) {
    if (absent_expert(&table[i])) return 0;
    for (int k = 0; k < i; k++)
        if (table[k].group == DT_PG_LAYER && !absent_expert(&table[k])) return table[i].unit_start;
    return 1;
}
static int starts_unit(const dt_params *ps, int i) { return table_starts_unit(ps->tensors, i); }

size_t dt_params_table_unit_max(const dt_tensor_info *table, int n) {
    size_t run = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        if (table[i].group != DT_PG_LAYER) continue;
        if (table_starts_unit(table, i)) run = 0;
        run += dt_tensor_shard_len(&table[i]); /* a TP rank's own (the blocks test mode: alike) */
        if (run > mx) mx = run;
    }
    return mx;
}

/* Units per layer and the largest one's elements (the layer tensors in table order, cut at
 * each tensor that starts a unit). */
static void count_layer_units(dt_params *ps) {
    ps->layer_units = dt_params_table_layer_units(ps->tensors, ps->n_tensors); /* none: 1 empty */
    ps->layer_unit_max = dt_params_table_unit_max(ps->tensors, ps->n_tensors);
}

int dt_params_table_layer_units(const dt_tensor_info *table, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (table[i].group == DT_PG_LAYER && !absent_expert(&table[i])) k += k == 0 || table[i].unit_start;
    return k > 0 ? k : 1;
}

/* Rows per chunk of a vocabulary tensor: the fewest chunks of at most the largest layer unit,
 * so the embeddings never set the size of a ZeRO window. */
static size_t chunk_rows(const dt_params *ps, const dt_tensor_info *t) {
    size_t cap = ps->chunk_cap ? ps->chunk_cap : ps->layer_unit_max > 0 ? ps->layer_unit_max : 1,
           len = dt_tensor_shard_len(t), rows = t->shard_rows ? t->shard_rows : t->rows;
    /* under tensor parallelism every shard is cut alike (one shard's rows at a time) */
    if (!t->vocab || t->group == DT_PG_LAYER || len <= cap) return rows;
    size_t k = (len + cap - 1) / cap;
    return (rows + k - 1) / k;
}

/* Cuts the index space into units (see params.h), fills the tensors' unit and chunk_rows,
 * and returns the unit count; with `lo`, also writes unit starts into lo[] and lengths into
 * lo[n_units + u]. */
static int make_units(dt_params *ps, size_t *lo) {
    int n = 0, open = 0; /* open: the last unit is a run of non-vocabulary tensors */
#define START(at) (lo ? (void)(lo[n] = (at)) : (void)0, n++)
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        if (g == DT_PG_LAYER) {
            ps->n_pre_units = n;
            for (int l = 0; l < ps->n_layer; l++) {
                size_t base = (size_t)l * ps->layer_floats;
                int k = 0;
                for (int i = 0; i < ps->n_tensors; i++) {
                    dt_tensor_info *t = &ps->tensors[i];
                    if (t->group != DT_PG_LAYER) continue;
                    if (starts_unit(ps, i)) START(t->offset + base), k++;
                    t->unit = absent_expert(t) ? -1 : ps->n_pre_units + k - 1; /* layer 0's unit */
                    t->chunk_rows = t->rows;
                }
                if (k == 0) START(ps->layers_offset + base);
            }
            open = 0;
            continue;
        }
        for (int i = 0; i < ps->n_tensors; i++) {
            dt_tensor_info *t = &ps->tensors[i];
            if ((int)t->group != g) continue;
            if (dt_tensor_absent(t)) { /* not held by this pipeline stage: no unit */
                t->unit = -1;
                t->chunk_rows = 1;
                continue;
            }
            t->chunk_rows = chunk_rows(ps, t);
            if (t->vocab) {
                t->unit = n;
                for (int c = 0, K = dt_params_chunks(ps, i); c < K; c++) {
                    int uu;
                    size_t r0, rows;
                    dt_params_chunk(ps, i, c, &uu, &r0, &rows);
                    START(t->offset + r0 * t->cols);
                }
                open = 0;
            } else {
                if (!open) START(t->offset);
                t->unit = n - 1;
                open = 1;
            }
        }
    }
#undef START
    if (lo) {
        size_t *len = lo + n;
        for (int u = 0; u < n; u++) len[u] = (u + 1 < n ? lo[u + 1] : ps->n_params) - lo[u];
    }
    return n;
}

int dt_params_matmul_runs(const dt_params *ps, int u, size_t *off, size_t *len, int cap) {
    int n = 0;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        if (!t->matmul || dt_tensor_absent(t)) continue;
        size_t o = 0, l;
        if (t->vocab) { /* its chunks are whole units */
            if (u < t->unit || u >= t->unit + dt_params_chunks(ps, id)) continue;
            l = ps->unit_len[u];
        } else {
            int layer = 0;
            if (t->group == DT_PG_LAYER) { /* units of layer l: t->unit + l x layer_units */
                if (u < t->unit || (u - t->unit) % ps->layer_units) continue;
                layer = (u - t->unit) / ps->layer_units;
            }
            if (layer >= dt_params_copies(ps, id)) continue;
            if (dt_params_unit_of(ps, id, layer, &o) != u) continue;
            l = t->rows * t->cols;
        }
        DT_ASSERT(n < cap);
        int i = n++; /* insertion in offset order (a unit's tensors are ascending already) */
        for (; i > 0 && off[i - 1] > o; i--) off[i] = off[i - 1], len[i] = len[i - 1];
        off[i] = o;
        len[i] = l;
    }
    int m = 0; /* merge adjacent runs */
    for (int i = 0; i < n; i++) {
        if (m > 0 && off[m - 1] + len[m - 1] == off[i]) {
            len[m - 1] += len[i];
            continue;
        }
        off[m] = off[i];
        len[m++] = len[i];
    }
    return m;
}

/* Shards stored (1 unless tensor parallelism keeps several), rows of each, chunks of each. */
static size_t shards_of(const dt_tensor_info *t) { return t->tp_k > 1 && t->split ? (size_t)t->tp_nb : 1; }
static size_t rows_of_shard(const dt_tensor_info *t) { return t->rows / shards_of(t); }
static size_t chunks_per_shard(const dt_tensor_info *t) {
    return (rows_of_shard(t) + t->chunk_rows - 1) / t->chunk_rows;
}

int dt_params_chunks(const dt_params *ps, int id) {
    const dt_tensor_info *t = &ps->tensors[id];
    if (dt_tensor_absent(t)) return 0;
    return (int)(shards_of(t) * chunks_per_shard(t));
}

void dt_params_chunk(const dt_params *ps, int id, int c, int *unit, size_t *row0, size_t *rows) {
    const dt_tensor_info *t = &ps->tensors[id];
    size_t kc = chunks_per_shard(t), rs = rows_of_shard(t), j = (size_t)c / kc, cc = (size_t)c % kc;
    *unit = t->unit + c;
    *row0 = j * rs + cc * t->chunk_rows;
    *rows = rs - cc * t->chunk_rows < t->chunk_rows ? rs - cc * t->chunk_rows : t->chunk_rows;
}


static size_t unit_bytes(const dt_params *ps) {
    return (size_t)ps->n_units * (2 * sizeof(size_t) + 2 * sizeof(float *) + sizeof(uint16_t *));
}

dt_status dt_params_init(dt_ctx *ctx, dt_params *ps, const dt_tensor_info *table, int n,
                         int n_layer, dt_alloc *alloc, int slabs) {
    return dt_params_init_cap(ctx, ps, table, n, n_layer, alloc, slabs, 0);
}

dt_status dt_params_init_cap(dt_ctx *ctx, dt_params *ps, const dt_tensor_info *table, int n,
                             int n_layer, dt_alloc *alloc, int slabs, size_t chunk_cap) {
    memset(ps, 0, sizeof *ps);
    ps->chunk_cap = chunk_cap;
    ps->alloc = alloc;
    ps->n_layer = n_layer;
    ps->n_tensors = n;
    dt_status st = DT_OK;
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, (size_t)n * sizeof *ps->tensors,
                               (void **)&ps->tensors));
    memcpy(ps->tensors, table, (size_t)n * sizeof *table);
    for (int i = 0; i < n; i++)
        if (!ps->tensors[i].file_rows) ps->tensors[i].file_rows = ps->tensors[i].rows;
    layout(ps);
    count_layer_units(ps);
    ps->n_units = make_units(ps, NULL);
    DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_OTHER, unit_bytes(ps), (void **)&ps->unit_lo));
    ps->unit_len = ps->unit_lo + ps->n_units;
    ps->unit_params = (float **)(ps->unit_len + ps->n_units);
    ps->unit_grads = ps->unit_params + ps->n_units;
    ps->unit_params_lp = (uint16_t **)(ps->unit_grads + ps->n_units);
    for (int u = 0; u < ps->n_units; u++) ps->unit_params_lp[u] = NULL;
    make_units(ps, ps->unit_lo);
    if (slabs & DT_SLAB_PARAMS)
        DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_PARAMS, ps->n_params * sizeof(float),
                                   (void **)&ps->params));
    if (slabs & DT_SLAB_GRADS)
        DT_CHECK_GOTO(dt_alloc_get(ctx, alloc, DT_MEM_GRADS, ps->n_params * sizeof(float),
                                   (void **)&ps->grads));
    dt_params_point_units(ps);
    return DT_OK;
fail:
    dt_params_free(ps);
    return st;
}

void dt_params_free(dt_params *ps) {
    if (!ps->alloc) return;
    if (ps->unit_lo) dt_alloc_put(ps->alloc, DT_MEM_OTHER, ps->unit_lo, unit_bytes(ps));
    dt_alloc_put(ps->alloc, DT_MEM_PARAMS, ps->params, ps->n_params * sizeof(float));
    dt_alloc_put(ps->alloc, DT_MEM_GRADS, ps->grads, ps->n_params * sizeof(float));
    dt_alloc_put(ps->alloc, DT_MEM_OTHER, ps->tensors, (size_t)ps->n_tensors * sizeof *ps->tensors);
    memset(ps, 0, sizeof *ps);
}

void dt_params_point_units(dt_params *ps) {
    for (int u = 0; u < ps->n_units; u++) {
        ps->unit_params[u] = ps->params ? ps->params + ps->unit_lo[u] : NULL;
        ps->unit_grads[u] = ps->grads ? ps->grads + ps->unit_lo[u] : NULL;
    }
}

size_t dt_params_flat(const dt_params *ps, int id, int layer) {
    const dt_tensor_info *t = &ps->tensors[id];
    return t->offset + (t->group == DT_PG_LAYER ? (size_t)layer * t->stride : 0);
}

int dt_params_copies(const dt_params *ps, int id) {
    return ps->tensors[id].group == DT_PG_LAYER ? ps->n_layer : 1;
}

float *dt_params_tensor(const dt_params *ps, float *base, int id, int layer) {
    return base + dt_params_flat(ps, id, layer);
}

int dt_params_unit_of(const dt_params *ps, int id, int layer, size_t *offset_in_unit) {
    const dt_tensor_info *t = &ps->tensors[id];
    if (t->unit < 0) { /* absent from a pipeline stage's store */
        *offset_in_unit = 0;
        return -1;
    }
    int u = t->unit + (t->group == DT_PG_LAYER ? layer * ps->layer_units : 0);
    *offset_in_unit = dt_params_flat(ps, id, layer) - ps->unit_lo[u];
    return u;
}

float *dt_params_unit_tensor(const dt_params *ps, float *const *units, int id, int layer) {
    size_t off;
    int u = dt_params_unit_of(ps, id, layer, &off);
    return u < 0 ? NULL : units[u] + off;
}

static void format_name(const char *fmt, const dt_tensor_info *t, int layer, char *buf, size_t n) {
    if (!fmt)
        snprintf(buf, n, "%s", "");
    else if (t->group == DT_PG_LAYER)
        snprintf(buf, n, fmt, layer);
    else
        snprintf(buf, n, "%s", fmt);
}

void dt_params_name(const dt_params *ps, int id, int layer, char *buf, size_t n) {
    format_name(ps->tensors[id].name, &ps->tensors[id], dt_params_layer(ps, layer), buf, n);
}

void dt_params_ext_name(const dt_params *ps, int id, int layer, char *buf, size_t n) {
    format_name(ps->tensors[id].ext_name, &ps->tensors[id], dt_params_layer(ps, layer), buf, n);
}

dt_status dt_params_check_finite(dt_ctx *ctx, const dt_params *ps, const float *base, const char *path, int ext) {
    for (int id = 0; id < ps->n_tensors; id++)
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            const float *w = dt_params_tensor(ps, (float *)base, id, l);
            long n = (long)(ps->tensors[id].rows * ps->tensors[id].cols);
            long bad = (long)dt_count_nonfinite_f32(w, (size_t)n);
            if (!bad) continue;
            long first = 0;
            while (isfinite(w[first])) first++;
            char name[160], other[160] = "";
            dt_params_name(ps, id, l, name, sizeof name);
            if (ext) {
                dt_params_ext_name(ps, id, l, other, sizeof other);
                if (other[0] && strcmp(other, name)) snprintf(name, sizeof name, "%s", other);
            }
            return dt_fail(ctx, DT_ERR_FORMAT, "%s: tensor %s holds %ld non-finite value%s (the first, %g, at element "
                           "%ld of %ld): the weights are damaged (training or evaluating them only gives NaN)",
                           path, name, bad, bad == 1 ? "" : "s", (double)w[first], first, n);
        }
    return DT_OK;
}

size_t dt_params_file_count(const dt_params *ps) {
    size_t n = 0;
    for (int i = 0; i < ps->n_tensors; i++)
        n += ps->tensors[i].file_rows * ps->tensors[i].cols * (size_t)dt_params_copies(ps, i);
    return n;
}

void dt_params_init_range(const dt_params *ps, uint64_t seed, float *dst, size_t lo, size_t n) {
    size_t hi = lo + n;
    for (int id = 0; id < ps->n_tensors; id++) {
        const dt_tensor_info *t = &ps->tensors[id];
        for (int l = 0; l < dt_params_copies(ps, id); l++) {
            size_t base = dt_params_flat(ps, id, l);
            size_t len = t->rows * t->cols;
            /* Only real rows are drawn; padding rows stay 0 (never read, zero gradient). A
             * tensor-parallel shard draws its elements' canonical indices: the slice of the
             * unsplit initialisation. */
            const int tp = t->tp_k > 1 && t->split;
            size_t drawn = tp ? t->g_file_rows * t->g_cols : t->file_rows * t->cols;
            size_t a = base > lo ? base : lo, z = base + len < hi ? base + len : hi;
            if (a >= z) continue;
            /* a layer tensor's stream is the model's layer (a pipeline stage's: dt_params_layer) */
            uint64_t stream = ((uint64_t)id << 32) | (uint64_t)(t->group == DT_PG_LAYER ? dt_params_layer(ps, l) : l);
            const uint64_t sd = seed ^ ps->seed_salt;
            float *out = dst + (a - lo);
            switch (t->init) {
            case DT_INIT_ONES: dt_fill_f32(out, 1.0f, z - a); break;
            case DT_INIT_ZEROS: dt_fill(out, 0, (z - a) * sizeof(float)); break;
            case DT_INIT_NORMAL:
                if (!tp) {
                    dt_fill_normal(out, z - a, sd, stream, a - base, drawn, t->std);
                    break;
                }
                /* runs of consecutive canonical indices (dt_params_global_run) */
                for (size_t e = a; e < z;) {
                    size_t gi;
                    int sh;
                    size_t run = dt_params_global_run(t, e - base, &gi, &sh);
                    if (run > z - e) run = z - e;
                    dt_fill_normal(dst + (e - lo), run, sd, stream, gi, drawn, t->std);
                    e += run;
                }
                break;
            }
        }
    }
}

dt_status dt_params_segments(dt_ctx *ctx, const dt_params *ps, dt_param_segment **out, int *n) {
    /* Walk the space in memory order: PRE tensors, layer blocks, POST tensors. */
    int cap = ps->n_tensors * (ps->n_layer + 1), cnt = 0;
    dt_param_segment *s = malloc((size_t)cap * sizeof *s);
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate optimizer segments");
    for (int g = DT_PG_PRE; g <= DT_PG_POST; g++) {
        int copies = g == DT_PG_LAYER ? ps->n_layer : 1;
        for (int l = 0; l < copies; l++)
            for (int i = 0; i < ps->n_tensors; i++) {
                const dt_tensor_info *t = &ps->tensors[i];
                if ((int)t->group != g) continue;
                size_t off = dt_params_flat(ps, i, l), len = t->rows * t->cols;
                if (cnt > 0 && s[cnt - 1].decay == t->decay && s[cnt - 1].offset + s[cnt - 1].len == off)
                    s[cnt - 1].len += len; /* merge neighbours of equal decay */
                else
                    s[cnt++] = (dt_param_segment){off, len, t->decay};
            }
    }
    *out = s;
    *n = cnt;
    return DT_OK;
}

void dt_params_zero_grad(dt_params *ps) {
    for (int u = 0; u < ps->n_units; u++) dt_fill(ps->unit_grads[u], 0, ps->unit_len[u] * sizeof(float));
}
