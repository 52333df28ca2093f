#!/usr/bin/env bash
# tests/run.sh itself: a copy of it runs in a temporary tree holding only fake
# tests (never the real ones, so no recursion), and its output and exit status
# must count passes, failures, timeouts and skips as its header says:
#   build/tests/a/  real cmocka binaries (compiled here, with tests/support/skip.c):
#                   all cases pass; two of three cases skipped (one with RF_SKIP's
#                   reason, one bare skip()); every case skipped; one case failing
#   tests/b/        scripts: exit 0; exit 77 with "SKIP: reason"; bare exit 77;
#                   exit 3; one that outlives TEST_TIMEOUT=1
set -euo pipefail
cd "$REFINERY_ROOT"
t=$(mktemp -d /tmp/rf-run-sh.XXXXXX)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/tests/a" "$t/tests/b" "$t/build/tests/a"
cp tests/run.sh "$t/tests/run.sh"

cmocka_bin() { # NAME C-BODY-OF-CASES CASE-LIST
    cat >"$t/$1.c" <<EOF
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include "skip.h"
$2
int main(void) {
    const struct CMUnitTest t[] = {$3};
    return cmocka_run_group_tests(t, NULL, NULL);
}
EOF
    cc -std=c17 -Itests/support -o "$t/build/tests/a/$1" "$t/$1.c" tests/support/skip.c -lcmocka
}
cmocka_bin test_pass 'static void one(void **s) { (void)s; assert_int_equal(2, 1 + 1); }' \
    'cmocka_unit_test(one)'
cmocka_bin test_partial '
static void ok(void **s) { (void)s; assert_true(1); }
static void gpu(void **s) { (void)s; RF_SKIP("no GPU: %s", "none visible"); }
static void bare(void **s) { (void)s; skip(); }' \
    'cmocka_unit_test(ok), cmocka_unit_test(gpu), cmocka_unit_test(bare)'
cmocka_bin test_allskip 'static void model(void **s) { (void)s; RF_SKIP("no model at %d", 7); }' \
    'cmocka_unit_test(model)'
cmocka_bin test_fails '
static void good(void **s) { (void)s; }
static void bad(void **s) { (void)s; assert_int_equal(1, 2); }' \
    'cmocka_unit_test(good), cmocka_unit_test(bad)'

printf 'exit 0\n' >"$t/tests/b/ok.test.sh"
printf 'echo "SKIP: no network here"\nexit 77\n' >"$t/tests/b/skip.test.sh"
printf 'exit 77\n' >"$t/tests/b/quiet.test.sh"
printf 'echo broken; exit 3\n' >"$t/tests/b/fail.test.sh"
printf 'sleep 30\n' >"$t/tests/b/slow.test.sh"

out=$t/out
rc=0
env -u TESTS BUILD=build TEST_TIMEOUT=1 bash "$t/tests/run.sh" >"$out" 2>&1 || rc=$?
cat "$out"

bad=0
expect() { # a line that must be in the output, exactly (fixed string)
    grep -qxF -- "$1" "$out" || { echo "run_sh: missing line: $1"; bad=1; }
}
expect_re() { # a line that must match an extended regex
    grep -qxE -- "$1" "$out" || { echo "run_sh: no line matching: $1"; bad=1; }
}
expect "3 passed, 3 failed, 5 skipped"
[ "$(tail -n 1 "$out")" = "3 passed, 3 failed, 5 skipped" ] || { echo "run_sh: closing line is not last"; bad=1; }
[ $rc -ne 0 ] || { echo "run_sh: failures but exit 0"; bad=1; }
expect_re 'PASS a/test_pass +[0-9]+s'
expect_re 'PASS a/test_partial +[0-9]+s \(2 of 3 cases skipped\)'
expect "SKIP a/test_partial:gpu — no GPU: none visible"
expect "SKIP a/test_partial:bare — (no reason given)"
expect "SKIP a/test_allskip:model — no model at 7"
expect_re 'FAIL a/test_fails +[0-9]+s \(exit 1\)'
expect_re 'PASS b/ok.test.sh +[0-9]+s'
expect_re 'SKIP b/skip.test.sh +[0-9]+s — no network here'
expect_re 'SKIP b/quiet.test.sh +[0-9]+s — \(no reason given\)'
expect_re 'FAIL b/fail.test.sh +[0-9]+s \(exit 3\)'
expect_re 'FAIL b/slow.test.sh +[0-9]+s \(timed out after 1s, exit 124\)'
if grep -qE '^PASS a/test_allskip' "$out"; then echo "run_sh: an all-skipped binary shows as PASS"; bad=1; fi
[ "$(grep -c '^SKIP ' "$out")" -eq 5 ] || { echo "run_sh: SKIP lines != skipped count"; bad=1; }

# TESTS=pattern: only the matching tests, and a clean run exits 0
rc=0
env TESTS=a/test_pa BUILD=build bash "$t/tests/run.sh" >"$out" 2>&1 || rc=$?
cat "$out"
[ "$(tail -n 1 "$out")" = "2 passed, 0 failed, 2 skipped" ] || { echo "run_sh: TESTS=a/test_pa closing line"; bad=1; }
[ $rc -eq 0 ] || { echo "run_sh: clean run exited $rc"; bad=1; }
[ $bad -eq 0 ] && echo "run_sh: every expected line and status seen"
exit $bad
