"""Errors that requant reports to a user instead of a traceback.

Every problem with an input checkpoint is a `CheckpointError`, and its message names the
file (and, where there is one, the tensor) so that a user can find the fault without a
debugger. The command line catches exactly this family, prints the message and exits
non-zero; anything else escaping is a bug in requant and keeps its traceback.
"""

from __future__ import annotations

import os


class CheckpointError(Exception):
    """A checkpoint (or a request about one) that requant refuses, with a located message."""

    def __init__(self, message: str, *, file: str | os.PathLike | None = None, tensor: str | None = None):
        self.file = None if file is None else str(file)
        self.tensor = tensor
        where = []
        if self.file is not None:
            where.append(self.file)
        if tensor is not None:
            where.append(f"tensor {tensor!r}")
        self.detail = message
        super().__init__(": ".join(where + [message]) if where else message)


class SafetensorsFormatError(CheckpointError):
    """A .safetensors file whose bytes break the format (header, offsets, sizes)."""


class SchemeError(CheckpointError):
    """A config.json / quantization_config that is not the W8A8 scheme requant handles."""


class TensorError(CheckpointError):
    """A tensor that is present but wrong: dtype, shape, missing partner, bad scale values."""


class LayoutError(CheckpointError):
    """Files missing or misnamed: no config, no weights, an index naming a missing shard."""


class OutputError(CheckpointError):
    """A request about the output that requant refuses (exists, inside the source, ...)."""


class UsageError(Exception):
    """A request refused before (or instead of) doing the work: a bad option value, a
    backend the device cannot run, an arm name that does not exist. Commands exit 2."""


def os_reason(exc: OSError) -> str:
    """The operating system's words for a failed call ("No space left on device")."""
    return exc.strerror or str(exc) or type(exc).__name__
