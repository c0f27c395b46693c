/* vit_params.h - the one table of ViT parameter tensors (params.h describes the store).
 *
 *   X(id, group, rows, cols, init, decay, name)
 *   K = channels * patch^2 (one flattened patch, Conv2d weight order c, y, x), T = patches + 1,
 *   F = d_ff. Matrices are "out x in". init: NORMAL (std 0.02), ONES, ZEROS. Weight decay on
 *   the 2-D weights except pos_embed (timm's no_weight_decay).
 */
#ifndef DT_VIT_PARAMS_H
#define DT_VIT_PARAMS_H

#define DT_VIT_PARAMS(X)                                                                       \
    X(PATCHW, PRE, c->d_model, K, NORMAL, 1, "patch_embed.proj.weight")                       \
    X(PATCHB, PRE, 1, c->d_model, ZEROS, 0, "patch_embed.proj.bias")                          \
    X(CLS, PRE, 1, c->d_model, NORMAL, 0, "cls_token")                                        \
    X(POS, PRE, T, c->d_model, NORMAL, 0, "pos_embed")                                        \
    X(LN1W, LAYER, 1, c->d_model, ONES, 0, "blocks.%d.norm1.weight")                          \
    X(LN1B, LAYER, 1, c->d_model, ZEROS, 0, "blocks.%d.norm1.bias")                           \
    X(QKVW, LAYER, 3 * c->d_model, c->d_model, NORMAL, 1, "blocks.%d.attn.qkv.weight")        \
    X(QKVB, LAYER, 1, 3 * c->d_model, ZEROS, 0, "blocks.%d.attn.qkv.bias")                    \
    X(PROJW, LAYER, c->d_model, c->d_model, NORMAL, 1, "blocks.%d.attn.proj.weight")          \
    X(PROJB, LAYER, 1, c->d_model, ZEROS, 0, "blocks.%d.attn.proj.bias")                      \
    X(LN2W, LAYER, 1, c->d_model, ONES, 0, "blocks.%d.norm2.weight")                          \
    X(LN2B, LAYER, 1, c->d_model, ZEROS, 0, "blocks.%d.norm2.bias")                           \
    X(FC1W, LAYER, c->d_ff, c->d_model, NORMAL, 1, "blocks.%d.mlp.fc1.weight")                \
    X(FC1B, LAYER, 1, c->d_ff, ZEROS, 0, "blocks.%d.mlp.fc1.bias")                            \
    X(FC2W, LAYER, c->d_model, c->d_ff, NORMAL, 1, "blocks.%d.mlp.fc2.weight")                \
    X(FC2B, LAYER, 1, c->d_model, ZEROS, 0, "blocks.%d.mlp.fc2.bias")                         \
    X(LNFW, POST, 1, c->d_model, ONES, 0, "norm.weight")                                      \
    X(LNFB, POST, 1, c->d_model, ZEROS, 0, "norm.bias")                                       \
    X(HEADW, POST, c->n_classes, c->d_model, NORMAL, 1, "head.weight")                        \
    X(HEADB, POST, 1, c->n_classes, ZEROS, 0, "head.bias")

#endif
