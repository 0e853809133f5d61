"""Records made on a GPU by the portable engine (committed under tests/data/gpu_records by the
GPU run of benchmarks/gpu_portable.sh), replayed on this CPU by the portable engine's torch form:
every record of every file must match bit for bit (exit 0). Skipped while the folder holds none.

Reference: the records themselves, computed by another implementation (the Triton kernels,
compiled for the GPU) on another machine."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from requant.cli import app

DIR = Path(__file__).resolve().parents[1] / "data" / "gpu_records"
FILES = sorted(DIR.glob("*.jsonl"))


@pytest.mark.skipif(not FILES, reason="no GPU-made records committed under tests/data/gpu_records")
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_gpu_record_replays_on_the_cpu(path, tmp_path):
    ckpt = path.with_suffix(".ckpt")
    args = ["replay", str(path), "--device", "cpu", "--json", str(tmp_path / "r.json")]
    if ckpt.is_dir():
        args += ["--checkpoint", str(ckpt)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
