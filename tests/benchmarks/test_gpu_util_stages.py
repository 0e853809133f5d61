"""benchmarks/gpu_util_stages.py: nvidia-smi samples split by the audit log's stage lines.
Independent reference: sample files written here, the expected means computed by hand."""

from datetime import datetime

from benchmarks import gpu_util_stages as g


def _csv(rows):
    return "\n".join(f"2026/12/06 {t}, {u}, 1000" for t, u in rows) + "\n"


def test_each_stage_gets_the_samples_from_its_line_to_the_next():
    samples = g.read_samples(
        "garbage line\n"
        + _csv([("23:59:58.000", 10), ("23:59:58.500", 30), ("23:59:59.100", 100), ("00:00:00.400", 50)])
    )
    # the clock passes midnight: the samples carry their date, the log lines only the time
    samples[-1] = (datetime(2026, 12, 7, 0, 0, 0, 400000), 50.0)
    log = "auditing x\n[23:59:58] native: loading\nsome table\n[23:59:59] native: cells   \n[00:00:00] pow2: decode\n"
    day = datetime(2026, 12, 6)
    rows = g.per_stage(samples, g.read_stages(log, day))
    assert [r["stage"] for r in rows] == ["native: loading", "native: cells", "pow2: decode"]
    assert [r["samples"] for r in rows] == [2, 1, 1]
    assert [r["mean_util"] for r in rows] == [20.0, 100.0, 50.0]
    assert rows[0]["seconds"] == 1.0 and rows[2]["seconds"] == 0.4
    text = g.markdown(rows)
    assert text.splitlines()[2] == "| native: loading | 1.0 | 2 | 20.0 | 20.0 |"


def test_a_stage_without_samples_says_so():
    samples = g.read_samples(_csv([("10:00:05.000", 80)]))
    rows = g.per_stage(samples, g.read_stages("[10:00:00] a\n[10:00:01] b\n", datetime(2026, 12, 6)))
    assert rows[0] == {"stage": "a", "seconds": 1.0, "samples": 0, "mean_util": None, "median_util": None}
    assert rows[1]["samples"] == 1 and rows[1]["mean_util"] == 80.0
