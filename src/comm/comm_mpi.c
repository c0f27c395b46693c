/* The MPI backend: standard MPI-3 only (Open MPI and MPICH). Errors come back as dt_status
 * with MPI's message (MPI_ERRORS_RETURN); note that Open MPI 4.1 aborts the whole job
 * itself when a peer process dies, so that case never reaches us. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "comm/shm.h"
#include "core/log.h"
#include "ops/ops.h"

#define NAME_LEN 256

typedef struct mpi_state {
    MPI_Comm comm[DT_GROUP_MAX];
    dt_shm *shm; /* the node's shared-memory segment (NULL: none, MPI everywhere) */
    dt_shm *gshm[DT_GROUP_MAX]; /* split groups inside the node: a segment each (NULL: MPI) */
    int node_id; /* the lowest world rank of this rank's node: the same for all ranks of a node */
    int shm_on;  /* route node-local groups to it (dt_comm_set_shm) */
    int hier_ok; /* several nodes, equal sizes > 1, each node's world ranks consecutive */
    int hier_want; /* dt_comm_set_hierarchical (default on): hierarchical where hier_ok and shm_on */
} mpi_state;

struct dt_comm_req {
    dt_comm_req_head head; /* first: comm.c reads it */
    MPI_Request r;
};

static MPI_Comm comm_of(dt_comm *c, dt_group g) { return ((mpi_state *)c->impl)->comm[g]; }

/* The shared-memory segment for group g when all of g's ranks are on this node (the node
 * group, or the world on one node: node ranks are in world order) and it is in use. */
static dt_shm *shm_of(dt_comm *c, dt_group g) {
    mpi_state *s = c->impl;
    if (!s->shm || !s->shm_on || c->size[g] < 2) return NULL;
    if (g >= DT_GROUP_N) return s->gshm[g];
    return g == DT_GROUP_NODE || (g == DT_GROUP_WORLD && c->nodes == 1) ? s->shm : NULL;
}

static dt_status mpi_err(dt_ctx *ctx, dt_comm *c, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return dt_fail(ctx, DT_ERR_BACKEND, "%s failed on rank %d: %s", what, c->rank[DT_GROUP_WORLD], msg);
}

#define MPI_TRY(call, what)                                                                  \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != MPI_SUCCESS) return mpi_err(ctx, c, rc_, what);                           \
    } while (0)

static MPI_Datatype mpi_type(dt_dtype t) {
    return t == DT_F32 ? MPI_FLOAT : t == DT_F64 ? MPI_DOUBLE : MPI_INT64_T;
}
static size_t type_size(dt_dtype t) { return t == DT_F32 ? 4 : 8; }
static MPI_Op mpi_op(dt_redop op) { return op == DT_SUM ? MPI_SUM : op == DT_MAX ? MPI_MAX : MPI_MIN; }

/* MPI counts are int: large buffers go in chunks. */
#define CHUNK ((size_t)1 << 30)

static dt_status m_allreduce(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t n, dt_dtype t,
                             dt_redop op) {
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + i * type_size(t), (int)m, mpi_type(t),
                              mpi_op(op), comm_of(c, g)),
                "MPI_Allreduce");
    }
    int p = c->size[g];
    c->bytes += (uint64_t)(2.0 * (p - 1) / p * (double)(n * type_size(t)));
    return DT_OK;
}


static dt_status to_int(dt_ctx *ctx, size_t v, int *out) {
    if (v > INT_MAX) return dt_fail(ctx, DT_ERR_BACKEND, "collective too large for MPI int counts (%zu)", v);
    *out = (int)v;
    return DT_OK;
}

/* The alltoallv counts of an ordered reduce-scatter: I send counts[r] elements from sdispls[r]
 * (NULL: packed in rank order) to rank r, and receive every rank's copy of my part (mine =
 * counts[me]) stacked in rank order. ic holds 4 p ints: scount | sdispl | rcount | rdispl. */
static dt_status exchange_counts(dt_ctx *ctx, int p, int me, const size_t *counts, const size_t *sdispls,
                                 int *ic) {
    int *scount = ic, *sdispl = ic + p, *rcount = ic + 2 * p, *rdispl = ic + 3 * p;
    size_t mine = counts[me], packed = 0;
    int imine = 0;
    dt_status st = to_int(ctx, mine, &imine);
    for (int r = 0; r < p && st == DT_OK; r++) {
        st = to_int(ctx, counts[r], &scount[r]);
        if (st == DT_OK) st = to_int(ctx, sdispls ? sdispls[r] : packed, &sdispl[r]);
        if (st == DT_OK) st = to_int(ctx, mine * (size_t)r, &rdispl[r]);
        rcount[r] = imine;
        packed += counts[r];
    }
    return st;
}

