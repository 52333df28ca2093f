/* The evaluator service in-process against a real PostgreSQL (started here
 * with scripts/test-env/pg.sh, or $REFINERY_PG when set), on the tiny BERT
 * fixture: the tokens.eval intake and the checkpoint handling (metrics equal
 * rf_evaluate's on the same sequences, first record of a replayed seq wins,
 * replayed announcements change nothing, empty split, cancelled run, broken
 * folder, bad messages; waiting for an incomplete intake, then evaluating,
 * or skipping when the run is cancelled meanwhile), the classifier cache,
 * and Classify (predictions
 * equal the model's forward pass; bad input gets the right status codes and
 * the server keeps serving). With arguments, the tools
 * evaluator_service.test.sh drives the refinery-evaluator binary with:
 *   --produce BOOTSTRAP RUN FOLDER JSONL PER_BATCH [FIRST_SEQ]
 *       {"text","label"} lines tokenized with FOLDER's tokenizer -> TokenBatches
 *       (eval) of PER_BATCH sequences to tokens.eval, seqs from FIRST_SEQ
 *   --announce BOOTSTRAP RUN STEP FOLDER FINAL   a CheckpointAnnounce to `checkpoints`
 *   --classify PORT RUN FOLDER JSONL   Classify (latest checkpoint) == the model's forward
 *   --bad PORT RUN                     health, and bad requests get their status codes */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
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
#include "evaluator/evaluate.h"
#include "health.pb-c.h"
#include "kafka/kafka.h"
#include "refinery.pb-c.h"
#include "rpc/client.h"
#include "rpc/rpc.h"
#include "store/store.h"
#include "evaluator/classifier.h"
#include "svc/evaluator_service.h"
#include "tokenizer/tokenizer.h"
#include "trainer/dataset.h"
#include "trainer/model.h"

#include "../support/pg.h"

#define CLASSIFY "/refinery.v1.Evaluator/Classify"

static char work[] = "/tmp/rf-evsvc-XXXXXX";
static char tiny[1024], exported[1024];
static test_pg pg_server;

static int group_setup(void **state) {
    const char *root = getenv("REFINERY_ROOT");
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/trainer/tiny-bert", root ? root : ".");
    snprintf(exported, sizeof exported, "%s/tests/fixtures/trainer/exported", root ? root : ".");
    if (!mkdtemp(work)) return -1;
    return test_pg_start(&pg_server, "evsvc");
}

static int group_teardown(void **state) {
    test_pg_stop(&pg_server);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", work);
    return 0;
}

static rf_store *open_store(void) {
    rf_store_opts o = {.conninfo = pg_server.conninfo, .attempts = 20, .backoff_s = 0.05};
    rf_store *s = NULL;
    if (rf_store_open(&o, &s) < 0) fail_msg("open: %s", rf_errmsg());
    return s;
}

static const char *const texts[] = {
    "the movie was good",
    "awful plot and boring actor",
    "a really brilliant film , very fun !",
    "the story is long the scene is long the ending is long the music is long and dull",
    "naïve café",
    "not bad",
    "the worst film",
    "great music",
};
#define NTEXTS (sizeof texts / sizeof texts[0])

/* Labels 0..2 for the tiny model's three classes. */
static int text_label(size_t i) {
    return (int)(i % 3);
}

/* texts tokenized with the folder's tokenizer as the tokenizer service does
 * (full length, special tokens). */
typedef struct encoded {
    uint32_t *ids[NTEXTS];
    size_t len[NTEXTS];
} encoded;

static void encode_texts(const char *folder, encoded *e) {
    rf_tokenizer *tok;
    assert_int_equal(rf_tokenizer_load(folder, &tok), RF_OK);
    rf_tok_state *st = rf_tok_state_new(tok);
    rf_tok_encoding enc = {0};
    for (size_t i = 0; i < NTEXTS; i++) {
        assert_int_equal(rf_tok_encode(st, texts[i], strlen(texts[i]), true, &enc), RF_OK);
        e->ids[i] = malloc(enc.len * sizeof *enc.ids);
        memcpy(e->ids[i], enc.ids, enc.len * sizeof *enc.ids);
        e->len[i] = enc.len;
    }
    rf_tok_encoding_free(&enc);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
}

static void encoded_free(encoded *e) {
    for (size_t i = 0; i < NTEXTS; i++)
        free(e->ids[i]);
}

