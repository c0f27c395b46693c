/* comm_impl.h - the backend table behind dt_comm (internal to src/comm). A backend is one
 * file that fills dt_comm_ops; members marked (optional) may be NULL. */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include "comm/comm.h"
#include "comm/comm_fit.h"

/* The head of every backend's request (struct dt_comm_req begins with it): comm.c fills it
 * when the request is made and reads it at the wait, which the watchdog records as the
 * operation it completes - a point-to-point one with its peer. */
typedef struct dt_comm_req_head {
    int peer;     /* the peer's world rank (-1: a collective, or a peer not known) */
    int send;     /* point-to-point: 1 send, 0 receive */
    int p2p;      /* 1: a point-to-point request */
    dt_group group;
    size_t bytes;
} dt_comm_req_head;

typedef struct dt_comm_ops {
    const char *name;
    void (*free)(dt_comm *c);
    void (*abort)(dt_comm *c, int code);
    dt_status (*allreduce)(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t n, dt_dtype t, dt_redop op);
    dt_status (*allreduce_ordered)(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n, float *scratch);
    dt_status (*reduce_scatter_ordered)(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                        const size_t *counts, const size_t *displs, float *out, float *scratch);
    dt_status (*allgatherv)(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts,
                            const size_t *displs);
    /* the 16-bit reductions (comm.h), t = DT_BF16 or DT_F16 */
    dt_status (*allreduce_ordered_lp)(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, float *buf, size_t n,
                                      uint16_t *scratch);
    dt_status (*reduce_scatter_ordered_lp)(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, const float *buf,
                                           const size_t *counts, const size_t *displs, uint16_t *out,
                                           uint16_t *scratch);
    dt_status (*allgatherv_bf16)(dt_ctx *ctx, dt_comm *c, dt_group g, uint16_t *buf, const size_t *counts,
                                 const size_t *displs);
    dt_status (*reduce_scatter)(dt_ctx *ctx, dt_comm *c, dt_group g, const float *send, float *recv,
                                const size_t *counts);
    dt_status (*allgather)(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts);
    dt_status (*broadcast)(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int root);
    dt_status (*barrier)(dt_ctx *ctx, dt_comm *c, dt_group g);
    dt_status (*iallreduce)(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n, dt_comm_req **req);
    dt_status (*wait)(dt_ctx *ctx, dt_comm *c, dt_comm_req *req);
    /* makes group g (c->ngroups - 1 is its slot; sets c->rank[g], c->size[g]) from this rank's
     * member list: comm.h dt_comm_group_split */
    dt_status (*group_split)(dt_ctx *ctx, dt_comm *c, dt_group g, const int *ranks, int n);
    int (*group_shm)(const dt_comm *c, dt_group g); /* (optional) */
    /* point-to-point (send: 1, receive: 0); req NULL: blocking */
    dt_status (*p2p)(dt_ctx *ctx, dt_comm *c, dt_group g, int send, void *buf, size_t bytes, int peer, int tag,
                     dt_comm_req **req);
    dt_status (*alltoallv)(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, const size_t *scounts,
                           const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
                           size_t esize);
} dt_comm_ops;

struct dt_comm {
    const dt_comm_ops *ops;
    int rank[DT_GROUP_MAX], size[DT_GROUP_MAX];
    int ngroups; /* groups in use: DT_GROUP_N built-in, then dt_comm_group_split's */
    int nodes;
    int *members[DT_GROUP_MAX]; /* split groups: their members' world ranks in group order */
    _Atomic uint64_t bytes; /* atomic: concurrent lanes (dt_comm_init_concurrent) add to it at once */
    int concurrent;         /* MPI_THREAD_MULTIPLE: a thread per group class may run collectives */
    void *impl; /* backend state */
    struct dt_watchdog *wd; /* collective records and the watchdog thread */
    int hier_on;            /* the world's ordered all-reduce runs hierarchically now (comm_mpi.c) */
    dt_comm_fit *model;     /* (optional) the cost model: predicted_us sums its predictions */
    double predicted_us;
};

/* Records a collective's start (returns its ring slot) and end; comm.c wraps every op. */
int dt_wd_begin(dt_comm *c, const char *op, dt_group g, size_t bytes, int peer);
void dt_wd_end(dt_comm *c, int slot);
void dt_wd_free(dt_comm *c);

/* The owner's step of the 16-bit reductions (comm.h; t = DT_BF16 or DT_F16): out[i] = t of
 * the f32 sum, in rank order, of the widened contributions stacked at in[r * n + i], r < parts. */
void dt_comm_sum_lp(dt_dtype t, uint16_t *out, const uint16_t *in, size_t n, int parts);

/* Checks this rank's member list of dt_comm_group_split; *me = its index there. */
dt_status dt_comm_check_members(dt_ctx *ctx, const dt_comm *c, const int *ranks, int n, int *me);

/* Backend constructors. */
dt_status dt_comm_self_init(dt_ctx *ctx, dt_comm *c);
dt_status dt_comm_mpi_init(dt_ctx *ctx, dt_comm *c);

#endif
