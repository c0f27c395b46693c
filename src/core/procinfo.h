/* procinfo.h - numbers the kernel publishes about this process and host (Linux /proc).
 *
 *   size_t rss = dt_proc_bytes("/proc/self/status", "VmRSS");     // 0 if unknown
 *   size_t free = dt_proc_bytes("/proc/meminfo", "MemAvailable");
 */
#ifndef DT_PROCINFO_H
#define DT_PROCINFO_H

#include <stddef.h>

/* The "KEY: N kB" line of a /proc file, in bytes; 0 when the file or the key is missing. */
size_t dt_proc_bytes(const char *path, const char *key);

#endif
