/* The pieces of ZeRO that need no group: AdamW on shards that cut tensors
 * anywhere equals the full step element for element (weight decay follows
 * each tensor's flag), the padded/sharded training buffers, loading a
 * checkpoint's moments for a shard, the trainer.parallel spec keys, the
 * model's unit hook (what ZeRO-3 rebinds) and sharded checkpoints read back
 * in another layout.
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
#include "common/sys.h"
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

/* A unit hook that does what ZeRO-3 does to the views, without a group:
 * each unit's parameters are copied into a buffer of their own before the
 * unit runs, its gradients go to a fresh zeroed buffer that is added into a
 * separate full gradient block when the unit's backward is done. */
typedef struct copy_hook {
    float *params_src; /* the real parameters (the model's own block) */
    float *grads;      /* full gradient block collected from the units */
    float *pbuf[64], *gbuf[64];
    int events[3];
} copy_hook;

static int copy_unit(void *user, rf_bert *m, int u, rf_unit_event ev) {
    copy_hook *h = user;
    size_t lo, hi;
    rf_bert_unit_range(m, u, &lo, &hi);
    h->events[ev]++;
    if (ev == RF_UNIT_FWD || ev == RF_UNIT_BWD) {
        free(h->pbuf[u]);
        h->pbuf[u] = malloc((hi - lo) * sizeof(float));
        memcpy(h->pbuf[u], h->params_src + lo, (hi - lo) * sizeof(float));
        rf_bert_bind_unit(m, u, h->pbuf[u], NULL);
    }
    if (ev == RF_UNIT_BWD) {
        free(h->gbuf[u]);
        h->gbuf[u] = calloc(hi - lo, sizeof(float));
        rf_bert_bind_unit(m, u, NULL, h->gbuf[u]);
    }
    if (ev == RF_UNIT_BWD_DONE)
        for (size_t i = lo; i < hi; i++)
            h->grads[i] += h->gbuf[u][i - lo];
    return RF_OK;
}

/* Forward and backward through the hook equal the plain ones bit for bit, and
 * the units tile the flat block in order. */
static void test_unit_hook_same_arithmetic(void **state) {
    (void)state;
    rf_bert *a = load_tiny(), *b = load_tiny();
    assert_int_equal(rf_bert_enable_training(a), 0);
    assert_int_equal(rf_bert_enable_training(b), 0);
    int U = rf_bert_units(a);
    assert_int_equal(U, a->cfg.num_layers + 2);
    size_t prev = 0;
    for (int u = 0; u < U; u++) {
        size_t lo, hi;
        rf_bert_unit_range(a, u, &lo, &hi);
        assert_int_equal(lo, prev);
        assert_true(hi > lo);
        prev = hi;
    }
    assert_int_equal(prev, a->nparams);
    int32_t ids[2 * 6] = {2, 5, 7, 9, 3, 0, 2, 11, 4, 3, 0, 0}, types[12] = {0};
    int32_t labels[2] = {1, 0};
    uint8_t valid[12] = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0};
    rf_batch bt = {2, 6, ids, types, labels, valid};
    copy_hook h = {.params_src = b->params, .grads = calloc(b->nparams, sizeof(float))};
    b->unit_hook = copy_unit;
    b->unit_user = &h;
    /* one backward: a second one would add into a's gradients inside the
     * kernels (one rounding) but into h.grads after them (two), which is why
     * zero 3 with accumulation is not bitwise equal (see the README) */
    assert_int_equal(rf_bert_forward(a, &bt, true, 7), 0);
    assert_int_equal(rf_bert_forward(b, &bt, true, 7), 0);
    assert_true(a->loss == b->loss);
    assert_memory_equal(a->logits, b->logits, 2 * (size_t)a->cfg.num_labels * sizeof(float));
    rf_bert_backward(a, 0.5f);
    rf_bert_backward(b, 0.5f);
    assert_int_equal(h.events[RF_UNIT_FWD], U);
    assert_int_equal(h.events[RF_UNIT_BWD], U);
    assert_int_equal(h.events[RF_UNIT_BWD_DONE], U);
    /* b's own gradient block was never written: everything went through the units */
    for (size_t i = 0; i < b->nparams; i++)
        assert_true(b->grads[i] == 0);
    assert_memory_equal(a->grads, h.grads, a->nparams * sizeof(float));
    b->unit_hook = NULL;
    rf_bert_bind_all(b);
    assert_ptr_equal(b->p.cls_b, b->params + rf_bert_find(b, "classifier.bias")->offset);
    for (int u = 0; u < 64; u++) {
        free(h.pbuf[u]);
        free(h.gbuf[u]);
    }
    free(h.grads);
    rf_bert_free(a);
    rf_bert_free(b);
}

