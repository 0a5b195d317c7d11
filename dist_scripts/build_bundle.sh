#!/usr/bin/env bash
# Builds the signed air-gapped bundle dist/denpex-airgap-bundle-<version>-<arch>.tar.gz: both
# frozen binaries, install.sh, the systemd unit, Slurm scripts, the Kubernetes DaemonSet, an
# annotated agent.yaml, a CycloneDX SBOM, SHA256SUMS and its minisign signature.
# Usage: bash dist_scripts/build_bundle.sh (--key FILE | --throwaway-key DIR) [--version V]
#        [--arch A] [--out DIR] [--binary-dir DIR] [--static PATH] [--python PY] [--help]
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash dist_scripts/build_bundle.sh (--key FILE | --throwaway-key DIR) [options]

  --key FILE           the release secret key (minisign format, unencrypted: `minisign -G -W`
                       or `python dist_scripts/sign.py keygen DIR`)
  --throwaway-key DIR  tests and development: use DIR/denpex-release.key, generating a new key
                       pair there first when there is none
  --version V          default: denpex.__version__
  --arch A             default: uname -m
  --out DIR            where the .tar.gz goes (default: dist/)
  --binary-dir DIR     the onedir build (default dist/denpex; built when missing)
  --static PATH        the static onefile binary (default dist/denpex-static; built when missing)
  --python PY          the interpreter that froze the binaries, for the SBOM's package list
                       (default build/frozen/venv/bin/python, else python3)
  --help               this text
Environment: PYTHON (runs sign.py and sbom.py; needs `cryptography`; default python3),
SOURCE_DATE_EPOCH (file times inside the tarball; default: the last commit's time).
USAGE
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE="$ROOT/dist_scripts"
VERSION=""
ARCH=$(uname -m)
KEY=""
THROWAWAY=""
OUT="$ROOT/dist"
BINARY_DIR=""
STATIC=""
FREEZE_PYTHON=""
PYTHON=${PYTHON:-python3}
log() { echo "build_bundle: $*"; }
fail() {
    echo "build_bundle: $*" >&2
    exit 1
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --version) VERSION=$2; shift 2 ;;
        --arch) ARCH=$2; shift 2 ;;
        --key) KEY=$(realpath "$2"); shift 2 ;;
        --throwaway-key) THROWAWAY=$(realpath -m "$2"); shift 2 ;;
        --out) OUT=$(realpath -m "$2"); shift 2 ;;
        --binary-dir) BINARY_DIR=$(realpath -m "$2"); shift 2 ;;
        --static) STATIC=$(realpath -m "$2"); shift 2 ;;
        --python) FREEZE_PYTHON=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "build_bundle: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -n "$KEY" && -n "$THROWAWAY" ]] || [[ -z "$KEY" && -z "$THROWAWAY" ]]; then
    echo "build_bundle: give exactly one of --key FILE (a release) or --throwaway-key DIR (tests)" >&2
    exit 2
fi
if [[ -n "$THROWAWAY" ]]; then
    KEY="$THROWAWAY/denpex-release.key"
    [[ -f "$KEY" ]] || "$PYTHON" "$HERE/sign.py" keygen "$THROWAWAY"
    log "THROWAWAY KEY $KEY: not for release"
fi
[[ -r "$KEY" ]] || fail "cannot read the key $KEY"
[[ -n "$VERSION" ]] || VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/denpex/__init__.py")
[[ "$VERSION" =~ ^[A-Za-z0-9._+-]+$ ]] || fail "bad version '$VERSION'"
[[ "$ARCH" =~ ^[A-Za-z0-9_-]+$ ]] || fail "bad arch '$ARCH'"

# the binaries: given, or dist/ from build_binary.sh (run when dist/ lacks them)
if [[ -z "$BINARY_DIR" || -z "$STATIC" ]]; then
    if [[ ( -z "$BINARY_DIR" && ! -x "$ROOT/dist/denpex/denpex" ) || ( -z "$STATIC" && ! -x "$ROOT/dist/denpex-static" ) ]]; then
        [[ -f "$HERE/build_binary.sh" ]] || fail "no frozen binaries in dist/ and no dist_scripts/build_binary.sh"
        log "building the frozen binaries (dist_scripts/build_binary.sh)"
        bash "$HERE/build_binary.sh" --key "$KEY"
    fi
    BINARY_DIR=${BINARY_DIR:-$ROOT/dist/denpex}
    STATIC=${STATIC:-$ROOT/dist/denpex-static}
