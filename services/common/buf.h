/* A growable byte buffer. The caller owns the struct; rf_buf_free releases data.
 * data is always NUL-terminated after a successful append (len excludes it). */
#ifndef RF_BUF_H
#define RF_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct rf_buf {
    char *data;
    size_t len;
    size_t cap;
} rf_buf;

#define RF_BUF_INIT                                                                                \
    { NULL, 0, 0 }

int rf_buf_reserve(rf_buf *b, size_t extra); /* room for len+extra+1 bytes */
int rf_buf_append(rf_buf *b, const void *p, size_t n);
int rf_buf_puts(rf_buf *b, const char *s);
int rf_buf_putc(rf_buf *b, char c);
int rf_buf_printf(rf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Decimal integers without printf (hot in JSON Lines output). */
int rf_buf_put_u64(rf_buf *b, uint64_t v);
int rf_buf_put_i64(rf_buf *b, int64_t v);
/* Appends s[0..n) as a quoted JSON string. Bytes that are not valid UTF-8 are
 * written as U+FFFD so the output is always valid JSON. */
int rf_buf_append_json_str(rf_buf *b, const char *s, size_t n);
void rf_buf_reset(rf_buf *b);  /* len = 0, keeps memory */
void rf_buf_free(rf_buf *b);   /* releases memory, back to RF_BUF_INIT */
char *rf_buf_steal(rf_buf *b); /* returns data (caller frees), resets b */

#endif
