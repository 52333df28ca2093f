/* The stage cache (cache.h). */
#include "pipeline/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/sys.h"

#define FORMAT "refinery-cache 1"

struct rf_cache {
    char *dir;
};

static const char *const generic_keys[] = {"cache", "retries", "resources", NULL};

static bool in_list(const char *const *list, const char *s) {
    for (; list && *list; list++)
        if (!strcmp(*list, s)) return true;
    return false;
}

char *rf_cache_default_dir(void) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char *p = NULL;
    if (xdg && *xdg) {
        if (asprintf(&p, "%s/refinery", xdg) < 0) p = NULL;
    } else if (home && *home) {
        if (asprintf(&p, "%s/.cache/refinery", home) < 0) p = NULL;
    }
    return p;
}

int rf_cache_open(const char *dir, rf_cache **out) {
    int rc = rf_mkdir_p(dir);
    if (rc) return rf_fail_ctx(rc, "cache directory %s", dir);
    char *abs = realpath(dir, NULL);
    if (!abs) return rf_fail(RF_ERR_IO, "cache directory %s: %s", dir, strerror(errno));
    rf_cache *c = calloc(1, sizeof *c);
    if (!c) {
        free(abs);
        return RF_ERR_NOMEM;
    }
    c->dir = abs;
    *out = c;
    return RF_OK;
}

void rf_cache_close(rf_cache *c) {
    if (!c) return;
    free(c->dir);
    free(c);
}

const char *rf_cache_path(const rf_cache *c) {
    return c->dir;
}

bool rf_cache_is_record(const char *name) {
    static const char *const records[] = {"cached", "key", "attempts", "seconds", NULL};
    const char *dot = strchr(name, '.'); /* only "<stage>.<record>", not deeper counters */
    return dot && !strchr(dot + 1, '.') && in_list(records, dot + 1);
}

/* ---- canonical form ---- */

static int canon_scalar(const char *v, rf_buf *out) {
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On", NULL};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "Off", NULL};
    if (in_list(yes, v)) return rf_buf_puts(out, "true");
    if (in_list(no, v)) return rf_buf_puts(out, "false");
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (*v && !*end && end != v && !errno && isfinite(d)) return rf_buf_printf(out, "%.17g", d);
    return rf_buf_append_json_str(out, v, strlen(v));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int canon_node(const rf_cfg *n, const rf_stage_cache *info, bool top, rf_buf *out) {
    rf_cfg_kind kind = rf_cfg_kind_of(n);
    if (kind == RF_CFG_SCALAR && !(top && !rf_cfg_scalar(n)[0]))
        return canon_scalar(rf_cfg_scalar(n), out);
    int rc = RF_OK;
    size_t len = kind == RF_CFG_SCALAR ? 0 : rf_cfg_len(n);
    if (kind == RF_CFG_SEQ) {
        rc |= rf_buf_putc(out, '[');
        for (size_t i = 0; i < len; i++) {
            if (i) rc |= rf_buf_putc(out, ',');
            rc |= canon_node(rf_cfg_at(n, i), NULL, false, out);
        }
        return rc | rf_buf_putc(out, ']');
    }
    /* a mapping: keys sorted; at the top, defaults for absent keys */
    size_t nd = 0;
    if (top && info && info->defaults)
        while (info->defaults[2 * nd])
            nd++;
    const char **keys = malloc((len + nd + 1) * sizeof *keys);
    if (!keys) return RF_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        const char *key = rf_cfg_key_at(n, i);
        if (top && (in_list(generic_keys, key) || (info && in_list(info->ignore, key)))) continue;
        keys[k++] = key;
    }
    for (size_t i = 0; i < nd; i++)
        if (!rf_cfg_get(n, info->defaults[2 * i])) keys[k++] = info->defaults[2 * i];
    qsort(keys, k, sizeof *keys, cmp_str);
    rc |= rf_buf_putc(out, '{');
    for (size_t i = 0; i < k && !rc; i++) {
        if (i) rc |= rf_buf_putc(out, ',');
        rc |= rf_buf_append_json_str(out, keys[i], strlen(keys[i]));
        rc |= rf_buf_putc(out, ':');
        const rf_cfg *v = NULL;
        for (size_t j = 0; j < len && !v; j++)
            if (!strcmp(rf_cfg_key_at(n, j), keys[i])) v = rf_cfg_at(n, j);
        if (v) {
            rc |= canon_node(v, NULL, false, out);
        } else { /* a default */
            for (size_t j = 0; j < nd; j++)
                if (!strcmp(info->defaults[2 * j], keys[i]))
                    rc |= canon_scalar(info->defaults[2 * j + 1], out);
        }
    }
    free(keys);
    return rc ? RF_ERR_NOMEM : rf_buf_putc(out, '}');
}

