/* The tokenizer service's Tokenize handler in-process (ids equal to the
 * library's, invalid UTF-8 -> INVALID_ARGUMENT, the server keeps serving);
 * its consume path on the mock Kafka cluster (a document without text and one
 * the tokenizer refuses are counted rejects, the others reach tokens.train /
 * tokens.eval with rf_tok_split_batch's ids, split and cluster); and, with
 * arguments, the tools tokenizer_service.test.sh drives the
 * refinery-tokenizer binary with:
 *   --tokenize PORT LINES     Tokenize (C client), one line of ids per input line
 *   --bad PORT                a text that is not UTF-8 must get INVALID_ARGUMENT
 *   --collect BOOTSTRAP RUN NBATCH OUT
 *                             tokens.train + tokens.eval deduplicated by (topic, seq):
 *                             "doc_id<TAB>ids" lines to OUT, counts on stdout */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/hash.h"
#include "common/stats.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "runtime/kafka/mock.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "tokenizer/server/tokenizer_service.h"
#include "tokenizer/split_batch.h"

#define METHOD "/refinery.v1.Tokenizer/Tokenize"

static int tokenize(rf_rpc_client *c, char **texts, size_t n, Refinery__V1__TokenizeResponse **out,
                    rf_rpc_status *st) {
    Refinery__V1__TokenizeRequest req = REFINERY__V1__TOKENIZE_REQUEST__INIT;
    req.texts = texts;
    req.n_texts = n;
    req.add_special_tokens = 1;
    return rf_rpc_unary(c, METHOD, &req.base, &refinery__v1__tokenize_response__descriptor,
                        (ProtobufCMessage **)out, 30, st);
}

static void test_tokenize_in_process(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: the tokenizer comes from the shared data");
    char path[4096];
    snprintf(path, sizeof path, "%s/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json", shared);
    rf_tokenizer_service_opts so = {.tokenizer = path, .add_special = true};
    rf_tokenizer_service *svc;
    assert_int_equal(rf_tokenizer_service_new(&so, &svc), RF_OK);
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0"};
    rf_rpc_server *server;
    assert_int_equal(rf_rpc_server_new(&ro, &server), RF_OK);
    assert_int_equal(rf_tokenizer_service_register(svc, server), RF_OK);
    assert_int_equal(rf_rpc_server_start(server), RF_OK);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(server));
    rf_rpc_client *c;
    assert_int_equal(rf_rpc_client_new(target, NULL, 0, &c), RF_OK);

    char *texts[] = {"Hello, world!", "", "naïve café"};
    Refinery__V1__TokenizeResponse *resp;
    rf_rpc_status st;
    assert_int_equal(tokenize(c, texts, 3, &resp, &st), RF_OK);
    assert_int_equal(resp->n_seqs, 3);
    rf_tokenizer *tok;
    assert_int_equal(rf_tokenizer_load(path, &tok), RF_OK);
    rf_tok_state *ts = rf_tok_state_new(tok);
    rf_tok_encoding e = {0};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(rf_tok_encode(ts, texts[i], strlen(texts[i]), true, &e), RF_OK);
        assert_int_equal(resp->seqs[i]->n_ids, e.len);
        assert_memory_equal(resp->seqs[i]->ids, e.ids, e.len * sizeof *e.ids);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    char bad[] = "ok \xff\xfe end";
    char *bad_texts[] = {"fine", bad};
    assert_int_equal(tokenize(c, bad_texts, 2, &resp, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "texts[1]"));
    /* still serving */
    assert_int_equal(tokenize(c, texts, 1, &resp, &st), RF_OK);
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    rf_tok_encoding_free(&e);
    rf_tok_state_free(ts);
    rf_tokenizer_free(tok);
    rf_rpc_client_free(c);
    rf_rpc_server_free(server);
    rf_tokenizer_service_free(svc);
}

static int tokenize_max(rf_rpc_client *c, char **texts, size_t n, bool special, uint32_t max,
                        Refinery__V1__TokenizeResponse **out, rf_rpc_status *st) {
    Refinery__V1__TokenizeRequest req = REFINERY__V1__TOKENIZE_REQUEST__INIT;
    req.texts = texts;
    req.n_texts = n;
    req.add_special_tokens = special;
    req.max_length = max;
    *out = NULL;
    return rf_rpc_unary(c, METHOD, &req.base, &refinery__v1__tokenize_response__descriptor,
                        (ProtobufCMessage **)out, 30, st);
}

