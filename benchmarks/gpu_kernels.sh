#!/usr/bin/env bash
# GPU run of the kernels, on the device machine, from the repository root:
#   bash benchmarks/gpu_kernels.sh [pytest-args...]
# Installs the nvidia-cutlass wheel from .whl/ (filled by ../shared/tools/gpu-wheels.sh),
# builds the CUTLASS extension once, runs the GPU tests, the benchmark, then the Triton
# tests of the CPU suite with real GPU compilation. The machine gets no .git: set
# REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) when launching (env.txt records it). Everything
# lands in $OUT: env.txt, build.log, gpu_tests.log, bench.log, kernels_bench.{json,md}.
set -uo pipefail
source "$(dirname "$0")/_gpu_common.sh" || exit 1
gpu_out /tmp/requant_gpu_out
source benchmarks/gpu_setup.sh || exit 1
{ gpu_env triton; nvcc --version | tail -2; } > "$OUT/env.txt" 2>&1
: > "$OUT/build.log"; : > "$OUT/gpu_tests.log"; : > "$OUT/bench.log"
STEP_LOG="$OUT/build.log" cutlass_build 420 verbose
STEP_LOG="$OUT/gpu_tests.log" step gpu_tests 240 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -s "$@"
tail -4 "$OUT/gpu_tests.log"
STEP_LOG="$OUT/bench.log" step bench 300 python3 benchmarks/bench_kernels.py --out "$OUT"
# The CPU suite again, on the GPU: Triton compiled for real (not interpreted), same oracle.
STEP_LOG="$OUT/gpu_tests.log" step cpu_suite_on_gpu 150 python3 -m pytest -q tests/kernels/test_triton.py \
    tests/kernels/test_reference.py -p no:cacheprovider
tail -60 "$OUT/bench.log"
