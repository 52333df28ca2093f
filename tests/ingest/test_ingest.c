/* The ingest pipeline as a library: accounting, order independent of thread
 * count and batch size, the emit path used by `refinery run`, cancellation,
 * CSV column mapping, format detection, paragraphs, line/offset bookkeeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <zlib.h>

#include "common/error.h"
#include "common/json.h"
#include "common/stats.h"
#include "ingest/ingest.h"
#include "ingest/preset.h"
#include "common/doc.h"
#include "../support/mixed_jsonl.h"

static char tmpdir[] = "/tmp/rf_ingest_XXXXXX";

static int setup(void **state) {
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

static void write_file(const char *name, const char *data, size_t n) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void opts_plain(rf_ingest_opts *o) {
    rf_ingest_opts_default(o);
    o->quality_enabled = false;
}

typedef struct result {
    char *docs, *rejects;
    size_t docs_len, rejects_len;
    rf_stats *stats;
    int rc;
} result;

static result run(const rf_ingest_opts *o, const char *const *inputs, size_t n) {
    result r = {0};
    FILE *docs = open_memstream(&r.docs, &r.docs_len);
    FILE *rej = open_memstream(&r.rejects, &r.rejects_len);
    r.stats = rf_stats_new();
    rf_ingest_sink sink = {.docs = docs, .rejects = rej};
    r.rc = rf_ingest_run(o, inputs, n, &sink, r.stats, NULL);
    fclose(docs);
    fclose(rej);
    return r;
}

static void result_free(result *r) {
    free(r->docs);
    free(r->rejects);
    rf_stats_free(r->stats);
}

static int64_t counter(const result *r, const char *name) {
    return rf_stats_get(r->stats, name);
}

static size_t count_lines(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* A mixed JSONL corpus: kept records and every reader-level reason. */
static void write_mixed(const char *name, int n) {
    assert_int_equal(test_write_mixed_jsonl(path_of(name), n), 0);
}

static void test_accounting_and_thread_independence(void **state) {
    write_mixed("mixed.jsonl", 7000);
    const char *in[] = {path_of("mixed.jsonl")};
    rf_ingest_opts o;
    opts_plain(&o);
    o.text_fields[0] = "text";
    o.label_field = "y";
    o.batch_docs = 37; /* many batches, none aligned with the pattern */
    result ref = run(&o, in, 1);
    assert_int_equal(ref.rc, 0);
    assert_int_equal(counter(&ref, "ingest.records_in"), 6000);
    assert_int_equal(counter(&ref, "ingest.lines_skipped"), 1000);
    assert_int_equal(counter(&ref, "ingest.kept"), 2000);
    assert_int_equal(counter(&ref, "ingest.rejected.invalid_json"), 1000);
    assert_int_equal(counter(&ref, "ingest.rejected.missing_text"), 1000);
    assert_int_equal(counter(&ref, "ingest.rejected.bad_label"), 1000);
    assert_int_equal(counter(&ref, "ingest.rejected.empty"), 1000);
    assert_int_equal(counter(&ref, "ingest.rejected_total"), 4000);
    assert_int_equal(counter(&ref, "ingest.clean.utf8_repairs"), 1000);
    assert_int_equal(count_lines(ref.docs, ref.docs_len), 2000);
    assert_int_equal(count_lines(ref.rejects, ref.rejects_len), 4000);
    assert_non_null(strstr(ref.docs,
                           "{\"id\":\"mixed.jsonl:1\",\"text\":\"document number 0 is fine\","
                           "\"label\":0,\"source\":"));

    int threads[] = {2, 3, 8};
    size_t batches[] = {1, 37, 1000};
    for (size_t t = 0; t < 3; t++) {
        for (size_t b = 0; b < 3; b++) {
            o.threads = threads[t];
            o.batch_docs = batches[b];
            result r = run(&o, in, 1);
            assert_int_equal(r.rc, 0);
            assert_int_equal(r.docs_len, ref.docs_len);
            assert_memory_equal(r.docs, ref.docs, ref.docs_len);
            assert_int_equal(r.rejects_len, ref.rejects_len);
            assert_memory_equal(r.rejects, ref.rejects, ref.rejects_len);
            assert_int_equal(counter(&r, "ingest.rejected_total"), 4000);
            result_free(&r);
        }
    }
    result_free(&ref);
}

