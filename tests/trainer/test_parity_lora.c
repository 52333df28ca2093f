/* Parity of LoRA and QLoRA (lora.h, quant.h) with peft + bitsandbytes
 * (fixtures from scripts/parity/lora_fixtures.py, CPU, eager attention, no
 * dropout). On the random tiny GPT-2 and Llama of tests/fixtures/causal/, an
 * adapter of rank 4, alpha 12 on every projection, loaded from peft's own
 * adapter files: logits and loss within 1e-5, every LoRA gradient within 1e-4,
 * every LoRA weight after 3 AdamW steps of the adapter alone within 1e-5
 * (norm-wise relative errors, the tolerances of the other causal parity
 * tests). QLoRA: the same over the base as transformers + bitsandbytes load it
 * in 4 bits (NF4, double quantization), the C side using bitsandbytes' own
 * quantized state. The quantizers: NF4 and int8 codes and dequantization
 * against bitsandbytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/error.h"
#include "parity_causal.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/quant.h"

static const uint8_t *fx_bytes(const rf_st_file *f, const char *name, size_t *n) {
    const rf_st_tensor *t = rf_st_find(f, name);
    if (!t || t->dtype != RF_ST_U8) fail_msg("fixture lacks U8 tensor '%s'", name);
    *n = t->nbytes;
    return t->data;
}

static float fx_scalar(const rf_st_file *f, const char *name) {
    float *x = fx_get(f, name, NULL), v = x[0];
    free(x);
    return v;
}

/* ---- the quantizers against bitsandbytes ---- */

static void test_quantizers(void **state) {
    (void)state;
    char *path = root_path("tests/fixtures/lora/quant_ref.safetensors");
    rf_st_file *f;
    if (rf_st_open(path, &f)) fail_msg("%s", rf_errmsg());
    size_t n;
    float *code = fx_get(f, "dynamic_code", &n);
    assert_int_equal(n, 256);
    assert_memory_equal(code, rf_dynamic_code, sizeof(float) * 256);
    free(code);
    const char *keys[] = {"a", "b"};
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "w.%s", keys[k]);
        const rf_st_tensor *t = rf_st_find(f, name);
        assert_non_null(t);
        int R = (int)t->shape[0], K = (int)t->shape[1];
        float *w = fx_get(f, name, NULL);
        rf_qweight q, b;
        assert_int_equal(rf_qweight_quantize(&q, RF_QT_NF4, w, R, K), RF_OK);
        /* the 4-bit level is bitsandbytes' own kernel's, bit for bit */
        size_t np, nqa;
        snprintf(name, sizeof name, "bnb.packed.%s", keys[k]);
        const uint8_t *packed = fx_bytes(f, name, &np);
        assert_int_equal(np, ((size_t)R * K + 1) / 2);
        assert_memory_equal(q.q, packed, np);
        /* the nested level: bitsandbytes' reference rule, bit for bit */
        snprintf(name, sizeof name, "ref.qabsmax.%s", keys[k]);
        const uint8_t *rq = fx_bytes(f, name, &nqa);
        assert_int_equal(nqa, q.nblocks);
        assert_memory_equal(q.qabsmax, rq, nqa);
        snprintf(name, sizeof name, "ref.absmax2.%s", keys[k]);
        float *ra2 = fx_get(f, name, &n);
        assert_int_equal(n, q.ngroups);
        assert_memory_equal(q.scale, ra2, sizeof(float) * n);
        snprintf(name, sizeof name, "ref.offset.%s", keys[k]);
        assert_true(q.offset == fx_scalar(f, name));
        /* against bitsandbytes' CPU kernel for the nested step: count */
        snprintf(name, sizeof name, "bnb.qabsmax.%s", keys[k]);
        const uint8_t *bq = fx_bytes(f, name, &nqa);
        size_t differ = 0;
        for (size_t i = 0; i < nqa; i++)
            differ += bq[i] != q.qabsmax[i];
        snprintf(name, sizeof name, "bnb.offset.%s", keys[k]);
        float boff = fx_scalar(f, name);
        /* dequantizing bitsandbytes' own state gives its dequantization, bit for bit */
        snprintf(name, sizeof name, "bnb.absmax2.%s", keys[k]);
        float *ba2 = fx_get(f, name, &n);
        assert_int_equal(rf_qweight_from_nf4(&b, R, K, packed, np, bq, nqa, ba2, n, boff), RF_OK);
        float *deq = malloc(sizeof(float) * R * K), *mine = malloc(sizeof(float) * R * K);
        snprintf(name, sizeof name, "bnb.deq.%s", keys[k]);
        float *bdeq = fx_get(f, name, NULL);
        rf_qweight_dequant(&b, deq);
        assert_memory_equal(deq, bdeq, sizeof(float) * R * K);
        rf_qweight_dequant(&q, mine);
        printf("  nf4 [%d, %d]: codes, dequantization of bitsandbytes' state bitwise; nested "
               "codes of its CPU kernel off the reference rule: %zu of %zu (offset %.9g vs "
               "%.9g); our dequantized weights vs its: %.3g\n",
               R, K, differ, nqa, q.offset, boff, rel_err(mine, bdeq, (size_t)R * K));
        assert_true(differ * 100 <= nqa); /* a layout error would differ nearly everywhere */
        rf_qweight_free(&q), rf_qweight_free(&b);
        free(w), free(ra2), free(ba2), free(deq), free(mine), free(bdeq);
    }
    /* int8: codes, row absmaxes and dequantization bit for bit */
    const rf_st_tensor *t = rf_st_find(f, "w.int8");
    int R = (int)t->shape[0], K = (int)t->shape[1];
    float *w = fx_get(f, "w.int8", NULL), *cb = fx_get(f, "int8.CB", NULL),
          *scb = fx_get(f, "int8.SCB", NULL), *deq = fx_get(f, "int8.deq", NULL),
          *mine = malloc(sizeof(float) * R * K);
    rf_qweight q;
    assert_int_equal(rf_qweight_quantize(&q, RF_QT_INT8, w, R, K), RF_OK);
    for (int i = 0; i < R * K; i++)
        assert_int_equal((int8_t)q.q[i], (int)cb[i]);
    assert_memory_equal(q.scale, scb, sizeof(float) * R);
    rf_qweight_dequant(&q, mine);
    assert_memory_equal(mine, deq, sizeof(float) * R * K);
    printf("  int8 [%d, %d]: codes, row absmaxes and dequantization bitwise\n", R, K);
    rf_qweight_free(&q);
    free(w), free(cb), free(scb), free(deq), free(mine);
    rf_st_free(f);
    free(path);
}