/* No silent truncation: each sequence says whether it was cut and how long
 * it was; a request's max_length cuts as the tokenizer's own truncation
 * would (compared with the library set to that length); above the server's
 * limit (256 in MiniLM's tokenizer.json) is INVALID_ARGUMENT naming both. */
static void test_tokenize_truncation(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: the tokenizer comes from the shared data");
    char path[4096];
    snprintf(path, sizeof path, "%s/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json", shared);
    rf_tokenizer_service_opts so = {.tokenizer = path, .add_special = true};
    rf_tokenizer_service *svc;
    assert_int_equal(rf_tokenizer_service_new(&so, &svc), RF_OK);
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0"};
    rf_rpc_server *server;
    assert_int_equal(rf_rpc_server_new(&ro, &server), RF_OK);
    assert_int_equal(rf_tokenizer_service_register(svc, server), RF_OK);
    assert_int_equal(rf_rpc_server_start(server), RF_OK);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(server));
    rf_rpc_client *c;
    assert_int_equal(rf_rpc_client_new(target, NULL, 0, &c), RF_OK);

    /* 400 repetitions of 4 words and a full stop: 2000 ids before the cut. */
    size_t n_long = 0;
    char *longtext = malloc(400 * 32);
    for (int i = 0; i < 400; i++)
        n_long += (size_t)sprintf(longtext + n_long, "the quick brown fox. ");
    char *texts[] = {longtext, "Hello, world!", ""};
    rf_tokenizer *ref, *full;
    assert_int_equal(rf_tokenizer_load(path, &ref), RF_OK);
    assert_int_equal(rf_tokenizer_load(path, &full), RF_OK);
    rf_tok_side side;
    assert_int_equal(rf_tokenizer_truncation(ref, &side), 256);
    rf_tokenizer_set_truncation(full, 0, RF_TRUNC_LONGEST_FIRST, RF_SIDE_RIGHT);
    rf_tok_encoding e = {0}, f = {0};
    const uint32_t maxes[] = {0, 20, 256, 2};
    for (int special = 0; special < 2; special++) {
        for (size_t m = 0; m < sizeof maxes / sizeof maxes[0]; m++) {
            if (special && maxes[m] == 2) continue; /* below [CLS] [SEP] + 1: see below */
            Refinery__V1__TokenizeResponse *resp;
            rf_rpc_status st;
            assert_int_equal(tokenize_max(c, texts, 3, special, maxes[m], &resp, &st), RF_OK);
            assert_int_equal(resp->n_seqs, 3);
            rf_tokenizer_set_truncation(ref, maxes[m] ? maxes[m] : 256, RF_TRUNC_LONGEST_FIRST,
                                        side);
            rf_tok_state *rs = rf_tok_state_new(ref), *fs = rf_tok_state_new(full);
            for (size_t i = 0; i < 3; i++) {
                assert_int_equal(rf_tok_encode(rs, texts[i], strlen(texts[i]), special, &e), 0);
                assert_int_equal(rf_tok_encode(fs, texts[i], strlen(texts[i]), special, &f), 0);
                const Refinery__V1__TokenSequence *q = resp->seqs[i];
                assert_int_equal(q->n_ids, e.len);
                assert_memory_equal(q->ids, e.ids, e.len * sizeof *e.ids);
                assert_int_equal(q->original_length, f.len);
                assert_int_equal(q->truncated, f.len > e.len);
            }
            /* The long text is cut, the short ones are not. */
            assert_true(resp->seqs[0]->truncated);
            assert_int_equal(resp->seqs[0]->original_length, 2000 + 2 * special);
            if (maxes[m] != 2) assert_false(resp->seqs[1]->truncated);
            rf_tok_state_free(rs);
            rf_tok_state_free(fs);
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
    }
    Refinery__V1__TokenizeResponse *resp;
    rf_rpc_status st;
    assert_int_equal(tokenize_max(c, texts, 1, true, 257, &resp, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "max_length 257"));
    assert_non_null(strstr(st.message, "limit 256"));
    assert_int_equal(tokenize_max(c, texts, 1, true, 1, &resp, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "special tokens"));
    /* still serving */
    assert_int_equal(tokenize_max(c, texts + 1, 1, true, 0, &resp, &st), RF_OK);
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    rf_tok_encoding_free(&e);
    rf_tok_encoding_free(&f);
    rf_tokenizer_free(ref);
    rf_tokenizer_free(full);
    free(longtext);
    rf_rpc_client_free(c);
    rf_rpc_server_free(server);
    rf_tokenizer_service_free(svc);
}

