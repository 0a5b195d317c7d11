#!/usr/bin/env bash
# Installs everything denpex's tests need (Debian packages, then Python packages) and runs
# the whole suite: lint, the tests with the compiled extensions, then again on the
# pure-Python fallbacks (DENPEX_NO_EXTENSIONS=1). Usage: bash scripts/test-all.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

install_system_packages() {
    local wanted=() pkg
    while read -r pkg; do
        [[ -z "$pkg" || "$pkg" == \#* ]] && continue
        dpkg -s "$pkg" >/dev/null 2>&1 || wanted+=("$pkg")
    done < scripts/system-packages.txt
    [[ ${#wanted[@]} -eq 0 ]] && return 0
    if ! command -v apt-get >/dev/null; then
        echo "test-all: missing system packages (${wanted[*]}) and no apt-get; install them by hand" >&2
        return 1
    fi
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    echo "test-all: installing ${wanted[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${wanted[@]}"
}

command -v dpkg >/dev/null && install_system_packages
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[test]'

echo "== eBPF objects (CO-RE, from bpf/*.bpf.c)"
"$PYTHON" bpf/build.py || echo "test-all: eBPF objects not built; the BPF tests will skip and say why"
echo "== backends"
"$PYTHON" -m denpex --version --verbose
echo "== lint"
"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
"$PYTHON" -m mypy denpex _native sdk
echo "== catalog"
"$PYTHON" -m denpex.catalog.check
if [[ "$*" != *"not slow"* ]]; then  # the slow dist tests run them; a build error shows here
    echo "== frozen binaries (dist/: onedir, onefile, static)"
    bash dist_scripts/build_binary.sh
fi
echo "== tests (compiled extensions)"
"$PYTHON" -m pytest "$@"
echo "== tests (pure-Python fallbacks, DENPEX_NO_EXTENSIONS=1)"
DENPEX_NO_EXTENSIONS=1 "$PYTHON" -m pytest -m "not slow" -p no:cacheprovider -q "$@"
