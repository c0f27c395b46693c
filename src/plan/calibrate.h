/* calibrate.h - a hardware catalog entry for the machine dtrain runs on, from its own
 * measurements (`dtrain plan --calibrate FILE`): the matmul peak and the GEMM efficiency a
 * training step reached (`dtrain bench --json`), and the links from the alpha-beta fit of the
 * ordered all-reduce (`dtrain bench comm --fit`, decision 42). The file is a whole catalog
 * (accelerators, links, efficiency) that `dtrain plan --catalog FILE --hardware
 * cpu-calibrated` reads.
 *
 * A link: the fit says t = alpha + beta x S for an all-reduce of S bytes per rank over n
 * ranks; the planner's ring model says t = 2 (n-1)/n S / B + 2 (n-1) a, so B = 2 (n-1)/n /
 * beta (the line at the fit's largest size, 64 MiB by default) and a = alpha / (2 (n-1)) (the
 * line at 1 KiB). One node (nodes <= 1): the world's lines give one link, `shm-fit`, for both
 * levels. Several nodes (decision 53): the fit ran across them (`bench comm` then also times
 * the node group and the cross group, one rank of each node, every group at once): the node
 * group's lines give the intra-node link `shm-fit` (n = ranks per node; absent with one rank
 * per node, which never uses it) and the cross group's the inter-node link `net-fit` (n =
 * nodes), a per-rank bandwidth: nics_per_node = ranks per node, so that the planner's share
 * of a node's NICs per device (B x nics / devices) is B.
 *
 * Fixed costs (decision 55): a step's time is not only FLOPs and bytes; kernel calls, thread
 * hand-offs and the optimizer's per-tensor loop cost about the same whatever the model's
 * width, which is most of a small model's step. Two DDP runs of R ranks on the entry's layout
 * (M nodes: those of the comm fit), the calibration's own (run) and a probe of a tiny model
 * (probe: gpt2-tiny), give two equations, t = F x + o + c(x) (F: one rank's model FLOPs per
 * step, c: the all-reduce the planner predicts for it on the entry's links, k ranks a node on
 * M nodes, exposed behind 2/3 of F x), solved for the time per FLOP x and the fixed cost per
 * micro-batch o: gemm efficiency = 1 / (x peak), step_overhead_us = o. With R >= 2 a third
 * run, the probe under ZeRO-3 (zprobe; 18 collective calls a step), gives the fixed cost per
 * collective call d: its step beyond the planner's plan of the same job with d = 0, per call
 * (d also enters the DDP runs' c, once per bucket: x, o and d are solved together);
 * collective_call_us = d. The optimizer step (decision 56) is measured apart, in the runs'
 * breakdowns: its time per parameter q = (opt_run - opt_probe) / (P_run - P_probe) (the
 * probe's few parameters carry the loop's fixed part, which stays in o), taken out of each
 * run's step as P q before the solve, and written as optimizer_bw_gbs = 28 / q (fp32 AdamW's
 * bytes per parameter: the planner charges ZeRO's shard P / R of it). The planner then gives
 * back the runs' step times. Without a probe
 * (probe.step_s = 0), with a calibration step of no more FLOPs than the probe's, or where the
 * two runs show no fixed cost (o <= 0): o = 0 and x from the calibration run alone, its
 * all-reduce taken out (the planner gives back its step). */
#ifndef DT_PLAN_CALIBRATE_H
#define DT_PLAN_CALIBRATE_H

#include "comm/comm_fit.h"
#include "core/status.h"

/* One DDP run of the calibration (dtrain bench --json). */
typedef struct dt_plan_cal_run {
    double step_s;       /* median step time */
    double flops;        /* model FLOPs of one rank's step (flops_per_token x micro-batch x seq x accum) */
    double grad_bytes;   /* bytes the step all-reduces: fp32 gradients of every parameter (0: not DDP) */
    double bucket_bytes; /* DDP's bucket size */
    int overlap;         /* buckets overlapped with the backward */
    double params;       /* parameters the optimizer updates (trainable; DDP: all of them) */
    double opt_s;        /* the optimizer's time in a step (bench: breakdown_s.optimizer; 0: not known) */
    double layer_share;  /* the layers' share of its FLOPs, whose backward follows the forward (dtrain's
                            fused loss computes the head's gradients in the forward: decision 97):
                            1 - 6 V d / FLOPs per token; 0: 1 */
} dt_plan_cal_run;

