"""The clone's top-level modules never hide an installed distribution of the same name.

The repository keeps kernels/, audit/, model_cards/ and cli.py at its top (the user's layout);
they install as requant.kernels, requant.audit, requant.model_cards and requant.cli's runner.
Python run from the clone's root (`python -m pytest`, a script, pytest's rootdir insertion) puts
that root first on sys.path, so `import kernels` would find the clone's folder before Hugging
Face's `kernels` package (transformers >= 5.2x imports it). Each of those files calls
`hand_over` first when it is imported under its bare name: the installed distribution of that
name, found on sys.path without the clone's root, replaces it in sys.modules (Python's import
returns whatever sys.modules holds once the module ran), so the import gets the distribution.
Where none is installed, the clone's module stays what it is: it hides nothing.

Standard library only: this runs before anything of requant is importable under that name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import PathFinder


def _inside(path: str | None, root: str) -> bool:
    if not path:
        return False
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def hand_over(name: str, file: str) -> bool:
    """Put the installed distribution's `name` in sys.modules in place of the clone's module
    defined in `file` (a package's __init__.py or a top-level .py); False where none exists."""
    here = os.path.realpath(file)
    root = os.path.dirname(os.path.dirname(here) if os.path.basename(here) == "__init__.py" else here)
    path = [p for p in sys.path if os.path.realpath(p or os.curdir) != root]
    spec = PathFinder.find_spec(name, path)
    # A namespace portion (no loader) or a spec inside the clone is not an installed distribution.
    if spec is None or spec.loader is None or _inside(spec.origin, root):
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # on an exception the import machinery removes the entry
    return True