fi
[[ -x "$BINARY_DIR/denpex" ]] || fail "$BINARY_DIR/denpex is not an executable (the onedir build)"
[[ -x "$STATIC" ]] || fail "$STATIC is not an executable (the static binary)"
# the eBPF objects inside must be signed by the key this bundle is signed with
SHIPPED_PUB="$BINARY_DIR/_internal/denpex/host/bpf/denpex-release.pub"
if [[ -n "$(ls "$BINARY_DIR"/_internal/denpex/host/bpf/*.bpf.o 2>/dev/null)" ]] &&
    [[ "$(cat "$SHIPPED_PUB" 2>/dev/null)" != "$("$PYTHON" "$HERE/sign.py" pubkey --key "$KEY")" ]]; then
    what="the eBPF objects in $BINARY_DIR are not signed by $KEY (rebuild: bash dist_scripts/build_binary.sh --key $KEY)"
    [[ -n "$THROWAWAY" ]] || fail "$what"
    log "WARNING: $what; acceptable for a throwaway bundle only"
fi
if [[ -z "$FREEZE_PYTHON" ]]; then
    FREEZE_PYTHON="$ROOT/build/frozen/venv/bin/python"
    if [[ ! -x "$FREEZE_PYTHON" ]]; then
        FREEZE_PYTHON=$PYTHON
        log "no build/frozen/venv: the SBOM lists the packages of $PYTHON instead"
    fi
fi

NAME="denpex-airgap-bundle-$VERSION-$ARCH"
mkdir -p "$OUT"
STAGE_ROOT=$(mktemp -d "$OUT/.bundle-stage.XXXXXX")
trap 'rm -rf "$STAGE_ROOT"' EXIT
STAGE="$STAGE_ROOT/$NAME"
mkdir -p "$STAGE"

log "staging $NAME"
cp -RL "$BINARY_DIR" "$STAGE/denpex"  # -L: a bundle holds plain files only
cp -L "$STATIC" "$STAGE/denpex-static"
cp "$HERE/bundle/install.sh" "$STAGE/install.sh"
for folder in systemd slurm k8s config objects; do
    cp -R "$HERE/bundle/$folder" "$STAGE/$folder"
done
cp "$HERE/bundle/README.txt" "$STAGE/README.txt"
printf 'version=%s\narch=%s\n' "$VERSION" "$ARCH" >"$STAGE/BUNDLE-INFO"
"$PYTHON" "$HERE/sign.py" pubkey --key "$KEY" >"$STAGE/denpex-release.pub"
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+rwX,go+rX,go-w "$STAGE"
chmod 755 "$STAGE/install.sh" "$STAGE/denpex-static" "$STAGE/denpex/denpex" "$STAGE"/slurm/*.sh

"$PYTHON" "$HERE/sbom.py" --bundle "$STAGE" --version "$VERSION" --arch "$ARCH" \
    --python "$FREEZE_PYTHON" --out "$STAGE/sbom.cdx.json"

# names install.sh accepts (it refuses anything else in SHA256SUMS)
odd=$(cd "$STAGE" && find . ! -type d | sed 's|^\./||' |
    grep -Ev '^[A-Za-z0-9._+@=~,-]+(/[A-Za-z0-9._+@=~,-]+)*$' | head -n 3 || true)
[[ -z "$odd" ]] || fail "file names install.sh would refuse: $odd"
[[ -z "$(find "$STAGE" ! -type d ! -type f -print -quit)" ]] || fail "links or special files in $STAGE"

log "SHA256SUMS and signature"
(cd "$STAGE" && find . -type f | sed 's|^\./||' | LC_ALL=C sort | xargs -d '\n' sha256sum) >"$STAGE_ROOT/SHA256SUMS"
mv "$STAGE_ROOT/SHA256SUMS" "$STAGE/SHA256SUMS"
"$PYTHON" "$HERE/sign.py" sign --key "$KEY" \
    --trusted "$NAME timestamp:$(date +%s) files:$(wc -l <"$STAGE/SHA256SUMS")" "$STAGE/SHA256SUMS"

EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}
TARBALL="$OUT/$NAME.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" \
    -C "$STAGE_ROOT" -cf - "$NAME" | gzip -n -6 >"$TARBALL.partial"
mv "$TARBALL.partial" "$TARBALL"
cp "$STAGE/denpex-release.pub" "$OUT/denpex-release.pub"

log "checking the result (denpex.core.bundle)"
PYTHONPATH="$ROOT" "$PYTHON" - "$TARBALL" "$STAGE/denpex-release.pub" <<'PY'
import sys

from denpex.core import signing
from denpex.core.bundle import check_bundle

result = check_bundle(sys.argv[1], signing.parse_public_key(open(sys.argv[2], "rb").read()))
print(f"build_bundle: verified {result.files} files, key {result.key_id}")
PY
log "done: $TARBALL ($(du -h "$TARBALL" | cut -f1)); key $(sed -n 1p "$STAGE/denpex-release.pub")"
