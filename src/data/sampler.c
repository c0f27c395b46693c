#include "data/sampler.h"

#include <stdlib.h>

#include "core/rng.h"

#define DT_RNG_STREAM_PERM 0x5e9a11e5ULL
#define PERM_ROUNDS 8 /* 4 per half: enough avalanche for a data order, and cheap */

struct dt_sampler {
    const dt_dataset *ds;
    int T;
    int rec_len; /* record datasets: tokens per record (T + 1), one record per sample; else 0 */
    int shuffle;
    int n_shards;
    uint64_t seed;
    uint64_t n;      /* samples per epoch */
    uint64_t layout; /* hash of the shards' token counts (and record length) */
    uint64_t *first; /* first[s] = id of shard s's first sample; first[n_shards] = n */
};

typedef unsigned long long ull;

/* splitmix64 finaliser: the Feistel round function. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dt_sampler_perm(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t i) {
    DT_ASSERT(i < n);
    if (n == 1) return 0;
    /* Domain 2^bits >= n, split into a high half (hb bits) and a low half (lb bits). Each
     * round XORs one half with a keyed function of the other, which is invertible whatever
     * the function, so the network is a bijection of the domain even when hb != lb. */
    int bits = 64 - __builtin_clzll(n - 1);
    if (bits < 2) bits = 2; /* n = 2: walk inside [0, 4) so both orders occur */
    int lb = bits / 2, hb = bits - lb;
    uint64_t lmask = (1ULL << lb) - 1, hmask = (1ULL << hb) - 1;
    uint64_t key[PERM_ROUNDS];
    for (int r = 0; r < PERM_ROUNDS; r++)
        key[r] = dt_rng_u64(seed, DT_RNG_STREAM_PERM, epoch * PERM_ROUNDS + (uint64_t)r);
    /* Cycle walking: re-encrypt until the value lands in [0, n). The walk stays on i's cycle
     * of the domain permutation, so it ends, and the restriction is a bijection of [0, n).
     * The domain is < 2n (4 for n = 2), so it takes fewer than two passes on average. */
    uint64_t x = i;
    do {
        uint64_t hi = x >> lb, lo = x & lmask;
        for (int r = 0; r < PERM_ROUNDS; r++) {
            if (r & 1)
                lo ^= mix64(hi ^ key[r]) & lmask;
            else
                hi ^= mix64(lo ^ key[r]) & hmask;
        }
        x = (hi << lb) | lo;
    } while (x >= n);
    return x;
}

static uint64_t layout_hash(const dt_dataset *ds) {
    int ns = dt_dataset_num_shards(ds);
    uint64_t h = mix64(0x6a09e667f3bcc908ULL + (uint64_t)ns);
    for (int s = 0; s < ns; s++) h = mix64(h ^ dt_dataset_shard_tokens(ds, s)) + 0x9e3779b97f4a7c15ULL;
    /* Records are another sampling of the same token counts. Token streams keep the hash
     * they always had, so their checkpoints still resume. */
    int L = dt_dataset_record_len(ds);
    if (L > 0) h = mix64(h ^ (0x1d3e5a7c00000000ULL + (uint64_t)L));
    /* A loss mask changes what a step trains on: resuming across it is refused. */
    if (dt_dataset_has_loss_mask(ds)) h = mix64(h ^ 0x6d61736b00000001ULL);
    return h;
}

dt_status dt_sampler_init(dt_ctx *ctx, dt_sampler **out, const dt_dataset *ds, int T,
                          uint64_t seed, int shuffle) {
    dt_status st = DT_OK;
    *out = NULL;
    DT_CHECK(dt_dataset_check_seq_len(ctx, ds, T));
    int ns = dt_dataset_num_shards(ds);
    dt_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->first = malloc(((size_t)ns + 1) * sizeof *s->first))) {
        st = dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate the sampler of '%s'", dt_dataset_spec(ds));
        goto fail;
    }
    s->ds = ds;
    s->T = T;
    s->rec_len = dt_dataset_record_len(ds);
    s->shuffle = shuffle != 0;
    s->seed = seed;
    s->n_shards = ns;
    uint64_t n = 0;
    for (int i = 0; i < ns; i++) {
        s->first[i] = n;
        if (s->rec_len) /* whole records: the shard's images, >= 1 */
            n += dt_dataset_shard_tokens(ds, i) / (uint64_t)s->rec_len;
        else
            n += (dt_dataset_shard_tokens(ds, i) - 1) / (uint64_t)T; /* >= 1 by the check above */
    }
    s->first[ns] = n;
    s->n = n;
    s->layout = layout_hash(ds);
    *out = s;
    return DT_OK;
fail:
    dt_sampler_free(s);
    return st;
}

void dt_sampler_free(dt_sampler *s) {
    if (!s) return;
    free(s->first);
    free(s);
}

