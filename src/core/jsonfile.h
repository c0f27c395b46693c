/* jsonfile.h - whole JSON documents to and from files: written to PATH.tmp and renamed over
 * PATH (a reader never sees half a file), read and parsed with one line naming the file on
 * failure. */
#ifndef DT_JSONFILE_H
#define DT_JSONFILE_H

#include <cjson/cJSON.h>

#include "core/status.h"

dt_status dt_json_write(dt_ctx *ctx, const char *path, const cJSON *obj);
/* *out: the parsed document (the caller deletes it). */
dt_status dt_json_read(dt_ctx *ctx, const char *path, cJSON **out);

#endif
