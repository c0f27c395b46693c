/* ZeRO-3's embedding lookup: only the vocabulary rows the micro-batch's tokens name travel.
 *
 * A token lookup reads one row of the embedding per token, yet gathering the table chunk by
 * chunk moves all of it (the largest tensor of a small model) at the start of every forward,
 * with no compute to hide behind. Instead the ranks of the shard group exchange the sorted
 * sets of token ids they look up (one all-gather of small records), every rank forms the same
 * sorted union, and one all-gather moves, for each id of the union, each rank's piece of that
 * row (a row lies in one vocabulary-chunk unit; a rank owns a contiguous range of each unit,
 * so a row is at most one piece per rank, in rank order). Each token's row is then copied
 * from its pieces into the lookup's output: exactly the fp32 master values the chunk gathers
 * would have given, so the bits are the same. Bytes per rank: its pieces of at most G x tokens
 * rows instead of a 1/G share of all V rows; used when G x tokens < V (otherwise the chunk
 * gathers move no more bytes, and need no id exchange and no buffers).
 *
 * Buffers (one block, communication memory, sized by dt_par_lookup_sizes from the strategy,
 * the shard group and the tokens per micro-batch alone, so the plan counts them exactly):
 * the receive area (rows x cols floats), my id record and every rank's (words of 8 bytes:
 * the count, then the ids as int32 pairs), where each row's pieces arrived (rows x G), and
 * the union of the ids (rows).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "ops/ops.h"
#include "parallel/parallel_impl.h"

void dt_par_lookup_sizes(const dt_params *ps, const dt_parallel_cfg *cfg, int G, dt_par_sizes *z) {
    z->lk_rows = z->lk_cols = z->lk_words = z->lk_bytes = 0;
    /* gathers per step read the resident copy (zero_step.c): no lookup */
    if (cfg->strategy != DT_STRAT_ZERO3 || G < 2 || cfg->tokens <= 0 || cfg->zero3_gather == DT_ZG_STEP) return;
    size_t rows = 0, cols = 0;
    for (int i = 0; i < ps->n_tensors; i++) {
        const dt_tensor_info *t = &ps->tensors[i];
        if (!t->vocab) continue;
        if (t->rows > rows) rows = t->rows;
        if (t->cols > cols) cols = t->cols;
    }
    size_t n = (size_t)cfg->tokens, cap = (size_t)G * n;
    if (cap >= rows) return; /* the ranks may name every row: the chunk gathers move no more */
    z->lk_rows = cap;
    z->lk_cols = cols;
    z->lk_words = (n + 2) / 2;
    z->lk_bytes = z->lk_rows * cols * sizeof(float) + (1 + (size_t)G) * z->lk_words * 8 +
                  z->lk_rows * (size_t)G * sizeof(size_t) + z->lk_rows * sizeof(int32_t);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The piece of row r of tensor t (in its chunk unit *u) that shard rank j owns: [*a, *b) in
 * unit offsets (empty when *a == *b), and where the row starts in the unit (*row). */
static void piece(const dt_parallel *p, const dt_tensor_info *t, size_t r, int j, int *u, size_t *row, size_t *a,
                  size_t *b) {
    size_t c = r / t->chunk_rows;
    *u = t->unit + (int)c;
    *row = (r - c * t->chunk_rows) * t->cols;
    size_t lo = p->split_off[(size_t)*u * p->G + (size_t)j], hi = lo + p->split_cnt[(size_t)*u * p->G + (size_t)j];
    size_t e = *row + t->cols;
    *a = *row > lo ? *row : lo;
    *b = e < hi ? e : hi;
    if (*b < *a) *b = *a;
}

