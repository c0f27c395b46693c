/* Naive double-precision references (see ops_ref.h). Written straight from the definitions;
 * attention's reference is in attention_ref.c. */
#include <math.h>
#include <string.h>

#include "ops/ops_ref.h"

void dt_ref_encoder_forward(double *out, const int32_t *tokens, const double *wte,
                            const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                out[((size_t)b * T + t) * C + i] =
                    wte[(size_t)tokens[b * T + t] * C + i] + (wpe ? wpe[(size_t)t * C + i] : 0.0);
}

void dt_ref_encoder_backward(double *dwte, double *dwpe, const double *dout,
                             const int32_t *tokens, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) {
                double d = dout[((size_t)b * T + t) * C + i];
                dwte[(size_t)tokens[b * T + t] * C + i] += d;
                if (dwpe) dwpe[(size_t)t * C + i] += d;
            }
}

void dt_ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                              const double *w, const double *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < C; i++) out[(size_t)n * C + i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void dt_ref_layernorm_backward(double *dinp, double *dw, double *db, const double *dout,
                               const double *inp, const double *w, const double *mean,
                               const double *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        double m = mean[n], s = rstd[n];
        /* y_i = xhat_i w_i + b_i, xhat = (x - m) s. dxhat_i = g_i w_i;
         * dx_i = s (dxhat_i - mean(dxhat) - xhat_i mean(dxhat . xhat)). */
        double a = 0, c = 0;
        for (int i = 0; i < C; i++) {
            double xh = (x[i] - m) * s;
            a += g[i] * w[i];
            c += g[i] * w[i] * xh;
            dw[i] += g[i] * xh;
            db[i] += g[i];
        }
        a /= C;
        c /= C;
        for (int i = 0; i < C; i++) {
            double xh = (x[i] - m) * s;
            dinp[(size_t)n * C + i] += s * (g[i] * w[i] - a - xh * c);
        }
    }
}

void dt_ref_matmul_forward(double *out, const double *inp, const double *w, const double *bias,
                           int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < C; i++) acc += inp[(size_t)n * C + i] * w[(size_t)o * C + i];
            out[(size_t)n * OC + o] = acc;
        }
}

void dt_ref_matmul_backward(double *dinp, double *dw, double *dbias, const double *dout,
                            const double *inp, const double *w, int N, int C, int OC) {
    if (dinp) memset(dinp, 0, (size_t)N * C * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double d = dout[(size_t)n * OC + o];
            for (int i = 0; i < C; i++) {
                if (dinp) dinp[(size_t)n * C + i] += d * w[(size_t)o * C + i];
                dw[(size_t)o * C + i] += d * inp[(size_t)n * C + i];
            }
            if (dbias) dbias[o] += d;
        }
}

void dt_ref_gelu_forward(double *out, const double *inp, int N) {
    const double k = sqrt(2.0 / M_PI);
    for (int i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}

void dt_ref_gelu_backward(double *dinp, const double *inp, const double *dout, int N) {
    const double k = sqrt(2.0 / M_PI);
    for (int i = 0; i < N; i++) {
        double x = inp[i];
        double th = tanh(k * (x + 0.044715 * x * x * x));
        double du = k * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] = dout[i] * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du);
    }
}

