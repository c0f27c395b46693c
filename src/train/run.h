/* run.h - a whole training run as `dtrain train` performs it: the data pipeline (dataset,
 * shuffling sampler, prefetching loader; a validation loader), the trainer, periodic
 * evaluation and checkpoints, metrics (JSONL + console).
 *
 *   dt_run_cfg cfg; ... dt_cfg_finish(ctx, &cfg) ...
 *   DT_CHECK(dt_train_run(ctx, &cfg, NULL));
 */
#ifndef DT_RUN_H
#define DT_RUN_H

#include "comm/comm.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/keys.h"

/* Trains as configured on the ranks of comm; save_weights (may be NULL) receives the final
 * model file (rank 0). */
dt_status dt_train_run(dt_ctx *ctx, dt_comm *comm, const dt_run_cfg *cfg, const char *save_weights);

/* Mean loss of m over every batch of the validation loader (forward only); *tokens gets the
 * number of tokens evaluated. The loader is reset first. */
/* The dataset suits the model, naming `key` (data.train / data.val): an image classifier
 * needs IDX images of its size with labels below n_classes; a language model, tokens. */
dt_status dt_data_check_model(dt_ctx *ctx, const dt_dataset *ds, const dt_model_config *m, const char *key);

/* Mean loss over the validation batches, the tokens (samples x T) they held, and for
 * classifiers the top-1 accuracy (NaN for language models). With a loss mask the mean is over
 * the counted targets, whose number goes to *counted (optional; images: one per image). */
dt_status dt_eval_loss(dt_ctx *ctx, dt_model *m, dt_val_loader *vl, double *loss, double *tokens,
                       double *accuracy, double *counted);
/* The same on a pipeline stage (model.h dt_model_opts.pp_l0/pp_l1) of `chunks` chunks (an
 * interleaved stage's; else 1): xfer(ctx, ud, 1, c) before each chunk's forward (make it
 * current, receive the previous stage's activations), xfer(ctx, ud, 0, c) after it (send them
 * on). Only the last stage's results are the loss, tokens, accuracy and count (the others' are
 * not checked); xfer NULL: dt_eval_loss. */
typedef dt_status (*dt_eval_xfer)(dt_ctx *ctx, void *ud, int before, int chunk);
dt_status dt_eval_loss_stage(dt_ctx *ctx, dt_model *m, dt_val_loader *vl, dt_eval_xfer xfer, void *ud, int chunks,
                             double *loss, double *tokens, double *accuracy, double *counted_out);

#endif
