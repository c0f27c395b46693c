#include "train/straggler.h"

#include <stdlib.h>
#include <string.h>

#include "core/sortcmp.h"

void dt_straggler_add(dt_straggler *s, long step, double compute_s) {
    if (s->n == 0) s->from = step;
    s->sum += compute_s;
    s->n++;
}

dt_status dt_straggler_check(dt_ctx *ctx, dt_straggler *s, dt_comm *comm, long step, double factor,
                             dt_metrics *m) {
    int world = dt_comm_size(comm, DT_GROUP_WORLD), rank = dt_comm_rank(comm, DT_GROUP_WORLD);
    if (world < 2 || s->n == 0) return DT_OK;
    double *v = malloc((size_t)world * 2 * sizeof *v), mine = s->sum / (double)s->n;
    if (!v) return dt_fail(ctx, DT_ERR_NOMEM, "straggler check: out of memory");
    dt_status st = dt_comm_allgather_words(ctx, comm, DT_GROUP_WORLD, &mine, 1, v);
    long from = s->from;
    s->sum = 0;
    s->n = 0;
    if (st == DT_OK && rank == 0) {
        for (int r = 0; r < world && st == DT_OK; r++) {
            double med = dt_median_others(v, world, r);
            if (med > 0 && v[r] > factor * med) {
                s->found++;
                st = dt_metrics_straggler(ctx, m, step, from, r, 1e3 * v[r], 1e3 * med);
            }
        }
    }
    free(v);
    return st;
}
