/* params.h - the parameter store: a family's table of tensors laid out as units.
 *
 * A model family describes its parameters as one table of dt_tensor_info rows (name, shape,
 * dtype, group, init, weight decay, external name); the store lays them out in one flat
 * index space: the PRE tensors (embeddings), then n_layer contiguous layer blocks (every
 * LAYER tensor once per layer, in table order), then the POST tensors (final norm, head).
 * Units cut that space into contiguous regions, in order: the PRE units (a run of small
 * tensors, or one row chunk of a vocabulary tensor each), then layer_units units per layer,
 * then the POST units. A layer's units are sub-layer units, as FSDP wraps modules: the
 * family marks the LAYER tensors that start a new one (unit_start; gpt2: [ln_1, attention]
 * [ln_2, fc] [fc_proj]), so the windows of ZeRO-2/3 hold a part of a layer, not a whole
 * one. DDP buckets, ZeRO shards and gathers, the optimizer's segments, checkpoints and
 * import/export all derive from the table and the units, never from a family's struct.
 *
 * Storage: `params` and `grads` are slabs over the whole index space (either may be NULL
 * when a strategy stores shards instead); unit_params[u] / unit_grads[u] are where the
 * kernels read and write unit u (by default inside the slabs; ZeRO points them at windows).
 * Under mixed precision, unit_params_lp[u] (NULL: not provided) may hold the 16-bit copies
 * of unit u's `matmul` tensors at their unit offsets (ZeRO-3 gathers them so: model.h).
 *
 *   dt_params ps; DT_CHECK(dt_params_init(ctx, &ps, table, n, n_layer, alloc, DT_SLAB_PARAMS));
 *   float *w = dt_params_tensor(&ps, ps.params, id, layer);
 *   dt_params_free(&ps);
 */
#ifndef DT_PARAMS_H
#define DT_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "optim/optim.h"

/* Element types of tensors (master weights are fp32; the others are for compute copies
 * and quantised bases). */
typedef enum dt_elem_type { DT_ELEM_F32, DT_ELEM_BF16, DT_ELEM_F16 } dt_elem_type;
const char *dt_elem_type_name(dt_elem_type t);

typedef enum dt_param_group { DT_PG_PRE, DT_PG_LAYER, DT_PG_POST } dt_param_group;
/* NORMAL: N(0, std); ONES, ZEROS: constants. */
typedef enum dt_init_kind { DT_INIT_NORMAL, DT_INIT_ONES, DT_INIT_ZEROS } dt_init_kind;

/* One row of a family's table. The family fills name..ext_transpose; the store fills
 * offset and stride. */
