/* Class-weighted cross-entropy (trainer.class_weights): the weighted forward
 * against a closed-form hand computation, weights = NULL bitwise equal to the
 * unweighted op as it was before weights existed (a verbatim copy below),
 * sklearn's "balanced" weights, the spec's parsing and its errors, and the
 * checkpoint identity refusing a resume with other weights. The numerical
 * gradient check of the weighted backward is in test_ops.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/error.h"
#include "common/rng.h"
#include "parity_util.h"
#include "trainer/ops.h"
#include "trainer/spec.h"
#include "trainer/train.h"

/* ---- the unweighted op before this change, kept verbatim as the reference ---- */
static float old_xent_fwd(float *probs, float *losses, const float *logits, const int32_t *labels,
                          int B, int K) {
    double total = 0;
    int counted = 0;
    for (int b = 0; b < B; b++) {
        const float *z = logits + (size_t)b * K;
        float *p = probs + (size_t)b * K;
        float mx = z[0];
        for (int k = 1; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        double sum = 0;
        for (int k = 0; k < K; k++)
            sum += exp((double)z[k] - mx);
        for (int k = 0; k < K; k++)
            p[k] = (float)(exp((double)z[k] - mx) / sum);
        losses[b] = 0;
        if (labels[b] < 0) continue;
        losses[b] = (float)(log(sum) + mx - z[labels[b]]);
        total += losses[b];
        counted++;
    }
    return counted ? (float)(total / counted) : 0.0f;
}

static void old_xent_bwd(float *dlogits, const float *probs, const int32_t *labels, int B, int K,
                         float scale) {
    int counted = 0;
    for (int b = 0; b < B; b++)
        counted += labels[b] >= 0;
    if (!counted) return;
    float s = scale / counted;
    for (int b = 0; b < B; b++) {
        if (labels[b] < 0) continue;
        for (int k = 0; k < K; k++)
            dlogits[(size_t)b * K + k] += s * (probs[(size_t)b * K + k] - (k == labels[b]));
    }
}

/* Rows chosen so that every loss has a closed form:
 *   row 0: logits (0, 0),     label 0: p = 1/2, loss ln 2
 *   row 1: logits (0, ln 3),  label 1: p = 3/4, loss ln(4/3)
 *   row 2: logits (5, -5),    label -1: ignored (loss 0, no weight)
 *   row 3: logits (ln 4, 0),  label 1: p = 1/5, loss ln 5
 * With w = (3, 0.5): loss = (3 ln2 + 0.5 ln(4/3) + 0.5 ln5) / (3 + 0.5 + 0.5),
 * and the backward of row b is w[y_b] / 4 * (p_b - onehot). */
static void test_weighted_by_hand(void **state) {
    float logits[8] = {0, 0, 0, logf(3), 5, -5, logf(4), 0};
    int32_t labels[4] = {0, 1, -1, 1};
    const float w[2] = {3.0f, 0.5f};
    float probs[8], losses[4], d[8] = {0};
    float loss = rf_op_xent_fwd(probs, losses, logits, labels, w, 4, 2);
    double want = (3 * log(2.0) + 0.5 * log(4.0 / 3) + 0.5 * log(5.0)) / 4.0;
    printf("weighted loss %.7f, by hand %.7f\n", loss, want);
    assert_true(fabs(loss - want) < 1e-6);
    assert_true(fabs(losses[0] - log(2.0)) < 1e-6 && fabs(losses[1] - log(4.0 / 3)) < 1e-6);
    assert_true(losses[2] == 0.0f && fabs(losses[3] - log(5.0)) < 1e-6);
    /* unweighted for comparison: the plain mean of the three counted rows */
    float plain = rf_op_xent_fwd(probs, losses, logits, labels, NULL, 4, 2);
    assert_true(fabs(plain - (log(2.0) + log(4.0 / 3) + log(5.0)) / 3) < 1e-6);

    rf_op_xent_bwd(d, probs, labels, w, 4, 2, 2.0f); /* scale 2 */
    double want_d[8] = {2 * 3.0 / 4 * (0.5 - 1),
                        2 * 3.0 / 4 * 0.5,
                        2 * 0.5 / 4 * 0.25,
                        2 * 0.5 / 4 * (0.75 - 1),
                        0,
                        0,
                        2 * 0.5 / 4 * 0.8,
                        2 * 0.5 / 4 * (0.2 - 1)};
    for (int i = 0; i < 8; i++)
        if (fabs(d[i] - want_d[i]) > 1e-6)
            fail_msg("dlogits[%d] = %g, by hand %g", i, d[i], want_d[i]);

    /* a batch whose labelled rows all have weight 0: loss 0, no gradient (no 0/0) */
    const float w0[2] = {0.0f, 1.0f};
    int32_t only0[4] = {0, -1, 0, -1};
    float d0[8] = {0};
    assert_true(rf_op_xent_fwd(probs, losses, logits, only0, w0, 4, 2) == 0.0f);
    rf_op_xent_bwd(d0, probs, only0, w0, 4, 2, 1.0f);
    for (int i = 0; i < 8; i++)
        assert_true(d0[i] == 0.0f);
}

/* weights = NULL must reproduce the pre-weights op bit for bit (so that
 * unweighted training is unchanged), and all-ones weights give the same bits. */
static void test_null_weights_bitwise(void **state) {
    enum { B = 37, K = 5 };
    rf_rng r;
    rf_rng_seed(&r, 11);
    float logits[B * K];
    int32_t labels[B];
    for (int i = 0; i < B * K; i++)
        logits[i] = (float)((rf_rng_double(&r) * 2 - 1) * 6);
    for (int b = 0; b < B; b++)
        labels[b] = b % 7 == 3 ? -1 : (int32_t)rf_rng_below(&r, K);
    const float ones[K] = {1, 1, 1, 1, 1};
    float p_old[B * K], l_old[B], d_old[B * K], p_new[B * K], l_new[B], d_new[B * K];
    float d_ones[B * K];
    for (int i = 0; i < B * K; i++)
        d_old[i] = d_new[i] = d_ones[i] = (float)i * 1e-3f; /* backward accumulates */
    float a = old_xent_fwd(p_old, l_old, logits, labels, B, K);
    float b = rf_op_xent_fwd(p_new, l_new, logits, labels, NULL, B, K);
    assert_memory_equal(&a, &b, sizeof a);
    assert_memory_equal(p_old, p_new, sizeof p_old);
    assert_memory_equal(l_old, l_new, sizeof l_old);
    float c = rf_op_xent_fwd(p_new, l_new, logits, labels, ones, B, K);
    assert_memory_equal(&a, &c, sizeof a);
    old_xent_bwd(d_old, p_old, labels, B, K, 0.25f);
    rf_op_xent_bwd(d_new, p_new, labels, NULL, B, K, 0.25f);
    assert_memory_equal(d_old, d_new, sizeof d_old);
    rf_op_xent_bwd(d_ones, p_new, labels, ones, B, K, 0.25f);
    assert_memory_equal(d_old, d_ones, sizeof d_old);
}

/* sklearn's compute_class_weight("balanced"): n / (n_classes * count_c). */
static void test_balanced(void **state) {
    rf_dataset d = {0};
    uint32_t ids[3] = {1, 2, 3};
    int lab[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 2}; /* counts 2, 7, 1 of 10; class 3 absent */
    for (int i = 0; i < 10; i++)
        assert_int_equal(rf_dataset_add(&d, ids, 3, lab[i]), 0);
    rf_train_opts o = rf_train_defaults();
    float w[4] = {-1, -1, -1, -1};
    bool weighted = true;
    assert_int_equal(rf_train_class_weights(&o, &d, 4, w, &weighted), 0);
    assert_false(weighted);
    assert_true(w[0] == -1); /* untouched */
    o.class_weighting = RF_CW_BALANCED;
    assert_int_equal(rf_train_class_weights(&o, &d, 3, w, &weighted), 0);
    assert_true(weighted);
    assert_true(fabsf(w[0] - 10.0f / (3 * 2)) < 1e-6f);
    assert_true(fabsf(w[1] - 10.0f / (3 * 7)) < 1e-6f);
    assert_true(fabsf(w[2] - 10.0f / (3 * 1)) < 1e-6f);
    assert_int_equal(rf_train_class_weights(&o, &d, 4, w, &weighted), 0);
    assert_true(fabsf(w[0] - 10.0f / (4 * 2)) < 1e-6f);
    assert_true(w[3] == 0.0f); /* absent from the training set */
    o.class_weighting = RF_CW_LIST;
    o.n_class_weights = 2;
    o.class_weights[0] = 1, o.class_weights[1] = 3;
    assert_int_equal(rf_train_class_weights(&o, &d, 2, w, &weighted), 0);
    assert_true(w[0] == 1.0f && w[1] == 3.0f);
    assert_int_equal(rf_train_class_weights(&o, &d, 3, w, &weighted), RF_ERR_INVALID);
    assert_non_null(
        strstr(rf_errmsg(), "class_weights has 2 weight(s) but the model has 3 labels"));
    rf_dataset_free(&d);
}

/* Parses "trainer:\n  model: m\n<extra>" from spec.yaml; returns the rc. */
static int parse(const char *extra, rf_trainer_spec *s) {
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml, "trainer:\n  model: m\n%s", extra);
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, (size_t)n, "spec.yaml", &root), 0);
    int rc = rf_trainer_spec_parse(rf_cfg_get(root, "trainer"), s);
    rf_cfg_free(root);
    return rc;
}

