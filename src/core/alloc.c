#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

void dt_alloc_init(dt_alloc *a) { memset(a, 0, sizeof *a); }

dt_status dt_alloc_get(dt_ctx *ctx, dt_alloc *a, dt_mem_kind kind, size_t bytes, void **out) {
    DT_ASSERT(kind >= 0 && kind < DT_MEM_NKINDS);
    *out = NULL;
    a->n_allocs++;
    if (a->fail_at > 0 && a->n_allocs == a->fail_at) {
        a->failed++;
        return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate %zu bytes for %s (injected failure)",
                       bytes, dt_mem_kind_name(kind));
    }
    size_t rounded = (bytes + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
    if (rounded == 0) rounded = DT_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, DT_ALIGN, rounded) != 0 || p == NULL)
        return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate %zu bytes for %s", bytes,
                       dt_mem_kind_name(kind));
    memset(p, 0, rounded);
    a->cur[kind] += bytes;
    if (a->cur[kind] > a->peak[kind]) a->peak[kind] = a->cur[kind];
    a->total_cur += bytes;
    if (a->total_cur > a->total_peak) a->total_peak = a->total_cur;
    *out = p;
    return DT_OK;
}

void dt_alloc_put(dt_alloc *a, dt_mem_kind kind, void *p, size_t bytes) {
    if (p == NULL) return;
    DT_ASSERT(a->cur[kind] >= bytes);
    a->cur[kind] -= bytes;
    a->total_cur -= bytes;
    free(p);
}

const char *dt_mem_kind_name(dt_mem_kind kind) {
    static const char *names[DT_MEM_NKINDS] = {"params", "grads", "optimizer", "activations",
                                               "comm", "other"};
    return (kind >= 0 && kind < DT_MEM_NKINDS) ? names[kind] : "?";
}
