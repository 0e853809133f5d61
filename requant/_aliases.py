"""The import paths modules had before the package was grouped by concern, kept working.

`import requant.output` (and `python -m requant.synthetic`, `--kernel
requant.audit.fault_kernels:NAME`) resolve to the module's new home: the same module object, so
attributes set or monkeypatched through either name are one. A finder, not a file per old path,
so that no file stands where a module used to be (git follows the move).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

MOVED = {
    "requant.safetensors_io": "requant.io.safetensors_io",
    "requant.inputs": "requant.io.inputs",
    "requant.links": "requant.io.links",
    "requant.output": "requant.io.output",
    "requant.scheme": "requant.checkpoint.scheme",
    "requant.inspect": "requant.checkpoint.inspect",
    "requant.streaming": "requant.convert._streaming",
    "requant.workers": "requant.convert._workers",
    "requant.verify": "requant.evidence.verify",
    "requant.qwen3": "requant.models.qwen3",
    "requant.synthetic": "requant.models.synthetic",
    "requant.tokenizer": "requant.models.tokenizer",
    "requant.prompts": "requant.models.prompts",
    "requant.sampling": "requant.runtime.sampling",
    "requant.sampling_batch": "requant.runtime.sampling_batch",
    "requant.generation": "requant.runtime.generation",
    "requant.audit.formulas": "requant.audit.conform.formulas",
    "requant.audit.vectors": "requant.audit.conform.vectors",
    "requant.audit.fault_kernels": "requant.audit.conform.fault_kernels",
    "requant.audit.decode": "requant.audit.phases.decode",
    "requant.audit.injection": "requant.audit.phases.injection",
    # the decode and injection sections (decode_markdown, injection_markdown, plot_injection)
    "requant.audit.report_phases": "requant.audit.phases",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        pass

    def get_code(self, fullname: str):
        # `python -m OLD` runs the new module's code as __main__ (runpy asks the loader for it)
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        origin = getattr(importlib.util.find_spec(new), "origin", None)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), origin=origin)


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
