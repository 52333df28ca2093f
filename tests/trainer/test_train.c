/* The training loop on the tiny BERT fixture with a synthetic, learnable task
 * (label = whether token 7 occurs): determinism, resume after a stop giving
 * bitwise-identical weights, gradient accumulation, learning, checkpoint
 * integrity, refusal to resume another run's checkpoint, and the Hugging Face
 * export round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/rng.h"
#include "common/sys.h"
#include "evaluator/evaluate.h"
#include "parity_util.h"
#include "trainer/checkpoint.h"
#include "trainer/train.h"

static char tmpdir[] = "/tmp/rf_train_XXXXXX";
static rf_dataset data;

static void make_data(void) {
    rf_rng r;
    rf_rng_seed(&r, 5);
    for (int i = 0; i < 40; i++) {
        uint32_t ids[12];
        int len = 4 + (int)rf_rng_below(&r, 8), label = i % 2;
        ids[0] = 1;
        for (int t = 1; t < len; t++) {
            ids[t] = 10 + (uint32_t)rf_rng_below(&r, 80);
        }
        if (label) ids[1 + rf_rng_below(&r, (uint64_t)len - 1)] = 7;
        assert_int_equal(rf_dataset_add(&data, ids, (size_t)len, label), 0);
    }
}

static rf_bert *load_tiny(int labels) {
    char *dir = fixture_path("tiny-bert");
    rf_bert *m;
    if (rf_bert_load(dir, labels, 3, rf_backend_cpu(), &m)) fail_msg("%s", rf_errmsg());
    free(dir);
    return m;
}

static rf_train_opts opts(const char *sub) {
    static char out[8][512];
    static int k;
    rf_train_opts o = rf_train_defaults();
    char *p = out[k++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, sub);
    o.out_dir = p;
    o.epochs = 3;
    o.batch_size = 4;
    o.grad_accum = 2;
    o.optim.lr = 2e-3f;
    o.optim.weight_decay = 0.01f;
    o.warmup_ratio = 0.1;
    o.log_every = 0;
    o.checkpoint_every = 2;
    o.resume = true;
    return o;
}

static float *train_once(const rf_train_opts *o, rf_train_result *res) {
    rf_bert *m = load_tiny(2);
    assert_int_equal(rf_train(o, &data, m, res), 0);
    float *w = malloc(m->nparams * sizeof(float));
    memcpy(w, m->params, m->nparams * sizeof(float));
    rf_bert_free(m);
    return w;
}

static size_t tiny_nparams(void) {
    rf_bert *m = load_tiny(2);
    size_t n = m->nparams;
    rf_bert_free(m);
    return n;
}

static void test_deterministic(void **state) {
    rf_train_result r1, r2;
    rf_train_opts a = opts("det_a"), b = opts("det_b");
    float *w1 = train_once(&a, &r1), *w2 = train_once(&b, &r2);
    assert_true(r1.finished && r2.finished);
    assert_int_equal(r1.steps, 15); /* 40 seqs / 4 = 10 micro, /2 = 5 steps x 3 epochs */
    assert_memory_equal(w1, w2, tiny_nparams() * sizeof(float));
    free(w1), free(w2);
}

/* Stop after k steps (the checkpoint is written), resume in a fresh model:
 * bitwise the same final weights as an uninterrupted run, for every k. */
static void test_resume_bitwise(void **state) {
    rf_train_result r;
    rf_train_opts full = opts("full");
    full.checkpoint_every = 0;
    float *want = train_once(&full, &r);
    size_t np = tiny_nparams();
    for (long k = 1; k < 15; k += 5) {
        char sub[64];
        snprintf(sub, sizeof sub, "resume_%ld", k);
        rf_train_opts o = opts(sub);
        o.stop_after = k;
        float *w = train_once(&o, &r);
        assert_false(r.finished);
        assert_int_equal(r.steps, k);
        free(w);
        o.stop_after = 0;
        w = train_once(&o, &r);
        assert_true(r.resumed && r.finished);
        assert_memory_equal(w, want, np * sizeof(float));
        free(w);
    }
    free(want);
}

/* Dropout off: 2 micro-batches of 4 accumulate to the gradient of one batch
 * of 8 (same order), up to float round-off. */
static void test_grad_accum(void **state) {
    rf_train_result r;
    rf_train_opts a = opts("acc_a"), b = opts("acc_b");
    a.dropout = b.dropout = false;
    a.epochs = b.epochs = 1;
    b.batch_size = 8;
    b.grad_accum = 1;
    float *w1 = train_once(&a, &r), *w2 = train_once(&b, &r);
    double e = rel_err(w1, w2, tiny_nparams());
    printf("accumulated vs single batch weights: rel err %.3g\n", e);
    assert_true(e < 1e-5);
    free(w1), free(w2);
}

