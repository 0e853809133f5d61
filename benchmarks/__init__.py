"""The benchmarks (not installed): run each from the repository root as `python3 -m benchmarks.NAME`;
shared helpers are the `_`-prefixed modules. Index: benchmarks/README.md."""
