/* trainer.device: cpu | cuda (and the test device cpu-staged). cpu (the
 * default) gives the CPU backend; cuda is refused before any work with a
 * message saying why when the build has no CUDA (make CUDA=1) or the machine
 * no GPU, and gives the CUDA backend where both exist; any other name is
 * invalid. The evaluator follows the device. These cases check the behaviour
 * of whichever build and machine run them, so they run (and can fail)
 * everywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../support/skip.h"
#include "common/config.h"
#include "common/error.h"
#include "evaluator/evaluate.h"
#include "trainer/backend.h"
#include "trainer/spec.h"

#ifdef REFINERY_CUDA
#include <cuda_runtime.h>
#endif

/* Parses "trainer:\n  model: m\n<extra>"; *device gets a copy of s.device. */
static int parse(const char *extra, char *device, size_t cap) {
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml, "trainer:\n  model: m\n%s", extra);
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, (size_t)n, "spec.yaml", &root), 0);
    rf_trainer_spec s;
    int rc = rf_trainer_spec_parse(rf_cfg_get(root, "trainer"), &s);
    if (!rc) snprintf(device, cap, "%s", s.device);
    rf_cfg_free(root);
    return rc;
}

/* Whether this process can use a CUDA device (independently of the code under test). */
static int have_gpu(void) {
#ifdef REFINERY_CUDA
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return 0;
#endif
}

static void test_cpu_default(void **state) {
    (void)state;
    char dev[32];
    assert_int_equal(parse("", dev, sizeof dev), RF_OK);
    assert_string_equal(dev, "cpu");
    assert_int_equal(parse("  device: cpu\n", dev, sizeof dev), RF_OK);
    assert_string_equal(dev, "cpu");
    const rf_backend *be;
    assert_int_equal(rf_backend_for(dev, &be), RF_OK);
    assert_ptr_equal(be, rf_backend_cpu());
    assert_int_equal(rf_backend_for(NULL, &be), RF_OK);
    assert_string_equal(be->name, "cpu");
}

static void test_unknown_device(void **state) {
    (void)state;
    char dev[32];
    assert_int_equal(parse("  device: tpu\n", dev, sizeof dev), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "expected cpu, cuda or cuda-bf16, got 'tpu'"));
}

static void check_cuda(const char *name) {
    char dev[32], line[64];
    snprintf(line, sizeof line, "  device: %s\n", name);
    int rc = parse(line, dev, sizeof dev);
    const rf_backend *be = NULL;
    if (have_gpu()) {
        assert_int_equal(rc, RF_OK);
        assert_string_equal(dev, name);
        assert_int_equal(rf_backend_for(name, &be), RF_OK);
        assert_string_equal(be->name, name);
        return;
    }
    print_message("refused: %s\n", rf_errmsg());
    assert_int_equal(rc, RF_ERR_UNSUPPORTED);
#ifdef REFINERY_CUDA
    assert_non_null(strstr(rf_errmsg(), "GPU") ? rf_errmsg() : strstr(rf_errmsg(), "CUDA device"));
#else
    assert_non_null(strstr(rf_errmsg(), "make CUDA=1"));
#endif
    assert_int_equal(rf_backend_for(name, &be), RF_ERR_UNSUPPORTED);
    assert_null(be);
}

static void test_cuda(void **state) {
    (void)state;
    check_cuda("cuda");
    check_cuda("cuda-bf16");
}

/* Data, pipeline and tensor parallelism run on the device (NCCL, issue 14):
 * dp 2, pp 2 and tp 2 with cuda, for a classifier and a causal model, are
 * accepted where a GPU is. */