/* A packed TokenBatch of texts[from..to) (label shifted by `shift`). */
static uint8_t *pack_batch(const encoded *e, const char *run, uint64_t seq, size_t from, size_t to,
                           int shift, size_t *len) {
    Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
    Refinery__V1__TokenSequence q[NTEXTS], *p[NTEXTS];
    b.run_id = (char *)run;
    b.seq = seq;
    b.eval = 1;
    for (size_t i = from; i < to; i++) {
        refinery__v1__token_sequence__init(&q[i - from]);
        q[i - from].ids = e->ids[i];
        q[i - from].n_ids = e->len[i];
        q[i - from].label = (text_label(i) + shift) % 3;
        p[i - from] = &q[i - from];
    }
    b.seqs = p;
    b.n_seqs = to - from;
    *len = refinery__v1__token_batch__get_packed_size(&b);
    uint8_t *buf = malloc(*len + 1);
    refinery__v1__token_batch__pack(&b, buf);
    return buf;
}

/* Feeds one batch through the intake as the stage loop would, recording it. */
static void intake(rf_evaluator_service *svc, rf_store *store, const encoded *e, const char *run,
                   uint64_t seq, size_t from, size_t to, int shift) {
    size_t len;
    uint8_t *buf = pack_batch(e, run, seq, from, to, shift, &len);
    rf_kafka_msg m = {.topic = "tokens.eval", .value = buf, .len = len};
    rf_stage_batch_id id;
    assert_int_equal(rf_stage_identify_batch(NULL, &m, &id), RF_OK);
    rf_store_counts c = {0};
    assert_int_equal(rf_evaluator_service_intake(svc, &m, &id, NULL, &c), RF_OK);
    assert_int_equal(c.in, (int64_t)(to - from));
    assert_int_equal(rf_store_progress_add(store, run, "evaluator", seq, &c, NULL), RF_OK);
    free(buf);
}

/* A sealed run whose upstream stages recorded batches 0..nbatch-1 with outputs. */
static void make_run(rf_store *store, const char *run, int nbatch, const char *spec) {
    assert_int_equal(rf_store_run_create(store, run, spec, NULL), RF_OK);
    assert_int_equal(rf_store_run_set_state(store, run, RF_RUN_RUNNING, NULL), RF_OK);
    const char *stages[] = {"ingest", "dedup", "tokenizer"};
    rf_store_counts c = {.in = 3, .out = 3};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < nbatch; i++)
            assert_int_equal(rf_store_progress_add(store, run, stages[k], (uint64_t)i, &c, NULL),
                             RF_OK);
    if (nbatch == 0) { /* one upstream batch with nothing in it */
        rf_store_counts none = {.in = 2, .rejected = 2};
        assert_int_equal(rf_store_progress_add(store, run, "ingest", 0, &none, NULL), RF_OK);
    }
    assert_int_equal(rf_store_run_seal(store, run), RF_OK);
}

/* rf_evaluate on texts[0..NTEXTS) cut to max_len keeping [SEP], in batches of batch. */
static void reference_metrics(rf_bert *m, const encoded *e, size_t max_len, int batch,
                              rf_metrics *out) {
    rf_dataset d = {0};
    for (size_t i = 0; i < NTEXTS; i++) {
        uint32_t ids[64];
        size_t n = e->len[i] < max_len ? e->len[i] : max_len;
        memcpy(ids, e->ids[i], n * sizeof *ids);
        ids[n - 1] = e->ids[i][e->len[i] - 1];
        assert_int_equal(rf_dataset_add(&d, ids, n, text_label(i)), RF_OK);
    }
    assert_int_equal(rf_evaluate(m, &d, batch, out), RF_OK);
    rf_dataset_free(&d);
}

static int announce(rf_evaluator_service *svc, rf_store *store, const char *run, int64_t step,
                    const char *folder, int final) {
    Refinery__V1__CheckpointAnnounce a = REFINERY__V1__CHECKPOINT_ANNOUNCE__INIT;
    a.run_id = (char *)run;
    a.step = step;
    a.path = (char *)folder;
    a.final = final;
    a.train_loss = 0.25;
    uint8_t buf[2048];
    size_t len = refinery__v1__checkpoint_announce__pack(&a, buf);
    return rf_evaluator_service_checkpoint(svc, store, buf, len);
}

static double eval_value(rf_store *store, const char *run, int64_t step, const char *metric) {
    double v = NAN;
    if (rf_store_eval_get(store, run, step, metric, &v) != RF_OK) return NAN;
    return v;
}

