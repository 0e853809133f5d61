set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
source benchmarks/_gpu_common.sh
gpu_env triton transformers > $OUT/env.txt 2>&1
cutlass_build 240
export REQUANT_GPU_RECORDS=$OUT/records
timeout ${T1:-260} python3 -m pytest -q -m gpu -p no:cacheprovider --durations=30 tests > $OUT/gpu_suite_1.log 2>&1; echo "suite 1 (collection order) rc=$?"; tail -4 $OUT/gpu_suite_1.log
unset REQUANT_GPU_RECORDS
tar -czf $OUT/records.tgz -C $OUT records 2>/dev/null && rm -rf $OUT/records
echo "elapsed $SECONDS s"
mkdir -p $OUT/sizes
OUT=$OUT/sizes STEPS="generate audit" SIZES="${SIZES1:-14b 1.7b}" TOTAL_S=$((575 - SECONDS)) bash benchmarks/gpu_audit_sizes.sh 2>&1 | grep -v "^==\|^|" | tail -30
tar -czf $OUT/sizes.tgz -C $OUT/sizes . && rm -rf $OUT/sizes; ls -la $OUT