typedef struct collected {
    uint64_t next_seq;
    size_t batches;
    size_t docs;
    uint64_t last_line;
    int in_order;
} collected;

static int collect(void *ctx, rf_doc_batch *b) {
    collected *c = ctx;
    if (b->seq != c->next_seq++) c->in_order = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->docs[i].line <= c->last_line) c->in_order = 0;
        c->last_line = b->docs[i].line;
        if (!b->docs[i].text || strlen(b->docs[i].text) != b->docs[i].text_len) c->in_order = 0;
    }
    c->docs += b->n;
    c->batches++;
    rf_doc_batch_free(b);
    return 0;
}

static void test_emit_in_order(void **state) {
    write_mixed("emit.jsonl", 700);
    const char *in[] = {path_of("emit.jsonl")};
    rf_ingest_opts o;
    opts_plain(&o);
    o.batch_docs = 10;
    o.threads = 2;
    collected c = {.in_order = 1};
    rf_stats *st = rf_stats_new();
    rf_ingest_sink sink = {.emit = collect, .emit_ctx = &c};
    assert_int_equal(rf_ingest_run(&o, in, 1, &sink, st, NULL), 0);
    assert_true(c.in_order);
    assert_int_equal(c.docs, (size_t)rf_stats_get(st, "ingest.kept"));
    assert_int_equal(c.docs, 300);   /* without a label field, bad labels do not count */
    assert_int_equal(c.batches, 60); /* 600 records in full batches of 10 */
    rf_stats_free(st);
}

static void test_cancel_and_missing_input(void **state) {
    write_mixed("c.jsonl", 70);
    const char *in[] = {path_of("c.jsonl")};
    rf_ingest_opts o;
    opts_plain(&o);
    volatile int cancel = 1;
    rf_stats *st = rf_stats_new();
    rf_ingest_sink sink = {0};
    assert_int_equal(rf_ingest_run(&o, in, 1, &sink, st, &cancel), RF_ERR_CANCELED);
    o.threads = 2;
    assert_int_equal(rf_ingest_run(&o, in, 1, &sink, st, &cancel), RF_ERR_CANCELED);
    const char *missing[] = {path_of("c.jsonl"), path_of("nope.jsonl")};
    assert_int_equal(rf_ingest_run(&o, missing, 2, &sink, st, NULL), RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), "nope.jsonl"));
    rf_stats_free(st);
}

static void test_csv_columns(void **state) {
    const char csv[] = "id,title,body,stars\n"
                       "a1,Nice,\"Works, mostly\",4\n"
                       "a2,,\"only body\",1\n";
    write_file("r.csv", csv, sizeof csv - 1);
    const char *in[] = {path_of("r.csv")};
    rf_ingest_opts o;
    opts_plain(&o);
    o.text_fields[0] = "title";
    o.text_fields[1] = "2"; /* by index */
    o.n_text_fields = 2;
    o.text_join = " | ";
    o.label_field = "stars";
    o.id_field = "id";
    assert_int_equal(rf_label_map_parse("1-2:0,3-5:1", &o.label_map), 0);
    result r = run(&o, in, 1);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.kept"), 2);
    assert_int_equal(counter(&r, "ingest.lines_skipped"), 1);
    assert_non_null(
        strstr(r.docs, "{\"id\":\"a1\",\"text\":\"Nice | Works, mostly\",\"label\":1,"));
    assert_non_null(strstr(r.docs, "{\"id\":\"a2\",\"text\":\"only body\",\"label\":0,"));
    assert_non_null(strstr(r.docs, "\"line\":3,\"offset\":46}"));
    result_free(&r);

    o.text_fields[0] = "headline";
    r = run(&o, in, 1);
    assert_int_equal(r.rc, RF_ERR_NOT_FOUND);
    assert_non_null(strstr(rf_errmsg(), "column 'headline'"));
    result_free(&r);
}