static dt_status m_reduce_scatter_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, const float *buf,
                                          const size_t *counts, const size_t *displs, float *out,
                                          float *scratch) {
    int p = c->size[g], me = c->rank[g];
    size_t mine = counts[me];
    if (p == 1) {
        memmove(out, buf + displs[0], counts[0] * sizeof(float));
        return DT_OK;
    }
    dt_shm *sh = shm_of(c, g);
    if (sh) {
        size_t total = 0;
        for (int r = 0; r < p; r++) total += counts[r];
        dt_shm_reduce_scatter_ordered(sh, buf, counts, displs, out);
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * 4));
        return DT_OK;
    }
    int *ic = malloc(4 * (size_t)p * sizeof(int));
    if (!ic) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    int *scount = ic, *sdispl = ic + p, *rcount = ic + 2 * p, *rdispl = ic + 3 * p;
    dt_status st = exchange_counts(ctx, p, me, counts, displs, ic);
    if (st == DT_OK) {
        /* Every rank's copy of my part lands in scratch, stacked in rank order. */
        int rc = MPI_Alltoallv(buf, scount, sdispl, MPI_FLOAT, scratch, rcount, rdispl, MPI_FLOAT, comm_of(c, g));
        if (rc != MPI_SUCCESS) st = mpi_err(ctx, c, rc, "MPI_Alltoallv");
    }
    if (st == DT_OK) {
        for (size_t i = 0; i < mine; i++) out[i] = scratch[i];
        for (int r = 1; r < p; r++) {
            const float *x = scratch + mine * (size_t)r;
            for (size_t i = 0; i < mine; i++) out[i] += x[i];
        }
        size_t total = 0;
        for (int r = 0; r < p; r++) total += counts[r];
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * 4));
    }
    free(ic);
    return st;
}

/* In-place all-gather of elements of `type` (esize bytes) with any layout. */
static dt_status allgatherv_of(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, const size_t *counts,
                               const size_t *displs, MPI_Datatype type, size_t esize) {
    int p = c->size[g];
    if (p == 1) return DT_OK;
    dt_shm *sh = shm_of(c, g);
    if (sh) {
        size_t total = 0;
        for (int r = 0; r < p; r++) total += counts[r];
        dt_shm_allgatherv(sh, buf, counts, displs, esize);
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * esize));
        return DT_OK;
    }
    int *ic = malloc(2 * (size_t)p * sizeof(int));
    if (!ic) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    dt_status st = DT_OK;
    size_t total = 0;
    for (int r = 0; r < p && st == DT_OK; r++) {
        st = to_int(ctx, counts[r], &ic[r]);
        if (st == DT_OK) st = to_int(ctx, displs[r], &ic[p + r]);
        total += counts[r];
    }
    if (st == DT_OK) {
        int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, ic + p, type, comm_of(c, g));
        if (rc != MPI_SUCCESS) st = mpi_err(ctx, c, rc, "MPI_Allgatherv");
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * esize));
    }
    free(ic);
    return st;
}

static dt_status m_allgatherv(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts,
                              const size_t *displs) {
    return allgatherv_of(ctx, c, g, buf, counts, displs, MPI_FLOAT, sizeof(float));
}

static dt_status m_allgatherv_bf16(dt_ctx *ctx, dt_comm *c, dt_group g, uint16_t *buf, const size_t *counts,
                                   const size_t *displs) {
    return allgatherv_of(ctx, c, g, buf, counts, displs, MPI_UINT16_T, sizeof(uint16_t));
}

/* The hierarchical chain (shm.h dt_shm_allreduce_ordered_chain) over the cross group: node k's
 * owner of a part receives the running sum from node k - 1, passes its own on to node k + 1,
 * and the last node broadcasts the total. */
typedef struct chain_ud {
    dt_comm *c;
    int rc; /* the first MPI error */
} chain_ud;

