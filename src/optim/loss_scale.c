/* Dynamic loss scaling (optim.h). */
#include "optim/optim.h"

void dt_loss_scaler_init(dt_loss_scaler *s, float scale, int dynamic, long interval) {
    *s = (dt_loss_scaler){scale, dynamic, interval > 0 ? interval : 1, 0, 0};
}

int dt_loss_scaler_update(dt_loss_scaler *s, int finite) {
    if (!finite) {
        s->overflows++;
        s->good = 0;
        if (s->dynamic && s->scale * 0.5f >= DT_LOSS_SCALE_MIN) s->scale *= 0.5f;
        return 1;
    }
    if (s->dynamic && ++s->good >= s->interval) {
        s->good = 0;
        if (s->scale * 2.0f <= DT_LOSS_SCALE_MAX) s->scale *= 2.0f;
    }
    return 0;
}