static int64_t count_rows(rf_store *store, const char *sql, const char *run) {
    const char *p[] = {run};
    PGresult *r;
    assert_int_equal(rf_store_exec(store, sql, 1, p, &r), RF_OK);
    int64_t n = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void test_checkpoints(void **state) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/state", work);
    rf_evaluator_service_opts o = {.state_dir = dir, .batch_size = 3};
    rf_evaluator_service *svc;
    assert_int_equal(rf_evaluator_service_new(&o, &svc), RF_OK);
    rf_store *store = open_store();
    encoded e;
    encode_texts(tiny, &e);

    /* Batches out of order; seq 1 delivered twice with different labels (a
     * replay after a crash between append and record): the first wins. */
    make_run(store, "ev-1", 2, "{}");
    intake(svc, store, &e, "ev-1", 1, 5, NTEXTS, 0);
    intake(svc, store, &e, "ev-1", 1, 5, NTEXTS, 1);
    intake(svc, store, &e, "ev-1", 0, 0, 5, 0);

    /* The reference: the same sequences in (seq, position) order, cut to the
     * model's 16 positions keeping [SEP], through rf_evaluate. */
    rf_bert *m;
    assert_int_equal(rf_bert_load(tiny, 0, 0, rf_backend_cpu(), &m), RF_OK);
    rf_metrics ref;
    reference_metrics(m, &e, 16, 3, &ref);

    assert_int_equal(announce(svc, store, "ev-1", 5, tiny, 0), RF_OK);
    assert_true(eval_value(store, "ev-1", 5, "accuracy") == rf_metrics_accuracy(&ref));
    assert_true(eval_value(store, "ev-1", 5, "loss") == rf_metrics_loss(&ref));
    assert_true(eval_value(store, "ev-1", 5, "macro_f1") == rf_metrics_macro(&ref).f1);
    assert_true(eval_value(store, "ev-1", 5, "n") == (double)NTEXTS);
    for (int c = 0; c < 3; c++) {
        char name[32];
        rf_class_scores cs = rf_metrics_class(&ref, c);
        snprintf(name, sizeof name, "f1.%d", c);
        assert_true(eval_value(store, "ev-1", 5, name) == cs.f1);
        snprintf(name, sizeof name, "support.%d", c);
        assert_true(eval_value(store, "ev-1", 5, name) == (double)cs.support);
    }
    const char *rows = "SELECT count(*) FROM eval_results WHERE run_id = $1";
    int64_t nrows = count_rows(store, rows, "ev-1");
    assert_int_equal(nrows, 5 + 4 * 3 + 1);
    rf_store_run r;
    assert_int_equal(rf_store_run_get(store, "ev-1", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_RUNNING);

    /* Replayed: nothing changes. The final checkpoint sets the run succeeded. */
    assert_int_equal(announce(svc, store, "ev-1", 5, tiny, 0), RF_OK);
    assert_int_equal(count_rows(store, rows, "ev-1"), nrows);
    assert_int_equal(announce(svc, store, "ev-1", 9, tiny, 1), RF_OK);
    assert_true(eval_value(store, "ev-1", 9, "n") == (double)NTEXTS);
    assert_int_equal(rf_store_run_get(store, "ev-1", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_SUCCEEDED);

    /* An empty eval split: n = 0 and nothing else, and the run still ends. */
    make_run(store, "ev-empty", 0, "{}");
    assert_int_equal(announce(svc, store, "ev-empty", 1, tiny, 1), RF_OK);
    assert_true(eval_value(store, "ev-empty", 1, "n") == 0);
    assert_true(isnan(eval_value(store, "ev-empty", 1, "accuracy")));
    assert_int_equal(rf_store_run_get(store, "ev-empty", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_SUCCEEDED);

    /* A cancelled run is skipped. */
    make_run(store, "ev-cancel", 1, "{}");
    intake(svc, store, &e, "ev-cancel", 0, 0, 3, 0);
    assert_int_equal(rf_store_run_set_state(store, "ev-cancel", RF_RUN_CANCELLED, NULL), RF_OK);
    assert_int_equal(announce(svc, store, "ev-cancel", 1, tiny, 1), RF_OK);
    assert_true(isnan(eval_value(store, "ev-cancel", 1, "n")));
    assert_int_equal(rf_store_run_get(store, "ev-cancel", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_CANCELLED);

    /* A folder that does not load fails the run with the reason. */
    make_run(store, "ev-bad", 1, "{}");
    intake(svc, store, &e, "ev-bad", 0, 0, 3, 0);
    assert_int_equal(announce(svc, store, "ev-bad", 1, "/nonexistent/folder", 1), RF_OK);
    assert_int_equal(rf_store_run_get(store, "ev-bad", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_FAILED);
    assert_non_null(strstr(r.error, "/nonexistent/folder"));

    /* Unknown runs and messages that are not announcements are skipped. */
    assert_int_equal(announce(svc, store, "no-such-run", 1, tiny, 1), RF_OK);
    uint8_t junk[] = {0xff, 0xff, 0xff};
    assert_int_equal(rf_evaluator_service_checkpoint(svc, store, junk, sizeof junk), RF_OK);
    assert_int_equal(rf_stats_get(rf_evaluator_service_stats(svc), "evaluator.checkpoints.bad"), 1);

    /* max_len and batch_size from the spec's evaluator: section. */
    make_run(store, "ev-spec", 1, "evaluator:\n  max_len: 5\n  batch_size: 2\n");
    intake(svc, store, &e, "ev-spec", 0, 0, NTEXTS, 0);
    rf_metrics cut;
    reference_metrics(m, &e, 5, 2, &cut);
    assert_int_equal(announce(svc, store, "ev-spec", 1, tiny, 1), RF_OK);
    assert_true(eval_value(store, "ev-spec", 1, "loss") == rf_metrics_loss(&cut));
    assert_true(eval_value(store, "ev-spec", 1, "loss") != rf_metrics_loss(&ref));

    rf_metrics_free(&cut);
    rf_metrics_free(&ref);
    rf_bert_free(m);
    encoded_free(&e);
    rf_store_close(store);
    rf_evaluator_service_free(svc);
}

/* An announcement handled on its own thread and store, as the service's
 * checkpoint consumer does while the intake goes on. */
typedef struct announcer {
    rf_evaluator_service *svc;
    const char *run;
    volatile int done;
    int rc;
} announcer;

static void *announce_main(void *arg) {
    announcer *a = arg;
    rf_store *store = open_store();
    a->rc = announce(a->svc, store, a->run, 1, tiny, 1);
    rf_store_close(store);
    a->done = 1;
    return NULL;
}

/* An announcement waits for the run's eval intake: evaluated once the last
 * batch is taken in, or skipped when the run is cancelled meanwhile. */
static void test_waits_for_intake(void **state) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/state-wait", work);
    rf_evaluator_service_opts o = {.state_dir = dir, .batch_size = 3, .poll_s = 0.05};
    rf_evaluator_service *svc;
    assert_int_equal(rf_evaluator_service_new(&o, &svc), RF_OK);
    rf_store *store = open_store();
    encoded e;
    encode_texts(tiny, &e);
    make_run(store, "ev-wait", 2, "{}");
    make_run(store, "ev-wait-cancel", 1, "{}");
    intake(svc, store, &e, "ev-wait", 0, 0, 4, 0);

    announcer a = {svc, "ev-wait", 0, 0}, b = {svc, "ev-wait-cancel", 0, 0};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, announce_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, announce_main, &b), 0);
    usleep(400 * 1000);
    assert_false(a.done);
    assert_false(b.done);
    assert_true(isnan(eval_value(store, "ev-wait", 1, "n")));
    intake(svc, store, &e, "ev-wait", 1, 4, NTEXTS, 0); /* the last batch */
    assert_int_equal(rf_store_run_set_state(store, "ev-wait-cancel", RF_RUN_CANCELLED, NULL),
                     RF_OK);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.rc, RF_OK);
    assert_int_equal(b.rc, RF_OK);
    assert_true(eval_value(store, "ev-wait", 1, "n") == (double)NTEXTS);
    assert_true(isnan(eval_value(store, "ev-wait-cancel", 1, "n")));
    rf_store_run r;
    assert_int_equal(rf_store_run_get(store, "ev-wait", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_SUCCEEDED);
    assert_int_equal(rf_store_run_get(store, "ev-wait-cancel", &r), RF_OK);
    assert_int_equal(r.state, RF_RUN_CANCELLED);
    encoded_free(&e);
    rf_store_close(store);
    rf_evaluator_service_free(svc);
}

/* The model's own forward pass on texts (one batch), as the reference. */
static void reference(const char *folder, const char *const *t, size_t n, int32_t *labels,
                      float *probs) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ref.jsonl", work);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) {
        rf_buf b = RF_BUF_INIT;
        assert_int_equal(rf_buf_append_json_str(&b, t[i], strlen(t[i])), RF_OK);
        fprintf(f, "{\"id\":\"t%zu\",\"text\":%.*s,\"label\":0}\n", i, (int)b.len, b.data);
        rf_buf_free(&b);
    }
    fclose(f);
    rf_bert *m;
    assert_int_equal(rf_bert_load(folder, 0, 0, rf_backend_cpu(), &m), RF_OK);
    rf_dataset d = {0};
    assert_int_equal(rf_dataset_load_jsonl(&d, path, folder, m->cfg.max_position, NULL, NULL),
                     RF_OK);
    assert_int_equal(d.n, n);
    size_t idx[NTEXTS];
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    rf_batch_buf bb = {0};
    assert_int_equal(rf_batch_collate(&bb, &d, idx, (int)n), RF_OK);
    rf_batch b = {bb.B, bb.T, bb.ids, bb.types, NULL, bb.valid};
    assert_int_equal(rf_bert_forward(m, &b, false, 0), RF_OK);
    int K = m->cfg.num_labels;
    for (size_t i = 0; i < n; i++) {
        const float *z = m->logits + i * K;
        int best = 0;
        for (int k = 1; k < K; k++)
            if (z[k] > z[best]) best = k;
        double sum = 0;
        for (int k = 0; k < K; k++)
            sum += exp((double)z[k] - z[best]);
        for (int k = 0; k < K; k++)
            probs[i * K + k] = (float)(exp((double)z[k] - z[best]) / sum);
        labels[i] = best;
    }
    rf_batch_buf_free(&bb);
    rf_dataset_free(&d);
    rf_bert_free(m);
}