int rf_cache_canon(const rf_cfg *section, const rf_stage_cache *info, rf_buf *out) {
    if (!section) return rf_buf_puts(out, "{}");
    return canon_node(section, info, true, out);
}

/* ---- content hashes ---- */

static int hash_fd(int fd, const char *path, XXH128_hash_t *out, uint64_t *size) {
    XXH3_state_t *st = XXH3_createState();
    char *buf = malloc(1 << 20);
    int rc = st && buf ? RF_OK : RF_ERR_NOMEM;
    if (!rc) XXH3_128bits_reset(st);
    uint64_t total = 0;
    while (!rc) {
        ssize_t n = read(fd, buf, 1 << 20);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) rc = rf_fail(RF_ERR_IO, "reading %s: %s", path, strerror(errno));
        if (n <= 0) break;
        XXH3_128bits_update(st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    if (!rc) *out = XXH3_128bits_digest(st);
    if (size) *size = total;
    free(buf);
    XXH3_freeState(st);
    return rc;
}

static int hash_file(const char *path, char hex[33], uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    XXH128_hash_t h;
    int rc = hash_fd(fd, path, &h, size);
    close(fd);
    if (!rc) rf_hash128_hex((rf_hash128){h.low64, h.high64}, hex);
    return rc;
}

static int names_of(const char *dir, struct dirent ***list) {
    int n = scandir(dir, list, NULL, alphasort);
    if (n < 0) return rf_fail(RF_ERR_IO, "%s: %s", dir, strerror(errno));
    return n;
}

static bool dot_name(const char *n) {
    return !strcmp(n, ".") || !strcmp(n, "..");
}

/* The content hash of a file, or of a directory (names, kinds and contents of
 * everything under it, following links), remembered by stat identity. */
#define MAX_TREE_FILES 100000

static int hash_path(rf_cache *c, const char *path, char hex[33], int depth, size_t *files) {
    struct stat st;
    if (++*files > MAX_TREE_FILES)
        return rf_fail(RF_ERR_RANGE, "%s: more than %d files under it", path, MAX_TREE_FILES);
    if (stat(path, &st) != 0) return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    if (depth > 32) return rf_fail(RF_ERR_RANGE, "%s: directories nested too deep", path);
    if (S_ISREG(st.st_mode)) {
        char *real = realpath(path, NULL), *memo = NULL, *text = NULL;
        if (!real) return RF_ERR_NOMEM;
        char ident[PATH_MAX + 160];
        int len = snprintf(ident, sizeof ident, "%s|%llu|%llu|%lld|%lld.%09ld|%lld.%09ld", real,
                           (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                           (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                           (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
        free(real);
        char id[33];
        rf_hash128_hex(rf_hash128_of(ident, (size_t)len, 0), id);
        size_t tlen;
        if (asprintf(&memo, "%s/files/%s", c->dir, id) < 0) return RF_ERR_NOMEM;
        if (rf_read_file(memo, 64, &text, &tlen) == RF_OK && tlen == 32) {
            memcpy(hex, text, 33);
            free(text);
            free(memo);
            return RF_OK;
        }
        free(text);
        int rc = hash_file(path, hex, NULL);
        if (!rc) { /* a failure to remember is not an error */
            char files[PATH_MAX];
            snprintf(files, sizeof files, "%s/files", c->dir);
            if (!rf_mkdir_p(files)) rf_write_file_atomic(memo, hex, 32);
        }
        free(memo);
        return rc;
    }
    if (!S_ISDIR(st.st_mode)) return rf_fail(RF_ERR_INVALID, "%s: not a file or directory", path);
    struct dirent **list;
    int n = names_of(path, &list);
    if (n < 0) return n;
    XXH3_state_t *hs = XXH3_createState();
    int rc = hs ? RF_OK : RF_ERR_NOMEM;
    if (!rc) XXH3_128bits_reset(hs);
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (!rc && !dot_name(name)) {
            char *sub = NULL, h[33];
            if (asprintf(&sub, "%s/%s", path, name) < 0) rc = RF_ERR_NOMEM;
            if (!rc) rc = hash_path(c, sub, h, depth + 1, files);
            if (!rc) {
                XXH3_128bits_update(hs, name, strlen(name) + 1);
                XXH3_128bits_update(hs, h, 32);
            }
            free(sub);
        }
        free(list[i]);
    }
    free(list);
    if (!rc) {
        XXH128_hash_t h = XXH3_128bits_digest(hs);
        rf_hash128_hex((rf_hash128){h.low64, h.high64}, hex);
    }
    XXH3_freeState(hs);
    return rc;
}

/* Whether directory v is the working directory or one above it. */
static bool encloses_cwd(const char *v) {
    char *dir = realpath(v, NULL), *cwd = getcwd(NULL, 0);
    size_t n = dir ? strlen(dir) : 0;
    bool above = dir && cwd && !strncmp(cwd, dir, n) &&
                 (cwd[n] == 0 || cwd[n] == '/' || (n == 1 && dir[0] == '/'));
    free(dir);
    free(cwd);
    return above;
}

/* Hashes the content of every scalar of n that names an existing file or
 * directory, with the scalar, in tree order. */
static int hash_inputs(rf_cache *c, const rf_cfg *n, XXH3_state_t *hs, bool top,
                       const rf_stage_cache *info) {
    rf_cfg_kind kind = rf_cfg_kind_of(n);
    if (kind == RF_CFG_SCALAR) {
        const char *v = rf_cfg_scalar(n);
        struct stat st;
        if (!*v || stat(v, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) return RF_OK;
        if (S_ISDIR(st.st_mode) && encloses_cwd(v)) /* ".", "/": settings, not inputs */
            return RF_OK;
        char h[33];
        size_t files = 0;
        int rc = hash_path(c, v, h, 0, &files);
        if (rc) return rc;
        XXH3_128bits_update(hs, "input", 6);
        XXH3_128bits_update(hs, v, strlen(v) + 1);
        XXH3_128bits_update(hs, h, 32);
        return RF_OK;
    }
    for (size_t i = 0; i < rf_cfg_len(n); i++) {
        if (top && kind == RF_CFG_MAP) {
            const char *key = rf_cfg_key_at(n, i);
            if (in_list(generic_keys, key) || (info && in_list(info->ignore, key))) continue;
        }
        int rc = hash_inputs(c, rf_cfg_at(n, i), hs, false, info);
        if (rc) return rc;
    }
    return RF_OK;
}

int rf_cache_key(rf_cache *c, const char *stage, const rf_stage_cache *info, const rf_cfg *section,
                 const char *upstream, char key[RF_CACHE_KEY_LEN]) {
    rf_buf canon = RF_BUF_INIT;
    int rc = rf_cache_canon(section, info, &canon);
    XXH3_state_t *hs = XXH3_createState();
    if (!hs) rc = RF_ERR_NOMEM;
    if (!rc) {
        char head[128];
        int n = snprintf(head, sizeof head, FORMAT "|%s|%u|", stage, info ? info->version : 0);
        XXH3_128bits_reset(hs);
        XXH3_128bits_update(hs, head, (size_t)n);
        XXH3_128bits_update(hs, canon.data, canon.len);
        XXH3_128bits_update(hs, "|up|", 4);
        if (upstream) XXH3_128bits_update(hs, upstream, strlen(upstream));
        if (section) rc = hash_inputs(c, section, hs, true, info);
    }
    if (!rc) {
        XXH128_hash_t h = XXH3_128bits_digest(hs);
        rf_hash128_hex((rf_hash128){h.low64, h.high64}, key);
    }
    if (hs) XXH3_freeState(hs);
    rf_buf_free(&canon);
    return rc ? rf_fail_ctx(rc, "cache key of stage %s", stage) : RF_OK;
}

/* ---- files and trees ---- */

int rf_rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? RF_OK : RF_ERR_IO;
    if (S_ISDIR(st.st_mode)) {
        struct dirent **list;
        int n = scandir(path, &list, NULL, NULL);
        if (n < 0) return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
        int rc = RF_OK;
        for (int i = 0; i < n; i++) {
            if (!rc && !dot_name(list[i]->d_name)) {
                char *sub = NULL;
                if (asprintf(&sub, "%s/%s", path, list[i]->d_name) < 0) rc = RF_ERR_NOMEM;
                if (!rc) rc = rf_rm_tree(sub);
                free(sub);
            }
            free(list[i]);
        }
        free(list);
        if (!rc && rmdir(path) != 0) rc = rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
        return rc;
    }
    if (unlink(path) != 0) return rf_fail(RF_ERR_IO, "%s: %s", path, strerror(errno));
    return RF_OK;
}

/* Copies a tree (for a cache on another filesystem than the run directory). */
static int copy_tree(const char *from, const char *to) {
    struct stat st;
    if (lstat(from, &st) != 0) return rf_fail(RF_ERR_IO, "%s: %s", from, strerror(errno));
    if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(from, target, sizeof target - 1);
        if (n < 0) return rf_fail(RF_ERR_IO, "%s: %s", from, strerror(errno));
        target[n] = 0;
        return symlink(target, to) ? rf_fail(RF_ERR_IO, "%s: %s", to, strerror(errno)) : RF_OK;
    }
    if (S_ISDIR(st.st_mode)) {
        if (mkdir(to, 0755) != 0) return rf_fail(RF_ERR_IO, "%s: %s", to, strerror(errno));
        struct dirent **list;
        int n = names_of(from, &list);
        if (n < 0) return n;
        int rc = RF_OK;
        for (int i = 0; i < n; i++) {
            if (!rc && !dot_name(list[i]->d_name)) {
                char *a = NULL, *b = NULL;
                if (asprintf(&a, "%s/%s", from, list[i]->d_name) < 0 ||
                    asprintf(&b, "%s/%s", to, list[i]->d_name) < 0)
                    rc = RF_ERR_NOMEM;
                if (!rc) rc = copy_tree(a, b);
                free(a);
                free(b);
            }
            free(list[i]);
        }
        free(list);
        return rc;
    }
    char *data = NULL;
    size_t len;
    int rc = rf_read_file(from, SIZE_MAX / 2, &data, &len);
    if (!rc) {
        FILE *f = fopen(to, "wb");
        if (!f || fwrite(data, 1, len, f) != len) rc = rf_fail(RF_ERR_IO, "%s", to);
        if (f && fclose(f) && !rc) rc = rf_fail(RF_ERR_IO, "%s", to);
    }
    free(data);
    return rc;
}

/* Writes MANIFEST lines for everything under dir/rel, sorted. */
static int manifest_walk(const char *dir, const char *rel, rf_buf *out, int depth) {
    char *path = NULL;
    if (asprintf(&path, "%s%s%s", dir, *rel ? "/" : "", rel) < 0) return RF_ERR_NOMEM;
    struct dirent **list;
    int n = names_of(path, &list);
    if (n < 0) {
        free(path);
        return n;
    }
    int rc = depth > 32 ? rf_fail(RF_ERR_RANGE, "%s: nested too deep", path) : RF_OK;
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (!rc && !dot_name(name) &&
            !(!*rel && (!strcmp(name, "MANIFEST") || !strcmp(name, "COMPLETE")))) {
            char *sub = NULL, *r = NULL;
            if (asprintf(&sub, "%s/%s", path, name) < 0 ||
                asprintf(&r, "%s%s%s", rel, *rel ? "/" : "", name) < 0)
                rc = RF_ERR_NOMEM;
            struct stat st;
            if (!rc && lstat(sub, &st) != 0)
                rc = rf_fail(RF_ERR_IO, "%s: %s", sub, strerror(errno));
            if (!rc && S_ISDIR(st.st_mode)) {
                rc = rf_buf_printf(out, "D\t%s\n", r);
                if (!rc) rc = manifest_walk(dir, r, out, depth + 1);
            } else if (!rc && S_ISLNK(st.st_mode)) {
                char target[PATH_MAX];
                ssize_t k = readlink(sub, target, sizeof target - 1);
                if (k < 0) rc = rf_fail(RF_ERR_IO, "%s: %s", sub, strerror(errno));
                if (!rc) {
                    target[k] = 0;
                    rc = rf_buf_printf(out, "L\t%s\t%s\n", r, target);
                }
            } else if (!rc) {
                char hex[33];
                uint64_t size;
                rc = hash_file(sub, hex, &size);
                if (!rc)
                    rc = rf_buf_printf(out, "F\t%s\t%llu\t%s\n", r, (unsigned long long)size, hex);
            }
            free(sub);
            free(r);
        }
        free(list[i]);
    }
    free(list);
    free(path);
    return rc;
}

static char *join(const char *a, const char *b) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", a, b) < 0 ? NULL : p;
}

/* Checks an entry; "" when intact, else what is wrong. */
static const char *verify(const char *entry, const char *key) {
    static _Thread_local char why[512];
    char *complete = join(entry, "COMPLETE"), *mpath = join(entry, "MANIFEST");
    char *text = NULL, *man = NULL;
    size_t tlen, mlen;
    why[0] = 0;
    if (!complete || !mpath) {
        snprintf(why, sizeof why, "out of memory");
    } else if (rf_read_file(complete, 4096, &text, &tlen) != RF_OK) {
        snprintf(why, sizeof why, "no COMPLETE marker (a partial entry)");
    } else if (rf_read_file(mpath, (size_t)1 << 30, &man, &mlen) != RF_OK) {
        snprintf(why, sizeof why, "MANIFEST missing");
    } else {
        char expect[256], mhex[33];
        rf_hash128_hex(rf_hash128_of(man, mlen, 0), mhex);
        snprintf(expect, sizeof expect, FORMAT "\nkey %s\nmanifest %s\n", key, mhex);
        if (strcmp(text, expect) != 0)
            snprintf(why, sizeof why, "MANIFEST does not match COMPLETE");
        for (char *line = man, *next; !why[0] && line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            char *f[4] = {0};
            int nf = 0;
            for (char *t = line, *save = NULL;
                 nf < 4 && (t = strtok_r(nf ? NULL : t, "\t", &save));)
                f[nf++] = t;
            char *p = nf >= 2 ? join(entry, f[1]) : NULL;
            struct stat st;
            if (!p) {
                snprintf(why, sizeof why, "bad MANIFEST line");
            } else if (lstat(p, &st) != 0) {
                snprintf(why, sizeof why, "%s is missing", f[1]);
            } else if (f[0][0] == 'F') {
                char hex[33];
                if (nf != 4 || (unsigned long long)st.st_size != strtoull(f[2], NULL, 10))
                    snprintf(why, sizeof why, "%s: size differs from MANIFEST", f[1]);
                else if (hash_file(p, hex, NULL) != RF_OK || strcmp(hex, f[3]) != 0)
                    snprintf(why, sizeof why, "%s: content differs from MANIFEST", f[1]);
            } else if (f[0][0] == 'D' && !S_ISDIR(st.st_mode)) {
                snprintf(why, sizeof why, "%s: not a directory", f[1]);
            } else if (f[0][0] == 'L') {
                char target[PATH_MAX];
                ssize_t k = readlink(p, target, sizeof target - 1);
                if (k < 0 || nf != 3 || (target[k] = 0, strcmp(target, f[2]) != 0))
                    snprintf(why, sizeof why, "%s: link differs from MANIFEST", f[1]);
            }
            free(p);
        }
    }
    free(text);
    free(man);
    free(complete);
    free(mpath);
    return why;
}

int rf_cache_lookup(rf_cache *c, const char *stage, const char *key, char **entry,
                    const char **why) {
    char *path = NULL;
    *entry = NULL;
    if (asprintf(&path, "%s/%s/%s", c->dir, stage, key) < 0) return RF_ERR_NOMEM;
    struct stat st;
    if (stat(path, &st) != 0) {
        free(path);
        *why = "absent";
        return 0;
    }
    const char *bad = verify(path, key);
    if (!bad[0]) {
        *entry = path;
        return 1;
    }
    /* set it aside before removing, so that a concurrent lookup never sees half of it */
    char *aside = NULL;
    if (asprintf(&aside, "%s.bad.%ld", path, (long)getpid()) >= 0 && rename(path, aside) == 0)
        rf_rm_tree(aside);
    free(aside);
    free(path);
    *why = bad;
    return 0;
}

/* Removes <stage>/<key>.tmp.<pid> (and the .bad. and .old. ones set aside)
 * of processes that have ended: what a killed run left behind. */
static void sweep(rf_cache *c, const char *stage) {
    char *dir = NULL;
    if (asprintf(&dir, "%s/%s", c->dir, stage) < 0) return;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *at = strstr(e->d_name, ".tmp.");
        if (!at) at = strstr(e->d_name, ".bad.");
        if (!at) at = strstr(e->d_name, ".old.");
        if (!at) continue;
        long pid = strtol(at + 5, NULL, 10);
        if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            char *p = NULL;
            if (asprintf(&p, "%s/%s", dir, e->d_name) >= 0) rf_rm_tree(p);
            free(p);
        }
    }
    if (d) closedir(d);
    free(dir);
}