static int chain_prefix(void *ud, float *acc, size_t n) {
    chain_ud *u = ud;
    int k = u->c->rank[DT_GROUP_CROSS];
    if (k == 0) return 0;
    int rc = MPI_Recv(acc, (int)n, MPI_FLOAT, k - 1, 0, comm_of(u->c, DT_GROUP_CROSS), MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS && u->rc == MPI_SUCCESS) u->rc = rc;
    return 1;
}

static void chain_finish(void *ud, float *acc, size_t n) {
    chain_ud *u = ud;
    int k = u->c->rank[DT_GROUP_CROSS], N = u->c->size[DT_GROUP_CROSS], rc = MPI_SUCCESS;
    MPI_Comm cc = comm_of(u->c, DT_GROUP_CROSS);
    if (k + 1 < N) rc = MPI_Send(acc, (int)n, MPI_FLOAT, k + 1, 0, cc);
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(acc, (int)n, MPI_FLOAT, N - 1, cc);
    if (rc != MPI_SUCCESS && u->rc == MPI_SUCCESS) u->rc = rc;
}

/* Ordered all-reduce = ordered reduce-scatter over an even split + all-gather. */
static dt_status m_allreduce_ordered(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n,
                                     float *scratch) {
    int p = c->size[g], me = c->rank[g];
    if (p == 1) return DT_OK;
    dt_shm *sh = shm_of(c, g);
    if (sh) {
        dt_shm_allreduce_ordered(sh, buf, n);
        c->bytes += (uint64_t)(2.0 * (p - 1) / p * (double)(n * 4));
        return DT_OK;
    }
    mpi_state *ms = c->impl;
    if (g == DT_GROUP_WORLD && ms->hier_want && ms->hier_ok && ms->shm_on) {
        chain_ud u = {c, MPI_SUCCESS};
        dt_shm_chain ch = {&u, chain_prefix, chain_finish};
        dt_shm_allreduce_ordered_chain(ms->shm, buf, n, &ch);
        if (u.rc != MPI_SUCCESS) return mpi_err(ctx, c, u.rc, "hierarchical all-reduce");
        /* this rank's bytes: the node-local exchange, then its part once down the chain and
         * once back (broadcast) */
        int L = c->size[DT_GROUP_NODE];
        c->bytes += (uint64_t)((double)(L - 1) / L * (double)(n * 4) * 2.0 + 2.0 * (double)(n * 4) / L);
        return DT_OK;
    }
    size_t *cnt = malloc(2 * (size_t)p * sizeof(size_t));
    if (!cnt) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    dt_comm_split(n, p, cnt, cnt + p);
    dt_status st = m_reduce_scatter_ordered(ctx, c, g, buf, cnt, cnt + p, buf + cnt[p + me], scratch);
    if (st == DT_OK) st = m_allgatherv(ctx, c, g, buf, cnt, cnt + p);
    free(cnt);
    return st;
}

/* The 16-bit reduce-scatter (comm.h; t = DT_BF16 or DT_F16): my contributions to every rank's part, rounded, packed in
 * rank order at the start of scratch (sum(counts)); every rank's copy of my part lands after
 * them, stacked in rank order (size x counts[me]); dt_comm_sum_lp sums those into out.
 * Internally out may be the packed place of my own part: it is written after the exchange. */
static dt_status m_reduce_scatter_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, const float *buf,
                                             const size_t *counts, const size_t *displs, uint16_t *out,
                                             uint16_t *scratch) {
    int p = c->size[g], me = c->rank[g];
    size_t mine = counts[me], total = 0;
    if (p == 1) {
        dt_to_lowp(t, out, buf + displs[0], counts[0]);
        return DT_OK;
    }
    dt_shm *sh = shm_of(c, g);
    if (sh) {
        for (int r = 0; r < p; r++) total += counts[r];
        dt_shm_reduce_scatter_ordered_lp(sh, t, buf, counts, displs, out);
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * 2));
        return DT_OK;
    }
    int *ic = malloc(4 * (size_t)p * sizeof(int));
    if (!ic) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    int *scount = ic, *sdispl = ic + p, *rcount = ic + 2 * p, *rdispl = ic + 3 * p;
    dt_status st = exchange_counts(ctx, p, me, counts, NULL, ic); /* sent packed */
    for (int r = 0; r < p; r++) total += counts[r];
    uint16_t *recv = scratch + total;
    if (st == DT_OK) {
        for (int r = 0; r < p; r++) dt_to_lowp(t, scratch + sdispl[r], buf + displs[r], counts[r]);
        int rc = MPI_Alltoallv(scratch, scount, sdispl, MPI_UINT16_T, recv, rcount, rdispl, MPI_UINT16_T,
                               comm_of(c, g));
        if (rc != MPI_SUCCESS) st = mpi_err(ctx, c, rc, "MPI_Alltoallv");
    }
    if (st == DT_OK) {
        dt_comm_sum_lp(t, out, recv, mine, p);
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * 2));
    }
    free(ic);
    return st;
}

