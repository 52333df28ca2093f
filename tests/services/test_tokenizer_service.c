/* The tokenizer service's Tokenize handler in-process (ids equal to the
 * library's, invalid UTF-8 -> INVALID_ARGUMENT, the server keeps serving),
 * and, with arguments, the tools tokenizer_service.test.sh drives the
 * refinery-tokenizer binary with:
 *   --tokenize PORT LINES     Tokenize (C client), one line of ids per input line
 *   --bad PORT                a text that is not UTF-8 must get INVALID_ARGUMENT
 *   --collect BOOTSTRAP RUN NBATCH OUT
 *                             tokens.train + tokens.eval deduplicated by (topic, seq):
 *                             "doc_id<TAB>ids" lines to OUT, counts on stdout */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"
#include "tokenizer/server/tokenizer_service.h"

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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tokenize_in_process)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
