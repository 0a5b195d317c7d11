#!/usr/bin/env bash
# Installs everything denpex's tests need (Debian packages, then Python packages) and runs
# the whole suite: lint, the catalog check, the frozen binaries, the GPU checks (they skip
# without a GPU), then the tests, once: those whose code reaches a compiled extension run on
# it and on its pure-Python twin in the same run.
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
# npm: the OpenID provider (node-oidc-provider) the OIDC tests start, pinned by its lock file
phase "npm packages (tests/enterprise/oidc)" \
    npm ci --prefix tests/enterprise/oidc --no-audit --no-fund --loglevel=error
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
# the junit XML is what `denpex compliance report` reads each control's test results from
# one run: tests of code that reaches a native module run on it and on its pure-Python twin
# (ids [native] / [reference]: tests/conftest.py's both_backends and module_backend)
phase "tests" "$PYTHON" -m pytest --junitxml=build/test-results/junit.xml "$@"

echo "== summary"
if [[ ${#failed[@]} -eq 0 ]]; then
    echo "test-all: every phase passed"
    exit 0
fi
printf 'test-all: FAILED: %s\n' "${failed[@]}"
exit 1
