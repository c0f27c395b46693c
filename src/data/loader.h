/* loader.h - batches for one rank: a prefetching training loader and a validation loader.
 *
 * dt_loader: a background thread fills the next micro-batches of this rank (positions as in
 * sampler.h) while the trainer computes on the current one. Batches come back in the fixed
 * order (step, k) = (0,0), (0,1), ..., (0,accum-1), (1,0), ... from the cursor given to init
 * or seek, bitwise equal to dt_sampler_fill whatever the thread timing. A failure in the
 * thread comes back from dt_loader_next as its dt_status and message.
 *
 *   dt_loader *ld;
 *   DT_CHECK(dt_loader_init(ctx, &ld, sampler, world, rank, B, accum, cursor));
 *   for each step: for (k = 0; k < accum; k++) {
 *       int32_t *in, *tg; DT_CHECK(dt_loader_next(ctx, ld, &in, &tg)); ... forward/backward
 *   }
 *   cursor = dt_loader_cursor(ld);      // at a step boundary: what the checkpoint saves
 *   dt_loader_free(ld);                 // joins the thread
 *
 * dt_val_loader: the validation walk, unshuffled and synchronous: global batch i holds
 * samples [i*world*B, (i+1)*world*B) in dataset order, rank r taking rows r*B .. r*B+B-1;
 * the first max_batches such batches (all complete ones if 0), the same on every eval. On a
 * record dataset (IDX images) a sample is one image: rows are whole records in file order,
 * inputs its pixels and targets its label (sampler.h), with T = H*W.
 *
 *   dt_val_loader *vl;
 *   DT_CHECK(dt_val_loader_init(ctx, &vl, val_ds, T, world, rank, B, 20));
 *   while (dt_val_loader_next(vl, &in, &tg)) ... forward only
 *   dt_val_loader_reset(vl);            // before the next eval
 *   dt_val_loader_free(vl);
 */
#ifndef DT_LOADER_H
#define DT_LOADER_H

#include <stdint.h>

#include "core/status.h"
#include "data/sampler.h"

typedef struct dt_loader dt_loader;
typedef struct dt_val_loader dt_val_loader;

/* Starts the prefetch thread at `cursor`; the sampler must outlive the loader. */
dt_status dt_loader_init(dt_ctx *ctx, dt_loader **out, const dt_sampler *s, int world, int rank,
                         int B, int accum, uint64_t cursor);

/* The next micro-batch, inputs and targets (B,T). The buffers belong to the loader and stay
 * valid until the next call of next, seek or free. */
dt_status dt_loader_next(dt_ctx *ctx, dt_loader *l, int32_t **inputs, int32_t **targets);

/* Drops prefetched batches and restarts at `cursor` (a step boundary), e.g. on resume. */
dt_status dt_loader_seek(dt_ctx *ctx, dt_loader *l, uint64_t cursor);

/* Cursor of the step holding the next micro-batch to be returned; after the last micro-step
 * of a step, the start of the next step. */
uint64_t dt_loader_cursor(const dt_loader *l);

/* At a step boundary: the targets of that step that count, over all ranks
 * (dt_sampler_count_targets; every target without a loss mask). */
uint64_t dt_loader_step_targets(const dt_loader *l);

/* Stops and joins the thread, frees the buffers; NULL is a no-op. */
void dt_loader_free(dt_loader *l);

/* Fault injection for tests: from the next seek on, filling micro-batch q (0-based, counted
 * from that seek) fails with DT_ERR_IO in the thread. UINT64_MAX turns it off. */
void dt_loader_inject_fault(dt_loader *l, uint64_t q);

/* Fails with the sample count if the dataset has fewer than world*B samples (no batch). */
dt_status dt_val_loader_init(dt_ctx *ctx, dt_val_loader **out, const dt_dataset *ds, int T,
                             int world, int rank, int B, uint64_t max_batches);
uint64_t dt_val_loader_num_batches(const dt_val_loader *v);
/* 1 and the next batch (valid until the next call), or 0 after the last batch. */
int dt_val_loader_next(dt_val_loader *v, int32_t **inputs, int32_t **targets);
void dt_val_loader_reset(dt_val_loader *v); /* back to batch 0 */
void dt_val_loader_free(dt_val_loader *v);   /* NULL is a no-op */

#endif
