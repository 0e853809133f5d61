#!/usr/bin/env bash
# CPU figures of requant tp-check (gloo): every reference backend x regime with the int32
# all-reduce, and the bf16 all-reduce for contrast, TP 1, 2, 4 on the embedded default.
set -uo pipefail
OUT=$1; PY=${PY:-python3}
rm -f "$OUT/tp_check.jsonl" "$OUT/tp_check.log"
run() {
    echo "\$ requant tp-check $*" >> "$OUT/tp_check.log"
    $PY -c 'import typer; from requant.commands.tp_check import tp_check; typer.run(tp_check)' "$@" \
        --json "$OUT/one.json" >> "$OUT/tp_check.log" 2>/dev/null
    echo "exit $?" >> "$OUT/tp_check.log"
    $PY -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$OUT/one.json" >> "$OUT/tp_check.jsonl"
    rm -f "$OUT/one.json"
}
for be in reference-triton-order reference-cutlass-order reference; do
    for regime in native pow2; do
        run --tp 1,2,4 --backend $be --regime $regime --prompts 8 --new-tokens 32
    done
done
for be in reference-triton-order reference-cutlass-order; do
    for regime in native pow2; do
        run --tp 1,2,4 --backend $be --regime $regime --reduce bf16 --prompts 8 --new-tokens 32
    done
done
