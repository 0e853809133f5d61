"""The requant audit (requant.audit): per-layer comparison of a kernel pair on real activations, a
fault-injection suite scored against a prediction matrix pinned before the run, and the kernel
fingerprinting of `requant conform`.

Modules:
  records        what a GEMM run is (operands, accumulator, output, kernel description)
  faults         the fault catalogue: 9 families, 21 variants, each a modified reference run
  checks         the eight checks C1..C8, each (reference run, run under test, kernel) -> verdict
  matrix         the pinned prediction matrices (v1: C1..C7; v2: + C8; v3: + injection) and their sha256
  scoring        false positives/negatives, detection table, ULP histograms
  compare        the per-layer bitwise comparison of the two real backends
  capture        calibration prompts, tokenization, and the capture of each Linear's operands
  suite          runs the catalogue and the checks over every captured layer, both regimes
  decode         the decode phase: the pair compared on decode steps as well as prefill
  injection      the injection phase: C7 on faults injected into the generating model
  report         JSON, Markdown and PNG outputs
  report_phases  the Markdown sections of the decode and injection phases
  conform/       the conformance kit of `requant conform`: formulas (the epilogue formulas and
                 accumulator models it tells apart), vectors (the crafted vectors on which they
                 differ), the package itself (fingerprint one kernel and certify it),
                 fault_kernels (every fault as a scaled_mm kernel, for `--kernel`)

The forward pass whose operands are captured is requant.runtime; the `requant audit` and
`requant conform` commands are requant/commands/audit.py and conform.py. Docs: docs/audit.md,
docs/conformance.md.
"""
