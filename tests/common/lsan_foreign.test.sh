#!/usr/bin/env bash
# tests/support/lsan_foreign.sh, which kafka_mock.test.sh uses under make asan
# to tell librdkafka's own leaks from ours, on four reports: the one CI saw on
# 2026-11-28 (a partition list allocated inside librdkafka, no frame of ours;
# shown here with the whole stack a slow unwind gives), the same with a frame
# of ours on the stack, no report at all, and a report in a form it cannot read.
set -u
filter="$REFINERY_ROOT/tests/support/lsan_foreign.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
expect() { # expect STATUS NAME: the filter's exit status on $dir/NAME
    "$filter" "$dir/$2" librdkafka.so >"$dir/$2.out" 2>&1
    local got=$?
    if [ "$got" -ne "$1" ]; then
        echo "FAIL $2: exit $got, expected $1"
        cat "$dir/$2.out"
        fail=1
    else
        echo "ok $2: exit $got ($(tail -1 "$dir/$2.out"))"
    fi
}
cat >"$dir/library" <<'R'
=================================================================
==2966==ERROR: LeakSanitizer: detected memory leaks

Direct leak of 16 byte(s) in 1 object(s) allocated from:
    #0 0x7f50d0cb83b7 in __interceptor_calloc ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:77
    #1 0x7f50d0ab7e55 in rd_kafka_topic_partition_list_new (/lib/x86_64-linux-gnu/librdkafka.so.1+0x93e55)
    #2 0x7f50d0a51234  (/lib/x86_64-linux-gnu/librdkafka.so.1+0x2d234)
    #3 0x7f50d0a9aaaa  (/lib/x86_64-linux-gnu/librdkafka.so.1+0x76aaa)
    #4 0x7f50d0693fd3 in start_thread nptl/pthread_create.c:442
    #5 0x7f50d071466b in clone3 ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81

Indirect leak of 64 byte(s) in 1 object(s) allocated from:
    #0 0x7f50d0cb78d5 in __interceptor_realloc ../../../../src/libsanitizer/asan/asan_malloc_linux.cpp:85
    #1 0x7f50d0ab420a  (/lib/x86_64-linux-gnu/librdkafka.so.1+0x9020a)
    #2 0x7f50d0693fd3 in start_thread (/lib/x86_64-linux-gnu/libc.so.6+0x89134)

SUMMARY: AddressSanitizer: 80 byte(s) leaked in 2 allocation(s).
R
sed 's|#3 0x7f50d0a9aaaa  (/lib/x86_64-linux-gnu/librdkafka.so.1+0x76aaa)|#3 0x55d0a9aaaa in offset_reset services/runtime/kafka/consumer.c:95|' \
    "$dir/library" >"$dir/ours"
grep -q offset_reset "$dir/ours" || { echo "FAIL: the fixture edit did not apply"; exit 1; }
printf '[==========] 10 test(s) run.\n[  PASSED  ] 10 test(s).\n' >"$dir/none"
printf '==1==ERROR: LeakSanitizer: detected memory leaks\nsomething else\n' >"$dir/unknown"
expect 0 library
grep -q '^lsan: 2 leak(s) of the libraries (librdkafka.so) alone, 0 of ours' "$dir/library.out" ||
    { echo "FAIL library: counts"; fail=1; }
expect 1 ours
grep -q '^\[ours\]    Direct leak of 16' "$dir/ours.out" || { echo "FAIL ours: not named"; fail=1; }
expect 0 none
expect 1 unknown
exit $fail
