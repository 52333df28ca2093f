/* Token shards (tokenizer/shard.h) as training data. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tokenizer/shard.h"
#include "trainer/dataset.h"

int rf_dataset_load_shard(rf_dataset *d, const char *prefix, int max_len) {
    rf_shard *s;
    int rc = rf_shard_open(prefix, &s);
    if (rc) return rc;
    const rf_shard_info *info = rf_shard_get_info(s);
    uint32_t *buf = malloc(((size_t)max_len + 1) * sizeof *buf);
    if (!buf) rc = RF_ERR_NOMEM;
    for (uint64_t i = 0; i < info->n_seqs && !rc; i++) {
        rf_shard_seq q;
        if ((rc = rf_shard_get(s, i, &q))) break;
        if (q.len == 0) {
            d->skipped++;
            continue;
        }
        size_t n = q.len;
        memcpy(buf, q.ids, (n < (size_t)max_len ? n : (size_t)max_len) * sizeof *buf);
        if (n > (size_t)max_len) { /* keep the closing [SEP] */
            buf[max_len - 1] = q.ids[n - 1];
            n = (size_t)max_len;
        }
        rc = rf_dataset_add(d, buf, n, q.label);
    }
    free(buf);
    rf_shard_close(s);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int rf_dataset_load_shard_dir(rf_dataset *d, const char *dir, int max_len) {
    DIR *dh = opendir(dir);
    if (!dh) return rf_fail(RF_ERR_IO, "cannot open directory %s", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = RF_OK;
    struct dirent *e;
    while ((e = readdir(dh)) && !rc) {
        size_t L = strlen(e->d_name);
        if (L < 5 || strcmp(e->d_name + L - 4, ".idx") != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = RF_ERR_NOMEM;
                break;
            }
            names = nn;
        }
        if (!(names[n] = malloc(strlen(dir) + L + 2))) {
            rc = RF_ERR_NOMEM;
            break;
        }
        sprintf(names[n++], "%s/%.*s", dir, (int)(L - 4), e->d_name);
    }
    closedir(dh);
    if (!rc && n == 0) rc = rf_fail(RF_ERR_NOT_FOUND, "no *.idx token shards in %s", dir);
    if (!rc) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++)
        rc = rf_dataset_load_shard(d, names[i], max_len);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}
