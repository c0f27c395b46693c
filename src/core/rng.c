#include "core/rng.h"

#include <math.h>

/* splitmix64 finaliser: a bijective mix with full avalanche. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t dt_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    /* Two rounds keyed by seed and stream: distinct (seed, stream) give unrelated sequences. */
    uint64_t k = mix64(seed * 0x9e3779b97f4a7c15ULL + mix64(stream + 0x632be59bd9b4e019ULL));
    return mix64(k ^ mix64(counter + 0x9e3779b97f4a7c15ULL));
}

float dt_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(dt_rng_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

float dt_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r = dt_rng_u64(seed, stream, counter);
    /* Two 32-bit halves -> two uniforms; u1 in (0, 1] avoids log(0). */
    double u1 = ((double)(r >> 32) + 1.0) / 4294967296.0;
    double u2 = (double)(r & 0xffffffffULL) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t dt_rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n) {
    /* Lemire's multiply-shift: maps 64 random bits to [0, n). */
    return (uint64_t)(((unsigned __int128)dt_rng_u64(seed, stream, counter) * n) >> 64);
}