static void expect_error(const char *extra, const char *msg) {
    rf_trainer_spec s;
    assert_int_equal(parse(extra, &s), RF_ERR_INVALID);
    if (!strstr(rf_errmsg(), msg)) fail_msg("error '%s' lacks '%s'", rf_errmsg(), msg);
}

static void test_spec(void **state) {
    rf_trainer_spec s;
    assert_int_equal(parse("  num_labels: 2\n", &s), 0);
    assert_int_equal(s.opts.class_weighting, RF_CW_NONE);
    assert_int_equal(parse("  class_weights: none\n", &s), 0);
    assert_int_equal(s.opts.class_weighting, RF_CW_NONE);
    assert_int_equal(parse("  class_weights: balanced\n", &s), 0);
    assert_int_equal(s.opts.class_weighting, RF_CW_BALANCED);
    assert_int_equal(parse("  num_labels: 3\n  class_weights: [1, 2.5, 0]\n", &s), 0);
    assert_int_equal(s.opts.class_weighting, RF_CW_LIST);
    assert_int_equal(s.opts.n_class_weights, 3);
    assert_true(s.opts.class_weights[0] == 1.0f && s.opts.class_weights[1] == 2.5f &&
                s.opts.class_weights[2] == 0.0f);
    /* num_labels 0 (from the data): the length is checked when training starts */
    assert_int_equal(parse("  class_weights:\n    - 0.5\n    - 4\n", &s), 0);
    assert_int_equal(s.opts.n_class_weights, 2);

    expect_error("  class_weights: balance\n",
                 "spec.yaml:3: trainer.class_weights: expected 'balanced', 'none' or a list of "
                 "one non-negative weight per label, got 'balance'");
    expect_error("  num_labels: 2\n  class_weights: [1, 2, 3]\n",
                 "spec.yaml:4: trainer.class_weights: expected 2 weights (num_labels), got '3 "
                 "weight(s)'");
    expect_error("  class_weights: []\n", "spec.yaml:3: trainer.class_weights: expected one weight "
                                          "per label (1 to 256), got '0 weight(s)'");
    expect_error("  num_labels: 2\n  class_weights: [1, -0.5]\n",
                 "spec.yaml:4: trainer.class_weights[1]: expected a non-negative number (at most "
                 "1e6), got '-0.5'");
    expect_error("  num_labels: 2\n  class_weights:\n    - 1\n    - heavy\n",
                 "spec.yaml:6: trainer.class_weights[1]: expected a non-negative number (at most "
                 "1e6), got 'heavy'");
    expect_error("  num_labels: 2\n  class_weights: [1, nan]\n",
                 "trainer.class_weights[1]: expected a non-negative number");
    expect_error("  num_labels: 2\n  class_weights: [[1], 2]\n",
                 "trainer.class_weights[0]: expected a non-negative number (at most 1e6), got "
                 "'(a mapping or list)'");
    expect_error("  num_labels: 2\n  class_weights: [0, 0]\n",
                 "spec.yaml:4: trainer.class_weights: expected at least one weight above 0, got "
                 "'all zero'");
    expect_error("  class_weights: {a: 1}\n", "trainer.class_weights: expected 'balanced'");

    assert_int_equal(parse("  num_labels: 2\n", &s), 0);
    assert_false(s.opts.balanced_sampler);
    assert_int_equal(parse("  sampler: shuffle\n", &s), 0);
    assert_false(s.opts.balanced_sampler);
    assert_int_equal(parse("  sampler: balanced\n", &s), 0);
    assert_true(s.opts.balanced_sampler);
    expect_error("  sampler: weighted\n", "spec.yaml:3: trainer.sampler");
    expect_error("  sampler: balanced\n  shuffle: false\n",
                 "trainer.sampler: balanced draws at random; it cannot be combined with shuffle: "
                 "false");
}

