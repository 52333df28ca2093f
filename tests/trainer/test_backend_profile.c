/* The backend profiler (backend_profile.h): its slots forward to the wrapped
 * backend's with the same results bit for bit, count calls only while it is
 * on, report the slots called most-seconds-first, and wrapped around the
 * test device cpu-staged it runs a GPT-2 training step (the model takes its
 * device paths, every op through the profiler) to the same gradients bit for
 * bit as cpu-staged itself, with each slot's calls per step the same at every
 * step (once per step for the embedding, the LM head and the loss) and the
 * seconds charged within the steps' wall time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "common/sys.h"
#include "parity_util.h"
#include "trainer/backend_profile.h"
#include "trainer/model_iface.h"

static long calls_of(const rf_backend_profile *p, const char *slot) {
    rf_slot_time rows[64];
    size_t n = rf_backend_profile_rows(p, rows, 64);
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(rows[i].slot, slot)) return rows[i].calls;
    return 0;
}

static void test_forward_and_count(void **state) {
    (void)state;
    const rf_backend *cpu = rf_backend_cpu();
    rf_backend_profile *p;
    assert_int_equal(rf_backend_profile_new(cpu, &p), RF_OK);
    const rf_backend *be = rf_backend_profile_backend(p);
    assert_string_equal(be->name, "cpu+profile");
    assert_ptr_equal(be->queue, cpu->queue);
    assert_int_equal(be->device_memory, cpu->device_memory);
    enum { N = 5, IC = 7, OC = 3 };
    float x[N * IC], w[OC * IC], b[OC], want[N * OC], got[N * OC];
    for (int i = 0; i < N * IC; i++)
        x[i] = (float)((i * 37) % 11) / 7.0f - 0.6f;
    for (int i = 0; i < OC * IC; i++)
        w[i] = (float)((i * 13) % 9) / 5.0f - 0.8f;
    for (int i = 0; i < OC; i++)
        b[i] = 0.1f * (float)i;
    assert_int_equal(cpu->linear_fwd(cpu, want, x, w, b, N, IC, OC), RF_OK);

    /* off: forwards, counts nothing */
    memset(got, 0, sizeof got);
    assert_int_equal(be->linear_fwd(be, got, x, w, b, N, IC, OC), RF_OK);
    assert_memory_equal(got, want, sizeof want);
    rf_slot_time rows[4];
    assert_int_equal(rf_backend_profile_rows(p, rows, 4), 0);

    /* on: the same bits, one call of linear_fwd, three of scale */
    rf_backend_profile_enable(p, true);
    memset(got, 0, sizeof got);
    assert_int_equal(be->linear_fwd(be, got, x, w, b, N, IC, OC), RF_OK);
    assert_memory_equal(got, want, sizeof want);
    for (int k = 0; k < 3; k++)
        assert_int_equal(be->scale(be, got, N * OC, 2.0f), RF_OK);
    for (int i = 0; i < N * OC; i++)
        assert_true(got[i] == want[i] * 8.0f);
    assert_int_equal(calls_of(p, "linear_fwd"), 1);
    assert_int_equal(calls_of(p, "scale"), 3);
    assert_int_equal(calls_of(p, "gelu_fwd"), 0);
    /* most seconds first; room for one row: the count of all, the top one */
    size_t n = rf_backend_profile_rows(p, rows, 4);
    assert_int_equal(n, 2);
    assert_true(rows[0].seconds >= rows[1].seconds && rows[1].seconds >= 0);
    rf_slot_time top;
    assert_int_equal(rf_backend_profile_rows(p, &top, 1), 2);
    assert_string_equal(top.slot, rows[0].slot);
    rf_backend_profile_reset(p);
    assert_int_equal(rf_backend_profile_rows(p, rows, 4), 0);
    rf_backend_profile_free(p);
    rf_backend_profile_free(NULL);
}

static int failing_scale(const rf_backend *be, float *x, size_t n, float s) {
    (void)be, (void)x, (void)n, (void)s;
    return rf_fail(RF_ERR_INVALID, "scale failed on purpose");
}

/* A slot's error comes back through the wrapper (the call still counted);
 * a slot the inner backend lacks stays NULL. */