/* The Kafka path does not cut silently either: a sequence cut to the
 * tokenizer's max_length (256 in MiniLM's tokenizer.json) is marked in the
 * TokenBatch with its length before the cut, and counted. */
static void test_process_truncation(void **state) {
    const char *shared = getenv("SHARED");
    if (!shared) fail_msg("SHARED is not set: the tokenizer comes from the shared data");
    char path[4096], train[64], eval[64];
    snprintf(path, sizeof path, "%s/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json", shared);
    snprintf(train, sizeof train, "tokens.train.t%d", (int)getpid());
    snprintf(eval, sizeof eval, "tokens.eval.t%d", (int)getpid());
    rf_kafka_mock *mock;
    assert_int_equal(rf_kafka_mock_new(1, &mock), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, train, 1), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, eval, 1), 0);
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(mock), .delivery_timeout_s = 5};
    rf_kafka_producer *producer;
    assert_int_equal(rf_kafka_producer_new(&ko, &producer), 0);
    rf_stats *stats = rf_stats_new();
    rf_tokenizer_service_opts so = {.tokenizer = path,
                                    .add_special = true,
                                    .producer = producer,
                                    .stats = stats,
                                    .topic_train = train,
                                    .topic_eval = eval};
    rf_tokenizer_service *svc;
    assert_int_equal(rf_tokenizer_service_new(&so, &svc), RF_OK);
    /* 400 times 5 ids: 2000 ids and [CLS] [SEP] before the cut. */
    size_t n_long = 0;
    char *longtext = malloc(400 * 32);
    for (int i = 0; i < 400; i++)
        n_long += (size_t)sprintf(longtext + n_long, "the quick brown fox. ");
    Refinery__V1__Document docs[2], *ptrs[2];
    for (int i = 0; i < 2; i++) {
        refinery__v1__document__init(&docs[i]);
        docs[i].id = i ? "short" : "long";
        docs[i].text = i ? "Hello, world!" : longtext;
        ptrs[i] = &docs[i];
    }
    Refinery__V1__DocumentBatch in = REFINERY__V1__DOCUMENT_BATCH__INIT;
    in.run_id = "run-cut";
    in.seq = 1;
    in.docs = ptrs;
    in.n_docs = 2;
    size_t len = refinery__v1__document_batch__get_packed_size(&in);
    uint8_t *buf = malloc(len);
    refinery__v1__document_batch__pack(&in, buf);
    rf_kafka_msg m = {.topic = "docs.unique", .value = buf, .len = len};
    rf_stage_batch_id id = {0};
    rf_kafka_tracker t = {0};
    rf_store_counts counts = {0};
    assert_int_equal(rf_tokenizer_service_process(svc, &m, &id, &t, &counts), RF_OK);
    assert_int_equal(rf_kafka_wait(producer, &t, 10), RF_OK);
    assert_int_equal(counts.out, 2);
    assert_int_equal(rf_stats_get(stats, "tokenizer.truncated"), 1);
    const char *topics[] = {train, eval};
    rf_kafka_consumer *c;
    assert_int_equal(rf_kafka_consumer_new(&ko, "collect", topics, 2, &c), 0);
    int batches = 0, seen = 0;
    double end = rf_now() + 20;
    while (batches < 2 && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        for (size_t i = 0; i < b.n; i++, batches++) {
            Refinery__V1__TokenBatch *tb =
                refinery__v1__token_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            assert_non_null(tb);
            for (size_t k = 0; k < tb->n_seqs; k++, seen++) {
                const Refinery__V1__TokenSequence *q = tb->seqs[k];
                bool is_long = !strcmp(q->doc_id, "long");
                assert_int_equal(q->truncated, is_long);
                assert_int_equal(q->n_ids, is_long ? 256 : q->original_length);
                if (is_long) assert_int_equal(q->original_length, 2002);
                assert_true(q->original_length > 2);
            }
            refinery__v1__token_batch__free_unpacked(tb, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(batches, 2);
    assert_int_equal(seen, 2);
    rf_kafka_consumer_free(c);
    rf_tokenizer_service_free(svc);
    rf_kafka_producer_free(producer);
    rf_kafka_mock_free(mock);
    rf_stats_free(stats);
    free(buf);
    free(longtext);
}

/* A WordPiece tokenizer without unk_token: an unknown word fails to encode.
 * ids: [PAD]0 [UNK]1 [CLS]2 [SEP]3 the4 cat5 sat6 ##s7 .8 */
static const char no_unk_json[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":[{\"id\":0,\"content\":\"[PAD]\",\"special\":true,\"normalized\":false},"
    "{\"id\":1,\"content\":\"[UNK]\",\"special\":true,\"normalized\":false},"
    "{\"id\":2,\"content\":\"[CLS]\",\"special\":true,\"normalized\":false},"
    "{\"id\":3,\"content\":\"[SEP]\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,"
    "\"strip_accents\":null,\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\","
    "\"single\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}}],"
    "\"pair\":[{\"SpecialToken\":{\"id\":\"[CLS]\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
    "\"type_id\":0}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":0}},{\"Sequence\":{\"id\":"
    "\"B\",\"type_id\":1}},{\"SpecialToken\":{\"id\":\"[SEP]\",\"type_id\":1}}],"
    "\"special_tokens\":{\"[CLS]\":{\"id\":\"[CLS]\",\"ids\":[2],\"tokens\":[\"[CLS]\"]},"
    "\"[SEP]\":{\"id\":\"[SEP]\",\"ids\":[3],\"tokens\":[\"[SEP]\"]}}},"
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
    "\"model\":{\"type\":\"WordPiece\",\"continuing_subword_prefix\":\"##\","
    "\"max_input_chars_per_word\":8,\"vocab\":{\"[PAD]\":0,\"[UNK]\":1,\"[CLS]\":2,\"[SEP]\":3,"
    "\"the\":4,\"cat\":5,\"sat\":6,\"##s\":7,\".\":8}}}";

static void test_process_rejects(void **state) {
    char dir[] = "/tmp/rf_tok_svc_XXXXXX", path[128], train[64], eval[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(no_unk_json, f);
    fclose(f);
    snprintf(train, sizeof train, "tokens.train.%d", (int)getpid());
    snprintf(eval, sizeof eval, "tokens.eval.%d", (int)getpid());
    rf_kafka_mock *mock;
    assert_int_equal(rf_kafka_mock_new(1, &mock), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, train, 1), 0);
    assert_int_equal(rf_kafka_mock_topic(mock, eval, 1), 0);
    rf_kafka_opts ko = {.bootstrap = rf_kafka_mock_bootstrap(mock), .delivery_timeout_s = 5};
    rf_kafka_producer *producer;
    assert_int_equal(rf_kafka_producer_new(&ko, &producer), 0);
    rf_stats *stats = rf_stats_new();
    rf_tokenizer_service_opts so = {.tokenizer = path,
                                    .add_special = true,
                                    .eval_fraction = 0.5,
                                    .producer = producer,
                                    .stats = stats,
                                    .topic_train = train,
                                    .topic_eval = eval};
    rf_tokenizer_service *svc;
    assert_int_equal(rf_tokenizer_service_new(&so, &svc), RF_OK);

    /* d0..d7: every 4th has no text, every 4th (offset 1) an unknown word. */
    enum { N = 8 };
    Refinery__V1__Document docs[N], *ptrs[N];
    char ids[N][16];
    for (int i = 0; i < N; i++) {
        refinery__v1__document__init(&docs[i]);
        snprintf(ids[i], sizeof ids[i], "d%d", i);
        docs[i].id = ids[i];
        docs[i].text = i % 4 == 0 ? "" : i % 4 == 1 ? "the dog sat." : "The cats sat.";
        docs[i].label = i % 2;
        docs[i].cluster = i == 7 ? 777 : 0;
        ptrs[i] = &docs[i];
    }
    Refinery__V1__DocumentBatch in = REFINERY__V1__DOCUMENT_BATCH__INIT;
    in.run_id = "run-t";
    in.seq = 3;
    in.docs = ptrs;
    in.n_docs = N;
    size_t len = refinery__v1__document_batch__get_packed_size(&in);
    uint8_t *buf = malloc(len);
    refinery__v1__document_batch__pack(&in, buf);
    rf_kafka_msg m = {.topic = "docs.unique", .value = buf, .len = len};
    rf_stage_batch_id id = {0};
    rf_kafka_tracker t = {0};
    rf_store_counts counts = {0};
    assert_int_equal(rf_tokenizer_service_process(svc, &m, &id, &t, &counts), RF_OK);
    assert_int_equal(rf_kafka_wait(producer, &t, 10), RF_OK);
    assert_int_equal(counts.in, N);
    assert_int_equal(counts.out, 4);
    assert_int_equal(counts.rejected, 4);
    assert_int_equal(rf_stats_get(stats, "tokenizer.rejected.no_text"), 2);
    assert_int_equal(rf_stats_get(stats, "tokenizer.rejected.encode_failed"), 2);

    /* The kept documents, each once, as rf_tok_split_batch decides them. */
    rf_tokenizer *tok;
    assert_int_equal(rf_tokenizer_load(path, &tok), RF_OK);
    rf_tok_split_opts o = {.add_special = true, .eval_fraction = 0.5, .threads = 1};
    rf_tok_splitter *sp;
    assert_int_equal(rf_tok_splitter_new(tok, &o, &sp), RF_OK);
    rf_tok_doc views[N];
    for (int i = 0; i < N; i++)
        views[i] =
            (rf_tok_doc){ids[i], docs[i].text, strlen(docs[i].text), docs[i].cluster, NULL, 0};
    const rf_tok_result *res;
    assert_int_equal(rf_tok_split_batch(sp, views, N, &res), RF_OK);
    const char *topics[] = {train, eval};
    rf_kafka_consumer *c;
    assert_int_equal(rf_kafka_consumer_new(&ko, "collect", topics, 2, &c), 0);
    int seen[N] = {0}, batches = 0;
    double end = rf_now() + 20;
    while (batches < 2 && rf_now() < end) {
        rf_kafka_batch b;
        assert_int_equal(rf_kafka_poll_batch(c, 100, 0.5, &b), 0);
        for (size_t i = 0; i < b.n; i++) {
            Refinery__V1__TokenBatch *tb =
                refinery__v1__token_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            assert_non_null(tb);
            assert_string_equal(tb->run_id, "run-t");
            assert_int_equal(tb->seq, 3);
            assert_int_equal(tb->eval, strcmp(b.msgs[i].topic, train) != 0);
            for (size_t k = 0; k < tb->n_seqs; k++) {
                const Refinery__V1__TokenSequence *q = tb->seqs[k];
                int x = atoi(q->doc_id + 1);
                assert_true(x >= 0 && x < N);
                assert_null(res[x].reject);
                seen[x]++;
                assert_int_equal(res[x].split, tb->eval ? RF_SPLIT_EVAL : RF_SPLIT_TRAIN);
                assert_int_equal(q->cluster, res[x].cluster);
                assert_int_equal(q->label, x % 2);
                assert_int_equal(q->n_ids, res[x].enc.len);
                assert_memory_equal(q->ids, res[x].enc.ids, q->n_ids * sizeof *q->ids);
            }
            batches++;
            refinery__v1__token_batch__free_unpacked(tb, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    assert_int_equal(batches, 2); /* both splits, always */
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], i % 4 >= 2 ? 1 : 0);
    assert_int_equal(res[7].cluster, 777);
    assert_int_equal(res[2].cluster, rf_hash64("d2", 2, 0));

    rf_kafka_consumer_free(c);
    rf_tok_splitter_free(sp);
    rf_tokenizer_free(tok);
    free(buf);
    rf_tokenizer_service_free(svc);
    rf_stats_free(stats);
    rf_kafka_producer_free(producer);
    rf_kafka_mock_free(mock);
    unlink(path);
    rmdir(dir);
}

static int tool_fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, rf_errmsg());
    return 1;
}

static int connect_port(const char *port, rf_rpc_client **c) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%s", port);
    return rf_rpc_client_new(target, NULL, 0, c);
}

