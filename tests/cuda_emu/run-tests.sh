#!/usr/bin/env bash
# Runs every test program of the emulated device and prints one closing line,
# "N passed, N failed". Each program prints "PASS <case>" or "FAIL <case>: why"
# per case; a program that crashes or prints no PASS line counts as a failure.
set -uo pipefail
dir=$1
passed=0
failed=0
for t in "$dir"/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(timeout 600 "$t" 2>&1)
    rc=$?
    p=$(grep -c '^PASS ' <<<"$out")
    f=$(grep -c '^FAIL ' <<<"$out")
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ] || [ "$f" -gt 0 ] || [ "$p" -eq 0 ]; then
        echo "---- $name (exit $rc)"
        echo "$out" | tail -n 60
        if [ "$f" -eq 0 ]; then failed=$((failed + 1)); fi
    else
        echo "$name: $p passed"
    fi
done
echo "emulated device: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
