/* Process-level measurements and small OS helpers. */
#ifndef RF_SYS_H
#define RF_SYS_H

#include <stddef.h>
#include <stdint.h>

double rf_now(void);              /* monotonic seconds */
int64_t rf_peak_rss_kb(void);     /* peak resident set size of this process */
int rf_mkdir_p(const char *path); /* like mkdir -p */
/* Writes data to path atomically: temp file in the same directory, fsync,
 * rename, fsync of the directory. */
int rf_write_file_atomic(const char *path, const void *data, size_t len);
/* Reads a whole file (NUL-terminated); *out is malloc'd. max bounds the size. */
int rf_read_file(const char *path, size_t max, char **out, size_t *len);
/* Number of CPUs usable by this process. */
int rf_ncpu(void);

#endif
