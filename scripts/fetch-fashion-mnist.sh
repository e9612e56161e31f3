#!/usr/bin/env bash
# Puts the real Fashion-MNIST set in data/fashion-mnist/ (or the directory
# given as $1) as the four gzipped IDX files `dataset = "fashion_mnist"` reads:
#   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz  (60,000 images)
#   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz   (10,000 images)
#
# Source: Debian's package `dataset-fashion-mnist` (pinned version, .deb
# sha256 checked), which holds Zalando's original files under
# /usr/share/datasets/fashion-mnist/. `apt-get download` fetches the .deb
# without installing it (no root needed); `dpkg-deb -x` unpacks it into a
# temporary directory.
#
# Idempotent: if the target already holds four valid 60,000/10,000 IDX files
# it says so and exits 0. Files are staged in a temporary directory next to
# the target and renamed into place (labels last), so an interrupted run
# never leaves a set that passes validation half-written.
#
# Needs: apt-get and dpkg-deb (Debian or Ubuntu with Debian's archive in its
# sources), python3 (standard library only, for the checks).

set -euo pipefail

PKG="dataset-fashion-mnist"
PKG_VERSION="0.0~git20200523.55506a9-1"
DEB_SHA256="39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0"
FILES=(train-images-idx3-ubyte.gz t10k-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-labels-idx1-ubyte.gz)

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-$repo_root/data/fashion-mnist}"

die() {
    echo "fetch-fashion-mnist: error: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 is not installed (needed to check the IDX files)"

# Prints "train N, test M" and exits 0 when the four files hold the full
# 60,000/10,000 set with consistent headers, else prints why and exits 1.
validate() {
    python3 - "$1" <<'PY'
import gzip, os, struct, sys

d = sys.argv[1]

def read(name):
    p = os.path.join(d, name)
    if not os.path.isfile(p):
        raise SystemExit(f"{p}: missing")
    try:
        with gzip.open(p, "rb") as f:
            return p, f.read()
    except OSError as e:
        raise SystemExit(f"{p}: unreadable: {e}")

def split(prefix, want):
    ip, img = read(f"{prefix}-images-idx3-ubyte.gz")
    lp, lab = read(f"{prefix}-labels-idx1-ubyte.gz")
    if len(img) < 16 or struct.unpack(">I", img[:4])[0] != 0x803:
        raise SystemExit(f"{ip}: not an IDX image file")
    n, h, w = struct.unpack(">III", img[4:16])
    if (n, h, w) != (want, 28, 28) or len(img) != 16 + n * h * w:
        raise SystemExit(f"{ip}: header says {n}x{h}x{w} ({len(img)} bytes), expected {want}x28x28")
    if len(lab) < 8 or struct.unpack(">I", lab[:4])[0] != 0x801:
        raise SystemExit(f"{lp}: not an IDX label file")
    m = struct.unpack(">I", lab[4:8])[0]
    if m != n or len(lab) != 8 + m:
        raise SystemExit(f"{lp}: {m} labels ({len(lab)} bytes) for {n} images")
    if max(lab[8:], default=0) >= 10:
        raise SystemExit(f"{lp}: label >= 10")
    return n

print(f"train {split('train', 60000)}, test {split('t10k', 10000)}")
PY
}

if [[ -d "$target" ]] && summary="$(validate "$target" 2>/dev/null)"; then
    echo "fetch-fashion-mnist: $target already holds valid Fashion-MNIST IDX files ($summary); nothing to do"
    exit 0
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get is not available; this script needs Debian's archive (or copy Fashion-MNIST's four .gz IDX files into $target by hand)"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is not installed (apt-get install dpkg)"

work="$(mktemp -d "${TMPDIR:-/tmp}/fetch-fashion-mnist.XXXXXX")"
stage=""
cleanup() {
    rm -rf "$work"
    if [[ -n "$stage" ]]; then rm -rf "$stage"; fi
}
trap cleanup EXIT

echo "fetch-fashion-mnist: downloading $PKG=$PKG_VERSION from the Debian archive ..."
# apt runs the download as user _apt, which cannot write a directory mktemp
# made private; the .deb's sha256 below is what vouches for it.
chmod 755 "$work"
if ! (cd "$work" && apt-get download "$PKG=$PKG_VERSION" >apt.out 2>apt.err); then
    sed 's/^/  /' "$work/apt.err" | head -n 5 >&2 || true
    die "could not download $PKG=$PKG_VERSION: is Debian's archive in the apt sources (try apt-get update)?"
fi
deb="$(ls "$work"/*.deb 2>/dev/null | head -n 1)"
[[ -n "$deb" && -f "$deb" ]] || die "apt-get download did not produce a .deb in $work"
got_sha="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$deb")"
[[ "$got_sha" == "$DEB_SHA256" ]] || die "$(basename "$deb") sha256 is $got_sha, expected $DEB_SHA256"

dpkg-deb -x "$deb" "$work/root" || die "dpkg-deb could not unpack $deb"
src="$work/root/usr/share/datasets/fashion-mnist"

mkdir -p "$(dirname "$target")"
# Same filesystem as the target, so the final renames are atomic.
stage="$(mktemp -d "$(dirname "$target")/.fashion-mnist.tmp.XXXXXX")"
for f in "${FILES[@]}"; do
    [[ -f "$src/$f" ]] || die "the package has no $f under /usr/share/datasets/fashion-mnist"
    cp "$src/$f" "$stage/$f"
done
validate "$stage" >/dev/null || die "the files from the package failed validation: $(validate "$stage" 2>&1)"

mkdir -p "$target"
for f in "${FILES[@]}"; do
    # The reader prefers a raw file over its .gz: drop raw twins so the
    # directory holds exactly the files this script checked.
    rm -f "$target/${f%.gz}"
    mv -f "$stage/$f" "$target/$f"
done

echo "fetch-fashion-mnist: wrote $target: $(validate "$target") (from Debian $PKG $PKG_VERSION)"
