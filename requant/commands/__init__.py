"""The `requant` commands, one module per group, assembled into one app by requant/cli.py:

checkpoint.py   convert, inspect, verify
audit.py        audit
determinism.py  determinism
eval.py         eval
publish.py      manifest, card, push
_common.py      consoles, the error line, exit codes, the atomic JSON writer, shared options
"""
