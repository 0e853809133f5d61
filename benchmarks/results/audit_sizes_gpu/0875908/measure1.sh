set -uo pipefail
export REQUANT_WHEELS=.gpu/wheels; source benchmarks/gpu_setup.sh || exit 1
T0=$SECONDS
mkdir -p $OUT/sizes
# 14B cold (first audit on the machine), then 32B
OUT=$OUT/sizes STEPS="build generate audit" SIZES="14b 32b" TOTAL_S=420 bash benchmarks/gpu_audit_sizes.sh 2>&1 | grep -v "^|" | tail -25
echo "elapsed $((SECONDS-T0)) s"
D=/tmp/requant-qwen3-14b-synthetic
if [ -f $D/config.json ] && [ $((SECONDS-T0)) -lt 500 ]; then
  /usr/bin/time -v -o $OUT/sizes/time_14b_warm.txt timeout 80 python3 cli.py audit $D --backends cutlass,triton --byte-tokens --json $OUT/sizes/audit_14b_warm.json > $OUT/sizes/audit_14b_warm.log 2>&1; echo "14b warm rc=$?"; tail -5 $OUT/sizes/audit_14b_warm.log
fi
echo "elapsed $((SECONDS-T0)) s"
if [ $((SECONDS-T0)) -lt 480 ]; then
  OUT=$OUT/inj STEPS="generate injection" SIZES="1.7b" INJ_SIZES="1.7b" TOTAL_S=$((575-SECONDS+T0)) bash benchmarks/gpu_audit_sizes.sh 2>&1 | grep -v "^|" | tail -20
fi
echo "elapsed $((SECONDS-T0)) s"
for f in $OUT/sizes/*.json $OUT/inj/*.json; do [ -f "$f" ] && gzip -f "$f"; done
tar -czf $OUT/measure1.tgz -C $OUT sizes inj 2>/dev/null; rm -rf $OUT/sizes $OUT/inj; ls -la $OUT
