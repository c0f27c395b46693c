/* Dispatch to the backend, the single-process backend, and shard arithmetic. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "ops/ops.h"

int dt_comm_launched_by_mpi(void) {
    const char *force = getenv("DTRAIN_COMM");
    if (force && *force) return strcmp(force, "mpi") == 0;
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                                       "MPI_LOCALNRANKS", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

int dt_comm_env_rank(void) {
    if (!dt_comm_launched_by_mpi()) return 0;
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", NULL};
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        if (!v || !*v) continue;
        long r = strtol(v, &end, 10);
        if (!*end && r >= 0 && r < 1000000000L) return (int)r;
    }
    return -1;
}

#ifndef DT_HAVE_MPI
/* A build without MPI (cmake -DDTRAIN_MPI=OFF: single-process machines, the aarch64 test
 * build) refuses a multi-rank launch instead of running it as N unrelated processes. */
dt_status dt_comm_mpi_init(dt_ctx *ctx, dt_comm *c) {
    (void)c;
    return dt_fail(ctx, DT_ERR_CONFIG, "comm: launched under MPI, but this dtrain was built "
                                       "without MPI (cmake -DDTRAIN_MPI=OFF)");
}

int dt_comm_set_shm(dt_comm *c, int on) {
    (void)c, (void)on;
    return 0;
}

int dt_comm_set_hierarchical(dt_comm *c, int on) {
    (void)c, (void)on;
    return 0;
}

const char *dt_comm_routing(const dt_comm *c) { return c->size[DT_GROUP_WORLD] > 1 ? "MPI" : "no communication"; }
#endif

static dt_status init_with(dt_ctx *ctx, dt_comm **out, int mpi, int concurrent) {
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    c->concurrent = concurrent;
    dt_status st = mpi ? dt_comm_mpi_init(ctx, c) : dt_comm_self_init(ctx, c);
    if (st != DT_OK) {
        free(c);
        return st;
    }
    *out = c;
    return DT_OK;
}

static dt_status init_launched(dt_ctx *ctx, dt_comm **out, int concurrent) {
    DT_CHECK(init_with(ctx, out, dt_comm_launched_by_mpi(), concurrent));
    ctx->rank = (*out)->rank[DT_GROUP_WORLD];
    ctx->world = (*out)->size[DT_GROUP_WORLD];
    return DT_OK;
}

dt_status dt_comm_init(dt_ctx *ctx, dt_comm **out) { return init_launched(ctx, out, 0); }
dt_status dt_comm_init_concurrent(dt_ctx *ctx, dt_comm **out) { return init_launched(ctx, out, 1); }

dt_status dt_comm_init_self(dt_ctx *ctx, dt_comm **out) { return init_with(ctx, out, 0, 0); }

void dt_comm_free(dt_comm *c) {
    if (!c) return;
    dt_wd_free(c);
    free(c->model);
    for (int g = 0; g < DT_GROUP_MAX; g++) free(c->members[g]);
    if (c->ops->free) c->ops->free(c);
    free(c);
}

void dt_comm_abort(dt_comm *c, int code) {
    if (c && c->ops->abort) c->ops->abort(c, code);
}

static int begin(dt_comm *c, const char *op, dt_group g, size_t bytes);

dt_status dt_comm_group_split(dt_ctx *ctx, dt_comm *c, const int *ranks, int n, dt_group *out) {
    /* The same answer on every rank (a rank over the limit is over it everywhere: all split
     * the same number of times), so nobody enters the backend's collective alone. */
    if (c->ngroups >= DT_GROUP_MAX)
        return dt_fail(ctx, DT_ERR_BACKEND, "comm: more than %d groups", DT_GROUP_MAX);
    dt_group g = c->ngroups++;
    c->rank[g] = -1;
    c->size[g] = n;
    int slot = begin(c, "group_split", DT_GROUP_WORLD, 0);
    dt_status st = c->ops->group_split(ctx, c, g, ranks, n);
    dt_wd_end(c, slot);
    if (st != DT_OK) {
        c->ngroups--;
        return st;
    }
    free(c->members[g]);
    if ((c->members[g] = malloc((size_t)n * sizeof(int)))) memcpy(c->members[g], ranks, (size_t)n * sizeof(int));
    *out = g;
    return DT_OK;
}

