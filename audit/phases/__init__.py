"""The audit's phases, one module each, owning its run, its JSON keys and its report section:

  prefill    both backends prefill the prompts; every Linear's cells on the captured operands
  decode     the same cells on each decode step's operands, per batch size (JSON `decode`)
  injection  each fault kernel injected into the generating model, C7 scored (JSON `injection`)

audit/suite.py runs them regime by regime; audit/report.py assembles their sections. They import the
cells, the catalogue and the core below them. Docs:
docs/architecture.md (audit), docs/audit.md.
"""

from requant.audit.phases.decode import DecodePhase, decode_markdown
from requant.audit.phases.injection import injection_markdown, plot_injection, run_injection, score_injection
from requant.audit.phases.prefill import PrefillPhase, prefill_markdown

__all__ = [
    "DecodePhase",
    "PrefillPhase",
    "decode_markdown",
    "injection_markdown",
    "plot_injection",
    "prefill_markdown",
    "run_injection",
    "score_injection",
]
