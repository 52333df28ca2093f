/* The causal LMs (GPT-2, Llama) on a backend that is not the CPU (issue 14),
 * checked on any machine: the test device "cpu-staged" (backend.h) has the
 * CPU backend's kernels under an identity of its own, so the models take their device paths
 * (weights read into host memory then to_device, the batch uploaded, the export through to_host,
 * every op through the slots) and the CPU-only paths refuse it. Since its kernels are the CPU's,
 * two full fine-tuning steps on it must equal the CPU backend's bit for bit, with a unit hook
 * (what ZeRO-2/3 drive) called with the same events on both; LoRA merging must refuse it with
 * RF_ERR_UNSUPPORTED and a message naming the CPU backend; inference with a key/value cache runs
 * on the test device cpu-guarded within round-off of the CPU's; a backend that lacks a causal
 * kernel is refused at load. (The CUDA backend's numbers: test_cuda_step.c; ZeRO-3 on the device
 * path under mpirun: causal_dp.test.sh; tensor parallelism: tp_staged.test.sh.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "parity_util.h"
#include "trainer/causal_infer.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/model_iface.h"
#include "trainer/optim.h"

static const rf_backend *staged; /* the test device cpu-staged */

static int setup(void **state) {
    (void)state;
    staged = rf_backend_cpu_staged();
    return 0;
}

static rf_model *load(const char *model, const rf_backend *be) {
    char *dir = fixture_path(model);
    rf_model *m;
    if (rf_model_load(dir, NULL, be, &m)) fail_msg("load %s on %s: %s", dir, be->name, rf_errmsg());
    free(dir);
    return m;
}

/* The unit events a model's hook saw (unit, event, prefetch hint). */
typedef struct trace {
    int n;
    int ev[4096][3];
} trace;

static int record(void *user, int u, rf_unit_event ev, int next) {
    trace *t = user;
    if (t->n == 4096) return RF_ERR_RANGE;
    t->ev[t->n][0] = u, t->ev[t->n][1] = (int)ev, t->ev[t->n][2] = next;
    t->n++;
    return RF_OK;
}

/* Two steps (forward, backward, clip, AdamW) on the CPU and on test-device,
 * each model with a recording unit hook: logits, loss, gradients, parameters
 * and moments bit for bit equal, and the same unit events on both; then the
 * device model's export (to_host) loads back on the CPU with its parameters. */
