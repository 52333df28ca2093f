#!/usr/bin/env bash
# lsan_foreign.sh LOG MODULE...
#
# Reads a LeakSanitizer report in LOG and tells the leaks of a third-party
# library from ours. A leak block (its "Direct/Indirect leak of ..." line and
# its allocation stack) is the library's own when every frame of the stack,
# past the sanitizer's allocator, lies in one of the MODULEs (e.g.
# librdkafka.so) or in libc's thread start: the memory was allocated on the
# library's own threads, with no function of ours on the stack. Any other
# leak is ours. The process must have run with fast_unwind_on_malloc=0: the
# frame-pointer unwinder stops inside libraries built without frame pointers,
# and a stack cut short would hide our callers.
#
# Prints every leak block, then one line with the counts. Exits 1 when a leak
# is ours (or a report is there but no block could be read: a format this
# script does not know), 0 otherwise (no leak, or only the libraries' own).
set -u
log=$1
shift
[ $# -gt 0 ] || { echo "usage: lsan_foreign.sh LOG MODULE..." >&2; exit 2; }
awk -v mods="$*" '
function judge(   k, f, foreign) {
    if (!inblock) return
    foreign = 1
    for (k = 1; k <= nf; k++) {
        f = frames[k]
        if (f ~ /libsanitizer|__interceptor_|asan_malloc|\/libasan\.so|\/libubsan\.so/) continue
        if (f ~ /\/libc\.so\.6|[ (]nptl\/|sysdeps\/unix\/sysv\/linux\/[^ ]*clone/) continue
        ok = 0
        for (m in mod) if (index(f, "/" mod[m]) > 0) ok = 1
        if (!ok) { foreign = 0; break }
    }
    if (nf == 0) foreign = 0
    print (foreign ? "[library] " : "[ours]    ") head
    for (k = 1; k <= nf; k++) print "    " frames[k]
    if (foreign) nforeign++; else nours++
    inblock = 0; nf = 0
}
BEGIN { n = split(mods, mod, " "); report = 0; nforeign = 0; nours = 0 }
/ERROR: LeakSanitizer/ { report = 1 }
/^(Direct|Indirect) leak of / { judge(); inblock = 1; head = $0; nf = 0; next }
inblock && /^ *#[0-9]+ 0x/ { sub(/^ +/, ""); frames[++nf] = $0; next }
inblock && /^ *$/ { judge(); next }
END {
    judge()
    printf "lsan: %d leak(s) of the libraries (%s) alone, %d of ours\n", nforeign, mods, nours
    if (nours > 0) exit 1
    if (report && nforeign == 0) { print "lsan: a leak report without a block this script reads"; exit 1 }
}' "$log"
