#!/bin/sh
# Usage (inside the build stage): docker/collect.sh OUT BINARY...
# Copies each binary to OUT/usr/local/bin (without debug sections) and every shared library it loads (ldd's
# closure, with the loader) to the same path under OUT, plus the CA bundle and a
# passwd/group naming the fixed non-root user, so that a FROM scratch image runs it.
set -eu
out=$1; shift
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/tmp"
for b in "$@"; do
    cp "$b" "$out/usr/local/bin/"
    strip --strip-debug "$out/usr/local/bin/$(basename "$b")"   # symbols stay for backtraces
    ldd "$b" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | while read -r lib; do
        real=$(readlink -f "$lib")
        mkdir -p "$out$(dirname "$lib")"
        cp "$real" "$out$lib"
    done
done
cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
printf 'root:x:0:0:root:/:/sbin/nologin\nrefinery:x:10001:10001:refinery:/tmp:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nrefinery:x:10001:\n' >"$out/etc/group"
chmod 1777 "$out/tmp"
