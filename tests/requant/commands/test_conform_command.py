"""`requant conform` through the assembled app: exit 0 for a kernel whose declared legal order
is confirmed, 1 for a catalogue fault (audit/catalogue/faults.py says what it computes), 2 with one
`error:` line for requests it cannot run (no kernel named, broken callables written here)."""

import json
import textwrap

import pytest
from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()

BROKEN = textwrap.dedent("""
    from requant.kernels.reference import scaled_mm_triton_order

    def raises(a, w, s_a, s_w):
        raise RuntimeError("no kernel for you")

    def wrong_dtype(a, w, s_a, s_w):
        return scaled_mm_triton_order(a, w, s_a, s_w).float()

    def wrong_shape(a, w, s_a, s_w):
        return scaled_mm_triton_order(a, w, s_a, s_w).T
""")


def _invoke(*args):
    res = runner.invoke(app, ["conform", *map(str, args)])
    assert "Traceback" not in res.output, res.output
    return res


def _error_line(res):
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_a_backend_that_implements_its_declared_order_exits_0(tmp_path):
    res = _invoke("--backend", "reference-triton-order", "--json", tmp_path / "r.json", "--export", tmp_path / "vec")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == (
        "reference-triton-order: implements Triton order ((s_a*acc)*s_w, RNE), "
        "exact int32 accumulation, batch-invariant"
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["conforms"] and doc["formula"] == "triton-order" and doc["declared"] == "triton-order"
    assert doc["vectors"]["pinned"] and doc["command"].startswith(
        "requant conform --backend reference-triton-order --json "
    )
    assert sorted(p.name for p in (tmp_path / "vec").iterdir()) == ["vectors.json", "vectors.safetensors"]


@pytest.mark.parametrize(
    "fault,start",
    [
        ("F4", "implements Triton order truncated to bf16"),
        ("F7", "implements Triton order ((s_a*acc)*s_w, RNE), inexact accumulation (an int16 accumulator"),
        ("F9c", "matches no known formula; nearest: "),
    ],
)
def test_a_catalogue_fault_exits_1(fault, start):
    res = _invoke("--kernel", f"requant.audit.conform.fault_kernels:{fault}")
    assert res.exit_code == 1, res.output
    assert res.stdout.splitlines()[0].startswith(f"requant.audit.conform.fault_kernels:{fault}: {start}")


@pytest.mark.parametrize(
    "fn,msg",
    [
        ("raises", "kernel brokenkernels:raises raised RuntimeError on case epilogue: no kernel for you"),
        (
            "wrong_dtype",
            "kernel brokenkernels:wrong_dtype returned dtype torch.float32 on case epilogue, expected torch.bfloat16",
        ),
        (
            "wrong_shape",
            "kernel brokenkernels:wrong_shape returned shape (24, 16) on case epilogue_random, expected (16, 24)",
        ),
    ],
)
def test_broken_callables_exit_2_with_one_line(fn, msg, tmp_path, monkeypatch):
    (tmp_path / "brokenkernels.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    res = _invoke("--kernel", f"brokenkernels:{fn}", "--json", tmp_path / "r.json")
    assert res.exit_code == 2, res.output
    assert msg in _error_line(res) and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "args,msg",
    [
        ([], "exactly one of --backend"),
        (["--backend", "nope"], "unknown backend 'nope'"),
        (["--kernel", "requant.no_such:f"], "cannot import requant.no_such"),
        (["--backend", "reference", "--device", "banana"], "--device"),
    ],
)
def test_requests_it_cannot_run_exit_2(args, msg):
    res = _invoke(*args)
    assert res.exit_code == 2 and msg in _error_line(res)
