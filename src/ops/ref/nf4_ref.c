/* Naive double-precision NF4 (see ops_ref.h): quantization by distance to every code value,
 * dequantization straight from the layout. */
#include <math.h>

#include "ops/ops_ref.h"

void dt_ref_nf4_quantize(uint8_t *idx, double *absmax, const float *w, size_t n) {
    double code[16];
    dt_nf4_codebook_derive(code);
    for (size_t b = 0; b * DT_NF4_BLOCK < n; b++) {
        size_t i0 = b * DT_NF4_BLOCK, i1 = i0 + DT_NF4_BLOCK < n ? i0 + DT_NF4_BLOCK : n;
        double a = 0.0;
        for (size_t i = i0; i < i1; i++) a = fmax(a, fabs((double)w[i]));
        absmax[b] = a;
        for (size_t i = i0; i < i1; i++) {
            double x = a > 0.0 ? w[i] / a : 0.0, best = INFINITY;
            for (int k = 0; k < 16; k++)
                if (fabs(x - code[k]) < best) {
                    best = fabs(x - code[k]);
                    idx[i] = (uint8_t)k;
                }
        }
    }
}

void dt_ref_nf4_dequantize(double *out, const dt_nf4 *t) {
    double code[16];
    dt_nf4_codebook_derive(code);
    for (size_t i = 0; i < t->n; i++) {
        size_t b = i / DT_NF4_BLOCK;
        double scale = (double)t->qabsmax[b] * t->step[b / DT_NF4_GROUP] + *t->offset;
        int k = i % 2 == 0 ? t->codes[i / 2] >> 4 : t->codes[i / 2] & 15;
        out[i] = code[k] * scale;
    }
}
