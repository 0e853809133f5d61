"""requant: power-of-two INT8 weight scales for deterministic W8A8 inference.

Read a compressed-tensors W8A8 checkpoint exactly (requant.checkpoint), requantize its weight
scales to powers of two (requant.scales.arms, requant.convert), audit a kernel pair bitwise
(requant.audit), run it (requant.runtime), evaluate it (requant.eval) and publish it
(requant.publish). `DEFAULT_CHECKPOINT` is the small trained Qwen3 W8A8 checkpoint embedded
in the package, used when a command is given no checkpoint.

The repository's top-level kernels/, audit/ and model_cards/ install as requant.kernels,
requant.audit and requant.model_cards (pyproject.toml's package-dir); a checkout uses the
editable install (`pip install -e .`).
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "data" / "default"


def data_path() -> Path:
    """Path of the embedded default checkpoint (config.json + model.safetensors)."""
    return DEFAULT_CHECKPOINT
