/* The trainer's parallel mesh (trainer/mesh.h), in one process:
 * `trainer.parallel` parsing, the world-size and model checks and their
 * messages, rank <-> coordinates with tp fastest, the vocabulary split with
 * padding, and the mesh of a world of one. The tensor-parallel ops themselves
 * run under mpirun in tests/trainer/tp.test.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "common/config.h"
#include "common/error.h"
#include "trainer/mesh.h"

static int parse(const char *yaml, rf_tr_parallel *p) {
    rf_cfg *root;
    assert_int_equal(rf_cfg_load_string(yaml, strlen(yaml), "test", &root), RF_OK);
    int rc = rf_tr_parallel_parse(rf_cfg_get(root, "trainer"), p);
    rf_cfg_free(root);
    return rc;
}

static void assert_msg(const char *part) {
    if (!strstr(rf_errmsg(), part)) fail_msg("message \"%s\" lacks \"%s\"", rf_errmsg(), part);
}

static void test_parse(void **state) {
    (void)state;
    rf_tr_parallel p;
    assert_int_equal(parse("trainer:\n  model: m\n", &p), RF_OK);
    assert_int_equal(p.dp, 1);
    assert_int_equal(p.tp, 1);
    assert_int_equal(p.pp, 1);
    assert_int_equal(p.zero, 0);
    assert_int_equal(p.microbatches, 1);
    assert_int_equal(
        parse("trainer:\n  parallel: {dp: 2, tp: 4, pp: 3, zero: 1, microbatches: 8}\n", &p),
        RF_OK);
    assert_int_equal(p.dp, 2);
    assert_int_equal(p.tp, 4);
    assert_int_equal(p.pp, 3);
    assert_int_equal(p.zero, 1);
    assert_int_equal(p.microbatches, 8);
    /* unknown key, with the key named */
    assert_int_equal(parse("trainer:\n  parallel: {dp: 2, tpp: 2}\n", &p), RF_ERR_INVALID);
    assert_msg("tpp");
    assert_int_equal(parse("trainer:\n  parallel: {tp: 0}\n", &p), RF_ERR_INVALID);
    assert_msg("tp");
    assert_int_equal(parse("trainer:\n  parallel: {pp: two}\n", &p), RF_ERR_INVALID);
    assert_msg("pp");
    assert_int_equal(parse("trainer:\n  parallel: {zero: 4}\n", &p), RF_ERR_INVALID);
    assert_msg("zero");
    assert_int_equal(parse("trainer:\n  parallel: {microbatches: 0}\n", &p), RF_ERR_INVALID);
    assert_msg("microbatches");
    assert_int_equal(parse("trainer:\n  parallel: 4\n", &p), RF_ERR_INVALID);
    assert_msg("mapping");
    /* ZeRO-3 only without tp/pp; ZeRO-1/2 on the dp axis of any mesh */
    assert_int_equal(parse("trainer:\n  parallel: {dp: 2, tp: 2, zero: 3}\n", &p),
                     RF_ERR_UNSUPPORTED);
    assert_msg("zero 3 with tp 2 x pp 1");
    assert_int_equal(parse("trainer:\n  parallel: {dp: 2, pp: 2, zero: 2}\n", &p), RF_OK);
    assert_int_equal(parse("trainer:\n  parallel: {dp: 4, zero: 3}\n", &p), RF_OK);
    /* stages: layers per pipeline stage */
    assert_int_equal(parse("trainer:\n  parallel: {pp: 3, stages: [2, 3, 1]}\n", &p), RF_OK);
    assert_int_equal(p.nstages, 3);
    assert_int_equal(p.stages[0], 2);
    assert_int_equal(p.stages[2], 1);
    assert_int_equal(parse("trainer:\n  parallel: {pp: 2, stages: [2, 0]}\n", &p), RF_ERR_INVALID);
    assert_msg("stages[1]");
    assert_int_equal(parse("trainer:\n  parallel: {pp: 2, stages: 3}\n", &p), RF_ERR_INVALID);
    assert_msg("a list of 1 to");
}

