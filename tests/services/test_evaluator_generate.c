/* Evaluator.Generate (server streaming) in-process through the C client, on
 * ../shared/models/tiny-gpt2 under a models directory: the streamed tokens
 * (ids, text pieces, index, the finish reason on the last, the prompt length
 * on the first) equal rf_generate's greedy and sampled output; bad requests
 * get their status codes and the server keeps serving. No PostgreSQL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/skip.h"
#include "common/buf.h"
#include "common/error.h"
#include "evaluator/generate.h"
#include "evaluator/lm.h"
#include "evaluator/server/evaluator_service.h"
#include "refinery.pb-c.h"
#include "runtime/rpc/client.h"
#include "runtime/rpc/rpc.h"

#define GENERATE "/refinery.v1.Evaluator/Generate"

typedef struct streamed {
    int32_t ids[128];
    int n, prompt_tokens;
    rf_buf text;
    char finish[16];
} streamed;

/* One Generate call: the tokens in *out, 0 or the status in *st. */
static int call(rf_rpc_client *c, const Refinery__V1__GenerateRequest *req, streamed *out,
                rf_rpc_status *st) {
    memset(out, 0, sizeof *out);
    rf_rpc_stream *s;
    if (rf_rpc_stream_open(c, GENERATE, 60, &s)) fail_msg("%s", rf_errmsg());
    assert_int_equal(rf_rpc_stream_send(s, &req->base), 0);
    assert_int_equal(rf_rpc_stream_close_send(s), 0);
    ProtobufCMessage *m;
    while (rf_rpc_stream_recv(s, &refinery__v1__generated_token__descriptor, &m) == 1) {
        Refinery__V1__GeneratedToken *t = (Refinery__V1__GeneratedToken *)m;
        assert_int_equal(t->index, out->n);
        assert_true(out->n < 128);
        assert_true(out->finish[0] == 0); /* nothing after the last token */
        if (out->n == 0)
            out->prompt_tokens = t->prompt_tokens;
        else
            assert_int_equal(t->prompt_tokens, 0);
        out->ids[out->n++] = t->id;
        rf_buf_puts(&out->text, t->text);
        snprintf(out->finish, sizeof out->finish, "%s", t->finish);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return rf_rpc_stream_finish(s, st);
}

static void expect_same(const rf_lm *lm, const Refinery__V1__GenerateRequest *req,
                        const streamed *got) {
    rf_gen_opts o = {.max_new_tokens = req->max_new_tokens,
                     .sampling = {req->temperature, req->top_k, req->top_p, req->seed}};
    rf_gen_result r;
    assert_int_equal(rf_generate(lm, req->prompt, &o, NULL, NULL, &r), 0);
    assert_int_equal(got->n, r.n);
    assert_memory_equal(got->ids, r.ids, (size_t)r.n * sizeof *r.ids);
    assert_int_equal(got->prompt_tokens, r.n_prompt);
    assert_string_equal(got->finish, r.finish);
    rf_buf dec = RF_BUF_INIT;
    assert_int_equal(rf_tok_decode(lm->tok, (const uint32_t *)r.ids, (size_t)r.n, true, &dec), 0);
    assert_int_equal(got->text.len, dec.len);
    if (dec.len) assert_memory_equal(got->text.data, dec.data, dec.len);
    rf_buf_free(&dec);
    rf_gen_result_free(&r);
}

static void test_generate(void **state) {
    const char *sh = getenv("SHARED");
    char shared[2048], model[2100], dir[] = "/tmp/rf-evgen-XXXXXX", link[2100];
    snprintf(shared, sizeof shared, "%s", sh ? sh : "../shared");
    snprintf(model, sizeof model, "%s/models/tiny-gpt2", shared);
    struct stat st;
    if (stat(model, &st) != 0) RF_SKIP("%s is missing", model);
    char *real = realpath(model, NULL);
    assert_non_null(mkdtemp(dir));
    snprintf(link, sizeof link, "%s/tiny-gpt2", dir);
    assert_int_equal(symlink(real, link), 0);

    rf_evaluator_service_opts o = {.models_dir = dir, .max_new_tokens = 40};
    rf_evaluator_service *svc;
    assert_int_equal(rf_evaluator_service_new(&o, &svc), RF_OK);
    rf_rpc_server_opts ro = {.listen = "127.0.0.1:0"};
    rf_rpc_server *server;
    assert_int_equal(rf_rpc_server_new(&ro, &server), RF_OK);
    assert_int_equal(rf_evaluator_service_register(svc, server), RF_OK);
    assert_int_equal(rf_rpc_server_start(server), RF_OK);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(server));
    rf_rpc_client *c;
    assert_int_equal(rf_rpc_client_new(target, NULL, 0, &c), RF_OK);
    rf_lm *lm;
    assert_int_equal(rf_lm_load(real, &lm), 0);

    Refinery__V1__GenerateRequest req = REFINERY__V1__GENERATE_REQUEST__INIT;
    req.model = "tiny-gpt2";
    req.prompt = "Hello, my name is";
    req.max_new_tokens = 12;
    streamed got;
    rf_rpc_status s;
    assert_int_equal(call(c, &req, &got, &s), 0);
    assert_int_equal(got.n, 12);
    assert_string_equal(got.finish, "length");
    expect_same(lm, &req, &got);
    rf_buf_free(&got.text);
    /* sampled, seeded */
    req.temperature = 0.9f, req.top_k = 50, req.top_p = 0.95f, req.seed = 7;
    assert_int_equal(call(c, &req, &got, &s), 0);
    expect_same(lm, &req, &got);
    rf_buf_free(&got.text);

    struct {
        const char *model, *prompt;
        int max_new;
        float temperature;
        bool chat;
        grpc_status_code code;
        const char *says;
    } bad[] = {
        {"", "x", 4, 0, false, GRPC_STATUS_INVALID_ARGUMENT, "model is empty"},
        {"/etc", "x", 4, 0, false, GRPC_STATUS_INVALID_ARGUMENT, "relative"},
        {"tiny-gpt2/../tiny-gpt2", "x", 4, 0, false, GRPC_STATUS_INVALID_ARGUMENT, ".."},
        {"no-such-model", "x", 4, 0, false, GRPC_STATUS_NOT_FOUND, "no model"},
        {"tiny-gpt2", "x", 41, 0, false, GRPC_STATUS_INVALID_ARGUMENT, "at most 40"},
        {"tiny-gpt2", "x", 4, -1, false, GRPC_STATUS_INVALID_ARGUMENT, "temperature"},
        {"tiny-gpt2", "", 4, 0, false, GRPC_STATUS_INVALID_ARGUMENT, "0 tokens"},
        {"tiny-gpt2", "bad \xc3\x28", 4, 0, false, GRPC_STATUS_INVALID_ARGUMENT, "UTF-8"},
        {"tiny-gpt2", "hi", 4, 0, true, GRPC_STATUS_FAILED_PRECONDITION, "chat template"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Refinery__V1__GenerateRequest r = REFINERY__V1__GENERATE_REQUEST__INIT;
        r.model = (char *)bad[i].model;
        r.prompt = (char *)bad[i].prompt;
        r.max_new_tokens = bad[i].max_new;
        r.temperature = bad[i].temperature;
        r.chat = bad[i].chat;
        assert_int_equal(call(c, &r, &got, &s), RF_ERR_IO);
        if (s.code != bad[i].code || !strstr(s.message, bad[i].says))
            fail_msg("case %zu: %d %s", i, (int)s.code, s.message);
        assert_int_equal(got.n, 0);
        rf_buf_free(&got.text);
    }
    /* with a PEFT adapter (tests/fixtures/lora/tiny_gpt2_lora, peft's over
     * tiny-gpt2) under the models directory: the stream equals rf_generate on
     * the merged model (lm_adapter_cli.test.sh checks that one against peft's
     * greedy ids) and differs from the base's; an adapter made for another
     * GPT-2 (gpt2_lora: hidden 32) is the request's error */
    const char *root = getenv("REFINERY_ROOT");
    char fx[2200];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/lora/tiny_gpt2_lora", root ? root : ".");
    char *fxreal = realpath(fx, NULL);
    assert_non_null(fxreal);
    snprintf(link, sizeof link, "%s/adapter", dir);
    assert_int_equal(symlink(fxreal, link), 0);
    snprintf(fx, sizeof fx, "%s/tests/fixtures/lora/gpt2_lora", root ? root : ".");
    char *other = realpath(fx, NULL);
    assert_non_null(other);
    snprintf(link, sizeof link, "%s/other-adapter", dir);
    assert_int_equal(symlink(other, link), 0);
    rf_lm *merged;
    assert_int_equal(rf_lm_load_adapter(real, fxreal, &merged), 0);
    streamed base;
    req = (Refinery__V1__GenerateRequest)REFINERY__V1__GENERATE_REQUEST__INIT;
    req.model = "tiny-gpt2";
    req.prompt = "Hello, my name is";
    req.max_new_tokens = 20;
    assert_int_equal(call(c, &req, &base, &s), 0);
    req.adapter = "adapter";
    assert_int_equal(call(c, &req, &got, &s), 0);
    assert_int_equal(got.n, 20);
    expect_same(merged, &req, &got);
    assert_memory_not_equal(got.ids, base.ids, sizeof(int32_t) * 20);
    rf_buf_free(&got.text);
    rf_buf_free(&base.text);
    struct {
        const char *adapter;
        grpc_status_code code;
        const char *says;
    } bad_adapter[] = {
        {"no-such-adapter", GRPC_STATUS_NOT_FOUND, "no adapter"},
        {"../adapter", GRPC_STATUS_INVALID_ARGUMENT, ".."},
        {"/tmp", GRPC_STATUS_INVALID_ARGUMENT, "relative"},
        {"other-adapter", GRPC_STATUS_INVALID_ARGUMENT, "another model"},
        {"tiny-gpt2", GRPC_STATUS_INVALID_ARGUMENT, "adapter_config.json"},
    };
    for (size_t i = 0; i < sizeof bad_adapter / sizeof bad_adapter[0]; i++) {
        req.adapter = (char *)bad_adapter[i].adapter;
        assert_int_equal(call(c, &req, &got, &s), RF_ERR_IO);
        if (s.code != bad_adapter[i].code || !strstr(s.message, bad_adapter[i].says))
            fail_msg("adapter case %zu: %d %s", i, (int)s.code, s.message);
        rf_buf_free(&got.text);
    }
    rf_lm_free(merged);
    free(fxreal);
    free(other);

    /* still serving; the model was loaded once */
    req = (Refinery__V1__GenerateRequest)REFINERY__V1__GENERATE_REQUEST__INIT;
    req.model = "tiny-gpt2";
    req.prompt = "The end";
    req.max_new_tokens = 3;
    assert_int_equal(call(c, &req, &got, &s), 0);
    assert_int_equal(got.n, 3);
    rf_buf_free(&got.text);

    /* a service without a models directory refuses Generate */
    rf_evaluator_service_opts o2 = {0};
    rf_evaluator_service *svc2;
    assert_int_equal(rf_evaluator_service_new(&o2, &svc2), RF_OK);
    rf_rpc_server *server2;
    assert_int_equal(rf_rpc_server_new(&ro, &server2), RF_OK);
    assert_int_equal(rf_evaluator_service_register(svc2, server2), RF_OK);
    assert_int_equal(rf_rpc_server_start(server2), RF_OK);
    snprintf(target, sizeof target, "127.0.0.1:%d", rf_rpc_server_port(server2));
    rf_rpc_client *c2;
    assert_int_equal(rf_rpc_client_new(target, NULL, 0, &c2), RF_OK);
    assert_int_equal(call(c2, &req, &got, &s), RF_ERR_IO);
    assert_int_equal(s.code, GRPC_STATUS_FAILED_PRECONDITION);
    rf_buf_free(&got.text);
    rf_rpc_client_free(c2);
    rf_rpc_server_free(server2);
    rf_evaluator_service_free(svc2);

    rf_lm_free(lm);
    rf_rpc_client_free(c);
    rf_rpc_server_free(server);
    rf_evaluator_service_free(svc);
    for (size_t i = 0; i < 3; i++) { /* the three links */
        static const char *const names[] = {"tiny-gpt2", "adapter", "other-adapter"};
        snprintf(link, sizeof link, "%s/%s", dir, names[i]);
        unlink(link);
    }
    assert_int_equal(rmdir(dir), 0);
    free(real);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_generate)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