typedef struct dt_plan_cal {
    double peak_gflops;     /* dtrain's fp32 matmul peak of one rank (bench: peak_gflops) */
    double achieved_gflops; /* model FLOP/s one rank reached in training (bench: tflops_rank x 1e3) */
    double memory_bytes;    /* the node's memory */
    int ranks;              /* ranks that ran the benchmark: the devices of the job */
    const dt_comm_fit *fit; /* the ordered all-reduce lines of the comm fit */
    const char *source;     /* what was run, for the file's comments */
    int comm_ranks;         /* one node: ranks of the comm fit (0: = ranks; a 1-rank calibration
                               fits the link on 2, which its 1-device plans never use) */
    int nodes;              /* nodes the ranks are spread over (0 or 1: one node); several: the
                               fit ran on `ranks` ranks of `nodes` nodes */
    double link_bytes;      /* the message size (per rank) the bandwidths are read at (0: 64 MiB) */
    double tp_bytes;        /* the activation a TP group all-reduces (micro-batch x seq x d_model x 4 bytes of
                               the calibration's job): the size the TP link is read at (0: no TP link), and
                               the message a pipeline stage sends, the size the PP link is read at */
    dt_plan_cal_run run;    /* the calibration's bench (step_s 0: only achieved_gflops is known) */
    dt_plan_cal_run probe;  /* the tiny model's (step_s 0: not run; no fixed cost) */
    dt_plan_cal_run zprobe; /* the tiny model under ZeRO-3 (only step_s is read; 0: not run) */
    int machine_ranks;      /* ranks of the calibration on one machine (bench: environment.machine_ranks;
                               0: not known) and the machine's cores and threads per rank: with
                               machine_ranks x threads > cores the devices are time-sliced (decision 95) */
    int cores, threads;
} dt_plan_cal;

/* Bytes fp32 AdamW moves per parameter (dt_plan_opt_bytes of an fp32 job): the calibration
 * expresses its measured time per parameter as optimizer_bw_gbs with it. */
#define DT_PLAN_CAL_OPT_BYTES 28.0

/* The probes' job: gpt2-tiny, micro-batch 2 x 64 tokens, one micro-batch a step. */
#define DT_PLAN_CAL_PROBE_MODEL "gpt2-tiny"
#define DT_PLAN_CAL_PROBE_BATCH 2
#define DT_PLAN_CAL_PROBE_SEQ 64

/* What the runs give (dt_plan_cal_solve). */
typedef struct dt_plan_cal_fit {
    double eff;         /* GEMM efficiency: 1 / (x peak), in [0.01, 1] */
    double peak_gflops; /* the entry's peak per rank: the given one, or the rate 1 / x the runs reached where
                           that is higher (a peak is at least what a run reaches; never a clamped efficiency) */
    int peak_raised;    /* 1: peak_gflops is the runs' rate, above the benchmark's peak (eff = 1) */
    double comm_over_s; /* > 0: the communication and call costs predicted for the calibration run (s)
                           left no time for its FLOPs (the link fit or the ZeRO-3 probe over-predicts,
                           e.g. on a loaded machine): x is its whole step per FLOP, o = d = 0, and the
                           entry says so */
    double overhead_us; /* fixed cost per micro-batch, >= 0 */
    double call_us;     /* fixed cost per collective call, >= 0 */
    double ct;          /* the DDP probe's predicted communication (s) */
    double opt_s_param; /* the optimizer's time per parameter (s; 0: not measured) */
    double opt_bw_gbs;  /* = DT_PLAN_CAL_OPT_BYTES / opt_s_param / 1e9: the entry's optimizer_bw_gbs */
    int opt_runs;       /* breakdowns q came from: 2 (run and probe: the fixed part apart), 1 (run), 0 */
    double zplan_s;     /* the ZeRO-3 probe's plan without call costs (s; 0: no ZeRO-3 probe) */
    double zcalls;      /* its collective calls per step */
} dt_plan_cal_fit;