/* ---- the models ---- */

typedef struct lm {
    bool llama;
    rf_gpt2 *g;
    rf_llama *l;
} lm;

/* bitsandbytes' state of every Linear4bit into the adapter set's base. */
static void import_nf4(rf_lora *lo, const rf_st_file *ref) {
    int n = 0;
    for (int i = 0; i < lo->nlayers * RF_NPROJ; i++)
        for (int j = 0; j < lo->proj[i].nparts; j++) {
            const rf_lora_part *p = &lo->proj[i].part[j];
            char key[160];
            size_t np, nb, ng;
            snprintf(key, sizeof key, "nf4.%s.shape", p->module);
            float *shape = fx_get(ref, key, NULL);
            snprintf(key, sizeof key, "nf4.%s.packed", p->module);
            const uint8_t *packed = fx_bytes(ref, key, &np);
            snprintf(key, sizeof key, "nf4.%s.qabsmax", p->module);
            const uint8_t *qa = fx_bytes(ref, key, &nb);
            snprintf(key, sizeof key, "nf4.%s.absmax2", p->module);
            float *a2 = fx_get(ref, key, &ng);
            snprintf(key, sizeof key, "nf4.%s.offset", p->module);
            rf_qweight q;
            assert_int_equal(rf_qweight_from_nf4(&q, (int)shape[0], (int)shape[1], packed, np, qa,
                                                 nb, a2, ng, fx_scalar(ref, key)),
                             RF_OK);
            if (rf_lora_set_base(lo, i / RF_NPROJ, i % RF_NPROJ, j, &q))
                fail_msg("%s", rf_errmsg());
            free(shape), free(a2);
            n++;
        }
    printf("  %d Linear4bit states of bitsandbytes loaded (%zu bytes)\n", n, lo->qbytes);
}

