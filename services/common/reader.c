#include "common/reader.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "common/buf.h"
#include "common/error.h"

#define IN_CAP  (256 * 1024)
#define OUT_CAP (1024 * 1024)

struct rf_reader {
    FILE *f; /* NULL for a reader over memory */
    int owns_file;
    int owns_in; /* in is ours (else the caller's memory) */
    char *path;
    rf_compression comp;
    size_t max_line;
    /* compressed input */
    unsigned char *in;
    size_t in_len, in_pos;
    int in_eof;
    z_stream zs;
    int zs_live;
    ZSTD_DStream *zd;
    /* decompressed window */
    char *win;
    size_t win_len, win_pos;
    int out_eof;
    /* a line spanning windows, or the kept prefix of a too-long one */
    rf_buf line;
    uint64_t lineno, offset, bytes_in, bytes_out;
};

static int fill_input(rf_reader *r) {
    if (r->in_pos < r->in_len || r->in_eof) return RF_OK;
    r->in_len = fread(r->in, 1, IN_CAP, r->f);
    r->in_pos = 0;
    r->bytes_in += r->in_len;
    if (r->in_len == 0) {
        if (ferror(r->f))
            return rf_fail(RF_ERR_IO, "%s: read failed: %s", r->path, strerror(errno));
        r->in_eof = 1;
    }
    return RF_OK;
}

/* Refills the decompressed window; sets out_eof at the end of the stream. */
static int fill_window(rf_reader *r) {
    r->win_len = r->win_pos = 0;
    while (r->win_len == 0 && !r->out_eof) {
        int rc = fill_input(r);
        if (rc) return rc;
        size_t avail = r->in_len - r->in_pos;
        if (r->comp == RF_COMP_NONE) {
            if (avail == 0 && r->in_eof) {
                r->out_eof = 1;
                break;
            }
            /* Plain files read straight into the window. */
            size_t n = avail < OUT_CAP ? avail : OUT_CAP;
            memcpy(r->win, r->in + r->in_pos, n);
            r->in_pos += n;
            r->win_len = n;
        } else if (r->comp == RF_COMP_GZIP) {
            if (avail == 0 && r->in_eof) {
                if (r->zs_live)
                    return rf_fail(RF_ERR_CORRUPT, "%s: truncated gzip stream", r->path);
                r->out_eof = 1;
                break;
            }
            if (!r->zs_live) {
                if (inflateReset2(&r->zs, 15 + 32) != Z_OK)
                    return rf_fail(RF_ERR_INTERNAL, "%s: inflate reset failed", r->path);
                r->zs_live = 1;
            }
            r->zs.next_in = r->in + r->in_pos;
            r->zs.avail_in = (uInt)avail;
            r->zs.next_out = (Bytef *)r->win;
            r->zs.avail_out = OUT_CAP;
            int zr = inflate(&r->zs, Z_NO_FLUSH);
            r->in_pos = r->in_len - r->zs.avail_in;
            r->win_len = OUT_CAP - r->zs.avail_out;
            if (zr == Z_STREAM_END) {
                r->zs_live = 0; /* another gzip member may follow */
            } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
                return rf_fail(RF_ERR_CORRUPT, "%s: corrupt gzip data at compressed byte %llu",
                               r->path, (unsigned long long)(r->bytes_in - r->zs.avail_in));
            } else if (zr == Z_BUF_ERROR && avail == 0 && r->in_eof) {
                return rf_fail(RF_ERR_CORRUPT, "%s: truncated gzip stream", r->path);
            }
        } else {
            if (avail == 0 && r->in_eof) {
                if (r->zs_live)
                    return rf_fail(RF_ERR_CORRUPT, "%s: truncated zstd stream", r->path);
                r->out_eof = 1;
                break;
            }
            ZSTD_inBuffer ib = {r->in + r->in_pos, avail, 0};
            ZSTD_outBuffer ob = {r->win, OUT_CAP, 0};
            size_t zr = ZSTD_decompressStream(r->zd, &ob, &ib);
            if (ZSTD_isError(zr))
                return rf_fail(RF_ERR_CORRUPT, "%s: corrupt zstd data: %s", r->path,
                               ZSTD_getErrorName(zr));
            r->zs_live = zr != 0; /* 0 means a frame just ended */
            r->in_pos += ib.pos;
            r->win_len = ob.pos;
        }
    }
    r->bytes_out += r->win_len;
    return RF_OK;
}

/* Detects the compression from the first input bytes and sets up the
 * decompressor. Frees r on failure. */