int dt_comm_group_shm(const dt_comm *c, dt_group g) { return c->ops->group_shm ? c->ops->group_shm(c, g) : 0; }

/* Checks this rank's member list (backends share it): n ranks of the world, no repeats, this
 * rank among them. Local: a list that passes here can still disagree with another member's,
 * which the backend's split finds. */
dt_status dt_comm_check_members(dt_ctx *ctx, const dt_comm *c, const int *ranks, int n, int *me) {
    int W = c->size[DT_GROUP_WORLD], wr = c->rank[DT_GROUP_WORLD];
    *me = -1;
    if (n < 1 || n > W) return dt_fail(ctx, DT_ERR_BACKEND, "comm: a group of %d ranks in a world of %d", n, W);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= W)
            return dt_fail(ctx, DT_ERR_BACKEND, "comm: group member %d is not a rank of the world of %d", ranks[i], W);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return dt_fail(ctx, DT_ERR_BACKEND, "comm: rank %d twice in a group", ranks[i]);
        if (ranks[i] == wr) *me = i;
    }
    if (*me < 0) return dt_fail(ctx, DT_ERR_BACKEND, "comm: rank %d split into a group without it", wr);
    return DT_OK;
}

int dt_comm_rank(const dt_comm *c, dt_group g) { return c->rank[g]; }
int dt_comm_world_rank(const dt_comm *c, dt_group g, int r) {
    if (g < 0 || g >= c->ngroups || r < 0 || r >= c->size[g]) return -1;
    if (g == DT_GROUP_WORLD) return r;
    if (g == DT_GROUP_NODE && c->size[g] == 1) return c->rank[DT_GROUP_WORLD];
    return g >= DT_GROUP_N && c->members[g] ? c->members[g][r] : -1;
}
int dt_comm_size(const dt_comm *c, dt_group g) { return c->size[g]; }
int dt_comm_num_nodes(const dt_comm *c) { return c->nodes; }
const char *dt_comm_backend(const dt_comm *c) { return c->ops->name; }
uint64_t dt_comm_bytes(const dt_comm *c) { return c->bytes; }

/* The cost model's name of a collective (the bench comm row it was fitted on); NULL: none. */
static const char *model_op(const char *op) {
    static const char *const map[][2] = {
        {"allreduce", "allreduce"},          {"allreduce_ordered", "allreduce_ordered"},
        {"allreduce_ordered_bf16", "allreduce_ordered"}, {"reduce_scatter_ordered", "reduce_scatter_ordered"},
        {"reduce_scatter_ordered_bf16", "reduce_scatter_ordered"}, {"allgatherv", "allgather"},
        {"allreduce_ordered_f16", "allreduce_ordered"}, {"reduce_scatter_ordered_f16", "reduce_scatter_ordered"},
        {"allgatherv_bf16", "allgather"},     {"reduce_scatter", "reduce_scatter"},
        {"allgather", "allgather"},          {"broadcast", "broadcast"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], op)) return map[i][1];
    return NULL;
}

/* Every collective: its prediction under the cost model (if set), then the watchdog record. */
/* The line of the group's own link level where the model has it (bench comm on several
 * nodes fits the node and cross groups apart), else the world's; the world's ordered all-reduce
 * takes the flat line while the hierarchical one is off. */
