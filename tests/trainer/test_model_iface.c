/* The model interface (model_iface.h) on every model: forward and backward
 * over unit ranges split at each boundary, the boundary activation copied
 * from one model instance to a second (its gradient views bound to the first
 * one's gradient block), are bitwise the whole model's loss, logits and
 * gradients; the replayed event sequence is the real one; and the tensor
 * table, units and blocks are consistent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "parity_util.h"
#include "trainer/model_iface.h"

static char *path_of(const char *rel) {
    const char *root = getenv("REFINERY_ROOT");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/tests/fixtures/%s", root ? root : ".", rel);
    return p;
}

static rf_model *load(const char *rel) {
    char *dir = path_of(rel);
    rf_model *m;
    rf_model_load_opts o = {.num_labels = 3, .seed = 5};
    if (rf_model_load(dir, &o, rf_backend_cpu(), &m)) fail_msg("%s: %s", dir, rf_errmsg());
    free(dir);
    rf_model_blocks b;
    assert_int_equal(rf_model_blocks_of(m, &b), 0);
    assert_int_equal(rf_model_enable_training(m, b.nparams, b.nparams), 0);
    return m;
}

/* A batch of 3 rows x 7 tokens, padded; labels per the model's task. */
typedef struct batch {
    int32_t ids[21], types[21], labels[21], pos[21], seg[21];
    uint8_t valid[21];
    rf_model_batch b;
} batch;

static void make_batch(const rf_model *m, batch *x, bool packed) {
    rf_model_info in = rf_model_info_of(m);
    int B = 3, T = 7, len[3] = {7, 5, 3};
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            int n = r * T + t;
            x->ids[n] = (int32_t)((7 * n + 3) % (in.vocab < 90 ? in.vocab : 90));
            x->types[n] = 0;
            x->valid[n] = t < len[r];
            x->labels[n] = t < len[r] ? x->ids[n] : -100;
            /* row 0 packs two documents: tokens 0-3 and 4-6 */
            x->seg[n] = r == 0 && t >= 4;
            x->pos[n] = r == 0 && t >= 4 ? t - 4 : t;
        }
    x->labels[4] = -100; /* the second document's first token */
    x->b = (rf_model_batch){.B = B, .T = T, .ids = x->ids, .valid = x->valid, .types = x->types};
    if (in.task == RF_TASK_CLASSIFY) {
        x->labels[0] = 2, x->labels[1] = 0, x->labels[2] = 1;
        x->b.labels = x->labels;
    } else {
        x->b.labels = x->labels;
        if (packed) {
            x->b.pos = x->pos;
            x->b.seg = x->seg;
        }
    }
}

/* ---- event recording ---- */

typedef struct ev {
    int unit, ev, next;
} ev;

typedef struct rec {
    ev e[512];
    int n;
} rec;

static int record(void *user, int unit, rf_unit_event e, int next) {
    rec *r = user;
    assert_true(r->n < 512);
    r->e[r->n++] = (ev){unit, (int)e, next};
    return RF_OK;
}

static void logits_of(const rf_model *m, const float **p, size_t *n, int rows_B, int T) {
    size_t row;
    assert_int_equal(rf_model_logits(m, p, &row), 0);
    rf_model_info in = rf_model_info_of(m);
    *n = row * (size_t)(in.task == RF_TASK_CLASSIFY ? rows_B : rows_B * T);
}

