/* The 1F1B schedule (trainer/pipeline.h) against hand-written tables, and the
 * executor with one stage (no group). The multi-stage executor runs under
 * mpirun in tests/trainer/pp.test.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "trainer/pipeline.h"

/* Written by hand from the rule (warmup = stages - stage - 1 forwards, then
 * one forward one backward, then the remaining backwards), not generated:
 * {stages, micro, one line per stage}. */
static const struct {
    int p, m;
    const char *stage[4];
} tables[] = {
    {2, 1, {"F0 B0", "F0 B0"}},
    {2, 2, {"F0 F1 B0 B1", "F0 B0 F1 B1"}},
    {2, 4, {"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"}},
    {2,
     8,
     {"F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"}},
    {4, 1, {"F0 B0", "F0 B0", "F0 B0", "F0 B0"}},
    {4, 2, {"F0 F1 B0 B1", "F0 F1 B0 B1", "F0 F1 B0 B1", "F0 B0 F1 B1"}},
    {4,
     4,
     {"F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3",
      "F0 B0 F1 B1 F2 B2 F3 B3"}},
    {4,
     8,
     {"F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"}},
};

static void format(const rf_pp_op *ops, int n, char *out, size_t cap) {
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%c%d", i ? " " : "",
                               ops[i].kind == RF_PP_FWD ? 'F' : 'B', ops[i].micro);
}

static void test_schedule_tables(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        for (int s = 0; s < tables[t].p; s++) {
            rf_pp_op ops[16];
            char got[128];
            assert_int_equal(rf_pp_schedule(tables[t].p, s, tables[t].m, ops), RF_OK);
            format(ops, 2 * tables[t].m, got, sizeof got);
            if (strcmp(got, tables[t].stage[s]))
                fail_msg("p=%d m=%d stage %d: got \"%s\", want \"%s\"", tables[t].p, tables[t].m, s,
                         got, tables[t].stage[s]);
            int w = tables[t].p - s - 1;
            assert_int_equal(rf_pp_warmup(tables[t].p, s, tables[t].m),
                             w < tables[t].m ? w : tables[t].m);
        }
    }
}

/* Any shape: every micro-batch once forward, once backward, the backward
 * after its forward, backwards in order, and at most stages - stage
 * micro-batches in flight. */
static void test_schedule_invariants(void **state) {
    (void)state;
    for (int p = 1; p <= 9; p++)
        for (int m = 1; m <= 17; m++)
            for (int s = 0; s < p; s++) {
                rf_pp_op ops[34];
                assert_int_equal(rf_pp_schedule(p, s, m, ops), RF_OK);
                int fwd = 0, bwd = 0, live = 0, peak = 0;
                for (int k = 0; k < 2 * m; k++) {
                    if (ops[k].kind == RF_PP_FWD) {
                        assert_int_equal(ops[k].micro, fwd++);
                        live++;
                    } else {
                        assert_int_equal(ops[k].micro, bwd++);
                        assert_true(bwd <= fwd);
                        live--;
                    }
                    peak = live > peak ? live : peak;
                }
                assert_int_equal(fwd, m);
                assert_int_equal(bwd, m);
                assert_true(peak <= p - s);
                assert_int_equal(peak, m < p - s ? m : p - s);
            }
}

static void test_schedule_errors(void **state) {
    (void)state;
    rf_pp_op ops[4];
    assert_int_equal(rf_pp_schedule(0, 0, 1, ops), RF_ERR_INVALID);
    assert_int_equal(rf_pp_schedule(2, 2, 1, ops), RF_ERR_INVALID);
    assert_int_equal(rf_pp_schedule(2, -1, 1, ops), RF_ERR_INVALID);
    assert_int_equal(rf_pp_schedule(2, 0, 0, ops), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "micro-batches"));
    assert_true(rf_pp_bubble_theory(1, 8) == 0.0);
    assert_true(rf_pp_bubble_theory(4, 8) == 3.0 / 11.0);
    assert_true(rf_pp_bubble_theory(2, 4) == 1.0 / 5.0);
}

/* One stage: F0 B0 F1 B1 ..., no boundary buffers, no inputs; a callback's
 * error stops the run and comes back. */
typedef struct one {
    char log[256];
    size_t at;
    int fail_at; /* fail the backward of this micro-batch (-1: never) */
} one;

static void one_stage(rf_pp_stage *st, one *o);

static size_t one_boundary(void *u, int edge, int micro) {
    (void)u, (void)edge, (void)micro;
    fail_msg("boundary asked for with one stage");
    return 0;
}
static int one_fwd(void *u, int micro, const float *in, float *out) {
    one *o = u;
    assert_null(in);
    assert_null(out);
    o->at +=
        (size_t)snprintf(o->log + o->at, sizeof o->log - o->at, "%sF%d", o->at ? " " : "", micro);
    return RF_OK;
}
static int one_bwd(void *u, int micro, const float *in, const float *dout, float *din) {
    one *o = u;
    assert_null(in);
    assert_null(dout);
    assert_null(din);
    o->at += (size_t)snprintf(o->log + o->at, sizeof o->log - o->at, " B%d", micro);
    return micro == o->fail_at ? rf_fail(RF_ERR_RANGE, "callback failed") : RF_OK;
}

/* One stage, with both executors (pipeline.h): no transfers, 1F1B order,
 * a callback's error stops the run. */
static void test_one_stage(void **state) {
    (void)state;
    for (int paired = 0; paired < 2; paired++) {
        one o = {.fail_at = -1};
        rf_pp_stage st = {.user = &o,
                          .boundary = one_boundary,
                          .forward = one_fwd,
                          .backward = one_bwd,
                          .paired = paired};
        one_stage(&st, &o);
    }
}
static void one_stage(rf_pp_stage *st, one *o) {
    rf_pp_stats stats;
    assert_int_equal(rf_pp_run(NULL, 4, st, &stats), RF_OK);
    assert_string_equal(o->log, "F0 B0 F1 B1 F2 B2 F3 B3");
    assert_int_equal(stats.stages, 1);
    assert_true(stats.theory == 0.0);
    assert_int_equal(stats.bytes_sent, 0);
    assert_int_equal(stats.peak_floats, 0);
    assert_true(stats.compute_s <= stats.step_s);
    one f = {.fail_at = 1};
    st->user = &f;
    assert_int_equal(rf_pp_run(NULL, 4, st, NULL), RF_ERR_RANGE);
    assert_string_equal(f.log, "F0 B0 F1 B1");
    assert_int_equal(rf_pp_run(NULL, 0, st, NULL), RF_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_tables),
        cmocka_unit_test(test_schedule_invariants),
        cmocka_unit_test(test_schedule_errors),
        cmocka_unit_test(test_one_stage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
