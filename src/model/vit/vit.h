/* vit.h - the ViT family (Vision Transformer, encoder only): images cut into square patches,
 * each patch a linear projection (a stride-p convolution written as a matmul), a learned
 * class token and position embedding, pre-norm blocks with bidirectional attention and a GELU
 * MLP (LayerNorm, biases as GPT-2), a final LayerNorm of the class token and a linear
 * classification head; loss = cross-entropy of the class, metric = top-1 accuracy.
 *
 * A sample is one image of channels x image_size^2 pixel values 0..255 (channel-planar, rows
 * in order), given as int32 inputs; its label is in every target slot (the model reads slot
 * 0). So the trainer's "sequence" of a ViT is the image: training.seq_len = model.context =
 * channels x image_size^2 (derived), and tokens/s counts pixels; the reports count images.
 * The model's own sequence is the n_patches + 1 embeddings.
 *
 * Layout (params.h): PRE = patch_embed.proj.weight (C, channels p^2) | bias, cls_token,
 * pos_embed (n_patches + 1, C); each layer block as GPT-2's (timm names blocks.N.*); POST =
 * norm, head (n_classes, C) | bias. Names follow timm's VisionTransformer. */
#ifndef DT_VIT_H
#define DT_VIT_H

#include "model/model.h"

extern const dt_model_family dt_family_vit;

/* Tensor ids: the rows of the table in vit_params.h. */
typedef enum dt_vit_param_id {
#define DT_X_ENUM(id, group, rows, cols, init, decay, name) DT_VIT_P_##id,
#include "model/vit/vit_params.h"
    DT_VIT_PARAMS(DT_X_ENUM)
#undef DT_X_ENUM
        DT_VIT_NPARAMS
} dt_vit_param_id;

#endif