static int begin(dt_comm *c, const char *op, dt_group g, size_t bytes) {
    static const char *const gname[DT_GROUP_N] = {"world", "node", "cross"};
    const char *mop = c->model && c->size[g] > 1 ? model_op(op) : NULL;
    const dt_comm_fit_line *l = NULL;
    /* a split group (the mesh's) takes the fit of its kind over all ranks (no level of its own) */
    if (mop && g == DT_GROUP_WORLD && !c->hier_on && c->nodes > 1 && !strcmp(mop, "allreduce_ordered"))
        l = dt_comm_fit_find(c->model, "allreduce_ordered_flat", (double)bytes);
    if (mop && !l && g != DT_GROUP_WORLD && g < DT_GROUP_N) l = dt_comm_fit_find_in(c->model, gname[g], mop, (double)bytes);
    if (mop && !l) l = dt_comm_fit_find(c->model, mop, (double)bytes);
    if (l) c->predicted_us += dt_comm_fit_predict_us(l, (double)bytes);
    return dt_wd_begin(c, op, g, bytes, -1);
}

void dt_comm_set_model(dt_comm *c, const dt_comm_fit *f) {
    free(c->model);
    c->model = NULL;
    if (f && (c->model = malloc(sizeof *f))) *c->model = *f;
}

double dt_comm_predicted_us(const dt_comm *c) { return c->predicted_us; }

static size_t sum_counts(const dt_comm *c, dt_group g, const size_t *counts) {
    size_t n = 0;
    for (int i = 0; i < c->size[g]; i++) n += counts[i];
    return n;
}

