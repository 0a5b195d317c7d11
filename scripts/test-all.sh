#!/usr/bin/env bash
# Installs everything denpex's tests need (Debian packages, then Python packages) and runs
# the whole suite: lint, the catalog check, the frozen binaries, the GPU checks (they skip
# without a GPU), then the tests with the compiled extensions and again on the pure-Python
# fallbacks (DENPEX_NO_EXTENSIONS=1).
# Every phase runs and reports, whatever happened before it; the exit status is 1 when any
# phase failed, and the summary at the end names them.
# Usage: bash scripts/test-all.sh [pytest args]   (e.g. -m "not slow" to skip the slow suites)
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
failed=()

phase() {  # phase NAME COMMAND...: run one phase, report how it ended, never stop the script
    local name=$1 status
    shift
    echo "== $name"
    "$@"
    status=$?
    if [[ $status -eq 0 ]]; then
        echo "-- $name: ok"
    else
        echo "-- $name: FAILED (exit $status)"
        failed+=("$name")
    fi
}

phase "Debian packages" bash scripts/install-packages.sh scripts/system-packages.txt
phase "Python packages" "$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[test]'
phase "eBPF objects (CO-RE, from bpf/*.bpf.c)" "$PYTHON" bpf/build.py
phase "backends" "$PYTHON" -m denpex --version --verbose
phase "lint: ruff check" "$PYTHON" -m ruff check .
phase "lint: ruff format" "$PYTHON" -m ruff format --check .
phase "lint: mypy" "$PYTHON" -m mypy denpex _native sdk
phase "catalog" "$PYTHON" -m denpex.catalog.check
if [[ "$*" != *"not slow"* ]]; then  # the slow dist tests run them; a build error shows here
    phase "frozen binaries (dist/: onedir, onefile, static)" bash dist_scripts/build_binary.sh
fi
# every check that needs a real NVIDIA GPU; without one it prints them all SKIP and passes
phase "GPU checks (scripts/gpu-check.sh)" env PYTHON="$PYTHON" bash scripts/gpu-check.sh
phase "tests (compiled extensions)" "$PYTHON" -m pytest "$@"
DENPEX_NO_EXTENSIONS=1 phase "tests (pure-Python fallbacks, DENPEX_NO_EXTENSIONS=1)" \
    "$PYTHON" -m pytest -m "not slow" -p no:cacheprovider -q "$@"

echo "== summary"
if [[ ${#failed[@]} -eq 0 ]]; then
    echo "test-all: every phase passed"
    exit 0
fi
printf 'test-all: FAILED: %s\n' "${failed[@]}"
exit 1
