"""requant: power-of-two INT8 weight scales for deterministic W8A8 inference.

Checkpoint tools (issue 2): read a compressed-tensors W8A8 checkpoint exactly
(requant.checkpoint, requant.safetensors_io), requantize its weight scales to powers of two
(requant.arms), write the result atomically (requant.convert), and inspect/verify
checkpoints. `DEFAULT_CHECKPOINT` is the tiny embedded Qwen3 W8A8 checkpoint that
`requant convert` uses when no source is given (made by requant.synthetic, preset tiny).
"""

from pathlib import Path

__version__ = "0.1.0"

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "data" / "default"


def data_path() -> Path:
    """Path of the embedded default checkpoint (config.json + model.safetensors)."""
    return DEFAULT_CHECKPOINT