static void steps_equal(const char *model, const char *reffile) {
    char *refp = fixture_path(reffile);
    rf_st_file *ref;
    if (rf_st_open(refp, &ref)) fail_msg("%s", rf_errmsg());
    fx_batch fb = fx_causal_batch(ref, 3);
    size_t n = fb.n;
    rf_model_batch b = {
        .B = fb.B, .T = fb.T, .ids = fb.ids, .valid = fb.valid, .labels = fb.labels};
    rf_model *c = load(model, rf_backend_cpu()), *d = load(model, staged);
    rf_model_blocks cb, db;
    assert_int_equal(rf_model_blocks_of(c, &cb), 0);
    assert_int_equal(rf_model_enable_training(c, cb.nparams, cb.nparams), 0);
    assert_int_equal(rf_model_enable_training(d, cb.nparams, cb.nparams), 0);
    assert_int_equal(rf_model_blocks_of(c, &cb), 0);
    assert_int_equal(rf_model_blocks_of(d, &db), 0);
    assert_ptr_equal(db.be, staged);
    assert_int_equal(cb.nparams, db.nparams);
    size_t bytes = cb.nparams * sizeof(float);
    assert_memory_equal(cb.params, db.params, bytes);
    static trace tc, td;
    tc.n = td.n = 0;
    assert_int_equal(rf_model_set_hook(c, record, &tc), 0);
    assert_int_equal(rf_model_set_hook(d, record, &td), 0);
    for (long k = 0; k < 2; k++) {
        for (int i = 0; i < 2; i++) {
            rf_model *m = i ? d : c;
            assert_int_equal(rf_model_zero_grad(m), 0);
            assert_int_equal(rf_model_forward(m, &b, true, 0), 0);
            assert_int_equal(rf_model_backward(m, 1.0f), 0);
        }
        const float *lc, *ld;
        size_t row;
        float losc, losd;
        long kc, kd;
        assert_int_equal(rf_model_logits(c, &lc, &row), 0);
        assert_int_equal(rf_model_logits(d, &ld, &row), 0);
        assert_memory_equal(lc, ld, n * row * sizeof(float));
        assert_int_equal(rf_model_loss(c, &losc, &kc), 0);
        assert_int_equal(rf_model_loss(d, &losd, &kd), 0);
        assert_true(kc > 0);
        assert_int_equal(kc, kd);
        assert_memory_equal(&losc, &losd, sizeof losc);
        assert_memory_equal(cb.grads, db.grads, bytes);
        rf_adamw o = rf_adamw_defaults();
        o.lr = 1e-3f, o.weight_decay = 0.01f, o.clip_norm = 0.5f;
        float nc, nd;
        assert_int_equal(rf_optim_clip(&cb, o.clip_norm, &nc), 0);
        assert_int_equal(rf_optim_clip(&db, o.clip_norm, &nd), 0);
        assert_memory_equal(&nc, &nd, sizeof nc);
        assert_int_equal(rf_optim_adamw(&cb, &o, k, o.lr, 0, cb.nparams, cb.m, cb.v), 0);
        assert_int_equal(rf_optim_adamw(&db, &o, k, o.lr, 0, db.nparams, db.m, db.v), 0);
        assert_memory_equal(cb.params, db.params, bytes);
        assert_memory_equal(cb.m, db.m, bytes);
        assert_memory_equal(cb.v, db.v, bytes);
    }
    /* every unit's forward and backward events, twice, the same on both */
    assert_true(tc.n >= 2 * 2 * 3);
    assert_int_equal(tc.n, td.n);
    assert_memory_equal(tc.ev, td.ev, (size_t)tc.n * sizeof tc.ev[0]);
    assert_int_equal(rf_model_set_hook(d, NULL, NULL), 0);
    /* the device's export, read back on the CPU */
    char dir[] = "/tmp/rf_causal_dev_XXXXXX";
    assert_non_null(mkdtemp(dir));
    if (rf_model_save(d, dir)) fail_msg("save: %s", rf_errmsg());
    rf_model *back;
    if (rf_model_load(dir, NULL, rf_backend_cpu(), &back)) fail_msg("reload: %s", rf_errmsg());
    rf_model_blocks bb;
    assert_int_equal(rf_model_blocks_of(back, &bb), 0);
    assert_int_equal(bb.nparams, db.nparams);
    assert_memory_equal(bb.params, db.params, bytes);
    rf_model_free(back);
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir), unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir), unlink(p);
    rmdir(dir);
    rf_model_free(c);
    rf_model_free(d);
    rf_st_free(ref);
    fx_batch_free(&fb), free(refp);
}

static void test_gpt2_steps(void **state) {
    (void)state;
    steps_equal("../causal/tiny-gpt2-rand", "../causal/gpt2_rand_ref.safetensors");
}

static void test_llama_steps(void **state) {
    (void)state;
    steps_equal("../causal/tiny-llama-rand", "../causal/llama_rand_ref.safetensors");
    steps_equal("../causal/tiny-llama-tied", "../causal/llama_tied_ref.safetensors");
}

static void expect_refusal(int rc, const char *needle) {
    assert_int_equal(rc, RF_ERR_UNSUPPORTED);
    const char *msg = rf_errmsg();
    print_message("  refused: %s\n", msg);
    if (!strstr(msg, needle)) fail_msg("'%s' does not say '%s'", msg, needle);
}

