set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
source benchmarks/_gpu_common.sh
gpu_env triton transformers lm_eval > $OUT/env.txt 2>&1
cat $OUT/env.txt | tail -2
cutlass_build 240
echo "build done at $SECONDS s"
timeout ${T1:-330} python3 -m pytest -q -m gpu -p no:cacheprovider --durations=30 tests > $OUT/gpu_suite_1.log 2>&1; echo "suite 1 (collection order) rc=$?"; tail -6 $OUT/gpu_suite_1.log
echo "elapsed $SECONDS s"
