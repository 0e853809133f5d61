"""`requant eval` end to end through typer's CliRunner and the real cli.app.

The runs use the micro Qwen3 checkpoint (2 layers, 32 wide, 128 positions): on the embedded
default two chapters per arm take about a minute of CPU with today's runtime, on the micro
model a few seconds, and the machinery (converter, simple_evaluate, samples, bootstrap,
reports) is the same. Independent references: the per-document log-likelihoods the JSON
records, recombined here with math.fsum into lm-eval's corpus formulas and the ratio
against native; the converter's output of the same arm, scored directly through the LM.
"""

import importlib.metadata
import json
import math

import pytest
from typer.testing import CliRunner

from requant.cli import app

runner = CliRunner()
REQUIRED = {
    "arms",
    "documents",
    "bootstrap",
    "decomposition",
    "lm_eval_version",
    "backend",
    "tokenizer",
    "tasks",
    "limit",
    "checkpoint",
    "tool_version",
    "command",
}


def _invoke(args):
    res = runner.invoke(app, ["eval"] + [str(a) for a in args])
    assert "Traceback" not in res.output
    return res


def test_eval_native_nearest_limit_2_json(micro_with_source, tmp_path):
    ckpt, _ = micro_with_source
    out = tmp_path / "eval.json"
    res = _invoke([ckpt, "--arms", "native,nearest", "--limit", 2, "--bootstrap", 500, "--json", out])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert REQUIRED <= set(r)
    assert r["documents"] == 2 and r["limit"] == 2 and r["tasks"] == ["requant-heldout"]
    assert r["bootstrap"]["replicates"] == 500 and r["bootstrap"]["seed"] == 0
    assert r["decomposition"]["probe_mismatch_share"] is None  # no probe arm
    assert r["lm_eval_version"] == importlib.metadata.version("lm_eval")
    assert r["backend"] == "reference-triton-order" and r["checkpoint"] == str(ckpt)
    assert r["tokenizer"] == {"kind": "byte-level", "sha256": None, "vocab_size": 256, "model_vocab_size": 64}
    assert r["command"].startswith("requant eval ") and "--limit 2" in r["command"]
    assert list(r["arms"]) == ["native", "nearest"]
    assert set(r["arms"]["native"]) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
    docs = r["per_task"]["requant-heldout"]["per_document"]
    assert [d["doc_id"] for d in docs] == [0, 1]
    W, B = sum(d["words"] for d in docs), sum(d["bytes"] for d in docs)
    ll = {arm: math.fsum(d["loglikelihood"][arm] for d in docs) for arm in ("native", "nearest")}
    assert r["arms"]["native"]["word_perplexity"] == pytest.approx(math.exp(-ll["native"] / W), rel=1e-12)
    assert r["arms"]["native"]["bits_per_byte"] == pytest.approx(-ll["native"] / B / math.log(2), rel=1e-12)
    near = r["arms"]["nearest"]
    assert near["delta_pct"] == pytest.approx(
        100 * (math.exp(-ll["nearest"] / W) / math.exp(-ll["native"] / W) - 1), rel=1e-9
    )
    assert near["ci90"][0] <= near["ci90"][1] and near["byte_ci90"][0] <= near["byte_ci90"][1]
    assert ll["nearest"] != ll["native"]  # the converted arm really is another model
    assert "nearest" in res.output and "Δ word ppl" in res.output


