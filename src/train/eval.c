/* Validation loss and the dataset-model check (run.h), shared by `dtrain train` (run.c) and
 * `dtrain eval` (cmd_eval.c). */
#include <math.h>
#include <stdlib.h>

#include "model/cp.h"
#include "model/model.h"
#include "train/run.h"

dt_status dt_eval_loss(dt_ctx *ctx, dt_model *m, dt_val_loader *vl, double *loss, double *tokens,
                       double *accuracy, double *counted_out) {
    return dt_eval_loss_stage(ctx, m, vl, NULL, NULL, 1, loss, tokens, accuracy, counted_out);
}

dt_status dt_eval_loss_stage(dt_ctx *ctx, dt_model *m, dt_val_loader *vl, dt_eval_xfer xfer, void *ud, int chunks,
                             double *loss, double *tokens, double *accuracy, double *counted_out) {
    dt_val_loader_reset(vl);
    int32_t *in, *tg;
    double sum = 0.0, wsum = 0.0, counted = 0.0;
    long n = 0, right = 0;
    const int cp = m->opts.cp > 1 ? m->opts.cp : 1;
    const size_t bt = (size_t)m->B * m->T; /* context parallelism: this rank's rows of each sequence */
    int32_t *rows = cp > 1 ? malloc(2 * bt * sizeof *rows) : NULL;
    if (cp > 1 && !rows) return dt_fail(ctx, DT_ERR_NOMEM, "validation: out of memory");
    while (dt_val_loader_next(vl, &in, &tg)) {
        if (rows) {
            dt_cp_rows(rows, in, m->B, m->T * cp, cp, m->opts.cp_rank, m->cp_ring.contiguous);
            dt_cp_rows(rows + bt, tg, m->B, m->T * cp, cp, m->opts.cp_rank, m->cp_ring.contiguous);
            in = rows, tg = rows + bt;
        }
        float l = 0.0f;
        for (int c = 0; c < chunks; c++) { /* an interleaved stage: each chunk in turn */
            dt_status st = xfer ? xfer(ctx, ud, 1, c) : DT_OK;
            if (st == DT_OK) st = dt_model_forward(ctx, m, in, tg, &l);
            if (st == DT_OK && m->cp_failed)
                st = dt_fail(ctx, DT_ERR_BACKEND, "validation: a transfer of the context-parallel ring failed");
            if (st == DT_OK && xfer) st = xfer(ctx, ud, 0, c);
            if (st != DT_OK) {
                free(rows);
                return st;
            }
        }
        if (m->cfg.n_experts) l = m->moe_ce; /* a mixture of experts: the cross-entropy, without the router losses */
        int c = m->cfg.n_classes > 0 ? m->B : dt_count_targets(tg, m->B * m->T);
        sum += l;
        wsum += (double)l * c; /* a loss mask: each batch weighs its counted targets */
        counted += c;
        n++;
        right += dt_model_correct(m);
    }
    free(rows);
    *accuracy = m->cfg.n_classes > 0 && n > 0 ? (double)right / ((double)n * m->B) : NAN;
    if (n == 0) return dt_fail(ctx, DT_ERR_CONFIG, "data.val: no complete validation batch");
    *tokens = (double)n * m->B * m->T;
    /* the mean over the counted targets (with nothing masked: the mean of the batch means) */
    *loss = counted < *tokens && m->cfg.n_classes == 0 ? (counted > 0 ? wsum / counted : 0.0) : sum / (double)n;
    if (counted_out) *counted_out = counted;
    if (!dt_stage_last(&m->cfg, &m->opts)) return DT_OK; /* a pipeline's last stage has the loss */
    if (!isfinite(*loss)) return dt_fail(ctx, DT_ERR_NUMERIC, "validation loss is %g: the model diverged", *loss);
    return DT_OK;
}

dt_status dt_data_check_model(dt_ctx *ctx, const dt_dataset *ds, const dt_model_config *m, const char *key) {
    int h, w;
    const int images = dt_dataset_image_hw(ds, &h, &w);
    if (m->n_classes > 0) {
        if (!images)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' holds tokens; model.family %s trains on images (IDX files)",
                           key, dt_dataset_spec(ds), m->family);
        if (h != m->image_size || w != m->image_size || m->channels != 1)
            return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' holds %dx%d grey images; the model takes %dx%d x %d channel(s) "
                           "(model.image_size, model.channels)", key, dt_dataset_spec(ds), h, w, m->image_size,
                           m->image_size, m->channels);
        return dt_dataset_check_labels(ctx, ds, m->n_classes);
    }
    if (images)
        return dt_fail(ctx, DT_ERR_CONFIG, "%s: '%s' holds images; model.family %s is a language model", key,
                       dt_dataset_spec(ds), m->family);
    return DT_OK;
}
