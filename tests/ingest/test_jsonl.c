/* JSON Lines extraction: joined text fields, labels through a map, ids, nested
 * fields, and a reason for every kind of bad record. Also the label map. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/doc.h"
#include "common/error.h"
#include "ingest/join.h"
#include "ingest/jsonl.h"
#include "ingest/label.h"

static const char *const amazon_text[] = {"summary", "reviewText"};

typedef struct fixture {
    rf_json_doc *doc;
    rf_buf text;
    rf_label_map map;
    rf_field_map fm;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    f->doc = rf_json_doc_new();
    assert_int_equal(rf_label_map_parse("1-2:0,3-5:1", &f->map), 0);
    f->fm = (rf_field_map){amazon_text, 2, "\n", "overall", NULL, &f->map, false};
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    rf_json_doc_free(f->doc);
    rf_buf_free(&f->text);
    free(f);
    return 0;
}

static void assert_text(const rf_record_fields *r, const char *want) {
    assert_int_equal(r->text_len, strlen(want));
    assert_memory_equal(r->text_data, want, r->text_len);
    assert_int_equal(r->text_data[r->text_len], '\0');
}

static const char *extract(fixture *f, const char *line, rf_record_fields *out) {
    *out = (rf_record_fields){.text = &f->text};
    return rf_jsonl_extract(f->doc, line, strlen(line), &f->fm, out);
}

/* text_join_skip_contained: a summary cut out of the review is left out. */
static void test_skip_contained(void **state) {
    fixture *f = *state;
    f->fm.skip_contained = true;
    rf_buf norm = RF_BUF_INIT;
    rf_record_fields r;
    static const struct {
        const char *line, *want;
    } cases[] = {
        /* contained, modulo whitespace and the ellipsis marking the cut */
        {"{\"overall\": 5, \"summary\": \"Works  great. ...\", \"reviewText\": \"Works\\ngreat. "
         "Would buy again.\"}",
         "Works\ngreat. Would buy again."},
        {"{\"overall\": 5, \"summary\": \"\\u2026 buy again\", \"reviewText\": \"Would buy "
         "again.\"}",
         "Would buy again."},
        /* not contained (case differs, or new words): both joined */
        {"{\"overall\": 5, \"summary\": \"would buy\", \"reviewText\": \"Would buy again.\"}",
         "would buy\nWould buy again."},
        {"{\"overall\": 5, \"summary\": \"Five Stars\", \"reviewText\": \"Nice.\"}",
         "Five Stars\nNice."},
        /* the review inside the summary: the review is left out */
        {"{\"overall\": 5, \"summary\": \"Nice. Really.\", \"reviewText\": \"Nice.\"}",
         "Nice. Really."},
        /* equal: the first stays; an empty field is contained in any other */
        {"{\"overall\": 5, \"summary\": \"Same\", \"reviewText\": \" Same \"}", "Same"},
        {"{\"overall\": 5, \"summary\": \"\", \"reviewText\": \"Text\"}", "Text"},
        {"{\"overall\": 5, \"summary\": \"Alone\"}", "Alone"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r = (rf_record_fields){.text = &f->text, .norm = &norm};
        assert_null(rf_jsonl_extract(f->doc, cases[i].line, strlen(cases[i].line), &f->fm, &r));
        assert_int_equal(r.text_len, strlen(cases[i].want));
        assert_memory_equal(r.text_data, cases[i].want, r.text_len);
    }
    rf_buf_free(&norm);
}

/* Whitespace normalization, byte by byte, for checking the block-wise one. */
static size_t ref_normalize(const char *p, size_t n, char *out) {
    size_t k = 0;
    bool gap = false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')) {
            gap = k > 0;
        } else {
            if (gap) out[k++] = ' ';
            out[k++] = p[i];
            gap = false;
        }
    }
    return k;
}

/* Random texts of letters and whitespace: a text equals its normalized form
 * (so the first of the two stays alone) and is contained in it plus a word. */
