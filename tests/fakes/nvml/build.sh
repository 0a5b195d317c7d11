#!/bin/sh
# Build the fake libnvidia-ml.so.1 from the C sources the package ships
# (denpex/gpu/nvml/fake.h, fake*.c); the tests and DENPEX_NVML_SHIM build the same library
# through denpex.gpu.nvml.scenario.build_fake_library. Usage: build.sh [OUTPUT_DIR]
set -eu
src=$(cd "$(dirname "$0")/../../../denpex/gpu/nvml" && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
${CC:-cc} -shared -fPIC -O2 -Wall -Wextra -Wno-unused-parameter -o "$out/libnvidia-ml.so.1" "$src"/fake*.c
echo "$out/libnvidia-ml.so.1"
echo "run with: LD_LIBRARY_PATH=$out DENPEX_FAKE_NVML_SCENARIO=<line file from denpex.gpu.nvml.scenario.write_lines>"
