/* Context parallelism's ring attention (cp.h; ARCHITECTURE decision 83). */
#include "model/cp.h"

#include <math.h>

#include "core/trace.h"
#include "ops/ops.h"

/* The scratch: two block buffers and two gradient buffers of B Tl key/value rows (2 NKV hs
 * floats each), this step's share of a block's gradient, and one sequence's partial output
 * and log-sum-exp. */
typedef struct cp_bufs {
    float *kv[2], *dkv[2], *mine, *ob, *lb;
    float *all, *share, *home; /* all_gather: every rank's blocks, this rank's shares of them, ours back */
    size_t n; /* floats of one block buffer */
} cp_bufs;

static cp_bufs bufs_of(float *s, int B, int Tl, int NH, int NKV, int hs, int cp, int all_gather) {
    cp_bufs b = {0};
    b.n = (size_t)B * Tl * 2 * NKV * hs;
    if (all_gather) {
        b.all = s, b.share = s + (size_t)cp * b.n, b.home = s + 2 * (size_t)cp * b.n;
        b.ob = s + 3 * (size_t)cp * b.n;
    } else {
        b.kv[0] = s, b.kv[1] = s + b.n, b.dkv[0] = s + 2 * b.n, b.dkv[1] = s + 3 * b.n, b.mine = s + 4 * b.n;
        b.ob = s + 5 * b.n;
    }
    b.lb = b.ob + (size_t)Tl * NH * hs;
    return b;
}

size_t dt_cp_scratch_floats(int B, int Tl, int NH, int NKV, int hs, int cp, int all_gather) {
    const size_t n = (size_t)B * Tl * 2 * NKV * hs;
    return (all_gather ? 3 * (size_t)cp * n : 5 * n) + (size_t)Tl * NH * hs + (size_t)NH * Tl;
}

/* The keys and values of the local rows, packed (B Tl rows of k heads | v heads). */
static void pack_kv(float *kv, const float *qkv, int rows, int NH, int NKV, int hs) {
    const size_t ld = (size_t)(NH + 2 * NKV) * hs, w = 2 * (size_t)NKV * hs;
    for (int t = 0; t < rows; t++) dt_copy(kv + t * w, qkv + t * ld + (size_t)NH * hs, w * sizeof(float));
}

/* The chunk pairs of one step, for one sequence: which local query rows [q0, q0 + nq) see which
 * rows [k0, k0 + nk) of the block held (of rank j), and whether on the diagonal. Rank r's rows
 * are chunk r then chunk 2 cp - 1 - r; a chunk sees an earlier chunk whole, itself causally.
 * Own block (j = r): lo x lo and hi x hi causal, hi x lo whole (lo x hi never). An earlier
 * rank's (j < r): both local chunks see chunk j whole and not chunk 2 cp - 1 - j (later than
 * both). A later rank's (j > r): only hi sees the block, both of its chunks whole. */
typedef struct cp_pair { int q0, nq, k0, nk, causal; } cp_pair;
static int pairs_of(int r, int j, int c, int contiguous, cp_pair *p) {
    if (contiguous) { /* chunks 2r, 2r + 1: an earlier rank's block is seen whole, a later one not */
        if (j > r) return 0;
        if (j < r) {
            p[0] = (cp_pair){0, 2 * c, 0, 2 * c, 0};
            return 1;
        }
        p[0] = (cp_pair){0, c, 0, c, 1}, p[1] = (cp_pair){c, c, c, c, 1}, p[2] = (cp_pair){c, c, 0, c, 0};
        return 3;
    }
    if (j == r) {
        p[0] = (cp_pair){0, c, 0, c, 1}, p[1] = (cp_pair){c, c, c, c, 1}, p[2] = (cp_pair){c, c, 0, c, 0};
        return 3;
    }
    if (j < r) p[0] = (cp_pair){0, 2 * c, 0, c, 0};
    else p[0] = (cp_pair){c, c, 0, 2 * c, 0};
    return 1;
}

void dt_cp_rows(int32_t *dst, const int32_t *src, int B, int T, int cp, int r, int contiguous) {
    const int Tl = T / cp;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++) dst[(size_t)b * Tl + i] = src[(size_t)b * T + dt_cp_pos(cp, r, Tl, i, contiguous)];
}

