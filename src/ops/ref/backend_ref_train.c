/* The reference backend's operations of the training layers (backend_ref_impl.h): each in
 * float64 from the float / 16-bit inputs, rounded to float once per stored value; the
 * model/ operations that are exact in the contract (patchify, the class token and positions
 * forward, the narrowing, the fills) give its bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "ops/backend.h"
#include "ops/ref/backend_ref_impl.h"

/* ---- parallel/ and optim/ operations */

void dt_ref_be_adamw_chunked(float *params, const float *grads, float *m, float *v, size_t n, const dt_adamw_step *s) {
    const double b1 = s->b1, b2 = s->b2;
    for (size_t i = 0; i < n; i++) {
        const double g = (double)grads[i] * s->gscale;
        const double mi = b1 * m[i] + (1.0 - b1) * g, vi = b2 * v[i] + (1.0 - b2) * g * g;
        m[i] = (float)mi, v[i] = (float)vi;
        params[i] = (float)((double)params[i] * s->shrink - (double)s->step_size * mi / (sqrt(vi) / s->bc2_sqrt + s->eps));
    }
}

void dt_ref_be_adamw_aged(float *params, const float *grads, float *m, float *v, float *age, size_t n,
                          const dt_adamw_step *s) {
    for (size_t i = 0; i < n; i++) {
        const double g = (double)grads[i] * s->gscale;
        if (g == 0.0) {
            params[i] = (float)((double)params[i] * s->shrink);
            age[i] += 1.0f;
            continue;
        }
        const double a = age[i], d1 = pow(s->b1, a), d2 = pow(s->b2, a);
        const double mi = d1 * m[i] + (1.0 - d1) * (g / a), vi = d2 * v[i] + (1.0 - d2) * (g * g / a);
        m[i] = (float)mi, v[i] = (float)vi;
        params[i] = (float)((double)params[i] * s->shrink - a * s->step_size * mi / (sqrt(vi) / s->bc2_sqrt + s->eps));
        age[i] = 1.0f;
    }
}

double dt_ref_be_sumsq_chunked(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void dt_ref_be_add_f32(float *a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = (float)((double)a[i] + x[i]);
}

void dt_ref_be_scale_f32(float *x, float factor, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * factor);
}

/* ---- model/ operations */

/* One fp32 operation (a sum, product or quotient of two floats) in double, rounded once:
 * double has more than 2 24 + 2 bits, so that is the fp32 operation's correctly rounded
 * result, bit for bit (the ops below marked exact rely on it). */

void dt_ref_be_patchify(float *patches, const int32_t *pix, int B, int CH, int S, int p) {
    const int g = S / p;
    for (int b = 0; b < B; b++)
        for (int gy = 0; gy < g; gy++)
            for (int gx = 0; gx < g; gx++)
                for (int ch = 0; ch < CH; ch++)
                    for (int py = 0; py < p; py++)
                        for (int px = 0; px < p; px++) {
                            size_t row = ((size_t)b * g + gy) * g + gx, col = ((size_t)ch * p + py) * p + px;
                            size_t y = (size_t)gy * p + py, x = (size_t)gx * p + px;
                            int32_t v = pix[(((size_t)b * CH + ch) * S + y) * S + x];
                            patches[row * ((size_t)CH * p * p) + col] = (float)((double)(float)v / 255.0); /* exact */
                        }
}

void dt_ref_be_cls_pos_forward(float *out, const float *cls, const float *pe, const float *pos, int r0, int rows, int T,
                               int C) {
    for (int i = 0; i < rows; i++) {
        const int b = (r0 + i) / T, t = (r0 + i) % T;
        for (int k = 0; k < C; k++) {
            double e = t == 0 ? cls[k] : pe[((size_t)b * (T - 1) + (size_t)(t - 1)) * C + k];
            out[(size_t)i * C + k] = (float)(e + pos[(size_t)t * C + k]); /* exact */
        }
    }
}

