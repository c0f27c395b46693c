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

typedef struct dt_alloc {
    size_t cur[DT_MEM_NKINDS];
    size_t peak[DT_MEM_NKINDS];
    size_t total_cur, total_peak;
    long n_allocs;
    long fail_at; /* fault injection: the fail_at-th allocation (1-based) fails; 0 = never */
    long failed;  /* injected failures so far, so a test knows the fault fired */
} dt_alloc;

void dt_alloc_init(dt_alloc *a);

/* Allocates `bytes` zeroed bytes aligned to DT_ALIGN and counts them under `kind`. */
dt_status dt_alloc_get(dt_ctx *ctx, dt_alloc *a, dt_mem_kind kind, size_t bytes, void **out);

/* Frees a block from dt_alloc_get; `bytes` and `kind` must match. NULL is a no-op. */
void dt_alloc_put(dt_alloc *a, dt_mem_kind kind, void *p, size_t bytes);

const char *dt_mem_kind_name(dt_mem_kind kind);

#endif
