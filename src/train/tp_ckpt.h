/* tp_ckpt.h - checkpoints, weight files and initial weights of a tensor-parallel run
 * (parallel.tp; docs/ARCHITECTURE.md decision 66, docs/FORMATS.md version 2): every tensor and
 * optimizer moment is written and read in its canonical, unpadded index space - the unsplit
 * model's (the tp = 1 store) - so a checkpoint resumes onto any tp (a TP group or the blocks
 * test mode), dp, ZeRO stage or tp = 1, and HF export, eval and sample read it unchanged.
 *
 *   the model file: the TP group's stores gathered and laid out canonically (world rank 0
 *                   writes it, as under ZeRO-3); a LoRA run's store is its adapters, canonical
 *                   as a tp = 1 run's;
 *   the optimizer:  each rank writes its own moments as pieces of the canonical space (a
 *                   row-parallel shard is one piece per row of its block), whatever rank of
 *                   a TP or data-parallel group it is; a resuming rank fills its moments from
 *                   the pieces that overlap its own canonical runs.
 *
 *   dt_tp_ckpt c; DT_CHECK(dt_tp_ckpt_init(ctx, &c, &trainer));
 *   (save) dt_tp_ckpt_pieces(...) once; dt_tp_ckpt_gather(...) per save;
 *   (load) dt_tp_ckpt_scatter(...), dt_tp_ckpt_pieces(...) on the resume's pieces;
 *   dt_tp_ckpt_free(&c); */
#ifndef DT_TP_CKPT_H
#define DT_TP_CKPT_H

#include "train/trainer.h"

typedef struct dt_tp_ckpt {
    int live;             /* initialised (a LoRA run without tensor parallelism has none) */
    int on;               /* tensor parallelism (model_opts.tp > 1): parameters are mapped; without
                             it the runs still leave vocabulary padding out of a resume's
                             pieces (a tensor-parallel run's files hold none) */
    dt_alloc alloc;       /* the canonical store's tables (outside the trainer's plan) */
    dt_params canon;      /* the unsplit store: tables and offsets, no slabs */
    dt_model view;        /* the model as files see it: canonical config and store */
    dt_canon_run *runs;   /* this process's store -> canonical, ascending */
    size_t nruns;
    int ranks, me;        /* the model-parallel group's ranks (tp x pp; 1 without model
                             parallelism and in the blocks mode without a pipeline) and mine */
    int tp_ranks, tp_me;  /* of them, a stage's TP ranks and my place among them */
    dt_group group;
    dt_comm *comm;
    dt_canon_run **peer;  /* each TP rank's runs (its layout), for the gather */
    size_t *npeer;
    size_t *nlen;         /* floats in each peer's store (stages differ) */
    size_t n_local;       /* floats in my store */
} dt_tp_ckpt;

dt_status dt_tp_ckpt_init(dt_ctx *ctx, dt_tp_ckpt *c, const dt_trainer *tr);
void dt_tp_ckpt_free(dt_tp_ckpt *c);
/* Pieces of this store's flat space (global = its flat index, local = an offset into the
 * moments) as pieces of the canonical space, padding left out; *out malloc'ed. `save`: what
 * this rank writes - a replicated tensor's moments only from TP rank 0 (every TP rank holds
 * the same). */
dt_status dt_tp_ckpt_pieces(dt_ctx *ctx, const dt_tp_ckpt *c, const dt_shard_piece *in, int n, int save,
                            dt_shard_piece **out, int *nout);
/* The full canonical parameters from every TP rank's full local parameters (all ranks of the
 * TP group call it; *canon is malloc'ed, canon.n_params floats, on every rank). */
dt_status dt_tp_ckpt_gather(dt_ctx *ctx, const dt_tp_ckpt *c, const float *local, float **canon);
/* This store's full parameters from canonical ones (padding rows 0). */
void dt_tp_ckpt_scatter(const dt_tp_ckpt *c, const float *canon, float *local);

#endif
