/* fuzz.h - shared by the fuzz harnesses (fuzz_<target>.c). Each harness defines the
 * libFuzzer entry point; built with -fsanitize=fuzzer it is a fuzzer (cmake -DFUZZ=ON, make
 * fuzz), linked with replay_main.c it replays corpus files (the CTest regression tests).
 * A harness aborts (FZ_CHECK) when a reader accepts something that breaks its contract, so
 * logic errors are findings too, not only crashes. */
#ifndef DT_FUZZ_H
#define DT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes data to this process's scratch file (in /dev/shm when it exists) whose name ends
 * in `suffix`, and returns its path. Aborts on I/O errors (the harness cannot go on). */
const char *fz_write_file(const uint8_t *data, size_t size, const char *suffix);

/* Prints "accepted" or the refusal message when DT_FUZZ_VERBOSE is set (replay only). */
void fz_note(const char *refusal);

#define FZ_CHECK(cond)                                                                   \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: contract broken: %s\n", __FILE__, __LINE__, #cond);  \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
