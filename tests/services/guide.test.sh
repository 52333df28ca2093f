#!/usr/bin/env bash
# services/README.md's by-hand guide, run as written: every fenced block that
# follows a `<!-- guide -->` line, in order, in one bash, so that the guide
# and this test cannot drift apart. The only changes: its ports 7101-7105 are
# moved to free ones (tests run beside other services), and under make asan
# build/refinery* is build-asan/refinery*. It runs in a
# terminal of its own (script(1)) with job control, as a person's shell
# would: a background process that read the terminal would be stopped there
# (the Kafka mock once was) and the stop at the end would hang.
#
# The guide starts the mock Kafka and a throwaway PostgreSQL, the five
# services, submits examples/amazon.yaml with the tiny model (the guide's
# "try in seconds" block) and watches it to the end, shows its status,
# watches the ended run, prints `refinery help watch`, classifies two texts
# and stops everything. Checked here: the guide exits 0 (each command, under
# set -e), every record of the three Amazon files is accounted for, the run
# succeeded with an evaluation, classify answers per text, and every service
# logged its stop.
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -d ../shared/data/amazon ] || { echo "../shared/data/amazon is missing (the guide reads it)"; exit 77; }
command -v script >/dev/null || { echo "script(1) is missing (util-linux)"; exit 77; }
readme=services/README.md

# The guide's blocks, in order.
awk '/^<!-- guide -->$/ { want = 1; next }
     want && /^```sh$/ { on = 1; want = 0; next }
     on && /^```$/ { on = 0; print ""; next }
     on { print }' "$readme" >"$TEST_DIR/blocks.sh"
n=$(grep -c '^<!-- guide -->$' "$readme")
[ "$n" -ge 6 ] || { echo "only $n guide blocks in $readme" >&2; exit 1; }
grep -q 'refinery submit examples/amazon.yaml' "$TEST_DIR/blocks.sh"

# Free ports for 7101-7105.
read -r -a ports < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
subst=()
for i in 0 1 2 3 4; do subst+=(-e "s/127\.0\.0\.1:710$((i + 1))\b/127.0.0.1:${ports[$i]}/g"); done
# Under make asan the binaries are those of $REFINERY_BUILD (build-asan).
build_rel=${REFINERY_BUILD#"$REFINERY_ROOT"/}
[ "$build_rel" = build ] || subst+=(-e "s#\bbuild/refinery#$build_rel/refinery#g")
sed "${subst[@]}" "$TEST_DIR/blocks.sh" >"$TEST_DIR/body.sh"
! grep -n '710[1-5]' "$TEST_DIR/body.sh" | grep -v '^[0-9]*:#' || { echo "a port was not moved" >&2; exit 1; }

{
    echo "set -euo pipefail"
    echo "set -m # job control, as in a terminal"
    # If a command fails, what the guide started goes too.
    # (The guide's own status is kept: the trap does not exit.)
    echo 'trap '\''set +e; p=$(jobs -p); [ -z "$p" ] || kill $p 2>/dev/null; [ -z "${PGDIR:-}" ] || scripts/test-env/pg.sh stop "$PGDIR" 2>/dev/null'\'' EXIT'
    cat "$TEST_DIR/body.sh"
    echo 'echo "guide: done"'
} >"$TEST_DIR/guide.sh"
echo "running $n blocks ($(grep -cv '^\s*\(#\|$\)' "$TEST_DIR/body.sh") command lines) of $readme"

# A clean environment apart from the tools' paths, and a watchdog that stops
# the guide's PostgreSQL if this test dies.
rc=0
start=$SECONDS
env -i PATH="$PATH" HOME="${HOME:-/tmp}" TERM=dumb LANG=C.UTF-8 PG_OWNER_PID=$$ \
    ${ASAN_OPTIONS:+ASAN_OPTIONS="$ASAN_OPTIONS"} ${UBSAN_OPTIONS:+UBSAN_OPTIONS="$UBSAN_OPTIONS"} \
    ${LSAN_OPTIONS:+LSAN_OPTIONS="$LSAN_OPTIONS"} \
    timeout -k 10 180 script -qec "bash $TEST_DIR/guide.sh >$TEST_DIR/guide.log 2>&1" /dev/null \
    </dev/null >/dev/null 2>&1 || rc=$?
echo "the guide ran for $((SECONDS - start)) s, exit $rc"
out=$TEST_DIR/guide.log
fail() { echo "guide: $*" >&2; grep -v '^{"ts"' "$out" | tail -n 40 >&2; exit 1; }
[ $rc -eq 0 ] || fail "exit $rc"
grep -q '^guide: done$' "$out" || fail "did not reach its end"

# submit: every record of the three files accounted for, sealed.
summary=$(grep '^{"run_id":"amazon-1","records"' "$out") || fail "no submit summary"
echo "submit: $summary"
python3 - "$summary" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
assert s["records"] == 12596, s
assert s["pushed"] + s["client_rejected"] == s["records"], s
assert s["accepted"] + s["rejected"] == s["pushed"] and s["accepted"] > 12000, s
assert s["sealed"] is True, s
PY
grep -q ' amazon-1 succeeded sealed | ingest .* | eval@[0-9]' "$out" || fail "no succeeded progress line"
status=$(grep '^{"run_id":"amazon-1","state"' "$out" | tail -n 1)
python3 - "$status" <<'PY'
import json, sys
s = json.loads(sys.argv[1])
assert s["state"] == "succeeded", s
assert s["checkpoint_step"] == 4 and s["eval_step"] == 4, s
assert "accuracy" in s["eval"], s
for name, st in s["stages"].items():
    assert st["complete"] and st["liveness"] == "ended" and st["last_progress"], (name, st)
print("status: succeeded, step 4, accuracy %.3f; every stage complete" % s["eval"]["accuracy"])
PY
grep -q '^usage: refinery watch RUN' "$out" || fail "refinery help watch printed no usage"
grep -q '^exit: ' "$out" || fail "refinery help watch printed no exit statuses"
[ "$(grep -c '^{"step":4,"label":[01],"probs":\[' "$out")" -eq 2 ] || fail "classify: not 2 predictions"
for s in ingest dedup tokenizer trainer evaluator; do
    grep -q "\"comp\":\"$s\",\"msg\":\"stopped: " "$out" || fail "refinery-$s logged no stop"
done
# Also without --control: `refinery-kafka-mock &` in a terminal with job
# control is not stopped by it (it read stdin, and the terminal stopped it
# with SIGTTIN).
script -qec "bash -c 'set -m; $REFINERY_BUILD/refinery-kafka-mock >$TEST_DIR/bg.out 2>$TEST_DIR/bg.log &
p=\$!; sleep 1; ps -o stat= -p \$p >$TEST_DIR/bg.stat; kill -CONT \$p; kill \$p; wait \$p'" /dev/null \
    </dev/null >/dev/null 2>&1 || true
stat=$(tr -d ' ' <"$TEST_DIR/bg.stat")
echo "kafka mock in the background of a terminal: state $stat"
[ -n "$stat" ] && [[ $stat != T* ]] || fail "the background kafka mock was stopped (state '$stat')"
grep -q '^bootstrap=' "$TEST_DIR/bg.out" || fail "the background kafka mock printed no bootstrap"
echo "guide: ok"
