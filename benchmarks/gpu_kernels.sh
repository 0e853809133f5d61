#!/usr/bin/env bash
# GPU run of the kernels, on the device machine, from the repository root:
#   bash benchmarks/gpu_kernels.sh [pytest-args...]
# Installs the nvidia-cutlass wheel from .whl/ (filled by ../shared/tools/gpu-wheels.sh),
# builds the CUTLASS extension once, runs the GPU tests, the benchmark, then the Triton
# tests of the CPU suite with real GPU compilation. The machine gets no .git: set
# REQUANT_COMMIT=$(bash benchmarks/commit_id.sh) when launching (env.txt records it). Everything
# lands in $OUT: env.txt, build.log, gpu_tests.log, bench.log, kernels_bench.{json,md}.
set -uo pipefail
OUT=${OUT:-/tmp/requant_gpu_out}
mkdir -p "$OUT"
source benchmarks/gpu_setup.sh || exit 1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  python3 -c "import torch,triton;print('torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__)"
  nvcc --version | tail -2
  echo "commit $(bash benchmarks/commit_id.sh)"; } > "$OUT/env.txt" 2>&1   # $REQUANT_COMMIT, else git, else unknown
# A killed build leaves torch's FileBaton lock behind; every later build would wait on it
# forever. Nothing else builds into this cache on the device machine, so remove it.
rm -f "$REQUANT_CUTLASS_CACHE/lock"
s=$SECONDS
timeout 420 python3 -c "import requant.kernels.cutlass as c; c.build(verbose=True)" > "$OUT/build.log" 2>&1
echo "build rc=$? in $((SECONDS - s)) s" | tee -a "$OUT/build.log"
s=$SECONDS
timeout 240 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider -s "$@" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? in $((SECONDS - s)) s" | tee -a "$OUT/gpu_tests.log"
tail -4 "$OUT/gpu_tests.log"
s=$SECONDS
timeout 300 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$? in $((SECONDS - s)) s" | tee -a "$OUT/bench.log"
s=$SECONDS
# The CPU suite again, on the GPU: Triton compiled for real (not interpreted), same oracle.
timeout 150 python3 -m pytest -q tests/kernels/test_triton.py tests/kernels/test_reference.py -p no:cacheprovider >> "$OUT/gpu_tests.log" 2>&1
echo "cpu suite on the GPU rc=$? in $((SECONDS - s)) s" | tee -a "$OUT/gpu_tests.log"
tail -60 "$OUT/bench.log"