void dt_ref_residual_forward(double *out, const double *a, const double *b, int N) {
    for (int i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void dt_ref_crossentropy_forward(double *losses, double *lse, const double *logits,
                                 const int32_t *targets, int N, int V, int Vp) {
    for (int n = 0; n < N; n++) {
        const double *x = logits + (size_t)n * Vp;
        double mx = x[0], s = 0;
        for (int v = 1; v < V; v++) mx = x[v] > mx ? x[v] : mx;
        for (int v = 0; v < V; v++) s += exp(x[v] - mx);
        lse[n] = mx + log(s);
        losses[n] = targets[n] >= 0 ? lse[n] - x[targets[n]] : 0.0;
    }
}

void dt_ref_crossentropy_backward(double *dlogits, const double *logits, const double *lse,
                                  const int32_t *targets, double dloss, int N, int V, int Vp) {
    for (int n = 0; n < N; n++)
        for (int v = 0; v < Vp; v++) {
            double p = v < V ? exp(logits[(size_t)n * Vp + v] - lse[n]) : 0.0;
            double y = v == targets[n] ? 1.0 : 0.0;
            dlogits[(size_t)n * Vp + v] = v < V && targets[n] >= 0 ? (p - y) * dloss : 0.0;
        }
}

void dt_ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *w,
                            int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += x[i] * x[i];
        double s = 1.0 / sqrt(ss / C + eps);
        for (int i = 0; i < C; i++) out[(size_t)n * C + i] = x[i] * s * w[i];
        rstd[n] = s;
    }
}

void dt_ref_rmsnorm_backward(double *dinp, double *dw, const double *dout, const double *inp,
                             const double *w, const double *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        const double s = rstd[n];
        /* y_i = x_i s w_i, s = (mean(x^2) + eps)^(-1/2), ds/dx_j = -s^3 x_j / C:
         * dx_j = s g_j w_j - s^3 x_j / C sum_i g_i w_i x_i. */
        double a = 0.0;
        for (int i = 0; i < C; i++) {
            a += g[i] * w[i] * x[i];
            dw[i] += g[i] * x[i] * s;
        }
        for (int j = 0; j < C; j++)
            dinp[(size_t)n * C + j] += s * g[j] * w[j] - s * s * s * x[j] * a / C;
    }
}

static void ref_rope(double *qkv, int B, int T, int t0, int NH, int NKV, int hs, const double *inv,
                     double scale, double sign) {
    const int h2 = hs / 2;
    const size_t ld = (size_t)(NH + 2 * NKV) * hs;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH + NKV; h++) {
                double *x = qkv + ((size_t)b * T + t) * ld + (size_t)h * hs;
                for (int i = 0; i < h2; i++) {
                    const double a = (t0 + t) * inv[i];
                    const double c = scale * cos(a), s = sign * scale * sin(a);
                    const double lo = x[i], hi = x[i + h2];
                    x[i] = lo * c - hi * s;
                    x[i + h2] = hi * c + lo * s;
                }
            }
}

void dt_ref_rope_forward(double *qkv, int B, int T, int NH, int NKV, int hs, const double *inv_freq,
                         double scale) {
    ref_rope(qkv, B, T, 0, NH, NKV, hs, inv_freq, scale, 1.0);
}

void dt_ref_rope_backward(double *dqkv, int B, int T, int NH, int NKV, int hs, const double *inv_freq,
                          double scale) {
    ref_rope(dqkv, B, T, 0, NH, NKV, hs, inv_freq, scale, -1.0);
}

void dt_ref_rope_at(double *qkv, int B, int T, int pos0, int NH, int NKV, int hs, const double *inv_freq, double scale,
                    int backward) {
    ref_rope(qkv, B, T, pos0, NH, NKV, hs, inv_freq, scale, backward ? -1.0 : 1.0);
}

void dt_ref_rope_inv_freq(double *inv, int hs, double theta) {
    for (int i = 0; i < hs / 2; i++) inv[i] = pow(theta, -2.0 * i / hs);
}

void dt_ref_swiglu_forward(double *out, const double *inp, int N, int F) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            const double g = inp[(size_t)n * 2 * F + i], u = inp[(size_t)n * 2 * F + F + i];
            out[(size_t)n * F + i] = g / (1.0 + exp(-g)) * u;
        }
}

void dt_ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int N, int F) {
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            const double g = inp[(size_t)n * 2 * F + i], u = inp[(size_t)n * 2 * F + F + i];
            const double d = dout[(size_t)n * F + i], s = 1.0 / (1.0 + exp(-g));
            dinp[(size_t)n * 2 * F + i] = d * u * (s + g * s * (1.0 - s));
            dinp[(size_t)n * 2 * F + F + i] = d * g * s;
        }
}
