/* LoRA and QLoRA through the backend table (issue 14), checked on any
 * machine: on the test device "cpu-staged" (backend.h: the CPU's kernels under
 * an identity of its own) the adapter set takes its device paths (its block
 * and activations from be->alloc, the quantized bases moved into the
 * backend's memory at attach, every product through the lora / qlinear /
 * conv1d / linear slots, the PEFT files through to_host / to_device). Its
 * kernels being the CPU's, two steps (forward, backward, clipping, AdamW) of
 * the tiny random GPT-2 and Llama on every base (fp32, int8, nf4, q4_1) must
 * equal the CPU backend's bit for bit: loss, adapter gradients, parameters and
 * moments, and the saved PEFT adapter byte for byte. (The CUDA kernels of the
 * new slots: test_cuda_ops.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "parity_util.h"
#include "trainer/gpt2.h"
#include "trainer/llama.h"
#include "trainer/lora.h"
#include "trainer/model_iface.h"
#include "trainer/optim.h"

static const rf_backend *staged;

static int setup(void **state) {
    (void)state;
    staged = rf_backend_cpu_staged();
    return 0;
}

/* A fixed batch of 2 rows of 12 tokens (vocabulary 64), the second row padded. */
enum { BB = 2, TT = 12 };
static int32_t ids[BB * TT], labels[BB * TT];
static uint8_t valid[BB * TT];
static const rf_model_batch batch = {
    .B = BB, .T = TT, .ids = ids, .valid = valid, .labels = labels};

static void make_batch(void) {
    for (int i = 0; i < BB * TT; i++) {
        ids[i] = (int32_t)((i * 37 + 11) % 64);
        valid[i] = i < TT + 9;
        labels[i] = valid[i] ? ids[i] : -100;
    }
}

static rf_model *load(const char *model, const rf_backend *be) {
    char *dir = fixture_path(model);
    rf_model *m;
    if (rf_model_load(dir, NULL, be, &m)) fail_msg("load %s on %s: %s", dir, be->name, rf_errmsg());
    free(dir);
    return m;
}

/* A random Llama whose projections all take a multiple of 32 inputs (Q4_1
 * rows), the same weights on either backend. */
static rf_model *q4_llama(const rf_backend *be) {
    rf_llama_config c = {.vocab_size = 64,
                         .hidden_size = 32,
                         .intermediate_size = 64,
                         .num_hidden_layers = 2,
                         .num_attention_heads = 4,
                         .num_key_value_heads = 2,
                         .head_dim = 8,
                         .max_position_embeddings = 32,
                         .rms_norm_eps = 1e-6f,
                         .rope_theta = 10000};
    rf_llama *l;
    assert_int_equal(rf_llama_new_on(&c, be, &l), 0);
    float *w = malloc(l->nparams * sizeof(float));
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < l->nparams; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.6f;
    }
    for (size_t t = 0; t < l->ntensors; t++) /* norms near 1 */
        if (l->tensors[t].ndim == 1)
            for (size_t i = 0; i < l->tensors[t].numel; i++)
                w[l->tensors[t].offset + i] += 1.0f;
    assert_int_equal(rf_llama_adopt_params(l, w), 0);
    free(w);
    rf_model *m = calloc(1, sizeof *m);
    rf_model_init_llama(m, l);
    m->owns = m->heap = true;
    return m;
}

static void host_copy(const rf_lora *lo, const float *src, float *dst, size_t n) {
    assert_int_equal(lo->be->to_host(lo->be, dst, src, n * sizeof(float)), 0);
}

/* Both adapter blocks (params, grads, m, v) equal bit for bit. */
static void blocks_equal(const rf_lora *c, const rf_lora *d, bool training) {
    size_t n = c->nparams;
    assert_int_equal(n, d->nparams);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    const float *const cs[4] = {c->params, c->grads, c->m, c->v};
    const float *const ds[4] = {d->params, d->grads, d->m, d->v};
    for (int k = 0; k < (training ? 4 : 1); k++) {
        host_copy(c, cs[k], a, n);
        host_copy(d, ds[k], b, n);
        if (memcmp(a, b, n * sizeof(float))) fail_msg("adapter block %d differs", k);
    }
    free(a), free(b);
}

static void files_equal(const char *d1, const char *d2, const char *name) {
    char p1[4200], p2[4200];
    snprintf(p1, sizeof p1, "%s/%s", d1, name);
    snprintf(p2, sizeof p2, "%s/%s", d2, name);
    char *t1, *t2;
    size_t n1, n2;
    assert_int_equal(rf_read_file(p1, 1 << 24, &t1, &n1), 0);
    assert_int_equal(rf_read_file(p2, 1 << 24, &t2, &n2), 0);
    assert_int_equal(n1, n2);
    assert_memory_equal(t1, t2, n1);
    free(t1), free(t2);
}

static void rm_peft(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/adapter_config.json", dir), unlink(p);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir), unlink(p);
    rmdir(dir);
}