int rf_cache_begin(rf_cache *c, const char *stage, const char *key, char **tmp) {
    sweep(c, stage);
    char *p = NULL;
    if (asprintf(&p, "%s/%s/%s.tmp.%ld", c->dir, stage, key, (long)getpid()) < 0)
        return RF_ERR_NOMEM;
    rf_rm_tree(p);
    int rc = rf_mkdir_p(p);
    if (rc) {
        free(p);
        return rf_fail_ctx(rc, "cache entry");
    }
    *tmp = p;
    return RF_OK;
}

void rf_cache_abort(char *tmp) {
    if (!tmp) return;
    rf_rm_tree(tmp);
    free(tmp);
}

static int dump_counter(void *user, const char *name, int kind, int64_t value, double real,
                        const char *str) {
    rf_buf *out = user;
    if (rf_cache_is_record(name)) return RF_OK;
    if (kind == 1) return rf_buf_printf(out, "r\t%s\t%.17g\n", name, real);
    if (kind == 2) return rf_buf_printf(out, "b\t%s\t%lld\n", name, (long long)value);
    if (kind == 3) return strchr(str, '\n') ? RF_OK : rf_buf_printf(out, "s\t%s\t%s\n", name, str);
    return rf_buf_printf(out, "i\t%s\t%lld\n", name, (long long)value);
}

