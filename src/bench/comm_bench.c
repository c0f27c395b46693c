#include "bench/comm_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/timer.h"

double dt_comm_busbw_factor(const char *op, int n) {
    if (!strncmp(op, "allreduce", 9)) return 2.0 * (n - 1) / n;
    if (!strcmp(op, "broadcast") || !strcmp(op, "pingpong")) return 1.0;
    return (double)(n - 1) / n; /* reduce_scatter, allgather */
}

/* Rank r's value at i: small integers, so every sum is exact in float and checkable. */
static float val(int r, size_t i) { return (float)((r + 1) * ((int)(i % 31) + 1)); }
static float sum_val(int n, size_t i) { return (float)(n * (n + 1) / 2 * ((int)(i % 31) + 1)); }

/* dtrain's own collectives (ordered all-reduce and reduce-scatter, all-gather) run over the
 * node's shared memory when the world is one node (comm.h dt_comm_set_shm); their *_mpi rows
 * are the same calls with it off, measured in the same run. With several nodes the world's
 * ordered all-reduce is the hierarchical one where the layout allows (comm.h
 * dt_comm_set_hierarchical); allreduce_ordered_flat is the same call with it off. */
/* pingpong: the point-to-point link of pipeline stages (dt_comm_send / dt_comm_recv): rank 0
 * of the group sends a message to rank 1, which sends it back; the row's time is half the round
 * trip, one message (the other ranks of the group wait at the row's barrier). */
/* alltoall: expert parallelism's exchange of token rows (dt_comm_alltoallv, as train/ep.c
 * calls it): every rank sends `count` elements to every rank of the group (itself included);
 * the row's size is a rank's whole send buffer, n x count. */
enum { OP_AR, OP_ARO, OP_ARO_MPI, OP_ARO_FLAT, OP_RS, OP_RSO, OP_RSO_MPI, OP_AG, OP_AG_MPI, OP_BC, OP_PP, OP_A2A, OP_N };
static const char *const op_names[OP_N] = {"allreduce",      "allreduce_ordered",      "allreduce_ordered_mpi",
                                           "allreduce_ordered_flat", "reduce_scatter", "reduce_scatter_ordered",
                                           "reduce_scatter_ordered_mpi", "allgather", "allgather_mpi", "broadcast",
                                           "pingpong", "alltoall"};
static int op_forces_mpi(int op) { return op == OP_ARO_MPI || op == OP_RSO_MPI || op == OP_AG_MPI; }
static const char *const group_names[DT_GROUP_N] = {"world", "node", "cross"};