static int flush_lines(rf_rpc_client *c, char **lines, size_t n) {
    Refinery__V1__TokenizeResponse *resp;
    rf_rpc_status st;
    if (tokenize(c, lines, n, &resp, &st) < 0) {
        fprintf(stderr, "Tokenize: %d %s\n", (int)st.code, st.message);
        return 1;
    }
    for (size_t i = 0; i < resp->n_seqs; i++) {
        for (size_t k = 0; k < resp->seqs[i]->n_ids; k++)
            printf(k ? " %u" : "%u", resp->seqs[i]->ids[k]);
        printf("\n");
    }
    int rc = resp->n_seqs == n ? 0 : 1;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    return rc;
}

static int tool_tokenize(const char *port, const char *path) {
    rf_rpc_client *c;
    FILE *f = fopen(path, "r");
    if (!f || connect_port(port, &c) < 0) return tool_fail("tokenize");
    char *lines[64], *line = NULL;
    size_t n = 0, cap = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        if (len && line[len - 1] == '\n') line[len - 1] = '\0';
        lines[n++] = strdup(line);
        if (n == 64) {
            rc = flush_lines(c, lines, n);
            n = 0;
        }
    }
    if (!rc && n) rc = flush_lines(c, lines, n);
    free(line);
    fclose(f);
    rf_rpc_client_free(c);
    return rc;
}

