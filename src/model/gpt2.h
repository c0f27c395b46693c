/* gpt2.h - the GPT-2 model: config and presets, parameter table, sizes, init, forward and
 * backward with per-layer hooks for the parallel strategies.
 *
 * Memory layout (one slab each for params and grads, same layout): the PRE tensors (wte,
 * wpe), then L contiguous layer blocks, then the POST tensors (ln_f). Keeping each layer's
 * parameters contiguous lets DDP bucket and ZeRO-3 gather a layer as one range.
 *
 *   dt_gpt2_config cfg; DT_CHECK(dt_gpt2_config_preset(ctx, "gpt2", &cfg));
 *   dt_gpt2 m; DT_CHECK(dt_gpt2_init(ctx, &m, &cfg, &alloc, B, T));
 *   dt_gpt2_init_weights(&m, seed);
 *   dt_gpt2_zero_grad(&m);
 *   DT_CHECK(dt_gpt2_forward(ctx, &m, inputs, targets, &loss));
 *   dt_gpt2_backward(&m, 1.0f);
 *   ...
 *   dt_gpt2_free(&m);
 */
#ifndef DT_GPT2_H
#define DT_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/gpt2_params.h"
#include "optim/optim.h"

typedef struct dt_gpt2_config {
    int n_layer;
    int d_model;
    int n_head;
    int vocab;        /* real vocabulary size */
    int vocab_padded; /* vocab rounded up to a multiple of 128 (derived) */
    int context;      /* maximum sequence length (rows of wpe) */
} dt_gpt2_config;

/* Known presets: gpt2-tiny, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl, bench-small. */
dt_status dt_gpt2_config_preset(dt_ctx *ctx, const char *name, dt_gpt2_config *out);
/* Checks every field (naming the config key of a bad one) and derives vocab_padded. */
dt_status dt_gpt2_config_validate(dt_ctx *ctx, dt_gpt2_config *c);
/* Names of presets, NULL-terminated, for help texts. */
extern const char *const dt_gpt2_preset_names[];

typedef enum dt_param_group { DT_PG_PRE, DT_PG_LAYER, DT_PG_POST } dt_param_group;
typedef enum dt_init_kind { DT_INIT_NORMAL, DT_INIT_RESID, DT_INIT_ONES, DT_INIT_ZEROS } dt_init_kind;

typedef enum dt_gpt2_param_id {
#define DT_X_ENUM(id, group, rows, cols, init, decay, name) DT_GPT2_P_##id,
    DT_GPT2_PARAMS(DT_X_ENUM)
#undef DT_X_ENUM
        DT_GPT2_NPARAMS
} dt_gpt2_param_id;

typedef struct dt_tensor_info {
    const char *name; /* HF-style, with "%d" for the layer of per-layer tensors */
    dt_param_group group;
    dt_init_kind init;
    int decay;
    size_t rows, cols;
    size_t offset; /* of layer 0's copy, in floats from the start of the slab */
    size_t stride; /* floats between layer copies (layer block size); 0 if not per-layer */
} dt_tensor_info;

/* Per-layer callbacks for the parallel strategies; any member may be NULL. */
typedef struct dt_gpt2_hooks {
    void *ud;
    void (*before_layer_forward)(void *ud, int layer);  /* (optional) ZeRO-3: gather params */
    void (*after_layer_forward)(void *ud, int layer);   /* (optional) ZeRO-3: release them */
    void (*before_layer_backward)(void *ud, int layer); /* (optional) gather; grad window */
    void (*after_layer_backward)(void *ud, int layer);  /* (optional) layer grads final */
    void (*after_embed_backward)(void *ud);             /* (optional) wte/wpe grads final */
} dt_gpt2_hooks;

/* Units: the slab regions a strategy may store separately. Unit 0 = the embeddings (PRE),
 * unit 1 + l = layer l, unit L + 1 = ln_f (POST). */
#define DT_GPT2_UNIT_PRE 0
#define DT_GPT2_UNIT_LAYER(l) (1 + (l))
#define DT_GPT2_UNIT_POST(m) ((m)->cfg.n_layer + 1)

/* Per-op wall-time accumulators (seconds), for the benchmark's breakdown. */
typedef enum dt_op_kind {
    DT_OP_ENCODER, DT_OP_LAYERNORM, DT_OP_MATMUL, DT_OP_ATTENTION, DT_OP_GELU,
    DT_OP_RESIDUAL, DT_OP_LMHEAD, DT_OP_CROSSENTROPY, DT_OP_NKINDS
} dt_op_kind;
extern const char *const dt_op_kind_names[DT_OP_NKINDS];

typedef struct dt_gpt2_prof {
    double fwd[DT_OP_NKINDS], bwd[DT_OP_NKINDS];
} dt_gpt2_prof;