static int write_text(const char *dir, const char *name, const rf_buf *b) {
    char *p = join(dir, name);
    if (!p) return RF_ERR_NOMEM;
    int rc = rf_write_file_atomic(p, b->data ? b->data : "", b->len);
    free(p);
    return rc;
}

/* Replaces run_dir/<name> by a link to target. */
static int link_output(const char *target, const char *run_dir, const char *name) {
    char *at = join(run_dir, name);
    if (!at) return RF_ERR_NOMEM;
    int rc = rf_rm_tree(at);
    if (!rc && symlink(target, at) != 0)
        rc = rf_fail(RF_ERR_IO, "linking %s to %s: %s", at, target, strerror(errno));
    free(at);
    return rc;
}

int rf_cache_commit(rf_cache *c, const char *stage, const char *key, char *tmp, const char *run_dir,
                    const char *const *outputs, const rf_stats *stats, char **entry) {
    char *out = join(tmp, "out"), *final = NULL;
    rf_buf b = RF_BUF_INIT;
    int rc = out ? rf_mkdir_p(out) : RF_ERR_NOMEM;
    for (const char *const *o = outputs; !rc && o && *o; o++) {
        char *from = join(run_dir, *o), *to = join(out, *o);
        struct stat st;
        if (!from || !to) rc = RF_ERR_NOMEM;
        if (!rc && lstat(from, &st) == 0) {
            if (rename(from, to) != 0) {
                if (errno == EXDEV) /* another filesystem: copied once, reused by reference */
                    rc = copy_tree(from, to);
                else
                    rc = rf_fail(RF_ERR_IO, "moving %s into the cache: %s", from, strerror(errno));
                if (!rc) rc = rf_rm_tree(from);
            }
        }
        free(from);
        free(to);
    }
    if (!rc && stats) {
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%s.", stage);
        rc = rf_stats_each(stats, prefix, dump_counter, &b);
    }
    if (!rc) rc = write_text(tmp, "stats.tsv", &b);
    rf_buf_reset(&b);
    if (!rc) rc = manifest_walk(tmp, "", &b, 0);
    if (!rc) rc = write_text(tmp, "MANIFEST", &b);
    if (!rc) {
        char mhex[33];
        rf_hash128_hex(rf_hash128_of(b.data ? b.data : "", b.len, 0), mhex);
        rf_buf_reset(&b);
        rc = rf_buf_printf(&b, FORMAT "\nkey %s\nmanifest %s\n", key, mhex);
        if (!rc) rc = write_text(tmp, "COMPLETE", &b);
    }
    if (!rc && asprintf(&final, "%s/%s/%s", c->dir, stage, key) < 0) rc = RF_ERR_NOMEM;
    if (!rc && rename(tmp, final) != 0) {
        /* an entry of the same key is there (a stage rerun after an upstream miss):
         * put ours in its place */
        char *aside = NULL;
        if (asprintf(&aside, "%s.old.%ld", final, (long)getpid()) < 0) rc = RF_ERR_NOMEM;
        if (!rc && (rename(final, aside) != 0 || rename(tmp, final) != 0))
            rc = rf_fail(RF_ERR_IO, "cache entry %s: %s", final, strerror(errno));
        if (aside) rf_rm_tree(aside);
        free(aside);
    }
    if (!rc) {
        char *dir = join(final, "out");
        for (const char *const *o = outputs; !rc && o && *o; o++) {
            char *target = dir ? join(dir, *o) : NULL;
            struct stat st;
            if (!target) rc = RF_ERR_NOMEM;
            if (!rc && lstat(target, &st) == 0) rc = link_output(target, run_dir, *o);
            free(target);
        }
        free(dir);
    }
    rf_buf_free(&b);
    free(out);
    if (rc) {
        rf_cache_abort(tmp);
        free(final);
        return rf_fail_ctx(rc, "storing stage %s in the cache", stage);
    }
    free(tmp);
    *entry = final;
    return RF_OK;
}

