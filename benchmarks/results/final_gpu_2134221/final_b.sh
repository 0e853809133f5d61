set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
source benchmarks/_gpu_common.sh
T0=$SECONDS
PYTHONPATH=.gpu:$PYTHONPATH timeout ${T2:-330} python3 -m pytest -q -m gpu -p no:cacheprovider -p reverse_order --durations=30 tests > $OUT/gpu_suite_2_reversed.log 2>&1; echo "suite 2 (reversed) rc=$?"; tail -6 $OUT/gpu_suite_2_reversed.log
echo "elapsed $((SECONDS-T0)) s"
if [ -n "${INJ:-}" ] && [ $((SECONDS-T0)) -lt ${INJ_START_BEFORE:-300} ]; then
  mkdir -p $OUT/inj
  OUT=$OUT/inj STEPS="generate injection" SIZES="1.7b" INJ_SIZES="1.7b" TOTAL_S=$((585-SECONDS+T0)) bash benchmarks/gpu_audit_sizes.sh 2>&1 | grep -v "^|" | tail -20
  tar -czf $OUT/inj.tgz -C $OUT inj && rm -rf $OUT/inj
fi
echo "elapsed $((SECONDS-T0)) s"
