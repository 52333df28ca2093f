/* The trainer service's pieces without servers: the intake through
 * rf_trainer_service_process (round trip in (seq, position) order, counts, a
 * replayed seq, a torn tail cut off on reopen, a damaged record), the run
 * directory names, and rf_train's checkpoint hook on the tiny BERT fixture
 * (called at each scheduled step and the last; a failure in it resumes from
 * the previous checkpoint and ends with the same weights bitwise).
 *
 * Tool modes for tests/services/trainer_service.test.sh:
 *   --produce BOOTSTRAP RUN IDS LABELS BATCH  TokenBatches (seq 0, 1, ...) of the
 *                                            space-separated id lines of IDS
 *                                            with the labels (one a line) of
 *                                            LABELS to tokens.train; prints
 *                                            the number of batches
 *   --announcements BOOTSTRAP N OUT          reads `checkpoints` until N
 *                                            distinct (run, step) arrived:
 *                                            "run step final path" lines to OUT */
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
#include "common/rng.h"
#include "common/sys.h"
#include "runtime/kafka/kafka.h"
#include "refinery.pb-c.h"
#include "runtime/intake.h"
#include "trainer/server/trainer_service.h"
#include "trainer/train.h"

static char tmpdir[] = "/tmp/rf_trainer_svc_XXXXXX";

/* A TokenBatch message of n sequences; sequence i has ids base+i repeated
 * (i % 3 + 1) times and label i % 2 (the last one -1 when unlabelled). */
typedef struct msg {
    uint8_t *buf;
    size_t len;
} msg;

static msg make_batch(const char *run, uint64_t seq, int n, uint32_t base, bool unlabelled) {
    Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
    Refinery__V1__TokenSequence q[8], *ptrs[8];
    uint32_t ids[8][3];
    assert_true(n <= 8);
    b.run_id = (char *)run;
    b.seq = seq;
    b.seqs = ptrs;
    b.n_seqs = (size_t)n;
    for (int i = 0; i < n; i++) {
        refinery__v1__token_sequence__init(&q[i]);
        for (int k = 0; k < 3; k++)
            ids[i][k] = base + (uint32_t)i;
        q[i].ids = ids[i];
        q[i].n_ids = (size_t)(i % 3 + 1);
        q[i].label = unlabelled && i == n - 1 ? -1 : i % 2;
        ptrs[i] = &q[i];
    }
    msg m = {malloc(refinery__v1__token_batch__get_packed_size(&b) + 1), 0};
    m.len = refinery__v1__token_batch__pack(&b, m.buf);
    return m;
}

static rf_trainer_service *open_service(const char *sub) {
    char state[512], ck[512];
    snprintf(state, sizeof state, "%s/%s/state", tmpdir, sub);
    snprintf(ck, sizeof ck, "%s/%s/ck", tmpdir, sub);
    rf_trainer_service_opts o = {.state_dir = state, .checkpoints_dir = ck};
    rf_trainer_service *s;
    if (rf_trainer_service_new(&o, &s)) fail_msg("%s", rf_errmsg());
    return s;
}

static int feed(rf_trainer_service *s, const char *run, uint64_t seq, int n, uint32_t base,
                bool unlabelled, rf_store_counts *c) {
    msg m = make_batch(run, seq, n, base, unlabelled);
    rf_kafka_msg km = {.topic = "tokens.train", .value = m.buf, .len = m.len};
    rf_stage_batch_id id;
    int rc = rf_stage_identify_batch(NULL, &km, &id);
    assert_int_equal(rc, 0);
    assert_int_equal(id.seq, seq);
    rc = rf_trainer_service_process(s, &km, &id, NULL, c);
    if (rc) print_message("process: %s\n", rf_errmsg());
    free(m.buf);
    return rc;
}

static void intake_path(const char *sub, const char *run, char *out, size_t size) {
    snprintf(out, size, "%s/%s/state/%s/intake", tmpdir, sub, run);
}

