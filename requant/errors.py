"""Errors that requant reports to a user instead of a traceback.

Every problem with an input checkpoint is a `CheckpointError`, and its message names the
file (and, where there is one, the tensor) so that a user can find the fault without a
debugger. The command line catches exactly this family, prints the message and exits
non-zero; anything else escaping is a bug in requant and keeps its traceback.
"""

from __future__ import annotations

import os
import sys

# Python puts the current directory first on sys.path, and setuptools' editable finder comes after
# the path finder: run from the directory that holds a clone named `requant`, `import requant`
# finds the clone's top directory (no __init__.py there, so a namespace package) and the real
# package's modules then fail on attributes it lacks. Nothing of requant runs at that `import`;
# the first requant module imported after it (each imports this one) says so in one line.
_pkg = sys.modules.get("requant")
if _pkg is not None and getattr(_pkg, "__file__", None) is None:
    _where = ", ".join(str(p) for p in getattr(_pkg, "__path__", []))
    raise ImportError(
        f"`import requant` found the directory {_where} (a clone of the repository in the current "
        "directory, imported as a namespace package) instead of the installed package: run Python from "
        "another directory, or as `python -P` (PYTHONSAFEPATH=1)"
    )


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