static int start(rf_reader *r, rf_reader **out) {
    const unsigned char *m = r->in;
    if (r->in_len >= 2 && m[0] == 0x1f && m[1] == 0x8b) {
        r->comp = RF_COMP_GZIP;
        if (inflateInit2(&r->zs, 15 + 32) != Z_OK) {
            rf_reader_close(r);
            return rf_fail(RF_ERR_NOMEM, "inflateInit failed");
        }
        r->zs_live = 1;
    } else if (r->in_len >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) {
        r->comp = RF_COMP_ZSTD;
        r->zd = ZSTD_createDStream();
        if (!r->zd) {
            rf_reader_close(r);
            return RF_ERR_NOMEM;
        }
        ZSTD_initDStream(r->zd);
        r->zs_live = 1;
    }
    *out = r;
    return RF_OK;
}

static rf_reader *reader_new(const char *name, size_t max_line, bool own_in) {
    rf_reader *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->max_line = max_line ? max_line : (size_t)1 << 30;
    r->path = strdup(name);
    r->owns_in = own_in;
    r->in = own_in ? malloc(IN_CAP) : NULL;
    r->win = malloc(OUT_CAP);
    if (!r->path || (own_in && !r->in) || !r->win) {
        rf_reader_close(r);
        return NULL;
    }
    return r;
}

int rf_reader_open(const char *path, size_t max_line, rf_reader **out) {
    rf_reader *r = reader_new(path, max_line, true);
    if (!r) return RF_ERR_NOMEM;
    if (strcmp(path, "-") == 0) {
        r->f = stdin;
    } else {
        r->f = fopen(path, "rb");
        if (!r->f) {
            int e = errno;
            rf_reader_close(r);
            return rf_fail(e == ENOENT ? RF_ERR_NOT_FOUND : RF_ERR_IO, "%s: %s", path, strerror(e));
        }
        r->owns_file = 1;
    }
    int rc = fill_input(r);
    if (rc) {
        rf_reader_close(r);
        return rc;
    }
    return start(r, out);
}

int rf_reader_open_mem(const void *data, size_t len, const char *name, size_t max_line,
                       rf_reader **out) {
    rf_reader *r = reader_new(name, max_line, false);
    if (!r) return RF_ERR_NOMEM;
    /* All the input at once: fill_input never reads (in_eof). */
    r->in = (unsigned char *)data;
    r->in_len = len;
    r->in_eof = 1;
    r->bytes_in = len;
    return start(r, out);
}

int rf_reader_next(rf_reader *r, rf_line *line) {
    rf_buf_reset(&r->line);
    uint64_t full = 0;
    int spanning = 0; /* bytes of this line are in r->line, not the window */
    for (;;) {
        if (r->win_pos == r->win_len) {
            if (r->out_eof) break;
            int rc = fill_window(r);
            if (rc) return rc;
            if (r->win_len == 0) break;
        }
        char *start = r->win + r->win_pos;
        size_t avail = r->win_len - r->win_pos;
        char *nl = memchr(start, '\n', avail);
        size_t take = nl ? (size_t)(nl - start) : avail;
        if (!spanning && nl && take <= r->max_line) {
            /* Common case: the whole line is in the window. */
            r->win_pos += take + 1;
            *line = (rf_line){start, take, ++r->lineno, r->offset, take, false, true};
            r->offset += take + 1;
            return 1;
        }
        size_t room = full < r->max_line ? r->max_line - (size_t)full : 0;
        size_t keep = take < room ? take : room;
        if (keep && rf_buf_append(&r->line, start, keep)) return RF_ERR_NOMEM;
        spanning = 1;
        full += take;
        r->win_pos += take + (nl != NULL);
        if (nl) {
            *line = (rf_line){r->line.data, r->line.len,        ++r->lineno, r->offset,
                              full,         full > r->max_line, true};
            r->offset += full + 1;
            return 1;
        }
    }
    if (!spanning) return 0;
    /* Last line without a newline. */
    *line = (rf_line){r->line.data ? r->line.data : "",
                      r->line.len,
                      ++r->lineno,
                      r->offset,
                      full,
                      full > r->max_line,
                      false};
    r->offset += full;
    return 1;
}

rf_compression rf_reader_compression(const rf_reader *r) {
    return r->comp;
}

uint64_t rf_reader_bytes_in(const rf_reader *r) {
    return r->bytes_in;
}

uint64_t rf_reader_bytes_out(const rf_reader *r) {
    return r->bytes_out;
}

void rf_reader_close(rf_reader *r) {
    if (!r) return;
    if (r->owns_file) fclose(r->f);
    if (r->comp == RF_COMP_GZIP) inflateEnd(&r->zs);
    if (r->zd) ZSTD_freeDStream(r->zd);
    rf_buf_free(&r->line);
    if (r->owns_in) free(r->in);
    free(r->win);
    free(r->path);
    free(r);
}