/* Two LoRA steps of the same model and adapter set on the CPU and on the
 * test device, compared at every stage; then the PEFT files. */
static void lora_steps(rf_model *c, rf_model *d, bool llama, rf_qtype base, float dropout) {
    rf_lora_config lc = rf_lora_defaults();
    lc.rank = 4, lc.alpha = 8, lc.dropout = dropout, lc.base = base;
    lc.targets = RF_LORA_Q | RF_LORA_K | RF_LORA_V | RF_LORA_O | RF_LORA_UP | RF_LORA_DOWN |
                 (llama ? RF_LORA_GATE : 0);
    rf_lora *lo[2];
    rf_model *m[2] = {c, d};
    for (int i = 0; i < 2; i++) {
        int rc = llama ? rf_lora_new_llama(m[i]->impl, &lc, 7, &lo[i])
                       : rf_lora_new_gpt2(m[i]->impl, &lc, 7, &lo[i]);
        if (!rc)
            rc = llama ? rf_lora_attach_llama(lo[i], m[i]->impl, base == RF_QT_Q4_1)
                       : rf_lora_attach_gpt2(lo[i], m[i]->impl);
        if (rc) fail_msg("lora on %s: %s", i ? "cpu-staged" : "cpu", rf_errmsg());
        assert_int_equal(rf_lora_enable_training(lo[i]), 0);
        assert_int_equal(rf_model_enable_training(m[i], 0, 0), 0);
    }
    assert_ptr_equal(lo[1]->be, staged);
    assert_int_equal(lo[0]->qbytes, lo[1]->qbytes);
    if (base != RF_QT_F32) { /* the device's quantized bases live in its memory */
        assert_false(lo[0]->proj[0].part[0].qdev);
        assert_true(lo[1]->proj[0].part[0].qdev);
    }
    blocks_equal(lo[0], lo[1], true);
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-2f, o.weight_decay = 0.01f, o.clip_norm = 0.5f;
    for (long k = 0; k < 2; k++) {
        float loss[2], norm[2];
        long counted[2];
        for (int i = 0; i < 2; i++) {
            assert_int_equal(rf_lora_zero_grad(lo[i]), 0);
            lo[i]->train = dropout > 0, lo[i]->seed = 100 + (uint64_t)k;
            assert_int_equal(rf_model_forward(m[i], &batch, dropout > 0, 100 + (uint64_t)k), 0);
            assert_int_equal(rf_model_backward(m[i], 1.0f), 0);
            assert_int_equal(rf_model_loss(m[i], &loss[i], &counted[i]), 0);
        }
        assert_true(counted[0] > 0);
        assert_int_equal(counted[0], counted[1]);
        assert_memory_equal(&loss[0], &loss[1], sizeof(float));
        blocks_equal(lo[0], lo[1], true); /* the gradients (and the unchanged rest) */
        for (int i = 0; i < 2; i++)
            norm[i] = rf_lora_adamw_step(lo[i], &o, k);
        assert_true(norm[0] > 0);
        assert_memory_equal(&norm[0], &norm[1], sizeof(float));
        blocks_equal(lo[0], lo[1], true);
        print_message("  %s %s%s step %ld: loss %.6f, |g| %.6f (equal)\n", llama ? "llama" : "gpt2",
                      rf_lora_base_name(base), dropout > 0 ? " dropout" : "", k, (double)loss[0],
                      (double)norm[0]);
    }
    /* the PEFT adapter: the device's (to_host) is the CPU's, byte for byte */
    char d0[] = "/tmp/rf_lora_dev_c_XXXXXX", d1[] = "/tmp/rf_lora_dev_d_XXXXXX";
    assert_non_null(mkdtemp(d0));
    assert_non_null(mkdtemp(d1));
    assert_int_equal(rf_lora_save_peft(lo[0], d0, "tiny"), 0);
    assert_int_equal(rf_lora_save_peft(lo[1], d1, "tiny"), 0);
    files_equal(d0, d1, "adapter_config.json");
    files_equal(d0, d1, "adapter_model.safetensors");
    /* and it loads back into the device's set (to_device) */
    assert_int_equal(staged->zero(staged, lo[1]->params, lo[1]->nparams * sizeof(float)), 0);
    if (rf_lora_load_peft(lo[1], d0)) fail_msg("load_peft on cpu-staged: %s", rf_errmsg());
    blocks_equal(lo[0], lo[1], false);
    rm_peft(d0), rm_peft(d1);
    rf_model_free(c), rf_model_free(d); /* before the sets the models point to */
    rf_lora_free(lo[0]), rf_lora_free(lo[1]);
}

static void test_gpt2(void **state) {
    (void)state;
    const char *g = "../causal/tiny-gpt2-rand";
    lora_steps(load(g, rf_backend_cpu()), load(g, staged), false, RF_QT_F32, 0);
    lora_steps(load(g, rf_backend_cpu()), load(g, staged), false, RF_QT_F32, 0.1f);
    lora_steps(load(g, rf_backend_cpu()), load(g, staged), false, RF_QT_INT8, 0);
    lora_steps(load(g, rf_backend_cpu()), load(g, staged), false, RF_QT_NF4, 0.1f);
}