typedef struct dt_gpt2 {
    dt_gpt2_config cfg;
    int B, T; /* activation buffers are sized for micro-batch B of T tokens */
    dt_tensor_info tensors[DT_GPT2_NPARAMS];
    size_t n_params;       /* floats in the params slab (incl. vocabulary padding) */
    size_t layer_floats;   /* floats in one layer block */
    size_t layers_offset;  /* start of layer 0's block */
    float *params, *grads; /* slabs of n_params floats (NULL when a strategy owns storage) */
    int n_units;           /* n_layer + 2 */
    size_t *unit_lo, *unit_len; /* each unit's range in the flat layout */
    float **unit_params, **unit_grads; /* where the kernels read/write each unit (default:
                                          into the slabs; ZeRO moves them into windows) */
    float *acts;           /* activation slab */
    size_t n_acts;
    dt_alloc *alloc;
    dt_gpt2_hooks hooks;
    dt_gpt2_prof prof;
    int profile; /* accumulate prof timings when non-zero */
    struct dt_gpt2_acts *a; /* views into acts (internal) */
    float last_loss;        /* mean loss of the last forward with targets */
    int has_targets;        /* the last forward kept state for a backward */
} dt_gpt2;

dt_status dt_gpt2_init(dt_ctx *ctx, dt_gpt2 *m, const dt_gpt2_config *cfg, dt_alloc *alloc,
                       int B, int T);
/* Same, allocating only the slabs named in `slabs` (DT_GPT2_SLAB_*): a strategy that
 * shards a slab points unit_params/unit_grads at storage of its own (ZeRO-2/3). */
#define DT_GPT2_SLAB_PARAMS 1
#define DT_GPT2_SLAB_GRADS 2
dt_status dt_gpt2_init_unsharded(dt_ctx *ctx, dt_gpt2 *m, const dt_gpt2_config *cfg,
                                 dt_alloc *alloc, int B, int T, int slabs);
void dt_gpt2_free(dt_gpt2 *m);
/* Points every unit at its region of the params/grads slabs (after replacing a slab). */
void dt_gpt2_point_units(dt_gpt2 *m);

/* GPT-2 initialisation from the counter RNG: N(0, 0.02); residual projections N(0,
 * 0.02/sqrt(2L)); biases 0; layernorm weights 1; vocabulary padding rows 0. */
void dt_gpt2_init_weights(dt_gpt2 *m, uint64_t seed);

/* Writes the initial values of flat elements [lo, lo + n) into dst (any range: each element
 * depends only on (seed, tensor, layer, index)). dt_gpt2_init_weights = the whole slab. */
void dt_gpt2_init_range(const dt_gpt2 *m, uint64_t seed, float *dst, size_t lo, size_t n);

/* The unit holding tensor id of layer l, and the tensor's offset inside that unit. */
int dt_gpt2_unit_of(const dt_gpt2 *m, dt_gpt2_param_id id, int layer, size_t *offset_in_unit);

/* Pointer to a tensor's data in `base` (m->params or m->grads); layer ignored if not per-layer. */
float *dt_gpt2_tensor(const dt_gpt2 *m, float *base, dt_gpt2_param_id id, int layer);
/* Its name for layer `layer` ("h.3.ln_1.weight"). */
void dt_gpt2_tensor_name(const dt_gpt2 *m, dt_gpt2_param_id id, int layer, char *buf, size_t n);

/* Forward of a (m->B, m->T) batch; token ids are checked against the vocabulary. With
 * targets, *loss = mean loss and the state for backward is kept; without (targets NULL),
 * only logits are computed. */
dt_status dt_gpt2_forward(dt_ctx *ctx, dt_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                          float *loss);
/* Logits (B,T,vocab_padded) of the last forward; after backward they hold dlogits. */
const float *dt_gpt2_logits(const dt_gpt2 *m);
/* Accumulates parameter gradients of loss * scale (scale = 1/accumulation steps). */
void dt_gpt2_backward(dt_gpt2 *m, float scale);
void dt_gpt2_zero_grad(dt_gpt2 *m);

/* The AdamW segments of the parameter slab: contiguous ranges of equal weight decay, in
 * memory order (*out is malloc'ed). */
dt_status dt_gpt2_param_segments(dt_ctx *ctx, const dt_gpt2 *m, dt_param_segment **out, int *n);

/* Parameters without vocabulary padding, and the non-embedding count for MFU. */
size_t dt_gpt2_num_params(const dt_gpt2_config *c);
/* Training FLOPs per token: 6 N + 12 L T d, N = non-embedding params + the lm_head matmul
 * (V d); PaLM convention, no causal halving. */
double dt_gpt2_flops_per_token(const dt_gpt2_config *c, int T);
/* Activation bytes for micro-batch B x T (planning; what dt_gpt2_init allocates). */
size_t dt_gpt2_act_floats(const dt_gpt2_config *c, int B, int T);

#endif
