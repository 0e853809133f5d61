"""requant/regime.py: the regime names are checked by one function, and the pow2 build (the device
path, run here on CPU tensors) is byte-identical to the converter's numpy build
(requant.scales.arms.requantize(q, s, "nearest"), property-tested against exact rationals in
tests/requant/scales/test_arms.py), on every Linear of the embedded default and on seeded cases
with degenerate rows; load_linears' pow2 regime is that build."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint import open_checkpoint
from requant.errors import UsageError
from requant.regime import REGIMES, check_regime, pow2_weights
from requant.runtime import load_linears
from requant.scales.arms import requantize


def _same(got, want) -> None:
    (gq, gs), (wq, ws) = got, want
    assert gq.dtype == wq.dtype == torch.int8 and torch.equal(gq, wq)
    assert gs.dtype == ws.dtype and torch.equal(gs.reshape(-1).view(torch.int8), ws.reshape(-1).view(torch.int8))


def test_the_names_and_their_one_check():
    assert REGIMES == ("native", "pow2")
    for r in REGIMES:
        assert check_regime(r) == r == check_regime(r, "--regime")


@given(st.text(max_size=8).filter(lambda s: s not in REGIMES))
def test_any_other_name_is_refused_naming_the_option(name):
    with pytest.raises(UsageError) as cli:
        check_regime(name, "--regime")
    assert str(cli.value) == f"--regime must be one of native, pow2, got {name!r}"
    with pytest.raises(ValueError) as api:
        check_regime(name)
    assert str(api.value) == f"unknown regime {name!r}; known: native, pow2"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(4))
def test_pow2_build_equals_the_converter_on_seeded_cases(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    rows, cols = [(1, 1), (5, 3), (64, 96), (17, 256)][seed]
    q = torch.randint(-128, 128, (rows, cols), generator=g).to(torch.int8)
    lo, hi = (-20, 4) if dtype == torch.float16 else (-40, 10)
    s = torch.exp2(torch.empty(rows, 1).uniform_(lo, hi, generator=g).to(torch.float64))
    q[0] = 127 if seed % 2 else -128  # a saturated row
    s[0] = 2.0**-7 * (1.41 if seed % 2 else 1.0)  # clips under nearest / a power of two already
    if rows > 1:
        q[1] = 0  # an all-zero row
    _same(pow2_weights(q, s.to(dtype)), requantize(q, s.to(dtype), "nearest"))


def test_pow2_build_equals_the_converter_on_the_embedded_default():
    ckpt = open_checkpoint(DEFAULT_CHECKPOINT)
    loaded = load_linears(ckpt, "pow2", "cpu")
    for n in ckpt.quantized_linears:
        q, s = ckpt.weight_and_scale(n)
        want = requantize(q, s, "nearest")
        _same(pow2_weights(q, s), want)
        assert torch.equal(loaded[n][0], want[0])
        assert torch.equal(loaded[n][1].view(torch.int32), want[1].to(torch.float32).reshape(-1, 1).view(torch.int32))


def test_load_linears_refuses_another_regime():
    with pytest.raises(ValueError, match="unknown regime 'bf16'"):
        load_linears(open_checkpoint(DEFAULT_CHECKPOINT), "bf16", "cpu")
