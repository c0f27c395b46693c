/* peft.h - LoRA adapters out in Hugging Face PEFT's layout (ARCHITECTURE decision 49).
 *
 * A LoRA checkpoint (trainer.json with lora_base) becomes OUT_DIR/adapter_model.safetensors
 * (F32, PEFT's names: "base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight",
 * lora_A (r x in), lora_B (out x r), as dtrain stores them) and OUT_DIR/adapter_config.json
 * (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout (the run's lora.dropout),
 * target_modules, bias none). Only families whose adapters map one-to-one onto modules have
 * PEFT names (LLaMA); GPT-2's q, k, v adapters are row blocks of one c_attn module, which PEFT
 * cannot express.
 *
 *   DT_CHECK(dt_peft_export(ctx, "ckpt/", "adapter/"));
 */
#ifndef DT_PEFT_H
#define DT_PEFT_H

#include "core/status.h"

/* SRC: a step directory or a checkpoint directory (its newest intact step). */
dt_status dt_peft_export(dt_ctx *ctx, const char *src, const char *out_dir);

#endif
