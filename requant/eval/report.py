"""`requant eval` outputs: JSON (the record), Markdown (for people), a PNG (the picture).

Every file is rendered completely into a temporary file in its destination directory and
then renamed over the destination (os.replace), so a reader sees the old file or the new
one, never half of one; `--report DIR` renders all three before renaming any.
The PNG shows, per arm, the percent change of word perplexity against native with its 90%
paired-bootstrap interval, and a horizontal line at zero: an interval that crosses the line
is a change the documents cannot resolve.
"""

from __future__ import annotations

import math
from pathlib import Path

from requant.io.markdown import table
from requant.io.output import json_bytes, write_files_atomic, write_json_atomic


def fmt_number(v, digits=4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}g}" if abs(v) >= 1e5 or (v != 0 and abs(v) < 1e-3) else f"{v:.{digits}f}"
    return str(v)


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.3f}%"


def _ci(ci) -> str:
    return "-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def markdown(result: dict) -> str:
    from requant.evidence.identity import markdown_lines as identity_lines

    lines = [f"# requant eval: {result['checkpoint']}", ""]
    task = result.get("primary_task")
    if task:
        lines += [
            f"Task `{task}`: {result['documents']} documents; paired bootstrap over documents against native, "
            f"{result['bootstrap']['replicates']} replicates, seed {result['bootstrap']['seed']}, 90% percentile intervals.",
            "",
        ]
        rows = []
        for name in result["arm_order"]:
            a = result["arms"][name]
            tag = "" if result["servable"].get(name, True) else " (not servable)"
            rows.append(
                [
                    f"{name}{tag}",
                    fmt_number(a["word_perplexity"]),
                    fmt_number(a["byte_perplexity"]),
                    fmt_number(a["bits_per_byte"]),
                    _pct(a.get("delta_pct")),
                    _ci(a.get("ci90")),
                    _pct(a.get("byte_delta_pct")),
                    _ci(a.get("byte_ci90")),
                ]
            )
        header = ["arm", "word perplexity", "byte perplexity", "bits per byte", "Δ word ppl", "90% interval"]
        lines += table([*header, "Δ byte ppl", "90% interval"], rows, align="lrrrrlrl")
        dec = result["decomposition"]
        share = dec.get("probe_mismatch_share")
        lines += [
            "",
            "Probe decomposition, (ppl_probe - ppl_nearest) / (ppl_probe - ppl_native): "
            + (
                "n/a (needs the native, nearest and probe arms)"
                if share is None
                else f"**{share:.4f}**"
                + (f", 90% interval [{dec['ci90'][0]:.4f}, {dec['ci90'][1]:.4f}]" if dec.get("ci90") else "")
            ),
        ]
    for t, entry in result.get("per_task", {}).items():
        if t == task:
            continue
        lines += ["", f"## `{t}` (lm-eval metrics, no paired interval)", ""]
        keys = sorted({k for m in entry["metrics"].values() for k in m})
        rows = [[name, *(fmt_number(entry["metrics"][name].get(k)) for k in keys)] for name in result["arm_order"]]
        lines += table(["arm", *keys], rows, align="l" + "r" * len(keys))
    tok = result.get("tokenizer") or {}
    lines += [
        "",
        f"Backend `{result['backend']}` (activations `{result['act_backend']}`) on {result['device']}; "
        f"windows of {result['max_length']} tokens; tokenizer {tok.get('kind')} (vocab {tok.get('vocab_size')}"
        + (f", sha256 {tok['sha256']}" if tok.get("sha256") else "")
        + f"); limit {result['limit']}; "
        f"lm-eval {result['lm_eval_version']}.",
        "",
        *identity_lines(result),
        "",
        "Wall time per arm (s): " + ", ".join(f"{k} {v}" for k, v in result["wall_seconds"].items()) + ".",
    ]
    if result.get("command"):
        lines += ["", f"Command: `{result['command']}`"]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in result["arm_order"] if n != "native" and n in result.get("arms", {})]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 3.6))
    for i, n in enumerate(names):
        a = result["arms"][n]
        d, (lo, hi) = a["delta_pct"], a["ci90"]
        ax.errorbar(
            [i],
            [d],
            yerr=[[d - lo], [hi - d]],
            fmt="o",
            capsize=6,
            color="#4477aa" if result["servable"].get(n, True) else "#cc6677",
        )
    if not names:
        ax.text(
            0.5, 0.5, "only native was evaluated: nothing to compare", ha="center", va="center", transform=ax.transAxes
        )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_xlim(-0.6, max(len(names) - 0.4, 0.6))
    ax.set_ylabel("word perplexity change vs native (%)")
    ax.set_title(
        f"{result.get('primary_task')}: {result.get('documents')} documents\n90% paired bootstrap intervals (documents)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def _renderer(result: dict, kind: str):
    if kind == "json":
        data = json_bytes(result, indent=1)
        return lambda tmp: tmp.write_bytes(data)
    if kind == "md":
        text = markdown(result)
        return lambda tmp: tmp.write_text(text, encoding="utf-8")
    return lambda tmp: plot(result, tmp)


def write_json(result: dict, path: Path) -> Path:
    return write_json_atomic(path, result)


REPORT_FILES = ("eval.json", "eval.md", "eval.png")


def report_items(result: dict, directory: Path) -> list:
    """The (destination, render) pairs of --report DIR (eval.png only with a perplexity task)."""
    d = Path(directory)
    dests = [(d / "eval.json", "json"), (d / "eval.md", "md")] + (
        [(d / "eval.png", "png")] if result.get("primary_task") else []
    )
    return [(dest, _renderer(result, kind)) for dest, kind in dests]


def write_report(result: dict, directory: Path) -> list[Path]:
    """eval.json, eval.md, eval.png in `directory`: all rendered, then all renamed."""
    return write_files_atomic(report_items(result, directory))
