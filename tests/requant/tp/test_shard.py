"""requant/tp/shard.py: which rank holds what.

References: Qwen3's grouped-query rule (query head h reads KV head h // (H / KV)) for the
head placement, and the unsharded tensors themselves (reassembled from the shards by
concatenation) for the weight slicing.
"""

import pytest
import torch

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint import open_checkpoint
from requant.models.qwen3 import Qwen3Arch
from requant.runtime import arch_from_config, load_dense, load_linears
from requant.tp import check_degree, plan, shard
from requant.tp.shard import as_dense


@pytest.fixture(scope="module")
def model():
    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    return arch_from_config(ckpt.config), load_dense(ckpt, "cpu"), load_linears(ckpt, "native", "cpu")


def _arch(heads, kv, inter=64, vocab=64):
    return Qwen3Arch(
        hidden=32, intermediate=inter, layers=1, heads=heads, kv_heads=kv, head_dim=8, vocab=vocab, tie=False
    )


@pytest.mark.parametrize("heads,kv,tp", [(4, 2, 1), (4, 2, 2), (4, 2, 4), (8, 8, 4), (8, 2, 8), (16, 4, 2), (6, 3, 6)])
def test_every_query_head_finds_its_kv_head(heads, kv, tp):
    arch = _arch(heads, kv, inter=12 * tp, vocab=12 * tp)
    held = []
    for r in range(tp):
        p = plan(arch, tp, r)
        held += range(*p.heads)
        for h in range(*p.heads):
            assert p.kv_heads[0] <= h // (heads // kv) < p.kv_heads[1]
        assert p.local_heads == heads // tp and p.local_kv_heads == max(kv // tp, 1)
        assert p.local_heads % p.local_kv_heads == 0  # attention's group size on the rank
    assert held == list(range(heads))  # each query head on exactly one rank, in order


@pytest.mark.parametrize(
    "heads,kv,tp,what",
    [
        (4, 2, 3, "does not divide"),
        (4, 2, 8, "does not divide"),
        (12, 3, 2, "neither divides num_key_value_heads 3"),
        (4, 2, 0, "positive integer"),
    ],
)
def test_degrees_that_do_not_fit_are_refused(heads, kv, tp, what):
    with pytest.raises(ValueError, match=what):
        check_degree(_arch(heads, kv, inter=48, vocab=48), tp)


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_reassemble_the_model(model, tp):
    arch, dense, linears = model
    before = {k: v.clone() for k, v in dense.items()}
    parts = [shard(dense, linears, arch, plan(arch, tp, r)) for r in range(tp)]
    for k, v in dense.items():
        assert torch.equal(v, before[k])  # inputs untouched
    step = max(arch.kv_heads // tp, 1)
    for name, (w, s_w) in linears.items():
        ws = [lin[name][0] for _, lin in parts]
        ss = [lin[name][1] for _, lin in parts]
        if name.endswith(("o_proj", "down_proj")):
            assert torch.equal(torch.cat(ws, dim=1), w)
            assert all(torch.equal(s, s_w) for s in ss)
        elif name.endswith(("k_proj", "v_proj")) and tp > arch.kv_heads:
            # replicated KV heads: keep one rank of each group of tp / KV ranks
            keep = list(range(0, tp, tp // arch.kv_heads))
            assert torch.equal(torch.cat([ws[r] for r in keep]), w) and step == 1
            assert torch.equal(torch.cat([ss[r] for r in keep]), s_w)
        else:
            assert torch.equal(torch.cat(ws), w) and torch.equal(torch.cat(ss), s_w)
    assert torch.equal(torch.cat([d["lm_head.weight"] for d, _ in parts]), dense["lm_head.weight"])
    for k in dense:
        if k != "lm_head.weight":
            assert all(d[k] is dense[k] for d, _ in parts)  # replicated, shared


def test_as_dense_dequantizes_without_touching_the_inputs(model):
    _, dense, linears = model
    name = "model.layers.0.mlp.down_proj"
    d, lin = as_dense(dense, linears, (name,))
    w, s_w = linears[name]
    assert name in linears and name not in lin and name + ".weight" not in dense
    # reference: w * s_w in float64, rounded once to bf16 (s_w is a bf16 scale, so the fp32 product is exact too)
    assert torch.equal(d[name + ".weight"], (w.double() * s_w.double()).to(torch.bfloat16))
    with pytest.raises(KeyError, match="not a quantized Linear"):
        as_dense(dense, linears, ("lm_head",))
