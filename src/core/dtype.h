/* dtype.h - the element types of dtrain's buffers, one enum shared by the collectives
 * (comm.h: DT_F32, DT_F64, DT_I64) and the low-precision kernels (ops.h: DT_F32, DT_BF16,
 * DT_F16). Each module states which members it accepts. */
#ifndef DT_DTYPE_H
#define DT_DTYPE_H

typedef enum dt_dtype { DT_F32, DT_F64, DT_I64, DT_BF16, DT_F16 } dt_dtype;

/* "fp32", "bf16", "fp16", "fp64", "int64". */
const char *dt_dtype_name(dt_dtype dt);

#endif