static void test_errors(void **state) {
    (void)state;
    rf_backend inner = *rf_backend_cpu();
    inner.scale = failing_scale;
    inner.gelu_fwd = NULL;
    rf_backend_profile *p;
    assert_int_equal(rf_backend_profile_new(&inner, &p), RF_OK);
    const rf_backend *be = rf_backend_profile_backend(p);
    assert_null(be->gelu_fwd);
    assert_non_null(be->gelu_bwd);
    float x[3] = {1, 2, 3};
    assert_int_equal(be->scale(be, x, 3, 2.0f), RF_ERR_INVALID);
    rf_backend_profile_enable(p, true);
    assert_int_equal(be->scale(be, x, 3, 2.0f), RF_ERR_INVALID);
    assert_string_equal(rf_errmsg(), "scale failed on purpose");
    assert_int_equal(calls_of(p, "scale"), 1);
    assert_true(x[0] == 1 && x[2] == 3);
    rf_backend_profile_free(p);
}

static rf_model *load(const rf_backend *be) {
    const char *root = getenv("REFINERY_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/causal/tiny-gpt2-rand", root ? root : ".");
    rf_model *m;
    if (rf_model_load(dir, NULL, be, &m)) fail_msg("load %s on %s: %s", dir, be->name, rf_errmsg());
    return m;
}

static void test_model_step(void **state) {
    (void)state;
    const rf_backend *staged = rf_backend_cpu_staged();
    rf_backend_profile *p;
    assert_int_equal(rf_backend_profile_new(staged, &p), RF_OK);
    const rf_backend *be = rf_backend_profile_backend(p);
    rf_model *a = load(staged), *m = load(be);
    rf_model_blocks ab, mb;
    assert_int_equal(rf_model_blocks_of(a, &ab), 0);
    assert_int_equal(rf_model_enable_training(a, ab.nparams, ab.nparams), 0);
    assert_int_equal(rf_model_enable_training(m, ab.nparams, ab.nparams), 0);
    assert_int_equal(rf_model_blocks_of(a, &ab), 0);
    assert_int_equal(rf_model_blocks_of(m, &mb), 0);
    assert_ptr_equal(mb.be, be);
    enum { B = 2, T = 8 };
    int32_t ids[B * T];
    for (int i = 0; i < B * T; i++)
        ids[i] = (i * 7 + 3) % 64;
    rf_model_batch b = {.B = B, .T = T, .ids = ids, .labels = ids};
    rf_model_info in = rf_model_info_of(m);
    rf_slot_time first[64]; /* step 1's rows (the names are static strings) */
    size_t nfirst = 0;
    rf_backend_profile_enable(p, true);
    double wall = 0;
    for (long step = 1; step <= 3; step++) {
        for (int i = 0; i < 2; i++) {
            rf_model *x = i ? m : a;
            double t0 = rf_now();
            assert_int_equal(rf_model_zero_grad(x), 0);
            assert_int_equal(rf_model_forward(x, &b, true, 0), 0);
            assert_int_equal(rf_model_backward(x, 1.0f), 0);
            if (i) wall += rf_now() - t0;
        }
        assert_memory_equal(ab.grads, mb.grads, ab.nparams * sizeof(float));
        rf_slot_time rows[64];
        size_t n = rf_backend_profile_rows(p, rows, 64);
        assert_true(n > 0 && n <= 64);
        double charged = 0;
        for (size_t r = 0; r < n; r++)
            charged += rows[r].seconds;
        print_message("step %ld: %zu slots, %.3f ms charged of %.3f ms\n", step, n, 1e3 * charged,
                      1e3 * wall);
        assert_true(charged > 0 && charged <= wall);
        if (step == 1) {
            nfirst = n;
            memcpy(first, rows, n * sizeof *rows);
            for (size_t r = 0; r < n; r++)
                print_message("  %-22s %3ld calls\n", rows[r].slot, rows[r].calls);
            assert_int_equal(calls_of(p, "tokpos_fwd"), 1);
            assert_int_equal(calls_of(p, "lm_head_fwd"), 1);
            assert_int_equal(calls_of(p, "causal_xent_fwd"), 1);
            assert_int_equal(calls_of(p, "causal_attention_bwd"), in.layers);
            assert_true(calls_of(p, "causal_attention_fwd") >= in.layers);
            continue;
        }
        /* the same slots, each with step times its calls of step 1 */
        assert_int_equal(n, nfirst);
        for (size_t r = 0; r < nfirst; r++)
            assert_int_equal(calls_of(p, first[r].slot), step * first[r].calls);
    }
    rf_model_free(a);
    rf_model_free(m);
    rf_backend_profile_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_and_count),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_model_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
