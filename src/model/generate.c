#include "model/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

#define DT_RNG_STREAM_SAMPLE 0x5a3b1eULL

/* k-th largest of x[0..n) (1-based k), by quickselect on the scratch copy. */
static float kth_largest(float *x, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = x[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (x[i] > pivot) i++;
            while (x[j] < pivot) j--;
            if (i <= j) {
                float t = x[i];
                x[i++] = x[j];
                x[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return x[want];
    }
    return x[want];
}

int dt_sample_logits(const float *logits, int V, float temperature, int top_k, float u,
                     float *scratch) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0.0f || top_k == 1) return best;
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof(float));
        cut = kth_largest(scratch, V, top_k);
    }
    /* Softmax over the kept logits in double; ties at the cut are all kept. */
    double sum = 0.0, mx = logits[best];
    for (int v = 0; v < V; v++) {
        double p = logits[v] >= cut ? exp(((double)logits[v] - mx) / temperature) : 0.0;
        scratch[v] = (float)p;
        sum += p;
    }
    double target = (double)u * sum, acc = 0.0;
    for (int v = 0; v < V; v++) {
        acc += scratch[v];
        if (scratch[v] > 0.0f && acc > target) return v;
    }
    return best; /* u ~ 1 and rounding: the mode is a safe answer */
}

dt_status dt_generate(dt_ctx *ctx, dt_model *m, const int32_t *prompt, int n_prompt,
                      const dt_gen_cfg *g, int32_t *out, int *n_out) {
    int T = m->T, V = m->cfg.vocab, Vp = m->cfg.vocab_padded;
    if (m->B != 1) return dt_fail(ctx, DT_ERR_INTERNAL, "dt_generate needs a model built with B = 1");
    if (n_prompt < 1) return dt_fail(ctx, DT_ERR_CONFIG, "sample: the prompt must hold at least one token");
    int total = n_prompt + g->max_new;
    int32_t *seq = malloc((size_t)total * sizeof *seq), *win = malloc((size_t)T * sizeof *win);
    float *scratch = malloc((size_t)V * sizeof *scratch);
    dt_status st = DT_OK;
    if (!seq || !win || !scratch) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "sample: out of memory");
        goto done;
    }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int len = n_prompt;
    *n_out = 0;
    for (int i = 0; i < g->max_new; i++) {
        int start = len > T ? len - T : 0, w = len - start;
        memset(win, 0, (size_t)T * sizeof *win); /* positions past w do not affect w-1 (causal) */
        memcpy(win, seq + start, (size_t)w * sizeof *win);
        st = dt_model_forward(ctx, m, win, NULL, NULL);
        if (st != DT_OK) goto done;
        const float *logits = dt_model_logits(m) + (size_t)(w - 1) * Vp;
        float u = dt_rng_uniform(g->seed, DT_RNG_STREAM_SAMPLE, (uint64_t)i);
        int tok = dt_sample_logits(logits, g->vocab_limit > 0 && g->vocab_limit < V ? g->vocab_limit : V,
                                   g->temperature, g->top_k, u, scratch);
        seq[len++] = tok;
        out[(*n_out)++] = tok;
        if (g->on_token && (st = g->on_token(ctx, g->on_token_ud, tok)) != DT_OK) goto done;
        if (tok == g->stop) break;
    }
done:
    free(seq);
    free(win);
    free(scratch);
    return st;
}