/* One collective over group g on `count` elements per rank; counts the wrong elements. */
static dt_status run_op(dt_ctx *ctx, dt_comm *c, dt_group g, int op, size_t count, float *buf, float *aux,
                        size_t *cnt, size_t *off, int check, long *wrong) {
    int n = dt_comm_size(c, g), me = dt_comm_rank(c, g);
    *wrong = 0;
    switch (op) {
    case OP_AR:
    case OP_ARO:
    case OP_ARO_MPI:
    case OP_ARO_FLAT:
        if (check) /* inputs are written for the checked run only: the timed runs time the collective */
            for (size_t i = 0; i < count; i++) buf[i] = val(me, i);
        if (op == OP_AR) DT_CHECK(dt_comm_allreduce(ctx, c, g, buf, count, DT_F32, DT_SUM));
        else DT_CHECK(dt_comm_allreduce_ordered(ctx, c, g, buf, count, aux));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += buf[i] != sum_val(n, i);
        break;
    case OP_RS: /* every rank sends n x count, receives its count */
        for (int r = 0; r < n; r++) cnt[r] = count;
        if (check)
            for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = val(me, i);
        DT_CHECK(dt_comm_reduce_scatter(ctx, c, g, buf, aux, cnt));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += aux[i] != sum_val(n, (size_t)me * count + i);
        break;
    case OP_RSO:
    case OP_RSO_MPI:
        for (int r = 0; r < n; r++) cnt[r] = count, off[r] = (size_t)r * count;
        if (check)
            for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = val(me, i);
        /* scratch: n x count after the output */
        DT_CHECK(dt_comm_reduce_scatter_ordered(ctx, c, g, buf, cnt, off, aux, aux + count));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += aux[i] != sum_val(n, (size_t)me * count + i);
        break;
    case OP_AG:
    case OP_AG_MPI:
        for (int r = 0; r < n; r++) cnt[r] = count;
        if (check)
            for (size_t i = 0; i < count; i++) buf[(size_t)me * count + i] = val(me, i);
        DT_CHECK(dt_comm_allgather(ctx, c, g, buf, cnt));
        if (check)
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) *wrong += buf[(size_t)r * count + i] != val(r, i);
        break;
    case OP_BC:
        if (check)
            for (size_t i = 0; i < count; i++) buf[i] = me == 0 ? val(0, i) : -1.0f;
        DT_CHECK(dt_comm_broadcast(ctx, c, g, buf, count * sizeof(float), 0));
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += buf[i] != val(0, i);
        break;
    case OP_PP: /* rank 0 -> 1 -> 0: rank 0 checks the echo in aux, rank 1 what arrived */
        if (me > 1) break;
        if (check)
            for (size_t i = 0; i < count; i++) buf[i] = me == 0 ? val(0, i) : -1.0f, aux[i] = -1.0f;
        if (me == 0) {
            DT_CHECK(dt_comm_send(ctx, c, g, buf, count * sizeof(float), 1, 7));
            DT_CHECK(dt_comm_recv(ctx, c, g, aux, count * sizeof(float), 1, 7));
        } else {
            DT_CHECK(dt_comm_recv(ctx, c, g, buf, count * sizeof(float), 0, 7));
            DT_CHECK(dt_comm_send(ctx, c, g, buf, count * sizeof(float), 0, 7));
        }
        if (check)
            for (size_t i = 0; i < count; i++) *wrong += (me == 0 ? aux[i] : buf[i]) != val(0, i);
        break;
    case OP_A2A: /* block q of the send buffer goes to rank q; block r of the receive came from rank r */
        for (int r = 0; r < n; r++) cnt[r] = count, off[r] = (size_t)r * count;
        if (check)
            for (size_t i = 0; i < count * (size_t)n; i++) buf[i] = val(me, i);
        DT_CHECK(dt_comm_alltoallv(ctx, c, g, buf, cnt, off, aux, cnt, off, sizeof(float)));
        if (check)
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++) *wrong += aux[(size_t)r * count + i] != val(r, (size_t)me * count + i);
        break;
    }
    return DT_OK;
}

/* Test aid: DTRAIN_TEST_COMM_DELAY_MS=N makes rank 0 sleep N ms inside the first timed call
 * of every row (a call descheduled on a shared host), so a test can tell the median from the
 * mean. */
static int test_delay_ms(void) {
    static int ms = -1;
    if (ms < 0) {
        const char *d = getenv("DTRAIN_TEST_COMM_DELAY_MS");
        ms = d ? atoi(d) : 0;
        if (ms < 0 || ms > 100000) ms = 0;
    }
    return ms;
}

/* The rows of one collective over group g at every size (every rank of the world calls it;
 * with g a node or cross group, the groups run side by side, as in the hierarchical phases). */
