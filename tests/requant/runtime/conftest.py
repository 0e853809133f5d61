"""Fixtures of the runtime tests."""

import pytest


@pytest.fixture(scope="module")
def micro_fast(tmp_path_factory):
    """The MICRO synthetic (seed 1), pow2, on the fast engine: the Triton kernels under the
    interpreter (each module using it sets TRITON_INTERPRET=1 before importing Triton)."""
    from requant.checkpoint.synthetic import generate
    from requant.runtime import load_model
    from tests.requant.conftest import MICRO

    path = generate(MICRO, tmp_path_factory.mktemp("micro") / "micro", seed=1)
    return load_model(path, regime="pow2", engine="fast")
