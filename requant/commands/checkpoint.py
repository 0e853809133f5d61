"""`requant convert | inspect | verify`: the checkpoint commands.

Thin typer wrappers over requant.convert, requant.checkpoint.inspect and requant.evidence.verify: rich tables
on stdout, progress and errors on stderr, JSON where a machine reads it. Exit codes as in
requant.commands._common: a refused checkpoint is exit 2, `verify` finding a difference
exit 1, an interrupt 130 after the converter has removed its temporary directory.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from requant import DEFAULT_CHECKPOINT
from requant.commands._common import (
    EXIT_FAILED,
    UsageError,
    cannot_run,
    check_not_inside,
    check_output_dir,
    check_output_file,
    err,
    out,
    plain,
    sigterm_as_interrupt,
    warn,
)
from requant.errors import CheckpointError
from requant.io.output import json_bytes, write_files_atomic
from requant.scales import ARMS, SERVABLE  # names only: importing the CLI must not import torch

Arm = Enum("Arm", {a: a for a in ARMS}, type=str)


def _fmt_shifts(shifts: dict) -> str:
    return " ".join(f"{int(k):+d}:{v}" for k, v in sorted(shifts.items(), key=lambda kv: int(kv[0]))) or "-"


def _plot(result, path: Path, fmt: str = "png") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = result.totals()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    ks = sorted(int(k) for k in totals["exponent_shifts"])
    ax1.bar([str(k) for k in ks], [totals["exponent_shifts"][str(k)] for k in ks], color="#4477aa")
    ax1.set_xlabel("exponent shift  e' - ceil(log2 s)")
    ax1.set_ylabel("output channels")
    ax1.set_title(f"arm {result.arm}: scale exponent shifts")
    names = list(result.layers)
    ax2.plot(range(len(names)), [result.layers[n].rel_error for n in names], ".", color="#cc6677")
    ax2.set_xlabel("quantized Linear (model order)")
    ax2.set_ylabel("relative weight error")
    ax2.set_title("per-layer ||W' - W|| / ||W||")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format=fmt)
    plt.close(fig)


PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def _check_reports(
    src: Optional[str], output: Path, json_report: Optional[Path], plot: Optional[Path], source: Optional[Path] = None
) -> None:
    """--json and --plot before the conversion: writable regular-file targets, a plot format
    matplotlib writes, and neither inside SRC (a local directory) nor inside OUT (the manifests
    list every file there)."""
    src_dir = Path(src) if src is not None and Path(src).is_dir() else None
    check_not_inside(
        {"--json": json_report, "--plot": plot},
        {"the source": src_dir, "the output": output, "--source": source if source and source.is_dir() else None},
    )
    check_output_file(json_report, "--json")
    check_output_file(plot, "--plot")
    if plot is not None and plot.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise UsageError(
            f"--plot {plain(plot)}: the extension names the image format; use one of "
            + ", ".join("." + f for f in PLOT_FORMATS)
        )


def _write_reports(result, report: dict, output: Path, json_report: Optional[Path], plot: Optional[Path]) -> None:
    """--json and --plot after the checkpoint is complete, as one set (all or nothing); a
    failure says that the checkpoint is complete and which file could not be written."""
    items = []
    if json_report is not None:
        items.append((json_report, lambda tmp: tmp.write_bytes(json_bytes(report, indent=2))))
    if plot is not None:
        items.append((plot, lambda tmp: _plot(result, tmp, plot.suffix.lower().lstrip("."))))
    if not items:
        return
    done = f"the checkpoint at {output} is complete"
    with cannot_run(interrupted=f"interrupted after {output} was written completely; the --json/--plot files were not"):
        try:
            write_files_atomic(items)
        except CheckpointError as exc:
            raise UsageError(f"{done}, but {exc}; nothing of --json/--plot was written") from None
        except (OSError, ValueError) as exc:
            raise UsageError(f"{done}, but writing --json/--plot failed: {exc}; nothing of them was written") from None


def _layer_table(result, arm_name: str) -> Table:
    """The per-Linear table. Every column but the exponent shifts keeps its full width (the
    Linear names without their common "model." prefix, so that layers.0.self_attn.q_proj and
    its k/v/o rows stay distinguishable at 80 columns); the shifts fold onto a second line."""
    from rich import box

    header = ("Linear", "channels", "changed", "exponent shifts", "clipped", "rel. error")
    rows = [
        (
            plain(name.removeprefix("model.")),
            str(st.rows),
            str(st.scales_changed),
            _fmt_shifts(st.exponent_shifts),
            str(st.weights_clipped),
            f"{st.rel_error:.3e}",
        )
        for name, st in result.layers.items()
    ]
    table = Table(title=f"requant convert --arm {arm_name}", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, col in enumerate(header):
        if col == "exponent shifts":
            table.add_column(col, overflow="fold")
        else:
            width = max(len(col), *(len(r[i]) for r in rows))
            table.add_column(col, justify="left" if i == 0 else "right", no_wrap=True, min_width=width)
    for r in rows:
        table.add_row(*r)
    return table


def convert(
    src: Annotated[
        Optional[str],
        typer.Argument(
            help="Checkpoint directory or Hub repo id (default: the embedded default, a small trained Qwen3 W8A8).",
            show_default=False,
            metavar="SRC",
        ),
    ] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Output directory (created atomically; never inside SRC).")
    ] = ...,
    arm: Annotated[
        Arm,
        typer.Option(
            "--arm",
            help="Scale arm: nearest (default), ceiling, mse, unconstrained (keeps the scales) or probe "
            "(an ablation, not servable).",
        ),
    ] = "nearest",
    json_report: Annotated[
        Optional[Path], typer.Option("--json", help="Also write the per-layer statistics as JSON here.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUTPUT.")] = False,
    source: Annotated[
        Optional[Path],
        typer.Option("--source", help="Requantize from these original bf16 weights instead of the int8 ones."),
    ] = None,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Hub revision when SRC is a repo id.")] = None,
    jobs: Annotated[
        Optional[int],
        typer.Option(
            "--jobs",
            "-j",
            help="Worker threads; the work is cut into ~64 MB segments of the shards (default: CPU count; at most 8).",
        ),
    ] = None,
    plot: Annotated[
        Optional[Path], typer.Option("--plot", help="Write a PNG of the exponent shifts and per-layer errors.")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the totals.")] = False,
):
    """Requantize every weight scale of a W8A8 checkpoint to a power of two (or keep it)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from requant.convert import convert as do_convert

    arm_name = arm.value if isinstance(arm, Enum) else str(arm)
    with cannot_run():  # every output path and option before any work: a refusal costs nothing and writes nothing
        _check_reports(src, output, json_report, plot, source)
        if not (output.exists() or output.is_symlink()):  # an existing OUT: the --force rules (requant.io.output)
            check_output_dir(output, "-o", make_parents=True)
        if jobs is not None and jobs < 1:
            raise UsageError(f"--jobs {jobs}: must be at least 1 (leave it out for the CPU count)")
    console = err()
    src_arg = src if src is not None else str(DEFAULT_CHECKPOINT)
    progress = Progress(
        TextColumn("[bold]convert[/] " + plain(arm_name)),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = {}

    def on_start(total):
        task["id"] = progress.add_task("convert", total=total)

    def advance(n):
        if "id" in task:
            progress.update(task["id"], advance=n)

    with cannot_run(), progress, sigterm_as_interrupt():
        result = do_convert(
            src_arg,
            output,
            arm_name,
            force=force,
            revision=revision,
            source=source,
            jobs=jobs,
            progress=advance,
            on_start=on_start,
            on_note=warn,
        )
    report = result.to_dict()
    _write_reports(result, report, output, json_report, plot)
    stdout = out()
    if not quiet and result.layers:
        stdout.print(_layer_table(result, arm_name))
    t = report["totals"]
    stdout.print(
        f"{t['linears']} quantized Linears, {t['channels']} channels: {t['scales_changed']} scales changed, "
        f"shifts {_fmt_shifts(t['exponent_shifts'])}, {t['weights_clipped']} weights clipped, "
        f"relative weight error {t['rel_weight_error']:.3e}"
    )
    stdout.print(f"wrote {plain(str(result.output))} ({result.bytes_total / 1e6:.1f} MB in {result.elapsed_s:.2f} s)")
    if not SERVABLE[arm_name]:
        warn("arm 'probe' rewrites scales without requantizing the weights: an ablation, NOT servable")


def _moe_rows(info: dict) -> list[tuple[str, str]]:
    """The experts line of a Qwen3-MoE checkpoint (none for a dense one)."""
    m = info.get("moe")
    if not m:
        return []
    text = (
        f"{m['experts']} per sparse layer x {m['sparse_layers']} layers, top {m['experts_per_token']}; "
        f"{m['expert_linears']} quantized expert Linears; routers {', '.join(m['routers'])}"
    )
    return [("experts", text)]


def inspect(
    src: Annotated[str, typer.Argument(help="Checkpoint directory or Hub repo id.", metavar="SRC")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Hub revision when SRC is a repo id.")] = None,
):
    """Describe a W8A8 checkpoint: architecture, Linears, scale dtype, power-of-two scales, int8 range."""
    from requant.checkpoint.inspect import inspect_checkpoint

    with cannot_run():
        info = inspect_checkpoint(src, revision=revision)
    stdout = out()
    if as_json:
        stdout.file.write(json_bytes(info, indent=2).decode("utf-8"))
        return
    rows = [
        ("architecture", f"{info['architecture']} ({info['model_type']})"),
        ("shape", ", ".join(f"{k}={v}" for k, v in info["config"].items())),
        ("layers", str(info["layers"])),
        ("quantized Linears", str(info["quantized_linears"])),
        *_moe_rows(info),
        (
            "scheme",
            f"{info['quantization']['quant_method']} {info['quantization']['format']}, ignore {info['quantization']['ignore']}",
        ),
        ("scale dtype", ", ".join(f"{k} x{v}" for k, v in info["scale_dtypes"].items())),
        (
            "power-of-two scales",
            f"{info['power_of_two_scales']} / {info['channels']}"
            + (" (all)" if info["all_scales_power_of_two"] else ""),
        ),
        ("scale exponents", str(info["scale_exponent_range"])),
        ("int8 range", f"{info.get('int8_range')} ({info.get('int8_min128_count')} weights at -128)"),
        ("pass-through tensors", str(info["passthrough_tensors"])),
        ("shards", ", ".join(f"{k} ({v / 1e6:.1f} MB)" for k, v in info["shards"].items())),
        ("provenance", json.dumps(info["provenance"]) if info["provenance"] else "-"),
    ]
    # "key  value" lines, not a table: nothing padded with spaces to the terminal's width, and a
    # long value (the shape) stays on its line
    stdout.print(plain(info["path"]))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        stdout.print(f"  [bold]{k:<{width}}[/]  {plain(v)}")


def verify(
    a: Annotated[Path, typer.Argument(help="First checkpoint directory.", metavar="A")],
    b: Annotated[Path, typer.Argument(help="Second checkpoint directory.", metavar="B")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
):
    """Exit 0 when two checkpoints are byte-identical, 1 listing what differs (tensor by tensor), 2 when one cannot be read."""
    from requant.evidence.verify import verify as do_verify

    with cannot_run():
        report = do_verify(a, b)
    stdout = out()
    if as_json:
        stdout.file.write(json_bytes(report, indent=2).decode("utf-8"))
    elif report["identical"]:
        stdout.print(f"[green]identical[/]: {plain(str(a))} and {plain(str(b))} are byte for byte the same")
    else:
        stdout.print(f"[red]different[/]: {plain(str(a))} vs {plain(str(b))}")
        for rel in report["only_in_a"]:
            stdout.print(f"  only in A: {plain(rel)}")
        for rel in report["only_in_b"]:
            stdout.print(f"  only in B: {plain(rel)}")
        for rel in report["differing_files"]:
            stdout.print(f"  file differs: {plain(rel)}")
        for d in report["tensors"]:
            if d["what"] == "values":
                detail = f"{d['elements_differing']} of {d['elements']} elements differ (first at flat index {d['first_index']})"
            elif d["what"] == "dtype/shape":
                detail = f"{d['a']} vs {d['b']}"
            else:
                detail = d["what"]
            stdout.print(f"  tensor {plain(d['tensor'])}: {plain(detail)}")
        for e in report["errors"]:
            stdout.print(f"  unreadable: {plain(e)}")
        if report.get("note"):
            stdout.print(f"  note: {plain(report['note'])}")
    if not report["identical"]:
        raise typer.Exit(EXIT_FAILED)
