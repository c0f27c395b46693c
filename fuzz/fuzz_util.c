#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

/* Every path written, removed when the process exits (a fuzz run or a replay leaves nothing). */
static char g_written[8][256];
static int g_nwritten;

static void remove_written(void) {
    for (int i = 0; i < g_nwritten; i++) unlink(g_written[i]);
}

const char *fz_write_file(const uint8_t *data, size_t size, const char *suffix) {
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/dtrain-fuzz-%d%s", dir, (int)getpid(), suffix);
    int known = 0;
    for (int i = 0; i < g_nwritten; i++) known |= !strcmp(g_written[i], path);
    if (!known && g_nwritten < 8) {
        if (g_nwritten == 0) atexit(remove_written);
        snprintf(g_written[g_nwritten++], sizeof g_written[0], "%s", path);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror(path);
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
    return path;
}

void fz_note(const char *refusal) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("DT_FUZZ_VERBOSE") != NULL;
    if (verbose) printf("    %s\n", refusal ? refusal : "accepted");
}