static void test_llama(void **state) {
    (void)state;
    const char *l = "../causal/tiny-llama-rand";
    lora_steps(load(l, rf_backend_cpu()), load(l, staged), true, RF_QT_F32, 0);
    lora_steps(load(l, rf_backend_cpu()), load(l, staged), true, RF_QT_INT8, 0.1f);
    lora_steps(load(l, rf_backend_cpu()), load(l, staged), true, RF_QT_NF4, 0);
    lora_steps(q4_llama(rf_backend_cpu()), q4_llama(staged), true, RF_QT_Q4_1, 0);
    lora_steps(q4_llama(rf_backend_cpu()), q4_llama(staged), true, RF_QT_Q4_1, 0.1f);
}

/* The model interface the driver uses (rf_model_load_lora with a backend),
 * from a Hugging Face folder or a GGUF file (lora_gguf.c: the model's
 * tensors dequantized on the host then to_device, the bases moved at
 * attach): its blocks are the device's, two steps through rf_optim equal
 * the CPU's, and the export is the same PEFT adapter. */
static void iface_steps(const char *model, rf_qtype base, float dropout) {
    char *dir = fixture_path(model);
    rf_lora_config lc = rf_lora_defaults();
    lc.rank = 2, lc.alpha = 4, lc.base = base, lc.dropout = dropout;
    lc.targets = RF_LORA_Q | RF_LORA_V | RF_LORA_GATE | RF_LORA_DOWN;
    rf_model *m[2];
    const rf_backend *bes[2] = {rf_backend_cpu(), staged};
    rf_model_blocks bl[2];
    for (int i = 0; i < 2; i++) {
        if (rf_model_load_lora(dir, &lc, bes[i], 3, &m[i]))
            fail_msg("rf_model_load_lora %s on %s: %s", dir, bes[i]->name, rf_errmsg());
        assert_int_equal(rf_model_blocks_of(m[i], &bl[i]), 0);
        assert_int_equal(rf_model_enable_training(m[i], bl[i].nparams, bl[i].nparams), 0);
        assert_int_equal(rf_model_blocks_of(m[i], &bl[i]), 0);
        assert_ptr_equal(bl[i].be, bes[i]);
    }
    size_t bytes = bl[0].nparams * sizeof(float);
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-2f, o.clip_norm = 0.1f;
    for (long k = 0; k < 2; k++) {
        float n[2], loss[2];
        long cnt[2];
        for (int i = 0; i < 2; i++) {
            assert_int_equal(rf_model_zero_grad(m[i]), 0);
            assert_int_equal(rf_model_forward(m[i], &batch, true, 5 + (uint64_t)k), 0);
            assert_int_equal(rf_model_backward(m[i], 1.0f), 0);
            assert_int_equal(rf_model_loss(m[i], &loss[i], &cnt[i]), 0);
        }
        assert_int_equal(cnt[0], cnt[1]);
        assert_memory_equal(&loss[0], &loss[1], sizeof(float));
        assert_memory_equal(bl[0].grads, bl[1].grads, bytes);
        for (int i = 0; i < 2; i++) {
            assert_int_equal(rf_optim_clip(&bl[i], o.clip_norm, &n[i]), 0);
            assert_int_equal(
                rf_optim_adamw(&bl[i], &o, k, o.lr, 0, bl[i].nparams, bl[i].m, bl[i].v), 0);
        }
        assert_true(n[0] > 0);
        assert_memory_equal(&n[0], &n[1], sizeof(float));
        assert_memory_equal(bl[0].params, bl[1].params, bytes);
        print_message("  %s %s%s step %ld: loss %.6f (equal)\n", model, rf_lora_base_name(base),
                      dropout > 0 ? " dropout" : "", k, (double)loss[0]);
    }
    char d0[] = "/tmp/rf_lora_dev_c_XXXXXX", d1[] = "/tmp/rf_lora_dev_d_XXXXXX";
    assert_non_null(mkdtemp(d0));
    assert_non_null(mkdtemp(d1));
    assert_int_equal(rf_model_save(m[0], d0), 0);
    assert_int_equal(rf_model_save(m[1], d1), 0);
    files_equal(d0, d1, "adapter_model.safetensors");
    rm_peft(d0), rm_peft(d1);
    rf_model_free(m[0]), rf_model_free(m[1]);
    free(dir);
}

static void test_model_iface(void **state) {
    (void)state;
    iface_steps("../causal/tiny-llama-rand", RF_QT_NF4, 0.1f);
    const char *gguf = "../lm/tiny-llama-tied.gguf"; /* F32 tensors: fp32, int8, nf4 bases */
    iface_steps(gguf, RF_QT_F32, 0);
    iface_steps(gguf, RF_QT_INT8, 0.1f);
    iface_steps(gguf, RF_QT_NF4, 0);
}

int main(void) {
    make_batch();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_model_iface),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