static void test_join_normalize_random(void **state) {
    (void)state;
    /* Whitespace-heavy, and mostly words (so most 16-byte blocks take the
     * block path). */
    static const char *const alphabets[2] = {"ab  \n\t\r.", "abcdefghijklmnopqrstu .\n"};
    rf_buf out = RF_BUF_INIT, norm = RF_BUF_INIT;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 20000; round++) {
        char t[96], want[100];
        size_t n = (size_t)(round % 96);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const char *alphabet = alphabets[round & 1];
            t[i] = alphabet[x % strlen(alphabet)];
        }
        size_t k = ref_normalize(t, n, want);
        const char *text;
        size_t len;
        rf_text_part eq[2] = {{want, k}, {t, n}};
        assert_int_equal(rf_text_join(eq, 2, "|", true, &out, &norm, &text, &len), 0);
        if (len != k || memcmp(text, want, k) != 0)
            fail_msg("round %d: '%.*s' not equal to its normalized form", round, (int)n, t);
        memcpy(want + k, " zz", 3);
        rf_text_part in[2] = {{t, n}, {want, k + 3}};
        assert_int_equal(rf_text_join(in, 2, "|", true, &out, &norm, &text, &len), 0);
        assert_true(text == want && len == k + 3);
    }
    rf_buf_free(&out);
    rf_buf_free(&norm);
}

static void test_amazon_record(void **state) {
    fixture *f = *state;
    rf_record_fields r;
    assert_null(extract(f,
                        "{\"overall\": 1.0, \"reviewText\": \"Smelled awful.\", "
                        "\"summary\": \"Smells awful\", \"style\": {\"Size:\": \" 7 oz\"}}",
                        &r));
    assert_text(&r, "Smells awful\nSmelled awful.");
    assert_int_equal(r.label, 0);
    assert_null(r.id);
    /* The 2014 format (McAuley's published example record). */
    assert_null(extract(f,
                        "{\"reviewerID\": \"A2SUAM1J3GNN3B\", \"asin\": \"0000013714\", "
                        "\"reviewerName\": \"J. McDonald\", \"helpful\": [2, 3], "
                        "\"reviewText\": \"I bought this for my husband who plays the piano.\", "
                        "\"overall\": 5.0, \"summary\": \"Heavenly Highway Hymns\", "
                        "\"unixReviewTime\": 1252800000, \"reviewTime\": \"09 13, 2009\"}",
                        &r));
    assert_text(&r, "Heavenly Highway Hymns\nI bought this for my husband who plays the piano.");
    assert_int_equal(r.label, 1);
    assert_null(extract(f, "{\"overall\": 3, \"reviewText\": \"ok\"}", &r));
    assert_text(&r, "ok"); /* summary missing: the rest is kept */
    assert_int_equal(r.label, 1);
    assert_null(extract(f, "{\"overall\": \"5.0\", \"summary\": \"s\", \"reviewText\": null}", &r));
    assert_text(&r, "s");
    assert_int_equal(r.label, 1);
}

static void test_reasons(void **state) {
    fixture *f = *state;
    rf_record_fields r;
    assert_string_equal(extract(f, "{\"overall\": 5, \"reviewText\": \"x\"", &r), "invalid_json");
    assert_string_equal(extract(f, "[1,2]", &r), "not_an_object");
    assert_string_equal(extract(f, "{\"overall\": 5}", &r), "missing_text");
    assert_string_equal(extract(f, "{\"overall\": 5, \"summary\": 7}", &r), "text_not_string");
    assert_string_equal(extract(f, "{\"reviewText\": \"x\"}", &r), "missing_label");
    assert_string_equal(extract(f, "{\"overall\": null, \"reviewText\": \"x\"}", &r),
                        "missing_label");
    assert_string_equal(extract(f, "{\"overall\": \"five\", \"reviewText\": \"x\"}", &r),
                        "bad_label");
    assert_string_equal(extract(f, "{\"overall\": [5], \"reviewText\": \"x\"}", &r), "bad_label");
    /* Booleans are 1 and 0, mapped like numbers. */
    assert_null(extract(f, "{\"overall\": true, \"reviewText\": \"x\"}", &r));
    assert_int_equal(r.label, 0);
    assert_string_equal(extract(f, "{\"overall\": false, \"reviewText\": \"x\"}", &r),
                        "unmapped_label");
    assert_string_equal(extract(f, "{\"overall\": 9, \"reviewText\": \"x\"}", &r),
                        "unmapped_label");
    assert_string_equal(extract(f, "{\"overall\": \"nan\", \"reviewText\": \"x\"}", &r),
                        "bad_label");
    /* A raw NUL or control byte inside a string is not JSON. */
    const char nul[] = "{\"overall\": 5, \"reviewText\": \"a\0b\"}";
    r = (rf_record_fields){.text = &f->text};
    assert_string_equal(rf_jsonl_extract(f->doc, nul, sizeof nul - 1, &f->fm, &r), "invalid_json");
}

