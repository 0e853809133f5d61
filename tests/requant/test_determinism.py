"""`requant determinism` (requant/determinism.py, requant/commands/determinism.py) through
typer's CliRunner, with the two emulated epilogue orders on the CPU.

References: hashlib over struct-packed little-endian int64 ids for the digests; a
hand-built "walk" checkpoint whose greedy tokens are known by construction (below) for the
first divergence; kernels/reference.py's two epilogue orders, called directly, for the
premise of that construction.
"""

import hashlib
import json
import re
import struct

import pytest
import torch
import typer
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.commands.determinism import determinism
from requant.determinism import first_divergence, ids_sha256
from requant.models.prompts import prompts
from requant.models.tokenizer import load_tokenizer

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("determinism")(determinism)
app.command("noop")(lambda: None)  # two commands: "determinism" stays a sub-command, as in cli.py
runner = CliRunner()
SUMMARY = re.compile(r"^pow2: (\d+)/(\d+) identical; native: (\d+)/(\d+)$", re.M)


def test_digest_and_divergence_helpers():
    ids = [0, 1, 257, 151935, 2**40]
    assert ids_sha256(ids) == hashlib.sha256(struct.pack("<5q", *ids)).hexdigest()
    assert ids_sha256([]) == hashlib.sha256(b"").hexdigest()
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_default_with_the_emulated_orders(tmp_path):
    out = tmp_path / "det.json"
    res = runner.invoke(
        app, ["determinism", "--backends", "reference", "--prompts", "3", "--new-tokens", "5", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert set(data) >= {
        "regimes",
        "batch_invariance",
        "tokenizer",
        "backends",
        "new_tokens",
        "device",
        "tool_version",
        "summary",
    }
    assert data["backends"] == ["reference-cutlass-order", "reference-triton-order"] and data["new_tokens"] == 5
    vocab = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())["vocab_size"]
    assert data["tokenizer"] == load_tokenizer(DEFAULT_CHECKPOINT, vocab).describe()
    assert data["device"] == "cpu"
    for regime in ("native", "pow2"):
        r = data["regimes"][regime]
        assert set(r) >= {"identical", "total", "prompts"} and r["total"] == 3 == len(r["prompts"])
        for p in r["prompts"]:
            assert set(p) >= {"identical", "first_divergence", "sha256", "text", "tokens"}
            for b in data["backends"]:
                assert len(p["tokens"][b]) == 5
                assert p["sha256"][b] == hashlib.sha256(struct.pack("<5q", *p["tokens"][b])).hexdigest()
            assert p["identical"] == (p["tokens"][data["backends"][0]] == p["tokens"][data["backends"][1]])
        for b in data["backends"]:
            assert data["batch_invariance"][regime][b] == {"identical": 3, "total": 3, "differing_prompts": []}
    assert data["regimes"]["pow2"]["identical"] == 3
    m = SUMMARY.search(res.stdout)
    assert m and res.stdout.rstrip().splitlines()[-1] == data["summary"] == m.group(0)
    assert "| native | reference-triton-order | 3/3 | - |" in res.stdout


# -- a checkpoint whose answer is known by construction -------------------------------------
# One layer, hidden 64 = vocab 64. Token t embeds as the one-hot e_t; every Linear of the
# layer has int8 weights 0, so attention and MLP add exact zeros and the last position's
# hidden state is e_t whatever came before. The final RMSNorm makes it 8 e_t (times the
# norm weight g_t), the per-token quantizer gives q = 127 at t, and lm_head row v scores
# bf16(s_a * s_v * 127 * w[v, t]): greedy decoding is a walk next(t) = the row with the
# largest score (ties: the lowest id). Designed walk from '.' (46), the last byte of
# calibration prompts 0-3: 46 -> 1 -> 2 -> 3 -> 4 -> U. At token 4 (norm weight
# G = 0.546875) two rows compete: U1 = 10 (w 3, scale 0.005859375) and U2 = 11 (w 9,
# scale 2**-9, a power of two: both orders give 0.0771484375). Row U1 is 0.0771484375 in
# the CUTLASS order and 0.07666015625 in the Triton order: a tie, won by the lower id U1,
# under CUTLASS; U2 wins under Triton. So native decodes [1, 2, 3, 4, 10, ...] vs
# [1, 2, 3, 4, 11, ...]: first divergence 4 for prompts 0-3. Prompt 4 ends with ')' (41),
# whose column is all zeros: token 0 forever, identical. Under pow2 the two orders agree.
WALK = {46: 1, 1: 2, 2: 3, 3: 4, 10: 12, 11: 13}
T_STAR, G, U1, U2 = 4, 0.546875, 10, 11
W1, S1, W2, S2 = 3, 0.005859375, 9, 2.0**-9


def write_walk_checkpoint(path):
    from safetensors.torch import save_file

    from requant.checkpoint.synthetic import Preset, model_config

    p = Preset(
        hidden=64,
        intermediate=64,
        layers=1,
        heads=2,
        kv_heads=1,
        head_dim=32,
        vocab=64,
        tie=False,
        max_position=256,
        bos=62,
        eos=63,
    )
    t = {"model.embed_tokens.weight": torch.eye(64, dtype=torch.bfloat16)}
    norm = torch.ones(64, dtype=torch.bfloat16)
    norm[T_STAR] = G
    t["model.norm.weight"] = norm
    pre = "model.layers.0."
    for n in ("input_layernorm", "post_attention_layernorm"):
        t[pre + n + ".weight"] = torch.ones(64, dtype=torch.bfloat16)
    for n in ("self_attn.q_norm", "self_attn.k_norm"):
        t[pre + n + ".weight"] = torch.ones(32, dtype=torch.bfloat16)
    for leaf, (out, inp) in p.layer_linear_shapes().items():
        t[pre + leaf + ".weight"] = torch.zeros(out, inp, dtype=torch.int8)
        t[pre + leaf + ".weight_scale"] = torch.full((out, 1), 2.0**-7, dtype=torch.bfloat16)
    w = torch.zeros(64, 64, dtype=torch.int8)
    s = torch.full((64, 1), 2.0**-7, dtype=torch.bfloat16)
    for a, b in WALK.items():
        w[b, a] = 127
    w[U1, T_STAR], w[U2, T_STAR] = W1, W2
    s[U1], s[U2] = S1, S2
    t["lm_head.weight"], t["lm_head.weight_scale"] = w, s
    path.mkdir(parents=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = model_config(p, quantized=True)
    cfg["quantization_config"]["ignore"] = []  # lm_head quantized too
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def test_the_walk_premise_with_the_kernels_directly():
    """Token 4's two competing rows through kernels/reference.py's epilogues."""
    from requant.kernels.reference import epilogue_cutlass_order, epilogue_triton_order, quantize_activations

    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    x[0, T_STAR] = 8.0 * G  # bf16(8 e_t) times the norm weight: exact
    q, s_a = quantize_activations(x)
    assert int(q[0, T_STAR]) == 127
    acc = torch.tensor([[127 * W1, 127 * W2]], dtype=torch.int32)
    s_w = torch.tensor([[S1], [S2]])
    c = epilogue_cutlass_order(acc, s_a, s_w)[0].float().tolist()
    t = epilogue_triton_order(acc, s_a, s_w)[0].float().tolist()
    assert c == [0.0771484375, 0.0771484375] and t == [0.07666015625, 0.0771484375]
    assert prompts(5)[4].endswith(")") and all(p.endswith(".") for p in prompts(5)[:4])


def test_a_pair_that_must_differ_is_found_at_the_known_position(tmp_path):
    ck = write_walk_checkpoint(tmp_path / "walk")
    out = tmp_path / "walk.json"
    res = runner.invoke(
        app,
        ["determinism", str(ck), "--backends", "reference", "--prompts", "5", "--new-tokens", "7", "--json", str(out)],
    )
    assert res.exit_code == 0, res.output  # pow2 identical and batch-invariant: success even though native differs
    data = json.loads(out.read_text())
    assert data["summary"] == "pow2: 5/5 identical; native: 1/5"
    cut, tri = data["backends"]
    native = data["regimes"]["native"]["prompts"]
    for p in native[:4]:
        assert p["identical"] is False and p["first_divergence"] == 4
        assert p["tokens"][cut] == [1, 2, 3, 4, U1, 12, 0] and p["tokens"][tri] == [1, 2, 3, 4, U2, 13, 0]
    assert native[4]["identical"] and native[4]["first_divergence"] is None and native[4]["tokens"][cut] == [0] * 7
    assert all(p["identical"] for p in data["regimes"]["pow2"]["prompts"])
    assert data["batch_invariant"]
    assert "| 0 | **no** | 4 |" in res.stdout


def test_a_converted_checkpoint_is_its_own_pow2_regime(tmp_path):
    from requant.convert import convert

    src = write_walk_checkpoint(tmp_path / "walk")
    conv = tmp_path / "walk-pow2"
    convert(src, conv, "nearest")
    out = tmp_path / "conv.json"
    res = runner.invoke(
        app,
        [
            "determinism",
            str(conv),
            "--backends",
            "reference",
            "--prompts",
            "2",
            "--new-tokens",
            "6",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["converted"]["arm"] == "nearest" and data["converted"]["all_scales_pow2"]
    assert data["regimes"]["pow2"]["same_as"] == "native"
    strip = {k: v for k, v in data["regimes"]["pow2"].items() if k != "same_as"}
    assert strip == data["regimes"]["native"] and data["summary"] == "pow2: 2/2 identical; native: 2/2"
    assert "native is the pow2 regime" in res.stdout


def test_exit_status_one_when_pow2_is_not_identical(monkeypatch):
    import requant.determinism as det

    real = det.run_determinism

    def broken(*args, **kwargs):
        result = real(*args, **kwargs)
        result["regimes"]["pow2"]["identical"] -= 1
        result["ok"] = False
        return result

    monkeypatch.setattr(det, "run_determinism", broken)
    res = runner.invoke(app, ["determinism", "--backends", "reference", "--prompts", "1", "--new-tokens", "2"])
    assert res.exit_code == 1, res.output


@pytest.mark.parametrize(
    "args, word",
    [
        (["--backends", "reference-triton-order"], "two comma-separated"),
        (["--backends", "cutlass,triton", "--device", "cpu"], "GPU"),
        (["--backends", "reference", "--device", "cuda:0"], "CUDA"),
        (["--prompts", "17"], "--prompts"),
        (["--new-tokens", "0"], "--new-tokens"),
        (["/nonexistent/checkpoint"], "nonexistent"),
        (
            ["--backends", "reference", "--prompts", "1", "--new-tokens", "1", "--act-backend", "nope"],
            "unknown quantize_activations backend 'nope'",
        ),
    ],
)
def test_usage_errors_are_one_line(args, word):
    if "cuda:0" in args and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    res = runner.invoke(app, ["determinism"] + args)
    assert res.exit_code == 2 and word in res.output and "Traceback" not in res.output


def test_json_ties_the_generations_to_the_bytes_and_the_code(tmp_path):
    """manifest_digest, tool_version and git_commit, as the audit records them. References:
    the manifest digest by hand (tests/digests.py: hashlib over the files), the sha256 of the
    stored SHA256SUMS by hashlib, requant.evidence.buildinfo.build_info() for the code. A SHA256SUMS
    that does not match the files is a checkpoint error before any decoding (exit 2)."""
    from requant.evidence import manifest as mf
    from requant.evidence.buildinfo import build_info
    from tests.digests import manifest_digest_by_hand

    src = write_walk_checkpoint(tmp_path / "walk")
    args = ["--backends", "reference", "--prompts", "1", "--new-tokens", "2", "--json", str(tmp_path / "det.json")]
    res = runner.invoke(app, ["determinism", str(src), *args])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "det.json").read_text())
    assert data["manifest"] is None and data["manifest_digest"] == manifest_digest_by_hand(
        src
    )  # no SHA256SUMS: computed
    assert {k: data[k] for k in ("tool_version", "git_commit")} == build_info()
    assert f"checkpoint manifest digest: `{data['manifest_digest']}`" in res.stdout
    mf.write(src)
    res = runner.invoke(app, ["determinism", str(src), *args])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "det.json").read_text())
    assert data["manifest"] == "SHA256SUMS"
    assert data["manifest_digest"] == "sha256:" + hashlib.sha256((src / "SHA256SUMS").read_bytes()).hexdigest()
    (src / "config.json").write_bytes((src / "config.json").read_bytes() + b"\n")
    res = runner.invoke(app, ["determinism", str(src), *args])
    assert res.exit_code == 2 and "config.json differs" in res.output and "Traceback" not in res.output
    assert "determinism of" not in res.output  # nothing ran
