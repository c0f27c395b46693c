/* parallel_impl.h - the state behind dt_parallel (internal to src/parallel).
 *
 * Sharding is per unit (params.h: each sub-layer unit, each vocabulary chunk, each run of
 * other embedding/head tensors; none larger than the largest sub-layer unit), like FSDP's
 * flat parameters: each
 * unit is split into G near-equal "node-shards" over the shard group (the world, or the
 * node when sharding is hybrid), and rank j of that group owns node-shard j of every unit.
 * DDP is the G = 1 case. A rank's shard vector concatenates its node-shards in unit order
 * (sb[u] = where unit u's piece starts). With hybrid sharding each node-shard is held by
 * one rank per node (its "replicas", the cross group); for the gradient reduction it is
 * further cut into one sub-chunk per replica.
 */
#ifndef DT_PARALLEL_IMPL_H
#define DT_PARALLEL_IMPL_H

#include <pthread.h>

#include "parallel/parallel.h"

typedef enum dt_task_kind { DT_TASK_BUCKET, DT_TASK_GATHER, DT_TASK_GATHER_LP, DT_TASK_REDUCE, DT_TASK_LOOKUP,
                             DT_TASK_GATHER_RES } dt_task_kind;

/* A communication task: reduce bucket a; gather unit a into parameter window b (in fp32, or
 * _LP: its matmul tensors in 16 bits, zero_params.c; _RES: into the resident step buffer,
 * zero_step.c); reduce unit a from gradient window b & 1, b & 2 set when it is the unit's first
 * reduction of the step (it writes the shard; b < 0: once from the step's gradient acc);
 * gather the rows of vocabulary tensor a that the micro-batch's tokens name (zero_lookup.c). */
typedef struct dt_par_task {
    dt_task_kind kind;
    int a, b;
} dt_par_task;

/* Buffer sizes in floats, from the units and the strategy alone: what dt_parallel_init
 * allocates and dt_parallel_plan counts come from this one function. */
typedef struct dt_par_sizes {
    size_t S;        /* my shard vector: my part of every unit */
    size_t max_unit; /* the largest unit: a ZeRO-2/3 window */
    size_t max_sub;  /* the largest part of a unit that one rank reduces */
    size_t max_ns;   /* my largest node-shard (hybrid ZeRO-2/3 gathers it across nodes) */
    size_t bucket;   /* a DDP/ZeRO-1 bucket */
    size_t bk;       /* ZeRO-1: my reduced part of a bucket, at most */
    size_t red;      /* DDP/ZeRO-1, f32 gradients: ordered-reduction scratch (every rank's copy
                        of my part); 0 with bf16 gradients */
    size_t rs_round; /* ZeRO-2/3: elements per rank in one reduce-scatter round */
    size_t rs_scr;   /* ZeRO-2/3, f32 gradients: reduce-scatter scratch, W x rs_round; 0 with bf16 */
    size_t lp;       /* bf16 gradients: staging of the bf16 collectives (bf16 values); 0 with f32 */
    size_t esize;    /* bytes of a reduced element in bk_out / rs_out / ns_buf: 4, or 2 with bf16 */
    size_t res;      /* Top-K (world > 1): the residual, n_params floats; 0 otherwise */
    size_t msg;      /* Top-K: every rank's message of the largest bucket (uint16 words, topk.h) */
    size_t age;      /* Top-K by age (ratio < 1, world > 1): S floats of element ages; 0 otherwise */
    size_t lpwin;    /* ZeRO-3 under mixed precision: a 16-bit parameter window (values; the
                        largest unit, as pwin); 0 otherwise */
    size_t lk_rows;  /* ZeRO-3, G > 1, a vocabulary tensor: rows of the lookup table, at most
                        min(vocabulary rows, G x tokens); 0 otherwise (zero_lookup.c) */
    size_t lk_cols;  /* the widest vocabulary tensor's columns */
    size_t lk_words; /* 8-byte words of one rank's token-id record: (tokens + 2) / 2 */
    size_t lk_bytes; /* the lookup's buffers, bytes (communication memory) */
} dt_par_sizes;