static void test_ids_nested_and_unlabeled(void **state) {
    fixture *f = *state;
    static const char *const text[] = {"meta.title", "body"};
    f->fm = (rf_field_map){text, 2, " | ", NULL, "uid", &f->map, false};
    rf_record_fields r;
    assert_null(
        extract(f, "{\"uid\": \"u-1\", \"meta\": {\"title\": \"T\"}, \"body\": \"B\"}", &r));
    assert_text(&r, "T | B");
    assert_int_equal(r.label, RF_LABEL_NONE);
    assert_int_equal(r.id_len, 3);
    assert_memory_equal(r.id, "u-1", 3);
    assert_null(extract(f, "{\"uid\": 42, \"meta.title\": \"dotted key\"}", &r));
    assert_text(&r, "dotted key");
    assert_memory_equal(r.id, "42", 2);
    assert_string_equal(extract(f, "{\"body\": \"B\"}", &r), "missing_id");
    assert_string_equal(extract(f, "{\"uid\": \"\", \"body\": \"B\"}", &r), "missing_id");
}

static void test_label_map(void **state) {
    rf_label_map m;
    int32_t label;
    assert_int_equal(rf_label_map_parse("1-2:0,3-5:1", &m), 0);
    assert_int_equal(m.n, 2);
    assert_null(rf_label_apply(&m, 2.0, &label));
    assert_int_equal(label, 0);
    assert_null(rf_label_apply(&m, 4.5, &label));
    assert_int_equal(label, 1);
    assert_string_equal(rf_label_apply(&m, 0.5, &label), "unmapped_label");
    assert_int_equal(rf_label_map_parse("-1:0,0:1,1:2", &m), 0);
    assert_null(rf_label_apply(&m, -1, &label));
    assert_int_equal(label, 0);
    assert_int_equal(rf_label_map_parse("", &m), RF_ERR_INVALID);
    assert_int_equal(rf_label_map_parse("1-2", &m), RF_ERR_INVALID);
    assert_int_equal(rf_label_map_parse("2-1:0", &m), RF_ERR_INVALID);
    assert_int_equal(rf_label_map_parse("1:x", &m), RF_ERR_INVALID);

    /* Class names, mixed with numbers. */
    assert_int_equal(rf_label_map_parse("neg:0,pos:1,5:2", &m), 0);
    assert_null(rf_label_from_text(&m, " pos\r", 5, &label));
    assert_int_equal(label, 1);
    assert_null(rf_label_from_text(&m, "5.0", 3, &label));
    assert_int_equal(label, 2);
    assert_string_equal(rf_label_from_text(&m, "Pos", 3, &label), "bad_label");
    assert_string_equal(rf_label_from_text(&m, "4", 1, &label), "unmapped_label");
    assert_string_equal(rf_label_apply(&m, 0, &label),
                        "unmapped_label"); /* names never match numbers */
    assert_int_equal(rf_label_map_parse("averyveryveryveryverylongclassname:1", &m),
                     RF_ERR_INVALID);

    rf_label_map none = {0};
    assert_null(rf_label_apply(&none, 7, &label));
    assert_int_equal(label, 7);
    assert_string_equal(rf_label_apply(&none, 0.5, &label), "bad_label");
    assert_string_equal(rf_label_apply(&none, -1, &label), "bad_label");

    double v;
    assert_int_equal(rf_label_parse_number(" 4.0 ", 5, &v), 0);
    assert_true(v == 4.0);
    assert_int_equal(rf_label_parse_number("1\r", 2, &v), 0);
    assert_int_equal(rf_label_parse_number("", 0, &v), RF_ERR_PARSE);
    assert_int_equal(rf_label_parse_number("4 stars", 7, &v), RF_ERR_PARSE);
    assert_int_equal(rf_label_parse_number("inf", 3, &v), RF_ERR_PARSE);
    assert_int_equal(rf_label_parse_number("0x10", 4, &v), RF_ERR_PARSE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_amazon_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_skip_contained, setup, teardown),
        cmocka_unit_test(test_join_normalize_random),
        cmocka_unit_test_setup_teardown(test_reasons, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_nested_and_unlabeled, setup, teardown),
        cmocka_unit_test(test_label_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