static void test_intake_round_trip(void **state) {
    rf_trainer_service *s = open_service("rt");
    rf_store_counts c;
    /* consumed out of order: the load order is by seq */
    assert_int_equal(feed(s, "run-1", 2, 3, 200, false, &c), 0);
    assert_int_equal(feed(s, "run-1", 0, 4, 0, true, &c), 0);
    assert_int_equal(c.in, 4);
    assert_int_equal(c.out, 3);
    assert_int_equal(c.rejected, 1);
    assert_int_equal(feed(s, "run-1", 1, 0, 0, false, &c), 0); /* an empty batch is recorded too */
    assert_int_equal(c.in, 0);
    assert_int_equal(feed(s, "other", 0, 2, 500, false, &c), 0);
    rf_trainer_service_free(s);

    char path[600];
    intake_path("rt", "run-1", path, sizeof path);
    rf_dataset d = {0};
    rf_intake_info info;
    assert_int_equal(rf_intake_load(path, "run-1", 0, &d, &info), 0);
    assert_int_equal(info.batches, 3);
    assert_int_equal(info.replays, 0);
    assert_int_equal(info.torn_bytes, 0);
    assert_int_equal(d.n, 7);
    uint32_t first[] = {0, 1, 2, 3, 200, 201, 202}, len[] = {1, 2, 3, 1, 1, 2, 3};
    int32_t labels[] = {0, 1, 0, -1, 0, 1, 0};
    for (size_t i = 0; i < d.n; i++) {
        assert_int_equal(d.tokens[d.start[i]], first[i]);
        assert_int_equal(d.len[i], len[i]);
        assert_int_equal(d.label[i], labels[i]);
    }
    rf_dataset_free(&d);
    /* another run's records are in its own file; the wrong run id is refused */
    assert_int_equal(rf_intake_load(path, "other", 0, &d, NULL), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
}

static void test_intake_replayed_seq(void **state) {
    rf_trainer_service *s = open_service("replay");
    rf_store_counts c;
    assert_int_equal(feed(s, "r", 0, 2, 10, false, &c), 0);
    assert_int_equal(feed(s, "r", 1, 2, 20, false, &c), 0);
    /* a replay after a crash between append and progress row: the first wins */
    assert_int_equal(feed(s, "r", 0, 3, 90, false, &c), 0);
    rf_trainer_service_free(s);
    char path[600];
    intake_path("replay", "r", path, sizeof path);
    rf_dataset d = {0};
    rf_intake_info info;
    assert_int_equal(rf_intake_load(path, "r", 0, &d, &info), 0);
    assert_int_equal(info.records, 3);
    assert_int_equal(info.replays, 1);
    assert_int_equal(info.batches, 2);
    assert_int_equal(d.n, 4);
    assert_int_equal(d.tokens[d.start[0]], 10);
    assert_int_equal(d.tokens[d.start[2]], 20);
    rf_dataset_free(&d);
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static void test_intake_truncated_tail(void **state) {
    rf_trainer_service *s = open_service("torn");
    rf_store_counts c;
    for (uint64_t q = 0; q < 3; q++)
        assert_int_equal(feed(s, "t", q, 4, (uint32_t)(10 * q), false, &c), 0);
    rf_trainer_service_free(s);
    char path[600];
    intake_path("torn", "t", path, sizeof path);
    long whole = file_size(path);
    assert_int_equal(truncate(path, whole - 7), 0); /* a crash in the last append */

    rf_dataset d = {0};
    rf_intake_info info;
    assert_int_equal(rf_intake_load(path, "t", 0, &d, &info), 0);
    assert_int_equal(info.batches, 2);
    assert_true(info.torn_bytes > 0);
    assert_int_equal(d.n, 8);
    rf_dataset_free(&d);

    /* the redelivered batch: the reopened intake cuts the tail, then appends */
    s = open_service("torn");
    assert_int_equal(feed(s, "t", 2, 4, 20, false, &c), 0);
    rf_trainer_service_free(s);
    assert_int_equal(file_size(path), whole);
    assert_int_equal(rf_intake_load(path, "t", 0, &d, &info), 0);
    assert_int_equal(info.batches, 3);
    assert_int_equal(info.torn_bytes, 0);
    assert_int_equal(d.n, 12);
    rf_dataset_free(&d);

    /* damage before the end is not a torn tail: an error, not a silent loss */
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 40, SEEK_SET);
    int byte = fgetc(f);
    fseek(f, 40, SEEK_SET);
    fputc(byte ^ 0x5a, f);
    fclose(f);
    assert_int_equal(rf_intake_load(path, "t", 0, &d, &info), RF_ERR_CORRUPT);
    rf_dataset_free(&d);
}

static void test_run_dirname(void **state) {
    char out[160];
    rf_trainer_run_dirname("run-1.a_b", out, sizeof out);
    assert_string_equal(out, "run-1.a_b");
    rf_trainer_run_dirname("../etc", out, sizeof out);
    assert_int_equal(strncmp(out, "run-", 4), 0);
    assert_null(strchr(out, '/'));
    rf_trainer_run_dirname(".hidden", out, sizeof out);
    assert_int_equal(strncmp(out, "run-", 4), 0);
}

/* ---- rf_train's checkpoint hook ---- */

typedef struct hook {
    long steps[8], totals[8];
    int n;
    long fail_at;   /* return an error at this step (once) */
    float *weights; /* copy of the parameters at the last call */
    size_t nparams;
} hook;

static int on_ckpt(void *user, const rf_bert *m, const rf_train_checkpoint *c) {
    hook *h = user;
    if (c->step == h->fail_at) {
        h->fail_at = 0;
        return rf_fail(RF_ERR_IO, "injected failure at step %ld", c->step);
    }
    assert_true(h->n < 8);
    assert_true(c->loss > 0 && c->lr >= 0 && c->tokens_per_s > 0);
    h->steps[h->n] = c->step;
    h->totals[h->n++] = c->total;
    free(h->weights);
    h->nparams = m->nparams;
    h->weights = malloc(m->nparams * sizeof *h->weights);
    memcpy(h->weights, m->params, m->nparams * sizeof *h->weights);
    return RF_OK;
}

static rf_bert *tiny(void) {
    char dir[4096];
    const char *root = getenv("REFINERY_ROOT");
    snprintf(dir, sizeof dir, "%s/tests/fixtures/trainer/tiny-bert", root ? root : ".");
    rf_bert *m;
    if (rf_bert_load(dir, 2, 3, rf_backend_cpu(), &m)) fail_msg("%s", rf_errmsg());
    return m;
}

static void train_with_hook(const char *sub, const rf_dataset *d, hook *h, int expect_rc,
                            rf_bert **out) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    rf_train_opts o = rf_train_defaults();
    o.out_dir = dir;
    o.batch_size = 4;
    o.max_steps = 5;
    o.checkpoint_every = 2;
    o.log_every = 0;
    o.resume = true;
    o.optim.lr = 1e-3;
    o.on_checkpoint = on_ckpt;
    o.user = h;
    rf_bert *m = tiny();
    rf_train_result r;
    assert_int_equal(rf_train(&o, d, m, &r), expect_rc);
    *out = m;
}