static void test_format_detection(void **state) {
    /* .gz is looked through; an unknown extension is sniffed. */
    const char jsonl[] = "{\"text\": \"from a gzip file\"}\n";
    gzFile gz = gzopen(path_of("d.jsonl.gz"), "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, jsonl, sizeof jsonl - 1), (int)(sizeof jsonl - 1));
    gzclose(gz);
    write_file("d.data", jsonl, sizeof jsonl - 1);
    const char text[] = "{not json, a line of text\nsecond line\n";
    write_file("e.log", text, sizeof text - 1);
    const char *in[] = {path_of("d.jsonl.gz"), path_of("d.data"), path_of("e.log")};
    rf_ingest_opts o;
    opts_plain(&o);
    result r = run(&o, in, 3);
    assert_int_equal(r.rc, 0);
    /* e.log starts with '{', so the whole file is taken as JSON Lines. */
    assert_int_equal(counter(&r, "ingest.kept"), 2);
    assert_int_equal(counter(&r, "ingest.rejected.invalid_json"), 2);
    assert_non_null(strstr(r.docs, "\"id\":\"d.jsonl.gz:1\",\"text\":\"from a gzip file\""));
    assert_non_null(strstr(r.docs, "\"id\":\"d.data:1\""));
    result_free(&r);
}

static void test_ids_unique_across_inputs(void **state) {
    const char line[] = "{\"text\": \"same name\"}\n";
    char dir[300];
    snprintf(dir, sizeof dir, "%s/sub", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    write_file("x.jsonl", line, sizeof line - 1);
    write_file("sub/x.jsonl", line, sizeof line - 1);
    write_file("y.jsonl", line, sizeof line - 1);
    char a[300], b[300], c[300];
    snprintf(a, sizeof a, "%s/x.jsonl", tmpdir);
    snprintf(b, sizeof b, "%s/sub/x.jsonl", tmpdir);
    snprintf(c, sizeof c, "%s/y.jsonl", tmpdir);
    const char *in[] = {a, b, a, c};
    rf_ingest_opts o;
    opts_plain(&o);
    result r = run(&o, in, 4);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.kept"), 4);
    char want[400];
    snprintf(want, sizeof want, "{\"id\":\"%s:1\",", a);
    assert_non_null(strstr(r.docs, want));
    snprintf(want, sizeof want, "{\"id\":\"%s:1\",", b);
    assert_non_null(strstr(r.docs, want));
    snprintf(want, sizeof want, "{\"id\":\"%s@2:1\",", a);
    assert_non_null(strstr(r.docs, want));
    assert_non_null(strstr(r.docs, "{\"id\":\"y.jsonl:1\","));
    result_free(&r);
}

static void test_paragraphs_lines_offsets(void **state) {
    const char text[] = "para one\r\nstill one\r\n\r\n\r\npara two\r\n";
    write_file("p.txt", text, sizeof text - 1);
    const char *in[] = {path_of("p.txt")};
    rf_ingest_opts o;
    opts_plain(&o);
    o.paragraphs = true;
    result r = run(&o, in, 1);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.records_in"), 2);
    assert_int_equal(counter(&r, "ingest.lines_skipped"), 2);
    assert_non_null(strstr(r.docs, "\"text\":\"para one still one\",\"source\":"));
    assert_non_null(strstr(r.docs, "\"id\":\"p.txt:5\",\"text\":\"para two\""));
    assert_non_null(strstr(r.docs, "\"line\":5,\"offset\":25}"));
    result_free(&r);

    o.paragraphs = false;
    o.max_line = 64;
    char big[300];
    memset(big, 'w', sizeof big);
    memcpy(big + 200, "\nshort line\n", 12);
    write_file("q.txt", big, 212);
    const char *in2[] = {path_of("q.txt")};
    r = run(&o, in2, 1);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.rejected.line_too_long"), 1);
    assert_int_equal(counter(&r, "ingest.kept"), 1);
    assert_non_null(strstr(r.docs, "\"line\":2,\"offset\":201}"));
    result_free(&r);
}

/* Conversations: preset sft (prompt/response, completion, messages, each
 * refusal with its reason) and the chat section over labelled records. */
static void test_conversations(void **state) {
    (void)state;
    const char *jl =
        "{\"prompt\":\"What is 2+2?\",\"response\":\"4\"}\n"
        "{\"system\":\"Be brief.\",\"prompt\":\"Hi\",\"completion\":\"Hello\"}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\"b\",\"x\":1},"
        "{\"role\":\"assistant\",\"content\":\"c\"},{\"role\":\"user\",\"content\":\"d\"},"
        "{\"role\":\"assistant\",\"content\":\"e\"}]}\n"
        "{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":7}]}\n"
        "{\"messages\":{}}\n"
        "{\"prompt\":\"no answer\"}\n"
        "{\"response\":\"no question\"}\n"
        "{not json\n";
    write_file("chat.jsonl", jl, strlen(jl));
    rf_ingest_opts o;
    opts_plain(&o);
    assert_int_equal(rf_ingest_preset_apply(&o, "sft"), 0);
    const char *in[] = {path_of("chat.jsonl")};
    result r = run(&o, in, 1);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.kept"), 3);
    assert_int_equal(counter(&r, "ingest.rejected.bad_role"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.no_assistant"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.bad_message"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.messages_not_array"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.missing_response"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.missing_prompt"), 1);
    assert_int_equal(counter(&r, "ingest.rejected.invalid_json"), 1);
    assert_non_null(strstr(r.docs, "\"text\":\"What is 2+2? 4\"")); /* cleaned: one space */
    assert_non_null(strstr(r.docs, "\"messages\":[{\"role\":\"user\",\"content\":\"What is "
                                   "2+2?\"},{\"role\":\"assistant\",\"content\":\"4\"}]"));
    assert_non_null(strstr(r.docs, "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":"
                                   "\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
                                   "\"content\":\"Hello\"}]"));
    /* canonical: the extra key dropped, the escape kept, four turns in order */
    assert_non_null(strstr(r.docs,
                           "\"messages\":[{\"role\":\"user\",\"content\":\"a\\\"b\"},{"
                           "\"role\":\"assistant\",\"content\":\"c\"},{\"role\":\"user\","
                           "\"content\":\"d\"},{\"role\":\"assistant\",\"content\":\"e\"}]"));
    /* every document line parses back, messages included */
    rf_json_doc *jd = rf_json_doc_new();
    size_t docs = 0;
    for (char *p = r.docs; p && *p; docs++) {
        char *nl = strchr(p, '\n');
        const rf_json *root;
        assert_int_equal(rf_json_parse(jd, p, (size_t)(nl - p), &root), 0);
        rf_doc d = {0};
        assert_int_equal(rf_doc_from_json(root, &d), 0);
        assert_non_null(d.messages);
        rf_doc_clear(&d);
        p = nl + 1;
    }
    assert_int_equal(docs, 3);
    rf_json_doc_free(jd);
    result_free(&r);
    rf_ingest_opts_free(&o);

    /* the chat section: labelled records become conversations */
    const char *lab = "{\"text\":\"one two three four five\",\"label\":1}\n"
                      "{\"text\":\"bad   thing\",\"label\":0}\n"
                      "{\"text\":\"unknown label\",\"label\":2}\n";
    write_file("lab.jsonl", lab, strlen(lab));
    opts_plain(&o);
    o.label_field = "label";
    o.chat_system = "S";
    o.chat_user = "Q: {text} ({text})?";
    o.chat_answers[0] = "negative", o.chat_answers[1] = "positive", o.n_chat_answers = 2;
    o.chat_max_words = 3;
    in[0] = path_of("lab.jsonl");
    r = run(&o, in, 1);
    assert_int_equal(r.rc, 0);
    assert_int_equal(counter(&r, "ingest.kept"), 2);
    assert_int_equal(counter(&r, "ingest.rejected.no_answer"), 1);
    assert_non_null(strstr(r.docs, "\"text\":\"one two three four five\""));
    assert_non_null(strstr(r.docs,
                           "\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{"
                           "\"role\":\"user\",\"content\":\"Q: one two three (one two "
                           "three)?\"},{\"role\":\"assistant\",\"content\":\"positive\"}]"));
    /* the cleaned text goes into the question (white space runs made one) */
    assert_non_null(strstr(r.docs, "\"content\":\"Q: bad thing (bad thing)?\"},{\"role\":"
                                   "\"assistant\",\"content\":\"negative\"}"));
    result_free(&r);
    rf_ingest_opts_free(&o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accounting_and_thread_independence),
        cmocka_unit_test(test_emit_in_order),
        cmocka_unit_test(test_cancel_and_missing_input),
        cmocka_unit_test(test_csv_columns),
        cmocka_unit_test(test_format_detection),
        cmocka_unit_test(test_ids_unique_across_inputs),
        cmocka_unit_test(test_paragraphs_lines_offsets),
        cmocka_unit_test(test_conversations),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
