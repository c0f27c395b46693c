/* plan_fixture.h - what the planner's unit tests share (test_plan.c, test_plan_pipe.c): the
 * relative comparison, a dense test model and a job on the fixture catalog's gpu-a. */
#ifndef DT_PLAN_FIXTURE_H
#define DT_PLAN_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "plan/plan.h"

#ifndef DT_SOURCE_DIR
#define DT_SOURCE_DIR "."
#endif
#define FIXTURE DT_SOURCE_DIR "/tests/data/plan/hardware.yaml"

/* Fails unless got is within a relative tol of want (NaN and Inf fail). */
static inline void near(double got, double want, double tol, const char *what) {
    double e = fabs(got - want) / fmax(fabs(want), 1e-300);
    if (!(e <= tol)) fail_msg("%s: got %.10g, want %.10g (rel err %.3g)", what, got, want, e);
}

static inline dt_plan_model dense(int L, int d, int h, int V) {
    dt_plan_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "test");
    m.n_layer = L, m.d_model = d, m.n_head = h, m.n_kv_head = h, m.d_ff = 4 * d, m.vocab = V, m.context = 1024;
    m.tied = 1, m.bias = 1;
    return m;
}

/* A job of `gpus` devices on the fixture's gpu-a (links fast / net), micro-batch 2 x 1024. */
static inline void job_of(dt_hw_catalog *cat, dt_plan_job *j, const dt_plan_model *m, int gpus) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_hw_load(&ctx, FIXTURE, cat), DT_OK);
    memset(j, 0, sizeof *j);
    j->model = *m;
    dt_train_cfg_defaults(&j->train);
    j->train.micro_batch = 2, j->train.seq_len = 1024;
    j->gpus = gpus, j->dpn = gpus < 8 ? gpus : 8, j->global_batch = 2L * gpus;
    assert_int_equal(dt_hw_find(&ctx, cat, "gpu-a", &j->hw), DT_OK);
    j->intra = dt_hw_link_find(cat, "fast"), j->inter = dt_hw_link_find(cat, "net");
    j->gemm_eff = 0.5, j->intra_eff = 1, j->inter_eff = 0.5, j->price_hour = j->spot_hour = -1;
}

/* A dtrain preset as the planner sees it: its validated configuration (mc) and model (m). */
static inline void preset_model(const char *name, dt_model_config *mc, dt_plan_model *m) {
    dt_ctx ctx;
    dt_ctx_init(&ctx);
    assert_int_equal(dt_model_preset(&ctx, name, mc), DT_OK);
    assert_int_equal(dt_model_config_validate(&ctx, mc), DT_OK);
    dt_plan_model_from_dtrain(mc, name, m);
}

/* The pipeline tests' job: an 8-layer dense model on 8 gpu-a, 16 sequences a step (micro 2
 * x dp 1: 8 micro-batches). */
static inline void pipe_job(dt_hw_catalog *cat, dt_plan_job *j) {
    dt_plan_model m = dense(8, 512, 8, 32000);
    job_of(cat, j, &m, 8);
    j->global_batch = 16;
}

#endif
