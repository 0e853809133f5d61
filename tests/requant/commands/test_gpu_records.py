"""Records made on a GPU by the portable engine (committed under tests/data/gpu_records by the
GPU run of benchmarks/gpu_portable.sh), replayed on this CPU by the portable engine's torch form:
every record of every file must match bit for bit (exit 0). Skipped while the folder holds none.

Reference: the records themselves, computed by another implementation (the Triton kernels,
compiled for the GPU) on another machine."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from requant.cli import app

DIR = Path(__file__).resolve().parents[2] / "data" / "gpu_records"
FILES = sorted(DIR.glob("*.jsonl"))


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    """A synthetic preset's checkpoint made here (seed 0), when its folder was not committed."""
    made = {}

    def get(name):
        if name not in made:
            from requant.checkpoint.synthetic import generate

            made[name] = generate(name, tmp_path_factory.mktemp("syn") / f"{name}.ckpt", seed=0)
        return made[name]

    return get


@pytest.mark.skipif(not FILES, reason="no GPU-made records committed under tests/data/gpu_records")
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_gpu_record_replays_on_the_cpu(path, tmp_path, presets):
    ckpt = path.with_suffix(".ckpt")  # NAME.ckpt, else PREFIX.ckpt for NAME = PREFIX-...
    if not ckpt.is_dir():
        ckpt = path.parent / (path.stem.split("-")[0] + ".ckpt")
    args = ["replay", str(path), "--device", "cpu", "--json", str(tmp_path / "r.json")]
    if ckpt.is_dir():
        args += ["--checkpoint", str(ckpt)]
    elif path.stem.split("-")[0] == "tiny":  # regenerated: the manifest check refuses other bytes (exit 2)
        args += ["--checkpoint", str(presets("tiny"))]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