typedef struct dt_tensor_info {
    const char *name;     /* dtrain's checkpoint name, "%d" = the layer of LAYER tensors */
    const char *ext_name; /* Hugging Face name ("%d" = layer); NULL = none */
    dt_param_group group;
    dt_elem_type dtype;
    size_t rows, cols;    /* stored shape (rows = 1 for a vector) */
    size_t file_rows;     /* rows written to files (below rows for vocabulary padding) */
    dt_init_kind init;
    float std;            /* of DT_INIT_NORMAL */
    int decay;            /* AdamW weight decay applies */
    int ext_transpose;    /* the external format stores the transpose (GPT-2's Conv1D) */
    size_t offset;        /* of layer 0's copy, in elements from the start of the space */
    size_t stride;        /* elements between layer copies; 0 if not per-layer */
    int vocab;            /* rows are the vocabulary: cut into row-chunk units (PRE/POST) */
    int unit;             /* (store) the unit holding the tensor (layer tensors: layer 0's;
                             vocabulary tensors: the first chunk's, chunks are consecutive) */
    size_t chunk_rows;    /* (store) rows per unit of a vocabulary tensor (at most
                             layer_unit_max elements; the last may hold fewer); = rows otherwise */
    int matmul;           /* a matmul weight: mixed precision feeds the GEMMs its 16-bit copy
                             (model.h); the other tensors are always read in fp32 */
    int unit_start;       /* (family) a LAYER tensor that starts a new unit of its layer (the
                             layer's first tensor always starts one); ignored elsewhere */
    /* Tensor parallelism (ARCHITECTURE decision 62). The family's split column: */
    int split;            /* (family) DT_SPLIT_*: how tensor parallelism cuts the tensor */
    int sections;         /* (family) the split dimension is this many equal parts, each cut
                             into tp pieces (gpt2's fused q|k|v: 3; 0 reads as 1) */
    /* (dt_params_table_tp) the layout under tensor parallelism degree tp_k: the store holds
     * tp_nb consecutive shards (tp_first, tp_first + 1, ...), each g_rows/tp_k (OUT) or
     * g_cols/tp_k (IN) of the canonical (g_rows, g_cols) tensor, stacked shard after shard:
     * OUT matrices as row blocks, OUT vectors as column blocks, IN matrices as (g_rows,
     * g_cols/tp_k) blocks stacked as rows. tp_k = 0: not split (rows, cols canonical). */
    int tp_k, tp_nb, tp_first;
    size_t g_rows, g_cols, g_file_rows; /* the canonical shape (and real rows) */
    size_t shard_rows;    /* rows of one shard as stored (= rows when not split) */
    int expert;           /* (family) 1 + the expert of a mixture-of-experts expert's tensor, 0
                             otherwise: expert parallelism's store holds only its rank's experts
                             (model.h dt_model_opts.ep; the others absent) */
} dt_tensor_info;

/* The split column (tensor parallelism, decision 62):
 *   NONE   replicated: every TP rank holds the whole tensor (norms, positions, the
 *          row-parallel layers' biases, added once after their all-reduce);
 *   OUT    column-parallel (Megatron's ColumnParallelLinear): the output dimension (a
 *          matrix's rows, its bias vector's elements) cut into tp pieces, section by section;
 *          with `vocab`, the vocabulary-parallel embedding and head;
 *   IN     row-parallel (RowParallelLinear): the input dimension (columns) cut. */
enum { DT_SPLIT_NONE, DT_SPLIT_OUT, DT_SPLIT_IN };
/* "replicated", "column", "row", "vocab" (the split column of `dtrain config` / docs). */
const char *dt_split_name(const dt_tensor_info *t);
/* Rewrites table (n rows, canonical shapes) for tensor parallelism of degree k: each split
 * tensor becomes nb shards starting at shard `first` (see dt_tensor_info). k <= 1: nothing
 * changes. The caller checked that k divides every split dimension (section-wise). */
void dt_params_table_tp(dt_tensor_info *table, int n, int k, int nb, int first);
/* The canonical (unsplit) index of element i of tensor t as stored (the identity when t is
 * not split); *shard = the shard holding it (0 when not split). */
size_t dt_params_global_index(const dt_tensor_info *t, size_t i, int *shard);
/* The same, and the length of the run of stored elements from i whose canonical indices are
 * consecutive too (to the end of a row block, a section or a row of a row-parallel shard). */
size_t dt_params_global_run(const dt_tensor_info *t, size_t i, size_t *gi, int *shard);
/* A run of a store's flat index space and where it lies in the canonical (unsplit) store. */
typedef struct dt_canon_run {
    size_t local, canon, n;
    int replicated; /* of a tensor every tensor-parallel rank holds whole */
} dt_canon_run;

/* A tensor this store does not hold (a pipeline stage's store keeps the PRE tensors on the
 * first stage only and the POST tensors on the last; an expert-parallel rank's store only its
 * experts: the others have no rows, no elements and no unit, unit = -1). */
static inline int dt_tensor_absent(const dt_tensor_info *t) { return t->rows == 0 || t->cols == 0; }

/* Elements of one stored shard of t (the whole tensor when not split). */
static inline size_t dt_tensor_shard_len(const dt_tensor_info *t) {
    return t->tp_k > 1 && t->split ? t->rows * t->cols / (size_t)t->tp_nb : t->rows * t->cols;
}

