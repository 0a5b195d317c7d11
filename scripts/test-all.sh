#!/usr/bin/env bash
# Installs everything denpex's tests need (Debian packages, then Python packages) and runs
# the whole suite: lint, the tests with the compiled extensions, then again on the
# pure-Python fallbacks (DENPEX_NO_EXTENSIONS=1). Usage: bash scripts/test-all.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}

bash scripts/install-packages.sh scripts/system-packages.txt
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
