/* Tokenizer unit tests on small inline tokenizers: loading errors, the
 * post-processor, truncation, padding, invalid UTF-8, decoding, and that
 * states used from several threads agree. (HF parity on real data is
 * test_parity; the expected ids of tiny_wp here were checked against
 * tokenizers 0.23.3 with the same JSON, enable_truncation/enable_padding.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

/* ids: [PAD]0 [UNK]1 [CLS]2 [SEP]3 the4 cat5 sat6 ##s7 .8 un9 ##able10 */
static const char tiny_wp[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":[{\"id\":0,\"content\":\"[PAD]\",\"special\":true,\"normalized\":false},"
    "{\"id\":1,\"content\":\"[UNK]\",\"special\":true,\"normalized\":false},"
    "{\"id\":2,\"content\":\"[CLS]\",\"special\":true,\"normalized\":false},"
    "{\"id\":3,\"content\":\"[SEP]\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\","
    "\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}}],"
    "\"pair\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}},{\"Sequence\":{\"id\":"
    "\"B\",\"type_id\":1}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":1}}],"
    "\"special_tokens\":{\"[CLS]\":{\"id\":\"[CLS]\",\"ids\":[2],\"tokens\":[\"[CLS]\"]},"
    "\"[SEP]\":{\"id\":\"[SEP]\",\"ids\":[3],\"tokens\":[\"[SEP]\"]}}},"
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
    "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":"
    "\"##\",\"max_input_chars_per_word\":8,\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,"
    "\"[SEP]\":3,\"the\":4,\"cat\":5,\"sat\":6,\"##s\":7,\".\":8,\"un\":9,\"##able\":10}}}";

static rf_tokenizer *tiny(void) {
    rf_tokenizer *t = NULL;
    if (rf_tokenizer_from_json(tiny_wp, sizeof tiny_wp - 1, &t)) fail_msg("%s", rf_errmsg());
    return t;
}

static void expect(const rf_tok_encoding *e, const uint32_t *ids, size_t n) {
    if (e->len != n) fail_msg("length %zu, expected %zu", e->len, n);
    for (size_t i = 0; i < n; i++)
        if (e->ids[i] != ids[i]) fail_msg("id %zu is %u, expected %u", i, e->ids[i], ids[i]);
}