void dt_ref_be_cls_pos_backward(float *dpos, float *dcls, float *dpe, const float *dout, int B, int T, int C) {
    for (int t = 0; t < T; t++)
        for (int k = 0; k < C; k++) {
            double sp = dpos[(size_t)t * C + k], sc = t == 0 ? dcls[k] : 0.0;
            for (int b = 0; b < B; b++) {
                const float g = dout[((size_t)b * T + t) * C + k];
                sp += g;
                if (t == 0) sc += g;
                else dpe[((size_t)b * (T - 1) + (size_t)(t - 1)) * C + k] = g;
            }
            dpos[(size_t)t * C + k] = (float)sp;
            if (t == 0) dcls[k] = (float)sc;
        }
}

void dt_ref_be_crossentropy_backward_blocks(float *dlogits, const float *lse, const int32_t *targets, float dloss, int N,
                                            int ld, int nb, int Vl, long col0, int V) {
    for (int n = 0; n < N; n++) {
        float *d = dlogits + (size_t)n * ld;
        if (targets[n] < 0) {
            for (int i = 0; i < ld; i++) d[i] = 0.0f;
            continue;
        }
        for (long i = 0; i < (long)nb * Vl; i++) { /* canonical column col0 + i */
            const long col = col0 + i;
            double v = col < V ? exp((double)d[i] - lse[n]) * dloss : 0.0;
            if (col == targets[n]) v -= dloss;
            d[i] = (float)v;
        }
    }
}

void dt_ref_be_f32_to_lowp_rows_inplace(dt_dtype dt, float *x, int N, int ld) {
    DT_ASSERT(dt == DT_BF16 || dt == DT_F16);
    float *f = malloc((size_t)(ld > 0 ? ld : 1) * sizeof(float));
    uint16_t *h = malloc((size_t)(ld > 0 ? ld : 1) * sizeof(uint16_t));
    DT_ASSERT(f && h);
    for (int r = 0; r < N; r++) { /* the row read whole, then its 16-bit values written at its start */
        memcpy(f, x + (size_t)r * ld, (size_t)ld * sizeof(float));
        if (dt == DT_BF16) dt_backend_ref.f32_to_bf16(h, f, (size_t)ld);
        else dt_backend_ref.f32_to_f16(h, f, (size_t)ld);
        memcpy(x + (size_t)r * ld, h, (size_t)ld * sizeof(uint16_t));
    }
    free(f), free(h);
}

/* x[n, c] (fp32, or 16-bit widened exactly) after dropout, in double: x inv when kept. */
static double xin(const float *xf, const uint16_t *xh, dt_dtype xdt, const dt_dropout *d, uint64_t key, int n, int C,
                  int c) {
    float v;
    if (xh) {
        if (xdt == DT_BF16) dt_backend_ref.bf16_to_f32(&v, xh + (size_t)n * C + c, 1);
        else dt_backend_ref.f16_to_f32(&v, xh + (size_t)n * C + c, 1);
    } else {
        v = xf[(size_t)n * C + c];
    }
    if (!d->on) return v;
    return dt_dropout_kept(d, key, c) ? (double)v * d->inv : 0.0;
}
/* drop(x) (N, C) in double. */
static double *xdrop(const float *xf, const uint16_t *xh, dt_dtype xdt, int N, int C, const dt_dropout *d) {
    DT_ASSERT(!xh || xdt == DT_BF16 || xdt == DT_F16);
    double *x = malloc((size_t)N * C * sizeof(double) + 8);
    DT_ASSERT(x != NULL);
    for (int n = 0; n < N; n++) {
        const uint64_t key = d->on ? dt_dropout_row_key(d, n) : 0;
        for (int c = 0; c < C; c++) x[(size_t)n * C + c] = xin(xf, xh, xdt, d, key, n, C, c);
    }
    return x;
}

