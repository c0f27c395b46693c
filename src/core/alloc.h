/* alloc.h - the counting allocator. Every large buffer (one slab per lifetime) goes through
 * it, so the benchmark can report bytes per kind and tests can inject allocation failures.
 *
 *   dt_alloc a; dt_alloc_init(&a);
 *   float *p; DT_CHECK(dt_alloc_get(ctx, &a, DT_MEM_PARAMS, n * sizeof(float), (void **)&p));
 *   ...
 *   dt_alloc_put(&a, DT_MEM_PARAMS, p, n * sizeof(float));
 */
#ifndef DT_ALLOC_H
#define DT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum dt_mem_kind {
    DT_MEM_PARAMS = 0,
    DT_MEM_GRADS,
    DT_MEM_OPTIM,
    DT_MEM_ACTS,
    DT_MEM_COMM,    /* communication buffers (bucket scratch, reduce-scatter rounds) */
    DT_MEM_OTHER,
    DT_MEM_NKINDS
} dt_mem_kind;

#define DT_ALIGN 64

/* Where a dt_alloc's blocks come from: the memory of a compute backend (ops/backend.h), named
 * by its owner. alloc returns `bytes` zeroed bytes aligned to DT_ALIGN, or NULL. */
typedef struct dt_mem_ops {
    const char *owner;
    void *(*alloc)(size_t bytes);
    void (*free)(void *p, size_t bytes);
} dt_mem_ops;

/* Host memory (posix_memalign, zeroed): the CPU backend's. */
extern const dt_mem_ops dt_mem_host;
/* The memory dt_alloc_init gives from now on (the active backend's: dt_backend_use sets it). */
void dt_alloc_set_default(const dt_mem_ops *mem);

typedef struct dt_alloc {
    const dt_mem_ops *mem; /* the backend memory every block of this allocator is */
    size_t cur[DT_MEM_NKINDS];
    size_t peak[DT_MEM_NKINDS];
    size_t total_cur, total_peak;
    long n_allocs;
    long fail_at; /* fault injection: the fail_at-th allocation (1-based) fails; 0 = never */
    long failed;  /* injected failures so far, so a test knows the fault fired */
} dt_alloc;

/* Zeroed counters; blocks from the default memory (dt_alloc_set_default). */
void dt_alloc_init(dt_alloc *a);

/* Allocates `bytes` zeroed bytes aligned to DT_ALIGN and counts them under `kind`. */
dt_status dt_alloc_get(dt_ctx *ctx, dt_alloc *a, dt_mem_kind kind, size_t bytes, void **out);

/* Frees a block from dt_alloc_get; `bytes` and `kind` must match. NULL is a no-op. */
void dt_alloc_put(dt_alloc *a, dt_mem_kind kind, void *p, size_t bytes);

const char *dt_mem_kind_name(dt_mem_kind kind);

#endif
