/* LoRA's adapter arithmetic (lora.h): the adapters of one base matmul, forward and backward,
 * whole or, under tensor parallelism, shard by shard (ARCHITECTURE decisions 49, 69). */
#include "model/lora.h"

#include <string.h>

#include "core/rng.h"
#include "model/family_impl.h"
#include "ops/ops.h"

/* Salt of the dropout masks' streams. */
#define LORA_DROP_SALT 0x4c6f524144726f70ULL

/* Blocking of the adapter loops: columns of x widened at a time (mixed precision), ranks and
 * output rows per accumulator block. Each output element is still one sum in ascending order
 * of its index (c, j, n or k), whatever the blocks and threads. */
enum { XB = 64, KB = 16, JB = 8 };

uint64_t dt_lora_drop_key(uint64_t seed, uint64_t seq, int t, int l, int site) {
    uint64_t row = dt_rng_u64(seq, (uint64_t)(uint32_t)t, LORA_DROP_SALT);
    return dt_rng_u64(seed, LORA_DROP_SALT + (uint64_t)l * DT_LORA_MAX_SITES + (uint64_t)site, row);
}

/* Kept when the high 32 bits reach p 2^32: probability 1 - p (to 2^-32). */
static inline uint64_t drop_thresh(float p) { return (uint64_t)((double)p * 4294967296.0); }

static inline int kept(uint64_t key, int c, uint64_t thresh) {
    return (dt_rng_u64(key, (uint64_t)c, 0) >> 32) >= thresh;
}

int dt_lora_drop_keep(uint64_t key, int c, float p) { return kept(key, c, drop_thresh(p)); }

/* The dropout of one site's adapters in this forward or backward (on = 0: none). */
typedef struct drop_ctx {
    int on, T, l, site;
    float inv; /* 1 / (1 - p) */
    uint64_t thresh, seed, seq0;
} drop_ctx;

static drop_ctx drop_of(const dt_model *m, int l, int site) {
    drop_ctx d = {0};
    if (!m->lora_drop_on) return d;
    const float p = m->opts.lora.dropout;
    d = (drop_ctx){1, m->T, l, site, 1.0f / (1.0f - p), drop_thresh(p), m->lora_drop_seed, m->lora_drop_seq0};
    return d;
}

/* Row n's mask key (rows are sequences of T positions). */
static inline uint64_t drop_row(const drop_ctx *d, int n) {
    return d->on ? dt_lora_drop_key(d->seed, d->seq0 + (uint64_t)(n / d->T), n % d->T, d->l, d->site) : 0;
}

/* x[n, c0 .. c0 + len) in fp32: a pointer into xf, or widened from xh into tmp; under
 * dropout drop(x) in tmp (key: drop_row of n; feature c of x is feature coff + c of the
 * layer's input: a row-parallel shard holds a block of its columns). */
static inline const float *xseg(const dt_model *m, const float *xf, const uint16_t *xh, int n, int C, int c0,
                                int len, float *tmp, const drop_ctx *d, uint64_t key, int coff) {
    const float *x = xf + (size_t)n * C + c0;
    if (xh) {
        dt_from_lowp(m->opts.compute, tmp, xh + (size_t)n * C + c0, (size_t)len);
        x = tmp;
    }
    if (!d->on) return x;
    for (int c = 0; c < len; c++) tmp[c] = kept(key, coff + c0 + c, d->thresh) ? x[c] * d->inv : 0.0f;
    return tmp;
}