/* What stays on the CPU refuses the device, each with its reason. */
static void test_refusals(void **state) {
    (void)state;
    rf_model *g = load("../causal/tiny-gpt2-rand", staged),
             *l = load("../causal/tiny-llama-rand", staged);
    rf_gpt2 *gm = g->impl;
    rf_llama *lm = l->impl;
    rf_lora_config lc = rf_lora_defaults();
    lc.rank = 2, lc.alpha = 4;
    lc.targets = RF_LORA_Q | RF_LORA_K | RF_LORA_V | RF_LORA_O | RF_LORA_UP | RF_LORA_DOWN;
    rf_lora *lo;
    /* LoRA trains on the device (test_lora_device.c); merging stays on the CPU */
    assert_int_equal(rf_lora_new_gpt2(gm, &lc, 1, &lo), 0);
    expect_refusal(rf_lora_merge_gpt2(lo, gm), "gpt2: LoRA merging runs on the CPU backend only");
    rf_lora_free(lo);
    assert_int_equal(rf_lora_new_llama(lm, &lc, 1, &lo), 0);
    expect_refusal(rf_lora_merge_llama(lo, lm), "llama: LoRA merging runs on the CPU backend only");
    rf_lora_free(lo);
    rf_model_free(g);
    rf_model_free(l);
}

/* The causal model's one state (rf_causal_model) of a loaded rf_model. */
static rf_causal_model causal_of(rf_model *m) {
    return strcmp(m->ops->name, "gpt2") ? (rf_causal_model){.llama = m->impl}
                                        : (rf_causal_model){.gpt2 = m->impl};
}

/* Inference with a key/value cache on a device (causal_infer.c's slot
 * path) against the CPU's (its own fast path: direct sgemm, a RoPE table):
 * on cpu-guarded, whose memory host code cannot touch, a 7-token prompt in
 * chunks of 5 (a split prefill), then 4 tokens one at a time, the hidden
 * states and logits of every step within 1e-5 of the CPU's (round-off: the
 * two paths cut their products differently); then the cache reset and a
 * prompt again. GPT-2, Llama (grouped-query heads) and the tied Llama. */
static void test_infer_device(void **state) {
    (void)state;
    const rf_backend *guarded = rf_backend_cpu_guarded();
    static const char *const models[] = {"../causal/tiny-gpt2-rand", "../causal/tiny-llama-rand",
                                         "../causal/tiny-llama-tied"};
    static const int32_t ids[] = {5, 17, 9, 33, 2, 41, 8, 60, 12, 7, 29};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        rf_model *c = load(models[k], rf_backend_cpu()), *g = load(models[k], guarded);
        rf_causal_model cc = causal_of(c), cg = causal_of(g);
        rf_infer *sc, *sg;
        assert_int_equal(rf_infer_new(&cc, 16, 5, &sc), RF_OK);
        assert_int_equal(rf_infer_new(&cg, 16, 5, &sg), RF_OK);
        const rf_causal_dims *d = rf_infer_dims(sc);
        float *hc = malloc(sizeof(float) * 7 * d->C), *hg = malloc(sizeof(float) * 7 * d->C),
              *lc = malloc(sizeof(float) * 7 * d->vocab),
              *lg = malloc(sizeof(float) * 7 * d->vocab);
        double worst_h = 0, worst_l = 0;
        for (int round = 0; round < 2; round++) {
            for (int at = 0; at < 11;) {
                int n = at == 0 ? 7 : 1;
                assert_int_equal(rf_infer_forward(sc, ids + at, n, hc), RF_OK);
                assert_int_equal(rf_infer_forward(sg, ids + at, n, hg), RF_OK);
                assert_int_equal(rf_infer_logits(sc, hc, n, lc), RF_OK);
                assert_int_equal(rf_infer_logits(sg, hg, n, lg), RF_OK);
                double eh = rel_err_floor(hg, hc, (size_t)n * d->C, 1e-6),
                       el = rel_err_floor(lg, lc, (size_t)n * d->vocab, 1e-6);
                worst_h = eh > worst_h ? eh : worst_h, worst_l = el > worst_l ? el : worst_l;
                at += n;
            }
            assert_int_equal(rf_infer_len(sg), 11);
            rf_infer_reset(sc), rf_infer_reset(sg);
        }
        print_message("%s: inference on %s vs the CPU: hidden %.2e, logits %.2e\n", models[k],
                      guarded->name, worst_h, worst_l);
        if (!(worst_h <= 1e-5 && worst_l <= 1e-5))
            fail_msg("%s: device inference off the CPU's (%.3e, %.3e)", models[k], worst_h,
                     worst_l);
        free(hc), free(hg), free(lc), free(lg);
        rf_infer_free(sc), rf_infer_free(sg);
        rf_model_free(c), rf_model_free(g);
    }
    /* a backend without kv_attention_fwd cannot generate: refused, naming it */
    rf_backend bare = *staged;
    bare.name = "bare-device";
    bare.kv_attention_fwd = NULL;
    rf_model *m = load("../causal/tiny-gpt2-rand", staged);
    rf_gpt2 *gm = m->impl;
    const rf_backend *was = gm->be;
    gm->be = &bare; /* the state reads the backend from the model */
    rf_infer *s;
    expect_refusal(rf_infer_new(&(rf_causal_model){.gpt2 = gm}, 8, 8, &s), "kv_attention_fwd");
    gm->be = was;
    rf_model_free(m);
}

