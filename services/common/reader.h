/* A line reader over plain, gzip and zstd files (detected by magic bytes, not by
 * name), or stdin for "-", or memory. Reports each line's 1-based number and the byte offset
 * of its first byte in the decompressed stream.
 *
 * A line is the bytes before '\n'; a trailing '\r' is kept (callers decide).
 * A line longer than max_line is not held in memory: the reader returns its first
 * max_line bytes with too_long set and full_len giving the real length, then
 * skips to the next line. A corrupt compressed stream ends reading with
 * RF_ERR_CORRUPT. */
#ifndef RF_READER_H
#define RF_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rf_reader rf_reader;

typedef enum rf_compression { RF_COMP_NONE, RF_COMP_GZIP, RF_COMP_ZSTD } rf_compression;

typedef struct rf_line {
    const char *data;  /* valid until the next call */
    size_t len;        /* bytes in data (<= max_line) */
    uint64_t lineno;   /* 1-based */
    uint64_t offset;   /* byte offset of the line start (decompressed) */
    uint64_t full_len; /* real length of the line, even when too_long */
    bool too_long;
    bool has_newline; /* false only for a last line without '\n' */
} rf_line;

int rf_reader_open(const char *path, size_t max_line, rf_reader **out);
/* The same over data[0..len), which must outlive the reader (a Kafka
 * message); name stands for the path in error messages. */
int rf_reader_open_mem(const void *data, size_t len, const char *name, size_t max_line,
                       rf_reader **out);
/* Returns 1 with a line, 0 at end of input, or a negative rf_err. */
int rf_reader_next(rf_reader *r, rf_line *line);
rf_compression rf_reader_compression(const rf_reader *r);
uint64_t rf_reader_bytes_in(const rf_reader *r);  /* compressed bytes consumed */
uint64_t rf_reader_bytes_out(const rf_reader *r); /* decompressed bytes produced */
void rf_reader_close(rf_reader *r);

#endif
