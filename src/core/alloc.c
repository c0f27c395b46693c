#include "core/alloc.h"

#include <stdlib.h>
#include <string.h>

static void *host_alloc(size_t bytes) {
    size_t rounded = (bytes + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
    if (rounded == 0) rounded = DT_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, DT_ALIGN, rounded) != 0 || p == NULL) return NULL;
    memset(p, 0, rounded);
    return p;
}

static void host_free(void *p, size_t bytes) {
    (void)bytes;
    free(p);
}

const dt_mem_ops dt_mem_host = {"cpu", host_alloc, host_free};
static const dt_mem_ops *g_default = &dt_mem_host;

void dt_alloc_set_default(const dt_mem_ops *mem) { g_default = mem ? mem : &dt_mem_host; }

void dt_alloc_init(dt_alloc *a) {
    memset(a, 0, sizeof *a);
    a->mem = g_default;
}

dt_status dt_alloc_get(dt_ctx *ctx, dt_alloc *a, dt_mem_kind kind, size_t bytes, void **out) {
    DT_ASSERT(kind >= 0 && kind < DT_MEM_NKINDS);
    *out = NULL;
    a->n_allocs++;
    if (a->fail_at > 0 && a->n_allocs == a->fail_at) {
        a->failed++;
        return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate %zu bytes for %s (injected failure)",
                       bytes, dt_mem_kind_name(kind));
    }
    if (!a->mem) a->mem = g_default; /* a zero-initialised dt_alloc */
    void *p = a->mem->alloc(bytes);
    if (p == NULL)
        return dt_fail(ctx, DT_ERR_NOMEM, "cannot allocate %zu bytes for %s (%s memory)", bytes,
                       dt_mem_kind_name(kind), a->mem->owner);
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
    a->mem->free(p, bytes);
}

const char *dt_mem_kind_name(dt_mem_kind kind) {
    static const char *names[DT_MEM_NKINDS] = {"params", "grads", "optimizer", "activations",
                                               "comm", "other"};
    return (kind >= 0 && kind < DT_MEM_NKINDS) ? names[kind] : "?";
}