int rf_cache_reuse(const char *entry, const char *run_dir, const char *const *outputs,
                   rf_stats *stats) {
    int rc = RF_OK;
    for (const char *const *o = outputs; !rc && o && *o; o++) {
        char *target = NULL;
        struct stat st;
        if (asprintf(&target, "%s/out/%s", entry, *o) < 0) return RF_ERR_NOMEM;
        if (lstat(target, &st) == 0)
            rc = link_output(target, run_dir, *o);
        else { /* the stage wrote no such output: neither is there one now */
            char *at = join(run_dir, *o);
            rc = at ? rf_rm_tree(at) : RF_ERR_NOMEM;
            free(at);
        }
        free(target);
    }
    char *path = join(entry, "stats.tsv"), *text = NULL;
    size_t len;
    if (!rc && !path) rc = RF_ERR_NOMEM;
    if (!rc) rc = rf_read_file(path, (size_t)64 << 20, &text, &len);
    for (char *line = text, *next; !rc && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *name = strchr(line, '\t'), *value = name ? strchr(name + 1, '\t') : NULL;
        if (!value) continue;
        *value++ = 0;
        name++;
        if (line[0] == 'r') rc = rf_stats_set_real(stats, name, strtod(value, NULL));
        if (line[0] == 'i') rc = rf_stats_set(stats, name, strtoll(value, NULL, 10));
        if (line[0] == 'b') rc = rf_stats_set_bool(stats, name, strtoll(value, NULL, 10) != 0);
        if (line[0] == 's') rc = rf_stats_set_str(stats, name, value);
    }
    free(text);
    free(path);
    return rc;
}

int rf_cache_unlink_outputs(const char *run_dir, const char *const *outputs) {
    for (const char *const *o = outputs; o && *o; o++) {
        char *at = join(run_dir, *o);
        struct stat st;
        if (!at) return RF_ERR_NOMEM;
        if (lstat(at, &st) == 0 && S_ISLNK(st.st_mode) && unlink(at) != 0) {
            int rc = rf_fail(RF_ERR_IO, "%s: %s", at, strerror(errno));
            free(at);
            return rc;
        }
        free(at);
    }
    return RF_OK;
}