/* 16-bit ordered all-reduce: the 16-bit reduce-scatter over an even split, its results written
 * where my part was packed (so the buffer that was sent becomes the one gathered), a 16-bit
 * all-gather in place, and every element widened back into buf. */
static dt_status m_allreduce_ordered_lp(dt_ctx *ctx, dt_comm *c, dt_group g, dt_dtype t, float *buf, size_t n,
                                        uint16_t *scratch) {
    int p = c->size[g], me = c->rank[g];
    dt_status st = DT_OK;
    if (p > 1) {
        size_t *cnt = malloc(2 * (size_t)p * sizeof(size_t));
        if (!cnt) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
        dt_comm_split(n, p, cnt, cnt + p);
        st = m_reduce_scatter_ordered_lp(ctx, c, g, t, buf, cnt, cnt + p, scratch + cnt[p + me], scratch);
        if (st == DT_OK) st = m_allgatherv_bf16(ctx, c, g, scratch, cnt, cnt + p);
        free(cnt);
    } else {
        dt_to_lowp(t, scratch, buf, n); /* one rank: t(x0), nothing travels */
    }
    if (st == DT_OK) dt_from_lowp(t, buf, scratch, n);
    return st;
}

static dt_status int_counts(dt_ctx *ctx, dt_comm *c, dt_group g, const size_t *counts, int *ic,
                            int *displs, size_t *total) {
    size_t off = 0;
    for (int r = 0; r < c->size[g]; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            return dt_fail(ctx, DT_ERR_BACKEND, "collective too large for MPI int counts (%zu elements)", counts[r]);
        ic[r] = (int)counts[r];
        displs[r] = (int)off;
        off += counts[r];
    }
    *total = off;
    return DT_OK;
}

static dt_status m_reduce_scatter(dt_ctx *ctx, dt_comm *c, dt_group g, const float *send, float *recv,
                                  const size_t *counts) {
    int p = c->size[g];
    int *ic = malloc(2 * (size_t)p * sizeof(int));
    if (!ic) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    size_t total = 0;
    dt_status st = int_counts(ctx, c, g, counts, ic, ic + p, &total);
    if (st == DT_OK) {
        int rc = MPI_Reduce_scatter(send, recv, ic, MPI_FLOAT, MPI_SUM, comm_of(c, g));
        if (rc != MPI_SUCCESS) st = mpi_err(ctx, c, rc, "MPI_Reduce_scatter");
        c->bytes += (uint64_t)((double)(p - 1) / p * (double)(total * 4));
    }
    free(ic);
    return st;
}

static dt_status m_allgather(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, const size_t *counts) {
    int p = c->size[g];
    size_t *displs = malloc((size_t)p * sizeof *displs);
    if (!displs) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    for (int r = 0, off = 0; r < p; off += (int)counts[r], r++) displs[r] = (size_t)off;
    dt_status st = m_allgatherv(ctx, c, g, buf, counts, displs);
    free(displs);
    return st;
}

static dt_status m_broadcast(dt_ctx *ctx, dt_comm *c, dt_group g, void *buf, size_t bytes, int root) {
    for (size_t i = 0; i < bytes; i += CHUNK) {
        size_t m = bytes - i < CHUNK ? bytes - i : CHUNK;
        MPI_TRY(MPI_Bcast((char *)buf + i, (int)m, MPI_BYTE, root, comm_of(c, g)), "MPI_Bcast");
    }
    c->bytes += bytes;
    return DT_OK;
}

static dt_status m_barrier(dt_ctx *ctx, dt_comm *c, dt_group g) {
    MPI_TRY(MPI_Barrier(comm_of(c, g)), "MPI_Barrier");
    return DT_OK;
}

