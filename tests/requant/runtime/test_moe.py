"""The Qwen3-MoE reference engine (requant/runtime/moe.py) on the CPU.

References, each independent of the code under test:
  * the router restated in numpy float32 from docs/moe.md (pairwise tree sums written as a
    loop, the max, the division, the tie rule as a Python sort key (-p, id), the normalisation);
    the one primitive both share is the elementwise exp (torch.exp on the restated values);
  * alone against batched, and one emulated epilogue order against the other under pow2:
    torch.equal on the fp32 logits (bit for bit), the batched run the reference of the alone run;
  * `requant replay` of records that `requant generate` wrote (its own bit-for-bit check).
"""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from requant.checkpoint.synthetic import generate
from requant.kernels.fused_moe import VLLM_MOE
from requant.runtime import load_model
from requant.runtime.moe import route, router_logits
from tests.requant.commands.cli import invoke, refused
from tests.requant.conftest import load_all


def _tree(v: np.ndarray) -> np.float32:
    """Pairwise halves of a float32 vector zero-padded to a power of two (docs/moe.md)."""
    n = 1 << max(len(v) - 1, 0).bit_length()
    v = np.concatenate([v, np.zeros(n - len(v), np.float32)]).astype(np.float32)
    while len(v) > 1:
        v = (v[: len(v) // 2] + v[len(v) // 2 :]).astype(np.float32)
    return np.float32(v[0])


def restated_route(x: torch.Tensor, w: torch.Tensor, k: int, norm: bool):
    xs, ws = x.float().numpy(), w.float().numpy()
    ids, weights = [], []
    for row in xs:
        logits = np.array([_tree((row * we).astype(np.float32)) for we in ws], np.float32)
        shifted = (logits - logits.max()).astype(np.float32)
        e = torch.exp(torch.from_numpy(shifted)).numpy()
        p = (e / _tree(e)).astype(np.float32)
        order = sorted(range(len(p)), key=lambda j: (-p[j], j))[:k]
        top = np.array([p[j] for j in order], np.float32)
        if norm:
            top = (top / _tree(top)).astype(np.float32)
        ids.append(order)
        weights.append(top)
    return torch.tensor(ids, dtype=torch.long), torch.from_numpy(np.stack(weights))


@st.composite
def router_cases(draw):
    t, e, h = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(1, 40))
    k = draw(st.integers(1, e))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    w = (torch.randn(e, h, generator=g) * draw(st.sampled_from([0.02, 1.0, 30.0]))).to(torch.bfloat16)
    kind = draw(st.sampled_from(["random", "tied experts", "zero input", "one token repeated"]))
    if kind == "tied experts" and e > 1:  # equal logits: ties go to the lowest expert id
        w[e - 1] = w[0]
        w[e // 2] = w[0]
    elif kind == "zero input":
        x[0] = 0
    elif kind == "one token repeated":
        x[:] = x[0].clone()
    return x, w, k, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(router_cases())
def test_router_is_the_specified_arithmetic(case):
    x, w, k, norm = case
    ids, weights = route(x, w, k, norm)
    want_ids, want_w = restated_route(x, w, k, norm)
    assert torch.equal(ids, want_ids)
    assert torch.equal(weights.view(torch.int32), want_w.view(torch.int32))


@settings(max_examples=40, deadline=None)
@given(router_cases())
def test_router_alone_equals_batched(case):
    x, w, k, norm = case
    ids, weights = route(x, w, k, norm)
    assert torch.equal(router_logits(x, w, chunk=1), router_logits(x, w))
    for j in range(x.shape[0]):
        i1, w1 = route(x[j : j + 1], w, k, norm)
        assert torch.equal(i1[0], ids[j]) and torch.equal(w1[0].view(torch.int32), weights[j].view(torch.int32))


def test_ties_go_to_the_lowest_expert():
    """All-zero input: every logit 0, every probability 1/E: the experts 0..k-1, weights 1/k."""
    ids, weights = route(torch.zeros(3, 16, dtype=torch.bfloat16), torch.ones(8, 16, dtype=torch.bfloat16), 3, True)
    assert ids.tolist() == [[0, 1, 2]] * 3
    assert torch.equal(weights, torch.full((3, 3), 1 / 3))  # (1/8) / (3/8), the tree in fp32


PROMPTS = [[256, 72, 101, 108, 108, 111], [84, 104, 101], [97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107]]


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return generate("tiny-moe", tmp_path_factory.mktemp("moe") / "m", seed=2)


@pytest.mark.parametrize(
    "regime, top_k, norm, backend",
    # the preset (top 2, normalised), every expert for every token, one expert, unnormalised; vLLM's
    # fused-MoE arithmetic with moe_sum's bf16 fold (top 2) and its fp32 sum (top 8)
    [
        ("native", 2, True, "reference-triton-order"),
        ("pow2", 2, True, "reference-triton-order"),
        ("pow2", 8, False, "reference-triton-order"),
        ("native", 1, False, "reference-triton-order"),
        ("native", 2, True, VLLM_MOE),
        ("pow2", 8, False, VLLM_MOE),
    ],
)
def test_prefill_and_decode_alone_equal_batched(tiny_moe, tmp_path, regime, top_k, norm, backend):
    import json
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(tiny_moe, ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(num_experts_per_tok=top_k, norm_topk_prob=norm)
    (ck / "config.json").write_text(json.dumps(cfg))
    m = load_model(ck, regime=regime, backend=backend)
    batched = m.logits(PROMPTS)
    for p, b in zip(PROMPTS, batched):
        assert torch.equal(m.logits([p])[0], b)
    g = m.generate(PROMPTS, 5, keep_logits=True)
    for i, p in enumerate(PROMPTS):
        a = m.generate([p], 5, keep_logits=True)
        assert a.ids[0] == g.ids[i]
        for s in range(5):
            assert torch.equal(a.step_logits[s][0], g.step_logits[s][i])


def test_pow2_cutlass_order_equals_triton_order(tiny_moe):
    t = load_model(tiny_moe, regime="pow2", backend="reference-triton-order")
    c = t.with_backends(backend="reference-cutlass-order")
    for a, b in zip(t.logits(PROMPTS), c.logits(PROMPTS)):
        assert torch.equal(a, b)
    gt, gc = t.generate(PROMPTS, 6, keep_logits=True), c.generate(PROMPTS, 6, keep_logits=True)
    assert gt.ids == gc.ids and all(torch.equal(a, b) for a, b in zip(gt.step_logits, gc.step_logits))


def test_vllm_moe_backend_runs_vllms_combine(tiny_moe):
    """Under pow2 the plain orders agree (above), but reference-vllm-moe-order's sparse block is
    vLLM's arithmetic (kernels/fused_moe.py): its logits differ, while the dense layer 0, whose
    GEMMs are the Triton order, gives the same operands to layer 1's attention."""
    t = load_model(tiny_moe, regime="pow2", backend="reference-triton-order")
    v = t.with_backends(backend=VLLM_MOE)
    rt, rv = Recorder(keep=True), Recorder(keep=True)
    lt, lv = t.logits(PROMPTS, capture=rt), v.logits(PROMPTS, capture=rv)
    assert not all(torch.equal(a, b) for a, b in zip(lt, lv))
    q = "model.layers.1.self_attn.q_proj"
    assert torch.equal(rt.ops[q][0], rv.ops[q][0]) and torch.equal(rt.ops[q][1], rv.ops[q][1])


class Recorder:
    def __init__(self, keep: bool = False):
        self.rows, self.ops, self.keep = {}, {}, keep

    def record(self, names, q, s):
        for n in names:
            self.rows[n] = self.rows.get(n, 0) + q.shape[0]
            if self.keep:
                self.ops[n] = (q, s)


def test_capture_records_each_expert_with_its_tokens(tiny_moe):
    """Every token goes to exactly top_k experts: the expert gate_proj rows sum to tokens x 2, the
    down_proj rows equal the gate_proj rows, and the dense layer 0 and attention see every token."""
    m = load_model(tiny_moe)
    rec = Recorder()
    m.logits(PROMPTS, capture=rec)
    tokens = sum(map(len, PROMPTS))
    gate = {n: r for n, r in rec.rows.items() if ".experts." in n and n.endswith("gate_proj")}
    assert sum(gate.values()) == tokens * 2 and all(r > 0 for r in gate.values())
    for n, r in gate.items():
        assert rec.rows[n.replace("gate_proj", "down_proj")] == r == rec.rows[n.replace("gate_proj", "up_proj")]
    assert rec.rows["model.layers.0.mlp.gate_proj"] == rec.rows["model.layers.1.self_attn.q_proj"] == tokens
    assert "model.layers.1.mlp.gate" not in rec.rows  # the router runs in fp32, unquantized


def test_portable_engine_refuses_moe(tiny_moe):
    """The fast engine runs the experts (test_fast_moe.py); the portable engine refuses them by name."""
    with pytest.raises(ValueError, match="portable engine cannot run this model: a Qwen3-MoE model"):
        load_model(tiny_moe, engine="portable")


def test_generate_and_replay_records(tiny_moe, tmp_path):
    rec = tmp_path / "gen.jsonl"
    res = invoke("generate", tiny_moe, "--prompt", "experts", "--prompt", "a router", "--max-new-tokens", 4, "--no-eos", "--regime", "pow2", "--json", rec)  # fmt: skip
    assert res.exit_code == 0, res.output
    res = invoke("replay", rec, "--backend", "reference-cutlass-order")
    assert res.exit_code == 0 and "2/2 records match bit for bit" in res.output, res.output


def test_tensor_parallelism_refuses_moe(tiny_moe):
    refused(invoke("tp-check", tiny_moe), "tensor parallelism runs dense Qwen3 only, not a Qwen3-MoE model")


def test_eval_source_check_knows_the_experts(tmp_path):
    """`requant eval --source`: the bf16 originals of an MoE checkpoint pass; one expert missing is named."""
    import json

    from requant.errors import UsageError
    from requant.eval.run import check_source

    q = generate("tiny-moe", tmp_path / "q", seed=1, keep_source=tmp_path / "src")
    config = json.loads((q / "config.json").read_text())
    check_source(tmp_path / "src", config)
    t = load_all(tmp_path / "src" / "model.safetensors")
    del t["model.layers.1.mlp.experts.3.down_proj.weight"]
    save_file(t, str(tmp_path / "src" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UsageError, match="no tensor 'model.layers.1.mlp.experts.3.down_proj.weight'"):
        check_source(tmp_path / "src", config)


def test_determinism_command(tiny_moe, tmp_path):
    """`requant determinism` on the MoE checkpoint: under pow2 every prompt's greedy tokens are the
    same bits with both emulated orders, and the batch-invariance check holds (its own comparison)."""
    import json

    res = invoke("determinism", tiny_moe, "--prompts", 2, "--new-tokens", 4, "--json", tmp_path / "d.json")
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "d.json").read_text())
    assert out["regimes"]["pow2"]["identical"] == out["regimes"]["pow2"]["total"] == 2
    assert out["batch_invariant"] is True and out["ok"] is True


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 12), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_combine_visits_experts_as_the_nonzero_definition(tokens, k, seed):
    """combine (runtime/moe.py) calls each routed expert once, in ascending id, with its (row, slot)
    positions in ascending row order: the same tensors as the definition (ids == e).nonzero(), drawn
    over token counts (none too), top-k widths and id sets that leave experts unused."""
    from requant.runtime.moe import combine

    g = torch.Generator().manual_seed(seed)
    experts = k + int(torch.randint(0, 6, (), generator=g))
    ids = (
        torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        if tokens
        else torch.zeros(0, k, dtype=torch.long)
    )
    weights = torch.rand(tokens, k, generator=g)
    seen = []

    def expert(e, rows, slots):
        seen.append((e, rows.tolist(), slots.tolist()))
        return torch.full((len(rows), 3), float(e + 1), dtype=torch.bfloat16)

    out = combine(ids, weights, 3, expert)
    want = []
    for e in torch.unique(ids).tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        want.append((e, rows.tolist(), slots.tolist()))
    assert seen == want
    ref = torch.zeros(tokens, 3)
    for e, rows, slots in want:  # fp32, ascending expert id, rounded once
        ref[rows] += float(e + 1) * weights[rows, slots][:, None]
    assert torch.equal(out.view(torch.int16), ref.to(torch.bfloat16).view(torch.int16))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 40), st.integers(1, 8), st.integers(0, 9), st.integers(1, 16), st.integers(0, 2**31 - 1))