/* ---- training: the weights change the run and are part of its identity ---- */
static char tmpdir[] = "/tmp/rf_cw_XXXXXX";

static rf_bert *load_tiny(void) {
    char *dir = fixture_path("tiny-bert");
    rf_bert *m;
    if (rf_bert_load(dir, 2, 3, rf_backend_cpu(), &m)) fail_msg("%s", rf_errmsg());
    free(dir);
    return m;
}

static void test_train_identity(void **state) {
    rf_dataset d = {0};
    rf_rng r;
    rf_rng_seed(&r, 9);
    for (int i = 0; i < 24; i++) { /* 1 in 4 negative, learnable: token 7 marks label 0 */
        uint32_t ids[8] = {1};
        for (int t = 1; t < 8; t++)
            ids[t] = 10 + (uint32_t)rf_rng_below(&r, 80);
        if (i % 4 == 0) ids[3] = 7;
        assert_int_equal(rf_dataset_add(&d, ids, 8, i % 4 != 0), 0);
    }
    char out[600];
    snprintf(out, sizeof out, "%s/run", tmpdir);
    rf_train_opts o = rf_train_defaults();
    o.out_dir = out;
    o.batch_size = 4;
    o.epochs = 2;
    o.log_every = 0;
    o.dropout = false;
    o.optim.lr = 1e-3f;
    o.resume = false;
    rf_train_result res;

    rf_bert *plain = load_tiny(), *bal = load_tiny();
    assert_int_equal(rf_train(&o, &d, plain, &res), 0);
    assert_null(plain->class_weights_dev);
    rf_train_opts ob = o;
    ob.class_weighting = RF_CW_BALANCED;
    assert_int_equal(rf_train(&ob, &d, bal, &res), 0);
    assert_non_null(bal->class_weights_dev);
    assert_true(fabsf(bal->class_weights_dev[0] - 2.0f) < 1e-6f); /* 24 / (2 * 6) */
    assert_true(fabsf(bal->class_weights_dev[1] - 24.0f / 36) < 1e-6f);
    /* different loss, different trajectory */
    assert_memory_not_equal(plain->params, bal->params, plain->nparams * sizeof(float));
    rf_bert_free(plain), rf_bert_free(bal);

    /* a checkpoint of a balanced run does not resume with other weights */
    ob.resume = true;
    ob.stop_after = 2;
    snprintf(out, sizeof out, "%s/resume", tmpdir);
    ob.out_dir = out;
    rf_bert *m = load_tiny();
    assert_int_equal(rf_train(&ob, &d, m, &res), 0);
    assert_false(res.finished);
    rf_bert_free(m);
    rf_train_opts other[4] = {ob, ob, ob, ob};
    other[3].balanced_sampler = true; /* the sampler is part of the identity too */
    other[0].class_weighting = RF_CW_NONE;
    other[1].class_weighting = RF_CW_LIST;
    other[1].n_class_weights = 2;
    other[1].class_weights[0] = 2.0f, other[1].class_weights[1] = 1.0f;
    other[2].class_weighting = RF_CW_LIST; /* the same values as balanced resolves: accepted */
    other[2].n_class_weights = 2;
    other[2].class_weights[0] = 2.0f, other[2].class_weights[1] = 24.0f / 36;
    for (int i = 0; i < 4; i++) {
        other[i].stop_after = 0;
        m = load_tiny();
        int rc = rf_train(&other[i], &d, m, &res);
        if (i != 2) {
            assert_int_equal(rc, RF_ERR_INVALID);
            assert_non_null(strstr(rf_errmsg(), "training options differ"));
        } else {
            assert_int_equal(rc, 0);
            assert_true(res.resumed && res.finished);
        }
        rf_bert_free(m);
    }
    /* balanced sampler + weights: a kill and resume gives the uninterrupted run's bits */
    rf_train_opts full = o;
    full.balanced_sampler = true;
    full.class_weighting = RF_CW_BALANCED;
    full.dropout = true;
    snprintf(out, sizeof out, "%s/sampler_full", tmpdir);
    full.out_dir = out;
    rf_bert *want = load_tiny();
    assert_int_equal(rf_train(&full, &d, want, &res), 0);
    assert_true(res.finished);
    char out2[600];
    snprintf(out2, sizeof out2, "%s/sampler_resume", tmpdir);
    rf_train_opts part = full;
    part.out_dir = out2;
    part.resume = true;
    part.stop_after = 5;
    m = load_tiny();
    assert_int_equal(rf_train(&part, &d, m, &res), 0);
    assert_false(res.finished);
    rf_bert_free(m);
    part.stop_after = 0;
    m = load_tiny();
    assert_int_equal(rf_train(&part, &d, m, &res), 0);
    assert_true(res.resumed && res.finished);
    assert_memory_equal(m->params, want->params, m->nparams * sizeof(float));
    rf_bert_free(m);
    rf_bert_free(want);
    rf_dataset_free(&d);
}

