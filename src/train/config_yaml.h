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

#include <yaml.h>

#include "train/keys.h"

/* Loads the whole YAML file `path` as one document (delete it with yaml_document_delete).
 * `what` names the file's role in the open error ("config", "price table"); a syntax error
 * names path:line, a directory is refused as one. All errors are DT_ERR_CONFIG (a bad input
 * file). */
dt_status dt_yaml_load_file(dt_ctx *ctx, const char *path, const char *what, yaml_document_t *doc);

/* Applies every key of the file to c (later --set flags may override them). A file that
 * sets no key (empty, only comments) and a directory are refused naming the path. */
dt_status dt_cfg_load_yaml(dt_ctx *ctx, dt_run_cfg *c, const char *path);
/* Same from YAML text in memory (a checkpoint's stored configuration); errors name `name`. */
dt_status dt_cfg_load_yaml_text(dt_ctx *ctx, dt_run_cfg *c, const char *name, const char *text);

#endif