int dt_cp_attention_forward(const dt_cp_ring *ring, float *scratch, float *out, float *lse, const float *qkv, int B,
                            int Tl, int NH, int NKV, int hs, dt_dtype op) {
    const int P = ring->n, r = ring->rank, c = Tl / 2;
    const int ldq = (NH + 2 * NKV) * hs, kvw = 2 * NKV * hs, ldo = NH * hs;
    const int ag = ring->allgather != NULL;
    cp_bufs w = bufs_of(scratch, B, Tl, NH, NKV, hs, P, ag);
    int err = 0;
    if (ag) { /* every rank's blocks at once */
        pack_kv(w.all + (size_t)r * w.n, qkv, B * Tl, NH, NKV, hs);
        err |= ring->allgather(ring->ud, w.all, w.n);
    } else {
        pack_kv(w.kv[0], qkv, B * Tl, NH, NKV, hs);
    }
    for (size_t i = 0; i < (size_t)B * NH * Tl; i++) lse[i] = -INFINITY; /* nothing merged yet */
    for (int s = 0; s < P; s++) {
        const int j = ((r - s) % P + P) % P; /* the block held: rank j's */
        const float *kv = ag ? w.all + (size_t)j * w.n : w.kv[s % 2];
        if (!ag && s + 1 < P) err |= ring->start(ring->ud, DT_CP_KV, kv, w.kv[(s + 1) % 2], w.n);
        cp_pair pr[3];
        const int np = pairs_of(r, j, c, ring->contiguous, pr);
        const double tb = dt_trace_begin(); /* the block's compute, beside the ring's waits */
        for (int b = 0; b < B; b++) {
            const float *qb = qkv + (size_t)b * Tl * ldq, *kb = kv + (size_t)b * Tl * kvw;
            float *obase = out + (size_t)b * Tl * ldo, *lbase = lse + (size_t)b * NH * Tl;
            for (int i = 0; i < np; i++) {
                const cp_pair *x = &pr[i];
                dt_attention_block_forward(w.ob, ldo, w.lb, Tl, qb + (size_t)x->q0 * ldq, ldq, kb + (size_t)x->k0 * kvw, kvw,
                                           x->nq, x->nk, NH, NKV, hs, x->causal, op);
                dt_attention_merge(obase + (size_t)x->q0 * ldo, ldo, lbase + x->q0, Tl, w.ob, ldo, w.lb, Tl, x->nq, NH, hs);
            }
        }
        dt_trace_end(tb, "attn", "attention block of cp rank %d", j);
        if (!ag && s + 1 < P) err |= ring->wait(ring->ud, DT_CP_KV);
    }
    return err;
}

int dt_cp_attention_backward(const dt_cp_ring *ring, float *scratch, float *dqkv, const float *dout, const float *qkv,
                             const float *out, const float *lse, int B, int Tl, int NH, int NKV, int hs, dt_dtype op) {
    const int P = ring->n, r = ring->rank, c = Tl / 2;
    const int ldq = (NH + 2 * NKV) * hs, kvw = 2 * NKV * hs, ldo = NH * hs;
    const int ag = ring->allgather != NULL;
    cp_bufs w = bufs_of(scratch, B, Tl, NH, NKV, hs, P, ag);
    int err = 0;
    if (ag) {
        pack_kv(w.all + (size_t)r * w.n, qkv, B * Tl, NH, NKV, hs);
        err |= ring->allgather(ring->ud, w.all, w.n);
    } else {
        pack_kv(w.kv[0], qkv, B * Tl, NH, NKV, hs);
    }
    dt_fill(dqkv, 0, (size_t)B * Tl * ldq * sizeof(float));
    for (int s = 0; s < P; s++) {
        const int j = ((r - s) % P + P) % P;
        const float *kv = ag ? w.all + (size_t)j * w.n : w.kv[s % 2];
        if (!ag && s + 1 < P) err |= ring->start(ring->ud, DT_CP_KV, kv, w.kv[(s + 1) % 2], w.n);
        cp_pair pr[3];
        const int np = pairs_of(r, j, c, ring->contiguous, pr);
        /* this rank's share of block j's gradient, formed while its earlier shares travel here
         * (all_gather: kept for the all-to-all) */
        float *mine = ag ? w.share + (size_t)j * w.n : s == 0 ? w.dkv[0] : w.mine;
        dt_fill(mine, 0, w.n * sizeof(float));
        const double tb = dt_trace_begin();
        for (int b = 0; b < B; b++) {
            const size_t qo = (size_t)b * Tl * ldq, ko = (size_t)b * Tl * kvw, oo = (size_t)b * Tl * ldo;
            const float *lb = lse + (size_t)b * NH * Tl;
            for (int i = 0; i < np; i++) {
                const cp_pair *x = &pr[i];
                dt_attention_block_backward(dqkv + qo + (size_t)x->q0 * ldq, ldq, mine + ko + (size_t)x->k0 * kvw, kvw,
                                            dout + oo + (size_t)x->q0 * ldo, out + oo + (size_t)x->q0 * ldo, ldo, lb + x->q0,
                                            Tl, qkv + qo + (size_t)x->q0 * ldq, ldq, kv + ko + (size_t)x->k0 * kvw, kvw, x->nq,
                                            x->nk, NH, NKV, hs, x->causal, op);
            }
        }
        dt_trace_end(tb, "attn", "attention backward block of cp rank %d", j);
        if (ag) continue;
        float *acc = w.dkv[s % 2];
        if (s > 0) { /* the shares of the ranks before, then this one's */
            err |= ring->wait(ring->ud, DT_CP_DKV);
            dt_add_f32(acc, mine, w.n);
        }
        if (s + 1 < P) err |= ring->wait(ring->ud, DT_CP_KV);
        /* on to the next rank; after the last step the block goes home, and ours arrives */
        if (P > 1) err |= ring->start(ring->ud, DT_CP_DKV, acc, w.dkv[(s + 1) % 2], w.n);
    }
    const float *home;
    if (ag) { /* every rank's share of our block, added in the ring's order: ours first, then r + 1's ... */
        err |= ring->alltoall(ring->ud, w.share, w.home, w.n);
        float *h = w.home + (size_t)r * w.n;
        for (int s = 1; s < P; s++) dt_add_f32(h, w.home + (size_t)((r + s) % P) * w.n, w.n);
        home = h;
    } else {
        if (P > 1) err |= ring->wait(ring->ud, DT_CP_DKV);
        home = w.dkv[P > 1 ? P % 2 : 0]; /* every rank's share of our keys' and values' gradient */
    }
    for (int t = 0; t < B * Tl; t++)
        dt_copy(dqkv + (size_t)t * ldq + (size_t)NH * hs, home + (size_t)t * kvw, (size_t)kvw * sizeof(float));
    return err;
}