static void test_wordpiece_and_template(void **state) {
    rf_tokenizer *t = tiny();
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    const char *s = "The CATS sat. Unable xyz [SEP]toolongword";
    assert_int_equal(rf_tok_encode(st, s, strlen(s), true, &e), 0);
    uint32_t want[] = {2, 4, 5, 7, 6, 8, 9, 10, 1, 3, 1, 3};
    expect(&e, want, 12);
    assert_int_equal(e.special_mask[0], 1);
    assert_int_equal(e.special_mask[9], 0); /* [SEP] typed in the text is not template-added */
    assert_int_equal(rf_tok_encode(st, s, strlen(s), false, &e), 0);
    expect(&e, want + 1, 10);
    assert_int_equal(rf_tok_encode_pair(st, "the cat", 7, "sat", 3, true, &e), 0);
    uint32_t pair[] = {2, 4, 5, 3, 6, 3};
    expect(&e, pair, 6);
    uint32_t types[] = {0, 0, 0, 0, 1, 1};
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(e.type_ids[i], types[i]);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

static void test_truncation_and_padding(void **state) {
    rf_tokenizer *t = tiny();
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    const char *s = "the cat sat the cat sat";
    rf_tokenizer_set_truncation(t, 5, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode(st, s, strlen(s), true, &e), 0);
    uint32_t right[] = {2, 4, 5, 6, 3};
    expect(&e, right, 5);
    rf_tokenizer_set_truncation(t, 5, RF_TRUNC_LONGEST_FIRST, RF_SIDE_LEFT);
    assert_int_equal(rf_tok_encode(st, s, strlen(s), true, &e), 0);
    uint32_t left[] = {2, 4, 5, 6, 3};
    expect(&e, left, 5); /* the last three tokens are "the cat sat" too */
    /* pair: 6 + 3 tokens into 10 - 3 = 7: the shorter keeps 3, the longer 4 */
    rf_tokenizer_set_truncation(t, 10, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode_pair(st, s, strlen(s), "the cat sat", 11, true, &e), 0);
    uint32_t p1[] = {2, 4, 5, 6, 4, 3, 4, 5, 6, 3};
    expect(&e, p1, 10);
    /* both long: 6 + 6 into 7 -> 3 and 4 (the odd token goes to the second) */
    assert_int_equal(rf_tok_encode_pair(st, s, strlen(s), s, strlen(s), true, &e), 0);
    uint32_t p2[] = {2, 4, 5, 6, 3, 4, 5, 6, 4, 3};
    expect(&e, p2, 10);
    rf_tokenizer_set_truncation(t, 9, RF_TRUNC_ONLY_FIRST, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode_pair(st, s, strlen(s), "the cat", 7, true, &e), 0);
    uint32_t of[] = {2, 4, 5, 6, 4, 3, 4, 5, 3};
    expect(&e, of, 9);
    rf_tokenizer_set_truncation(t, 9, RF_TRUNC_ONLY_SECOND, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode_pair(st, "the cat", 7, s, strlen(s), true, &e), 0);
    uint32_t os[] = {2, 4, 5, 3, 4, 5, 6, 4, 3};
    expect(&e, os, 9);
    rf_tokenizer_set_truncation(t, 1, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode(st, s, strlen(s), true, &e), RF_ERR_INVALID);
    rf_tokenizer_set_truncation(t, 0, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tokenizer_set_padding(t, true, 8, 0, 0, 0, RF_SIDE_RIGHT);
    assert_int_equal(rf_tok_encode(st, "the cat", 7, true, &e), 0);
    uint32_t padded[] = {2, 4, 5, 3, 0, 0, 0, 0};
    expect(&e, padded, 8);
    assert_int_equal(e.attention_mask[3], 1);
    assert_int_equal(e.attention_mask[4], 0);
    rf_tokenizer_set_padding(t, true, 0, 0, 0, 3, RF_SIDE_LEFT);
    assert_int_equal(rf_tok_encode(st, "the cat", 7, true, &e), 0);
    assert_int_equal(e.len, 4);                    /* BatchLongest: no padding alone */
    assert_int_equal(rf_tok_pad(t, &e, e.len), 0); /* a batch of one, multiple of 3 */
    uint32_t lpad[] = {0, 0, 2, 4, 5, 3};
    expect(&e, lpad, 6);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

static void test_invalid_utf8_repaired(void **state) {
    rf_tokenizer *t = tiny();
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    const char bad[] = "the \xff\xfe cat \xe2\x82";
    assert_int_equal(rf_tok_encode(st, bad, sizeof bad - 1, false, &e), 0);
    /* each maximal invalid subpart becomes U+FFFD, which clean_text drops */
    uint32_t want[] = {4, 5};
    expect(&e, want, 2);
    assert_int_equal(rf_tok_state_repaired(st), 1);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

static void test_decode(void **state) {
    rf_tokenizer *t = tiny();
    rf_buf out = RF_BUF_INIT;
    uint32_t ids[] = {2, 4, 5, 7, 8, 9, 10, 3, 99};
    assert_int_equal(rf_tok_decode(t, ids, 9, true, &out), 0);
    assert_string_equal(out.data, "the cats. unable");
    out.len = 0;
    assert_int_equal(rf_tok_decode(t, ids, 2, false, &out), 0);
    assert_string_equal(out.data, "[CLS] the");
    rf_buf_free(&out);
    rf_tokenizer_free(t);
}

static void expect_load_error(const char *json, int err, const char *needle) {
    rf_tokenizer *t = NULL;
    int rc = rf_tokenizer_from_json(json, strlen(json), &t);
    assert_null(t);
    if (rc != err || !strstr(rf_errmsg(), needle))
        fail_msg("rc %d (%s), expected %d with '%s'", rc, rf_errmsg(), err, needle);
}

static void test_load_errors(void **state) {
    expect_load_error("{\"model\":", RF_ERR_PARSE, "JSON");
    expect_load_error("[1]", RF_ERR_PARSE, "not an object");
    expect_load_error("{}", RF_ERR_PARSE, "no model");
    expect_load_error("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", RF_ERR_UNSUPPORTED,
                      "Unigram");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":-1}}}", RF_ERR_PARSE,
                      "bad id");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"vocab\":{}}}",
                      RF_ERR_INVALID, "unk_token");
    expect_load_error("{\"normalizer\":{\"type\":\"NFKC\"},\"pre_tokenizer\":{\"type\":"
                      "\"BertPreTokenizer\"},\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}",
                      RF_ERR_UNSUPPORTED, "NFKC");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}",
                      RF_ERR_INVALID, "missing from the vocabulary");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\","
                      "\"vocab\":{\"a\":0},\"merges\":[]}}",
                      RF_ERR_INVALID, "lacks byte");
    rf_tokenizer *t = NULL;
    assert_int_equal(rf_tokenizer_load("/nonexistent/tokenizer.json", &t), RF_ERR_NOT_FOUND);
}