dt_status dt_comm_allreduce(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t n,
                            dt_dtype t, dt_redop op) {
    int slot = begin(c, "allreduce", g, n * (t == DT_F32 ? 4 : 8));
    dt_status st = c->ops->allreduce(ctx, c, g, buf, n, t, op);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_allgather_words(dt_ctx *ctx, dt_comm *c, dt_group g, const void *mine, size_t words,
                                  void *all) {
    size_t n = (size_t)c->size[g] * words;
    memset(all, 0, n * 8);
    memcpy((char *)all + (size_t)c->rank[g] * words * 8, mine, words * 8);
    if (c->size[g] == 1) return DT_OK;
    return dt_comm_allreduce(ctx, c, g, all, n, DT_I64, DT_SUM);
}
dt_status dt_comm_allreduce_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                    float *scratch) {
    int slot = begin(c, "allreduce_ordered", g, n * 4);
    dt_status st = c->ops->allreduce_ordered(ctx, c, g, buf, n, scratch);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_reduce_scatter_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                         const size_t *counts, const size_t *displs, float *out,
                                         float *scratch) {
    int slot = begin(c, "reduce_scatter_ordered", g, sum_counts(c, g, counts) * 4);
    dt_status st = c->ops->reduce_scatter_ordered(ctx, c, g, buf, counts, displs, out, scratch);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_allgatherv(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts,
                             const size_t *displs) {
    int slot = begin(c, "allgatherv", g, sum_counts(c, g, counts) * 4);
    dt_status st = c->ops->allgatherv(ctx, c, g, buf, counts, displs);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_allreduce_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, float *buf, size_t n,
                                       uint16_t *scratch) {
    DT_ASSERT(t == DT_BF16 || t == DT_F16);
    int slot = begin(c, t == DT_BF16 ? "allreduce_ordered_bf16" : "allreduce_ordered_f16", g, n * 2);
    dt_status st = c->ops->allreduce_ordered_lp(ctx, c, g, t, buf, n, scratch);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_allreduce_ordered_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                         uint16_t *scratch) {
    return dt_comm_allreduce_ordered_lp(ctx, c, g, DT_BF16, buf, n, scratch);
}
dt_status dt_comm_reduce_scatter_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, const float *buf,
                                            const size_t *counts, const size_t *displs, uint16_t *out,
                                            uint16_t *scratch) {
    DT_ASSERT(t == DT_BF16 || t == DT_F16);
    int slot = begin(c, t == DT_BF16 ? "reduce_scatter_ordered_bf16" : "reduce_scatter_ordered_f16", g,
                     sum_counts(c, g, counts) * 2);
    dt_status st = c->ops->reduce_scatter_ordered_lp(ctx, c, g, t, buf, counts, displs, out, scratch);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_reduce_scatter_ordered_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                              const size_t *counts, const size_t *displs, uint16_t *out,
                                              uint16_t *scratch) {
    return dt_comm_reduce_scatter_ordered_lp(ctx, c, g, DT_BF16, buf, counts, displs, out, scratch);
}
dt_status dt_comm_allgatherv_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, uint16_t *buf, const size_t *counts,
                                  const size_t *displs) {
    int slot = begin(c, "allgatherv_bf16", g, sum_counts(c, g, counts) * 2);
    dt_status st = c->ops->allgatherv_bf16(ctx, c, g, buf, counts, displs);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_reduce_scatter(dt_ctx *ctx, dt_comm *c, dt_group g, const float *send,
                                 float *recv, const size_t *counts) {
    int slot = begin(c, "reduce_scatter", g, sum_counts(c, g, counts) * 4);
    dt_status st = c->ops->reduce_scatter(ctx, c, g, send, recv, counts);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_allgather(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts) {
    int slot = begin(c, "allgather", g, sum_counts(c, g, counts) * 4);
    dt_status st = c->ops->allgather(ctx, c, g, buf, counts);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_broadcast(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int root) {
    int slot = begin(c, "broadcast", g, bytes);
    dt_status st = c->ops->broadcast(ctx, c, g, buf, bytes, root);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_barrier(dt_ctx *ctx, dt_comm *c, dt_group g) {
    int slot = begin(c, "barrier", g, 0);
    dt_status st = c->ops->barrier(ctx, c, g);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_iallreduce(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                             dt_comm_req **req) {
    *req = NULL;
    dt_status st = c->ops->iallreduce(ctx, c, g, buf, n, req);
    if (st == DT_OK && *req) *(dt_comm_req_head *)*req = (dt_comm_req_head){-1, 0, 0, g, n * 4};
    return st;
}
/* The wait on a point-to-point request is recorded as a point-to-point operation with its
 * peer ("wait_isend" / "wait_irecv"): a stage blocked there points at the stage it waits on. */
dt_status dt_comm_wait(dt_ctx *ctx, dt_comm *c, dt_comm_req *req) {
    const dt_comm_req_head *h = (const dt_comm_req_head *)req;
    int slot = h && h->p2p ? dt_wd_begin(c, h->send ? "wait_isend" : "wait_irecv", h->group, h->bytes, h->peer)
                           : begin(c, "wait", h ? h->group : DT_GROUP_WORLD, 0);
    dt_status st = c->ops->wait(ctx, c, req);
    dt_wd_end(c, slot);
    return st;
}

/* A peer and tag the backends can take, named in the error otherwise. */
static dt_status check_p2p(dt_ctx *ctx, const dt_comm *c, dt_group g, int peer, int tag, size_t bytes) {
    if (peer < 0 || peer >= c->size[g])
        return dt_fail(ctx, DT_ERR_BACKEND, "comm: peer %d is not a rank of a group of %d", peer, c->size[g]);
    if (tag < 0 || tag > 32767) return dt_fail(ctx, DT_ERR_BACKEND, "comm: tag %d outside [0, 32767]", tag);
    if (bytes > INT_MAX) return dt_fail(ctx, DT_ERR_BACKEND, "comm: a message of %zu bytes is too large", bytes);
    return DT_OK;
}

static dt_status p2p(dt_ctx *ctx, dt_comm *c, dt_group g, int send, void *buf, size_t bytes, int peer, int tag,
                     dt_comm_req **req) {
    DT_CHECK(check_p2p(ctx, c, g, peer, tag, bytes));
    const int wpeer = dt_comm_world_rank(c, g, peer);
    if (req) { /* recorded at the wait */
        dt_status st = c->ops->p2p(ctx, c, g, send, buf, bytes, peer, tag, req);
        if (st == DT_OK && *req) *(dt_comm_req_head *)*req = (dt_comm_req_head){wpeer, send, 1, g, bytes};
        return st;
    }
    int slot = dt_wd_begin(c, send ? "send" : "recv", g, bytes, wpeer);
    dt_status st = c->ops->p2p(ctx, c, g, send, buf, bytes, peer, tag, NULL);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_send(dt_ctx *ctx, dt_comm *c, dt_group g, const void *buf, size_t bytes, int peer, int tag) {
    return p2p(ctx, c, g, 1, (void *)buf, bytes, peer, tag, NULL);
}
dt_status dt_comm_recv(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int peer, int tag) {
    return p2p(ctx, c, g, 0, buf, bytes, peer, tag, NULL);
}
dt_status dt_comm_isend(dt_ctx *ctx, dt_comm *c, dt_group g, const void *buf, size_t bytes, int peer, int tag,
                        dt_comm_req **req) {
    *req = NULL;
    return p2p(ctx, c, g, 1, (void *)buf, bytes, peer, tag, req);
}
dt_status dt_comm_irecv(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int peer, int tag,
                        dt_comm_req **req) {
    *req = NULL;
    return p2p(ctx, c, g, 0, buf, bytes, peer, tag, req);
}
dt_status dt_comm_alltoallv(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, const size_t *scounts,
                            const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
                            size_t esize) {
    int slot = begin(c, "alltoallv", g, sum_counts(c, g, scounts) * esize);
    dt_status st = c->ops->alltoallv(ctx, c, g, send, scounts, sdispls, recv, rcounts, rdispls, esize);
    dt_wd_end(c, slot);
    return st;
}
dt_status dt_comm_alltoall(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, void *recv, size_t count,
                           size_t esize) {
    int p = c->size[g];
    size_t *cd = malloc(2 * (size_t)p * sizeof *cd);
    if (!cd) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    for (int r = 0; r < p; r++) cd[r] = count, cd[p + r] = count * (size_t)r;
    dt_status st = dt_comm_alltoallv(ctx, c, g, send, cd, cd + p, recv, cd, cd + p, esize);
    free(cd);
    return st;
}

void dt_comm_sum_lp(dt_dtype t, uint16_t *out, const uint16_t *in, size_t n, int parts) {
    enum { BLOCK = 512 };
    float acc[BLOCK], x[BLOCK];
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        dt_from_lowp(t, acc, in + i0, m); /* widening is exact */
        for (int r = 1; r < parts; r++) {
            dt_from_lowp(t, x, in + (size_t)r * n + i0, m);
            for (size_t i = 0; i < m; i++) acc[i] += x[i];
        }
        dt_to_lowp(t, out + i0, acc, m);
    }
}

void dt_comm_split(size_t n, int parts, size_t *counts, size_t *offsets) {
    size_t base = n / (size_t)parts, extra = n % (size_t)parts, off = 0;
    for (int r = 0; r < parts; r++) {
        counts[r] = base + ((size_t)r < extra);
        if (offsets) offsets[r] = off;
        off += counts[r];
    }
}

/* ---- the single-process backend: every group is {self}; collectives are identities. */

static dt_status self_allreduce(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t n,
                                dt_dtype t, dt_redop op) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)n, (void)t, (void)op;
    return DT_OK;
}
static dt_status self_allreduce_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                        float *scratch) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)n, (void)scratch;
    return DT_OK;
}
static dt_status self_reduce_scatter_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                             const size_t *counts, const size_t *displs, float *out,
                                             float *scratch) {
    (void)ctx, (void)c, (void)g, (void)scratch;
    memmove(out, buf + displs[0], counts[0] * sizeof(float));
    return DT_OK;
}
static dt_status self_allgatherv(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts,
                                 const size_t *displs) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)counts, (void)displs;
    return DT_OK;
}
/* 16 bits with one rank: the rule of comm.h, t(x0), though nothing travels. */
static dt_status self_allreduce_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, float *buf, size_t n,
                                           uint16_t *scratch) {
    (void)ctx, (void)c, (void)g;
    dt_to_lowp(t, scratch, buf, n);
    dt_from_lowp(t, buf, scratch, n);
    return DT_OK;
}
static dt_status self_reduce_scatter_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, const float *buf,
                                                const size_t *counts, const size_t *displs, uint16_t *out,
                                                uint16_t *scratch) {
    (void)ctx, (void)c, (void)g, (void)scratch;
    dt_to_lowp(t, out, buf + displs[0], counts[0]);
    return DT_OK;
}
static dt_status self_allgatherv_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, uint16_t *buf, const size_t *counts,
                                      const size_t *displs) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)counts, (void)displs;
    return DT_OK;
}
static dt_status self_reduce_scatter(dt_ctx *ctx, dt_comm *c, dt_group g, const float *send,
                                     float *recv, const size_t *counts) {
    (void)ctx, (void)c, (void)g;
    if (recv != send) memmove(recv, send, counts[0] * sizeof(float));
    return DT_OK;
}
static dt_status self_allgather(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)counts;
    return DT_OK;
}
static dt_status self_broadcast(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int root) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)bytes, (void)root;
    return DT_OK;
}
static dt_status self_barrier(dt_ctx *ctx, dt_comm *c, dt_group g) {
    (void)ctx, (void)c, (void)g;
    return DT_OK;
}
static dt_status self_iallreduce(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                 dt_comm_req **req) {
    (void)ctx, (void)c, (void)g, (void)buf, (void)n;
    *req = NULL;
    return DT_OK;
}
static dt_status self_wait(dt_ctx *ctx, dt_comm *c, dt_comm_req *req) {
    (void)ctx, (void)c, (void)req;
    return DT_OK;
}