/* Sizes for shard group size G (my index j in it) and n_rep replicas of each node-shard. */
void dt_par_sizes_of(const dt_params *ps, const dt_parallel_cfg *cfg, int world, int G, int j, int n_rep,
                     dt_par_sizes *z);

typedef struct dt_bucket {
    size_t lo, hi; /* floats in the gradient slab */
    int first;     /* the unit holding lo: the bucket is final once it has ended */
    int unit;      /* the unit holding hi - 1 (ZeRO-1 buckets stay inside it) */
} dt_bucket;

struct dt_parallel {
    dt_parallel_cfg cfg;
    dt_comm *comm;
    dt_model *m;
    dt_alloc *alloc;
    int world, rank;   /* of the data-parallel group g_dp */
    dt_group g_dp;
    int sharded_grads, sharded_params; /* ZeRO-2/3, ZeRO-3 */
    /* shard geometry */
    dt_group g_shard;  /* the DP group, or when hybrid the node's part of it (NODE without a mesh) */
    dt_group g_cross;  /* hybrid: my node-shard's replicas, one per node (CROSS without a mesh) */
    int G, j;          /* shard-group size and my index in it (G = 1 for DDP) */
    int n_rep, k;      /* replicas of my node-shard (cross group size) and my index */
    int U;             /* units */
    size_t *split_cnt, *split_off; /* [U x G] node-shard counts/offsets inside each unit */
    size_t *sb;        /* [U] start of unit u's piece in my shard vector */
    size_t S;          /* shard vector length */
    size_t *rs_cnt, *rs_dis;       /* [U x world] gradient reduce-scatter owner map */
    size_t *sub_cnt, *sub_off;     /* [U x n_rep] sub-chunks of my node-shard, per replica */
    /* optimizer state (S floats each) and update segments, shard-relative */
    float *mom, *var;
    dt_param_segment *segs;
    int *seg_unit;
    int nsegs;
    /* DDP / ZeRO-1: buckets over the full gradient slab */
    float *acc, *extra;     /* the step's gradient; gradients of micro-steps k >= 1 */
    float *red_scratch;     /* for the ordered all-reduce / reduce-scatter of one bucket */
    float *bk_out;          /* ZeRO-1: my part of a bucket, reduced */
    /* bf16 gradients (cfg.grad_dtype): the same roles in bf16 (z.esize = 2), and the staging
     * of the bf16 collectives (z.lp values) in place of red_scratch / rs_scratch */
    uint16_t *lp, *bk16, *rs16, *ns16;
    int topk_on;            /* Top-K this step (dt_parallel_set_compression) */
    float *res;             /* Top-K: this rank's residual over the gradient slab (z.res floats) */
    uint16_t *msg;          /* Top-K: the all-gathered messages of one bucket (z.msg words) */
    float *age;             /* Top-K by age: steps since each element of my shard last received a
                               gradient (z.age floats, optimizer state; optim.h) */
    size_t *part_cnt;       /* [2 x world] counts and offsets of one collective's parts
                               (a ZeRO-1 bucket, a ZeRO-2/3 reduce-scatter round) */
    dt_bucket *b;
    int nb;
    /* ZeRO-2/3 storage */
    float *gshard, *pshard;  /* S floats: reduced gradient shard; parameter shard (ZeRO-3) */
    float *gwin[2], *pwin[2];/* unit windows (double-buffered), z.max_unit floats each */
    int pwin_unit[2];        /* which unit each parameter window holds (-1: none/stale) */
    int pw_cur, gw_cur;      /* the window the model reads (parameters) / writes (gradients) */
    float *rs_scratch, *rs_out, *ns_buf; /* reduce-scatter rounds: every rank's part of one
                                            round, my reduced part, my node-shard (hybrid) */
    dt_par_sizes z;          /* buffer sizes (dt_par_sizes_of) */
    /* micro-step state */
    int last_micro, micro;
    /* communication tasks: run in submission order on the communication thread (overlap)
     * or inline. Every rank submits the same sequence, so the collectives match up. */
    dt_par_task *tasks;      /* ring of cap entries */
    int cap;
    long queued, done;       /* tasks submitted / finished since init */
    int next;                /* DDP: next bucket to launch this step */
    pthread_t thread;
    int thread_live, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dt_status err;           /* first failure (later tasks are skipped) */
    dt_ctx err_ctx;
    double t_exposed, t_total;
    long gwin_task[2];       /* ZeRO: the task reading each gradient window (-1: none) */
    long pwin_task[2];       /* ZeRO-3: task filling each parameter window (-1: none) */
    /* ZeRO-3 under mixed precision (zero_params.c): matmul tensors gathered in 16 bits */
    int lp_gather;           /* z.lpwin > 0 */
    uint16_t *lpwin[2];      /* 16-bit windows beside pwin (z.lpwin values each) */
    int pwin_lp[2];          /* window w holds its unit's matmul tensors in lpwin[w] only */
    int *run0;               /* [U + 1]: unit u's matmul runs are [run0[u], run0[u + 1]) */
    size_t *run_off, *run_len; /* runs in unit offsets (params.h dt_params_matmul_runs) */
    size_t *mm_cnt, *mm_off; /* [U x G] matmul elements of each node-shard, and of those before */
    size_t *nm_cnt, *nm_off; /* [U x G] the same for the other elements */
    /* parallel.zero_reduce=step (zero_step.c): the step's full gradient acc (DDP/ZeRO-1's
     * field, n_params floats, kept between steps), which units a micro-step of this step formed
     * (touched[u]); in both modes which units were reduced this step (reduced[u]) */
    int zr_step;
    unsigned char *touched, *reduced;
    /* parallel.zero3_gather=step (zero_step.c): the resident parameters (n_params floats at
     * the store's offsets; 16-bit copies of the matmul runs beside under mixed precision),
     * unit u current since the shard last changed (res_ok[u]) and the task filling it */
    int zg_step;
    float *pres;
    uint16_t *pres16;
    unsigned char *res_ok;
    long *res_task;
    long n_reduce, n_gather; /* unit reductions and gathers run (dt_parallel_unit_counts) */
    /* expert parallelism (cfg.skip_len; decision 88): the local experts' units (uexp[u]) are
     * sharded over their expert-data-parallel group g_edp (Ge ranks, my index je; Ge <= G, so
     * the [U x G] split arrays hold their Ge parts first), the other units over g_shard. DDP:
     * Ge = 1. Their gradients are reduced by the trainer (train/ep.c), not here. */
    unsigned char *uexp;
    dt_group g_edp;
    int Ge, je;
    /* ZeRO-3's vocabulary row lookup (zero_lookup.c): one block of z.lk_bytes */
    void *lk_block;
    float *lk_recv;               /* what arrived: every rank's pieces of the rows (z.lk_rows x cols) */
    int64_t *lk_mine, *lk_all;    /* my token-id record; every shard rank's */
    size_t *lk_pos;               /* [z.lk_rows x G] where row k's piece from rank j arrived */
    int32_t *lk_ids;              /* the sorted union of the ids (z.lk_rows) */
    const int32_t *lk_tokens;     /* the task: tokens, count, tensor, output (N x cols) */
    int lk_n, lk_id;
    float *lk_out;
};