static dt_status bench_op(dt_ctx *ctx, dt_comm *c, dt_group g, int op, const dt_comm_bench_opts *o, float *buf,
                          float *aux, size_t *cnt, double *tw, FILE *out, long *total_wrong) {
    const int n = dt_comm_size(c, g), wn = dt_comm_size(c, DT_GROUP_WORLD), me = dt_comm_rank(c, DT_GROUP_WORLD);
    dt_status st = DT_OK;
    if (op == OP_PP && n < 2) return DT_OK; /* no peer */
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && st == DT_OK; bytes *= 2) {
        size_t count = bytes / 4;
        long wrong = 0;
        for (int w = 0; w < o->warmup && st == DT_OK; w++)
            st = run_op(ctx, c, g, op, count, buf, aux, cnt, cnt + wn, 0, &wrong);
        if (st == DT_OK) st = dt_comm_barrier(ctx, c, DT_GROUP_WORLD);
        /* tw: each timed iteration's time, the loop's mean, the wrong count; the maximum over
         * the ranks of each (an iteration takes as long as its slowest rank) */
        const int delay_ms = me == 0 ? test_delay_ms() : 0;
        double ti = dt_now(), sum = 0;
        for (int it = 0; it < o->iters && st == DT_OK; it++) {
            if (it == 0 && delay_ms > 0) usleep((useconds_t)delay_ms * 1000);
            st = run_op(ctx, c, g, op, count, buf, aux, cnt, cnt + wn, 0, &wrong);
            double now = dt_now();
            tw[it] = now - ti, sum += tw[it];
            ti = now;
        }
        tw[o->iters] = sum / o->iters;
        if (op == OP_PP) /* one message: half the round trip */
            for (int it = 0; it <= o->iters; it++) tw[it] /= 2;
        if (st == DT_OK) st = run_op(ctx, c, g, op, count, buf, aux, cnt, cnt + wn, 1, &wrong); /* checked */
        tw[o->iters + 1] = (double)wrong;
        if (st == DT_OK) st = dt_comm_allreduce(ctx, c, DT_GROUP_WORLD, tw, (size_t)o->iters + 2, DT_F64, DT_MAX);
        if (st != DT_OK) break;
        /* the row's time: the median iteration (one iteration descheduled on a shared host
         * does not move it); the loop's mean beside it, as nccl-tests reports */
        const double mean = tw[o->iters];
        wrong = (long)tw[o->iters + 1];
        double t = dt_median(tw, o->iters);
        if (!(t > 0)) t = mean; /* (no memory for the sorted copy) */
        /* nccl-tests' "size": the per-rank buffer for all-reduce / broadcast, the whole
         * (n x part) for reduce-scatter and all-gather. */
        const int whole =
            op == OP_RS || op == OP_RSO || op == OP_RSO_MPI || op == OP_AG || op == OP_AG_MPI || op == OP_A2A;
        double size = whole ? (double)bytes * n : (double)bytes;
        double algbw = size / t / 1e9;
        *total_wrong += wrong;
        char name[48];
        snprintf(name, sizeof name, "%s%s%s", g == DT_GROUP_WORLD ? "" : group_names[g], g == DT_GROUP_WORLD ? "" : ":",
                 op_names[op]);
        if (me == 0 && o->rows) {
            cJSON *row = cJSON_CreateObject();
            cJSON_AddStringToObject(row, "op", op_names[op]);
            cJSON_AddStringToObject(row, "group", group_names[g]);
            cJSON_AddNumberToObject(row, "ranks", n);
            cJSON_AddNumberToObject(row, "bytes", size);
            cJSON_AddNumberToObject(row, "count", (double)(whole ? count * (size_t)n : count));
            cJSON_AddNumberToObject(row, "time_us", t * 1e6);
            cJSON_AddNumberToObject(row, "time_mean_us", mean * 1e6);
            cJSON_AddNumberToObject(row, "algbw_gbs", algbw);
            cJSON_AddNumberToObject(row, "busbw_gbs", algbw * dt_comm_busbw_factor(op_names[op], n));
            cJSON_AddNumberToObject(row, "wrong", (double)wrong);
            cJSON_AddItemToArray(o->rows, row);
        }
        if (me == 0 && out)
            fprintf(out, "  %-32s %12.0f %12zu %10.1f %10.3f %10.3f %7ld\n", name, size, whole ? count * (size_t)n : count,
                    t * 1e6, algbw, algbw * dt_comm_busbw_factor(op_names[op], n), wrong);
    }
    return st;
}