def test_combine_routed_is_combine_bit_for_bit(tokens, k, spare, hidden, seed):
    """combine_routed (the sparse block's combine: a gather and k adds) against combine, the
    per-expert loop that defines the bits, drawn over token counts (none too), top-k widths, unused
    experts, chunk boundaries (COMBINE_CHUNK lowered) and outputs with -0.0, infinities, NaN,
    subnormals and values whose sums round."""
    from requant.runtime import moe

    g = torch.Generator().manual_seed(seed)
    experts = k + spare
    ids = (
        torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        if tokens
        else torch.zeros(0, k, dtype=torch.long)
    )
    weights = torch.rand(tokens, k, generator=g)
    weights[torch.rand(tokens, k, generator=g) < 0.1] = 0.0
    routes = moe.expert_rows(ids)
    n = tokens * k
    y = (torch.randn(n, hidden, generator=g) * torch.exp2(torch.randint(-130, 40, (n, hidden), generator=g))).to(
        torch.bfloat16
    )
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40], dtype=torch.bfloat16)
    pick = torch.rand(n, hidden, generator=g) < 0.05
    y[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=g)]
    at = dict(zip((e for e, _, _ in routes), itertools.accumulate((len(r) for _, r, _ in routes), initial=0)))
    want = moe.combine(ids, weights, hidden, lambda e, rows, slots: y[at[e] : at[e] + len(rows)], routes)
    old = moe.COMBINE_CHUNK
    moe.COMBINE_CHUNK = 1 + seed % 7
    try:
        got = moe.combine_routed(ids, weights, y, moe._route_order(ids) if seed % 2 else None)  # given or sorted here
    finally:
        moe.COMBINE_CHUNK = old
    assert got.shape == want.shape and torch.equal(got.view(torch.int16), want.view(torch.int16))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 24), st.integers(1, 96), st.integers(0, 2**31 - 1))