static int classify(rf_rpc_client *c, const char *run, int64_t step, char **t, size_t n,
                    Refinery__V1__ClassifyResponse **out, rf_rpc_status *st) {
    Refinery__V1__ClassifyRequest req = REFINERY__V1__CLASSIFY_REQUEST__INIT;
    req.run_id = (char *)run;
    req.checkpoint_step = step;
    req.texts = t;
    req.n_texts = n;
    *out = NULL;
    return rf_rpc_unary(c, CLASSIFY, &req.base, &refinery__v1__classify_response__descriptor,
                        (ProtobufCMessage **)out, 60, st);
}

/* Classify's answer for texts equals the reference forward pass. */
static void check_predictions(const Refinery__V1__ClassifyResponse *resp, const char *folder,
                              const char *const *t, size_t n) {
    int32_t labels[NTEXTS];
    float probs[NTEXTS * 8];
    reference(folder, t, n, labels, probs);
    assert_int_equal(resp->n_predictions, n);
    for (size_t i = 0; i < n; i++) {
        const Refinery__V1__Prediction *p = resp->predictions[i];
        assert_int_equal(p->label, labels[i]);
        double sum = 0;
        for (size_t k = 0; k < p->n_probs; k++) {
            assert_float_equal(p->probs[k], probs[i * p->n_probs + k], 1e-6);
            sum += p->probs[k];
        }
        assert_float_equal(sum, 1.0, 1e-5);
    }
}

