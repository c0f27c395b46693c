/* rng.h - counter-based random numbers: value = f(seed, stream, counter), no hidden state.
 *
 * Any element of any tensor can be drawn independently, so initialisation and synthetic data
 * are identical whatever the thread count, and an RNG "state" to checkpoint is just a counter.
 *
 *   float x = dt_rng_normal(seed, DT_RNG_STREAM_INIT + tensor_id, i);
 */
#ifndef DT_RNG_H
#define DT_RNG_H

#include <stdint.h>

/* 64 random bits for (seed, stream, counter). */
uint64_t dt_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);

/* Uniform in [0, 1) with 24 bits of resolution. */
float dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* Standard normal (Box-Muller on two independent uniforms). */
float dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);

/* Uniform integer in [0, n) (n > 0), negligible bias for n << 2^64. */
uint64_t dt_rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n);

#endif
