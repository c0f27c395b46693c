/* The calibrated CPU-node catalog entry (calibrate.h). */
#include "plan/calibrate.h"

#include <stdio.h>
#include <string.h>

/* B and a of the ring formula from the ordered all-reduce lines of `group` over n ranks. */
static dt_status ring_link(dt_ctx *ctx, const dt_comm_fit *fit, const char *group, int n, double bytes, double *bw_gbs,
                           double *lat_us) {
    const dt_comm_fit_line *l = dt_comm_fit_find_in(fit, group, "allreduce_ordered", bytes);
    if (!l)
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit has no %s%sallreduce_ordered line", group,
                       strcmp(group, "world") ? " group " : " ");
    if (n < 2 || !(l->beta_us_per_b > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit's %s group needs 2+ ranks and a positive beta",
                       group);
    *bw_gbs = 2.0 * (n - 1) / n / (l->beta_us_per_b * 1e-6) / 1e9;
    /* the latency from the smallest messages' line (large ones fit through the origin) */
    *lat_us = dt_comm_fit_find_in(fit, group, "allreduce_ordered", 1024)->alpha_us / (2.0 * (n - 1));
    return DT_OK;
}

static int per_node(const dt_plan_cal *c) { return c->nodes > 1 ? c->ranks / c->nodes : c->ranks; }

dt_status dt_plan_cal_link(dt_ctx *ctx, const dt_plan_cal *c, int level, double *bw_gbs, double *lat_us,
                           const char **name) {
    double bytes = c->link_bytes > 0 ? c->link_bytes : 64.0 * 1048576;
    if (c->nodes <= 1) {
        *name = "shm-fit";
        return ring_link(ctx, c->fit, "world", c->comm_ranks ? c->comm_ranks : c->ranks, bytes, bw_gbs, lat_us);
    }
    int k = per_node(c);
    if (c->ranks % c->nodes)
        return dt_fail(ctx, DT_ERR_CONFIG, "plan --calibrate: %d ranks do not split evenly over %d nodes", c->ranks,
                       c->nodes);
    if (c->fit->ranks != c->ranks || c->fit->nodes != c->nodes)
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit ran on %d ranks of %d node(s), not %d of %d",
                       c->fit->ranks, c->fit->nodes, c->ranks, c->nodes);
    if (level == 0 && k > 1) {
        *name = "shm-fit";
        return ring_link(ctx, c->fit, "node", k, bytes, bw_gbs, lat_us);
    }
    *name = "net-fit"; /* one rank per node: nothing moves inside a node, the level names the network */
    return ring_link(ctx, c->fit, "cross", c->nodes, bytes, bw_gbs, lat_us);
}

dt_status dt_plan_cal_write(dt_ctx *ctx, const char *path, const dt_plan_cal *c) {
    double bw[2], lat[2];
    const char *name[2];
    for (int lv = 0; lv < 2; lv++) DT_CHECK(dt_plan_cal_link(ctx, c, lv, &bw[lv], &lat[lv], &name[lv]));
    if (!(c->peak_gflops > 0) || !(c->achieved_gflops > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the benchmark gave no peak or throughput");
    double eff = c->achieved_gflops / c->peak_gflops;
    if (eff > 1) eff = 1;
    if (eff < 0.01) eff = 0.01;
    const int multi = c->nodes > 1, k = per_node(c);
    const double mib = (c->link_bytes > 0 ? c->link_bytes : 64.0 * 1048576) / 1048576;
    FILE *f = fopen(path, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    fprintf(f,
            "# Calibrated by `dtrain plan --calibrate` on this machine (%s), %d rank(s) on %d node(s).\n"
            "# Use: dtrain plan --catalog %s --hardware cpu-calibrated --gpus N%s ...\n"
            "accelerators:\n"
            "  cpu-calibrated:\n"
            "    name: \"this machine, one dtrain rank per device\"\n"
            "    kind: cpu\n"
            "    peak_tflops: {fp32: %.6g}   # dtrain bench: peak_gflops of one rank (oneDNN sgemm)\n"
            "    memory_gib: %.6g            # the node's memory\n"
            "    devices_per_node: %d        # the ranks of a node\n"
            "    intra_node: %s\n"
            "    inter_node: %s%s\n"
            "    nics_per_node: %d           # %s\n"
            "links:\n",
            c->source ? c->source : "dtrain bench, dtrain bench comm --fit", c->ranks, multi ? c->nodes : 1, path,
            multi ? " --nodes M" : "", c->peak_gflops / 1e3, c->memory_bytes / 1073741824.0, k, name[0], name[1],
            multi ? "" : "         # simulated nodes share the machine: the same link", k,
            multi ? "net-fit is per rank with every rank of a node sending: a device's share is its bw"
                  : "the ranks of the benchmark");
    if (!multi || k > 1)
        fprintf(f,
                "  shm-fit: {name: \"ordered all-reduce inside a node, fitted\", bw_gbs: %.6g, latency_us: %.6g}   "
                "# dtrain bench comm --fit, %s group of %d ranks: B = 2(n-1)/n / beta at %g MiB, a = alpha / 2(n-1) "
                "at 1 KiB\n",
                bw[0], lat[0], multi ? "node" : "world", multi ? k : c->comm_ranks ? c->comm_ranks : c->ranks, mib);
    if (multi)
        fprintf(f,
                "  net-fit: {name: \"ordered all-reduce across nodes, fitted\", bw_gbs: %.6g, latency_us: %.6g}   "
                "# dtrain bench comm --fit on %d ranks of %d nodes, cross group (one rank per node, %d groups at "
                "once) of %d ranks: B = 2(n-1)/n / beta at %g MiB, a = alpha / 2(n-1) at 1 KiB\n",
                bw[1], lat[1], c->ranks, c->nodes, k, c->nodes, mib);
    fprintf(f,
            "efficiency:\n"
            "  gemm: {cpu-calibrated: %.4g}   # achieved %.6g / peak %.6g GFLOP/s per rank in dtrain bench\n"
            "  link: {%s: 1.0%s}           # the fits are measured: nothing to discount\n",
            eff, c->achieved_gflops, c->peak_gflops, !multi || k > 1 ? "shm-fit" : "net-fit",
            multi && k > 1 ? ", net-fit: 1.0" : "");
    if (fclose(f) != 0) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    return DT_OK;
}
