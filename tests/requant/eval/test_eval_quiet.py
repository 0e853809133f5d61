"""Small things a user of `requant eval` notices: one document gives a degenerate interval and
says so; the manifest-digest bar ends when hashing ends (its total is what is hashed); lm-eval's
request-building tqdm and git's "not a git repository" stay off stderr. References: the files
`requant manifest --write` lists (SHA256SUMS) and their sizes on disk; the process's stderr at
file-descriptor level (capfd: git is a child process)."""

import json
import os

from typer.testing import CliRunner

from requant.checkpoint import open_checkpoint
from requant.cli import app
from requant.evidence import manifest as mf

runner = CliRunner()


def test_one_document_warns_of_a_degenerate_interval_and_stderr_stays_quiet(
    micro_with_source, tmp_path, monkeypatch, capfd
):
    ckpt, _ = micro_with_source
    away = tmp_path / "not-a-checkout"
    away.mkdir()
    monkeypatch.chdir(away)  # lm-eval asks git about the working directory
    out = tmp_path / "e.json"
    res = runner.invoke(
        app, ["eval", str(ckpt), "--arms", "native,nearest", "--limit", "1", "--bootstrap", "50", "--json", str(out)]
    )
    captured = capfd.readouterr()
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["documents"] == 1 and len(r["warnings"]) == 1 and "degenerate" in r["warnings"][0]
    assert "warning: 1 document scored (--limit 1)" in res.stderr
    noise = res.stderr + captured.err
    assert "not a git repository" not in noise and "it/s]" not in noise, noise


def test_the_digest_bar_ends_at_its_total(micro, tmp_path):
    from requant.eval.run import _identity

    (micro / "README.md").write_text("a card: not hashed\n")
    (micro / "requant-eval.json").write_text("{}\n")
    mf.write(micro)
    listed, _ = mf.read(micro)
    calls = []
    _identity(open_checkpoint(micro), lambda done, total: calls.append((done, total)), {})
    total = sum(os.path.getsize(micro / rel) for rel in listed)
    assert calls[0] == (0, total) and calls[-1] == (total, total)
