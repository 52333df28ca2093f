#include "common/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"

double rf_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* VmHWM from /proc: getrusage's ru_maxrss can report the parent's peak when a
 * large process forked us (it survives exec). */
int64_t rf_peak_rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        long long kb = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
        fclose(f);
        if (kb >= 0) return kb;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru)) return -1;
    return (int64_t)ru.ru_maxrss;
}

int rf_mkdir_p(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return rf_fail(RF_ERR_INVALID, "bad directory path");
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST)
                return rf_fail(RF_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode))
        return rf_fail(RF_ERR_IO, "%s: not a directory", path);
    return RF_OK;
}

int rf_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return rf_fail(RF_ERR_INVALID, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return rf_fail(RF_ERR_IO, "open %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return rf_fail(RF_ERR_IO, "write %s: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) || close(fd)) {
        int e = errno;
        unlink(tmp);
        return rf_fail(RF_ERR_IO, "fsync %s: %s", tmp, strerror(e));
    }
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return rf_fail(RF_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(e));
    }
    /* Make the rename itself durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return RF_OK;
}

int rf_read_file(const char *path, size_t max, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return rf_fail(errno == ENOENT ? RF_ERR_NOT_FOUND : RF_ERR_IO, "%s: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return rf_fail(RF_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        fclose(f);
        return rf_fail(RF_ERR_RANGE, "%s: %lld bytes exceeds the limit of %zu", path,
                       (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return RF_ERR_NOMEM;
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return rf_fail(RF_ERR_IO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return RF_OK;
}

int rf_ncpu(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
