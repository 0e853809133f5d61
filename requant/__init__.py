"""requant: power-of-two INT8 weight scales for deterministic W8A8 inference.

Checkpoint tools (issue 2): read a compressed-tensors W8A8 checkpoint exactly
(requant.checkpoint, requant.safetensors_io), requantize its weight scales to powers of two
(requant.arms), write the result atomically (requant.convert), and inspect/verify
checkpoints. `DEFAULT_CHECKPOINT` is the tiny embedded Qwen3 W8A8 checkpoint that
`requant convert` uses when no source is given (made by requant.synthetic, preset tiny).
"""

from pathlib import Path

__version__ = "0.1.0"

# Installed, requant.kernels and requant.audit are sub-packages of this one (pyproject.toml
# maps the repository's top-level kernels/ and audit/ there). Run from a source checkout
# (an editable install, a git worktree, or PYTHONPATH=. on the GPU machine) they are this
# package's siblings: search the checkout's root too, so that requant.kernels always means
# the kernels/ of the same tree as this file, never another checkout's.
_root = Path(__file__).resolve().parent.parent
if not (Path(__file__).resolve().parent / "kernels").is_dir() and (_root / "kernels" / "__init__.py").is_file() \
        and (_root / "pyproject.toml").is_file():
    __path__.append(str(_root))  # noqa: F821 (a package's __path__)
del _root

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "data" / "default"


def data_path() -> Path:
    """Path of the embedded default checkpoint (config.json + model.safetensors)."""
    return DEFAULT_CHECKPOINT
