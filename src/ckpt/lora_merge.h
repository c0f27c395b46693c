/* lora_merge.h - a LoRA checkpoint folded into its base, out as a whole model
 * (`dtrain ckpt merge`, ARCHITECTURE decision 51).
 *
 * The base is the one the run used, rebuilt as the run built it: model.init_from of the
 * configuration stored in trainer.json (or `base`, when given), or drawn from training.seed
 * when the run had none, in the run's lora.base_dtype; its XXH3 must equal trainer.json's
 * lora_base. Every targeted (sub-)projection then becomes
 *     W' = W + (alpha / rank) B A
 * (rows [row0, row0 + rows) of the base tensor: LLaMA's q|k|v and gate|up row blocks of the
 * fused tensors, GPT-2's q, k, v row blocks of c_attn), each element one double sum over the
 * rank rounded once to fp32. An NF4 (QLoRA) base merges onto its dequantized weights, the
 * values the run's forward used. The result goes out as a Hugging Face directory (dt_hf_export:
 * OUT_DIR/model.safetensors + config.json), which dtrain reads back (eval, model.init_from).
 *
 *   DT_CHECK(dt_lora_merge(ctx, "ckpt/", "merged/", NULL, run_base, &info));
 */
#ifndef DT_LORA_MERGE_H
#define DT_LORA_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_lora_merge_info {
    char step_dir[4200];   /* the step merged */
    char base[4200];       /* the base's path ("" : drawn from the seed) */
    int nf4;               /* the base was NF4 (merged onto its dequantized weights) */
    int sites;             /* (sub-)projections folded, over all layers */
    size_t params;         /* parameters of the whole model written */
    uint64_t base_hash;
} dt_lora_merge_info;

/* How the run built its base: its model.init_from ("" : drawn from training.seed) and whether
 * its lora.base_dtype was nf4, read from the configuration the step's trainer.json stores.
 * That configuration's keys belong to the config layer above ckpt/ (train/keys.h; ARCHITECTURE
 * decision 72's layer order), so the caller supplies the reader (the CLI's cmd_ckpt.c). */
typedef dt_status (*dt_lora_run_base_fn)(dt_ctx *ctx, const char *step_dir, char *init_from, size_t n, int *nf4);

/* SRC: a LoRA step directory or checkpoint directory (its newest intact step); base: the
 * base model's path (NULL: the run's model.init_from). Refuses, in one line, a checkpoint
 * that is not LoRA (naming its trainer.json), a base whose XXH3 differs (naming the base),
 * and an OUT_DIR that cannot be created or written (naming it). */
dt_status dt_lora_merge(dt_ctx *ctx, const char *src, const char *out_dir, const char *base,
                        dt_lora_run_base_fn run_base, dt_lora_merge_info *info);

#endif
