"""audit/report.py: JSON, Markdown and PNG outputs from the shared default audit
(tests/audit/conftest.py), and the loud warning for an unpinned matrix."""

import copy
import json

from requant.audit.catalogue.matrix import PINNED_SHA256
from requant.audit.report import markdown, matrix_warning, write_report


def test_report_files(default_audit, tmp_path):
    files = write_report(default_audit, tmp_path / "r", command="requant audit --backends reference")
    assert [f.name for f in files] == ["audit.json", "audit.md", "detection_heatmap.png", "ulp_histograms.png"]
    assert json.loads(files[0].read_text())["cells"] == default_audit["cells"]
    for png in files[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = files[1].read_text()
    assert PINNED_SHA256 in md and "WARNING" not in md and "requant audit --backends reference" in md


def test_unpinned_matrix_is_loud(default_audit):
    r = copy.deepcopy(default_audit)
    r["scorecard"]["matrix_pinned"] = False
    r["scorecard"]["matrix_sha256"] = "0" * 64
    warn = matrix_warning(r)
    assert warn and "NOT the pinned" in warn and PINNED_SHA256 in warn
    assert markdown(r).splitlines()[2].startswith("**WARNING")
    assert matrix_warning(default_audit) is None


def _expand_braces(text: str) -> list[str]:
    """The independent reference: split on ", " outside braces, then a Cartesian product of every
    {a,b} group (shell brace expansion)."""
    import itertools
    import re

    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    out = []
    for part in filter(None, parts):
        pieces = re.split(r"(\{[^}]*\})", part)
        choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in pieces]
        out += ["".join(c) for c in itertools.product(*choices)]
    return out


def test_compact_experts_expands_to_exactly_the_names_given():
    """audit.report.compact_experts over a seeded space of expert Linear sets (empty, one name, whole
    blocks, holes, leaves missing per expert, names of other forms): brace expansion of the line
    gives the same names, each once."""
    import random

    from requant.audit.report import compact_experts

    rng = random.Random(38)
    leaves = ("gate_proj", "up_proj", "down_proj")
    for case in range(300):
        names = []
        for layer in range(rng.randint(0, 3)):
            for e in range(rng.choice((1, 2, 8, 128))):
                if rng.random() < 0.5:
                    names += [
                        f"model.layers.{layer}.mlp.experts.{e}.{leaf}"
                        for leaf in leaves
                        if case % 3 or rng.random() < 0.7
                    ]
        if case % 7 == 0:
            names.append("model.layers.0.mlp.gate")  # not an expert Linear: kept as it is
        line = compact_experts(names)
        assert sorted(_expand_braces(line)) == sorted(names), (case, line)
        if names and all(".experts." in n for n in names):
            assert len(line) <= len(", ".join(names))