static void test_world(void **state) {
    (void)state;
    rf_tr_parallel p = {.dp = 2, .tp = 2, .pp = 1, .zero = 0, .microbatches = 1};
    assert_int_equal(rf_tr_parallel_check_world(&p, 4), RF_OK);
    assert_int_equal(rf_tr_parallel_check_world(&p, 2), RF_ERR_INVALID);
    assert_msg("dp 2 x tp 2 x pp 1 = 4 rank(s) but the group has 2");
    p = (rf_tr_parallel){.dp = 1, .tp = 2, .pp = 3, .microbatches = 4};
    assert_int_equal(rf_tr_parallel_check_world(&p, 6), RF_OK);
    assert_int_equal(rf_tr_parallel_check_world(&p, 8), RF_ERR_INVALID);
    assert_msg("= 6 rank(s) but the group has 8");
    p.tp = 0;
    assert_int_equal(rf_tr_parallel_check_world(&p, 0), RF_ERR_INVALID);
}

static rf_bert_config minilm(void) { /* MiniLM-L6's sizes */
    return (rf_bert_config){.vocab_size = 30522,
                            .hidden_size = 384,
                            .num_layers = 6,
                            .num_heads = 12,
                            .intermediate_size = 1536,
                            .max_position = 512,
                            .type_vocab_size = 2,
                            .num_labels = 2};
}

static void test_model(void **state) {
    (void)state;
    rf_bert_config c = minilm();
    rf_tr_parallel p = rf_tr_parallel_default();
    int good[][3] = {{1, 1, 1}, {1, 2, 2}, {2, 4, 6}, {1, 3, 1}, {1, 12, 1}, {4, 6, 3}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        p.dp = good[i][0], p.tp = good[i][1], p.pp = good[i][2];
        assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_OK);
    }
    p = rf_tr_parallel_default();
    p.tp = 5;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_ERR_INVALID);
    assert_msg("tp is 5 but the model has 12 attention heads");
    p.tp = 8;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_ERR_INVALID);
    assert_msg("12 attention heads");
    /* heads divisible but not the intermediate size */
    c.num_heads = 8, c.hidden_size = 32, c.intermediate_size = 36;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_ERR_INVALID);
    assert_msg("tp is 8 but the model's intermediate size is 36");
    c = minilm();
    p = rf_tr_parallel_default();
    p.pp = 7;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_ERR_INVALID);
    assert_msg("pp is 7 but the model has 6 layer(s)");
    p.pp = 6;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_OK);
    p.microbatches = 4;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 32), RF_OK);
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 30), RF_ERR_INVALID);
    assert_msg("microbatches is 4 but the batch size 30");
    /* the vocabulary never blocks a split (padding): 30522 is not a multiple of 4 */
    p = rf_tr_parallel_default();
    p.tp = 4;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_OK);
    /* explicit stages: one count >= 1 per stage, summing to the layers */
    p = rf_tr_parallel_default();
    p.pp = 2, p.nstages = 2, p.stages[0] = 4, p.stages[1] = 2;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_OK);
    assert_int_equal(rf_tr_parallel_check_layers(&p, 6, 0), RF_OK);
    p.stages[1] = 3;
    assert_int_equal(rf_tr_parallel_check_model(&p, &c, 0), RF_ERR_INVALID);
    assert_msg("stages sum to 7 layer(s) but the model has 6");
    p.stages[1] = 0;
    assert_int_equal(rf_tr_parallel_check_layers(&p, 4, 0), RF_ERR_INVALID);
    assert_msg("stages[1] is 0: every stage needs at least one layer");
    p.nstages = 3, p.stages[1] = 1, p.stages[2] = 1;
    assert_int_equal(rf_tr_parallel_check_layers(&p, 6, 0), RF_ERR_INVALID);
    assert_msg("stages lists 3 stage(s) but pp is 2");
}