/* A unit's shard geometry: its group's size, my index in it, where my part's count and offset
 * sit in split_cnt / split_off, and the group. */
static inline int dt_par_G(const dt_parallel *p, int u) { return p->uexp[u] ? p->Ge : p->G; }
static inline int dt_par_j(const dt_parallel *p, int u) { return p->uexp[u] ? p->je : p->j; }
static inline size_t dt_par_ix(const dt_parallel *p, int u) { return (size_t)u * (size_t)p->G + (size_t)dt_par_j(p, u); }
static inline dt_group dt_par_group(const dt_parallel *p, int u) { return p->uexp[u] ? p->g_edp : p->g_shard; }
/* Whether unit u of store ps is a local expert's under cfg (expert parallelism's skip range). */
int dt_par_is_expert(const dt_params *ps, const dt_parallel_cfg *cfg, int u);

/* tasks.c: the communication thread and its task queue */
/* Starts the thread that runs submitted tasks (p->mu, p->cv initialised); stops and joins it
 * (a no-op when it is not running). */
dt_status dt_par_thread_start(dt_ctx *ctx, dt_parallel *p);
void dt_par_thread_stop(dt_parallel *p);
/* Submits a task; returns its sequence number (inline execution when not overlapping). */
long dt_par_submit(dt_parallel *p, dt_task_kind kind, int a, int b);
/* Waits until task `seq` (and all before it) finished; -1 is a no-op. */
void dt_par_wait(dt_parallel *p, long seq);
/* Runs one task (on whichever thread executes tasks). */
dt_status dt_par_run_task(dt_ctx *ctx, dt_parallel *p, const dt_par_task *t);
dt_status dt_par_reduce_bucket(dt_ctx *ctx, dt_parallel *p, int i);
dt_status dt_par_reduce_unit(dt_ctx *ctx, dt_parallel *p, int u, int buf);

