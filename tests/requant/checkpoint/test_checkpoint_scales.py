"""A subnormal weight scale (1e-40 in bf16) is refused at read, naming the file, the tensor and
the output channel, before convert, inspect or the audit use it; the smallest normal value is
accepted. Reference: torch.finfo(dtype).tiny, the dtype's smallest normal number."""

import pytest
import torch
from typer.testing import CliRunner

from requant.checkpoint import check_scale_values, open_checkpoint
from requant.cli import app
from requant.convert import convert
from requant.errors import TensorError
from tests.requant.checkpoint.test_checkpoint import LIN, _set_scale
from tests.requant.conftest import leftovers, tree_bytes

runner = CliRunner()


def test_a_subnormal_scale_is_refused_naming_file_tensor_and_channel(tmp_path, micro):
    _set_scale(micro, 1e-40)
    assert 0 < float(torch.tensor(1e-40, dtype=torch.bfloat16)) < torch.finfo(torch.bfloat16).tiny  # stored subnormal
    before = tree_bytes(micro)
    with pytest.raises(TensorError) as exc:
        open_checkpoint(micro)
    msg = str(exc.value)
    assert "model.safetensors" in msg and LIN + ".weight_scale" in msg and "subnormal scale" in msg
    assert "output channel 3" in msg and "smallest normal" in msg
    with pytest.raises(TensorError, match="subnormal"):
        convert(micro, tmp_path / "out", "nearest")
    assert leftovers(tmp_path, "out") == [] and tree_bytes(micro) == before
    for args in (["inspect", str(micro)], ["audit", str(micro), "--backends", "reference", "--prompts", "1"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "subnormal scale" in res.stderr


def test_the_smallest_normal_scale_is_accepted(micro):
    _set_scale(micro, torch.finfo(torch.bfloat16).tiny)
    open_checkpoint(micro)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_subnormal_is_judged_in_the_stored_dtype(dtype):
    tiny = torch.finfo(dtype).tiny
    check_scale_values("f", "t", torch.tensor([[1.0], [tiny]], dtype=dtype))
    with pytest.raises(TensorError, match="subnormal scale .* at output channel 1"):
        check_scale_values("f", "t", torch.tensor([[1.0], [tiny / 4]], dtype=dtype))
