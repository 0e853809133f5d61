"""`requant conform`: fingerprint a W8A8 kernel on crafted vectors and certify it.

    requant conform (--backend NAME | --kernel MODULE:FUNCTION) [--device DEV] [--json OUT] [--export DIR]

`--backend` is any registered scaled_mm backend (requant.kernels); `--kernel` any importable
callable with the scaled_mm signature (a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1],
s_w fp32 [N, 1] -> bf16 [M, N]). The verdict (audit/conform/) names the formula of
audit/conform/formulas.py the kernel implements, whether it accumulates exactly and whether it is
batch-invariant, or the nearest formula and the first differing element. `--export DIR` writes
DIR/vectors.safetensors and DIR/vectors.json so that the same check can be made with numpy or torch alone.

Exit status: 0 for a known legal order (exact, CUTLASS, Triton, fused-scale) with exact int32
accumulation, batch invariance, every case equal to that order and, for a backend, the order
it declares; 1 otherwise; 2 when it could not run (unknown backend, a --kernel that cannot be
imported, a callable that raises or returns the wrong dtype or shape: one `error:` line).

More: docs/conformance.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from requant.backends import environment, triton_interpreter_on_cpu
from requant.commands._common import (
    EXIT_FAILED,
    EXIT_OK,
    DeviceOpt,
    JsonOpt,
    UsageError,
    cannot_run,
    check_device,
    check_output_dir,
    check_output_file,
    default_device,
    echo_command,
    out,
    plain,
    set_threads,
    warn,
)
from requant.commands._isolate import deliver, needs_child, run_in_child
from requant.io.output import json_bytes, write_files_atomic

__all__ = ["conform"]


def _check_outputs(json_out: Optional[Path], export_dir: Optional[Path]) -> None:
    """--json and --export DIR before any work (regular-file targets in writable places)."""
    from requant.audit.conform.vectors import EXPORT_FILES

    check_output_file(json_out, "--json")
    check_output_dir(export_dir, "--export", EXPORT_FILES)


def _write_outputs(result: dict, vs, json_out: Optional[Path], export_dir: Optional[Path]) -> None:
    """The --export pair and the --json record as one set, once the verdict is known: all or nothing."""
    from requant.audit.conform.vectors import export_items

    items = export_items(vs, export_dir) if export_dir is not None else []
    if json_out is not None:
        items.append((json_out, lambda tmp: tmp.write_bytes(json_bytes(result))))
    with cannot_run(interrupted="interrupted; no --json or --export file was written"):
        if items:
            write_files_atomic(items)


def conform(
    backend: Annotated[
        Optional[str], typer.Option("--backend", help="A registered scaled_mm backend to fingerprint.")
    ] = None,
    kernel: Annotated[
        Optional[str], typer.Option("--kernel", help="MODULE:FUNCTION of any callable with the scaled_mm signature.")
    ] = None,
    device: DeviceOpt = None,
    json_out: JsonOpt = None,
    export_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--export", help="Write DIR/vectors.safetensors and DIR/vectors.json (every case, every formula's output)."
        ),
    ] = None,
) -> None:
    """Identify the epilogue formula, accumulator and batch invariance of a W8A8 kernel."""
    if needs_child(kernel is not None):
        run_in_child("conform")  # a user kernel runs in a child; the verdict is given here
    with cannot_run():
        _check_outputs(json_out, export_dir)
        from requant.audit.conform import KernelError, declared_order, fingerprint, resolve_kernel, run_cases
        from requant.audit.conform import vectors as V

        dev = check_device(device or default_device())
        triton_interpreter_on_cpu(dev)  # before the kernel's module imports Triton
        set_threads(None, dev)
        name, fn = resolve_kernel(backend, kernel)
        vs = V.build_vectors()
        digest = vs.digest()
        written = [export_dir / n for n in V.EXPORT_FILES] if export_dir is not None else []
        try:
            outs = run_cases(name, fn, vs, dev)
        except KernelError as exc:
            raise UsageError(str(exc)) from None
        rep = fingerprint(name, outs, vs, declared_order(backend) if backend is not None else None)
    result = {
        "tool": "requant conform",
        "command": echo_command("conform"),
        "backend": backend,
        "device": dev,
        "vectors": {
            "seed": vs.seed,
            "sha256": digest,
            "pinned": digest == V.PINNED_SHA256,
            "cases": len(vs.cases),
            "exported": [str(p) for p in written],
        },
        **rep,
        "environment": environment(dev),
    }
    if digest != V.PINNED_SHA256:
        warn(f"the vectors built here (sha256 {digest}) are not the pinned ones ({V.PINNED_SHA256})")
    _write_outputs(result, vs, json_out, export_dir)
    console = out()
    console.print(f"{plain(name)}: {plain(rep['verdict'])}")
    if rep["declared"] is not None:
        console.print(f"declares {rep['declared']}: {'confirmed' if rep['declared_confirmed'] else 'NOT confirmed'}")
    console.print(
        f"vectors: {len(vs.cases)} cases, sha256 {digest} ({'pinned' if result['vectors']['pinned'] else 'NOT PINNED'})"
        + "".join(f"; wrote {plain(p)}" for p in written)
    )
    raise deliver(EXIT_OK if rep["conforms"] else EXIT_FAILED)
