/* The pieces of ZeRO that need no group: AdamW on shards that cut tensors
 * anywhere equals the full step element for element (weight decay follows
 * each tensor's flag), the padded/sharded training buffers, loading a
 * checkpoint's moments for a shard, and the trainer.parallel spec keys.
 * The group runs themselves are tests/trainer/dp.test.sh (mpirun). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "common/config.h"
#include "common/error.h"
#include "common/rng.h"
#include "parity_util.h"
#include "trainer/checkpoint.h"
#include "trainer/optim.h"
#include "trainer/driver.h"
#include "trainer/spec.h"

static rf_bert *load_tiny(void) {
    char *dir = fixture_path("tiny-bert");
    rf_bert *m;
    if (rf_bert_load(dir, 2, 3, rf_backend_cpu(), &m)) fail_msg("%s", rf_errmsg());
    free(dir);
    return m;
}

/* Random gradients and moments, a non-zero weight decay: 3 AdamW steps on the
 * whole block, then the same 3 steps shard by shard for several world sizes;
 * every parameter and moment must be bitwise equal. */
static void test_adamw_shards_bitwise(void **state) {
    (void)state;
    rf_bert *full = load_tiny();
    assert_int_equal(rf_bert_enable_training(full), 0);
    size_t n = full->nparams;
    float *p0 = malloc(n * sizeof *p0), *g[3];
    memcpy(p0, full->params, n * sizeof *p0);
    rf_rng r;
    rf_rng_seed(&r, 11);
    for (int s = 0; s < 3; s++) {
        g[s] = malloc(n * sizeof *g[s]);
        for (size_t i = 0; i < n; i++)
            g[s][i] = (float)(rf_rng_below(&r, 2001) - 1000.0) * 1e-4f;
    }
    rf_adamw o = rf_adamw_defaults();
    o.lr = 1e-2f;
    o.weight_decay = 0.1f;
    for (int s = 0; s < 3; s++) {
        memcpy(full->grads, g[s], n * sizeof *g[s]);
        rf_adamw_step(full, &o, s, o.lr);
    }
    int decayed = 0, plain = 0;
    for (size_t t = 0; t < full->ntensors; t++)
        full->tensors[t].decay ? decayed++ : plain++;
    assert_true(decayed > 0 && plain > 0); /* both kinds are cut by the shards */
    static const int worlds[] = {2, 3, 4, 7};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        rf_bert *m = load_tiny();
        assert_int_equal(rf_bert_enable_training(m), 0);
        memcpy(m->params, p0, n * sizeof *p0);
        int world = worlds[w];
        int cuts = 0;
        for (int rank = 0; rank < world; rank++) {
            size_t lo, hi, block = rf_comm_shard(n, world, rank, &lo, &hi);
            assert_true(hi - lo <= block);
            for (size_t t = 0; t < m->ntensors; t++) {
                size_t a = m->tensors[t].offset, b = a + m->tensors[t].numel;
                cuts += (a < lo && lo < b);
            }
            float *m1 = calloc(block + 1, sizeof *m1), *m2 = calloc(block + 1, sizeof *m2);
            for (int s = 0; s < 3; s++) {
                memcpy(m->grads, g[s], n * sizeof *g[s]);
                rf_adamw_step_range(m, &o, s, o.lr, lo, hi, m1, m2);
            }
            assert_memory_equal(m1, full->m + lo, (hi - lo) * sizeof *m1);
            assert_memory_equal(m2, full->v + lo, (hi - lo) * sizeof *m2);
            free(m1);
            free(m2);
        }
        assert_true(cuts > 0); /* some shard boundary falls inside a tensor */
        assert_memory_equal(m->params, full->params, n * sizeof *p0);
        rf_bert_free(m);
    }
    for (int s = 0; s < 3; s++)
        free(g[s]);
    free(p0);
    rf_bert_free(full);
}

/* Sharded buffers: params and grads padded (zero tail, views rebound), moments
 * of the shard; a full checkpoint loads its shard's moments. */
static void test_sharded_buffers_and_checkpoint(void **state) {
    (void)state;
    char dir[] = "/tmp/rf_zero_XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    rf_bert *full = load_tiny();
    assert_int_equal(rf_bert_enable_training(full), 0);
    size_t n = full->nparams;
    for (size_t i = 0; i < n; i++) {
        full->m[i] = (float)i;
        full->v[i] = (float)(2 * i);
    }
    rf_train_state st = {.step = 5, .ident = {1, 2}};
    assert_int_equal(rf_checkpoint_save(path, full, &st), 0);

    size_t lo, hi, block = rf_comm_shard(n, 4, 3, &lo, &hi);
    rf_bert *m = load_tiny();
    float before = m->params[n - 1];
    assert_int_equal(rf_bert_enable_training_sharded(m, 4 * block, block), 0);
    assert_int_equal(m->npadded, 4 * block);
    assert_int_equal(m->nmoments, block);
    assert_true(m->params[n - 1] == before);
    for (size_t i = n; i < 4 * block; i++)
        assert_true(m->params[i] == 0 && m->grads[i] == 0);
    /* views point into the new block */
    const rf_tensor_info *t = rf_bert_find(m, "classifier.bias");
    assert_non_null(t);
    assert_ptr_equal(m->p.cls_b, m->params + t->offset);
    rf_train_state got = {.ident = {1, 2}};
    assert_int_equal(rf_checkpoint_load_range(path, m, &got, lo, hi), 0);
    assert_int_equal(got.step, 5);
    assert_memory_equal(m->params, full->params, n * sizeof(float));
    for (size_t i = lo; i < hi; i++) {
        assert_true(m->m[i - lo] == (float)i);
        assert_true(m->v[i - lo] == (float)(2 * i));
    }
    /* a range larger than the shard's moments is refused */
    assert_int_equal(rf_checkpoint_load_range(path, m, &got, 0, n), RF_ERR_INVALID);
    rf_bert_free(m);
    rf_bert_free(full);
    unlink(path);
    rmdir(dir);
}

static int parse(const char *yaml, rf_trainer_spec *s) {
    rf_cfg *root;
    int rc = rf_cfg_load_string(yaml, strlen(yaml), "spec.yaml", &root);
    if (!rc) rc = rf_trainer_spec_parse(rf_cfg_get(root, "trainer"), s);
    rf_cfg_free(root); /* the test reads only numbers */
    return rc;
}

static void test_spec_parallel(void **state) {
    (void)state;
    rf_trainer_spec s;
    assert_int_equal(parse("trainer:\n  model: m\n", &s), 0);
    assert_int_equal(s.dp, 1);
    assert_int_equal(s.opts.zero, 0);
    assert_int_equal(rf_trainer_check_group(&s, NULL), 0);
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 4, zero: 2}\n", &s), 0);
    assert_int_equal(s.dp, 4);
    assert_int_equal(s.opts.zero, 2);
    /* a group of 1 (no group) is not dp 4: the error names both */
    assert_int_equal(rf_trainer_check_group(&s, NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "parallel.dp is 4 but the group has 1 rank"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, zero: 3}\n", &s),
                     RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "not implemented yet"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, zero: 4}\n", &s),
                     RF_ERR_INVALID);
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, tp: 2}\n", &s),
                     RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "tp"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: 2\n", &s), RF_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_shards_bitwise),
        cmocka_unit_test(test_sharded_buffers_and_checkpoint),
        cmocka_unit_test(test_spec_parallel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
