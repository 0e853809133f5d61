"""Perplexity evaluation through lm-eval, with paired bootstrap intervals (`requant eval`).

Modules, one concern each:
  lm.py          the lm-eval model `requant` (registered on import): rolling log-likelihood,
                 log-likelihood and greedy generation on requant's runtime
  task.py        the shipped `requant-heldout` task (tasks/*.yaml) and its TaskManager
  heldout.py     makes requant/data/heldout/ from the shared Austen corpus
  bootstrap.py   the paired bootstrap over documents and the probe decomposition
  run.py         arms -> converter -> lm_eval.simple_evaluate -> bootstrap
  report.py      JSON, Markdown and PNG outputs (atomic)
The typer command is requant/commands/evaluate.py. Importing this package imports neither lm-eval
nor torch. Imports the core below it (runtime, convert, checkpoint, evidence, io, scales, models) and
kernels/, never the audit nor the commands. Docs: docs/eval.md.
"""