void dt_ref_be_lowrank_down_forward(float *u, const float *xf, const uint16_t *xh, dt_dtype xdt, const float *A, int N,
                                    int C, int r, const dt_dropout *d) {
    double *x = xdrop(xf, xh, xdt, N, C, d);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += x[(size_t)n * C + c] * A[(size_t)k * C + c];
            u[(size_t)n * r + k] = (float)s;
        }
    free(x);
}

void dt_ref_be_lowrank_up_forward(float *out, int ldo, const float *u, const float *B, float s, int N, int rows, int r) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < rows; j++) {
            double a = 0.0;
            for (int k = 0; k < r; k++) a += (double)u[(size_t)n * r + k] * B[(size_t)j * r + k];
            out[(size_t)n * ldo + j] = (float)((double)out[(size_t)n * ldo + j] + (double)s * a);
        }
}

void dt_ref_be_lowrank_up_backward(float *dB, float *du, const float *dout, int ldd, const float *u, const float *B,
                                   float s, int N, int rows, int r) {
    for (int j = 0; dB && j < rows; j++) /* dB NULL: skipped */
        for (int k = 0; k < r; k++) {
            double a = 0.0;
            for (int n = 0; n < N; n++) a += (double)dout[(size_t)n * ldd + j] * u[(size_t)n * r + k];
            dB[(size_t)j * r + k] = (float)((double)dB[(size_t)j * r + k] + (double)s * a);
        }
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++) {
            double a = 0.0;
            for (int j = 0; j < rows; j++) a += (double)dout[(size_t)n * ldd + j] * B[(size_t)j * r + k];
            du[(size_t)n * r + k] = (float)((double)s * a);
        }
}

void dt_ref_be_lowrank_down_backward(float *dA, float *dinp, const float *du, const float *xf, const uint16_t *xh,
                                     dt_dtype xdt, const float *A, int N, int C, int r, const dt_dropout *d) {
    double *x = dA ? xdrop(xf, xh, xdt, N, C, d) : NULL;
    for (int k = 0; dA && k < r; k++) /* dA NULL: skipped */
        for (int c = 0; c < C; c++) {
            double a = dA[(size_t)k * C + c];
            for (int n = 0; n < N; n++) a += (double)du[(size_t)n * r + k] * x[(size_t)n * C + c];
            dA[(size_t)k * C + c] = (float)a;
        }
    free(x);
    if (!dinp) return;
    for (int n = 0; n < N; n++) {
        const uint64_t key = d->on ? dt_dropout_row_key(d, n) : 0;
        for (int c = 0; c < C; c++) {
            if (d->on && !dt_dropout_kept(d, key, c)) continue; /* a dropped feature gets no gradient */
            double a = 0.0;
            for (int k = 0; k < r; k++) a += (double)du[(size_t)n * r + k] * A[(size_t)k * C + c];
            if (d->on) a *= d->inv;
            dinp[(size_t)n * C + c] = (float)((double)dinp[(size_t)n * C + c] + a);
        }
    }
}

/* The counter RNG's draws themselves (core/rng.h), each times std: the same bits. */
void dt_ref_be_fill_normal(float *dst, size_t n, uint64_t seed, uint64_t stream, uint64_t i0, uint64_t drawn, float std) {
    for (size_t k = 0; k < n; k++)
        dst[k] = i0 + k < drawn ? (float)((double)std * dt_rng_normal(seed, stream, i0 + k)) : 0.0f; /* exact */
}

void dt_ref_be_fill_f32(float *dst, float v, size_t n) {
    for (size_t k = 0; k < n; k++) dst[k] = v;
}

/* The CPU's is already double sums rounded once: the same formula, serially. */
void dt_ref_be_lowrank_merge(float *W, const float *A, const float *B, float s, int rows, int C, int r) {
    for (int j = 0; j < rows; j++)
        for (int c = 0; c < C; c++) {
            double acc = 0.0;
            for (int k = 0; k < r; k++) acc += (double)B[(size_t)j * r + k] * (double)A[(size_t)k * C + c];
            float *w = W + (size_t)j * C + c;
            *w = (float)((double)*w + (double)s * acc);
        }
}
