/* Safetensors parser and config/model loading: round trip, conversions, and
 * every kind of corrupt input giving a clear error instead of a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "trainer/bert_config.h"
#include "trainer/model.h"
#include "trainer/safetensors.h"

static char tmpdir[] = "/tmp/rf_st_XXXXXX";

/* Builds a file from a header string and n data bytes (value = index). */
static uint8_t *make_file(const char *header, size_t ndata, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + ndata;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < ndata; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

static int parse(const char *header, size_t ndata) {
    size_t len;
    uint8_t *b = make_file(header, ndata, &len);
    rf_st_file *f;
    int rc = rf_st_parse(b, len, &f);
    if (!rc) rf_st_free(f);
    return rc;
}

static void test_roundtrip(void **state) {
    float a[6] = {1, -2, 3.5f, 4, 5, 6}, b[3] = {0.25f, -0.5f, 1e-3f};
    rf_st_out t[2] = {{"w", 2, {2, 3}, a}, {"bias", 1, {3}, b}};
    char path[256];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    assert_int_equal(rf_st_write(path, t, 2), 0);
    rf_st_file *f;
    assert_int_equal(rf_st_open(path, &f), 0);
    assert_int_equal(f->n, 2);
    const rf_st_tensor *w = rf_st_find(f, "w");
    assert_non_null(w);
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[1], 3);
    float out[6];
    assert_int_equal(rf_st_to_f32(w, out), 0);
    assert_memory_equal(out, a, sizeof a);
    assert_int_equal(rf_st_to_f32(rf_st_find(f, "bias"), out), 0);
    assert_memory_equal(out, b, sizeof b);
    assert_null(rf_st_find(f, "nope"));
    rf_st_free(f);
}

static void test_half_conversions(void **state) {
    /* F16: 1.0 = 0x3c00, -2.0 = 0xc000, smallest subnormal 0x0001 = 2^-24.
     * BF16: 1.0 = 0x3f80, -3.0 = 0xc040. */
    uint8_t data[] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x80, 0x3f, 0x40, 0xc0};
    const char *h = "{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]}}";
    size_t len;
    uint8_t *buf = make_file(h, sizeof data, &len);
    memcpy(buf + len - sizeof data, data, sizeof data);
    rf_st_file *f;
    assert_int_equal(rf_st_parse(buf, len, &f), 0);
    float x[3];
    assert_int_equal(rf_st_to_f32(rf_st_find(f, "a"), x), 0);
    assert_true(x[0] == 1.0f && x[1] == -2.0f && x[2] == 0x1p-24f);
    assert_int_equal(rf_st_to_f32(rf_st_find(f, "b"), x), 0);
    assert_true(x[0] == 1.0f && x[1] == -3.0f);
    rf_st_free(f);
}

static void test_corrupt(void **state) {
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    assert_int_equal(parse(ok, 8), 0);
    assert_int_equal(parse(ok, 4), RF_ERR_CORRUPT); /* data truncated */
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8),
                     RF_ERR_CORRUPT); /* shape does not match bytes */
    assert_int_equal(parse("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                     RF_ERR_UNSUPPORTED);
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8),
                     RF_ERR_CORRUPT);
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8),
                     RF_ERR_CORRUPT);
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), RF_ERR_CORRUPT);
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                           8),
                     RF_ERR_CORRUPT); /* overlap */
    assert_int_equal(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,"
                           "4294967296],\"data_offsets\":[0,8]}}",
                           8),
                     RF_ERR_CORRUPT); /* overflow */
    assert_int_equal(parse("[1,2]", 0), RF_ERR_CORRUPT);
    assert_int_equal(parse("{\"a\":", 0), RF_ERR_CORRUPT);
    assert_int_equal(parse("{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8),
                     0);
    /* header length larger than the file */
    uint8_t *b = malloc(12);
    memset(b, 0xff, 12);
    rf_st_file *f;
    assert_int_equal(rf_st_parse(b, 12, &f), RF_ERR_CORRUPT);
    assert_non_null(strstr(rf_errmsg(), "header"));
    b = malloc(3);
    assert_int_equal(rf_st_parse(b, 3, &f), RF_ERR_CORRUPT);
}

