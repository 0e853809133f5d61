"""The requant audit: per-layer CUTLASS-vs-Triton comparison on real activations, and a
fault-injection suite scored against a prediction matrix pinned before the run.

Modules (each small, each with the reasoning in its docstring):
  records   what a GEMM run is (operands, accumulator, output, kernel description)
  faults    the fault catalogue: 9 families, 21 variants, each a modified reference run
  checks    the seven checks C1..C7, each (reference run, run under test, kernel) -> verdict
  matrix    the pinned prediction matrix (prediction_matrix.json) and its sha256
  scoring   false positives/negatives, detection table, ULP histograms
  compare   the per-layer bitwise comparison of the two real backends
  suite     runs the catalogue and the checks over every captured layer, both regimes
  runtime   a small Qwen3 W8A8 runtime whose quantized Linears call kernels/ by name
  capture   calibration prompts, tokenization, and the capture of each Linear's operands
  report    JSON, Markdown and PNG outputs
  command   the `requant audit` typer command
"""
