/* rf_decide (ingest/decide.h), the verdict on one document that the ingest
 * workers and the service's Push path share: kept texts come back cleaned,
 * each reject path (cleaning, quality, language) gives its reason and the
 * bytes it is about, cleaning counters are filled, and a reading of JSON
 * Lines by the ingest library (rf_ingest_buffer, the workers) gives, record
 * for record, the verdicts rf_decide gives on the same texts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/buf.h"
#include "common/error.h"
#include "common/stats.h"
#include "ingest/buffer.h"
#include "ingest/decide.h"
#include "ingest/ingest.h"

static const char *EN =
    "I bought this shampoo for my wife and she loves it. It smells wonderful, leaves her hair "
    "soft and shiny, and a single bottle lasts for months. We will definitely order it again.";
static const char *DE =
    "Ich habe dieses Shampoo für meine Frau gekauft und sie liebt es. Es riecht wunderbar, "
    "macht die Haare weich und glänzend, und eine Flasche reicht monatelang. Wir bestellen "
    "es bestimmt wieder.";

/* Defaults of an ingest section, with English expected and at least 3 words. */
static void rules(rf_doc_rules *r) {
    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    o.quality.min_words = 3;
    o.language.n_expected = 1;
    strcpy(o.language.expected[0], "en");
    rf_doc_rules_from_opts(&o, r);
}

static rf_decider *decider(void) {
    rf_doc_rules r;
    rules(&r);
    rf_decider *d = rf_decider_new(&r);
    assert_non_null(d);
    return d;
}

static void test_keep_returns_cleaned_text(void **state) {
    rf_decider *d = decider();
    rf_verdict v;
    const char *in = "  Works\tgreat,\x01 easy   to install.\n";
    assert_int_equal(rf_decide(d, in, strlen(in), &v), 0);
    assert_null(v.reject);
    assert_string_equal(v.text, "Works great, easy to install.");
    assert_int_equal(v.len, strlen("Works great, easy to install."));
    assert_int_equal(v.clean.controls_removed, 1);
    /* The English review passes the language filter. */
    assert_int_equal(rf_decide(d, EN, strlen(EN), &v), 0);
    assert_null(v.reject);
    assert_memory_equal(v.text, EN, strlen(EN));
    rf_decider_free(d);
}

static void test_clean_rejects_point_at_the_input(void **state) {
    rf_decider *d = decider();
    rf_verdict v;
    assert_int_equal(rf_decide(d, " \t\n ", 4, &v), 0);
    assert_string_equal(v.reject, "empty");
    assert_int_equal(v.len, 4);
    assert_memory_equal(v.text, " \t\n ", 4);
    assert_int_equal(rf_decide(d, NULL, 0, &v), 0);
    assert_string_equal(v.reject, "empty");
    assert_int_equal(v.len, 0);
    /* Repaired by default, counted; rejected when the rules say so. */
    const char *bad = "caf\xe9 au lait is fine";
    assert_int_equal(rf_decide(d, bad, strlen(bad), &v), 0);
    assert_null(v.reject);
    assert_int_equal(v.clean.utf8_repairs, 1);
    rf_decider_free(d);

    rf_doc_rules r;
    rules(&r);
    r.clean.utf8 = RF_UTF8_REJECT;
    d = rf_decider_new(&r);
    assert_non_null(d);
    assert_int_equal(rf_decide(d, bad, strlen(bad), &v), 0);
    assert_string_equal(v.reject, "invalid_utf8");
    assert_ptr_equal(v.text, bad);
    assert_int_equal(v.len, strlen(bad));
    rf_decider_free(d);
}

static void test_filter_rejects_point_at_the_cleaned_text(void **state) {
    rf_decider *d = decider();
    rf_verdict v;
    assert_int_equal(rf_decide(d, "  Great\n  product ", 18, &v), 0);
    assert_string_equal(v.reject, "too_few_words");
    assert_string_equal(v.text, "Great product");
    assert_int_equal(rf_decide(d, DE, strlen(DE), &v), 0);
    assert_string_equal(v.reject, "wrong_language");
    assert_int_equal(v.len, strlen(DE));
    rf_decider_free(d);

    /* With the filters off, both are kept. */
    rf_doc_rules r;
    rules(&r);
    r.quality_enabled = false;
    r.language.n_expected = 0;
    d = rf_decider_new(&r);
    assert_non_null(d);
    assert_int_equal(rf_decide(d, "Great product", 13, &v), 0);
    assert_null(v.reject);
    assert_int_equal(rf_decide(d, DE, strlen(DE), &v), 0);
    assert_null(v.reject);
    rf_decider_free(d);
}

