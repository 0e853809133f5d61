"""`requant conform --kernel` runs user code; whatever that code does, the command ends with a
verdict (0/1) or one `error:` line and exit 2, never a false pass or a traceback: a kernel or a
module calling sys.exit(0), a kernel returning a meta, sparse or nested tensor, an exception
whose __str__ itself raises. The kernels written here are the references: each is known to be
none of the legal orders."""

import textwrap

import pytest
from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()

KERNELS = textwrap.dedent("""
    import sys
    import torch
    from requant.kernels.reference import scaled_mm_triton_order

    def exits_zero(a, w, s_a, s_w):
        sys.exit(0)

    def meta(a, w, s_a, s_w):
        return torch.empty(a.shape[0], w.shape[0], dtype=torch.bfloat16, device="meta")

    def sparse(a, w, s_a, s_w):
        return scaled_mm_triton_order(a, w, s_a, s_w).to_sparse()

    def nested(a, w, s_a, s_w):
        y = scaled_mm_triton_order(a, w, s_a, s_w)
        return torch.nested.nested_tensor([y, y])

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no message either")

    def bad_str(a, w, s_a, s_w):
        raise Unprintable()
""")


@pytest.fixture
def user_kernels(tmp_path, monkeypatch):
    (tmp_path / "userkernels.py").write_text(KERNELS)
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the kernel runs in a child process (requant.commands._isolate): torch's prototype warning
    # for nested tensors would reach its stderr, which pytest's warning capture does not see
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    return tmp_path


def _error_line(res):
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    return lines[0]


@pytest.mark.parametrize(
    "fn,words",
    [
        ("exits_zero", "called sys.exit(0) on case"),
        ("meta", "returned a meta tensor"),
        ("sparse", "returned a torch.sparse_coo tensor"),
        ("nested", "returned a nested tensor"),
        ("bad_str", "raised Unprintable on case epilogue: (its message could not be rendered"),
    ],
)
def test_user_kernel_misbehaving_is_exit_2_with_one_line(user_kernels, fn, words):
    res = runner.invoke(app, ["conform", "--kernel", f"userkernels:{fn}", "--json", str(user_kernels / "r.json")])
    assert res.exit_code == 2, res.output
    assert words in _error_line(res)
    assert not (user_kernels / "r.json").exists()


def test_a_module_calling_sys_exit_zero_at_import_is_exit_2_not_a_pass(user_kernels):
    res = runner.invoke(app, ["conform", "--kernel", "exits_on_import:f"])
    assert res.exit_code == 2, res.output
    assert "importing exits_on_import called sys.exit(0)" in _error_line(res)