/* u (N, r) = drop(x) A^T: each element one sum over c ascending. */
static void x_at(const dt_model *m, float *u, const float *xf, const uint16_t *xh, const float *A, int N, int C,
                 int r, const drop_ctx *d, int coff) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float tmp[XB];
        float *un = u + (size_t)n * r;
        const uint64_t key = drop_row(d, n);
        for (int k = 0; k < r; k++) un[k] = 0.0f;
        for (int c0 = 0; c0 < C; c0 += XB) {
            int len = C - c0 < XB ? C - c0 : XB;
            const float *xs = xseg(m, xf, xh, n, C, c0, len, tmp, d, key, coff);
            for (int k = 0; k < r; k++) {
                const float *a = A + (size_t)k * C + c0;
                float acc = un[k];
                for (int c = 0; c < len; c++) acc += xs[c] * a[c];
                un[k] = acc;
            }
        }
    }
}

/* Whether base tensor t is split by tensor parallelism, and how (DT_SPLIT_*). */
static int split_of(const dt_model *m, int t) {
    const dt_tensor_info *ti = &m->base.tensors[t];
    return ti->tp_k > 1 ? ti->split : DT_SPLIT_NONE;
}

size_t dt_lora_shard_rows(const dt_model *m, int id) {
    const dt_tensor_info *t = &m->base.tensors[id];
    const dt_nf4 *q = dt_lora_nf4(m, id, 0);
    if (q && t->group == DT_PG_LAYER) return q->n / t->cols; /* the NF4 tensors have no rows in the slab */
    return split_of(m, id) ? t->shard_rows : t->rows;
}

/* Where site i writes in the output (N, OC) of the matmul over base tensors id, id + 1, ...
 * (adjacent matmul tensors of input width C, one shard of each under tensor parallelism),
 * and what it reads. */
typedef struct site_geo {
    int col, rows;      /* its column block of the output */
    int coff;           /* the layer input's feature index of x's column 0 (dropout masks) */
    const float *A, *B; /* this shard's A (r x C) and B (rows x r) */
    float *dA, *dB;     /* their gradients; NULL: the replicated one, formed as a contribution */
} site_geo;

static int site_geo_of(dt_model *m, int i, int id, int l, int j, int OC, int C, int bwd, site_geo *g) {
    const dt_params *b = &m->base;
    const dt_lora_site *s = &m->sites[i];
    if (s->id < id) return 0;
    /* rows of the call before the site's tensor: the tensors from id up to it (adjacent) */
    size_t col = 0;
    for (int t = id; t < s->id; t++) {
        if (b->tensors[t].group != DT_PG_LAYER || !b->tensors[t].matmul || b->tensors[t].cols != (size_t)C) return 0;
        col += dt_lora_shard_rows(m, t);
    }
    const int sp = split_of(m, s->id), k = b->tensors[s->id].tp_k;
    size_t row0 = s->row0, rows = s->rows; /* a column-parallel shard holds 1/k of every section */
    if (sp == DT_SPLIT_OUT) row0 /= (size_t)k, rows /= (size_t)k;
    col += row0;
    if (col + rows > (size_t)OC) return 0;
    const size_t r = (size_t)m->opts.lora.rank;
    const int ia = m->site_a[i];
    g->col = (int)col, g->rows = (int)rows, g->coff = 0;
    g->A = dt_params_unit_tensor(&m->ps, m->ps.unit_params, ia, l);
    g->B = dt_params_unit_tensor(&m->ps, m->ps.unit_params, ia + 1, l);
    g->dA = bwd ? dt_params_unit_tensor(&m->ps, m->ps.unit_grads, ia, l) : NULL; /* a forward: no gradients */
    g->dB = bwd ? dt_params_unit_tensor(&m->ps, m->ps.unit_grads, ia + 1, l) : NULL;
    if (sp == DT_SPLIT_OUT) { /* B by output rows like the base, A replicated */
        g->B += (size_t)j * rows * r;
        if (g->dB) g->dB += (size_t)j * rows * r;
        g->dA = NULL;
    } else if (sp == DT_SPLIT_IN) { /* A by input columns like the base, B replicated */
        g->A += (size_t)j * r * (size_t)C;
        if (g->dA) g->dA += (size_t)j * r * (size_t)C;
        g->dB = NULL;
        g->coff = (dt_tp_first(&m->opts) + j) * C;
    }
    return 1;
}

