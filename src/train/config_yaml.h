/* config_yaml.h - loading a run configuration from a YAML file (libyaml).
 *
 * The file is a mapping of sections to mappings of scalar values:
 *     model:
 *       preset: gpt2-tiny
 *     training:
 *       micro_batch: 8
 * Each value goes through dt_cfg_set, so the key table decides what exists and how values
 * parse. Errors name the file, the line and the key (and the closest valid key).
 *
 *   DT_CHECK(dt_cfg_load_yaml(ctx, &cfg, "configs/demo.yaml"));
 */
#ifndef DT_CONFIG_YAML_H
#define DT_CONFIG_YAML_H

#include "train/keys.h"

/* Applies every key of the file to c (later --set flags may override them). */
dt_status dt_cfg_load_yaml(dt_ctx *ctx, dt_run_cfg *c, const char *path);

#endif