static void test_checkpoint_hook(void **state) {
    rf_set_threads(1);
    rf_dataset d = {0};
    rf_rng r;
    rf_rng_seed(&r, 9);
    for (int i = 0; i < 24; i++) {
        uint32_t ids[6] = {2, 0, 0, 0, 0, 3};
        for (int t = 1; t < 5; t++)
            ids[t] = 5 + (uint32_t)rf_rng_below(&r, 90);
        assert_int_equal(rf_dataset_add(&d, ids, 6, i % 2), 0);
    }
    hook a = {0};
    rf_bert *ma;
    train_with_hook("hook-a", &d, &a, RF_OK, &ma);
    assert_int_equal(a.n, 3);
    assert_int_equal(a.steps[0], 2);
    assert_int_equal(a.steps[1], 4);
    assert_int_equal(a.steps[2], 5);
    assert_int_equal(a.totals[2], 5);
    assert_memory_equal(a.weights, ma->params, ma->nparams * sizeof(float));

    /* fails at step 4 before its state is saved: rerunning resumes at step 2
     * and calls the hook for step 4 again, ending with the same weights */
    hook b = {.fail_at = 4};
    rf_bert *mb;
    train_with_hook("hook-b", &d, &b, RF_ERR_IO, &mb);
    assert_int_equal(b.n, 1);
    rf_bert_free(mb);
    train_with_hook("hook-b", &d, &b, RF_OK, &mb);
    assert_int_equal(b.n, 3);
    assert_int_equal(b.steps[1], 4);
    assert_int_equal(b.steps[2], 5);
    assert_memory_equal(mb->params, ma->params, ma->nparams * sizeof(float));
    free(a.weights);
    free(b.weights);
    rf_bert_free(ma);
    rf_bert_free(mb);
    rf_dataset_free(&d);
}

