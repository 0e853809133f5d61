"""audit/capture.py: the prompts it re-exports and the capture hook.
References: the literal prompt tuple of requant/models/prompts.py; concatenation by hand."""

import pytest
import torch

from requant.audit.capture import CALIBRATION_PROMPTS, Capture, prompts
from requant.models.prompts import CALIBRATION_PROMPTS as SHARED


def test_prompts_are_a_prefix_of_the_fixed_set():
    assert CALIBRATION_PROMPTS is SHARED
    assert prompts(3) == list(CALIBRATION_PROMPTS[:3])
    assert len(set(CALIBRATION_PROMPTS)) == len(CALIBRATION_PROMPTS) == 16
    assert prompts(len(CALIBRATION_PROMPTS)) == list(CALIBRATION_PROMPTS)
    for bad in (0, len(CALIBRATION_PROMPTS) + 1):
        with pytest.raises(ValueError, match="--prompts"):
            prompts(bad)


def test_capture_concatenates_parts_per_shared_input():
    cap = Capture()
    a1, a2 = torch.ones(2, 3, dtype=torch.int8), torch.full((1, 3), -2, dtype=torch.int8)
    s1, s2 = torch.full((2, 1), 0.5), torch.full((1, 1), 0.25)
    cap.record(("q", "k"), a1, s1)
    cap.record(("q", "k"), a2, s2)
    ops = cap.operands()
    assert ops["q"] is ops["k"]
    assert ops["q"].a.tolist() == [[1, 1, 1], [1, 1, 1], [-2, -2, -2]]
    assert ops["q"].s_a.reshape(-1).tolist() == [0.5, 0.5, 0.25]
