"""audit/phases/prefill.py's report section, from the shared default audit (tests/audit/conftest.py).
References: the per-layer rows of the result counted here, and the sentences the scorecard section
must carry, read back from the rendered Markdown."""

import torch

from requant.audit.phases.prefill import prefill_markdown
from requant.regime import REGIMES


def test_per_layer_tables_count_the_rows(default_audit):
    lines = prefill_markdown(default_audit)
    rows = default_audit["per_layer"]
    for r in REGIMES:
        mine = [x for x in rows if x["regime"] == r]
        equal = sum(x["bitwise_equal"] for x in mine)
        line = next(x for x in lines if x.startswith(f"| {r} | "))
        assert line.split(" | ")[1] == f"{equal}/{len(mine)}", line
    differing = [x for x in rows if not x["bitwise_equal"]]
    start = lines.index("Layers that differ:") + 4 if differing else None
    listed = lines[start : start + len(differing)] if differing else []
    assert listed == [f"| {x['name']} | {x['regime']} | {x['mismatches']} | {x['max_ulp']} |" for x in differing]
    if differing:
        assert lines[start + len(differing)] == ""  # nothing else in that table


def test_report_says_what_the_scorecard_proves(default_audit):
    """The Markdown states, next to the scorecard, that the faults are injected into
    emulations and that C1-C4 cannot fire on the real pair (reference: the sentence's
    required content, read back from the rendered Markdown)."""
    md = "\n".join(prefill_markdown(default_audit))
    section = md[md.index("## Scorecard against the prediction matrix") : md.index("## Detection")]
    for needle in (
        "injected into emulations",
        "not into CUTLASS or Triton",
        "C1 to C4 cannot fire on a real kernel run",
        "C1 and C2 hash the very operands",
        "C3 reads a declared accumulator descriptor",
        "C4 needs an accumulator",
        "not a claim about CUTLASS or Triton",
    ):
        assert needle in section, needle
    assert all(f"`{b}`" in section for b in default_audit["backends"])


def test_all_pow2_count_equals_one_check_per_tensor():
    """prefill._all_pow2_count (one pass over every Linear's scales) against is_power_of_two(s).all()
    per tensor, on seeded lists: pow2 and not, zeros, negatives, inf, NaN, subnormals, sizes 0 to 9."""
    from requant.audit.phases.prefill import _all_pow2_count
    from requant.kernels.bf16 import is_power_of_two

    g = torch.Generator().manual_seed(41)
    specials = torch.tensor([0.0, -0.25, float("inf"), float("nan"), 2.0**-140, 3.0 * 2.0**-140, 1.5])
    for trial in range(30):
        scales = []
        for _ in range(int(torch.randint(0, 7, (1,), generator=g))):
            n = int(torch.randint(0, 10, (1,), generator=g))
            s = torch.pow(2.0, torch.randint(-20, 3, (n, 1), generator=g).to(torch.float32))
            if n and torch.rand(1, generator=g) < 0.5:  # one element not a power of two
                s[int(torch.randint(0, n, (1,), generator=g))] = specials[int(torch.randint(0, 7, (1,), generator=g))]
            scales.append(s)
        want = sum(bool(is_power_of_two(s).all()) for s in scales)
        assert _all_pow2_count(scales) == want, trial