static void test_classify(void **state) {
    rf_store *store = open_store();
    char corrupt[1100], cmd[6000];
    snprintf(corrupt, sizeof corrupt, "%s/corrupt", work);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && cp '%s'/* '%s' && head -c 500 '%s/model.safetensors' > "
             "'%s/model.safetensors'",
             corrupt, tiny, corrupt, tiny, corrupt);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rf_store_run_create(store, "cl-1", "{}", NULL), RF_OK);
    assert_int_equal(rf_store_run_create(store, "cl-none", "{}", NULL), RF_OK);
    assert_int_equal(rf_store_checkpoint_add(store, "cl-1", 1, tiny, 0.5), RF_OK);
    assert_int_equal(rf_store_checkpoint_add(store, "cl-1", 2, corrupt, 0.5), RF_OK);

    rf_evaluator_service_opts o = {.pg = pg_server.conninfo, .max_texts = NTEXTS, .batch_size = 3};
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

    Refinery__V1__ClassifyResponse *resp;
    rf_rpc_status st;
    char *t[NTEXTS + 1];
    for (size_t i = 0; i < NTEXTS; i++)
        t[i] = (char *)texts[i];
    t[NTEXTS] = "one too many";
    /* Step 1, in batches of 3, equals one forward pass over all. */
    assert_int_equal(classify(c, "cl-1", 1, t, NTEXTS, &resp, &st), RF_OK);
    assert_int_equal(resp->checkpoint_step, 1);
    check_predictions(resp, tiny, texts, NTEXTS);
    /* And rf_evaluate agrees: with these predictions as labels, accuracy 1. */
    rf_dataset d = {0};
    rf_bert *m;
    rf_metrics mt;
    assert_int_equal(rf_bert_load(tiny, 0, 0, rf_backend_cpu(), &m), RF_OK);
    encoded e;
    encode_texts(tiny, &e);
    for (size_t i = 0; i < NTEXTS; i++) {
        uint32_t ids[16];
        size_t n = e.len[i] < 16 ? e.len[i] : 16;
        memcpy(ids, e.ids[i], n * sizeof *ids);
        ids[n - 1] = e.ids[i][e.len[i] - 1];
        assert_int_equal(rf_dataset_add(&d, ids, n, resp->predictions[i]->label), RF_OK);
    }
    assert_int_equal(rf_evaluate(m, &d, 4, &mt), RF_OK);
    assert_true(rf_metrics_accuracy(&mt) == 1.0);
    rf_metrics_free(&mt);
    rf_dataset_free(&d);
    rf_bert_free(m);
    encoded_free(&e);
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    /* The latest checkpoint (step 3, added now) is used when step <= 0. */
    assert_int_equal(rf_store_checkpoint_add(store, "cl-1", 3, exported, 0.5), RF_OK);
    assert_int_equal(classify(c, "cl-1", 0, t, 3, &resp, &st), RF_OK);
    assert_int_equal(resp->checkpoint_step, 3);
    check_predictions(resp, exported, texts, 3);
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    struct {
        const char *run;
        int64_t step;
        size_t n;
        grpc_status_code code;
        const char *says;
    } bad[] = {
        {"cl-1", 1, NTEXTS + 1, GRPC_STATUS_INVALID_ARGUMENT, "at most"},
        {"", 1, 1, GRPC_STATUS_INVALID_ARGUMENT, "run_id"},
        {"no-such-run", 0, 1, GRPC_STATUS_NOT_FOUND, "unknown run"},
        {"cl-none", 0, 1, GRPC_STATUS_FAILED_PRECONDITION, "no checkpoint yet"},
        {"cl-1", 7, 1, GRPC_STATUS_NOT_FOUND, "no checkpoint 7"},
        {"cl-1", 2, 1, GRPC_STATUS_INTERNAL, "corrupt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(classify(c, bad[i].run, bad[i].step, t, bad[i].n, &resp, &st), RF_ERR_IO);
        if (st.code != bad[i].code || !strstr(st.message, bad[i].says))
            fail_msg("case %zu: %d %s", i, (int)st.code, st.message);
    }
    char bad_text[] = "fine \xc3\x28 text", *bt[] = {"ok", bad_text};
    assert_int_equal(classify(c, "cl-1", 1, bt, 2, &resp, &st), RF_ERR_IO);
    assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "texts[1]"));
    /* Still serving. */
    assert_int_equal(classify(c, "cl-1", 1, t, 2, &resp, &st), RF_OK);
    protobuf_c_message_free_unpacked(&resp->base, NULL);

    rf_rpc_client_free(c);
    rf_rpc_server_free(server);
    rf_evaluator_service_free(svc);
    rf_store_close(store);
}