/* buckets.c */
dt_status dt_par_buckets_init(dt_ctx *ctx, dt_parallel *p);
void dt_par_buckets_free(dt_parallel *p);
dt_status dt_par_buckets_finish(dt_ctx *ctx, dt_parallel *p);
/* zero.c */
dt_status dt_par_zero_init(dt_ctx *ctx, dt_parallel *p, uint64_t seed);
void dt_par_zero_free(dt_parallel *p);
void dt_par_zero_begin_micro(dt_parallel *p);
dt_status dt_par_zero_finish(dt_ctx *ctx, dt_parallel *p);
/* zero_params.c: ZeRO-3's parameter shard and windows */
dt_status dt_par_params_init(dt_ctx *ctx, dt_parallel *p, uint64_t seed);
void dt_par_params_free(dt_parallel *p);
/* Gathers the full parameters of unit u (ZeRO-3) into dst, in fp32. */
dt_status dt_par_gather_unit(dt_ctx *ctx, dt_parallel *p, int u, float *dst);
/* Gathers unit u into window w: its matmul tensors in 16 bits into lpwin[w], the others in
 * fp32 into pwin[w], at their unit offsets. */
dt_status dt_par_gather_unit_lp(dt_ctx *ctx, dt_parallel *p, int u, int w);
/* The master shard changed: no window holds a current unit. */
void dt_par_params_stale(dt_parallel *p);
/* zero_step.c: the once-per-step modes */
dt_status dt_par_step_init(dt_ctx *ctx, dt_parallel *p);
void dt_par_step_free(dt_parallel *p);
/* Hooks of the step modes, installed by dt_par_step_init over zero.c's / zero_params.c's. */
/* After the last micro-step (finish_grads): reduces the units the last micro-step did not. */
void dt_par_step_finish(dt_parallel *p);
/* ZeRO-3, step gathers: unit u into the resident buffer (the task). */
dt_status dt_par_gather_resident(dt_ctx *ctx, dt_parallel *p, int u);
/* The resident copies are stale (the shard changed). */
void dt_par_step_stale(dt_parallel *p);
/* zero_lookup.c: p->lk_out's rows = the rows of vocabulary tensor p->lk_id that p->lk_tokens
 * name (the task) */
dt_status dt_par_lookup(dt_ctx *ctx, dt_parallel *p);
/* Fills the lookup's sizes in z (called by dt_par_sizes_of). */
void dt_par_lookup_sizes(const dt_params *ps, const dt_parallel_cfg *cfg, int G, dt_par_sizes *z);

#endif
