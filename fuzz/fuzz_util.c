#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"

const char *fz_write_file(const uint8_t *data, size_t size, const char *suffix) {
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/dtrain-fuzz-%d%s", dir, (int)getpid(), suffix);
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