static void run(bool llama, bool qlora) {
    const char *arch = llama ? "llama" : "gpt2";
    char rel[200];
    snprintf(rel, sizeof rel, "tests/fixtures/causal/tiny-%s-rand", arch);
    char *dir = root_path(rel);
    snprintf(rel, sizeof rel, "tests/fixtures/lora/%s_lora", arch);
    char *adapter = root_path(rel);
    snprintf(rel, sizeof rel, "tests/fixtures/lora/%s_%s_ref.safetensors", arch,
             qlora ? "qlora" : "lora");
    char *refp = root_path(rel);
    lm m = {.llama = llama};
    if (llama ? rf_llama_load(dir, &m.l) : rf_gpt2_load(dir, &m.g))
        fail_msg("load %s: %s", dir, rf_errmsg());
    rf_lora_config c = {.rank = 4,
                        .alpha = 12,
                        .dropout = 0,
                        .targets = RF_LORA_Q | RF_LORA_K | RF_LORA_V | RF_LORA_O | RF_LORA_UP |
                                   RF_LORA_DOWN | (llama ? RF_LORA_GATE : 0),
                        .base = qlora ? RF_QT_NF4 : RF_QT_F32};
    rf_lora *lo;
    int rc = llama ? rf_lora_new_llama(m.l, &c, 1, &lo) : rf_lora_new_gpt2(m.g, &c, 1, &lo);
    if (rc || (rc = rf_lora_load_peft(lo, adapter))) fail_msg("%s", rf_errmsg());
    rf_st_file *ref;
    if (rf_st_open(refp, &ref)) fail_msg("%s", rf_errmsg());
    if (qlora) import_nf4(lo, ref);
    rc = llama ? rf_lora_attach_llama(lo, m.l, false) : rf_lora_attach_gpt2(lo, m.g);
    if (rc) fail_msg("attach: %s", rf_errmsg());
    assert_int_equal(llama ? rf_llama_enable_training(m.l) : rf_gpt2_enable_training(m.g), 0);
    assert_int_equal(rf_lora_enable_training(lo), 0);

    fx_batch fb = fx_causal_batch(ref, 3);
    size_t n = fb.n;
    rf_causal_batch b = {
        .B = fb.B, .T = fb.T, .ids = fb.ids, .valid = fb.valid, .labels = fb.labels};
    int V = llama ? m.l->cfg.vocab_size : m.g->cfg.vocab_size;
    float loss = 0, *logits = NULL;
    for (long step = 0; step < 3; step++) {
        rf_lora_zero_grad(lo);
        rc = llama ? rf_llama_forward(m.l, &b) : rf_gpt2_forward(m.g, &b);
        if (!rc) rc = llama ? rf_llama_backward(m.l, 1.0f) : rf_gpt2_backward(m.g, 1.0f);
        if (rc) fail_msg("%s", rf_errmsg());
        if (step == 0) {
            logits = llama ? m.l->logits : m.g->logits;
            loss = llama ? m.l->loss : m.g->loss;
            float *rl = fx_get(ref, "out.loss", NULL);
            double el = compare(ref, "out.logits", logits, n * V),
                   eloss = fabs(loss - rl[0]) / fabs(rl[0]);
            printf("%s %s: logits rel err %.3g, loss rel err %.3g (%.7f vs %.7f)\n", arch,
                   qlora ? "QLoRA (nf4)" : "LoRA", el, eloss, loss, rl[0]);
            free(rl);
            assert_true(el <= LOGIT_TOL && eloss <= LOGIT_TOL);
            double worst = 0;
            const char *wn = "";
            for (size_t t = 0; t < lo->ntensors; t++) {
                char name[160];
                snprintf(name, sizeof name, "grad.%s", lo->tensors[t].name);
                double e =
                    compare(ref, name, lo->grads + lo->tensors[t].offset, lo->tensors[t].numel);
                if (e > GRAD_TOL) printf("  %s: rel err %.3g\n", name, e);
                if (e > worst) worst = e, wn = lo->tensors[t].name;
            }
            printf("  worst LoRA gradient rel err %.3g (%s), %zu tensors\n", worst, wn,
                   lo->ntensors);
            assert_true(worst <= GRAD_TOL);
        }
        rf_adamw o = causal_fixture_adamw();
        rf_lora_adamw_step(lo, &o, step);
    }
    double worst = 0;
    const char *wn = "";
    size_t left_out = 0;
    for (size_t t = 0; t < lo->ntensors; t++) {
        char name[160], gname[160];
        snprintf(name, sizeof name, "after.3.%s", lo->tensors[t].name);
        snprintf(gname, sizeof gname, "grad.%s", lo->tensors[t].name);
        double e = weight_err(ref, name, gname, lo->params + lo->tensors[t].offset,
                              lo->tensors[t].numel, &left_out);
        if (e > WEIGHT_TOL) printf("  %s: rel err %.3g\n", name, e);
        if (e > worst) worst = e, wn = lo->tensors[t].name;
    }
    printf("  after 3 AdamW steps: worst LoRA weight rel err %.3g (%s), %zu elements with a "
           "step-0 gradient below 1e-7 left out\n",
           worst, wn, left_out);
    assert_true(worst <= WEIGHT_TOL);
    fx_batch_free(&fb);
    rf_st_free(ref);
    rf_lora_free(lo);
    rf_gpt2_free(m.g), rf_llama_free(m.l);
    free(dir), free(adapter), free(refp);
}

static void test_gpt2_lora(void **state) {
    (void)state;
    run(false, false);
}
static void test_llama_lora(void **state) {
    (void)state;
    run(true, false);
}
static void test_gpt2_qlora(void **state) {
    (void)state;
    run(false, true);
}
static void test_llama_qlora(void **state) {
    (void)state;
    run(true, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantizers),  cmocka_unit_test(test_gpt2_lora),
        cmocka_unit_test(test_llama_lora),  cmocka_unit_test(test_gpt2_qlora),
        cmocka_unit_test(test_llama_qlora),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