dt_status dt_par_lookup(dt_ctx *ctx, dt_parallel *p) {
    const dt_tensor_info *t = &p->m->ps.tensors[p->lk_id];
    const size_t V = t->rows, C = t->cols, W = p->z.lk_words, G = (size_t)p->G;
    const int N = p->lk_n;
    /* My sorted, distinct ids (ids outside the vocabulary are left out: their positions are
     * left untouched, as the chunk lookups leave them). */
    int32_t *mine = (int32_t *)p->lk_mine;
    memset(mine, 0, W * 8);
    int n = 0;
    for (int i = 0; i < N; i++)
        if (p->lk_tokens[i] >= 0 && (size_t)p->lk_tokens[i] < V) mine[1 + n++] = p->lk_tokens[i];
    qsort(mine + 1, (size_t)n, sizeof(int32_t), cmp_i32);
    int d = 0;
    for (int i = 0; i < n; i++)
        if (d == 0 || mine[1 + i] != mine[d]) mine[1 + d++] = mine[1 + i];
    mine[0] = d;
    double t0 = dt_now();
    DT_CHECK(dt_comm_allgather_words(ctx, p->comm, p->g_shard, p->lk_mine, W, p->lk_all));
    p->t_total += dt_now() - t0;
    /* The union, merged from the ranks' sorted lists (the same on every rank). */
    size_t nu = 0;
    int at[4096];
    DT_ASSERT(G <= 4096);
    for (size_t j = 0; j < G; j++) at[j] = 0;
    for (;;) {
        int32_t best = -1;
        for (size_t j = 0; j < G; j++) {
            const int32_t *l = (const int32_t *)(p->lk_all + j * W);
            if (at[j] < l[0] && (best < 0 || l[1 + at[j]] < best)) best = l[1 + at[j]];
        }
        if (best < 0) break;
        for (size_t j = 0; j < G; j++) {
            const int32_t *l = (const int32_t *)(p->lk_all + j * W);
            if (at[j] < l[0] && l[1 + at[j]] == best) at[j]++;
        }
        if (nu >= p->z.lk_rows)
            return dt_fail(ctx, DT_ERR_INTERNAL, "parallel: the vocabulary lookup found more than %zu rows", p->z.lk_rows);
        p->lk_ids[nu++] = best;
    }
    /* Each rank's pieces of the union's rows, in id order, then rank after rank. */
    size_t *cnt = p->part_cnt, *off = p->part_cnt + G, sum = 0;
    for (size_t j = 0; j < G; j++) {
        size_t c = 0, row, a, b;
        int u;
        for (size_t k = 0; k < nu; k++) {
            piece(p, t, (size_t)p->lk_ids[k], (int)j, &u, &row, &a, &b);
            c += b - a;
        }
        cnt[j] = c;
        off[j] = sum;
        sum += c;
    }
    DT_ASSERT(sum == nu * C);
    float *dst = p->lk_recv + off[p->j];
    for (size_t k = 0; k < nu; k++) {
        size_t row, a, b;
        int u;
        piece(p, t, (size_t)p->lk_ids[k], p->j, &u, &row, &a, &b);
        size_t o = p->split_off[(size_t)u * G + (size_t)p->j];
        dt_copy(dst, p->pshard + p->sb[u] + (a - o), (b - a) * sizeof(float));
        dst += b - a;
    }
    t0 = dt_now();
    DT_CHECK(dt_comm_allgatherv(ctx, p->comm, p->g_shard, p->lk_recv, cnt, off));
    p->t_total += dt_now() - t0;
    /* Where row k's piece from rank j sits in what arrived (pieces of a row are contiguous
     * ranges of it, in rank order). */
    for (size_t j = 0; j < G; j++) {
        size_t at_j = off[j];
        for (size_t k = 0; k < nu; k++) {
            size_t row, a, b;
            int u;
            piece(p, t, (size_t)p->lk_ids[k], (int)j, &u, &row, &a, &b);
            p->lk_pos[k * G + j] = b > a ? at_j - (a - row) : SIZE_MAX; /* recv + pos + x: element x of the row */
            at_j += b - a;
        }
    }
    /* Each token's row, assembled from the ranks' pieces (tokens outside the vocabulary: the
     * position is left untouched). */
    float *out = p->lk_out;
    for (int i = 0; i < N; i++) {
        int32_t v = p->lk_tokens[i];
        const int32_t *hit = v >= 0 && (size_t)v < V ? bsearch(&v, p->lk_ids, nu, sizeof(int32_t), cmp_i32) : NULL;
        if (!hit) continue;
        size_t k = (size_t)(hit - p->lk_ids);
        for (size_t j = 0; j < G; j++) {
            size_t row, a, b;
            int u;
            piece(p, t, (size_t)v, (int)j, &u, &row, &a, &b);
            if (b > a) dt_copy(out + (size_t)i * C + (a - row), p->lk_recv + p->lk_pos[k * G + j] + (a - row), (b - a) * sizeof(float));
        }
    }
    return DT_OK;
}
