/* ckpt_impl.h - shared by checkpoint.c (trainer.json, reading) and ckpt_saver.c (writing);
 * internal to src/ckpt. */
#ifndef DT_CKPT_IMPL_H
#define DT_CKPT_IMPL_H

#include <stddef.h>

#include "ckpt/checkpoint.h"

#define TRAINER_JSON "trainer.json"
#define MODEL_FILE "model.safetensors"

/* trainer.json text of t with the run's configuration (malloc'd; NULL when out of memory). */
char *dt_ckpt_trainer_json(const dt_ckpt_trainer *t, const char *config_yaml, size_t *len);
/* Step numbers of the step-NNNNNNNN directories under root, newest first (caller frees). */
int dt_ckpt_list_steps(const char *root, long **out);

#endif
