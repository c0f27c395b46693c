#include "bench/comm_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

double dt_comm_busbw_factor(const char *op, int n) {
    if (!strncmp(op, "allreduce", 9)) return 2.0 * (n - 1) / n;
    if (!strcmp(op, "broadcast")) return 1.0;
    return (double)(n - 1) / n; /* reduce_scatter, allgather */
}

/* Rank r's value at i: small integers, so every sum is exact in float and checkable. */
static float val(int r, size_t i) { return (float)((r + 1) * ((int)(i % 31) + 1)); }
static float sum_val(int n, size_t i) { return (float)(n * (n + 1) / 2 * ((int)(i % 31) + 1)); }

/* dtrain's own collectives (ordered all-reduce and reduce-scatter, all-gather) run over the
 * node's shared memory when the world is one node (comm.h dt_comm_set_shm); their *_mpi rows
 * are the same calls with it off, measured in the same run. */
enum { OP_AR, OP_ARO, OP_ARO_MPI, OP_RS, OP_RSO, OP_RSO_MPI, OP_AG, OP_AG_MPI, OP_BC, OP_N };
static const char *const op_names[OP_N] = {"allreduce",      "allreduce_ordered",      "allreduce_ordered_mpi",
                                           "reduce_scatter", "reduce_scatter_ordered", "reduce_scatter_ordered_mpi",
                                           "allgather",      "allgather_mpi",          "broadcast"};
static int op_forces_mpi(int op) { return op == OP_ARO_MPI || op == OP_RSO_MPI || op == OP_AG_MPI; }

/* One collective on `count` elements per rank; returns the number of wrong elements. */
static dt_status run_op(dt_ctx *ctx, dt_comm *c, int op, size_t count, float *buf, float *aux,
                        size_t *cnt, size_t *off, int check, long *wrong) {
    int n = dt_comm_size(c, DT_GROUP_WORLD), me = dt_comm_rank(c, DT_GROUP_WORLD);
    *wrong = 0;
    switch (op) {
    case OP_AR:
    case OP_ARO:
    case OP_ARO_MPI:
        if (check) /* inputs are written for the checked run only: the timed runs time the collective */
            for (size_t i = 0; i < count; i++) buf[i] = val(me, i);
        if (op == OP_AR) DT_CHECK(dt_comm_allreduce(ctx, c, DT_GROUP_WORLD, buf, count, DT_F32, DT_SUM));
        else DT_CHECK(dt_comm_allreduce_ordered(ctx, c, DT_GROUP_WORLD, buf, count, aux));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += buf[i] != sum_val(n, i);
        break;
    case OP_RS: /* every rank sends n x count, receives its count */
        for (int r = 0; r < n; r++) cnt[r] = count;
        if (check)
            for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = val(me, i);
        DT_CHECK(dt_comm_reduce_scatter(ctx, c, DT_GROUP_WORLD, buf, aux, cnt));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += aux[i] != sum_val(n, (size_t)me * count + i);
        break;
    case OP_RSO:
    case OP_RSO_MPI:
        for (int r = 0; r < n; r++) cnt[r] = count, off[r] = (size_t)r * count;
        if (check)
            for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = val(me, i);
        /* scratch: n x count after the output */
        DT_CHECK(dt_comm_reduce_scatter_ordered(ctx, c, DT_GROUP_WORLD, buf, cnt, off, aux, aux + count));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += aux[i] != sum_val(n, (size_t)me * count + i);
        break;
    case OP_AG:
    case OP_AG_MPI:
        for (int r = 0; r < n; r++) cnt[r] = count;
        if (check)
            for (size_t i = 0; i < count; i++) buf[(size_t)me * count + i] = val(me, i);
        DT_CHECK(dt_comm_allgather(ctx, c, DT_GROUP_WORLD, buf, cnt));
        if (check)
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) *wrong += buf[(size_t)r * count + i] != val(r, i);
        break;
    case OP_BC:
        if (check)
            for (size_t i = 0; i < count; i++) buf[i] = me == 0 ? val(0, i) : -1.0f;
        DT_CHECK(dt_comm_broadcast(ctx, c, DT_GROUP_WORLD, buf, count * sizeof(float), 0));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += buf[i] != val(0, i);
        break;
    }
    return DT_OK;
}

