/* Node-local collectives over a shared-memory segment (shm.h). */
#include "comm/shm.h"

#include "ops/ops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LINE 64 /* one arrival counter per cache line */
#define ROUND_BYTES ((size_t)256 << 10) /* data per slot per round (below) */

struct dt_shm {
    int me, P;
    char *base;
    size_t bytes;
    _Atomic uint32_t *ctr[64]; /* arrival counters (futex words), one per rank */
    char *slot[64];            /* one DT_SHM_SLOT_BYTES slot per rank */
    uint32_t gen;              /* barriers passed so far */
    int spin;                  /* pause iterations before sleeping on the futex */
    float *prefix;             /* the chain's incoming running sum (half a round) */
};

static size_t header_bytes(int ranks) { return ((size_t)ranks * LINE + 4095) / 4096 * 4096; }

size_t dt_shm_segment_bytes(int ranks) { return header_bytes(ranks) + (size_t)ranks * DT_SHM_SLOT_BYTES; }

static dt_status map(dt_ctx *ctx, dt_shm **out, int fd, int me, int ranks, const char *name) {
    size_t bytes = dt_shm_segment_bytes(ranks);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED)
        return dt_fail(ctx, DT_ERR_IO, "shared memory /dev/shm/%s: mmap of %zu bytes: %s", name, bytes, strerror(err));
    dt_shm *s = calloc(1, sizeof *s);
    if (s) s->prefix = malloc(ROUND_BYTES / 2 + sizeof(float));
    if (!s || !s->prefix) {
        if (s) free(s);
        munmap(p, bytes);
        return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    }
    s->me = me, s->P = ranks, s->base = p, s->bytes = bytes;
    /* More ranks than cores: a spinning waiter holds the core its peer needs, so sleep at once. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->spin = cores > 0 && ranks > cores ? 0 : 2000;
    for (int r = 0; r < ranks; r++) {
        s->ctr[r] = (_Atomic uint32_t *)(s->base + (size_t)r * LINE);
        s->slot[r] = s->base + header_bytes(ranks) + (size_t)r * DT_SHM_SLOT_BYTES;
    }
    *out = s;
    return DT_OK;
}

dt_status dt_shm_create(dt_ctx *ctx, dt_shm **out, int ranks, char *name) {
    static _Atomic int serial;
    if (ranks < 1 || ranks > 64) return dt_fail(ctx, DT_ERR_CONFIG, "shared memory: %d ranks on a node (at most 64)", ranks);
    dt_shm_sweep_stale();
    snprintf(name, 64, DT_SHM_PREFIX "%ld-%d", (long)getpid(), atomic_fetch_add(&serial, 1));
    char path[80];
    snprintf(path, sizeof path, "/%s", name);
    int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return dt_fail(ctx, DT_ERR_IO, "shared memory /dev/shm/%s: %s", name, strerror(errno));
    if (ftruncate(fd, (off_t)dt_shm_segment_bytes(ranks)) != 0) {
        int err = errno;
        close(fd);
        shm_unlink(path);
        return dt_fail(ctx, DT_ERR_IO, "shared memory /dev/shm/%s: cannot size it to %zu bytes: %s", name,
                       dt_shm_segment_bytes(ranks), strerror(err));
    }
    dt_status st = map(ctx, out, fd, 0, ranks, name);
    if (st != DT_OK) shm_unlink(path);
    return st;
}

dt_status dt_shm_attach(dt_ctx *ctx, dt_shm **out, int me, int ranks, const char *name) {
    char path[80];
    snprintf(path, sizeof path, "/%s", name);
    int fd = shm_open(path, O_RDWR, 0600);
    if (fd < 0) return dt_fail(ctx, DT_ERR_IO, "shared memory /dev/shm/%s: %s", name, strerror(errno));
    struct stat stt;
    if (fstat(fd, &stt) != 0 || (size_t)stt.st_size < dt_shm_segment_bytes(ranks)) {
        close(fd);
        return dt_fail(ctx, DT_ERR_IO, "shared memory /dev/shm/%s: smaller than %zu bytes", name,
                       dt_shm_segment_bytes(ranks));
    }
    return map(ctx, out, fd, me, ranks, name);
}

void dt_shm_unlink(const char *name) {
    char path[80];
    snprintf(path, sizeof path, "/%s", name);
    shm_unlink(path);
}

void dt_shm_free(dt_shm *s) {
    if (!s) return;
    munmap(s->base, s->bytes);
    free(s->prefix);
    free(s);
}

int dt_shm_sweep_stale(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int removed = 0;
    const size_t np = strlen(DT_SHM_PREFIX);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, DT_SHM_PREFIX, np)) continue;
        char *end;
        long pid = strtol(e->d_name + np, &end, 10);
        if (pid <= 0 || *end != '-') continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to judge) */
        char path[300];
        snprintf(path, sizeof path, "/%s", e->d_name);
        if (shm_unlink(path) == 0) removed++;
    }
    closedir(d);
    return removed;
}