uint64_t dt_sampler_num_samples(const dt_sampler *s) { return s->n; }
int dt_sampler_seq_len(const dt_sampler *s) { return s->T; }

uint64_t dt_sampler_position(uint64_t cursor, int world, int rank, int B, int k, int b) {
    return cursor + ((uint64_t)k * (uint64_t)world + (uint64_t)rank) * (uint64_t)B + (uint64_t)b;
}

uint64_t dt_sampler_sample_id(const dt_sampler *s, uint64_t p) {
    uint64_t e = p / s->n, i = p % s->n;
    return s->shuffle ? dt_sampler_perm(s->n, s->seed, e, i) : i;
}

void dt_sampler_locate(const dt_sampler *s, uint64_t id, int *shard, uint64_t *start) {
    DT_ASSERT(id < s->n);
    int lo = 0, hi = s->n_shards; /* invariant: first[lo] <= id < first[hi] */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (s->first[mid] <= id)
            lo = mid;
        else
            hi = mid;
    }
    *shard = lo;
    *start = (id - s->first[lo]) * (uint64_t)(s->rec_len ? s->rec_len : s->T);
}

void dt_sampler_fill(const dt_sampler *s, uint64_t cursor, int world, int rank, int B, int accum,
                     int k, int32_t *inputs, int32_t *targets) {
    DT_ASSERT(world > 0 && rank >= 0 && rank < world && B > 0 && accum > 0 && k >= 0 && k < accum);
    size_t T = (size_t)s->T;
    for (int b = 0; b < B; b++) {
        uint64_t id = dt_sampler_sample_id(s, dt_sampler_position(cursor, world, rank, B, k, b));
        int shard;
        uint64_t start;
        dt_sampler_locate(s, id, &shard, &start);
        dt_dataset_read(s->ds, shard, start, T, inputs + (size_t)b * T);
        if (s->rec_len) { /* the label, in every slot */
            int32_t label = dt_dataset_token(s->ds, shard, start + T), *tg = targets + (size_t)b * T;
            for (size_t t = 0; t < T; t++) tg[t] = label;
        } else {
            int32_t *tg = targets + (size_t)b * T;
            dt_dataset_read(s->ds, shard, start + 1, T, tg);
            if (dt_dataset_has_loss_mask(s->ds)) { /* uncounted targets become -1 */
                uint8_t mk[1024];
                for (size_t t0 = 0; t0 < T; t0 += sizeof mk) {
                    size_t c = T - t0 < sizeof mk ? T - t0 : sizeof mk;
                    dt_dataset_read_mask(s->ds, shard, start + 1 + t0, c, mk);
                    for (size_t t = 0; t < c; t++)
                        if (!mk[t]) tg[t0 + t] = -1;
                }
            }
        }
    }
}

uint64_t dt_sampler_count_targets(const dt_sampler *s, uint64_t cursor, int world, int B, int accum) {
    uint64_t total = (uint64_t)world * (uint64_t)B * (uint64_t)accum, T = (uint64_t)s->T;
    if (s->rec_len || !dt_dataset_has_loss_mask(s->ds)) return total * T;
    uint64_t counted = 0;
    uint8_t mk[1024];
    for (uint64_t p = cursor; p < cursor + total; p++) { /* every rank's rows of the step */
        int shard;
        uint64_t start;
        dt_sampler_locate(s, dt_sampler_sample_id(s, p), &shard, &start);
        for (uint64_t t0 = 0; t0 < T; t0 += sizeof mk) {
            size_t c = T - t0 < sizeof mk ? (size_t)(T - t0) : sizeof mk;
            dt_dataset_read_mask(s->ds, shard, start + 1 + t0, c, mk);
            for (size_t t = 0; t < c; t++) counted += mk[t];
        }
    }
    return counted;
}

dt_sampler_state dt_sampler_state_get(const dt_sampler *s, uint64_t cursor) {
    dt_sampler_state st;
    st.cursor = cursor;
    st.seed = s->seed;
    st.shuffle = s->shuffle;
    st.T = s->T;
    st.n_samples = s->n;
    st.layout = s->layout;
    return st;
}

dt_status dt_sampler_state_set(dt_ctx *ctx, dt_sampler *s, const dt_sampler_state *st,
                               uint64_t *cursor) {
    if (st->T != s->T || st->n_samples != s->n || st->layout != s->layout)
        return dt_fail(ctx, DT_ERR_CONFIG,
                       "saved data state does not match dataset '%s': saved %llu samples of "
                       "T=%d (layout %016llx), now %llu samples of T=%d (layout %016llx); the "
                       "data files or the sequence length changed",
                       dt_dataset_spec(s->ds), (ull)st->n_samples, (int)st->T, (ull)st->layout,
                       (ull)s->n, s->T, (ull)s->layout);
    s->seed = st->seed;
    s->shuffle = st->shuffle != 0;
    *cursor = st->cursor;
    return DT_OK;
}