def test_quantizing_the_layer_once_gives_each_experts_rows_alone(tokens, hidden, seed):
    """The MoE block quantizes a layer's tokens once and hands each expert its rows: the same bits
    as quantizing those rows alone (kernels.quantize_activations per token), drawn over widths,
    zero rows, tiny rows (below the 2**-64 rescale) and row subsets."""
    from requant import kernels

    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(tokens, hidden, generator=g) * torch.exp2(torch.randint(-80, 20, (tokens, 1), generator=g))).to(
        torch.bfloat16
    )
    h[torch.rand(tokens, generator=g) < 0.15] = 0
    q, s = kernels.quantize_activations(h)
    for _ in range(4):
        rows = torch.nonzero(torch.rand(tokens, generator=g) < 0.5).reshape(-1)
        qa, sa = kernels.quantize_activations(h[rows])
        assert torch.equal(q[rows], qa) and torch.equal(s[rows].view(torch.int32), sa.view(torch.int32))


class _Records:
    """A capture: every record(names, q, s) kept in call order."""

    def __init__(self):
        self.calls = []

    def record(self, names, q, s):
        self.calls.append((tuple(names), q, s))


def _one_expert_at_a_time(m, i, h):
    """The definition, written apart from runtime/moe.py: each routed expert in ascending id
    ((ids == e).nonzero()) quantizes its own rows, runs gate/up, bf16(silu(gate) * up), quantizes that
    and runs down, one call each; acc += fp32(y) * w per token, rounded once. (output, {Linear:
    (q, s)} the operands each call got)."""
    from requant import kernels

    a, p = m.arch, f"model.layers.{i}.mlp."
    ids, w = route(h, m.dense[p + "gate.weight"], a.top_k, a.norm_topk_prob)
    acc = torch.zeros(h.shape[0], h.shape[1], dtype=torch.float32)
    ops = {}

    def gemm(name, q, s):
        ops[name] = (q, s)
        wt, s_w = m.linears[name]
        return kernels.scaled_mm(q, wt, s, s_w, backend=m.backend)

    for e in torch.unique(ids).tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        ex = f"{p}experts.{e}."
        q, s = kernels.quantize_activations(h[rows])
        gate, up = gemm(ex + "gate_proj", q, s), gemm(ex + "up_proj", q, s)
        act = (torch.nn.functional.silu(gate.float()) * up.float()).to(torch.bfloat16)
        y = gemm(ex + "down_proj", *kernels.quantize_activations(act))
        acc[rows] += y.float() * w[rows, slots][:, None]
    return acc.to(torch.bfloat16), ops