static int tool_bad(const char *port) {
    rf_rpc_client *c;
    if (connect_port(port, &c) < 0) return tool_fail("bad");
    char bad[] = "caf\xc3 au lait", *texts[] = {bad};
    Refinery__V1__TokenizeResponse *resp;
    rf_rpc_status st;
    int rc = tokenize(c, texts, 1, &resp, &st);
    rf_rpc_client_free(c);
    printf("invalid UTF-8: %d %s\n", (int)st.code, st.message);
    return rc == RF_ERR_IO && st.code == GRPC_STATUS_INVALID_ARGUMENT ? 0 : 1;
}

static int tool_collect(const char *bs, const char *run, int nbatch, const char *out) {
    const char *topics[] = {"tokens.train", "tokens.eval"};
    char *got[2] = {calloc((size_t)nbatch, 1), calloc((size_t)nbatch, 1)};
    long seqs[2] = {0, 0}, repeats = 0, bad = 0;
    int batches = 0;
    rf_kafka_opts co = {.bootstrap = bs};
    rf_kafka_consumer *c;
    FILE *f = fopen(out, "w");
    if (!f || !got[0] || !got[1] || rf_kafka_consumer_new(&co, "collect", topics, 2, &c) < 0)
        return tool_fail("collect");
    double end = rf_now() + 60;
    while (batches < 2 * nbatch && rf_now() < end && !bad) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) return tool_fail("poll");
        for (size_t i = 0; i < b.n; i++) {
            int t = strcmp(b.msgs[i].topic, "tokens.train") != 0;
            Refinery__V1__TokenBatch *tb =
                refinery__v1__token_batch__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            if (!tb || strcmp(tb->run_id, run) || tb->seq >= (uint64_t)nbatch || tb->eval != t) {
                bad++;
            } else if (got[t][tb->seq]++) {
                repeats++;
            } else {
                batches++;
                seqs[t] += (long)tb->n_seqs;
                for (size_t k = 0; k < tb->n_seqs; k++) {
                    fprintf(f, "%s\t", tb->seqs[k]->doc_id);
                    for (size_t j = 0; j < tb->seqs[k]->n_ids; j++)
                        fprintf(f, j ? " %u" : "%u", tb->seqs[k]->ids[j]);
                    fputc('\n', f);
                }
            }
            if (tb) refinery__v1__token_batch__free_unpacked(tb, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
    fclose(f);
    free(got[0]);
    free(got[1]);
    printf("batches=%d train=%ld eval=%ld repeats=%ld bad=%ld\n", batches, seqs[0], seqs[1],
           repeats, bad);
    return !bad && batches == 2 * nbatch ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--tokenize")) return tool_tokenize(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "--bad")) return tool_bad(argv[2]);
    if (argc == 6 && !strcmp(argv[1], "--collect"))
        return tool_collect(argv[2], argv[3], atoi(argv[4]), argv[5]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize_in_process), cmocka_unit_test(test_tokenize_truncation),
        cmocka_unit_test(test_process_rejects), cmocka_unit_test(test_process_truncation)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