typedef struct dt_params {
    int n_tensors;
    dt_tensor_info *tensors;    /* the table with offsets (owned) */
    int n_layer;
    int layer_units;            /* units per layer (>= 1: the layer tensors' unit_start marks) */
    size_t n_params;            /* elements in the index space (incl. vocabulary padding) */
    size_t layer_floats;        /* elements in one layer block */
    size_t layer_unit_max;      /* elements in the largest layer unit (no unit is larger) */
    size_t layers_offset;       /* start of layer 0's block */
    float *params, *grads;      /* slabs (NULL when a strategy owns the storage) */
    int n_units;                /* n_pre_units + n_layer x layer_units + POST units */
    int n_pre_units;            /* units before layer 0 */
    size_t *unit_lo, *unit_len; /* each unit's range in the index space */
    float **unit_params, **unit_grads;
    uint16_t **unit_params_lp;  /* 16-bit matmul tensors of unit u, or NULL (model.h) */
    uint64_t seed_salt;         /* XORed into the init seed (0; LoRA adapters: their own streams) */
    size_t chunk_cap;           /* elements per vocabulary chunk at most (0: the largest layer unit) */
    int layer0;                 /* the model's layer that local layer 0 is (a pipeline stage's
                                   store: model.h dt_model_opts.pp_l0; 0 otherwise) */
    int lchunk, lstride;        /* an interleaved stage's chunks (model.h pp_v): lchunk local layers
                                   each, the next chunk lstride model layers further (0: one
                                   range). Names, initial values and canonical runs use the
                                   model's layer, dt_params_layer */
    dt_alloc *alloc;
} dt_params;

/* The first unit of layer l; unit k of layer l; the first POST unit. */
#define DT_UNIT_LAYER(ps, l) ((ps)->n_pre_units + (l) * (ps)->layer_units)
#define DT_UNIT_SUB(ps, l, k) (DT_UNIT_LAYER(ps, l) + (k))
#define DT_UNIT_POST0(ps) ((ps)->n_pre_units + (ps)->n_layer * (ps)->layer_units)

/* Which slabs dt_params_init allocates. */
#define DT_SLAB_PARAMS 1
#define DT_SLAB_GRADS 2

/* Units per layer that table (n rows) gives: its first LAYER row and each later one marked
 * unit_start start one (1 without LAYER rows). */
int dt_params_table_layer_units(const dt_tensor_info *table, int n);
/* Elements of the largest layer unit of a table (the vocabulary chunks' cap). */
size_t dt_params_table_unit_max(const dt_tensor_info *table, int n);

/* The model's layer that local layer l of ps is (a pipeline stage's store: its chunks). */
static inline int dt_params_layer(const dt_params *ps, int l) {
    return ps->lchunk > 0 ? ps->layer0 + l / ps->lchunk * ps->lstride + l % ps->lchunk : ps->layer0 + l;
}

/* The local layer of ps holding the model's layer g, or -1 (a pipeline stage's store that does
 * not hold it). */
static inline int dt_params_local_layer(const dt_params *ps, int g) {
    int d = g - ps->layer0;
    if (d < 0) return -1;
    if (ps->lchunk > 0) {
        int c = d / ps->lstride, r = d % ps->lstride;
        return r < ps->lchunk && c * ps->lchunk + r < ps->n_layer ? c * ps->lchunk + r : -1;
    }
    return d < ps->n_layer ? d : -1;
}

/* Copies the table (n rows, offsets computed here), lays out the units and allocates the
 * slabs named in `slabs`. */
dt_status dt_params_init(dt_ctx *ctx, dt_params *ps, const dt_tensor_info *table, int n,
                         int n_layer, dt_alloc *alloc, int slabs);
