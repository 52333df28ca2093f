/* rf_tok_split_batch (tokenizer/split_batch.h), the tokenizer's job that the
 * embedded stage and the service share: kept documents get rf_tok_encode's
 * ids and rf_split_is_eval's split on their cluster (or id), a document
 * without text and one the tokenizer refuses are rejected with their reason
 * while the rest of the batch goes on, results do not depend on the thread
 * count; and the embedded stage (rf_tokenizer_stage) counts those rejects
 * and keeps running instead of failing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/stage.h"
#include "common/stats.h"
#include "common/sys.h"
#include "pipeline/stages.h"
#include "tokenizer/batch.h"
#include "tokenizer/split_batch.h"
#include "tokenizer/tokenizer.h"

/* ids: [PAD]0 [UNK]1 [CLS]2 [SEP]3 the4 cat5 sat6 ##s7 .8 un9 ##able10.
 * UNK is the model's unk_token, left out of the second tokenizer so that an
 * unknown word fails to encode. */
#define TINY_WP(UNK)                                                                               \
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"                                   \
    "\"added_tokens\":[{\"id\":0,\"content\":\"[PAD]\",\"special\":true,\"normalized\":false},"    \
    "{\"id\":1,\"content\":\"[UNK]\",\"special\":true,\"normalized\":false},"                      \
    "{\"id\":2,\"content\":\"[CLS]\",\"special\":true,\"normalized\":false},"                      \
    "{\"id\":3,\"content\":\"[SEP]\",\"special\":true,\"normalized\":false}],"                     \
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":"    \
    "true,\"strip_accents\":null,\"lowercase\":true},"                                             \
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"                                           \
    "\"post_processor\":{\"type\":\"TemplateProcessing\","                                         \
    "\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\"," \
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}}],"                        \
    "\"pair\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","   \
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}},{\"Sequence\":{\"id\":"   \
    "\"B\",\"type_id\":1}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":1}}],"                  \
    "\"special_tokens\":{\"[CLS]\":{\"id\":\"[CLS]\",\"ids\":[2],\"tokens\":[\"[CLS]\"]},"         \
    "\"[SEP]\":{\"id\":\"[SEP]\",\"ids\":[3],\"tokens\":[\"[SEP]\"]}}},"                           \
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"                     \
    "\"model\":{\"type\":\"WordPiece\"," UNK "\"continuing_subword_prefix\":"                      \
    "\"##\",\"max_input_chars_per_word\":8,\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,"        \
    "\"[SEP]\":3,\"the\":4,\"cat\":5,\"sat\":6,\"##s\":7,\".\":8,\"un\":9,\"##able\":10}}}"

static const char with_unk[] = TINY_WP("\"unk_token\":\"[UNK]\",");
static const char without_unk[] = TINY_WP("");

static rf_tokenizer *load(const char *json) {
    rf_tokenizer *t = NULL;
    if (rf_tokenizer_from_json(json, strlen(json), &t)) fail_msg("%s", rf_errmsg());
    return t;
}

static rf_tok_splitter *splitter(const rf_tokenizer *t, int threads, double eval_fraction) {
    rf_tok_split_opts o = {
        .add_special = true, .eval_fraction = eval_fraction, .seed = 7, .threads = threads};
    rf_tok_splitter *s = NULL;
    assert_int_equal(rf_tok_splitter_new(t, &o, &s), 0);
    return s;
}

static rf_tok_doc doc(const char *id, const char *text, uint64_t cluster) {
    return (rf_tok_doc){id, text, text ? strlen(text) : 0, cluster, NULL, 0};
}

