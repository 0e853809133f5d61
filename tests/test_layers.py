"""The layers, read from the imports of every module (ast: module-level and inside functions,
relative imports resolved, pyproject.toml's package-dir mapping applied):

    kernels/   imports only torch, triton, numpy, the CUTLASS headers' locator, the standard
               library and itself
    core       (requant/ but commands/ and cli.py) never imports requant.audit nor the commands
    audit/     consumes the core and kernels/, never the commands
    commands   on top
    requant._toplevel  the clone-root guard kernels/, audit/, model_cards/ and cli.py run first under
               a bare name: standard library only, so every layer may import it
and, inside the core, the packages CORE_IMPORTS names import only what it lists: requant.io (files
in and out) only requant.errors; requant.models (what a model is) only io and errors, so the
synthetic checkpoint maker lives in requant.checkpoint; requant.scales (the arithmetic of scales)
nothing; requant.checkpoint and requant.runtime nothing above them (convert, eval, publish, tp).
and no import cycle among requant's modules, counting function-level imports too (a circle hidden
in a function is still a circle) and the package __init__ an import runs first. The checker is
itself tested on a small tree it must fault."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml's [tool.setuptools.package-dir]; test_the_mapping_is_pyprojects checks it
PACKAGE_DIRS = {
    "requant": "requant",
    "requant.kernels": "kernels",
    "requant.audit": "audit",
    "requant.model_cards": "model_cards",
}
KERNEL_DEPS = {"torch", "triton", "numpy", "cutlass_library"}  # cutlass_library: nvidia-cutlass's headers


def modules(root: Path, dirs: dict[str, str]) -> dict[str, Path]:
    """{module name: file} of every .py under each package directory (data folders excluded)."""
    out = {}
    for pkg, d in dirs.items():
        base = root / d
        for p in base.rglob("*.py"):
            parts = list(p.relative_to(base).with_suffix("").parts)
            if "data" in parts[:-1] or any(not s.isidentifier() for s in parts):
                continue
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = p
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import statement of one module; a
    `from X import Y` names X.Y when that is a module, else X."""
    found = []
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node, in_function: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            inner = in_function or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.Import):
                found.extend((a.name, ch.lineno, in_function) for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    up = pkg.rsplit(".", ch.level - 1)[0] if ch.level > 1 else pkg
                    base = f"{up}.{base}" if base else up
                for a in ch.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in known else base, ch.lineno, in_function))
            visit(ch, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def owner(target: str, known: dict) -> str | None:
    """The requant module an import loads (the longest known prefix), None outside requant."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def _above(name: str) -> list[str]:
    """name and the packages above it."""
    return [name.rsplit(".", i)[0] for i in range(name.count(".") + 1)]


BASE = {"requant._toplevel"}


def layer(name: str) -> str:
    if name in BASE:
        return "base"
    if name.startswith("requant.kernels"):
        return "kernels"
    if name.startswith("requant.audit"):
        return "audit"
    if name.startswith("requant.commands") or name == "requant.cli":
        return "commands"
    return "core"


# package -> the only other requant packages its modules may import (itself always allowed)
CORE_IMPORTS = {
    "requant.io": {"requant.errors"},
    "requant.models": {"requant.errors", "requant.io"},
    "requant.scales": set(),
    "requant.checkpoint": {
        "requant.errors",
        "requant.io",
        "requant.models",
        "requant.scales",
        "requant.kernels",
        "requant.evidence",
    },  # evidence: inspect reads the "requant" key (PROVENANCE_KEY) of a converted config
    "requant.runtime": {
        "requant.errors",
        "requant.io",
        "requant.models",
        "requant.checkpoint",
        "requant.kernels",
        "requant.regime",
    },
}


def core_fault(m: str, mod: str) -> str | None:
    """The CORE_IMPORTS package m belongs to, when m's import of mod leaves what it may import."""
    for pkg, allowed in CORE_IMPORTS.items():
        if m == pkg or m.startswith(pkg + "."):
            ok = {pkg, *allowed}
            return None if any(mod == a or mod.startswith(a + ".") for a in ok) else pkg
    return None


FORBIDDEN = {
    "core": {"audit", "commands"},
    "audit": {"commands"},
    "kernels": {"core", "audit", "commands"},
    "base": {"core", "audit", "commands", "kernels"},
}


def faults(root: Path, dirs: dict[str, str]) -> list[str]:
    """One line per import that breaks a layer rule, and one per import cycle."""
    known = modules(root, dirs)
    bad, graph = [], {m: set() for m in known}
    for m, path in known.items():
        for target, line, in_function in imports(m, path, known):
            where = f"{path.relative_to(root)}:{line}{' (in a function)' if in_function else ''}"
            top = target.split(".")[0]
            mod = owner(target, known) if top == "requant" else None
            if mod is None:
                stdlib = set(sys.stdlib_module_names) | {"__future__"}
                if layer(m) == "kernels" and top not in KERNEL_DEPS | stdlib:
                    bad.append(f"{where}: kernels/ imports {target}")
                if layer(m) == "base" and top not in stdlib:
                    bad.append(f"{where}: {m} imports {target} (standard library only)")
                continue
            if layer(mod) in FORBIDDEN.get(layer(m), ()):
                bad.append(f"{where}: {layer(m)} imports {layer(mod)} ({mod})")
            elif (pkg := core_fault(m, mod)) is not None:
                bad.append(f"{where}: {pkg} imports {mod}")
            # importing a.b.c runs a.b's __init__ first: an edge to each package above mod but not above m
            ancestors = set(_above(mod)) - set(_above(m))
            graph[m].update(a for a in ancestors if a in known and a != m)
    return sorted(bad) + sorted(f"import cycle: {' -> '.join(c)}" for c in cycles(graph))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = n
        n += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_mapping_is_pyprojects():
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    pairs = dict(line.replace('"', "").split(" = ") for line in block.strip().splitlines() if " = " in line)
    assert pairs == PACKAGE_DIRS


def test_the_layers_hold():
    assert len(modules(ROOT, PACKAGE_DIRS)) > 100  # the whole tree was read
    assert faults(ROOT, PACKAGE_DIRS) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_checker_finds_each_kind_of_fault(tmp_path):
    _write(
        tmp_path,
        {
            "requant/__init__.py": "",
            "requant/a.py": "def f():\n    from requant.audit import x\n",  # core -> audit, hidden in a function
            "requant/b.py": "from . import c\n",  # relative: a cycle b -> c -> b
            "requant/c.py": "def g():\n    import requant.b\n",
            "requant/models/__init__.py": "",
            "requant/models/m.py": "from requant.io import f\nfrom requant.convert import s\n",  # 2nd: wrong way
            "requant/io/__init__.py": "",
            "requant/io/f.py": "from requant import errors\nfrom requant.checkpoint import x\n",  # 2nd: wrong way
            "requant/errors.py": "",
            "requant/convert/__init__.py": "",
            "requant/convert/s.py": "",
            "requant/checkpoint/__init__.py": "from requant import models\n",  # the right way
            "requant/commands/__init__.py": "from requant import audit\n",  # commands on top: allowed
            "kernels/__init__.py": "import torch, json\nfrom requant.b import q\nimport transformers\n",
            "audit/__init__.py": "",
            "audit/x.py": "from requant import kernels\nfrom ..commands import y\n",
        },
    )
    dirs = {"requant": "requant", "requant.kernels": "kernels", "requant.audit": "audit"}
    assert faults(tmp_path, dirs) == [
        "audit/x.py:2: audit imports commands (requant.commands)",
        "kernels/__init__.py:2: kernels imports core (requant.b)",
        "kernels/__init__.py:3: kernels/ imports transformers",
        "requant/a.py:2 (in a function): core imports audit (requant.audit.x)",
        "requant/io/f.py:2: requant.io imports requant.checkpoint",
        "requant/models/m.py:2: requant.models imports requant.convert.s",
        "import cycle: requant.b -> requant.c",
    ]
