"""benchmarks/audit_moe_groups.py on a small layer: the experts alone and grouped give equal results,
grouped with fewer dispatched ops; benchmarks/audit_equality.py --compare on two audit records."""

import json

from benchmarks import audit_equality, audit_moe_groups


def test_alone_and_grouped_agree_and_grouping_dispatches_fewer_ops(tmp_path, monkeypatch):
    monkeypatch.setenv("REQUANT_AUDIT_GROUPS", "1")  # the script sets it per run; restored after
    for phase in ("prefill", "decode"):
        out = tmp_path / f"{phase}.json"
        argv = ["x", "--experts", "6", "--top", "2", "--tokens", "5", "--k", "32", "--n", "16", "--phase", phase]
        monkeypatch.setattr("sys.argv", [*argv, "--json", str(out)])
        assert audit_moe_groups.main() == 0
        rep = json.loads(out.read_text())
        assert rep["equal"] is True and 1 <= rep["linears"] <= 6
        assert rep["grouped"]["kernel_ops"] < rep["alone"]["kernel_ops"]


def test_compare_files_ignores_timings_and_the_command_line(tmp_path):
    base = {"command": "requant audit a", "timings": {"x": 1}, "wall_seconds": 2, "per_layer": [{"m": 3}]}
    paths = []
    for i, rec in enumerate(
        [base, {**base, "command": "requant audit b", "timings": {"x": 9}}, {**base, "per_layer": [{"m": 4}]}]
    ):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(rec))
    assert audit_equality.compare_files(paths[0], paths[1]) == 0
    assert audit_equality.compare_files(paths[0], paths[2]) == 1
