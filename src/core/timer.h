/* timer.h - monotonic wall clock and named accumulating timers for per-kernel breakdowns.
 *
 *   double t0 = dt_now();  ...  double dt = dt_now() - t0;   // seconds
 */
#ifndef DT_TIMER_H
#define DT_TIMER_H

/* Seconds on CLOCK_MONOTONIC. */
double dt_now(void);
/* Seconds since the Unix epoch (CLOCK_REALTIME): for time stamps, not for durations. */
double dt_now_epoch(void);

#endif
