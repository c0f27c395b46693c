/* The calibrated CPU-node catalog entry (calibrate.h). */
#include "plan/calibrate.h"

#include <stdio.h>

dt_status dt_plan_cal_link(dt_ctx *ctx, const dt_plan_cal *c, double bytes, double *bw_gbs, double *lat_us) {
    const dt_comm_fit_line *l = dt_comm_fit_find(c->fit, "allreduce_ordered", bytes);
    if (!l) return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit has no allreduce_ordered line");
    double n = c->comm_ranks ? c->comm_ranks : c->ranks;
    if (n < 2 || !(l->beta_us_per_b > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the comm fit needs 2+ ranks and a positive beta");
    *bw_gbs = 2 * (n - 1) / n / (l->beta_us_per_b * 1e-6) / 1e9;
    /* the latency from the smallest messages' line (large ones fit through the origin) */
    const dt_comm_fit_line *small = dt_comm_fit_find(c->fit, "allreduce_ordered", 1024);
    *lat_us = small->alpha_us / (2 * (n - 1));
    return DT_OK;
}

dt_status dt_plan_cal_write(dt_ctx *ctx, const char *path, const dt_plan_cal *c) {
    double bw, lat;
    DT_CHECK(dt_plan_cal_link(ctx, c, 64.0 * 1048576, &bw, &lat));
    if (!(c->peak_gflops > 0) || !(c->achieved_gflops > 0))
        return dt_fail(ctx, DT_ERR_FORMAT, "plan --calibrate: the benchmark gave no peak or throughput");
    double eff = c->achieved_gflops / c->peak_gflops;
    if (eff > 1) eff = 1;
    if (eff < 0.01) eff = 0.01;
    FILE *f = fopen(path, "w");
    if (!f) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    fprintf(f,
            "# Calibrated by `dtrain plan --calibrate` on this machine (%s).\n"
            "# Use: dtrain plan --catalog %s --hardware cpu-calibrated --gpus N ...\n"
            "accelerators:\n"
            "  cpu-calibrated:\n"
            "    name: \"this machine, one dtrain rank per device\"\n"
            "    kind: cpu\n"
            "    peak_tflops: {fp32: %.6g}   # dtrain bench: peak_gflops of one rank (oneDNN sgemm)\n"
            "    memory_gib: %.6g            # the node's memory\n"
            "    devices_per_node: %d        # the ranks of the benchmark\n"
            "    intra_node: shm-fit\n"
            "    inter_node: shm-fit         # simulated nodes share the machine: the same link\n"
            "    nics_per_node: %d\n"
            "links:\n"
            "  shm-fit: {name: \"ordered all-reduce, fitted\", bw_gbs: %.6g, latency_us: %.6g}   # dtrain bench comm "
            "--fit, %d ranks: B = 2(n-1)/n / beta at 64 MiB, a = alpha / 2(n-1) at 1 KiB\n"
            "efficiency:\n"
            "  gemm: {cpu-calibrated: %.4g}   # achieved %.6g / peak %.6g GFLOP/s per rank in dtrain bench\n"
            "  link: {shm-fit: 1.0}           # the fit is measured: nothing to discount\n",
            c->source ? c->source : "dtrain bench, dtrain bench comm --fit", path, c->peak_gflops / 1e3,
            c->memory_bytes / 1073741824.0, c->ranks, c->ranks, bw, lat, c->comm_ranks ? c->comm_ranks : c->ranks, eff,
            c->achieved_gflops,
            c->peak_gflops);
    if (fclose(f) != 0) return dt_fail(ctx, DT_ERR_IO, "plan --calibrate: cannot write %s", path);
    return DT_OK;
}
