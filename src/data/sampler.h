/* sampler.h - the distributed sampler: which T+1-token window every row of every rank reads,
 * with exactly-once semantics per epoch across ranks, restarts and world-size changes.
 *
 * Samples are windows of T+1 tokens with stride T inside one shard (a window never crosses
 * a shard boundary; a shard of N tokens gives (N-1)/T samples); sample ids are global over
 * the shards in dataset order. Training progress is ONE number, the cursor: the count of
 * samples consumed by all ranks since the start of training. It does not depend on the world
 * size. Position p is epoch p / n, index p % n, and reads sample perm_e(p % n), where perm_e
 * is a pseudorandom permutation of [0, n) keyed by (seed, epoch) - a Feistel network over
 * the next power of two with cycle walking, O(1) memory - or the identity if shuffle = 0.
 *
 * Record datasets (IDX images, shard.h): a sample is one whole record instead - T must be
 * H*W (dt_sampler_init refuses anything else, naming training.seq_len and the image size),
 * n is the number of images over all shards, and sample id -> (shard, record start). A row
 * of inputs is the image's H*W pixels; the same row of targets holds its label in all T
 * slots (a classifier reads slot 0). Positions, permutation, cursor and exactly-once are
 * the same as for tokens, and the state's layout hash also covers the record length.
 *
 * One optimizer step consumes world * B * accum positions from its cursor; micro-step k of
 * rank r reads row b from position cursor + (k * world + r) * B + b. So 1 rank x 2 micro-steps
 * reads the same rows as 2 ranks x 1 micro-step, and any (world, B, accum) that resumes from
 * a saved cursor continues the same sequence of positions.
 *
 *   dt_sampler *s;
 *   DT_CHECK(dt_sampler_init(ctx, &s, ds, T, seed, 1));
 *   for (k = 0; k < accum; k++) dt_sampler_fill(s, cursor, world, rank, B, accum, k, in, tg);
 *   cursor += (uint64_t)world * B * accum;
 *   dt_sampler_state st = dt_sampler_state_get(s, cursor);        // into the checkpoint
 *   DT_CHECK(dt_sampler_state_set(ctx, s, &st, &cursor));         // on resume
 *   dt_sampler_free(s);
 */
#ifndef DT_SAMPLER_H
#define DT_SAMPLER_H

#include <stdint.h>

#include "core/status.h"
#include "data/shard.h"

typedef struct dt_sampler dt_sampler;

/* What a checkpoint stores for the data order; plain data. */
typedef struct dt_sampler_state {
    uint64_t cursor;    /* samples consumed since the start of training, over all ranks */
    uint64_t seed;      /* permutation key */
    int32_t shuffle;    /* 0 = identity order */
    int32_t T;          /* fingerprint: sequence length ... */
    uint64_t n_samples; /* ... samples per epoch ... */
    uint64_t layout;    /* ... and a hash of the shards' token counts (+ record length) */
} dt_sampler_state;

/* Samples of length T over `ds` (which must outlive the sampler). Fails, naming the shard,
 * if a shard holds fewer than T+1 tokens; for a record dataset unless T = H*W. */
dt_status dt_sampler_init(dt_ctx *ctx, dt_sampler **out, const dt_dataset *ds, int T,
                          uint64_t seed, int shuffle);
void dt_sampler_free(dt_sampler *s); /* NULL is a no-op */

uint64_t dt_sampler_num_samples(const dt_sampler *s); /* n, the epoch size */
int dt_sampler_seq_len(const dt_sampler *s);           /* T */

/* The position of row b of micro-step k of rank `rank` in the step starting at `cursor`. */
uint64_t dt_sampler_position(uint64_t cursor, int world, int rank, int B, int k, int b);

/* The global sample id read at position p (any p: epochs roll over). */
uint64_t dt_sampler_sample_id(const dt_sampler *s, uint64_t p);

/* Where sample `id` (< n) starts: shard index and token offset in it (records: the offset
 * of the record, id-in-shard * (H*W + 1)). */
void dt_sampler_locate(const dt_sampler *s, uint64_t id, int *shard, uint64_t *start);

/* Writes micro-step k's B rows for `rank`: inputs (B,T) and targets (B,T), targets being the
 * inputs shifted by one token (records: the pixels, and the label in all T target slots);
 * with a loss mask, a target whose mask byte is 0 is -1 (not counted by the loss).
 * Pure: the same arguments give the same bits, from any thread. */
void dt_sampler_fill(const dt_sampler *s, uint64_t cursor, int world, int rank, int B, int accum,
                     int k, int32_t *inputs, int32_t *targets);

/* Targets that count in the step starting at `cursor`, over every rank's rows and
 * micro-steps (world x B x accum rows): with a loss mask (shard.h) the tokens whose mask is 1,
 * else all of them. The same on every rank, without communication. */
uint64_t dt_sampler_count_targets(const dt_sampler *s, uint64_t cursor, int world, int B, int accum);

/* The sampler's state with `cursor`, for a checkpoint. */
dt_sampler_state dt_sampler_state_get(const dt_sampler *s, uint64_t cursor);

/* Restores a saved state: refuses (naming both sides) a fingerprint that does not match this
 * dataset and T; otherwise adopts the saved seed and shuffle - the permutation of the epoch
 * in progress must not change - and returns the saved cursor in *cursor. Call it before a
 * dt_loader uses this sampler (its thread reads the seed). */
dt_status dt_sampler_state_set(dt_ctx *ctx, dt_sampler *s, const dt_sampler_state *st,
                               uint64_t *cursor);

/* perm_(seed, epoch)(i) for i < n: a bijection of [0, n) for every (n, seed, epoch). */
uint64_t dt_sampler_perm(uint64_t n, uint64_t seed, uint64_t epoch, uint64_t i);

#endif