/* sampler: balanced. Each epoch has n draws; with 1 negative in 10 the two
 * classes still fill about half each (binomial: 4,000 draws, sd ~32), every
 * draw is a valid index of the drawn class, epochs differ, and the same seed
 * gives the same draws. The default order stays a permutation. */
static void test_balanced_sampler(void **state) {
    rf_dataset d = {0};
    uint32_t ids[3] = {1, 2, 3};
    for (int i = 0; i < 4000; i++)
        assert_int_equal(rf_dataset_add(&d, ids, 3, i % 10 != 0), 0);
    size_t *a = malloc(d.n * sizeof *a), *b = malloc(d.n * sizeof *b);
    rf_train_opts o = rf_train_defaults();
    assert_int_equal(rf_train_epoch_order(&o, &d, 2, 0, a), 0);
    size_t neg = 0;
    char *seen = calloc(d.n, 1);
    for (size_t i = 0; i < d.n; i++) {
        assert_true(a[i] < d.n && !seen[a[i]]); /* a permutation */
        seen[a[i]] = 1;
        neg += d.label[a[i]] == 0;
    }
    assert_int_equal(neg, 400);
    o.balanced_sampler = true;
    assert_int_equal(rf_train_epoch_order(&o, &d, 2, 0, a), 0);
    neg = 0;
    for (size_t i = 0; i < d.n; i++) {
        assert_true(a[i] < d.n);
        neg += d.label[a[i]] == 0;
    }
    printf("balanced sampler: %zu of %zu draws negative (1 in 10 of the data)\n", neg, d.n);
    assert_true(neg > 1800 && neg < 2200);
    assert_int_equal(rf_train_epoch_order(&o, &d, 2, 0, b), 0);
    assert_memory_equal(a, b, d.n * sizeof *a);
    assert_int_equal(rf_train_epoch_order(&o, &d, 2, 1, b), 0);
    assert_memory_not_equal(a, b, d.n * sizeof *a);
    /* a class absent from the data is never drawn */
    assert_int_equal(rf_train_epoch_order(&o, &d, 3, 0, b), 0);
    for (size_t i = 0; i < d.n; i++)
        assert_true(d.label[b[i]] < 2);
    free(a), free(b), free(seen);

    rf_dataset_free(&d);
}

static int setup(void **state) {
    if (!mkdtemp(tmpdir)) return -1;
    rf_set_threads(2);
    return 0;
}

static int teardown(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weighted_by_hand), cmocka_unit_test(test_null_weights_bitwise),
        cmocka_unit_test(test_balanced),         cmocka_unit_test(test_spec),
        cmocka_unit_test(test_balanced_sampler), cmocka_unit_test(test_train_identity),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
