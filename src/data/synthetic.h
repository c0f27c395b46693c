/* synthetic.h - synthetic token batches from the counter RNG: uniform tokens in [0, vocab).
 * Used by benchmarks and tests when no dataset is given; batch k is a pure function of
 * (seed, k), so runs are reproducible whatever the thread or rank layout.
 *
 *   dt_synthetic_batch(seed, vocab, k, B, T, inputs, targets);
 */
#ifndef DT_SYNTHETIC_H
#define DT_SYNTHETIC_H

#include <stdint.h>

/* The k-th micro-batch: B rows of T+1 random tokens, targets shifted by one. */
void dt_synthetic_batch(uint64_t seed, int vocab, uint64_t k, int B, int T, int32_t *inputs,
                        int32_t *targets);

#endif