static int setup(void **state) {
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- tool modes ---- */

static int tool_fail(const char *what) {
    fprintf(stderr, "%s: %s\n", what, rf_errmsg());
    return 1;
}

static int send_batch(rf_kafka_producer *p, const char *run, uint64_t seq,
                      Refinery__V1__TokenSequence **ptrs, size_t n) {
    Refinery__V1__TokenBatch b = REFINERY__V1__TOKEN_BATCH__INIT;
    b.run_id = (char *)run;
    b.seq = seq;
    b.seqs = ptrs;
    b.n_seqs = n;
    size_t len = refinery__v1__token_batch__get_packed_size(&b);
    uint8_t *buf = malloc(len + 1);
    if (!buf) return RF_ERR_NOMEM;
    refinery__v1__token_batch__pack(&b, buf);
    int rc = rf_kafka_produce(p, "tokens.train", run, strlen(run), buf, len);
    free(buf);
    for (size_t i = 0; i < n; i++) {
        free(ptrs[i]->ids);
        free(ptrs[i]);
    }
    return rc;
}

static int tool_produce(const char *bs, const char *run, const char *ids_path,
                        const char *labels_path, size_t batch) {
    FILE *fi = fopen(ids_path, "r"), *fl = fopen(labels_path, "r");
    rf_kafka_opts po = {.bootstrap = bs};
    rf_kafka_producer *p;
    if (!fi || !fl || rf_kafka_producer_new(&po, &p) < 0) return tool_fail("produce");
    Refinery__V1__TokenSequence **ptrs = calloc(batch, sizeof *ptrs);
    char *line = NULL, lab[32];
    size_t cap = 0, n = 0;
    uint64_t seq = 0;
    int rc = ptrs ? RF_OK : RF_ERR_NOMEM;
    while (!rc && getline(&line, &cap, fi) > 0 && fgets(lab, sizeof lab, fl)) {
        Refinery__V1__TokenSequence *q = calloc(1, sizeof *q);
        refinery__v1__token_sequence__init(q);
        q->label = atoi(lab);
        q->ids = malloc((strlen(line) / 2 + 1) * sizeof *q->ids);
        for (char *t = strtok(line, " \n"); t; t = strtok(NULL, " \n"))
            q->ids[q->n_ids++] = (uint32_t)strtoul(t, NULL, 10);
        ptrs[n++] = q;
        if (n == batch) {
            rc = send_batch(p, run, seq++, ptrs, n);
            n = 0;
        }
    }
    if (!rc && n) rc = send_batch(p, run, seq++, ptrs, n);
    if (!rc) rc = rf_kafka_flush(p, 30);
    free(line);
    free(ptrs);
    fclose(fi);
    fclose(fl);
    rf_kafka_producer_free(p);
    if (rc) return tool_fail("produce");
    printf("%llu\n", (unsigned long long)seq);
    return 0;
}

static int tool_announcements(const char *bs, int want, const char *out) {
    const char *topic = "checkpoints";
    rf_kafka_opts co = {.bootstrap = bs};
    rf_kafka_consumer *c;
    FILE *f = fopen(out, "w");
    char(*seen)[200] = calloc((size_t)want + 1, sizeof *seen);
    int n = 0;
    if (!f || !seen || rf_kafka_consumer_new(&co, "announcements", &topic, 1, &c) < 0)
        return tool_fail("announcements");
    double end = rf_now() + 60;
    while (n < want && rf_now() < end) {
        rf_kafka_batch b;
        if (rf_kafka_poll_batch(c, 100, 0.5, &b) < 0) return tool_fail("poll");
        for (size_t i = 0; i < b.n; i++) {
            Refinery__V1__CheckpointAnnounce *a =
                refinery__v1__checkpoint_announce__unpack(NULL, b.msgs[i].len, b.msgs[i].value);
            if (!a) {
                fprintf(stderr, "announcements: a message is not a CheckpointAnnounce\n");
                return 1;
            }
            char key[200];
            snprintf(key, sizeof key, "%s %lld", a->run_id, (long long)a->step);
            bool dup = false;
            for (int k = 0; k < n && !dup; k++)
                dup = !strcmp(seen[k], key);
            if (!dup && n < want) {
                snprintf(seen[n++], sizeof seen[0], "%s", key);
                fprintf(f, "%s %d %s\n", key, a->final ? 1 : 0, a->path);
            }
            refinery__v1__checkpoint_announce__free_unpacked(a, NULL);
        }
        rf_kafka_batch_release(&b);
    }
    rf_kafka_consumer_free(c);
    fclose(f);
    free(seen);
    if (n < want) {
        fprintf(stderr, "announcements: %d of %d after 60 s\n", n, want);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && !strcmp(argv[1], "--produce"))
        return tool_produce(argv[2], argv[3], argv[4], argv[5], (size_t)atoi(argv[6]));
    if (argc == 5 && !strcmp(argv[1], "--announcements"))
        return tool_announcements(argv[2], atoi(argv[3]), argv[4]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intake_round_trip),     cmocka_unit_test(test_intake_replayed_seq),
        cmocka_unit_test(test_intake_truncated_tail), cmocka_unit_test(test_run_dirname),
        cmocka_unit_test(test_checkpoint_hook),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