/* Two folders fit; a third evicts the least recently used; an entry held
 * while evicted stays usable (ASan watches). */
typedef struct runner {
    rf_classifier *c;
    int rc;
} runner;

static void *run_texts(void *arg) {
    runner *r = arg;
    int32_t labels[NTEXTS];
    float probs[NTEXTS * 3];
    for (int i = 0; i < 5 && !r->rc; i++)
        r->rc = rf_classifier_run(r->c, texts, NTEXTS, 4, labels, probs);
    return NULL;
}

static void test_cache(void **state) {
    char copy[1100], cmd[4000];
    snprintf(copy, sizeof copy, "%s/copy", work);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/* '%s'", copy, tiny, copy);
    assert_int_equal(system(cmd), 0);
    rf_classifier_cache *cc;
    assert_int_equal(rf_classifier_cache_new(2, 128, &cc), RF_OK);
    rf_classifier *a, *b, *a2, *held;
    assert_int_equal(rf_classifier_cache_get(cc, tiny, &a), RF_OK);
    assert_int_equal(rf_classifier_cache_get(cc, exported, &b), RF_OK);
    assert_int_equal(rf_classifier_cache_get(cc, tiny, &a2), RF_OK);
    assert_ptr_equal(a, a2);
    assert_int_equal(rf_classifier_cache_loads(cc), 2);
    rf_classifier_cache_release(cc, a2);
    rf_classifier_cache_release(cc, a);
    /* b is held while copy evicts it (b is the least recently used). */
    held = b;
    assert_int_equal(rf_classifier_cache_get(cc, copy, &a), RF_OK);
    assert_int_equal(rf_classifier_cache_loads(cc), 3);
    runner r1 = {held, 0}, r2 = {held, 0};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, run_texts, &r1);
    pthread_create(&t2, NULL, run_texts, &r2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(r1.rc, RF_OK);
    assert_int_equal(r2.rc, RF_OK);
    rf_classifier_cache_release(cc, held);
    rf_classifier_cache_release(cc, a);
    assert_int_equal(rf_classifier_cache_get(cc, tiny, &a), RF_OK); /* still cached */
    assert_int_equal(rf_classifier_cache_loads(cc), 3);
    rf_classifier_cache_release(cc, a);
    assert_true(rf_classifier_cache_get(cc, "/nonexistent", &a) < 0);
    rf_classifier_cache_free(cc);
}

