/* The predictions file of rf_evaluate_run on the tiny BERT fixture: one line
 * per evaluated example, in data order, each with the input's id, text and
 * gold label, probabilities that sum to 1, pred = their arg-max; the report's
 * accuracy and confusion matrix recomputed from the lines; the same labels and
 * probabilities as rf_classifier_run on the same texts (one inference path);
 * token shards give lines without id and with the ids decoded. */
#include <math.h>
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
#include "common/json.h"
#include "common/sys.h"
#include "evaluator/classifier.h"
#include "evaluator/evaluate.h"
#include "tokenizer/shard.h"

#define K 3 /* the tiny model's classes */

static char tiny[1024], work[] = "/tmp/rf_preds_XXXXXX";

/* Labelled records of the JSONL input; the file also holds a record without
 * label, one without id and a bad line, which the loader skips (the lines
 * must stay aligned with the records kept). */
static const struct {
    const char *id, *text;
    int label;
} recs[] = {
    {"a1", "good movie", 1},
    {"a2", "bad plot and boring story", 0},
    {"a3", "the film was really great fun", 2},
    {"a4", "awful", 0},
    {"a5", "a very long story about a long film with a sad ending and music", 1},
    {"a6", "brilliant actor", 2},
    {"a7", "worst scene", 0},
};
#define NRECS (sizeof recs / sizeof recs[0])

static int setup(void **state) {
    (void)state;
    const char *root = getenv("REFINERY_ROOT");
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/trainer/tiny-bert", root ? root : ".");
    if (!mkdtemp(work)) return -1;
    char path[1200];
    snprintf(path, sizeof path, "%s/data.jsonl", work);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (size_t i = 0; i < NRECS; i++) {
        if (i == 2)
            fputs("{\"id\":\"nolabel\",\"text\":\"good\"}\nnot json\n"
                  "{\"text\":\"no id\",\"label\":1}\n",
                  f);
        fprintf(f, "{\"id\":\"%s\",\"text\":\"%s\",\"label\":%d}\n", recs[i].id, recs[i].text,
                recs[i].label);
    }
    return fclose(f) ? -1 : 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", work);
    return system(cmd) ? -1 : 0;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    rf_buf b = RF_BUF_INIT;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        assert_int_equal(rf_buf_append(&b, chunk, n), 0);
    fclose(f);
    assert_int_equal(rf_buf_putc(&b, 0), 0);
    *len = b.len - 1;
    return b.data;
}

static int64_t int_of(const rf_json *v) {
    int64_t x;
    assert_non_null(v);
    assert_int_equal(rf_json_int64(v, &x), 0);
    return x;
}

/* One parsed prediction line. */
typedef struct pred_line {
    int64_t index, label, pred;
    char id[64], text[256];
    bool has_id, has_text;
    float probs[K];
} pred_line;

/* Parses every line of path, checking the invariants that hold for any
 * line: probabilities in [0,1] summing to 1, pred their arg-max. */
static size_t read_preds(const char *path, pred_line *out, size_t cap) {
    size_t len, n = 0;
    char *text = slurp(path, &len);
    rf_json_doc *d = rf_json_doc_new();
    assert_non_null(d);
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl); /* every line ends with a newline */
        assert_true(n < cap);
        const rf_json *r, *v;
        assert_int_equal(rf_json_parse(d, line, (size_t)(nl - line), &r), 0);
        pred_line *p = &out[n++];
        memset(p, 0, sizeof *p);
        p->index = int_of(rf_json_get(r, "index"));
        p->label = int_of(rf_json_get(r, "label"));
        p->pred = int_of(rf_json_get(r, "pred"));
        if ((v = rf_json_get(r, "id"))) {
            assert_true(rf_json_is_str(v) && v->len < sizeof p->id);
            memcpy(p->id, v->u.str, v->len);
            p->has_id = true;
        }
        if ((v = rf_json_get(r, "text"))) {
            assert_true(rf_json_is_str(v) && v->len < sizeof p->text);
            memcpy(p->text, v->u.str, v->len);
            p->has_text = true;
        }
        const rf_json *probs = rf_json_get(r, "probs");
        assert_non_null(probs);
        assert_int_equal(probs->type, RF_JSON_ARRAY);
        assert_int_equal(probs->len, K);
        double sum = 0;
        int best = 0;
        for (int k = 0; k < K; k++) {
            assert_int_equal(probs->u.items[k].type, RF_JSON_NUMBER);
            p->probs[k] = (float)probs->u.items[k].num;
            assert_true(p->probs[k] >= 0 && p->probs[k] <= 1);
            sum += probs->u.items[k].num;
            if (probs->u.items[k].num > probs->u.items[best].num) best = k;
        }
        assert_float_equal(sum, 1.0, 1e-5);
        assert_int_equal(p->pred, best);
    }
    rf_json_doc_free(d);
    free(text);
    return n;
}

