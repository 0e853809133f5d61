"""The audit's catalogue (requant.audit.catalogue): what the audit predicts and how it scores, apart
from the cells that run it.

  faults    the 21 fault variants (F1..F9c) as definitions on one layer's operands
  checks    C1..C8: pure functions of (reference run, run under test, kernel description)
  matrix    the prediction matrices v1..v4 (prediction_matrix*.json, sha256-pinned) and their loader
  scoring   a cell's verdicts against the matrix: false positives/negatives, ULP histograms

Imports torch, kernels/ and requant.audit.records only; the cells (audit/cells.py, batched.py and
their Triton kernels) consume it.
"""
