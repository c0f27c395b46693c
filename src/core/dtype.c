#include "core/dtype.h"

const char *dt_dtype_name(dt_dtype dt) {
    switch (dt) {
    case DT_F32: return "fp32";
    case DT_BF16: return "bf16";
    case DT_F16: return "fp16";
    case DT_F64: return "fp64";
    case DT_I64: return "int64";
    }
    return "unknown";
}