/* The same with vocabulary chunks of at most chunk_cap elements (0: the largest layer unit;
 * a frozen LoRA base whose layer matmuls live elsewhere keeps the full layout's chunks). */
dt_status dt_params_init_cap(dt_ctx *ctx, dt_params *ps, const dt_tensor_info *table, int n,
                             int n_layer, dt_alloc *alloc, int slabs, size_t chunk_cap);
void dt_params_free(dt_params *ps);
/* Points every unit at its region of the params/grads slabs (after replacing a slab). */
void dt_params_point_units(dt_params *ps);

/* Pointer to tensor id of layer `layer` in `base` (a slab); layer ignored if not per-layer. */
float *dt_params_tensor(const dt_params *ps, float *base, int id, int layer);
/* The same through the unit pointers (where the kernels read: slab or ZeRO window). */
float *dt_params_unit_tensor(const dt_params *ps, float *const *units, int id, int layer);
/* Flat index of a tensor's first element. */
size_t dt_params_flat(const dt_params *ps, int id, int layer);
/* Copies of a tensor: n_layer for LAYER tensors, else 1. */
int dt_params_copies(const dt_params *ps, int id);
/* Its checkpoint name ("h.3.ln_1.weight") and external name ("" if none). */
void dt_params_name(const dt_params *ps, int id, int layer, char *buf, size_t n);
void dt_params_ext_name(const dt_params *ps, int id, int layer, char *buf, size_t n);
/* The unit holding tensor id of layer l, and the tensor's offset inside that unit (a
 * vocabulary tensor: its first chunk's unit, offset 0). */
int dt_params_unit_of(const dt_params *ps, int id, int layer, size_t *offset_in_unit);
/* The `matmul` tensors of unit u as runs of elements [off[i], off[i] + len[i]) in unit
 * offsets, ascending, adjacent tensors merged (LLaMA's q|k|v); returns the number of runs.
 * cap (room in off and len) must cover the unit's matmul tensors: n_tensors always does. */
int dt_params_matmul_runs(const dt_params *ps, int u, size_t *off, size_t *len, int cap);
/* Chunks of a vocabulary tensor (1 for any other), and chunk c's unit and row range. */
int dt_params_chunks(const dt_params *ps, int id);
void dt_params_chunk(const dt_params *ps, int id, int c, int *unit, size_t *row0, size_t *rows);
/* DT_OK when every parameter in `base` (a full slab) is finite; else a DT_ERR_FORMAT naming
 * `path`, the first tensor with a NaN or Inf (its external name when ext and it has one: a
 * Hugging Face file's), how many and where. For weights read from a file, at load: such
 * weights would otherwise show as a divergence at the first step. */
dt_status dt_params_check_finite(dt_ctx *ctx, const dt_params *ps, const float *base, const char *path, int ext);
/* Elements stored in files (vocabulary padding excluded), over every tensor and layer. */
size_t dt_params_file_count(const dt_params *ps);

/* The initial values of flat elements [lo, lo + n) into dst: each element depends only on
 * (seed, tensor id, layer, index), so any range (a ZeRO shard) initialises alike. Rows
 * beyond file_rows (vocabulary padding) are 0. */
void dt_params_init_range(const dt_params *ps, uint64_t seed, float *dst, size_t lo, size_t n);

/* The AdamW segments: contiguous ranges of equal weight decay, in memory order (*out is
 * malloc'ed). */
dt_status dt_params_segments(dt_ctx *ctx, const dt_params *ps, dt_param_segment **out, int *n);

/* Every real element of store ps (under tensor parallelism: its shards) as runs into the flat
 * index space of canon (the same model's unsplit store), ascending in ps's space; vocabulary
 * padding is left out (it is zero and never saved). *out is malloc'ed. */
dt_status dt_params_canon_runs(dt_ctx *ctx, const dt_params *ps, const dt_params *canon, dt_canon_run **out,
                               size_t *n);

/* Zeroes every unit's gradient. */
void dt_params_zero_grad(dt_params *ps);

#endif