static void test_cuda_dp(void **state) {
    (void)state;
    char dev[32];
    int rc = parse("  device: cuda\n  parallel: {dp: 2, zero: 3}\n", dev, sizeof dev);
    if (have_gpu()) {
        assert_int_equal(rc, RF_OK);
    } else {
        assert_int_equal(rc, RF_ERR_UNSUPPORTED);
        assert_non_null(strstr(rf_errmsg(), "cuda"));
    }
    rc = parse("  device: cuda\n  parallel: {dp: 2, pp: 2, microbatches: 2}\n", dev, sizeof dev);
    assert_int_equal(rc, have_gpu() ? RF_OK : RF_ERR_UNSUPPORTED);
    rc = parse("  device: cuda\n  parallel: {dp: 2, tp: 2}\n", dev, sizeof dev);
    assert_int_equal(rc, have_gpu() ? RF_OK : RF_ERR_UNSUPPORTED);
    rc = parse("  task: causal_lm\n  device: cuda\n  parallel: {dp: 2, tp: 2}\n", dev, sizeof dev);
    assert_int_equal(rc, have_gpu() ? RF_OK : RF_ERR_UNSUPPORTED);
}

/* cpu-staged: the test device of backend.h (the CPU's kernels under their own
 * identity, host memory), accepted with dp > 1, pp > 1 and tp > 1. */
static void test_cpu_staged(void **state) {
    (void)state;
    char dev[32];
    assert_int_equal(parse("  device: cpu-staged\n  parallel: {dp: 2, zero: 2}\n", dev, sizeof dev),
                     RF_OK);
    assert_string_equal(dev, "cpu-staged");
    const rf_backend *be = NULL;
    assert_int_equal(rf_backend_for(dev, &be), RF_OK);
    assert_ptr_not_equal(be, rf_backend_cpu());
    assert_ptr_equal(be, rf_backend_cpu_staged());
    assert_string_equal(be->name, "cpu-staged");
    assert_false(be->device_memory);
    assert_false(rf_backend_cpu()->device_memory);
    assert_ptr_equal(be->linear_fwd, rf_backend_cpu()->linear_fwd);
    assert_int_equal(
        parse("  device: cpu-staged\n  parallel: {pp: 2, microbatches: 4}\n", dev, sizeof dev),
        RF_OK);
    assert_int_equal(parse("  device: cpu-staged\n  parallel: {tp: 2}\n", dev, sizeof dev), RF_OK);
    assert_int_equal(
        parse("  task: causal_lm\n  device: cpu-staged\n  parallel: {tp: 2}\n", dev, sizeof dev),
        RF_OK);
}

/* LoRA on a device: one process and data parallelism accepted (the adapter
 * runs through the backend, lora.h; lora_dp_staged.test.sh runs dp 2), a
 * pipeline refused with its reason (the adapter trains with dp only). */
static void test_lora_device(void **state) {
    (void)state;
    char dev[32];
    const char *lora = "  task: causal_lm\n  device: cpu-staged\n  lora: {rank: 4, base: nf4}\n";
    assert_int_equal(parse(lora, dev, sizeof dev), RF_OK);
    assert_string_equal(dev, "cpu-staged");
    char yaml[256];
    snprintf(yaml, sizeof yaml, "%s  parallel: {dp: 2}\n", lora);
    assert_int_equal(parse(yaml, dev, sizeof dev), RF_OK);
    snprintf(yaml, sizeof yaml, "%s  parallel: {pp: 2}\n", lora);
    assert_int_equal(parse(yaml, dev, sizeof dev), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "the adapter trains with data parallelism only"));
}

/* The evaluator refuses cuda the same way before it reads the model or data. */
static void test_evaluator_follows(void **state) {
    (void)state;
    if (have_gpu()) RF_SKIP("a GPU is present: there is no refusal to check");
    rf_eval_opts o = {.model_dir = "/nonexistent/model",
                      .data = "/nonexistent/data.jsonl",
                      .max_len = 16,
                      .batch_size = 4,
                      .device = "cuda"};
    assert_int_equal(rf_evaluate_run(&o, NULL), RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "trainer.device: cuda"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_default),
        cmocka_unit_test(test_unknown_device),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_cuda_dp),
        cmocka_unit_test(test_cpu_staged),
        cmocka_unit_test(test_lora_device),
        cmocka_unit_test(test_evaluator_follows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