/* Time per FLOP, fixed costs per micro-batch and per collective call from the runs (above). */
dt_status dt_plan_cal_solve(dt_ctx *ctx, const dt_plan_cal *c, dt_plan_cal_fit *f);
/* The planner's step (and collective calls) of the ZeRO-3 probe's job, R ranks on the
 * entry's nodes, for the given efficiency and fixed costs. */
dt_status dt_plan_cal_zero3_probe(dt_ctx *ctx, const dt_plan_cal *c, double eff, double overhead_us, double call_us,
                                  double opt_bw_gbs, double *step_s, double *calls);
/* 1 when run and probe can be solved for a fixed cost (both measured, the run the larger). */
int dt_plan_cal_probed(const dt_plan_cal *c);

/* The link of level 0 (inside a node) or 1 (across nodes): bandwidth (GB/s) at c->link_bytes
 * per rank and latency (us); *name gets its catalog key ("shm-fit", "net-fit"). */
dt_status dt_plan_cal_link(dt_ctx *ctx, const dt_plan_cal *c, int level, double *bw_gbs, double *lat_us,
                           const char **name);
/* The TP link (decision 71): tensor parallelism's all-reduces of activations run inside a node
 * on its shared memory (a TP group is consecutive ranks of a node), on the compute thread, as
 * the node group's ordered all-reduce does, but at an activation's size, where the ring's
 * latency and the caches matter more than at a gradient bucket's: B = 2(n-1)/n / beta of the
 * node-level line (the world's on one node, the node group's on several) holding c->tp_bytes,
 * a = alpha / 2(n-1) of its 1 KiB line, n = the ranks of a node; name "tp-fit". Fails with
 * DT_ERR_CONFIG when there is none to read: no tp_bytes, or one rank per node. */
dt_status dt_plan_cal_tp_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us);
/* The pipeline link (decision 77): the stages' sends of activations and their gradients are
 * point-to-point messages (dt_comm_send / recv), measured by `bench comm`'s ping-pong (one
 * message = half a round trip between ranks 0 and 1 of a group) and fitted t = alpha + beta S:
 * B = 1 / beta of the node-level line (the world's on one node, the node group's on several)
 * holding c->tp_bytes, a = alpha of its 1 KiB line; name "pp-fit". Fails with DT_ERR_CONFIG
 * when there is none to read: no activation size, one rank per node, a fit without pingpong
 * lines (made before them) or a line without a positive beta; the entry then has no pp_link. */
dt_status dt_plan_cal_pp_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us);
/* The expert-parallel link (decision 92): an EP group's dispatch and combine are all-to-alls of
 * token rows (dt_comm_alltoallv), measured by `bench comm`'s alltoall (every rank sends a block
 * to every rank; the row's size S is a rank's whole send buffer) and fitted t = alpha + beta S;
 * the planner's all-to-all over n ranks of a node costs (n-1)/n S / B + (n-1) a, so B = (n-1)/n /
 * beta of the node-level line (the world's on one node, the node group's on several) holding
 * c->tp_bytes, a = alpha / (n-1) of its 1 KiB line, n the ranks of a node; name "ep-fit". Fails
 * with DT_ERR_CONFIG when there is none to read: no activation size, one rank per node, a fit
 * without alltoall lines (made before them) or a line without a positive beta; the entry then
 * has no ep_link (the planner uses the intra-node link). */
dt_status dt_plan_cal_ep_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us);
/* The same two across nodes (decision 92), from the cross group's lines (one rank of each node,
 * every such group at once: a per-rank rate with the node's ranks sending, as net-fit) at
 * c->tp_bytes: pp-net-fit from its pingpong (B = 1 / beta, a = alpha at 1 KiB), ep-net-fit from
 * its alltoall over n = nodes (B = (n-1)/n / beta, a = alpha / (n-1)). Fail with DT_ERR_CONFIG on
 * one node, without an activation size, without the cross lines or a positive beta; the entry
 * then names none (the planner uses the inter-node link). */
dt_status dt_plan_cal_pp_inter_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us);
dt_status dt_plan_cal_ep_inter_link(dt_ctx *ctx, const dt_plan_cal *c, double *bw_gbs, double *lat_us);
/* Writes the catalog file; *fit_out (may be NULL) gets what dt_plan_cal_solve gave it. */
dt_status dt_plan_cal_write(dt_ctx *ctx, const char *path, const dt_plan_cal *c, dt_plan_cal_fit *fit_out);

#endif