static void test_count_clean(void **state) {
    rf_decider *d = decider();
    rf_stats *s = rf_stats_new();
    assert_non_null(s);
    rf_verdict v;
    const char *in = "a\x01\x02 b\xff c and d";
    assert_int_equal(rf_decide(d, in, strlen(in), &v), 0);
    rf_verdict_count_clean(&v, s);
    assert_int_equal(rf_stats_get(s, "ingest.clean.controls_removed"), 2);
    assert_int_equal(rf_stats_get(s, "ingest.clean.utf8_repairs"), 1);
    assert_int_equal(rf_stats_get(s, "ingest.clean.nul_bytes"), 0);
    rf_stats_free(s);
    rf_decider_free(d);
}

/* ---- the library's reading gives rf_decide's verdicts ---- */

typedef struct seen {
    rf_decider *d;
    const char *const *texts; /* by line - 1 */
    size_t n, kept, rejected;
} seen;

static int on_batch(void *ctx, rf_ingest_batch *b) {
    seen *s = ctx;
    rf_verdict v;
    for (size_t i = 0; b->docs && i < b->docs->n; i++) {
        const rf_doc *doc = &b->docs->docs[i];
        assert_true(doc->line >= 1 && doc->line <= s->n);
        const char *t = s->texts[doc->line - 1];
        assert_int_equal(rf_decide(s->d, t, strlen(t), &v), 0);
        if (v.reject)
            fail_msg("line %llu kept, rf_decide: %s", (unsigned long long)doc->line, v.reject);
        assert_int_equal(doc->text_len, v.len);
        assert_memory_equal(doc->text, v.text, v.len);
        s->kept++;
    }
    for (size_t i = 0; i < b->n_rejects; i++) {
        const rf_ingest_reject *r = &b->rejects[i];
        assert_true(r->line >= 1 && r->line <= s->n);
        const char *t = s->texts[r->line - 1];
        assert_int_equal(rf_decide(s->d, t, strlen(t), &v), 0);
        if (!v.reject || strcmp(v.reject, r->reason))
            fail_msg("line %llu rejected as %s, rf_decide: %s", (unsigned long long)r->line,
                     r->reason, v.reject ? v.reject : "keep");
        size_t n = v.len < r->excerpt_len ? v.len : r->excerpt_len;
        assert_memory_equal(r->excerpt, v.text, n);
        s->rejected++;
    }
    rf_doc_batch_free(b->docs);
    return 0;
}

static void test_library_reading_agrees(void **state) {
    /* Each text JSON-escaped (as read) and decoded (as rf_decide gets it);
     * every verdict path is present. */
    static const char *const json[] = {
        "Works great, easy to install.",
        "   ",
        "Great",
        "Ich habe dieses Shampoo f\\u00fcr meine Frau gekauft und sie liebt es. Es riecht "
        "wunderbar, macht die Haare weich und gl\\u00e4nzend, und eine Flasche reicht monatelang.",
        "Tabs\\tand\\u0001controls are removed here",
        "\\ufb01 ligature and   spaces  in a normal review",
        "A perfectly ordinary review of a perfectly ordinary kettle.",
    };
    static const char *const raw[] = {
        "Works great, easy to install.",
        "   ",
        "Great",
        "Ich habe dieses Shampoo f\xc3\xbcr meine Frau gekauft und sie liebt es. Es riecht "
        "wunderbar, macht die Haare weich und gl\xc3\xa4nzend, und eine Flasche reicht monatelang.",
        "Tabs\tand\x01"
        "controls are removed here",
        "\xef\xac\x81 ligature and   spaces  in a normal review",
        "A perfectly ordinary review of a perfectly ordinary kettle.",
    };
    enum { N = sizeof json / sizeof json[0] };
    rf_buf in = RF_BUF_INIT;
    for (size_t i = 0; i < N; i++)
        assert_int_equal(rf_buf_printf(&in, "{\"text\": \"%s\"}\n", json[i]), 0);

    rf_ingest_opts o;
    rf_ingest_opts_default(&o);
    o.format = RF_FORMAT_JSONL;
    o.quality.min_words = 3;
    o.language.n_expected = 1;
    strcpy(o.language.expected[0], "en");
    rf_doc_rules r;
    rf_doc_rules_from_opts(&o, &r);
    seen s = {rf_decider_new(&r), raw, N, 0, 0};
    assert_non_null(s.d);
    assert_int_equal(rf_ingest_buffer(&o, "t.jsonl", in.data, in.len, on_batch, &s), 0);
    assert_int_equal(s.kept + s.rejected, N);
    assert_int_equal(s.kept, 4);     /* lines 1, 5, 6, 7 */
    assert_int_equal(s.rejected, 3); /* empty, too_few_words, wrong_language */
    rf_decider_free(s.d);
    rf_buf_free(&in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_returns_cleaned_text),
        cmocka_unit_test(test_clean_rejects_point_at_the_input),
        cmocka_unit_test(test_filter_rejects_point_at_the_cleaned_text),
        cmocka_unit_test(test_count_clean),
        cmocka_unit_test(test_library_reading_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