static void test_kept_ids_split_and_cluster(void **state) {
    rf_tokenizer *t = load(with_unk);
    rf_tok_splitter *s = splitter(t, 1, 0.5);
    rf_tok_doc docs[64];
    char ids[64][16];
    for (int i = 0; i < 64; i++) {
        snprintf(ids[i], sizeof ids[i], "d%d", i);
        docs[i] = doc(ids[i], i % 3 ? "The cats sat." : "unable cat", i % 4 ? 0 : 1000u + i);
    }
    const rf_tok_result *res;
    assert_int_equal(rf_tok_split_batch(s, docs, 64, &res), 0);
    rf_tok_state *st = rf_tok_state_new(t);
    rf_tok_encoding e = {0};
    int evals = 0;
    for (int i = 0; i < 64; i++) {
        assert_null(res[i].reject);
        assert_int_equal(rf_tok_encode(st, docs[i].text, docs[i].text_len, true, &e), 0);
        assert_int_equal(res[i].enc.len, e.len);
        assert_memory_equal(res[i].enc.ids, e.ids, e.len * sizeof *e.ids);
        bool eval = rf_split_is_eval(docs[i].cluster, ids[i], strlen(ids[i]), 0.5, 7);
        assert_int_equal(res[i].split, eval ? RF_SPLIT_EVAL : RF_SPLIT_TRAIN);
        evals += eval;
        uint64_t key = docs[i].cluster ? docs[i].cluster : rf_hash64(ids[i], strlen(ids[i]), 0);
        assert_int_equal(res[i].cluster, key);
    }
    assert_true(evals > 0 && evals < 64); /* both splits are used */
    /* "The cats sat." is [CLS] the cat ##s sat . [SEP]. */
    const uint32_t want[] = {2, 4, 5, 7, 6, 8, 3};
    assert_int_equal(res[1].enc.len, 7);
    assert_memory_equal(res[1].enc.ids, want, sizeof want);
    rf_tok_encoding_free(&e);
    rf_tok_state_free(st);
    rf_tok_splitter_free(s);
    rf_tokenizer_free(t);
}

/* A NULL id splits as "" does (the service's proto ids are "" when unset). */
static void test_null_id_is_empty_id(void **state) {
    rf_tokenizer *t = load(with_unk);
    for (double f = 0.05; f < 1; f += 0.1) {
        rf_tok_splitter *s = splitter(t, 1, f);
        rf_tok_doc docs[2] = {doc(NULL, "the cat", 0), doc("", "the cat", 0)};
        const rf_tok_result *res;
        assert_int_equal(rf_tok_split_batch(s, docs, 2, &res), 0);
        assert_int_equal(res[0].split, res[1].split);
        assert_int_equal(res[0].cluster, res[1].cluster);
        assert_int_equal(res[0].split, rf_split_is_eval(0, "", 0, f, 7));
        rf_tok_splitter_free(s);
    }
    rf_tokenizer_free(t);
}

static void test_no_text_rejected(void **state) {
    rf_tokenizer *t = load(with_unk);
    rf_tok_splitter *s = splitter(t, 1, 0.1);
    rf_tok_doc docs[4] = {doc("a", "the cat", 0), doc("b", NULL, 0), doc("c", "", 5),
                          doc("d", "the cat sat", 0)};
    const rf_tok_result *res;
    assert_int_equal(rf_tok_split_batch(s, docs, 4, &res), 0);
    assert_null(res[0].reject);
    assert_string_equal(res[1].reject, RF_TOK_REJECT_NO_TEXT);
    assert_string_equal(res[2].reject, RF_TOK_REJECT_NO_TEXT);
    assert_int_equal(res[1].enc.len, 0);
    assert_null(res[3].reject);
    assert_int_equal(res[3].enc.len, 5);
    rf_stats *st = rf_stats_new();
    for (int i = 0; i < 4; i++)
        rf_tok_result_count(&res[i], st);
    assert_int_equal(rf_stats_get(st, "tokenizer.rejected.no_text"), 2);
    rf_stats_free(st);
    rf_tok_splitter_free(s);
    rf_tokenizer_free(t);
}

static void test_encode_failure_rejected(void **state) {
    rf_tokenizer *t = load(without_unk);
    rf_tok_splitter *s = splitter(t, 1, 0.1);
    rf_tok_doc docs[3] = {doc("a", "the cat", 0), doc("b", "the dog", 0), doc("c", "cats", 0)};
    const rf_tok_result *res;
    assert_int_equal(rf_tok_split_batch(s, docs, 3, &res), 0);
    assert_null(res[0].reject);
    assert_int_equal(res[0].enc.len, 4);
    assert_string_equal(res[1].reject, RF_TOK_REJECT_ENCODE);
    assert_non_null(strstr(res[1].detail, "UNK"));
    assert_int_equal(res[1].enc.len, 0);
    assert_null(res[2].reject); /* the batch went on */
    assert_int_equal(res[2].enc.len, 4);
    rf_stats *st = rf_stats_new();
    for (int i = 0; i < 3; i++)
        rf_tok_result_count(&res[i], st);
    assert_int_equal(rf_stats_get(st, "tokenizer.rejected.encode_failed"), 1);
    assert_int_equal(rf_stats_get(st, "tokenizer.rejected.no_text"), 0);
    rf_stats_free(st);
    /* The next batch reuses the results: nothing of the last one is left. */
    rf_tok_doc next[1] = {doc("e", "the cat", 0)};
    assert_int_equal(rf_tok_split_batch(s, next, 1, &res), 0);
    assert_null(res[0].reject);
    assert_string_equal(res[0].detail, "");
    rf_tok_splitter_free(s);
    rf_tokenizer_free(t);
}

