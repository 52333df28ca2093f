/* Token shards (format in shard.h). */
#include "tokenizer/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/sys.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards store little-endian ids and are mapped directly"
#endif

static void put_u32(unsigned char *p, uint32_t v) {
    memcpy(p, &v, 4);
}
static void put_u64(unsigned char *p, uint64_t v) {
    memcpy(p, &v, 8);
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

struct rf_shard_writer {
    char *bin_path, *bin_tmp, *idx_path;
    FILE *bin;
    rf_shard_info info;
    rf_buf records;
};

static char *cat(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", a, b);
    return s;
}

static void writer_free(rf_shard_writer *w) {
    if (w->bin) fclose(w->bin);
    if (w->bin_tmp) unlink(w->bin_tmp);
    free(w->bin_path);
    free(w->bin_tmp);
    free(w->idx_path);
    rf_buf_free(&w->records);
    free(w);
}

int rf_shard_writer_open(const char *prefix, const rf_shard_info *info, rf_shard_writer **out) {
    *out = NULL;
    if (info->vocab_size == 0) return rf_fail(RF_ERR_INVALID, "shard: vocab_size must be > 0");
    if ((info->flags & RF_SHARD_PACKED) && info->block_len == 0)
        return rf_fail(RF_ERR_INVALID, "shard: a packed shard needs block_len > 0");
    rf_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return RF_ERR_NOMEM;
    w->info = *info;
    w->info.n_seqs = w->info.n_tokens = 0;
    w->bin_path = cat(prefix, ".bin");
    w->bin_tmp = cat(prefix, ".bin.tmp");
    w->idx_path = cat(prefix, ".idx");
    if (!w->bin_path || !w->bin_tmp || !w->idx_path) {
        writer_free(w);
        return RF_ERR_NOMEM;
    }
    if (!(w->bin = fopen(w->bin_tmp, "wb"))) {
        int rc = rf_fail(RF_ERR_IO, "%s: %s", w->bin_tmp, strerror(errno));
        free(w->bin_tmp);
        w->bin_tmp = NULL;
        writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int rf_shard_writer_add(rf_shard_writer *w, const uint32_t *ids, uint32_t len, int32_t label,
                        uint64_t cluster) {
    if ((w->info.flags & RF_SHARD_PACKED) && len != w->info.block_len)
        return rf_fail(RF_ERR_RANGE, "shard: packed block of %u tokens, expected %u", len,
                       w->info.block_len);
    for (uint32_t i = 0; i < len; i++)
        if (ids[i] >= w->info.vocab_size)
            return rf_fail(RF_ERR_RANGE, "shard: id %u is not below vocab_size %u", ids[i],
                           w->info.vocab_size);
    if (len && fwrite(ids, sizeof *ids, len, w->bin) != len)
        return rf_fail(RF_ERR_IO, "%s: %s", w->bin_tmp, strerror(errno));
    unsigned char rec[RF_SHARD_RECORD_LEN];
    put_u64(rec, w->info.n_tokens);
    put_u32(rec + 8, len);
    put_u32(rec + 12, (uint32_t)label);
    put_u64(rec + 16, cluster);
    if (rf_buf_append(&w->records, rec, sizeof rec)) return RF_ERR_NOMEM;
    w->info.n_seqs++;
    w->info.n_tokens += len;
    return 0;
}

int rf_shard_writer_close(rf_shard_writer *w) {
    int rc = 0;
    if (fflush(w->bin) || fsync(fileno(w->bin)))
        rc = rf_fail(RF_ERR_IO, "%s: %s", w->bin_tmp, strerror(errno));
    if (fclose(w->bin) && !rc) rc = rf_fail(RF_ERR_IO, "%s: %s", w->bin_tmp, strerror(errno));
    w->bin = NULL;
    if (!rc && rename(w->bin_tmp, w->bin_path))
        rc = rf_fail(RF_ERR_IO, "rename %s: %s", w->bin_tmp, strerror(errno));
    if (!rc) {
        free(w->bin_tmp);
        w->bin_tmp = NULL;
    }
    rf_buf idx = RF_BUF_INIT;
    if (!rc && rf_buf_reserve(&idx, RF_SHARD_HEADER_LEN + w->records.len)) rc = RF_ERR_NOMEM;
    if (!rc) {
        unsigned char *h = (unsigned char *)idx.data;
        memset(h, 0, RF_SHARD_HEADER_LEN);
        memcpy(h, RF_SHARD_MAGIC, 8);
        put_u32(h + 8, RF_SHARD_VERSION);
        put_u32(h + 12, w->info.flags);
        put_u64(h + 16, w->info.n_seqs);
        put_u64(h + 24, w->info.n_tokens);
        put_u32(h + 32, w->info.vocab_size);
        put_u32(h + 36, (uint32_t)w->info.eos_id);
        put_u32(h + 40, (uint32_t)w->info.pad_id);
        put_u32(h + 44, w->info.block_len);
        put_u64(h + 48, rf_hash64(w->records.data ? w->records.data : "", w->records.len, 0));
        idx.len = RF_SHARD_HEADER_LEN;
        if (w->records.len) memcpy(idx.data + idx.len, w->records.data, w->records.len);
        idx.len += w->records.len;
        rc = rf_write_file_atomic(w->idx_path, idx.data, idx.len);
    }
    rf_buf_free(&idx);
    writer_free(w);
    return rc;
}

void rf_shard_writer_abort(rf_shard_writer *w) {
    if (w) writer_free(w);
}

struct rf_shard {
    rf_shard_info info;
    const unsigned char *idx;
    size_t idx_len;
    const uint32_t *ids;
    size_t bin_len;
};

static int map_file(const char *path, const void **data, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rf_fail(errno == ENOENT ? RF_ERR_NOT_FOUND : RF_ERR_IO, "%s: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return rf_fail(RF_ERR_IO, "%s: not a regular file", path);
    }
    *len = (size_t)st.st_size;
    *data = NULL;
    if (*len) {
        void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return rf_fail(RF_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        }
        *data = p;
    }
    close(fd);
    return 0;
}

void rf_shard_close(rf_shard *s) {
    if (!s) return;
    if (s->idx_len) munmap((void *)s->idx, s->idx_len);
    if (s->bin_len) munmap((void *)s->ids, s->bin_len);
    free(s);
}

static int corrupt(rf_shard *s, const char *prefix, const char *what) {
    rf_shard_close(s);
    return rf_fail(RF_ERR_CORRUPT, "shard %s: %s", prefix, what);
}

int rf_shard_open(const char *prefix, rf_shard **out) {
    *out = NULL;
    rf_shard *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    char path[4096];
    const void *p;
    snprintf(path, sizeof path, "%s.idx", prefix);
    int rc = map_file(path, &p, &s->idx_len);
    if (rc) {
        free(s);
        return rc;
    }
    s->idx = p;
    snprintf(path, sizeof path, "%s.bin", prefix);
    if ((rc = map_file(path, &p, &s->bin_len))) {
        rf_shard_close(s);
        return rc;
    }
    s->ids = p;
    const unsigned char *h = s->idx;
    if (s->idx_len < RF_SHARD_HEADER_LEN || memcmp(h, RF_SHARD_MAGIC, 8) != 0)
        return corrupt(s, prefix, "bad magic (not a token shard index)");
    if (get_u32(h + 8) != RF_SHARD_VERSION) return corrupt(s, prefix, "unsupported version");
    rf_shard_info *in = &s->info;
    in->flags = get_u32(h + 12);
    in->n_seqs = get_u64(h + 16);
    in->n_tokens = get_u64(h + 24);
    in->vocab_size = get_u32(h + 32);
    in->eos_id = (int32_t)get_u32(h + 36);
    in->pad_id = (int32_t)get_u32(h + 40);
    in->block_len = get_u32(h + 44);
    if (in->n_seqs > (s->idx_len - RF_SHARD_HEADER_LEN) / RF_SHARD_RECORD_LEN ||
        s->idx_len != RF_SHARD_HEADER_LEN + in->n_seqs * RF_SHARD_RECORD_LEN)
        return corrupt(s, prefix, "index size does not match its sequence count");
    if (in->n_tokens > SIZE_MAX / 4 || s->bin_len != in->n_tokens * 4)
        return corrupt(s, prefix, ".bin size does not match the token count");
    const unsigned char *rec = h + RF_SHARD_HEADER_LEN;
    if (rf_hash64(rec, in->n_seqs * RF_SHARD_RECORD_LEN, 0) != get_u64(h + 48))
        return corrupt(s, prefix, "record checksum mismatch");
    uint64_t next = 0;
    for (uint64_t i = 0; i < in->n_seqs; i++, rec += RF_SHARD_RECORD_LEN) {
        uint64_t start = get_u64(rec);
        uint32_t len = get_u32(rec + 8);
        if (start != next || len > in->n_tokens - start)
            return corrupt(s, prefix, "records are not contiguous within .bin");
        if ((in->flags & RF_SHARD_PACKED) && len != in->block_len)
            return corrupt(s, prefix, "packed block of the wrong length");
        next = start + len;
    }
    if (next != in->n_tokens) return corrupt(s, prefix, "records do not cover .bin");
    for (uint64_t i = 0; i < in->n_tokens; i++)
        if (s->ids[i] >= in->vocab_size) return corrupt(s, prefix, "token id out of vocabulary");
    *out = s;
    return 0;
}

const rf_shard_info *rf_shard_get_info(const rf_shard *s) {
    return &s->info;
}

int rf_shard_get(const rf_shard *s, uint64_t i, rf_shard_seq *out) {
    if (i >= s->info.n_seqs)
        return rf_fail(RF_ERR_RANGE, "shard: sequence %llu of %llu", (unsigned long long)i,
                       (unsigned long long)s->info.n_seqs);
    const unsigned char *rec = s->idx + RF_SHARD_HEADER_LEN + i * RF_SHARD_RECORD_LEN;
    uint64_t start = get_u64(rec);
    out->len = get_u32(rec + 8);
    out->ids = s->ids ? s->ids + start : NULL;
    out->label = (int32_t)get_u32(rec + 12);
    out->cluster = get_u64(rec + 16);
    return 0;
}