/* The report's accuracy and confusion matrix from the lines. */
static void check_report(const char *report, const pred_line *p, size_t n) {
    size_t len;
    char *text = slurp(report, &len);
    rf_json_doc *d = rf_json_doc_new();
    const rf_json *r;
    assert_int_equal(rf_json_parse(d, text, len, &r), 0);
    assert_int_equal(int_of(rf_json_get(r, "examples")), (int64_t)n);
    uint64_t conf[K][K] = {{0}}, right = 0;
    for (size_t i = 0; i < n; i++) {
        conf[p[i].label][p[i].pred]++;
        right += p[i].label == p[i].pred;
    }
    /* the report prints 6 decimals */
    assert_float_equal(rf_json_get(r, "accuracy")->num, (double)right / (double)n, 5e-7);
    const rf_json *c = rf_json_get(r, "confusion");
    assert_non_null(c);
    assert_int_equal(c->len, K);
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++)
            assert_int_equal(int_of(&c->u.items[a].u.items[b]), (int64_t)conf[a][b]);
    rf_json_doc_free(d);
    free(text);
}

static void test_jsonl(void **state) {
    (void)state;
    char data[1200], preds[1200], report[1200];
    snprintf(data, sizeof data, "%s/data.jsonl", work);
    snprintf(preds, sizeof preds, "%s/preds.jsonl", work);
    snprintf(report, sizeof report, "%s/report.json", work);
    /* batch 3: several batches, the last one short */
    rf_eval_opts o = {.model_dir = tiny,
                      .data = data,
                      .max_len = 128, /* capped at the model's 16 positions */
                      .batch_size = 3,
                      .report_path = report,
                      .predictions_path = preds};
    rf_buf json = RF_BUF_INIT;
    assert_int_equal(rf_evaluate_run(&o, &json), RF_OK);
    rf_buf_free(&json);
    pred_line p[32];
    size_t n = read_preds(preds, p, 32);
    assert_int_equal(n, NRECS);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(p[i].index, (int64_t)i);
        assert_int_equal(p[i].label, recs[i].label);
        assert_true(p[i].has_id);
        assert_string_equal(p[i].id, recs[i].id);
        assert_true(p[i].has_text);
        assert_string_equal(p[i].text, recs[i].text);
    }
    check_report(report, p, n);

    /* rf_classifier_run on the same texts: the same labels and probabilities
     * (the one inference path; here batches sorted by length, so different
     * batch compositions give the same per-row results). */
    rf_classifier *c;
    assert_int_equal(rf_classifier_load(tiny, 128, &c), RF_OK);
    const char *texts[NRECS];
    for (size_t i = 0; i < NRECS; i++)
        texts[i] = recs[i].text;
    int32_t labels[NRECS];
    float probs[NRECS * K];
    assert_int_equal(rf_classifier_run(c, texts, NRECS, 4, labels, probs), RF_OK);
    for (size_t i = 0; i < NRECS; i++) {
        assert_int_equal(labels[i], p[i].pred);
        for (int k = 0; k < K; k++)
            assert_float_equal(probs[i * K + k], p[i].probs[k], 1e-6);
    }
    rf_classifier_free(c);
}

/* Token shards keep no document id: lines have the index, no id, and the
 * text decoded from the ids (special tokens dropped). */
static void test_shards(void **state) {
    (void)state;
    char prefix[1200], preds[1200];
    snprintf(prefix, sizeof prefix, "%s/shard", work);
    snprintf(preds, sizeof preds, "%s/shard-preds.jsonl", work);
    rf_shard_info info = {0};
    info.vocab_size = 100;
    info.eos_id = -1;
    info.pad_id = 0;
    rf_shard_writer *w;
    assert_int_equal(rf_shard_writer_open(prefix, &info, &w), 0);
    /* [CLS] good movie [SEP], [CLS] bad plot [SEP], [CLS] great [SEP] */
    uint32_t a[] = {2, 5, 9, 3}, b[] = {2, 6, 11, 3}, c[] = {2, 7, 3};
    assert_int_equal(rf_shard_writer_add(w, a, 4, 1, 11), 0);
    assert_int_equal(rf_shard_writer_add(w, b, 4, 0, 12), 0);
    assert_int_equal(rf_shard_writer_add(w, c, 3, 2, 13), 0);
    assert_int_equal(rf_shard_writer_close(w), 0);
    rf_eval_opts o = {.model_dir = tiny,
                      .data = prefix,
                      .max_len = 16,
                      .batch_size = 2,
                      .predictions_path = preds};
    assert_int_equal(rf_evaluate_run(&o, NULL), RF_OK);
    pred_line p[8];
    assert_int_equal(read_preds(preds, p, 8), 3);
    const char *want[] = {"good movie", "bad plot", "great"};
    const int gold[] = {1, 0, 2};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(p[i].index, i);
        assert_false(p[i].has_id);
        assert_true(p[i].has_text);
        assert_string_equal(p[i].text, want[i]);
        assert_int_equal(p[i].label, gold[i]);
    }
}

/* A predictions path that cannot be written fails the evaluation, and the
 * report (written after the predictions) is not left behind. */
static void test_unwritable(void **state) {
    (void)state;
    char data[1200], preds[1200], report[1200];
    snprintf(data, sizeof data, "%s/data.jsonl", work);
    snprintf(preds, sizeof preds, "%s/no/such/dir/preds.jsonl", work);
    snprintf(report, sizeof report, "%s/report-unwritable.json", work);
    rf_eval_opts o = {.model_dir = tiny,
                      .data = data,
                      .max_len = 16,
                      .batch_size = 4,
                      .report_path = report,
                      .predictions_path = preds};
    assert_int_not_equal(rf_evaluate_run(&o, NULL), RF_OK);
    assert_non_null(strstr(rf_errmsg(), "preds.jsonl"));
    FILE *f = fopen(report, "r");
    assert_null(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_unwritable),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