/* A checkpoint written as 3 ranks' shards that cut tensors anywhere (and one
 * rank holding two pieces, as zero 3 does) loads into another layout: the full
 * state, and a 2-way split of the moments; a missing element, a damaged shard,
 * a missing marker and another run's identity are refused. */
static void test_sharded_checkpoint_reshards(void **state) {
    (void)state;
    char dir[] = "/tmp/rf_zshard_XXXXXX", path[300], cmd[400];
    assert_non_null(mkdtemp(dir));
    rf_bert *m = load_tiny();
    size_t n = m->nparams;
    float *blk[3];
    for (int k = 0; k < 3; k++) {
        blk[k] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            blk[k][i] = (float)(k + 1) * 1000.0f + (float)i;
    }
    rf_train_state st = {.step = 7, .epoch = 1, .pos = 3, .micro = 20, .ident = {5, 6}};
    rf_rng_seed(&st.rng, 99);
    /* rank 0: [0, 100) and [n/2, n/2 + 10); rank 1: [100, n/2); rank 2: the rest */
    size_t cut[] = {0, 100, n / 2, n / 2 + 10, n};
    rf_ckpt_piece r0[2] = {{cut[0], cut[1], blk[0], blk[1], blk[2]},
                           {cut[2], cut[3], blk[0] + cut[2], blk[1] + cut[2], blk[2] + cut[2]}};
    rf_ckpt_piece r1 = {cut[1], cut[2], blk[0] + cut[1], blk[1] + cut[1], blk[2] + cut[1]};
    rf_ckpt_piece r2 = {cut[3], cut[4], blk[0] + cut[3], blk[1] + cut[3], blk[2] + cut[3]};
    uint64_t sz[3], hs[3];
    assert_int_equal(rf_checkpoint_write_shard(dir, m, &st, 0, 3, r0, 2, &sz[0], &hs[0]), 0);
    assert_int_equal(rf_checkpoint_write_shard(dir, m, &st, 1, 3, &r1, 1, &sz[1], &hs[1]), 0);
    assert_int_equal(rf_checkpoint_write_shard(dir, m, &st, 2, 3, &r2, 1, &sz[2], &hs[2]), 0);
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    assert_int_equal(access(path, F_OK), -1); /* nothing to resume before the commit */
    assert_int_equal(rf_checkpoint_commit(dir, m, &st, 3, 3, sz, hs), 0);

    float *got[3];
    for (int k = 0; k < 3; k++)
        got[k] = calloc(n, sizeof(float));
    rf_train_state back = {.ident = {5, 6}};
    rf_ckpt_piece all = {0, n, got[0], got[1], got[2]};
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, &all, 1), 0);
    for (int k = 0; k < 3; k++)
        assert_memory_equal(got[k], blk[k], n * sizeof(float));
    assert_int_equal(back.step, 7);
    assert_int_equal(back.epoch, 1);
    assert_int_equal(back.pos, 3);
    assert_int_equal(back.micro, 20);
    assert_memory_equal(&back.rng, &st.rng, sizeof st.rng);
    /* a 2-rank zero-1 layout: all params, rank 1's half of the moments */
    size_t lo, hi;
    rf_comm_shard(n, 2, 1, &lo, &hi);
    memset(got[1], 0, n * sizeof(float));
    rf_ckpt_piece z1[2] = {{0, n, got[0], NULL, NULL}, {lo, hi, NULL, got[1], got[2]}};
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, z1, 2), 0);
    assert_memory_equal(got[1], blk[1] + lo, (hi - lo) * sizeof(float));
    /* another run's identity is refused before anything is written */
    rf_train_state other = {.ident = {5, 7}};
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &other, &all, 1), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "training options differ"));
    /* a damaged shard */
    char shard[400];
    snprintf(shard, sizeof shard, "%s/checkpoint.d/step-00000007/shard-00001-of-00003.bin", dir);
    char *buf;
    size_t len;
    assert_int_equal(rf_read_file(shard, 1 << 30, &buf, &len), 0);
    buf[len / 2] ^= 4;
    assert_int_equal(rf_write_file_atomic(shard, buf, len), 0);
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, &all, 1), RF_ERR_CORRUPT);
    assert_non_null(strstr(rf_errmsg(), "checksum"));
    buf[len / 2] ^= 4;
    assert_int_equal(rf_write_file_atomic(shard, buf, len), 0);
    free(buf);
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, &all, 1), 0);
    /* no marker: incomplete, refused */
    snprintf(cmd, sizeof cmd, "%s/checkpoint.d/step-00000007/COMPLETE", dir);
    assert_int_equal(unlink(cmd), 0);
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, &all, 1), RF_ERR_CORRUPT);
    assert_non_null(strstr(rf_errmsg(), "incomplete"));
    /* shards that leave elements out: the load says so */
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoint.d %s/checkpoint.bin", dir, dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rf_checkpoint_write_shard(dir, m, &st, 0, 2, r0, 2, &sz[0], &hs[0]), 0);
    assert_int_equal(rf_checkpoint_write_shard(dir, m, &st, 1, 2, &r1, 1, &sz[1], &hs[1]), 0);
    assert_int_equal(rf_checkpoint_commit(dir, m, &st, 2, 3, sz, hs), 0);
    assert_int_equal(rf_checkpoint_load_pieces(path, n, &back, &all, 1), RF_ERR_CORRUPT);
    assert_non_null(strstr(rf_errmsg(), "cover"));
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    for (int k = 0; k < 3; k++) {
        free(blk[k]);
        free(got[k]);
    }
    rf_bert_free(m);
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
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, zero: 3}\n", &s), 0);
    assert_int_equal(s.opts.zero, 3);
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, zero: 4}\n", &s),
                     RF_ERR_INVALID);
    /* the tp/pp mesh (issue 17): parsed into the options; the world must be
     * dp x tp x pp, zero 3 is refused on it, stages must match pp */
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, tp: 2, pp: 3, zero: 1, "
                           "microbatches: 4, stages: [1, 2, 3]}\n",
                           &s),
                     0);
    assert_int_equal(s.dp, 2);
    assert_int_equal(s.opts.tp, 2);
    assert_int_equal(s.opts.pp, 3);
    assert_int_equal(s.opts.zero, 1);
    assert_int_equal(s.opts.microbatches, 4);
    assert_int_equal(s.opts.nstages, 3);
    assert_int_equal(s.opts.stages[2], 3);
    assert_int_equal(rf_trainer_check_group(&s, NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "dp 2 x tp 2 x pp 3 = 12 rank(s) but the group has 1"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, tp: 2, zero: 3}\n", &s),
                     RF_ERR_UNSUPPORTED);
    assert_non_null(strstr(rf_errmsg(), "zero 3 with tp 2 x pp 1 is not supported"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {pp: 2, stages: [3]}\n", &s),
                     RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "stages lists 1 stage(s) but pp is 2"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {pp: 2, stages: [3, x]}\n", &s),
                     RF_ERR_INVALID);
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: {dp: 2, tpp: 2}\n", &s),
                     RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "tpp"));
    assert_int_equal(parse("trainer:\n  model: m\n  parallel: 2\n", &s), RF_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_shards_bitwise),
        cmocka_unit_test(test_sharded_buffers_and_checkpoint),
        cmocka_unit_test(test_spec_parallel),
        cmocka_unit_test(test_unit_hook_same_arithmetic),
        cmocka_unit_test(test_sharded_checkpoint_reshards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