static dt_status self_p2p(dt_ctx *ctx, dt_comm *c, dt_group g, int send, void *buf, size_t bytes, int peer,
                          int tag, dt_comm_req **req) {
    (void)c, (void)g, (void)send, (void)buf, (void)bytes, (void)peer, (void)tag, (void)req;
    return dt_fail(ctx, DT_ERR_BACKEND, "comm: point-to-point needs a peer; this is a single process");
}
static dt_status self_alltoallv(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, const size_t *scounts,
                                const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
                                size_t esize) {
    (void)ctx, (void)c, (void)g, (void)rcounts;
    memcpy((char *)recv + rdispls[0] * esize, (const char *)send + sdispls[0] * esize, scounts[0] * esize);
    return DT_OK;
}

static dt_status self_group_split(dt_ctx *ctx, dt_comm *c, dt_group g, const int *ranks, int n) {
    int me;
    DT_CHECK(dt_comm_check_members(ctx, c, ranks, n, &me)); /* only {0} passes */
    c->rank[g] = 0;
    c->size[g] = 1;
    return DT_OK;
}

static const dt_comm_ops self_ops = {
    "self", NULL, NULL, self_allreduce, self_allreduce_ordered, self_reduce_scatter_ordered,
    self_allgatherv, self_allreduce_ordered_lp, self_reduce_scatter_ordered_lp, self_allgatherv_bf16,
    self_reduce_scatter, self_allgather, self_broadcast, self_barrier, self_iallreduce, self_wait,
    self_group_split, NULL, self_p2p, self_alltoallv,
};

dt_status dt_comm_self_init(dt_ctx *ctx, dt_comm *c) {
    (void)ctx;
    c->ops = &self_ops;
    for (int g = 0; g < DT_GROUP_N; g++) {
        c->rank[g] = 0;
        c->size[g] = 1;
    }
    c->nodes = 1;
    c->ngroups = DT_GROUP_N;
    return DT_OK;
}