/* out (N, OC) at the site's columns += s drop(x) A^T B^T. */
static void site_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int N, int C, int OC,
                         const site_geo *g, const drop_ctx *d) {
    const int r = m->opts.lora.rank, rows = g->rows;
    const float s = m->lora_scale, *Bm = g->B;
    float *u = m->lora_u;
    x_at(m, u, xf, xh, g->A, N, C, r, d, g->coff);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *un = u + (size_t)n * r;
        float *o = out + (size_t)n * OC + g->col;
        for (int j = 0; j < rows; j++) {
            const float *b = Bm + (size_t)j * r;
            float acc = 0.0f;
            for (int k = 0; k < r; k++) acc += un[k] * b[k];
            o[j] += s * acc;
        }
    }
}

/* The site's backward: dB += s dout^T u, dA += du^T drop(x) (du = s dout B), dinp += du A
 * (masked, NULL: skipped), into dA and dB as given. */
static void site_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh, int N,
                          int C, int OC, const site_geo *g, const drop_ctx *dr, float *dA, float *dB) {
    const int r = m->opts.lora.rank, rows = g->rows, col = g->col, coff = g->coff;
    const float s = m->lora_scale, *A = g->A, *Bm = g->B;
    float *u = m->lora_u, *du = m->lora_du;
    x_at(m, u, xf, xh, A, N, C, r, dr, coff); /* recomputed: not kept from the forward */
    /* dB[j, k] += s sum_n g[n, j] u[n, k]: JB output rows at a time (dout read by rows) */
    int nj = (rows + JB - 1) / JB;
#pragma omp parallel for schedule(static)
    for (int jb = 0; jb < nj; jb++) {
        int j0 = jb * JB, nr = rows - j0 < JB ? rows - j0 : JB;
        for (int k0 = 0; k0 < r; k0 += KB) {
            int nk = r - k0 < KB ? r - k0 : KB;
            float acc[JB * KB] = {0};
            for (int n = 0; n < N; n++) {
                const float *gr = dout + (size_t)n * OC + col + j0, *un = u + (size_t)n * r + k0;
                for (int j = 0; j < nr; j++)
                    for (int k = 0; k < nk; k++) acc[j * KB + k] += gr[j] * un[k];
            }
            for (int j = 0; j < nr; j++)
                for (int k = 0; k < nk; k++) dB[(size_t)(j0 + j) * r + k0 + k] += s * acc[j * KB + k];
        }
    }
    /* du[n, k] = s sum_j g[n, j] B[j, k] */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *gr = dout + (size_t)n * OC + col;
        float *dn = du + (size_t)n * r;
        for (int k = 0; k < r; k++) dn[k] = 0.0f;
        for (int j = 0; j < rows; j++) {
            const float gj = gr[j], *b = Bm + (size_t)j * r;
            for (int k = 0; k < r; k++) dn[k] += gj * b[k];
        }
        for (int k = 0; k < r; k++) dn[k] *= s;
    }
    /* dA[k, c] += sum_n du[n, k] drop(x)[n, c]: blocks of XB columns x KB ranks, x widened once
     * per row and block */
    int nblk = (C + XB - 1) / XB;