dt_status dt_bench_comm(dt_ctx *ctx, dt_comm *c, const dt_comm_bench_opts *o, FILE *out) {
    int n = dt_comm_size(c, DT_GROUP_WORLD), me = dt_comm_rank(c, DT_GROUP_WORLD);
    if (o->min_bytes < 4 || o->max_bytes < o->min_bytes || o->iters < 1 || o->warmup < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "bench comm: need 4 <= --min-bytes <= --max-bytes and --iters >= 1");
    size_t maxc = o->max_bytes / 4;
    /* zeros: the timed runs reduce whatever the buffers hold (no denormals, no NaN) */
    float *buf = calloc(maxc * (size_t)n, sizeof(float)), *aux = calloc(maxc * ((size_t)n + 1), sizeof(float));
    size_t *cnt = malloc(2 * (size_t)n * sizeof(size_t));
    if (!buf || !aux || !cnt) {
        free(buf);
        free(aux);
        free(cnt);
        return dt_fail(ctx, DT_ERR_NOMEM, "bench comm: cannot allocate %zu bytes per buffer", maxc * (size_t)n * 4);
    }
    dt_status st = DT_OK;
    long total_wrong = 0;
    const int shm = dt_comm_set_shm(c, 1); /* on by default where it exists */
    if (me == 0 && out) {
        fprintf(out, "# dtrain bench comm: %d ranks on %d node(s), %s backend, float32, sum; %d warm-up + %d timed iterations\n",
                n, dt_comm_num_nodes(c), dt_comm_backend(c), o->warmup, o->iters);
        fprintf(out, "# busbw = algbw x factor: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1 (nccl-tests)\n");
        fprintf(out, "# allreduce, reduce_scatter, broadcast: the MPI library's; allreduce_ordered, reduce_scatter_ordered, "
                     "allgather: dtrain's, %s\n",
                shm ? "over the node's shared memory (*_mpi rows: the same calls over MPI)" : "over MPI");
        fprintf(out, "# %-26s %12s %12s %10s %10s %10s %7s\n", "collective", "size(B)", "count", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (int op = 0; op < OP_N && st == DT_OK; op++) {
        if (op_forces_mpi(op) && !shm) continue; /* the plain rows already are MPI */
        dt_comm_set_shm(c, !op_forces_mpi(op));
        for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && st == DT_OK; bytes *= 2) {
            size_t count = bytes / 4;
            long wrong = 0;
            for (int w = 0; w < o->warmup && st == DT_OK; w++)
                st = run_op(ctx, c, op, count, buf, aux, cnt, cnt + n, 0, &wrong);
            if (st == DT_OK) st = dt_comm_barrier(ctx, c, DT_GROUP_WORLD);
            double t0 = dt_now();
            for (int it = 0; it < o->iters && st == DT_OK; it++)
                st = run_op(ctx, c, op, count, buf, aux, cnt, cnt + n, 0, &wrong);
            double t = (dt_now() - t0) / o->iters;
            if (st == DT_OK) st = run_op(ctx, c, op, count, buf, aux, cnt, cnt + n, 1, &wrong); /* checked */
            double tw[2] = {t, (double)wrong};
            if (st == DT_OK) st = dt_comm_allreduce(ctx, c, DT_GROUP_WORLD, tw, 2, DT_F64, DT_MAX);
            if (st != DT_OK) break;
            /* nccl-tests' "size": the per-rank buffer for all-reduce / broadcast, the whole
             * (n x part) for reduce-scatter and all-gather. */
            const int whole = op == OP_RS || op == OP_RSO || op == OP_RSO_MPI || op == OP_AG || op == OP_AG_MPI;
            double size = whole ? (double)bytes * n : (double)bytes;
            double algbw = size / tw[0] / 1e9;
            total_wrong += (long)tw[1];
            if (me == 0 && o->rows) {
                cJSON *row = cJSON_CreateObject();
                cJSON_AddStringToObject(row, "op", op_names[op]);
                cJSON_AddNumberToObject(row, "bytes", size);
                cJSON_AddNumberToObject(row, "count", (double)(whole ? count * (size_t)n : count));
                cJSON_AddNumberToObject(row, "time_us", tw[0] * 1e6);
                cJSON_AddNumberToObject(row, "algbw_gbs", algbw);
                cJSON_AddNumberToObject(row, "busbw_gbs", algbw * dt_comm_busbw_factor(op_names[op], n));
                cJSON_AddNumberToObject(row, "wrong", tw[1]);
                cJSON_AddItemToArray(o->rows, row);
            }
            if (me == 0 && out)
                fprintf(out, "  %-26s %12.0f %12zu %10.1f %10.3f %10.3f %7ld\n", op_names[op], size,
                        whole ? count * (size_t)n : count, tw[0] * 1e6, algbw,
                        algbw * dt_comm_busbw_factor(op_names[op], n), (long)tw[1]);
        }
    }
    dt_comm_set_shm(c, shm);
    free(buf);
    free(aux);
    free(cnt);
    if (st == DT_OK && total_wrong > 0)
        st = dt_fail(ctx, DT_ERR_BACKEND, "bench comm: %ld elements arrived wrong (see #wrong)", total_wrong);
    return st;
}