static void test_learns_and_evaluates(void **state) {
    rf_bert *m = load_tiny(2);
    rf_metrics before, after;
    assert_int_equal(rf_evaluate(m, &data, 16, &before), 0);
    rf_train_opts o = opts("learn");
    o.epochs = 30;
    o.optim.lr = 5e-3f;
    o.warmup_ratio = 0;
    rf_train_result r;
    assert_int_equal(rf_train(&o, &data, m, &r), 0);
    assert_int_equal(rf_evaluate(m, &data, 16, &after), 0);
    printf("train loss %.4f -> %.4f, accuracy %.3f -> %.3f\n", rf_metrics_loss(&before),
           rf_metrics_loss(&after), rf_metrics_accuracy(&before), rf_metrics_accuracy(&after));
    assert_true(rf_metrics_loss(&after) < 0.5 * rf_metrics_loss(&before));
    assert_true(rf_metrics_accuracy(&after) >= 0.9);

    /* export, reload, same logits */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/export", tmpdir);
    assert_int_equal(rf_export_hf(m, NULL, dir), 0);
    rf_bert *back;
    assert_int_equal(rf_bert_load(dir, 0, 0, rf_backend_cpu(), &back), 0);
    assert_int_equal(back->cfg.num_labels, 2);
    rf_metrics again;
    assert_int_equal(rf_evaluate(back, &data, 16, &again), 0);
    assert_memory_equal(again.confusion, after.confusion, 4 * sizeof(uint64_t));
    assert_true(rf_metrics_loss(&again) == rf_metrics_loss(&after));
    rf_metrics_free(&before), rf_metrics_free(&after), rf_metrics_free(&again);
    rf_bert_free(back);
    rf_bert_free(m);
}

static void test_checkpoint_integrity(void **state) {
    rf_train_result r;
    rf_train_opts o = opts("ckpt");
    o.stop_after = 2;
    free(train_once(&o, &r));
    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint.bin", o.out_dir);
    char *buf;
    size_t len;
    assert_int_equal(rf_read_file(path, 1 << 30, &buf, &len), 0);
    rf_bert *m = load_tiny(2);
    assert_int_equal(rf_bert_enable_training(m), 0);
    rf_train_state st = {0};
    buf[len / 2] ^= 1; /* one flipped bit */
    assert_int_equal(rf_write_file_atomic(path, buf, len), 0);
    assert_int_equal(rf_checkpoint_load(path, m, &st), RF_ERR_CORRUPT);
    assert_non_null(strstr(rf_errmsg(), "checksum"));
    assert_int_equal(rf_write_file_atomic(path, buf, len - 100), 0); /* truncated */
    assert_int_equal(rf_checkpoint_load(path, m, &st), RF_ERR_CORRUPT);
    /* a training run refuses the damaged checkpoint instead of starting over */
    o.stop_after = 0;
    assert_int_equal(rf_train(&o, &data, m, &r), RF_ERR_CORRUPT);
    free(buf);
    rf_bert_free(m);
}

/* Resumes with the checkpoint's data and options only: a changed label or
 * learning rate, or an old-format file, is refused with a clear error and the
 * model is left as loaded; thread count and checkpoint cadence may change. */
static void test_resume_refuses_other_run(void **state) {
    rf_train_result r;
    rf_train_opts o = opts("ident");
    o.stop_after = 2;
    free(train_once(&o, &r));
    o.stop_after = 0;

    rf_dataset other = {0};
    for (size_t i = 0; i < data.n; i++)
        assert_int_equal(rf_dataset_add(&other, data.tokens + data.start[i], data.len[i],
                                        i == 17 ? 1 - data.label[i] : data.label[i]),
                         0);
    rf_bert *m = load_tiny(2);
    float *fresh = malloc(m->nparams * sizeof(float));
    memcpy(fresh, m->params, m->nparams * sizeof(float));
    assert_int_equal(rf_train(&o, &other, m, &r), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "training data differ"));
    assert_memory_equal(m->params, fresh, m->nparams * sizeof(float));

    rf_train_opts lr = o;
    lr.optim.lr *= 2;
    assert_int_equal(rf_train(&lr, &data, m, &r), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "training options differ"));
    rf_train_opts batch = o;
    batch.batch_size = 8;
    batch.grad_accum = 1;
    assert_int_equal(rf_train(&batch, &data, m, &r), RF_ERR_INVALID);
    assert_memory_equal(m->params, fresh, m->nparams * sizeof(float));

    rf_set_threads(1); /* not part of the identity */
    o.checkpoint_every = 5;
    assert_int_equal(rf_train(&o, &data, m, &r), 0);
    assert_true(r.resumed && r.finished);
    rf_set_threads(2);

    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint.bin", o.out_dir);
    assert_int_equal(rf_write_file_atomic(path, "RFCKPT01\0\0\0\0\0\0\0\0", 16), 0);
    assert_int_equal(rf_train(&o, &data, m, &r), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "old format"));
    free(fresh);
    rf_dataset_free(&other);
    rf_bert_free(m);
}

static void test_bad_labels(void **state) {
    rf_bert *m = load_tiny(2);
    rf_dataset d = {0};
    uint32_t ids[3] = {1, 2, 3};
    assert_int_equal(rf_dataset_add(&d, ids, 3, 5), 0);
    rf_train_opts o = opts("bad");
    rf_train_result r;
    assert_int_equal(rf_train(&o, &d, m, &r), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "label 5"));
    rf_dataset_free(&d);
    rf_bert_free(m);
}

static int setup(void **state) {
    if (!mkdtemp(tmpdir)) return -1;
    rf_set_threads(2);
    make_data();
    return 0;
}

static int teardown(void **state) {
    char cmd[300];
    rf_dataset_free(&data);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_resume_bitwise),
        cmocka_unit_test(test_grad_accum),
        cmocka_unit_test(test_learns_and_evaluates),
        cmocka_unit_test(test_checkpoint_integrity),
        cmocka_unit_test(test_resume_refuses_other_run),
        cmocka_unit_test(test_bad_labels),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