static void test_coords(void **state) {
    (void)state;
    /* every rank of every mesh of 12 ranks maps to the formula and back */
    int sizes[][3] = {{12, 1, 1}, {1, 12, 1}, {1, 1, 12}, {2, 3, 2}, {3, 2, 2}, {2, 2, 3}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        rf_tr_parallel p = rf_tr_parallel_default();
        p.dp = sizes[s][0], p.tp = sizes[s][1], p.pp = sizes[s][2];
        int seen[12] = {0};
        for (int r = 0; r < 12; r++) {
            int d, t, q;
            assert_int_equal(rf_tr_mesh_coords(&p, r, &d, &t, &q), RF_OK);
            assert_int_equal(r, (d * p.pp + q) * p.tp + t); /* tp fastest, then pp, then dp */
            assert_int_equal(rf_comm_mesh_rank(p.dp, p.tp, p.pp, d, t, q), r);
            seen[(d * p.pp + q) * p.tp + t]++;
        }
        for (int r = 0; r < 12; r++)
            assert_int_equal(seen[r], 1);
    }
    /* dp 2 x tp 2: tp groups {0,1} {2,3} are adjacent ranks */
    rf_tr_parallel p = {.dp = 2, .tp = 2, .pp = 1, .microbatches = 1};
    int d, t, q;
    assert_int_equal(rf_tr_mesh_coords(&p, 1, &d, &t, &q), RF_OK);
    assert_true(d == 0 && t == 1 && q == 0);
    assert_int_equal(rf_tr_mesh_coords(&p, 2, &d, &t, &q), RF_OK);
    assert_true(d == 1 && t == 0 && q == 0);
    assert_int_equal(rf_tr_mesh_coords(&p, 4, &d, &t, &q), RF_ERR_INVALID);
    assert_int_equal(rf_tr_mesh_coords(&p, -1, &d, &t, &q), RF_ERR_INVALID);
}

static void test_vocab(void **state) {
    (void)state;
    rf_tp_vocab v;
    /* MiniLM's 30522 over 4: blocks of 7631, padded to 30524; the last rank
     * owns 7629 ids and 2 padding rows */
    int lo = 0;
    for (int r = 0; r < 4; r++) {
        assert_int_equal(rf_tp_vocab_split(30522, 4, r, &v), RF_OK);
        assert_int_equal(v.block, 7631);
        assert_int_equal(v.padded, 30524);
        assert_int_equal(v.lo, lo);
        assert_int_equal(v.hi, r < 3 ? lo + 7631 : 30522);
        lo = v.hi;
    }
    /* 5 ids over 4 ranks: blocks of 2; the last rank owns none */
    int want[4][2] = {{0, 2}, {2, 4}, {4, 5}, {5, 5}};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(rf_tp_vocab_split(5, 4, r, &v), RF_OK);
        assert_int_equal(v.block, 2);
        assert_int_equal(v.padded, 8);
        assert_int_equal(v.lo, want[r][0]);
        assert_int_equal(v.hi, want[r][1]);
    }
    assert_int_equal(rf_tp_vocab_split(100, 1, 0, &v), RF_OK);
    assert_true(v.lo == 0 && v.hi == 100 && v.block == 100 && v.padded == 100);
    assert_int_equal(rf_tp_vocab_split(100, 4, 4, &v), RF_ERR_INVALID);
    assert_int_equal(rf_tp_vocab_split(0, 4, 0, &v), RF_ERR_INVALID);
}

static void test_mesh_of_one(void **state) {
    (void)state;
    rf_comm_env env = {.launch = RF_COMM_LAUNCH_SINGLE, .rank = 0, .world = 1, .local_rank = -1};
    rf_comm *w;
    assert_int_equal(rf_comm_init(NULL, &env, &w), RF_OK);
    rf_tr_parallel p = rf_tr_parallel_default();
    rf_comm_mesh m;
    assert_int_equal(rf_tr_mesh_init(w, &p, &m), RF_OK);
    assert_int_equal(rf_comm_world(m.tp_comm), 1);
    assert_int_equal(rf_comm_world(m.dp_comm), 1);
    assert_int_equal(rf_comm_world(m.pp_comm), 1);
    assert_true(m.dp_i == 0 && m.tp_i == 0 && m.pp_i == 0);
    assert_int_equal(rf_comm_mesh_destroy(&m), RF_OK);
    p.tp = 2;
    assert_int_equal(rf_tr_mesh_init(w, &p, &m), RF_ERR_INVALID);
    assert_msg("dp 1 x tp 2 x pp 1 = 2 rank(s) but the group has 1");
    assert_int_equal(rf_comm_destroy(w), RF_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse), cmocka_unit_test(test_world),
        cmocka_unit_test(test_model), cmocka_unit_test(test_coords),
        cmocka_unit_test(test_vocab), cmocka_unit_test(test_mesh_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
