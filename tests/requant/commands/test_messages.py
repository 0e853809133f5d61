"""Error messages are one line whatever the terminal (piped to a file: no hard wrap at 80
columns), control characters in file names are escaped, and a non-finite non-quantized tensor
is named with its file. References: the bytes written to a real file by a real `requant`
process, and the tensor the test damaged."""

import os
import shutil
import subprocess
import sys

import torch
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from requant.io.safetensors_io import read_header

runner = CliRunner()


def _error_lines(text):
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


def _nan_in(path, tensor, index=3):
    f = read_header(path)
    info = f.info(tensor)
    raw = bytearray(path.read_bytes())
    pos = f.data_start + info.begin + 2 * index
    raw[pos : pos + 2] = torch.tensor([float("nan")], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    path.write_bytes(bytes(raw))


def test_an_error_piped_to_a_file_is_one_line(tmp_path):
    long = tmp_path / ("a-directory-with-a-long-name-" * 4) / "missing-checkpoint"
    err = tmp_path / "stderr.txt"
    env = dict(os.environ, COLUMNS="80")
    with open(err, "wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "requant.cli", "audit", str(long), "--backends", "reference", "--prompts", "1"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            env=env,
        ).returncode
    text = err.read_text()
    assert rc == 2 and len(text) > 160, text  # longer than two 80-column lines
    assert text.count("\n") == 1 and text.startswith("error: ") and str(long) in text


def test_a_refused_tensor_piped_to_a_file_is_one_line(tmp_path, micro):
    from tests.requant.checkpoint.test_checkpoint import _set_scale

    _set_scale(micro, float("nan"))  # the case: "...NaN scale \nnan at output channel 3"
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "requant.cli", "determinism", str(micro), "--backends", "reference"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            env=dict(os.environ, COLUMNS="80"),
        ).returncode
    text = err.read_text()
    assert rc == 2 and text.count("\n") == 1 and text.startswith("error: "), text
    assert "NaN scale nan at output channel 3" in text and len(text) > 80


def test_a_newline_in_a_file_name_is_escaped(tmp_path):
    d = tmp_path / "two\nlines"
    res = runner.invoke(app, ["inspect", str(d)])
    assert res.exit_code == 2
    errors = _error_lines(res.stderr)
    assert len(errors) == 1 and "two\\nlines" in errors[0] and res.stderr.count("\n") == 1, res.stderr


def test_nan_embeddings_are_named_with_their_file(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, d, ignore=shutil.ignore_patterns("SHA256SUMS"))
    _nan_in(d / "model.safetensors", "model.embed_tokens.weight")
    for args in (
        ["determinism", str(d), "--backends", "reference", "--prompts", "1", "--new-tokens", "1"],
        ["audit", str(d), "--backends", "reference", "--prompts", "1"],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output  # the audit passed this with exit 0
        errors = _error_lines(res.stderr)
        assert len(errors) == 1, res.stderr
        assert "model.safetensors" in errors[0] and "model.embed_tokens.weight" in errors[0]
        assert "nan at flat index 3" in errors[0]


def test_the_hubs_message_and_requants_hint_stay_apart(hub, pow2_copy):
    from tests.conftest import TOKEN

    hub.fail("POST", "create", 401, "denied for Bearer " + TOKEN)  # a server that echoes the credential
    res = runner.invoke(app, ["push", str(pow2_copy), "requant-test/x"])
    assert res.exit_code == 2, res.output
    (line,) = _error_lines(res.stderr)
    assert TOKEN not in res.output
    assert "(the Hub said: 'denied for Bearer ***')" in line and line.endswith(
        ". Hint: set HF_TOKEN or run `hf auth login` with a write token"
    ), line


def test_scrub_stops_at_the_punctuation_after_a_credential():
    from requant.publish.push import scrub

    assert scrub("Bearer abc123; then", None) == "Bearer ***; then"
    assert scrub("(Authorization: Bearer abc123)", None) == "(Authorization: Bearer ***)"
