"""`--backends MODULE:FUNCTION` through requant audit and requant determinism (CliRunner).

The kernels are tests/audit/custom_kernels.py, written from the definitions: triton_order
(legal) and wrong_at_decode (truncating cast at M <= 8 only). The reference they are
compared with is the built-in reference-cutlass-order emulation (the other member of the pair).
"""

import json

import pytest
import typer
from typer.testing import CliRunner

from requant import kernels
from requant.commands.audit import audit
from requant.commands.determinism import determinism

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("audit")(audit)
app.command("determinism")(determinism)
runner = CliRunner()

LEGAL = "tests.audit.custom_kernels:triton_order"
WRONG = "tests.audit.custom_kernels:wrong_at_decode"
SMALL = ["--prompts", "1", "--decode-batches", "1", "--decode-tokens", "1"]


@pytest.fixture(autouse=True)
def _nothing_registered():
    """A command's MODULE:FUNCTION kernels live in its resolved pair: the process's backends
    are the built-in ones after every run."""
    before = kernels.scaled_mm_backends()
    yield
    assert kernels.scaled_mm_backends() == before


def _run(tmp_path, *args):
    out = tmp_path / "a.json"
    res = runner.invoke(app, ["audit", *args, *SMALL, "--json", str(out)])
    return res, (json.loads(out.read_text()) if out.exists() else None)


def test_a_legal_kernel_passes_with_its_fingerprinted_order(tmp_path):
    res, data = _run(tmp_path, "--backends", f"reference-cutlass-order,{LEGAL}")
    assert res.exit_code == 0, res.output
    assert data["backends"] == ["reference-cutlass-order", LEGAL]
    assert data["custom_kernels"][LEGAL]["order"] == "triton-order"
    assert data["custom_kernels"][LEGAL]["source"] == "fingerprint"
    assert data["kernels"]["backends"][LEGAL]["declares"] == "triton-order"  # C8 checks that order
    assert (
        data["decode"]["per_layer_summary"]["pow2"]["bitwise_equal"]
        == data["decode"]["per_layer_summary"]["pow2"]["layers"]
    )
    assert {b["variant"] for b in data["baseline"]} == {"B.cutlass-order", "B.triton-order"}
    # the tables and the summary on one stream, the table's heading saying what its cells hold
    assert "prefill (detected / observable)" in res.stdout and "per layer, decode M=1" in res.stdout
    assert "decode cells:" in res.stdout and "false negatives" in res.stdout


def test_a_kernel_wrong_only_at_decode_sizes_fails_the_decode_phase(tmp_path):
    args = ["--backends", f"reference-cutlass-order,{WRONG}", "--order", "triton-order"]
    res, data = _run(tmp_path, *args, "--phases", "prefill")
    assert res.exit_code == 0, res.output  # prefill alone (M = the prompt's 17 tokens) cannot see it
    assert data["custom_kernels"][WRONG] == {"order": "triton-order", "source": "--order", "verdict": None}
    res, data = _run(tmp_path, *args)
    assert res.exit_code == 1, res.output
    assert data["per_layer_summary"]["pow2"]["bitwise_equal"] == data["layers"]
    dec = data["decode"]["per_layer_summary"]["pow2"]
    assert dec["bitwise_equal"] < dec["layers"]
    # the kernel's own baseline row proves it faulty (C8): a kernel fault, named, not false positives
    assert data["decode"]["scorecard"]["false_positives"] == 0 and data["kernel_faults"] == []
    groups = data["decode"]["kernel_faults"]
    assert {(g["backend"], g["m"], g["regime"]) for g in groups} == {(WRONG, 1, "native"), (WRONG, 1, "pow2")}
    for g in groups:
        assert g["checks"] == ["C8"] and g["layers"] == data["layers"] and g["elements"] > 0
        got, want = int(g["first"]["got"], 16), int(g["first"]["want"], 16)
        assert abs(got - want) == 1  # truncation toward zero: one spacing from round-to-nearest-even
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("audit failed")]
    assert line == data["verdict"] and f"kernel {WRONG} is faulty" in line and "decode M=1" in line
    assert "declared triton-order" in line and "false positives" not in line


def test_bad_custom_kernels_are_usage_errors(tmp_path):
    res, _ = _run(tmp_path, "--backends", "reference-cutlass-order,tests.audit.custom_kernels:nothing")
    assert res.exit_code == 2 and "no callable" in res.output and "Traceback" not in res.output
    res, _ = _run(tmp_path, "--backends", "reference", "--order", "triton-order")
    assert res.exit_code == 2 and "--order" in res.output
    res, _ = _run(tmp_path, "--backends", f"reference-cutlass-order,{LEGAL}", "--order", "sideways")
    assert res.exit_code == 2 and "--order" in res.output
    res, _ = _run(tmp_path, "--phases", "decode")
    assert res.exit_code == 2 and "--phases" in res.output


def test_determinism_takes_a_module_function_backend(tmp_path):
    out = tmp_path / "d.json"
    res = runner.invoke(
        app,
        [
            "determinism",
            "--backends",
            f"reference-triton-order,{LEGAL}",
            "--prompts",
            "1",
            "--new-tokens",
            "2",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["backends"] == ["reference-triton-order", LEGAL]
    # registered (in the child process that ran it) with the order conform's fingerprint names
    assert data["custom_kernels"][LEGAL]["order"] == "triton-order"


DOUBLE = "tests.audit.custom_kernels:double_rounds"


def test_a_kernel_matching_no_legal_formula_is_a_failed_audit(tmp_path):
    """Independent reference: tests/audit/custom_kernels.double_rounds, written from the definition
    of double rounding; conform's crafted vectors tell it from every legal order."""
    res, data = _run(tmp_path, "--backends", f"reference-cutlass-order,{DOUBLE}")
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("audit failed")]
    assert len(lines) == 1 and DOUBLE in lines[0] and "nearest: triton-order" in lines[0]
    assert "first at case" in lines[0] and "Traceback" not in res.output
    fail = data["fingerprint_failure"]
    assert fail["kernel"] == DOUBLE and fail["nearest"] == "triton-order" and fail["mismatches"] > 0
    assert fail["first_difference"]["got"] != fail["first_difference"]["want"]
    assert data["custom_kernels"][DOUBLE]["order"] is None and data["verdict"].startswith("failed")
    # --order still audits it as that order: it runs, and the native C8 of its baseline fires
    res, data = _run(tmp_path, "--backends", f"reference-cutlass-order,{DOUBLE}", "--order", "triton-order")
    assert res.exit_code == 1 and "per_layer" in data and data["custom_kernels"][DOUBLE]["source"] == "--order"
    assert data["scorecard"]["false_positives"] == 0  # its baseline row is a kernel fault, not a false positive
    assert {(g["backend"], g["regime"]) for g in data["kernel_faults"]} == {(DOUBLE, "native")}
    assert data["verdict"].startswith(f"audit failed: kernel {DOUBLE} is faulty")


def test_a_kernel_that_cannot_run_stays_exit_2(tmp_path):
    res, data = _run(tmp_path, "--backends", "reference-cutlass-order,tests.audit.custom_kernels:two_args")
    assert res.exit_code == 2 and res.output.count("error:") == 1 and "Traceback" not in res.output
    assert data is None