/* A backend without the causal kernels (a device built before them) is
 * refused at load with the missing slot's name, never called. */
static void test_missing_kernels(void **state) {
    (void)state;
    rf_backend bare = *staged;
    bare.name = "bare-device";
    /* a quantized LoRA base needs qlinear: refused at attach, the model untouched */
    bare.qlinear_bwd = NULL;
    rf_model *g = load("../causal/tiny-gpt2-rand", &bare);
    rf_lora_config lc = rf_lora_defaults();
    lc.rank = 2, lc.alpha = 4, lc.base = RF_QT_INT8;
    lc.targets = RF_LORA_Q | RF_LORA_K | RF_LORA_V;
    rf_lora *lo;
    assert_int_equal(rf_lora_new_gpt2(g->impl, &lc, 1, &lo), 0);
    expect_refusal(rf_lora_attach_gpt2(lo, g->impl), "has no 'qlinear_bwd' kernel");
    assert_null(((rf_gpt2 *)g->impl)->lora);
    rf_lora_free(lo);
    bare.lora_fwd = NULL; /* any LoRA needs lora_fwd */
    lc.base = RF_QT_F32;
    assert_int_equal(rf_lora_new_gpt2(g->impl, &lc, 1, &lo), 0);
    expect_refusal(rf_lora_attach_gpt2(lo, g->impl), "has no 'lora_fwd' kernel");
    rf_lora_free(lo);
    rf_model_free(g);
    char *dir = fixture_path("../causal/tiny-llama-rand");
    rf_model *m = NULL;
    bare.copy2d = NULL; /* Llama's backward passes v's columns with it */
    expect_refusal(rf_model_load(dir, NULL, &bare, &m), "has no 'copy2d' kernel");
    assert_null(m);
    bare.rope_bwd = NULL;
    expect_refusal(rf_model_load(dir, NULL, &bare, &m), "has no 'rope_bwd' kernel");
    assert_null(m);
    free(dir);
    bare.conv1d_fwd = NULL;
    dir = fixture_path("../causal/tiny-gpt2-rand");
    expect_refusal(rf_model_load(dir, NULL, &bare, &m), "has no 'conv1d_fwd' kernel");
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_steps),      cmocka_unit_test(test_llama_steps),
        cmocka_unit_test(test_refusals),        cmocka_unit_test(test_infer_device),
        cmocka_unit_test(test_missing_kernels),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