@pytest.mark.parametrize("seed", range(12))
def test_sparse_block_equals_one_expert_at_a_time(tiny_moe, seed):
    """The block (one quantization of the layer's tokens for every gate/up, one of every expert's
    down input, then the down GEMMs and the combine per expert) against the definition above, bit for
    bit, output and every Linear's captured operands; cases drawn from a seeded space: tokens 0 to 40
    (none too), rows zero, tiny (below the quantizer's 2**-64 rescale) or large, top 1, 2 or all 8
    (every expert, some without tokens), both regimes, both epilogue orders."""
    import dataclasses
    import random

    from requant.runtime.moe import sparse_block

    r = random.Random(seed)
    regime, backend = r.choice(["native", "pow2"]), r.choice(["reference-triton-order", "reference-cutlass-order"])
    m = load_model(tiny_moe, regime=regime, backend=backend, engine="reference")
    m.arch = dataclasses.replace(m.arch, top_k=[1, 2, 8][seed % 3], norm_topk_prob=r.random() < 0.5)
    tokens = [0, 1, 3, 17, 40][seed % 5]
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-80, 8, (tokens, 1), generator=g).float())
    h = (torch.randn(tokens, m.arch.hidden, generator=g) * scale).to(torch.bfloat16)
    h[torch.rand(tokens, generator=g) < 0.1] = 0
    rec = _Records()
    got = sparse_block(m.impl, 1, h, rec)
    want, ops = _one_expert_at_a_time(m, 1, h)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (seed, regime, backend, tokens)
    seen = {}
    for names, q, s in rec.calls:
        for n in names:
            assert n not in seen, n  # each expert Linear called once
            seen[n] = (q, s)
    assert set(seen) == set(ops)
    for n, (q, s) in ops.items():
        assert torch.equal(seen[n][0], q) and torch.equal(seen[n][1].view(torch.int32), s.view(torch.int32)), n