/* ---- tools for evaluator_service.test.sh ---- */

static int tool_fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, rf_errmsg());
    return 1;
}

/* {"text":...,"label":N} lines, in order (the test writes them). */
static int read_jsonl(const char *path, char ***out_texts, int **out_labels, size_t *n) {
    FILE *f = fopen(path, "r");
    if (!f) return rf_fail(RF_ERR_IO, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0, k = 0;
    char **t = NULL;
    int *l = NULL;
    while (getline(&line, &cap, f) >= 0) {
        char *a = strstr(line, "\"text\":\""), *b = strstr(line, "\",\"label\":");
        if (!a || !b) continue;
        t = realloc(t, (k + 1) * sizeof *t);
        l = realloc(l, (k + 1) * sizeof *l);
        t[k] = strndup(a + 8, (size_t)(b - a - 8));
        l[k] = atoi(b + 10);
        k++;
    }
    free(line);
    fclose(f);
    *out_texts = t;
    *out_labels = l;
    *n = k;
    return RF_OK;
}

static void free_texts(char **t, int *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(t[i]);
    free(t);
    free(l);
}

static int tool_produce(const char *bs, const char *run, const char *folder, const char *jsonl,
                        int per_batch, uint64_t first_seq) {
    char **t;
    int *l;
    size_t n;
    rf_tokenizer *tok;
    rf_kafka_producer *p;
    rf_kafka_opts ko = {.bootstrap = bs};
    if (read_jsonl(jsonl, &t, &l, &n) || rf_tokenizer_load(folder, &tok) ||
        rf_kafka_producer_new(&ko, &p))
        return tool_fail("produce");
    rf_tok_state *st = rf_tok_state_new(tok);
    rf_tok_encoding enc[64] = {{0}};
    Refinery__V1__TokenSequence q[64], *qp[64];
    uint64_t seq = first_seq, nb = 0;
    for (size_t i = 0; i < n; i += (size_t)per_batch) {
        Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
        b.run_id = (char *)run;
        b.seq = seq++;
        b.eval = 1;
        b.seqs = qp;
        for (size_t j = i; j < n && j < i + (size_t)per_batch; j++) {
            size_t k = b.n_seqs++;
            if (rf_tok_encode(st, t[j], strlen(t[j]), true, &enc[k])) return tool_fail("encode");
            refinery__v1__token_sequence__init(&q[k]);
            q[k].doc_id = t[j];
            q[k].ids = enc[k].ids;
            q[k].n_ids = enc[k].len;
            q[k].label = l[j];
            qp[k] = &q[k];
        }
        size_t len = refinery__v1__token_batch__get_packed_size(&b);
        uint8_t *buf = malloc(len + 1);
        refinery__v1__token_batch__pack(&b, buf);
        if (rf_kafka_produce(p, "tokens.eval", run, strlen(run), buf, len))
            return tool_fail("produce");
        free(buf);
        nb++;
    }
    int rc = rf_kafka_flush(p, 30);
    printf("produced %" PRIu64 " batches, %zu sequences\n", nb, n);
    for (int k = 0; k < 64; k++)
        rf_tok_encoding_free(&enc[k]);
    rf_tok_state_free(st);
    rf_tokenizer_free(tok);
    rf_kafka_producer_free(p);
    free_texts(t, l, n);
    return rc ? tool_fail("flush") : 0;
}

static int tool_announce(const char *bs, const char *run, int64_t step, const char *folder,
                         int final) {
    rf_kafka_producer *p;
    rf_kafka_opts ko = {.bootstrap = bs};
    if (rf_kafka_producer_new(&ko, &p)) return tool_fail("announce");
    Refinery__V1__CheckpointAnnounce a = REFINERY__V1__CHECKPOINT_ANNOUNCE__INIT;
    a.run_id = (char *)run;
    a.step = step;
    a.path = (char *)folder;
    a.final = final;
    uint8_t buf[4096];
    size_t len = refinery__v1__checkpoint_announce__pack(&a, buf);
    int rc = rf_kafka_produce(p, "checkpoints", run, strlen(run), buf, len);
    if (!rc) rc = rf_kafka_flush(p, 30);
    rf_kafka_producer_free(p);
    return rc ? tool_fail("announce") : 0;
}

static int connect_port(const char *port, rf_rpc_client **c) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%s", port);
    return rf_rpc_client_new(target, NULL, 0, c);
}

