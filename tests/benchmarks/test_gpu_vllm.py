"""benchmarks/gpu_vllm.sh's collect stage, run by bash on the CPU over folders made here: what comes
back of a speed plan run under setsid (at most 8 files, the logs in one archive) and its exit
status while the plan still runs. The other stages need vLLM's wheels and a GPU."""

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collect(tmp_path: Path, finished: bool) -> tuple[subprocess.CompletedProcess, Path]:
    speed, out = tmp_path / "speed", tmp_path / "out"
    speed.mkdir()
    for name in ("vllm_speed.json", "vllm_speed.md", "env.txt", "run_vllm.json", "run_vllm.log", "speed.log"):
        (speed / name).write_text(name)
    if finished:
        (speed / "finished").write_text("")
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "REQUANT_COMMIT": "0123abc", "STAGE": "collect",
        "OUT": str(out), "WAIT_S": "1", "SPEED_DIR": str(speed), "PARTS_DIR": str(tmp_path / "parts"),
        "CK_DIR": str(tmp_path / "ck"),
    }  # fmt: skip
    r = subprocess.run(
        ["bash", "benchmarks/gpu_vllm.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    return r, out


def test_collect_brings_back_the_finished_plan(tmp_path):
    r, out = _collect(tmp_path, finished=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "speed_logs.tgz", "vllm_speed.json", "vllm_speed.md"]
    with tarfile.open(out / "speed_logs.tgz") as t:
        assert {"./run_vllm.log", "./speed.log", "./run_vllm.json"} <= set(t.getnames())
    assert (out / "vllm_speed.md").read_text() == "vllm_speed.md" and "vllm_speed.md" in r.stdout


def test_collect_says_when_the_plan_still_runs(tmp_path):
    r, out = _collect(tmp_path, finished=False)
    assert r.returncode == 1 and "still running" in r.stderr
    assert (out / "vllm_speed.json").exists()  # what is there so far comes back
