/* keys_layout.h - the configuration's checks of the parallel layout (keys_layout.c): the mesh's
 * degrees against the world and what each kind of model parallelism is built to compose with,
 * each refusal one line naming the keys, before anything is allocated. Called by keys.c's
 * apply_world. */
#ifndef DT_TRAIN_KEYS_LAYOUT_H
#define DT_TRAIN_KEYS_LAYOUT_H

#include "core/status.h"
#include "train/keys.h"

dt_status dt_cfg_check_mesh(dt_ctx *ctx, const dt_run_cfg *c, int world);
dt_status dt_cfg_check_ep(dt_ctx *ctx, const dt_run_cfg *c);
dt_status dt_cfg_check_cp(dt_ctx *ctx, const dt_run_cfg *c);
dt_status dt_cfg_check_tp(dt_ctx *ctx, const dt_run_cfg *c);
dt_status dt_cfg_check_pp(dt_ctx *ctx, const dt_run_cfg *c);

#endif
