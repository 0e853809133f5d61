"""`requant convert` refuses a source whose SHA256SUMS does not match its files, as audit, eval,
determinism, card and push do, and writes nothing. References: hashlib over the source's files
(a manifest written by `requant manifest --write`), the files on disk before and after."""

import pytest
from typer.testing import CliRunner

from requant.cli import app
from requant.convert import convert
from requant.errors import CheckpointError
from requant.evidence import manifest as mf
from tests.requant.conftest import leftovers, tree_bytes

runner = CliRunner()


@pytest.mark.parametrize("arm", ["nearest", "unconstrained"])
def test_a_source_that_differs_from_its_manifest_is_refused(tmp_path, micro, arm):
    mf.write(micro)
    convert(micro, tmp_path / "ok", arm)  # a matching manifest converts as before
    cfg = micro / "config.json"
    cfg.write_text(cfg.read_text() + " ")  # one byte that SHA256SUMS does not vouch for
    before = tree_bytes(micro)
    with pytest.raises(mf.ManifestError, match="config.json differs"):
        convert(micro, tmp_path / "out", arm)
    assert leftovers(tmp_path, "out") == [] and tree_bytes(micro) == before
    res = runner.invoke(app, ["convert", str(micro), "-o", str(tmp_path / "out"), "--arm", arm])
    assert res.exit_code == 2 and "config.json differs" in res.stderr and "Traceback" not in res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert leftovers(tmp_path, "out") == []


def test_a_file_missing_or_unlisted_is_refused_before_any_work(tmp_path, micro, monkeypatch):
    import requant.convert as conv

    mf.write(micro)
    (micro / "notes.txt").write_text("not listed")

    def no_work(*args, **kwargs):
        raise AssertionError("the conversion started")

    monkeypatch.setattr(conv, "AtomicOutput", no_work)
    with pytest.raises(CheckpointError, match="notes.txt not listed"):
        convert(micro, tmp_path / "out", "nearest")
    (micro / "notes.txt").unlink()
    assert leftovers(tmp_path, "out") == []
