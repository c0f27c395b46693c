#include "core/procinfo.h"

#include <stdio.h>
#include <string.h>

size_t dt_proc_bytes(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':' && sscanf(line + n + 1, "%zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