dt_status dt_bench_comm(dt_ctx *ctx, dt_comm *c, const dt_comm_bench_opts *o, FILE *out) {
    int n = dt_comm_size(c, DT_GROUP_WORLD), me = dt_comm_rank(c, DT_GROUP_WORLD);
    if (o->min_bytes < 4 || o->max_bytes < o->min_bytes || o->iters < 1 || o->warmup < 0)
        return dt_fail(ctx, DT_ERR_CONFIG, "bench comm: need 4 <= --min-bytes <= --max-bytes and --iters >= 1");
    size_t maxc = o->max_bytes / 4;
    /* zeros: the timed runs reduce whatever the buffers hold (no denormals, no NaN) */
    float *buf = calloc(maxc * (size_t)n, sizeof(float)), *aux = calloc(maxc * ((size_t)n + 1), sizeof(float));
    size_t *cnt = malloc(2 * (size_t)n * sizeof(size_t));
    double *tw = malloc(((size_t)o->iters + 2) * sizeof(double)); /* the iterations' times, the mean, #wrong */
    if (!buf || !aux || !cnt || !tw) {
        free(buf);
        free(aux);
        free(cnt);
        free(tw);
        return dt_fail(ctx, DT_ERR_NOMEM, "bench comm: cannot allocate %zu bytes per buffer", maxc * (size_t)n * 4);
    }
    dt_status st = DT_OK;
    long total_wrong = 0;
    const int shm = dt_comm_set_shm(c, 1); /* on by default where it exists */
    if (me == 0 && out) {
        fprintf(out, "# dtrain bench comm: %d ranks on %d node(s), %s backend, float32, sum; %d warm-up + %d timed iterations\n",
                n, dt_comm_num_nodes(c), dt_comm_backend(c), o->warmup, o->iters);
        fprintf(out, "# time: the median timed iteration, each as long as its slowest rank (JSON time_mean_us: the loop's mean)\n");
        fprintf(out, "# busbw = algbw x factor: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1 (nccl-tests); "
                     "pingpong: ranks 0 and 1 of the group send a message back and forth, the time is one message's "
                     "(half the round trip), factor 1; alltoall (dtrain's, expert parallelism's): size = a rank's whole send "
                     "buffer (count to each rank), factor (n-1)/n\n");
        fprintf(out, "# allreduce, reduce_scatter, broadcast: the MPI library's; allreduce_ordered, reduce_scatter_ordered, "
                     "allgather: dtrain's, %s\n",
                shm ? "over the node's shared memory (*_mpi rows: the same calls over MPI)" : "over MPI");
        fprintf(out, "# %-32s %12s %12s %10s %10s %10s %7s\n", "collective", "size(B)", "count", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    /* With several nodes the world's ordered all-reduce is hierarchical where the layout allows;
     * the flat one is measured beside it (the cost model chooses between them). */
    const int hier = dt_comm_set_hierarchical(c, 1);
    for (int op = 0; op < OP_N && st == DT_OK; op++) {
        if (op_forces_mpi(op) && !shm) continue; /* the plain rows already are MPI */
        if (op == OP_ARO_FLAT && !hier) continue; /* allreduce_ordered already is flat */
        dt_comm_set_shm(c, !op_forces_mpi(op));
        dt_comm_set_hierarchical(c, op != OP_ARO_FLAT);
        st = bench_op(ctx, c, DT_GROUP_WORLD, op, o, buf, aux, cnt, tw, out, &total_wrong);
    }
    dt_comm_set_shm(c, shm);
    dt_comm_set_hierarchical(c, 1);
    /* Several nodes: the two link levels on their own, every node's group at once (its shared
     * memory, as inside the hierarchical all-reduce), then the groups across the nodes (one rank
     * of each node per group, all groups at once: the network as the hierarchical phase uses it).
     * Only where every node has the same number of ranks, so every group is alike (and every
     * rank runs the same rows). */
    int64_t L[2] = {dt_comm_size(c, DT_GROUP_NODE), -dt_comm_size(c, DT_GROUP_NODE)};
    if (st == DT_OK && dt_comm_num_nodes(c) > 1) st = dt_comm_allreduce(ctx, c, DT_GROUP_WORLD, L, 2, DT_I64, DT_MIN);
    if (st == DT_OK && dt_comm_num_nodes(c) > 1 && L[0] == -L[1]) {
        static const int node_ops[] = {OP_ARO, OP_RSO, OP_AG, OP_PP, OP_A2A},
                         cross_ops[] = {OP_AR, OP_ARO, OP_AG, OP_PP, OP_A2A};
        for (int k = 0; k < 5 && st == DT_OK && L[0] > 1; k++)
            st = bench_op(ctx, c, DT_GROUP_NODE, node_ops[k], o, buf, aux, cnt, tw, out, &total_wrong);
        for (int k = 0; k < 5 && st == DT_OK; k++)
            st = bench_op(ctx, c, DT_GROUP_CROSS, cross_ops[k], o, buf, aux, cnt, tw, out, &total_wrong);
    }
    dt_comm_set_shm(c, shm);
    free(buf);
    free(aux);
    free(cnt);
    free(tw);
    if (st == DT_OK && total_wrong > 0)
        st = dt_fail(ctx, DT_ERR_BACKEND, "bench comm: %ld elements arrived wrong (see #wrong)", total_wrong);
    return st;
}
