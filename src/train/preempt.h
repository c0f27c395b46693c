/* preempt.h - preemption requests (SIGTERM, SIGUSR1: Slurm --signal, spot warnings, dtrain
 * launch's supervisor). The signals are blocked in every thread and taken by one thread in
 * sigwait(), so a signal never interrupts the compute threads or a library in the middle of
 * something (no handler runs at an arbitrary point of an arbitrary thread). The training loop
 * polls the request at each step boundary.
 *
 *   dt_preempt_setup();            // in main, before any other thread (MPI_Init included)
 *   ... if (dt_preempt_requested(&sig, &age)) checkpoint and exit 0 ...
 */
#ifndef DT_PREEMPT_H
#define DT_PREEMPT_H

/* Blocks SIGTERM and SIGUSR1 in the calling thread (inherited by every thread it starts
 * later) and starts the thread that waits for them. Idempotent. Returns 0, or -1 if the
 * thread could not start (the signals are then left unblocked, default action). */
int dt_preempt_setup(void);
/* The first preemption signal received (0: none) and the seconds since it arrived. */
int dt_preempt_requested(double *age_s);
/* Tests: forget a request. */
void dt_preempt_clear(void);

#endif
