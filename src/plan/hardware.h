/* hardware.h - the hardware catalog of `dtrain plan` (configs/hardware.yaml): accelerators
 * (peak FLOP/s per dtype, memory, devices and NICs per node, the links they use), links
 * (bandwidth per device and direction, latency) and efficiency factors (achievable fraction
 * of peak for GEMMs and for each link: defaults, overridable per key).
 *
 *   dt_hw_catalog c; DT_CHECK(dt_hw_load(ctx, "configs/hardware.yaml", &c));
 *   const dt_hw_accel *a; DT_CHECK(dt_hw_find(ctx, &c, "h100-sxm", &a));
 *   dt_hw_free(&c);
 *
 * Every bad value or unknown key is refused naming file:line and the key; an unknown
 * accelerator name is refused with the closest known one (edit distance). */
#ifndef DT_HARDWARE_H
#define DT_HARDWARE_H

#include "core/dtype.h"
#include "core/status.h"

enum { DT_HW_FP32, DT_HW_TF32, DT_HW_BF16, DT_HW_FP16, DT_HW_FP8, DT_HW_NPREC };
extern const char *const dt_hw_prec_names[DT_HW_NPREC];

typedef struct dt_hw_link {
    char key[48], name[96];
    double bw_gbs;     /* GB/s (1e9 bytes) per device (NVLink, PCIe) or per NIC, per direction */
    double latency_us;
    double eff;        /* efficiency.link.<key>, else efficiency.link.default */
} dt_hw_link;

typedef struct dt_hw_accel {
    char key[48], name[96], kind[8];
    double peak_tflops[DT_HW_NPREC]; /* dense; 0 = not given */
    double memory_bytes, memory_bw_gbs;
    int devices_per_node, nics_per_node;
    char intra[48], inter[48];       /* keys into links */
    char tp_link[48];                /* tp_link: the link of tensor parallelism's collectives (the TP
                                        group's all-reduces of activations, inside a node); "" = intra:
                                        `plan --calibrate` writes tp-fit, its all-reduce fit read at
                                        the activation's size (decision 71) */
    char pp_link[48];                /* pp_link: the link of pipeline stages' point-to-point sends of
                                        activations and their gradients inside a node; "" = intra:
                                        `plan --calibrate` writes pp-fit, its ping-pong fit read at the
                                        activation's size (decision 77) */
    char ep_link[48];                /* ep_link: the link of expert parallelism's all-to-alls of token
                                        rows inside a node; "" = intra: `plan --calibrate` writes
                                        ep-fit, its all-to-all fit read at the activation's size
                                        (decision 92) */
    char pp_inter_link[48];          /* pp_inter_link, ep_inter_link: the same two across nodes; "" =
                                        inter: `plan --calibrate` on several nodes writes pp-net-fit
                                        and ep-net-fit from its cross group's ping-pong and all-to-all
                                        (per rank, every rank of a node sending, as net-fit) */
    char ep_inter_link[48];
    double gemm_eff;                 /* efficiency.gemm.<key>, else efficiency.gemm.default */
    char same_compute_as[48];        /* another entry with the same compute die, clocks and peaks (H200 =
                                        H100 SXM: GH100): `plan --validate --fit` gives this type, when
                                        no fitting row is of it, that entry's fitted GEMM efficiency
                                        (decision 65); "" = none */
    int compute_twin;                /* index of same_compute_as in the catalog, -1 = none */
    double step_overhead_us;         /* fixed time per micro-batch no FLOP or byte term carries (kernel
                                        calls, thread hand-offs, the optimizer's per-tensor loop): measured
                                        by `plan --calibrate` (decision 55); 0 when not given */
    double collective_call_us;       /* fixed time of each collective call on the training thread
                                        beyond the link's (hand-offs to the communication thread
                                        and back): measured by `plan --calibrate`; 0 when not given */
    double optimizer_bw_gbs;         /* GB/s at which the optimizer step streams the state it updates
                                        (decision 56): measured by `plan --calibrate`; 0 when not given
                                        (the step is then folded into the GEMM efficiency, as the fitted
                                        GPU efficiencies carry it) */
    double idle_speedup;             /* time-sliced devices (decision 95): how many times its calibrated rate
                                        a device runs while the others sharing its machine's cores idle (a
                                        calibration with more ranks x threads than cores: ranks x threads /
                                        cores); 0 or 1 = dedicated devices (GPUs, a rank per core) */
    int machine_ranks;               /* the devices of a job that share one machine's cores (simulated nodes:
                                        all of them); 0 = devices_per_node */
} dt_hw_accel;

typedef struct dt_hw_catalog {
    char path[256];
    dt_hw_accel *acc;
    int n_acc;
    dt_hw_link *link;
    int n_link;
    double gemm_default, link_default;
} dt_hw_catalog;

dt_status dt_hw_load(dt_ctx *ctx, const char *path, dt_hw_catalog *c);
void dt_hw_free(dt_hw_catalog *c);
/* Accelerator by key (case-insensitive); unknown: "--hardware X: not in FILE (did you mean Y?
 * known: ...)". */
dt_status dt_hw_find(dt_ctx *ctx, const dt_hw_catalog *c, const char *key, const dt_hw_accel **out);
/* Link by key; NULL if absent. */
const dt_hw_link *dt_hw_link_find(const dt_hw_catalog *c, const char *key);
/* The link of a's tensor-parallel collectives: its tp_link, else its intra-node link. */
const dt_hw_link *dt_hw_tp_link(const dt_hw_catalog *c, const dt_hw_accel *a);
/* The link of a's pipeline sends inside a node: its pp_link, else its intra-node link. */
const dt_hw_link *dt_hw_pp_link(const dt_hw_catalog *c, const dt_hw_accel *a);
/* The link of a's expert-parallel all-to-alls inside a node: its ep_link, else its intra-node link. */
const dt_hw_link *dt_hw_ep_link(const dt_hw_catalog *c, const dt_hw_accel *a);
/* The links of a's pipeline sends and expert all-to-alls across nodes: its pp_inter_link /
 * ep_inter_link, else its inter-node link. */
const dt_hw_link *dt_hw_pp_inter_link(const dt_hw_catalog *c, const dt_hw_accel *a);
const dt_hw_link *dt_hw_ep_inter_link(const dt_hw_catalog *c, const dt_hw_accel *a);
/* Peak TFLOP/s for a compute dtype (DT_F32, DT_BF16, DT_F16); 0 when the catalog lacks it. */
double dt_hw_peak(const dt_hw_accel *a, dt_dtype compute);
/* Levenshtein distance (case-insensitive), for did-you-mean. */
int dt_hw_edit_distance(const char *a, const char *b);
/* The candidate closest to s (NULL if none is within max(2, len/3) edits). */
const char *dt_hw_closest(const char *s, const char *const *cands, int n);

#endif