static void test_threads_agree(void **state) {
    rf_tokenizer *t = load(without_unk);
    enum { N = 500 };
    static rf_tok_doc docs[N];
    static char ids[N][16];
    static const char *const texts[] = {"the cat sat.", "unable cats", "the dog", "",
                                        "sat sat sat"};
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "x%d", i);
        docs[i] = doc(ids[i], texts[i % 5], (uint64_t)(i % 7));
    }
    rf_tok_splitter *one = splitter(t, 1, 0.3), *four = splitter(t, 4, 0.3);
    const rf_tok_result *a, *b;
    assert_int_equal(rf_tok_split_batch(one, docs, N, &a), 0);
    assert_int_equal(rf_tok_split_batch(four, docs, N, &b), 0);
    for (int i = 0; i < N; i++) {
        assert_true((a[i].reject == NULL) == (b[i].reject == NULL));
        if (a[i].reject) {
            assert_string_equal(a[i].reject, b[i].reject);
            continue;
        }
        assert_int_equal(a[i].split, b[i].split);
        assert_int_equal(a[i].cluster, b[i].cluster);
        assert_int_equal(a[i].enc.len, b[i].enc.len);
        assert_memory_equal(a[i].enc.ids, b[i].enc.ids, a[i].enc.len * sizeof *a[i].enc.ids);
    }
    rf_tok_splitter_free(one);
    rf_tok_splitter_free(four);
    rf_tokenizer_free(t);
}

/* ---- the embedded stage ---- */

static int count_emitted(void *ctx, rf_doc_batch *b) {
    *(size_t *)ctx += b->n;
    rf_doc_batch_free(b);
    return 0;
}

static void add_doc(rf_doc_batch *b, const char *id, const char *text) {
    rf_doc *d = rf_doc_batch_push(b);
    assert_non_null(d);
    d->id = strdup(id);
    d->text = text ? strdup(text) : NULL;
    d->text_len = text ? strlen(text) : 0;
    d->label = 1;
    d->source = strdup("test");
}

/* A batch with a document without text and one the tokenizer refuses: the
 * stage counts both as rejects, writes the others and does not fail. */
static void test_stage_counts_rejects(void **state) {
    char dir[] = "/tmp/rf_split_batch_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char tok_path[128], yaml[512];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    FILE *f = fopen(tok_path, "w");
    assert_non_null(f);
    fputs(without_unk, f);
    fclose(f);
    snprintf(yaml, sizeof yaml,
             "tokenizer:\n  tokenizer: %s\n  max_length: 16\n  eval_fraction: 0.5\n"
             "  threads: 2\n",
             tok_path);
    rf_cfg *cfg = NULL;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "spec", &cfg), 0);
    rf_stats *stats = rf_stats_new();
    rf_run_ctx ctx = {.run_dir = dir, .spec = cfg, .stats = stats, .threads = 2};
    void *st = NULL;
    const rf_stage_ops *ops = &rf_tokenizer_stage;
    assert_int_equal(ops->open(rf_cfg_get(cfg, "tokenizer"), &ctx, &st), 0);
    rf_doc_batch *b = rf_doc_batch_new(8);
    add_doc(b, "a", "the cat sat.");
    add_doc(b, "b", NULL);
    add_doc(b, "c", "the dog sat.");
    add_doc(b, "d", "the cats");
    add_doc(b, "e", "un cat");
    size_t emitted = 0;
    assert_int_equal(ops->process(st, b, count_emitted, &emitted), 0);
    assert_int_equal(emitted, 5); /* documents pass on unchanged */
    assert_int_equal(ops->finish(st, count_emitted, &emitted), 0);
    ops->close(st);
    assert_int_equal(rf_stats_get(stats, "tokenizer.rejected.no_text"), 1);
    assert_int_equal(rf_stats_get(stats, "tokenizer.rejected.encode_failed"), 1);
    assert_int_equal(rf_stats_get(stats, "tokenizer.train.docs") +
                         rf_stats_get(stats, "tokenizer.eval.docs"),
                     3);
    rf_stats_free(stats);
    rf_cfg_free(cfg);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kept_ids_split_and_cluster),
        cmocka_unit_test(test_null_id_is_empty_id),
        cmocka_unit_test(test_no_text_rejected),
        cmocka_unit_test(test_encode_failure_rejected),
        cmocka_unit_test(test_threads_agree),
        cmocka_unit_test(test_stage_counts_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