/* ---- synchronisation: a barrier of arrival counters. Rank r stores the barrier's generation
 * in its counter (release: its slot writes before it) and wakes waiters; a rank leaves once
 * every counter reached the generation (acquire: the others' slot writes visible). Counters
 * differ by at most one generation, compared modulo 2^32. Waiting spins briefly, then sleeps
 * on the futex (cross-process: not FUTEX_PRIVATE), re-checking at least every millisecond. */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void wait_for(_Atomic uint32_t *w, uint32_t gen, int spins) {
    for (int spin = 0;; spin++) {
        uint32_t v = atomic_load_explicit(w, memory_order_acquire);
        if ((int32_t)(v - gen) >= 0) return;
        if (spin < spins) {
            cpu_relax();
            continue;
        }
        struct timespec ts = {0, 1000000};
        syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
    }
}

static void barrier(dt_shm *s) {
    uint32_t gen = ++s->gen;
    atomic_store_explicit(s->ctr[s->me], gen, memory_order_release);
    syscall(SYS_futex, (uint32_t *)s->ctr[s->me], FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    for (int r = 0; r < s->P; r++)
        if (r != s->me) wait_for(s->ctr[r], gen, s->spin);
}

/* ---- collectives. Data moves in rounds of at most ROUND_BYTES per slot, so what one
 * rank writes is still in the shared cache when the others read it; rounds alternate between
 * the two halves of every slot (the parity counts rounds over the segment's life), so a round
 * needs two barriers: a rank writes a half only after every rank finished the round before
 * the previous one, which it did before arriving at the previous round's barriers. */

#define BLK 1024 /* floats summed per pass (a stack block in L1) */

static void split(size_t n, int parts, int r, size_t *off, size_t *cnt) {
    size_t q = n / (size_t)parts, rem = n % (size_t)parts;
    *cnt = q + ((size_t)r < rem);
    *off = (size_t)r * q + ((size_t)r < rem ? (size_t)r : rem);
}

/* The half of the slots that the round starting now uses (every round has two barriers). */
static size_t round_half(const dt_shm *s) { return (s->gen / 2 % 2) * (DT_SHM_SLOT_BYTES / 2); }

/* dst[i] (and pub[i] when non-NULL) = src[0][i] + src[1][i] + ... in rank order, n floats;
 * src[me] may be dst's own memory (read before written, block by block). */
static void sum_ordered(float *dst, float *pub, const float *const *src, size_t n, int P) {
    float acc[BLK];
    for (size_t b = 0; b < n; b += BLK) {
        size_t k = n - b < BLK ? n - b : BLK;
        memcpy(acc, src[0] + b, k * sizeof(float));
        for (int r = 1; r < P; r++) {
            const float *x = src[r] + b;
            for (size_t i = 0; i < k; i++) acc[i] += x[i];
        }
        memcpy(dst + b, acc, k * sizeof(float));
        if (pub) memcpy(pub + b, acc, k * sizeof(float));
    }
}

void dt_shm_allreduce_ordered(dt_shm *s, float *buf, size_t n) { dt_shm_allreduce_ordered_chain(s, buf, n, NULL); }

void dt_shm_allreduce_ordered_chain(dt_shm *s, float *buf, size_t n, const dt_shm_chain *ch) {
    const size_t cap = ROUND_BYTES / sizeof(float);
    const int P = s->P, me = s->me;
    const float *src[65];
    float *prefix = s->prefix; /* my part of a round: at most half of it (P >= 2) */
    for (size_t i0 = 0; i0 < n; i0 += cap) {
        size_t m = n - i0 < cap ? n - i0 : cap, off, cnt, h = round_half(s);
        float *slot[64] = {0};
        for (int r = 0; r < P; r++) slot[r] = (float *)(s->slot[r] + h);
        /* the parts the others own, into my slot (they never read my own part) */
        for (int r = 0; r < P; r++) {
            if (r == me) continue;
            split(m, P, r, &off, &cnt);
            memcpy(slot[me] + off, buf + i0 + off, cnt * sizeof(float));
        }
        barrier(s);
        /* my part: my own contribution from my buffer, the others' from their slots; the sum
         * into my buffer and my slot (only I read my part of any slot before this barrier) */
        split(m, P, me, &off, &cnt);
        int k = 0;
        if (ch && ch->prefix(ch->ud, prefix, cnt)) src[k++] = prefix; /* the nodes before mine */
        for (int r = 0; r < P; r++) src[k++] = r == me ? buf + i0 + off : slot[r] + off;
        if (ch) {
            sum_ordered(buf + i0 + off, NULL, src, cnt, k);
            ch->finish(ch->ud, buf + i0 + off, cnt); /* now the total over every node */
            memcpy(slot[me] + off, buf + i0 + off, cnt * sizeof(float));
        } else {
            sum_ordered(buf + i0 + off, slot[me] + off, src, cnt, k);
        }
        barrier(s);
        for (int r = 0; r < P; r++) {
            if (r == me) continue;
            split(m, P, r, &off, &cnt);
            memcpy(buf + i0 + off, slot[r] + off, cnt * sizeof(float)); /* this round's half */
        }
    }
}

void dt_shm_reduce_scatter_ordered(dt_shm *s, const float *buf, const size_t *counts, const size_t *displs,
                                   float *out) {
    const int P = s->P, me = s->me;
    const size_t per = ROUND_BYTES / sizeof(float) / (size_t)P; /* floats per owner per round */
    const float *src[64];
    size_t most = 0;
    for (int r = 0; r < P; r++) most = counts[r] > most ? counts[r] : most;
    for (size_t t0 = 0; t0 < most; t0 += per) {
        const size_t h = round_half(s);
        for (int r = 0; r < P; r++) {
            size_t len = counts[r] > t0 ? (counts[r] - t0 < per ? counts[r] - t0 : per) : 0;
            if (r != me) memcpy((float *)(s->slot[me] + h) + (size_t)r * per, buf + displs[r] + t0, len * sizeof(float));
        }
        barrier(s);
        size_t len = counts[me] > t0 ? (counts[me] - t0 < per ? counts[me] - t0 : per) : 0;
        for (int r = 0; r < P; r++)
            src[r] = r == me ? buf + displs[me] + t0 : (const float *)(s->slot[r] + h) + (size_t)me * per;
        sum_ordered(out + t0, NULL, src, len, P);
        barrier(s);
    }
}

void dt_shm_reduce_scatter_ordered_lp(dt_shm *s, dt_dtype t, const float *buf, const size_t *counts,
                                      const size_t *displs, uint16_t *out) {
    const int P = s->P, me = s->me;
    const size_t per = ROUND_BYTES / sizeof(uint16_t) / (size_t)P; /* values per owner per round */
    size_t most = 0;
    for (int r = 0; r < P; r++) most = counts[r] > most ? counts[r] : most;
    float acc[BLK], x[BLK];
    uint16_t own[BLK];
    for (size_t t0 = 0; t0 < most; t0 += per) {
        const size_t h = round_half(s);
        for (int r = 0; r < P; r++) { /* every owner's piece rounded into my slot (mine too: read back below) */
            size_t len = counts[r] > t0 ? (counts[r] - t0 < per ? counts[r] - t0 : per) : 0;
            if (r != me) dt_to_lowp(t, (uint16_t *)(s->slot[me] + h) + (size_t)r * per, buf + displs[r] + t0, len);
        }
        barrier(s);
        size_t len = counts[me] > t0 ? (counts[me] - t0 < per ? counts[me] - t0 : per) : 0;
        for (size_t b = 0; b < len; b += BLK) {
            size_t k = len - b < BLK ? len - b : BLK;
            dt_to_lowp(t, own, buf + displs[me] + t0 + b, k);
            for (int r = 0; r < P; r++) { /* widened (exactly) and summed in rank order */
                const uint16_t *v = r == me ? own : (const uint16_t *)(s->slot[r] + h) + (size_t)me * per + b;
                dt_from_lowp(t, r == 0 ? acc : x, v, k);
                if (r > 0)
                    for (size_t i = 0; i < k; i++) acc[i] += x[i];
            }
            dt_to_lowp(t, out + t0 + b, acc, k);
        }
        barrier(s);
    }
}

void dt_shm_allgatherv(dt_shm *s, void *buf, const size_t *counts, const size_t *displs, size_t esize) {
    const int P = s->P, me = s->me;
    const size_t per = ROUND_BYTES / esize;
    char *b = buf;
    size_t most = 0;
    for (int r = 0; r < P; r++) most = counts[r] > most ? counts[r] : most;
    for (size_t t0 = 0; t0 < most; t0 += per) {
        size_t len = counts[me] > t0 ? (counts[me] - t0 < per ? counts[me] - t0 : per) : 0;
        const size_t h = round_half(s);
        memcpy(s->slot[me] + h, b + (displs[me] + t0) * esize, len * esize);
        barrier(s);
        for (int r = 0; r < P; r++) {
            if (r == me) continue;
            size_t lr = counts[r] > t0 ? (counts[r] - t0 < per ? counts[r] - t0 : per) : 0;
            memcpy(b + (displs[r] + t0) * esize, s->slot[r] + h, lr * esize);
        }
        barrier(s);
    }
}