/* Every prefix of a valid file is rejected cleanly (never read past the end). */
static void test_truncation(void **state) {
    float a[4] = {1, 2, 3, 4};
    rf_st_out t[1] = {{"x", 1, {4}, a}};
    char path[256];
    snprintf(path, sizeof path, "%s/tr.safetensors", tmpdir);
    assert_int_equal(rf_st_write(path, t, 1), 0);
    char *data;
    size_t len;
    assert_int_equal(rf_read_file(path, 1 << 20, &data, &len), 0);
    for (size_t n = 0; n < len; n++) {
        uint8_t *b = malloc(n ? n : 1);
        memcpy(b, data, n);
        rf_st_file *f;
        assert_int_not_equal(rf_st_parse(b, n, &f), 0);
    }
    free(data);
}

static void test_int_dtype_is_not_float(void **state) {
    size_t len;
    uint8_t *b =
        make_file("{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &len);
    rf_st_file *f;
    assert_int_equal(rf_st_parse(b, len, &f), 0);
    float x[2];
    assert_int_equal(rf_st_to_f32(&f->tensors[0], x), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "I32"));
    rf_st_free(f);
}

static void test_config(void **state) {
    rf_bert_config c;
    const char *ok = "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":2,\"intermediate_size\":16,"
                     "\"id2label\":{\"0\":\"a\",\"1\":\"b\",\"2\":\"c\"},"
                     "\"classifier_dropout\":null}";
    assert_int_equal(rf_bert_config_parse(ok, strlen(ok), 0, &c), 0);
    assert_int_equal(c.num_labels, 3);
    assert_float_equal(c.classifier_dropout, 0.1f, 1e-7);
    assert_int_equal(rf_bert_config_parse(ok, strlen(ok), 5, &c), 0);
    assert_int_equal(c.num_labels, 5);
    const char *bad[] = {
        "{\"hidden_size\":8}",
        "{\"vocab_size\":10,\"hidden_size\":9,\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2,\"intermediate_size\":16}",
        "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
        "\"num_attention_heads\":2,\"intermediate_size\":16,\"hidden_act\":\"relu\"}",
        "{\"vocab_size\":\"ten\",\"hidden_size\":8}",
        "{\"vocab_size\":10,",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_not_equal(rf_bert_config_parse(bad[i], strlen(bad[i]), 0, &c), 0);
        assert_true(strlen(rf_errmsg()) > 0);
    }
}

static void write_text(const char *path, const char *s) {
    assert_int_equal(rf_write_file_atomic(path, s, strlen(s)), 0);
}

/* A model folder whose tensors disagree with its config gives a clear error. */
static void test_model_mismatch(void **state) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    rf_mkdir_p(dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":2,\"intermediate_size\":16,"
                     "\"max_position_embeddings\":4}");
    rf_bert_config cfg;
    assert_int_equal(rf_bert_config_load(path, 0, &cfg), 0);
    rf_bert *m;
    assert_int_equal(rf_bert_new(&cfg, rf_backend_cpu(), &m), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(rf_bert_save_safetensors(m, path), 0);
    rf_bert *back;
    assert_int_equal(rf_bert_load(dir, 0, 1, rf_backend_cpu(), &back), 0);
    rf_bert_free(back);
    /* same weights, config with another hidden size */
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, "{\"vocab_size\":10,\"hidden_size\":12,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":2,\"intermediate_size\":16,"
                     "\"max_position_embeddings\":4}");
    assert_int_equal(rf_bert_load(dir, 0, 1, rf_backend_cpu(), &back), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "shape"));
    /* a layer the file does not have */
    write_text(path, "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":2,\"intermediate_size\":16,"
                     "\"max_position_embeddings\":4}");
    assert_int_equal(rf_bert_load(dir, 0, 1, rf_backend_cpu(), &back), RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), "layer.1"));
    rf_bert_free(m);
}

static int setup(void **state) {
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_int_dtype_is_not_float),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_model_mismatch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
