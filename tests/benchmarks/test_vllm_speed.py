"""benchmarks/vllm_speed.py and vllm_speed_report.py on the CPU: the arguments, the plan of runs
(one process per engine, the batch-invariant environment on its run only), the time budget, the
record `measure` writes from an engine's seconds, and the report of a record generated here.
vLLM never runs here; the requant engine's decode loop is checked in test_vllm_speed_engines.py."""

import importlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def _vs():
    return importlib.import_module("benchmarks.vllm_speed")


def _report():
    return importlib.import_module("benchmarks.vllm_speed_report")


def test_the_default_plan_and_cases():
    vs = _vs()
    a = vs.parse(["plan"])
    assert [r.engine for r in a.plan] == ["requant", "vllm", "vllm-bi"]
    assert {r.engine: r.env for r in a.plan} == {"vllm": {}, "vllm-bi": {"VLLM_BATCH_INVARIANT": "1"}, "requant": {}}
    assert {r.engine: r.compile for r in a.plan} == {"vllm": True, "vllm-bi": True, "requant": False}
    assert [c.key for c in a.case_list] == [
        "prefill 2048", "prefill 8192",
        "decode b1 c128", "decode b8 c128", "decode b64 c128",
        "decode b1 c4096", "decode b8 c4096", "decode b64 c4096",
    ]  # fmt: skip


