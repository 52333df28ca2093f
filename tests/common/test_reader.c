#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include <zlib.h>
#include <zstd.h>

#include "common/error.h"
#include "common/reader.h"

static char tmpdir[] = "/tmp/rf_reader_XXXXXX";

static int setup(void **state) {
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static const char text[] = "first\nsecond line\r\n\nlast without newline";

/* Reads text's lines from r, then closes it. */
static void check_reader(rf_reader *r) {
    rf_line l;
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_int_equal(l.len, 5);
    assert_memory_equal(l.data, "first", 5);
    assert_int_equal(l.lineno, 1);
    assert_int_equal(l.offset, 0);
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_int_equal(l.len, 12); /* the '\r' is kept */
    assert_memory_equal(l.data, "second line\r", 12);
    assert_int_equal(l.offset, 6);
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_int_equal(l.len, 0);
    assert_int_equal(l.lineno, 3);
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_false(l.has_newline);
    assert_int_equal(l.offset, 20);
    assert_memory_equal(l.data, "last without newline", 20);
    assert_int_equal(rf_reader_next(r, &l), 0);
    rf_reader_close(r);
}

static void check_lines(const char *path) {
    rf_reader *r;
    assert_int_equal(rf_reader_open(path, 0, &r), 0);
    check_reader(r);
}

static void test_plain(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/plain.txt", tmpdir);
    write_file(p, text, sizeof text - 1);
    check_lines(p);
}

static void test_gzip(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/a.gz", tmpdir);
    gzFile g = gzopen(p, "wb");
    gzwrite(g, text, sizeof text - 1);
    gzclose(g);
    check_lines(p);
}

static void test_zstd(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/a.zst", tmpdir);
    char out[256];
    size_t n = ZSTD_compress(out, sizeof out, text, sizeof text - 1, 3);
    assert_false(ZSTD_isError(n));
    write_file(p, out, n);
    check_lines(p);
}

/* A Kafka message's bytes: plain, zstd, bigger than one window, empty. */
static void test_memory(void **state) {
    rf_reader *r;
    assert_int_equal(rf_reader_open_mem(text, sizeof text - 1, "msg", 0, &r), 0);
    check_reader(r);

    char z[256];
    size_t n = ZSTD_compress(z, sizeof z, text, sizeof text - 1, 3);
    assert_false(ZSTD_isError(n));
    assert_int_equal(rf_reader_open_mem(z, n, "msg", 0, &r), 0);
    assert_int_equal(rf_reader_compression(r), RF_COMP_ZSTD);
    check_reader(r);

    size_t lines = 300000;              /* 3 MB: several windows */
    char *big = malloc(lines * 10 + 1); /* + the last snprintf's NUL */
    for (size_t i = 0; i < lines; i++)
        snprintf(big + 10 * i, 11, "%09zu\n", i);
    assert_int_equal(rf_reader_open_mem(big, lines * 10, "big", 0, &r), 0);
    rf_line l;
    for (size_t i = 0; i < lines; i++) {
        assert_int_equal(rf_reader_next(r, &l), 1);
        assert_int_equal(l.len, 9);
        assert_int_equal(strtoull(l.data, NULL, 10), i);
        assert_int_equal(l.offset, 10 * i);
    }
    assert_int_equal(rf_reader_next(r, &l), 0);
    assert_int_equal(rf_reader_bytes_out(r), lines * 10);
    rf_reader_close(r);
    free(big);

    assert_int_equal(rf_reader_open_mem("", 0, "empty", 0, &r), 0);
    assert_int_equal(rf_reader_next(r, &l), 0);
    rf_reader_close(r);
}

static void test_too_long_line_is_flagged_not_held(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/long.txt", tmpdir);
    size_t big = 5u << 20; /* 5 MiB line, spanning many windows */
    char *data = malloc(big + 8);
    memset(data, 'x', big);
    memcpy(data + big, "\nshort\n", 7);
    write_file(p, data, big + 7);
    free(data);
    rf_reader *r;
    assert_int_equal(rf_reader_open(p, 1000, &r), 0);
    rf_line l;
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_true(l.too_long);
    assert_int_equal(l.len, 1000);
    assert_int_equal(l.full_len, big);
    assert_int_equal(rf_reader_next(r, &l), 1);
    assert_false(l.too_long);
    assert_int_equal(l.offset, big + 1);
    assert_int_equal(l.lineno, 2);
    assert_memory_equal(l.data, "short", 5);
    assert_int_equal(rf_reader_next(r, &l), 0);
    rf_reader_close(r);
}

static void test_corrupt_gzip(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/bad.gz", tmpdir);
    unsigned char junk[64] = {0x1f, 0x8b, 8, 0};
    for (int i = 10; i < 64; i++)
        junk[i] = (unsigned char)(i * 37);
    write_file(p, junk, sizeof junk);
    rf_reader *r;
    assert_int_equal(rf_reader_open(p, 0, &r), 0);
    rf_line l;
    int rc;
    while ((rc = rf_reader_next(r, &l)) == 1) {
    }
    assert_int_equal(rc, RF_ERR_CORRUPT);
    rf_reader_close(r);
}

static void test_truncated_gzip(void **state) {
    char p[256];
    snprintf(p, sizeof p, "%s/trunc.gz", tmpdir);
    gzFile g = gzopen(p, "wb");
    for (int i = 0; i < 1000; i++)
        gzprintf(g, "line %d with some text to compress\n", i);
    gzclose(g);
    assert_int_equal(truncate(p, 200), 0);
    rf_reader *r;
    assert_int_equal(rf_reader_open(p, 0, &r), 0);
    rf_line l;
    int rc;
    while ((rc = rf_reader_next(r, &l)) == 1) {
    }
    assert_int_equal(rc, RF_ERR_CORRUPT);
    rf_reader_close(r);
}

static void test_missing_file(void **state) {
    rf_reader *r;
    assert_int_equal(rf_reader_open("/nonexistent/file", 0, &r), RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), "/nonexistent/file"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_gzip),
        cmocka_unit_test(test_zstd),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_too_long_line_is_flagged_not_held),
        cmocka_unit_test(test_corrupt_gzip),
        cmocka_unit_test(test_truncated_gzip),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