def test_eval_all_rows_report_and_decomposition(micro_with_source, tmp_path):
    """native, nearest, probe and the bf16 source on one document, with --report; the nearest
    row must equal the converter's checkpoint scored directly through the requant LM."""
    from requant.convert import convert
    from requant.eval.lm import RequantLM
    from requant.eval.task import heldout_docs

    ckpt, source = micro_with_source
    rep = tmp_path / "rep"
    res = _invoke(
        [
            ckpt,
            "--arms",
            "nearest,probe",
            "--source",
            source,
            "--limit",
            1,
            "--bootstrap",
            200,
            "--seed",
            7,
            "--report",
            rep,
            "--max-length",
            96,
        ]
    )
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in rep.iterdir()) == ["eval.json", "eval.md", "eval.png"]
    r = json.loads((rep / "eval.json").read_text())
    assert r["arm_order"] == ["native", "nearest", "probe", "bf16"] and r["max_length"] == 96
    assert r["servable"] == {"native": True, "nearest": True, "probe": False, "bf16": True}
    assert r["source"] == str(source) and r["bootstrap"]["seed"] == 7
    ppl = {k: v["word_perplexity"] for k, v in r["arms"].items()}
    share = (ppl["probe"] - ppl["nearest"]) / (ppl["probe"] - ppl["native"])
    assert r["decomposition"]["probe_mismatch_share"] == pytest.approx(share, rel=1e-9)
    for arm in ("nearest", "probe", "bf16"):  # one document: every resample is the full set
        assert r["arms"][arm]["ci90"] == pytest.approx([r["arms"][arm]["delta_pct"]] * 2, rel=1e-9)
    assert (rep / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (rep / "eval.md").read_text()
    assert "| probe (not servable) |" in md and "| bf16 |" in md and "Probe decomposition" in md
    assert not list(tmp_path.glob("**/.eval.*"))  # no temporary file left behind
    conv = tmp_path / "conv-nearest"
    convert(str(ckpt), conv, "nearest")
    direct = RequantLM(pretrained=str(conv), max_length=96, batch_size=4)

    class Req:
        args = (heldout_docs()[0]["text"],)

    (ll,) = direct.loglikelihood_rolling([Req()])
    assert r["per_task"]["requant-heldout"]["per_document"][0]["loglikelihood"]["nearest"] == ll


def test_eval_runs_on_a_qwen3_moe_checkpoint(tmp_path):
    """`requant eval` on the tiny Qwen3-MoE synthetic: native, nearest and the bf16
    source (whose expert tensors the source check reads) on one document; the nearest row equals
    the converter's MoE checkpoint scored directly through the requant LM, the bf16 row the source."""
    import dataclasses

    from requant.checkpoint.synthetic import PRESETS, generate
    from requant.convert import convert
    from requant.eval.lm import RequantLM
    from requant.eval.task import heldout_docs

    preset = dataclasses.replace(PRESETS["tiny-moe"], max_position=128)  # short windows: seconds of CPU
    ckpt = generate(preset, tmp_path / "moe", seed=1, keep_source=tmp_path / "moe_bf16")
    out = tmp_path / "eval.json"
    res = _invoke([ckpt, "--arms", "nearest", "--source", tmp_path / "moe_bf16", "--limit", 1, "--bootstrap", 100,
                   "--json", out])  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["arm_order"] == ["native", "nearest", "bf16"]
    lls = r["per_task"]["requant-heldout"]["per_document"][0]["loglikelihood"]
    assert len({lls["native"], lls["nearest"], lls["bf16"]}) == 3  # three models, three scores

    class Req:
        args = (heldout_docs()[0]["text"],)

    conv = tmp_path / "conv-nearest"
    convert(str(ckpt), conv, "nearest")
    (ll,) = RequantLM(pretrained=str(conv), batch_size=4).loglikelihood_rolling([Req()])
    assert lls["nearest"] == ll


@pytest.mark.parametrize(
    "args, message",
    [
        (["--arms", "native,fancy"], "unknown arm 'fancy'"),
        (["--arms", "nearest,nearest"], "twice"),
        (["--backend", "warp-drive"], "unknown backend 'warp-drive'"),
        (["--limit", "0"], "--limit"),
        (["--device", "cuda:7"], "no CUDA device"),
        (["--backend", "cutlass", "--device", "cpu"], "needs a CUDA GPU"),
        (["--act-backend", "nope"], "unknown act backend 'nope'"),
        (["--max-length", "4096"], "2048 positions"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    res = _invoke(["--limit", 1] + args if "--limit" not in args else args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert len([line for line in res.output.splitlines() if line.strip()]) == 1


def test_checkpoint_and_source_errors(micro_with_source, tmp_path):
    ckpt, source = micro_with_source
    res = _invoke([tmp_path / "nowhere", "--limit", 1])
    assert res.exit_code == 2 and "nowhere" in res.output
    res = _invoke([ckpt, "--source", ckpt, "--limit", 1])  # a W8A8 checkpoint is not a bf16 source
    assert res.exit_code == 2 and "quantization_config" in res.output
    cfg = json.loads((source / "config.json").read_text())
    bad = tmp_path / "bad_source"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**cfg, "vocab_size": 99}))
    res = _invoke([ckpt, "--source", bad, "--limit", 1])
    assert res.exit_code == 2 and "vocab_size" in res.output
    (bad / "config.json").write_text(json.dumps(cfg))
    res = _invoke([ckpt, "--source", bad, "--limit", 1])
    assert res.exit_code == 2 and "model.safetensors" in res.output
    import torch
    from safetensors.torch import load_file, save_file

    t = load_file(str(source / "model.safetensors"))
    t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"].to(torch.float32)
    save_file(t, str(bad / "model.safetensors"))
    res = _invoke([ckpt, "--source", bad, "--limit", 1])
    assert res.exit_code == 2 and "'model.layers.0.mlp.up_proj.weight' is F32" in res.output


def test_unknown_task_exit_2(monkeypatch):
    """An unknown name is refused before any model is loaded. (lm-eval's own 14,700-task index
    takes ~20 s to build; it is left out here, so the name is checked against ours only.)"""
    import lm_eval.tasks

    real = lm_eval.tasks.TaskManager
    monkeypatch.setattr(
        lm_eval.tasks,
        "TaskManager",
        lambda include_path=None, include_defaults=True: real(include_path=include_path, include_defaults=False),
    )
    res = _invoke(["--tasks", "requant-heldout,no-such-task", "--limit", 1])
    assert res.exit_code == 2 and "unknown task 'no-such-task'" in res.output


def test_json_ties_the_numbers_to_the_bytes_and_the_code(micro_with_source, tmp_path):
    """manifest_digest, tool_version and git_commit, as the audit records them. References:
    the manifest digest by hand (tests/digests.py: hashlib over the files),
    requant.evidence.buildinfo.build_info() for the code (the stored-SHA256SUMS case is shared code,
    requant.evidence.identity, tested through determinism and the audit). A SHA256SUMS that does not
    match the files is a checkpoint error before any arm runs (exit 2)."""
    from requant.evidence import manifest as mf
    from requant.evidence.buildinfo import build_info
    from tests.digests import manifest_digest_by_hand

    ckpt, _ = micro_with_source
    out = tmp_path / "eval.json"
    res = _invoke(
        [ckpt, "--arms", "native", "--limit", 1, "--bootstrap", 10, "--json", out, "--report", tmp_path / "rep"]
    )
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert (
        r["tool"] == "requant eval" and r["manifest"] is None and r["manifest_digest"] == manifest_digest_by_hand(ckpt)
    )
    assert {k: r[k] for k in ("tool_version", "git_commit")} == build_info()
    assert f"checkpoint manifest digest: `{r['manifest_digest']}`" in (tmp_path / "rep" / "eval.md").read_text()
    mf.write(ckpt)
    (ckpt / "config.json").write_bytes((ckpt / "config.json").read_bytes() + b"\n")
    before = out.read_bytes()
    res = _invoke([ckpt, "--arms", "native", "--limit", 1, "--bootstrap", 10, "--json", out])
    assert res.exit_code == 2 and "config.json differs" in res.output
    assert "evaluating" not in res.output and out.read_bytes() == before  # nothing ran, nothing written