def test_no_compile_and_limits_reach_the_runs():
    vs = _vs()
    a = vs.parse(["all", "--model", "M", "--out", "O", "--engines", "requant,vllm-bi,transformers"]
                 + ["--no-compile", "vllm-bi", "--limit-s", "vllm-bi=100,requant=7"])  # fmt: skip
    runs = {r.engine: r for r in a.plan}
    assert (runs["vllm-bi"].compile, runs["vllm-bi"].limit_s, runs["requant"].limit_s) == (False, 100, 7)
    assert runs["transformers"].limit_s == vs.LIMIT_S["transformers"]
    argv = runs["vllm-bi"].argv("M", "o.json", vs.common_args(a))
    assert argv[:3] == [sys.executable, "-m", "benchmarks.vllm_speed"] and argv[-1] == "--no-compile"
    assert vs.parse(argv[3:]).engine == "vllm-bi"  # the child's arguments parse


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["plan", "--engines", "vllm,sglang"], "--engines 'sglang'"),
        (["plan", "--no-compile", "requant2"], "--no-compile 'requant2'"),
        (["plan", "--batches", "1,x"], "--batches '1,x'"),
        (["plan", "--prefill", "0"], "--prefill '0'"),
        (["plan", "--contexts", "40"], "--contexts: context 40"),
        (["plan", "--limit-s", "vllm=ten"], "--limit-s 'vllm=ten'"),
        (["plan", "--steps", "0"], "--steps"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        _vs().parse(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err and err.startswith("error: ") and named in err


@given(st.integers(2, 20000), st.integers(1, 64))
def test_a_decode_prompt_leaves_room_for_its_steps(context, steps):
    vs = _vs()
    if context - steps - vs.HEADROOM < 1:
        with pytest.raises(ValueError):
            vs.decode_prompt_len(context, steps)
    else:
        assert vs.decode_prompt_len(context, steps) + steps + vs.HEADROOM == context


@given(st.integers(1, 1000), st.integers(0, 2000), st.floats(0, 2000))
def test_run_limit_keeps_inside_the_budget(limit, budget, elapsed):
    got = _vs().run_limit(limit, budget, elapsed)
    if budget == 0:
        assert got == limit
    elif budget - elapsed - 5 < 30:
        assert got is None
    else:
        assert got <= limit and got <= budget - elapsed - 5
        assert got == limit or got >= 30  # cut by the budget: never below 30 s


def test_prompt_ids_are_seeded_and_in_range():
    vs = _vs()
    a, b, c = vs.prompt_ids(151936, 4096, 3), vs.prompt_ids(151936, 4096, 3), vs.prompt_ids(151936, 4096, 4)
    assert a == b and a != c and len(a) == 4096 and 0 <= min(a) and max(a) < 151936
    assert vs.prompt_ids(1, 5, 0) == [0] * 5  # degenerate vocabulary


class _FakeEngine:
    """Seconds drawn from a seeded generator, kept to recompute the record; one case fails."""

    def __init__(self, a):
        self.rng = random.Random(5)
        self.info = {"startup_s": 1.5}
        self.prefill_secs, self.decode_secs = [], []

    def prefill(self, ids):
        s = self.rng.uniform(0.01, 1.0)
        self.prefill_secs.append((len(ids), s))
        return s

    def decode(self, prompts, steps, reps):
        if len(prompts) == 8:
            raise RuntimeError("out of memory")
        s = [self.rng.uniform(0.01, 1.0) for _ in range(reps)]
        self.decode_secs.append((len(prompts), len(prompts[0]), s))
        return s

    def done_case(self):
        pass


def test_measure_turns_seconds_into_the_record(tmp_path, monkeypatch):
    vs = _vs()
    eng = importlib.import_module("benchmarks._vllm_speed_engines")
    made = []
    monkeypatch.setitem(eng.ENGINE_CLASSES, "requant", lambda a: made.append(_FakeEngine(a)) or made[-1])
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    out = tmp_path / "r.json"
    a = vs.parse(["run", "--engine", "requant", "--model", str(model), "--out", str(out), "--reps", "3"]
                 + ["--steps", "4", "--prefill", "64", "--batches", "1,8", "--contexts", "16"])  # fmt: skip
    assert eng.measure(a) == 1  # the failed case
    rec = json.loads(out.read_text())
    fake = made[0]
    assert rec["startup_s"] == 1.5 and rec["timing"] == eng.TIMING["requant"]
    assert rec["errors"] == {"decode b8 c16": "RuntimeError: out of memory"}
    pre = fake.prefill_secs[1:]  # the first is the warm-up
    assert [n for n, _ in fake.prefill_secs] == [64] * 4
    assert rec["results"]["prefill 64"]["ttft_ms"]["median"] == 1e3 * sorted(s for _, s in pre)[1]
    assert rec["results"]["prefill 64"]["tok_s"]["max"] == 64 / min(s for _, s in pre)
    (b, n, secs), = fake.decode_secs  # fmt: skip
    assert (b, n) == (1, 16 - 4 - vs.HEADROOM)
    d = rec["results"]["decode b1 c16"]
    assert d["tok_s"]["median"] == 4 / sorted(secs)[1] and d["ms_per_step"] == 1e3 * sorted(secs)[1] / 4


def test_run_all_runs_each_engine_in_its_process(tmp_path, monkeypatch):
    vs = _vs()
    calls = []

    def fake_run(argv, env, log, limit):
        a = vs.parse(argv[3:])
        calls.append((a.engine, env.get("VLLM_BATCH_INVARIANT"), limit, a.no_compile))
        assert log == tmp_path / f"run_{a.engine}.log"
        if a.engine == "vllm-bi":
            return f"timeout after {limit} s"
        Path(a.out).write_text(json.dumps({"engine": a.engine, "label": a.engine, "results": {}, "errors": {}}))
        return 0

    monkeypatch.setattr(vs, "run_process", fake_run)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    a = vs.parse(["all", "--model", "M", "--out", str(tmp_path), "--engines", "requant,vllm,vllm-bi"]
                 + ["--no-compile", "vllm", "--limit-s", "requant=50"])  # fmt: skip
    assert vs.run_all(a) == 1
    lim = vs.LIMIT_S
    assert calls == [
        ("requant", None, 50, True),
        ("vllm", None, lim["vllm"], True),
        ("vllm-bi", "1", lim["vllm-bi"], False),
    ]
    rec = json.loads((tmp_path / "vllm_speed.json").read_text())
    assert [(r["engine"], r["process_rc"]) for r in rec["runs"]] == [
        ("requant", 0), ("vllm", 0), ("vllm-bi", f"timeout after {lim['vllm-bi']} s")
    ]  # fmt: skip
    assert (tmp_path / "vllm_speed.md").read_text().startswith("# requant beside vLLM")


def _record(seed: int) -> dict:
    """A vllm_speed.json of three engines with seeded medians; vllm-bi failed one case."""
    rng = random.Random(seed)
    cases = _vs().cases()
    runs = []
    for engine in ("requant", "vllm", "vllm-bi"):
        results, errors = {}, {}
        for c in cases:
            if engine == "vllm-bi" and c.key == "decode b64 c4096":
                errors[c.key] = "RuntimeError: x"
                continue
            med = rng.uniform(10, 60000)
            r = {"tok_s": {"median": med, "min": med * 0.9, "max": med * 1.1, "n": 5}}
            if c.kind == "prefill":
                ms = 1e3 * c.length / med
                r["ttft_ms"] = {"median": ms, "min": ms * 0.9, "max": ms * 1.1, "n": 5}
            results[c.key] = r
        runs.append({"engine": engine, "label": engine, "device": "NVIDIA H200", "results": results, "errors": errors,
                     "settings": {"steps": 32, "reps": 5}, "timing": {"prefill": "p", "decode": "d"}})  # fmt: skip
    return {"commit": "abc", "model": "/tmp/q8", "cases": [c.key for c in cases], "runs": runs}


@pytest.mark.parametrize("seed", range(6))
def test_the_table_ratios_and_goal_come_from_the_medians(seed):
    rec = _record(seed)
    md = _report().markdown(rec)
    runs = {r["engine"]: r["results"] for r in rec["runs"]}
    rows = {
        line.split(" | ")[0][2:]: line.strip("| ").split(" | ") for line in md.splitlines() if line.startswith("| ")
    }
    for case in rec["cases"]:
        cells = rows[case]
        rq, p = runs["requant"][case]["tok_s"]["median"], runs["vllm"][case]["tok_s"]["median"]
        assert cells[1] == f"{rq:.0f} [{0.9 * rq:.0f}-{1.1 * rq:.0f}]"
        assert cells[4] == f"{rq / p:.2f}x"
        if case in runs["vllm-bi"]:
            bi = runs["vllm-bi"][case]["tok_s"]["median"]
            assert cells[5] == f"{rq / bi:.2f}x"
            assert cells[6] == ("met" if rq > bi and rq >= 0.9 * p else "not met")
        else:
            assert cells[3] == "failed" and cells[5] == "-" and cells[6] == "-"
    assert rows["TTFT 8192 (ms)"][1] == f"{runs['requant']['prefill 8192']['ttft_ms']['median']:.1f}" + (
        f" [{runs['requant']['prefill 8192']['ttft_ms']['min']:.1f}-{runs['requant']['prefill 8192']['ttft_ms']['max']:.1f}]"
    )


def test_the_readme_row_has_the_readme_columns():
    rec = _record(1)
    row = _report().readme_row(rec)
    cells = row.strip("|").split(" | ")
    rq = {r["engine"]: r["results"] for r in rec["runs"]}
    met = sum(
        rq["requant"][c]["tok_s"]["median"] > rq["vllm-bi"][c]["tok_s"]["median"]
        and rq["requant"][c]["tok_s"]["median"] >= 0.9 * rq["vllm"][c]["tok_s"]["median"]
        for c in rec["cases"]
        if c in rq["vllm-bi"]
    )
    assert len(cells) == 4 and f"goal met on {met}/{len(rec['cases'])} rows" in cells[1]
    assert f"decode b1 c128: {rq['requant']['decode b1 c128']['tok_s']['median']:,.0f} tok/s" in cells[1]


def test_the_report_cli(tmp_path, capsys):
    rep = _report()
    path = tmp_path / "vllm_speed.json"
    path.write_text(json.dumps(_record(2)))
    assert rep.main([str(path), "--md", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == rep.markdown(_record(2))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert rep.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err


def test_run_process_kills_the_whole_session_at_its_limit(tmp_path):
    """A child that leaves a grandchild (as vLLM's engine core is) and outlives its limit: the
    status says so, and the grandchild is gone too."""
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        f"g = subprocess.Popen(['sleep', '600']); open({str(pidfile)!r}, 'w').write(str(g.pid)); "
        "print('started', flush=True); time.sleep(60)"
    )
    log = tmp_path / "run.log"
    rc = _vs().run_process([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}, log, 2)
    assert rc == "timeout after 2 s" and log.read_text() == "started\n"
    stat = Path(f"/proc/{int(pidfile.read_text())}/stat")

    def killed():  # gone, or a zombie waiting for its new parent to reap it
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while not killed() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not killed():  # the test's own grandchild: not left behind by a failing run
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert killed()


def test_run_process_returns_the_exit_status(tmp_path):
    rc = _vs().run_process([sys.executable, "-c", "print('x'); raise SystemExit(3)"], {}, tmp_path / "l", 30)
    assert rc == 3 and (tmp_path / "l").read_text() == "x\n"


def test_the_bound_line_is_the_weight_read_time_over_the_step():
    rec = _record(3)
    rq = rec["runs"][0]
    rq["weight_bytes_per_step"] = 8_200_000_000
    rq["results"]["decode b1 c128"]["ms_per_step"] = 4.1
    line = _report().bound_line(rq, "NVIDIA H200")
    assert line == (
        "requant decode b1 c128: 4.100 ms a step; the weight-read bound 1.708 ms (8.20 GB at 4.80 TB/s): 42% of it"
    )
    assert line in _report().markdown(rec)
    assert _report().bound_line(rq, "NVIDIA A100") is None  # no bandwidth known: no claim
