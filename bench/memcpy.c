/* bench_memcpy - one thread's memcpy rate over buffers larger than the caches: the yardstick
 * the issue states the shared-memory all-reduce against ("busbw >= 35% of the host's memcpy").
 * Not a test: run it alone on a quiet machine (bench/shm.sh runs it beside bench comm).
 *
 *   build/bench_memcpy [--mib N] [--reps R]      (defaults: 64 MiB, 10)
 *
 * Prints the best and the median of R timed copies of N MiB after one untimed copy, in GB/s of
 * bytes copied (10^9 bytes a second; each byte is read once and written once). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/timer.h"

int main(int argc, char **argv) {
    long mib = 64, reps = 10;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        long *dst = !strcmp(a, "--mib") ? &mib : !strcmp(a, "--reps") ? &reps : NULL;
        if (!dst || !v || (*dst = strtol(v, &end, 10), *end != '\0') || *dst < 1 || *dst > 1 << 16) {
            fprintf(stderr, "bench_memcpy: usage: bench_memcpy [--mib 1..65536] [--reps 1..65536] (bad '%s')\n", a);
            return 2;
        }
        i++;
    }
    size_t bytes = (size_t)mib << 20;
    char *src = malloc(bytes), *dst = malloc(bytes);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!src || !dst || !t) {
        fprintf(stderr, "bench_memcpy: cannot allocate 2 x %ld MiB\n", mib);
        return 1;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    memcpy(dst, src, bytes); /* untimed: pages mapped, caches warm as they will be */
    for (long r = 0; r < reps; r++) {
        src[(size_t)r % bytes] = (char)r; /* each copy moves different data */
        double t0 = dt_now();
        memcpy(dst, src, bytes);
        t[r] = dt_now() - t0;
    }
    volatile char sink = dst[(size_t)(reps - 1) % bytes];
    (void)sink;
    dt_stats s;
    dt_stats_of(&s, t, (int)reps);
    printf("memcpy %ld MiB x %ld: best %.2f GB/s, median %.2f GB/s\n", mib, reps, (double)bytes / s.min / 1e9,
           (double)bytes / s.median / 1e9);
    free(src);
    free(dst);
    free(t);
    return 0;
}
