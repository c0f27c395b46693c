#include "train/preempt.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/timer.h"

static atomic_int req_sig;
static _Atomic double req_t;
static int started;

/* SIGINT (Ctrl-C) is a preemption request like SIGTERM; a second SIGINT while one is pending
 * stops the process at once (status 130), as a user pressing Ctrl-C twice expects. The
 * messages are written from this thread (not a signal handler): plain write(2) of a line. */
static void say(const char *msg) {
    ssize_t w = write(2, msg, strlen(msg));
    (void)w;
}

static void *waiter(void *arg) {
    sigset_t *set = arg;
    for (;;) {
        int sig;
        if (sigwait(set, &sig) != 0) continue;
        int none = 0;
        if (atomic_compare_exchange_strong(&req_sig, &none, sig)) {
            atomic_store(&req_t, dt_now());
            if (sig == SIGINT)
                say("interrupt: checkpointing at the next step boundary (if checkpoint.dir is set) and "
                    "exiting; press Ctrl-C again to stop at once\n");
        } else if (sig == SIGINT) {
            say("second interrupt: stopping now, without a checkpoint\n");
            _exit(130);
        }
    }
    return NULL;
}

int dt_preempt_setup(void) {
    static sigset_t set;
    if (started) return 0;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGINT);
    sigset_t old;
    if (pthread_sigmask(SIG_BLOCK, &set, &old) != 0) return -1;
    pthread_attr_t a;
    pthread_t th;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &a, waiter, &set);
    pthread_attr_destroy(&a);
    if (rc != 0) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return -1;
    }
    started = 1;
    return 0;
}

int dt_preempt_requested(double *age_s) {
    int s = atomic_load(&req_sig);
    if (s && age_s) *age_s = dt_now() - atomic_load(&req_t);
    return s;
}

void dt_preempt_clear(void) { atomic_store(&req_sig, 0); }