/* Byte-level BPE over a two-letter alphabet built inline: all 256 byte tokens
 * plus merges, so decode(encode(x)) == x for any bytes. */
static rf_tokenizer *tiny_bpe(void) {
    char *json = malloc(1 << 16);
    size_t n = (size_t)sprintf(json, "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_"
                                     "space\":false},\"decoder\":{\"type\":\"ByteLevel\"},"
                                     "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    int id = 0, next = 256;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = keep ? b : next++;
        char u[8];
        int k = cp < 0x80 ? sprintf(u, "%c", cp)
                          : sprintf(u, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
        if (cp == '"' || cp == '\\') k = sprintf(u, "\\%c", cp);
        (void)k;
        n += (size_t)sprintf(json + n, "\"%s\":%d,", u, id++);
    }
    n += (size_t)sprintf(json + n, "\"ab\":256,\"\\u0120ab\":257},\"merges\":[\"a b\","
                                   "\"\\u0120 ab\"]}}");
    rf_tokenizer *t = NULL;
    if (rf_tokenizer_from_json(json, n, &t)) fail_msg("%s", rf_errmsg());
    free(json);
    return t;
}

static void test_bpe_round_trip(void **state) {
    rf_tokenizer *t = tiny_bpe();
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    const char *s = "ab ab  abab\tx\xc3\xa9\xf0\x9f\x98\x80 's";
    assert_int_equal(rf_tok_encode(st, s, strlen(s), true, &e), 0);
    assert_int_equal(e.ids[0], 256);
    assert_int_equal(e.ids[1], 257);
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_tok_decode(t, e.ids, e.len, true, &out), 0);
    assert_string_equal(out.data, s);
    rf_buf_free(&out);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

/* A 200 kB word goes through the heap merge (O(n log n)): same result as the
 * pair scan would give ("ab" merges everywhere) and a lossless round trip. */
static void test_bpe_long_word(void **state) {
    rf_tokenizer *t = tiny_bpe();
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    size_t n = 200000;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        s[i] = "ab"[i & 1];
    s[n] = 0;
    assert_int_equal(rf_tok_encode(st, s, n, true, &e), 0);
    assert_int_equal(e.len, n / 2);
    for (size_t i = 0; i < e.len; i++)
        assert_int_equal(e.ids[i], 256);
    rf_buf out = RF_BUF_INIT;
    assert_int_equal(rf_tok_decode(t, e.ids, e.len, true, &out), 0);
    assert_int_equal(out.len, n);
    assert_memory_equal(out.data, s, n);
    rf_buf_free(&out);
    free(s);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tokenizer_free(t);
}

static void test_threads_agree(void **state) {
    rf_tokenizer *t = tiny();
    const char *texts[] = {"the cat sat.", "unable cats", "xyz the", "The Sat. CAT"};
    uint32_t first[4][16];
    size_t lens[4] = {0};
    int bad = 0;
#pragma omp parallel num_threads(2) reduction(+ : bad)
    {
        rf_tok_state *st = rf_tok_state_new(t);
        rf_tok_encoding e = {0};
        for (int rep = 0; rep < 200; rep++) {
            for (int i = 0; i < 4; i++) {
                if (rf_tok_encode(st, texts[i], strlen(texts[i]), true, &e)) bad++;
#pragma omp critical
                {
                    if (rep == 0 && lens[i] == 0) {
                        lens[i] = e.len;
                        memcpy(first[i], e.ids, e.len * 4);
                    } else if (lens[i] != e.len || memcmp(first[i], e.ids, e.len * 4)) {
                        bad++;
                    }
                }
            }
        }
        rf_tok_encoding_free(&e);
        rf_tok_state_free(st);
    }
    assert_int_equal(bad, 0);
    rf_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wordpiece_and_template),
        cmocka_unit_test(test_truncation_and_padding),
        cmocka_unit_test(test_invalid_utf8_repaired),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_bpe_round_trip),
        cmocka_unit_test(test_bpe_long_word),
        cmocka_unit_test(test_threads_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
