"""The requant audit (requant.audit): per-layer comparison of a kernel pair on real activations, a
fault-injection suite scored against a prediction matrix pinned before the run, and the kernel
fingerprinting of `requant conform`. Entry point: suite.run_audit (the dict `--json` writes).

  records                                what a GEMM run is (operands, kernel, output)
  catalogue/ (faults checks matrix scoring)  21 fault variants, C1..C8, pinned matrices, scores
  capture linears                        operands from the runtime's forward pass; the Linears
  cells compare batched (+ batched_stats stats_triton device_acc f6_tiles)  one Linear's cells
  phases/ (prefill decode injection)     each phase's run, JSON keys and report section
  suite report pair                      the run of every phase; JSON/Markdown/PNG; the resolved pair
  conform/                               the conformance kit of `requant conform`

Consumes requant's core and kernels/, never the commands (tests/test_layers.py).
Docs: docs/audit.md, docs/conformance.md.
"""

if __name__ == "audit":  # imported from the clone's root under its bare name: requant/_toplevel.py
    from requant._toplevel import hand_over

    hand_over(__name__, __file__)
