#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: passes when CMD exits non-zero (not by a signal)
# and its stderr+stdout match REGEX (extended grep).
set -u
regex=$1; shift
out=$("$@" 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "expected a failure, got exit 0:"; echo "$out"; exit 1; fi
if [ $rc -gt 128 ]; then echo "crashed with signal $((rc-128)):"; echo "$out"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "output does not match /$regex/:"; echo "$out"; exit 1; fi
echo "ok (exit $rc): $(grep -E -m1 -- "$regex" <<<"$out")"