static void check_model(const char *rel, bool packed) {
    rf_model *full = load(rel), *a = load(rel), *b = load(rel);
    rf_model_info in = rf_model_info_of(full);
    int U = in.units;
    assert_true(U >= 3);
    rf_model_blocks fb;
    assert_int_equal(rf_model_blocks_of(full, &fb), 0);
    /* units tile the flat block in order; every tensor lies in one unit */
    size_t prev = 0;
    for (int u = 0; u < U; u++) {
        size_t lo, hi;
        assert_int_equal(rf_model_unit_range(full, u, &lo, &hi), 0);
        assert_int_equal(lo, prev);
        assert_true(hi > lo);
        prev = hi;
    }
    assert_int_equal(prev, fb.nparams);
    for (size_t t = 0; t < fb.ntensors; t++) {
        const rf_tensor_info *ti = &fb.tensors[t];
        int inside = 0;
        for (int u = 0; u < U; u++) {
            size_t lo, hi;
            rf_model_unit_range(full, u, &lo, &hi);
            inside += ti->offset >= lo && ti->offset + ti->numel <= hi;
        }
        assert_int_equal(inside, 1);
    }
    batch x;
    make_batch(full, &x, packed);
    const float scale = 0.75f;
    bool train = in.task == RF_TASK_CLASSIFY; /* BERT's dropout sites cross the boundaries */

    /* the whole model, its events recorded */
    rec real = {.n = 0}, replay = {.n = 0};
    assert_int_equal(rf_model_set_hook(full, record, &real), 0);
    assert_int_equal(rf_model_zero_grad(full), 0);
    assert_int_equal(rf_model_forward(full, &x.b, train, 9), 0);
    assert_int_equal(rf_model_backward(full, scale), 0);
    assert_int_equal(rf_model_set_hook(full, NULL, NULL), 0);
    assert_int_equal(rf_model_set_hook(full, record, &replay), 0);
    assert_int_equal(rf_model_replay(full, 0, U, true), 0);
    assert_int_equal(rf_model_set_hook(full, NULL, NULL), 0);
    assert_int_equal(real.n, replay.n);
    assert_memory_equal(real.e, replay.e, (size_t)real.n * sizeof(ev));
    int bwd_done = 0, part = 0;
    for (int i = 0; i < real.n; i++) {
        bwd_done += real.e[i].ev == RF_UNIT_BWD_DONE;
        part += real.e[i].ev == RF_UNIT_BWD_PART;
    }
    assert_int_equal(bwd_done, U); /* every unit's gradient completes once */
    assert_int_equal(part, in.tied ? 1 : 0);
    float loss_full;
    long counted_full;
    assert_int_equal(rf_model_loss(full, &loss_full, &counted_full), 0);
    assert_true(counted_full > 0);
    const float *lf;
    size_t nl;
    logits_of(full, &lf, &nl, x.b.B, x.b.T);
    float *logits_full = malloc(nl * sizeof(float));
    memcpy(logits_full, lf, nl * sizeof(float));
    rf_model_blocks ab;

    size_t cap = (size_t)x.b.B * x.b.T * (size_t)in.hidden;
    float *act = malloc(cap * sizeof(float)), *dact = malloc(cap * sizeof(float));
    for (int cut = 1; cut < U; cut++) {
        size_t nb = rf_model_boundary(full, x.b.B, x.b.T, cut);
        assert_true(nb > 0 && nb <= cap);
        assert_int_equal(rf_model_zero_grad(a), 0);
        assert_int_equal(rf_model_blocks_of(a, &ab), 0);
        /* b's gradient views point into a's block: one gradient, two arenas */
        for (int u = 0; u < U; u++) {
            size_t lo, hi;
            rf_model_unit_range(b, u, &lo, &hi);
            assert_int_equal(rf_model_bind_unit(b, u, NULL, ab.grads + lo), 0);
        }
        assert_int_equal(rf_model_forward_range(a, &x.b, 0, cut, NULL, act, train, 9), 0);
        assert_int_equal(rf_model_forward_range(b, &x.b, cut, U, act, NULL, train, 9), 0);
        float loss;
        long counted;
        assert_int_equal(rf_model_loss(b, &loss, &counted), 0);
        assert_true(loss == loss_full);
        assert_int_equal(counted, counted_full);
        const float *lb;
        size_t nlb;
        logits_of(b, &lb, &nlb, x.b.B, x.b.T);
        assert_int_equal(nlb, nl);
        assert_memory_equal(lb, logits_full, nl * sizeof(float));
        assert_int_equal(rf_model_backward_range(b, cut, U, NULL, dact, scale), 0);
        assert_int_equal(rf_model_backward_range(a, 0, cut, dact, NULL, scale), 0);
        if (memcmp(ab.grads, fb.grads, fb.nparams * sizeof(float)) != 0) {
            for (size_t t = 0; t < fb.ntensors; t++) {
                const rf_tensor_info *ti = &fb.tensors[t];
                if (memcmp(ab.grads + ti->offset, fb.grads + ti->offset, ti->numel * 4))
                    print_message("%s: cut %d: gradient of %s differs\n", rel, cut, ti->name);
            }
            fail_msg("%s: split at unit %d is not bitwise the whole model", rel, cut);
        }
        assert_int_equal(rf_model_bind_all(b), 0);
    }
    print_message("%s%s: %d units, %d events, split at every boundary bitwise equal "
                  "(loss %.6f over %ld labels)\n",
                  rel, packed ? " (packed)" : "", U, real.n, loss_full, counted_full);
    /* a range without its boundary buffers is refused */
    assert_int_equal(rf_model_forward_range(b, &x.b, 1, U, NULL, NULL, train, 9), RF_ERR_INVALID);
    assert_int_equal(rf_model_forward_range(b, &x.b, 0, U + 1, NULL, NULL, train, 9), RF_ERR_RANGE);
    free(act);
    free(dact);
    free(logits_full);
    rf_model_free(full);
    rf_model_free(a);
    rf_model_free(b);
}

static void test_bert(void **state) {
    (void)state;
    check_model("trainer/tiny-bert", false);
}

static void test_gpt2(void **state) {
    (void)state;
    check_model("causal/tiny-gpt2-rand", false);
    check_model("causal/tiny-gpt2-rand", true);
}

static void test_llama_untied(void **state) {
    (void)state;
    check_model("causal/tiny-llama-rand", true);
}

static void test_llama_tied(void **state) {
    (void)state;
    check_model("causal/tiny-llama-tied", false);
    check_model("causal/tiny-llama-tied", true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bert),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama_untied),
        cmocka_unit_test(test_llama_tied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