#pragma omp parallel for schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        int c0 = bi * XB, len = C - c0 < XB ? C - c0 : XB;
        float tmp[XB];
        for (int k0 = 0; k0 < r; k0 += KB) {
            int nk = r - k0 < KB ? r - k0 : KB;
            float acc[KB * XB] = {0};
            for (int n = 0; n < N; n++) {
                const float *xs = xseg(m, xf, xh, n, C, c0, len, tmp, dr, drop_row(dr, n), coff);
                const float *dn = du + (size_t)n * r + k0;
                for (int k = 0; k < nk; k++) {
                    const float d = dn[k];
                    float *a = acc + k * XB;
                    for (int c = 0; c < len; c++) a[c] += d * xs[c];
                }
            }
            for (int k = 0; k < nk; k++) {
                float *da = dA + (size_t)(k0 + k) * C + c0;
                for (int c = 0; c < len; c++) da[c] += acc[k * XB + c];
            }
        }
    }
    if (!dinp) return;
    /* dinp[n, c] += sum_k du[n, k] A[k, c] (times mask / (1 - p) under dropout): the sum
     * formed apart, then added */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *dx = dinp + (size_t)n * C;
        const uint64_t key = drop_row(dr, n);
        const float *dn = du + (size_t)n * r;
        for (int c0 = 0; c0 < C; c0 += XB) {
            int len = C - c0 < XB ? C - c0 : XB;
            float acc[XB] = {0};
            for (int k = 0; k < r; k++) {
                const float dk = dn[k], *a = A + (size_t)k * C + c0;
                for (int c = 0; c < len; c++) acc[c] += dk * a[c];
            }
            if (!dr->on)
                for (int c = 0; c < len; c++) dx[c0 + c] += acc[c];
            else
                for (int c = 0; c < len; c++)
                    if (kept(key, coff + c0 + c, dr->thresh)) dx[c0 + c] += acc[c] * dr->inv;
        }
    }
}

void dt_lora_mm_forward_sh(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int j,
                           int N, int C, int OC) {
    for (int i = 0; i < m->n_sites; i++) {
        site_geo g;
        if (!site_geo_of(m, i, id, l, j, OC, C, 0, &g)) continue;
        const drop_ctx d = drop_of(m, l, i);
        site_forward(m, out, xf, xh, N, C, OC, &g, &d);
    }
}

void dt_lora_mm_forward(dt_model *m, float *out, const float *xf, const uint16_t *xh, int id, int l, int N,
                        int C, int OC) {
    dt_lora_mm_forward_sh(m, out, xf, xh, id, l, 0, N, C, OC);
}

void dt_lora_mm_backward_sh(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                            int id, int l, int j, int N, int C, int OC) {
    const size_t r = (size_t)m->opts.lora.rank;
    for (int i = 0; i < m->n_sites; i++) {
        site_geo g;
        if (!site_geo_of(m, i, id, l, j, OC, C, 1, &g)) continue;
        const drop_ctx dr = drop_of(m, l, i); /* the forward's masks, regenerated */
        if (g.dA && g.dB) {
            site_backward(m, dinp, dout, xf, xh, N, C, OC, &g, &dr, g.dA, g.dB);
            continue;
        }
        /* a replicated adapter's gradient from this shard's activations: its contribution
         * (from zero), added to the shards' sum in shard order; after the last shard held,
         * summed over the TP group and added to the gradient */
        const int rep_a = g.dA == NULL;
        const size_t n = rep_a ? r * (size_t)C : (size_t)g.rows * r;
        float *acc = m->lora_red + m->lora_red_off[i], *part = j == 0 ? acc : m->lora_red_part;
        memset(part, 0, n * sizeof(float));
        site_backward(m, dinp, dout, xf, xh, N, C, OC, &g, &dr, rep_a ? part : g.dA, rep_a ? g.dB : part);
        if (j > 0) dt_tp_add(acc, part, n);
        if (j == dt_tp_local(&m->opts) - 1) {
            dt_tp_sum(m, acc, n);
            float *dst = dt_params_unit_tensor(&m->ps, m->ps.unit_grads, m->site_a[i] + !rep_a, l);
            for (size_t e = 0; e < n; e++) dst[e] += acc[e];
        }
    }
}

void dt_lora_mm_backward(dt_model *m, float *dinp, const float *dout, const float *xf, const uint16_t *xh,
                         int id, int l, int N, int C, int OC) {
    dt_lora_mm_backward_sh(m, dinp, dout, xf, xh, id, l, 0, N, C, OC);
}
