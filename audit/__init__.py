"""The requant audit (requant.audit): per-layer comparison of a kernel pair on real activations, a
fault-injection suite scored against a prediction matrix pinned before the run, and the kernel
fingerprinting of `requant conform`.

Modules:
  records        what a GEMM run is (operands, accumulator, output, kernel description)
  faults         the fault catalogue: 9 families, 21 variants, each a modified reference run
  checks         the eight checks C1..C8, each (reference run, run under test, kernel) -> verdict
  matrix         the pinned prediction matrices (v1: C1..C7; v2: C1..C8) and their sha256
  scoring        false positives/negatives, detection table, ULP histograms
  compare        the per-layer bitwise comparison of the two real backends
  capture        calibration prompts, tokenization, and the capture of each Linear's operands
  suite          runs the catalogue and the checks over every captured layer, both regimes
  report         JSON, Markdown and PNG outputs
  formulas       the epilogue formulas and accumulator models `requant conform` tells apart
  vectors        the crafted conformance vectors on which those formulas differ
  conform        fingerprints one kernel on the vectors and certifies it
  fault_kernels  every fault wrapped as a scaled_mm kernel, for `requant conform --kernel`

The forward pass whose operands are captured is requant.runtime; the `requant audit` and
`requant conform` commands are requant/commands/audit.py and conform.py. Docs: docs/audit.md,
docs/conformance.md.
"""