static dt_status m_iallreduce(dt_ctx *ctx, dt_comm *c, dt_group g, float *buf, size_t n, dt_comm_req **req) {
    if (n > INT_MAX) return dt_fail(ctx, DT_ERR_BACKEND, "non-blocking all-reduce of %zu elements is too large", n);
    dt_comm_req *r = malloc(sizeof *r);
    if (!r) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm_of(c, g), &r->r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_err(ctx, c, rc, "MPI_Iallreduce");
    }
    int p = c->size[g];
    c->bytes += (uint64_t)(2.0 * (p - 1) / p * (double)(n * 4));
    *req = r;
    return DT_OK;
}

static dt_status m_wait(dt_ctx *ctx, dt_comm *c, dt_comm_req *req) {
    if (!req) return DT_OK;
    int rc = MPI_Wait(&req->r, MPI_STATUS_IGNORE);
    free(req);
    if (rc != MPI_SUCCESS) return mpi_err(ctx, c, rc, "MPI_Wait");
    return DT_OK;
}

static void m_free(dt_comm *c) {
    mpi_state *s = c->impl;
    if (s) {
        dt_shm_free(s->shm);
        for (int g = 0; g < c->ngroups; g++) {
            dt_shm_free(s->gshm[g]);
            if (s->comm[g] != MPI_COMM_NULL) MPI_Comm_free(&s->comm[g]);
        }
        free(s);
    }
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

static void m_abort(dt_comm *c, int code) {
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* The node's shared-memory segment (shm.h), unless DTRAIN_SHM=0 or the node has one rank:
 * local rank 0 creates it and broadcasts its name, the others attach, everyone reports, and
 * once all have mapped it rank 0 unlinks the name. Any failure (no /dev/shm, too small) leaves
 * every rank of the node on MPI, with one warning. */
/* A segment for the P ranks of comm (all on this node; me: this rank's index): the first
 * creates it, the others attach. *out stays NULL unless every rank mapped it; *ok says
 * whether this rank did its part, tmp holds its error. */
static dt_status shm_make(dt_ctx *ctx, dt_comm *c, MPI_Comm comm, int P, int me, dt_shm **out, int *ok,
                          dt_ctx *tmp) {
    char name[64] = "";
    *ok = 1;
    if (me == 0 && dt_shm_create(tmp, out, P, name) != DT_OK) *ok = 0, name[0] = 0;
    MPI_TRY(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm), "MPI_Bcast (shm name)");
    if (me != 0 && (!name[0] || dt_shm_attach(tmp, out, me, P, name) != DT_OK)) *ok = 0;
    int all = 0;
    MPI_TRY(MPI_Allreduce(ok, &all, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce (shm)");
    if (me == 0 && name[0]) dt_shm_unlink(name); /* everyone mapped it (or gave up) */
    MPI_TRY(MPI_Barrier(comm), "MPI_Barrier (shm)"); /* the name is gone for all */
    if (!all) {
        dt_shm_free(*out);
        *out = NULL;
    }
    return DT_OK;
}

static dt_status shm_setup(dt_ctx *ctx, dt_comm *c, mpi_state *s) {
    const char *env = getenv("DTRAIN_SHM");
    int P = c->size[DT_GROUP_NODE], me = c->rank[DT_GROUP_NODE];
    if (P < 2 || (env && !strcmp(env, "0"))) return DT_OK;
    dt_ctx tmp;
    dt_ctx_init(&tmp);
    int ok = 1;
    DT_CHECK(shm_make(ctx, c, s->comm[DT_GROUP_NODE], P, me, &s->shm, &ok, &tmp));
    if (!s->shm) {
        if (!ok) {
            dt_ctx lc = *ctx;
            lc.rank = c->rank[DT_GROUP_WORLD];
            dt_log_warn(&lc, "node-local shared-memory collectives unavailable (%s); using MPI",
                        tmp.err[0] ? tmp.err : "another rank failed");
        }
        return DT_OK;
    }
    s->shm_on = 1;
    return DT_OK;
}

/* Every rank (a collective over the world): the hierarchical all-reduce needs shared memory
 * on every node, the same number L > 1 of ranks on each, and every node's world ranks
 * consecutive (node k = ranks k L .. k L + L - 1), so the chain of nodes adds in world-rank
 * order. */
static dt_status hier_setup(dt_ctx *ctx, dt_comm *c, mpi_state *s) {
    int L = c->size[DT_GROUP_NODE];
    int v[3] = {L, -L, s->shm_on && c->rank[DT_GROUP_WORLD] == c->rank[DT_GROUP_CROSS] * L + c->rank[DT_GROUP_NODE]};
    int lo[3];
    MPI_TRY(MPI_Allreduce(v, lo, 3, MPI_INT, MPI_MIN, s->comm[DT_GROUP_WORLD]), "MPI_Allreduce (node layout)");
    s->hier_ok = c->nodes > 1 && lo[0] == -lo[1] && lo[0] > 1 && lo[2] == 1;
    s->hier_want = 1;
    return DT_OK;
}

int dt_comm_set_shm(dt_comm *c, int on) {
    if (strcmp(c->ops->name, "mpi")) return 0;
    mpi_state *s = c->impl;
    s->shm_on = on && s->shm;
    c->hier_on = s->hier_want && s->hier_ok && s->shm_on;
    return s->shm_on;
}

const char *dt_comm_routing(const dt_comm *c) {
    if (strcmp(c->ops->name, "mpi")) return c->size[DT_GROUP_WORLD] > 1 ? "MPI" : "no communication";
    const mpi_state *s = c->impl;
    if (!s->shm_on) return "MPI";
    if (s->hier_want && s->hier_ok) return "shared memory inside nodes, hierarchical all-reduce across them";
    return c->nodes > 1 ? "shared memory inside nodes, MPI across them" : "shared memory inside the node";
}

int dt_comm_set_hierarchical(dt_comm *c, int on) {
    if (strcmp(c->ops->name, "mpi")) return 0;
    mpi_state *s = c->impl;
    s->hier_want = on;
    c->hier_on = on && s->hier_ok && s->shm_on;
    return c->hier_on;
}

/* dt_comm_group_split: MPI_Comm_split of the world with the group's lowest rank as colour and
 * the place in the list as key, then a check that the communicator holds exactly the listed
 * ranks in that order (lists that do not partition the world give groups that differ from
 * some member's list), agreed over the world so that every rank fails or none. A group inside
 * one node gets a shared-memory segment of its own (when the node has one: DTRAIN_SHM=0 or a
 * failed node segment leave it on MPI); its ranks map it together. */
static dt_status m_group_split(dt_ctx *ctx, dt_comm *c, dt_group g, const int *ranks, int n) {
    mpi_state *s = c->impl;
    dt_ctx mine;
    dt_ctx_init(&mine);
    int me = -1, lo = INT_MAX;
    int ok = dt_comm_check_members(&mine, c, ranks, n, &me) == DT_OK;
    for (int i = 0; ok && i < n; i++) lo = ranks[i] < lo ? ranks[i] : lo;
    MPI_Comm nc = MPI_COMM_NULL;
    MPI_TRY(MPI_Comm_split(s->comm[DT_GROUP_WORLD], ok ? lo : MPI_UNDEFINED, me, &nc), "MPI_Comm_split (group)");
    if (ok) {
        int sz = 0;
        MPI_Comm_size(nc, &sz);
        MPI_Group wg, gg;
        MPI_Comm_group(s->comm[DT_GROUP_WORLD], &wg);
        MPI_Comm_group(nc, &gg);
        int *idx = malloc(2 * (size_t)sz * sizeof(int));
        ok = idx != NULL;
        if (ok && sz == n) {
            for (int i = 0; i < n; i++) idx[i] = i;
            MPI_Group_translate_ranks(gg, n, idx, wg, idx + n);
            for (int i = 0; i < n && ok; i++) ok = idx[n + i] == ranks[i];
        } else {
            ok = 0;
        }
        if (!ok && !mine.err[0])
            snprintf(mine.err, sizeof mine.err, "comm: rank %d's group list (%d ranks from %d) is not its members' "
                     "(the lists do not partition the world)", c->rank[DT_GROUP_WORLD], n, ranks[0]);
        free(idx);
        MPI_Group_free(&wg);
        MPI_Group_free(&gg);
    }
    int all = 0;
    MPI_TRY(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, s->comm[DT_GROUP_WORLD]), "MPI_Allreduce (group split)");
    if (!all) {
        if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
        return dt_fail(ctx, DT_ERR_BACKEND, "%s", ok ? "comm: another rank's group list is not its members' "
                                                      "(the lists do not partition the world)" : mine.err);
    }
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    s->comm[g] = nc;
    c->rank[g] = me;
    c->size[g] = n;
    /* inside one node: every member's node id is the same */
    int v[2] = {s->node_id, -s->node_id}, m[2];
    MPI_TRY(MPI_Allreduce(v, m, 2, MPI_INT, MPI_MIN, nc), "MPI_Allreduce (group node)");
    if (n > 1 && m[0] == -m[1] && s->shm) {
        dt_ctx tmp;
        dt_ctx_init(&tmp);
        int sok = 1;
        DT_CHECK(shm_make(ctx, c, nc, n, me, &s->gshm[g], &sok, &tmp));
        if (!sok) {
            dt_ctx lc = *ctx;
            lc.rank = c->rank[DT_GROUP_WORLD];
            dt_log_warn(&lc, "a node-local group's shared-memory segment is unavailable (%s); it uses MPI", tmp.err);
        }
    }
    return DT_OK;
}

static dt_status m_p2p(dt_ctx *ctx, dt_comm *c, dt_group g, int send, void *buf, size_t bytes, int peer, int tag,
                       dt_comm_req **req) {
    MPI_Comm comm = comm_of(c, g);
    if (!req) {
        if (send) MPI_TRY(MPI_Send(buf, (int)bytes, MPI_BYTE, peer, tag, comm), "MPI_Send");
        else MPI_TRY(MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, tag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
    } else {
        dt_comm_req *r = malloc(sizeof *r);
        if (!r) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
        int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &r->r)
                      : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &r->r);
        if (rc != MPI_SUCCESS) {
            free(r);
            return mpi_err(ctx, c, rc, send ? "MPI_Isend" : "MPI_Irecv");
        }
        *req = r;
    }
    if (send) c->bytes += bytes;
    return DT_OK;
}

/* Counts in elements of a contiguous type of esize bytes, so int counts reach esize x 2^31. */
static dt_status m_alltoallv(dt_ctx *ctx, dt_comm *c, dt_group g, const void *send, const size_t *scounts,
                             const size_t *sdispls, void *recv, const size_t *rcounts, const size_t *rdispls,
                             size_t esize) {
    int p = c->size[g], me = c->rank[g];
    if (esize == 0 || esize > INT_MAX) return dt_fail(ctx, DT_ERR_BACKEND, "comm: all-to-all of %zu-byte elements", esize);
    int *ic = malloc(4 * (size_t)p * sizeof(int));
    if (!ic) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    dt_status st = DT_OK;
    size_t sent = 0;
    for (int r = 0; r < p && st == DT_OK; r++) {
        st = to_int(ctx, scounts[r], &ic[r]);
        if (st == DT_OK) st = to_int(ctx, sdispls[r], &ic[p + r]);
        if (st == DT_OK) st = to_int(ctx, rcounts[r], &ic[2 * p + r]);
        if (st == DT_OK) st = to_int(ctx, rdispls[r], &ic[3 * p + r]);
        if (r != me) sent += scounts[r];
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    if (st == DT_OK) {
        int rc = MPI_Type_contiguous((int)esize, MPI_BYTE, &t);
        if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&t);
        if (rc == MPI_SUCCESS)
            rc = MPI_Alltoallv(send, ic, ic + p, t, recv, ic + 2 * p, ic + 3 * p, t, comm_of(c, g));
        if (rc != MPI_SUCCESS) st = mpi_err(ctx, c, rc, "MPI_Alltoallv");
        if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
        c->bytes += sent * esize;
    }
    free(ic);
    return st;
}

static int m_group_shm(const dt_comm *c, dt_group g) { return shm_of((dt_comm *)c, g) != NULL; }

static const dt_comm_ops mpi_ops = {
    "mpi", m_free, m_abort, m_allreduce, m_allreduce_ordered, m_reduce_scatter_ordered,
    m_allgatherv, m_allreduce_ordered_lp, m_reduce_scatter_ordered_lp, m_allgatherv_bf16,
    m_reduce_scatter, m_allgather, m_broadcast, m_barrier, m_iallreduce, m_wait,
    m_group_split, m_group_shm, m_p2p, m_alltoallv,
};

dt_status dt_comm_mpi_init(dt_ctx *ctx, dt_comm *c) {
    int provided = 0, inited = 0;
    /* Open MPI busy-polls while a rank waits in a collective. dtrain's communication thread
     * waits there while the compute threads run, so polling steals their cores (measured:
     * gpt2, 2 ranks x 1 thread on 2 cores, 235 -> 246 tokens/s with yielding). A value the
     * user set wins. */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    MPI_Initialized(&inited);
    /* SERIALIZED: a communication thread may run collectives, never two threads at once.
     * MULTIPLE only for concurrent lanes (comm.h dt_comm_init_concurrent): it costs a lock
     * in every MPI call, which plain data parallelism does not need. */
    int want = c->concurrent ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    if (!inited && MPI_Init_thread(NULL, NULL, want, &provided) != MPI_SUCCESS)
        return dt_fail(ctx, DT_ERR_BACKEND, "MPI_Init_thread failed");
    if (inited) MPI_Query_thread(&provided);
    c->ops = &mpi_ops;
    mpi_state *s = calloc(1, sizeof *s);
    char *names = NULL;
    if (!s) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    c->impl = s;
    for (int g = 0; g < DT_GROUP_MAX; g++) s->comm[g] = MPI_COMM_NULL;
    c->ngroups = DT_GROUP_N;
    MPI_Comm_dup(MPI_COMM_WORLD, &s->comm[DT_GROUP_WORLD]);
    MPI_Comm_set_errhandler(s->comm[DT_GROUP_WORLD], MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm[DT_GROUP_WORLD], &c->rank[DT_GROUP_WORLD]);
    MPI_Comm_size(s->comm[DT_GROUP_WORLD], &c->size[DT_GROUP_WORLD]);
    if (provided < want)
        return dt_fail(ctx, DT_ERR_BACKEND, "the MPI library provides thread level %d, need %s", provided,
                       c->concurrent ? "MPI_THREAD_MULTIPLE (concurrent communication lanes)" : "MPI_THREAD_SERIALIZED");
    /* Node identity: DTRAIN_NODE_ID (simulated nodes) or the host name. Ranks with the same
     * name form a node; nodes are numbered in order of their lowest rank. */
    char mine[NAME_LEN] = "";
    const char *id = getenv("DTRAIN_NODE_ID");
    if (id && *id) snprintf(mine, sizeof mine, "%s", id);
    else snprintf(mine, sizeof mine, "%s", ctx->host);
    int p = c->size[DT_GROUP_WORLD], me = c->rank[DT_GROUP_WORLD];
    names = calloc((size_t)p, NAME_LEN);
    if (!names) return dt_fail(ctx, DT_ERR_NOMEM, "comm: out of memory");
    MPI_TRY(MPI_Allgather(mine, NAME_LEN, MPI_CHAR, names, NAME_LEN, MPI_CHAR, s->comm[DT_GROUP_WORLD]),
            "MPI_Allgather of node names");
    int color = -1, nodes = 0;
    for (int r = 0; r < p; r++) {
        int first = 1;
        for (int q = 0; q < r && first; q++) first = strcmp(names + (size_t)q * NAME_LEN, names + (size_t)r * NAME_LEN) != 0;
        if (first) nodes++;
        if (color < 0 && strcmp(names + (size_t)r * NAME_LEN, mine) == 0) color = r;
    }
    free(names);
    c->nodes = nodes;
    s->node_id = color;
    MPI_TRY(MPI_Comm_split(s->comm[DT_GROUP_WORLD], color, me, &s->comm[DT_GROUP_NODE]), "MPI_Comm_split (node)");
    MPI_Comm_rank(s->comm[DT_GROUP_NODE], &c->rank[DT_GROUP_NODE]);
    MPI_Comm_size(s->comm[DT_GROUP_NODE], &c->size[DT_GROUP_NODE]);
    MPI_TRY(MPI_Comm_split(s->comm[DT_GROUP_WORLD], c->rank[DT_GROUP_NODE], me, &s->comm[DT_GROUP_CROSS]),
            "MPI_Comm_split (cross)");
    MPI_Comm_rank(s->comm[DT_GROUP_CROSS], &c->rank[DT_GROUP_CROSS]);
    MPI_Comm_size(s->comm[DT_GROUP_CROSS], &c->size[DT_GROUP_CROSS]);
    for (int g = DT_GROUP_NODE; g < DT_GROUP_N; g++) MPI_Comm_set_errhandler(s->comm[g], MPI_ERRORS_RETURN);
    DT_CHECK(shm_setup(ctx, c, s));
    return hier_setup(ctx, c, s);
}
