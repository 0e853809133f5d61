"""The `requant` commands, one module per group, assembled into one app by requant/cli.py:

checkpoint.py   convert, inspect, verify
audit.py        audit
conform.py      conform
determinism.py  determinism
evaluate.py     eval (named so that it does not shadow the builtin when imported)
publish.py      manifest, card, push
tp_check.py     tp-check
generate.py     generate (greedy or seeded sampling, a record per prompt)
replay.py       replay (re-run a generation record, compared bit for bit)
_guards.py      RequantCommand (outputs checked against inputs before any command body) and
                the standard streams nobody reads (guarded_std_streams)
_common.py      consoles, the error line, exit codes, the atomic JSON writer, shared options,
                the echoed command line (echo_command)
_isolate.py     a command that runs a user kernel re-runs itself in a child process; the
                parent gives the verdict (docs/audit.md)
_limits.py      values that cannot fit (positions, batch memory, threads) refused before any work

On top of every layer: the commands may import the core, kernels/ and the audit; nothing imports them
but requant/cli.py. Heavy optional imports (torch, triton, lm-eval, transformers) stay inside the
command bodies, so that `requant --help` stays fast.
"""