/* Classify (latest checkpoint) on every text equals the folder's forward pass. */
static int tool_classify(const char *port, const char *run, const char *folder, const char *jsonl) {
    char **t;
    int *l;
    size_t n;
    rf_rpc_client *c;
    if (!mkdtemp(work) || read_jsonl(jsonl, &t, &l, &n) || connect_port(port, &c))
        return tool_fail("classify");
    size_t agree = 0, checked = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i += NTEXTS) {
        size_t k = n - i < NTEXTS ? n - i : NTEXTS;
        Refinery__V1__ClassifyResponse *resp;
        rf_rpc_status st;
        if (classify(c, run, 0, t + i, k, &resp, &st)) {
            fprintf(stderr, "Classify: %d %s\n", (int)st.code, st.message);
            rc = 1;
            break;
        }
        int32_t labels[NTEXTS];
        float probs[NTEXTS * 8];
        reference(folder, (const char *const *)(t + i), k, labels, probs);
        for (size_t j = 0; j < k; j++) {
            const Refinery__V1__Prediction *p = resp->predictions[j];
            bool same = p->label == labels[j];
            for (size_t q = 0; q < p->n_probs; q++)
                same = same && fabsf(p->probs[q] - probs[j * p->n_probs + q]) <= 1e-6f;
            agree += same;
            checked++;
        }
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    printf("classify: %zu of %zu predictions equal the model's forward pass\n", agree, checked);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", work);
    rf_rpc_client_free(c);
    free_texts(t, l, n);
    return rc || agree != n;
}

static int tool_bad(const char *port, const char *run) {
    rf_rpc_client *c;
    if (connect_port(port, &c)) return tool_fail("bad");
    Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    hreq.service = "refinery.v1.Evaluator";
    Grpc__Health__V1__HealthCheckResponse *hresp = NULL;
    rf_rpc_status st;
    int rc = rf_rpc_unary(c, "/grpc.health.v1.Health/Check", &hreq.base,
                          &grpc__health__v1__health_check_response__descriptor,
                          (ProtobufCMessage **)&hresp, 10, &st);
    int serving =
        !rc && hresp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    printf("health refinery.v1.Evaluator: %s\n", serving ? "SERVING" : "not serving");
    if (hresp) protobuf_c_message_free_unpacked(&hresp->base, NULL);
    int fails = !serving;
    char badt[] = "caf\xc3 au lait", *bt[] = {badt}, *many[300];
    for (int i = 0; i < 300; i++)
        many[i] = "good";
    struct {
        const char *run;
        char **t;
        size_t n;
        grpc_status_code code;
    } cases[] = {{run, bt, 1, GRPC_STATUS_INVALID_ARGUMENT},
                 {run, many, 300, GRPC_STATUS_INVALID_ARGUMENT},
                 {"no-such-run", many, 1, GRPC_STATUS_NOT_FOUND}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Refinery__V1__ClassifyResponse *resp;
        rc = classify(c, cases[i].run, 0, cases[i].t, cases[i].n, &resp, &st);
        printf("bad request %zu: %s %s\n", i, rf_rpc_status_name(st.code), st.message);
        fails += rc != RF_ERR_IO || st.code != cases[i].code;
        if (!rc) protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    rf_rpc_client_free(c);
    return fails != 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && !strcmp(argv[1], "--produce"))
        return tool_produce(argv[2], argv[3], argv[4], argv[5], atoi(argv[6]), 0);
    if (argc == 8 && !strcmp(argv[1], "--produce"))
        return tool_produce(argv[2], argv[3], argv[4], argv[5], atoi(argv[6]),
                            strtoull(argv[7], NULL, 10));
    if (argc == 7 && !strcmp(argv[1], "--announce"))
        return tool_announce(argv[2], argv[3], atoll(argv[4]), argv[5], atoi(argv[6]));
    if (argc == 6 && !strcmp(argv[1], "--classify"))
        return tool_classify(argv[2], argv[3], argv[4], argv[5]);
    if (argc == 4 && !strcmp(argv[1], "--bad")) return tool_bad(argv[2], argv[3]);
    if (argc > 1) {
        fprintf(stderr, "usage: see the comment at the top of %s\n", __FILE__);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoints),
        cmocka_unit_test(test_waits_for_intake),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_cache),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
