/* Parity with PyTorch on a tiny random BertForSequenceClassification
 * (fixtures from scripts/parity/trainer_fixtures.py): logits, loss and every
 * parameter's gradient within relative error 1e-4, every parameter after 3
 * AdamW steps (warmup/decay schedule, clipping) within 1e-5. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "parity_util.h"
#include "trainer/model.h"
#include "trainer/optim.h"

static void test_tiny_parity(void **state) {
    char *dir = fixture_path("tiny-bert"), *ref_path = fixture_path("tiny_ref.safetensors");
    rf_bert *m;
    int rc = rf_bert_load(dir, 0, 1, rf_backend_cpu(), &m);
    if (rc) fail_msg("load: %s", rf_errmsg());
    assert_int_equal(m->cfg.num_labels, 3);
    rf_st_file *ref;
    if (rf_st_open(ref_path, &ref)) fail_msg("%s", rf_errmsg());
    size_t n, nl;
    int32_t *ids = fx_ints(ref, "in.ids", &n), *types = fx_ints(ref, "in.types", NULL),
            *mask = fx_ints(ref, "in.mask", NULL), *labels = fx_ints(ref, "in.labels", &nl);
    uint8_t *valid = malloc(n);
    for (size_t i = 0; i < n; i++)
        valid[i] = (uint8_t)mask[i];
    rf_batch b = {(int)nl, (int)(n / nl), ids, types, labels, valid};
    assert_int_equal(rf_bert_enable_training(m), 0);

    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-3f;
    o.weight_decay = 0.01f;
    o.warmup_steps = 1;
    o.total_steps = 4;
    o.clip_norm = 1.0f;
    double worst_grad = 0, worst_w = 0;
    for (long step = 0; step < 3; step++) {
        rf_bert_zero_grad(m);
        assert_int_equal(rf_bert_forward(m, &b, true, 0), 0);
        rf_bert_backward(m, 1.0f);
        if (step == 0) {
            size_t k;
            float *logits = fx_get(ref, "out.logits", &k), *loss = fx_get(ref, "out.loss", NULL);
            double el = rel_err(m->logits, logits, k), eloss = rel_err(&m->loss, loss, 1);
            printf("logits rel err %.3g, loss rel err %.3g (loss %.6f vs %.6f)\n", el, eloss,
                   m->loss, loss[0]);
            assert_true(el <= 1e-4);
            assert_true(eloss <= 1e-4);
            for (size_t t = 0; t < m->ntensors; t++) {
                char name[128];
                snprintf(name, sizeof name, "grad.%s", m->tensors[t].name);
                float *g = fx_get(ref, name, &k);
                assert_int_equal(k, m->tensors[t].numel);
                double e = rel_err_floor(m->grads + m->tensors[t].offset, g, k,
                                         grad_scale_floor(ref, name));
                if (e > worst_grad) worst_grad = e;
                if (e > 1e-4) fail_msg("%s: gradient rel err %.3g", m->tensors[t].name, e);
                free(g);
            }
            free(logits);
            free(loss);
        }
        rf_clip_grads(m, o.clip_norm);
        rf_adamw_step(m, &o, step, rf_adamw_lr(&o, step));
    }
    for (size_t t = 0; t < m->ntensors; t++) {
        char name[128];
        size_t k;
        snprintf(name, sizeof name, "step3.%s", m->tensors[t].name);
        float *w = fx_get(ref, name, &k);
        double e = rel_err(m->params + m->tensors[t].offset, w, k);
        if (e > worst_w) worst_w = e;
        if (e > 1e-5) fail_msg("%s: weight after 3 AdamW steps rel err %.3g", name, e);
        free(w);
    }
    printf("worst gradient rel err %.3g over %zu tensors; worst post-AdamW weight rel err %.3g\n",
           worst_grad, m->ntensors, worst_w);
    free(ids), free(types), free(mask), free(labels), free(valid);
    rf_st_free(ref);
    rf_bert_free(m);
    free(dir), free(ref_path);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny_parity)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
