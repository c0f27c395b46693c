#include "train/straggler.h"

#include <stdlib.h>
#include <string.h>

void dt_straggler_add(dt_straggler *s, long step, double compute_s) {
    if (s->n == 0) s->from = step;
    s->sum += compute_s;
    s->n++;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

dt_status dt_straggler_check(dt_ctx *ctx, dt_straggler *s, dt_comm *comm, long step, double factor,
                             dt_metrics *m) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    if (world < 2 || s->n == 0) return DT_OK;
    double *v = calloc((size_t)world * 2, sizeof *v);
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "straggler check: out of memory");
    v[rank] = s->sum / (double)s->n;
    dt_status st = dt_comm_allreduce(ctx, comm, DT_GROUP_WORLD, v, (size_t)world, DT_F64, DT_SUM);
    long from = s->from;
    s->sum = 0;
    s->n = 0;
    if (st == DT_OK && rank == 0) {
        double *others = v + world;
        for (int r = 0; r < world && st == DT_OK; r++) {
            int k = 0;
            for (int o = 0; o < world; o++)
                if (o != r) others[k++] = v[o];
            qsort(others, (size_t)k, sizeof *others, cmp_double);
            double med = k % 2 ? others[k / 2] : 0.5 * (others[k / 2 - 1] + others[k / 2]);
            if (med > 0 && v[r] > factor * med) {
                s->found++;
                st = dt_metrics_straggler(ctx, m, step, from, r, 1e3 * v[r], 1e3 * med);
            }
        }
    }
    free(v);
    return st;
}
