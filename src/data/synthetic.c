#include "data/synthetic.h"

#include "core/rng.h"

#define DT_RNG_STREAM_DATA 0xda7aULL

void dt_synthetic_batch(uint64_t seed, int vocab, uint64_t k, int B, int T, int32_t *inputs,
                        int32_t *targets) {
    for (int b = 0; b < B; b++) {
        uint64_t row = k * (uint64_t)B + (uint64_t)b;
        for (int t = 0; t <= T; t++) {
            int32_t v = (int32_t)dt_rng_below(seed, DT_RNG_STREAM_DATA,
                                              row * (uint64_t)(T + 1) + (uint64_t)t, (uint64_t)vocab);
            if (t < T) inputs[b * T + t] = v;
            if (t > 0) targets[b * T + t - 1] = v;
        }
    }
}
