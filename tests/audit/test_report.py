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
