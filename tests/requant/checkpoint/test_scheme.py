"""requant.checkpoint.scheme.validate field by field, on the embedded default's config.json (a
W8A8 compressed-tensors config as llm-compressor writes it) and on single-field edits of it. Reference
for each refusal: the module's contract, that the message names the offending field by its path in
config.json. (The scheme refusals of whole checkpoints, through open_checkpoint and the CLI, are in
test_checkpoint.py.)"""

import copy
import json

import pytest

from requant import DEFAULT_CHECKPOINT
from requant.checkpoint.scheme import validate
from requant.errors import SchemeError

BASE = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())
G = "quantization_config.config_groups.group_0"


def _edit(fn):
    cfg = copy.deepcopy(BASE)
    fn(cfg["quantization_config"])
    return cfg


def test_the_default_is_accepted_with_its_ignore_list():
    assert validate(BASE).ignore == tuple(BASE["quantization_config"]["ignore"])
    assert validate(_edit(lambda q: q.update(ignore=None))).ignore == ()


CASES = {
    # JSON true is a Python int: the type is compared too
    "bool-bits": (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=True), f"{G}.weights.num_bits"),
    "group-size": (
        lambda q: q["config_groups"]["group_0"]["input_activations"].update(group_size=128),
        f"{G}.input_activations.group_size",
    ),
    "static-weights-dynamic": (
        lambda q: q["config_groups"]["group_0"]["weights"].update(dynamic=True),
        f"{G}.weights.dynamic",
    ),
    "output-activations": (
        lambda q: q["config_groups"]["group_0"].update(output_activations={"num_bits": 8}),
        f"{G}.output_activations",
    ),
    "targets": (lambda q: q["config_groups"]["group_0"].update(targets=[]), f"{G}.targets"),
    "status": (lambda q: q.update(quantization_status="frozen"), "quantization_config.quantization_status"),
    "sparsity": (lambda q: q.update(sparsity_config={"format": "sparse-24"}), "quantization_config.sparsity_config"),
    "ignore": (lambda q: q.update(ignore="lm_head"), "quantization_config.ignore"),
    "no-groups": (lambda q: q.update(config_groups={}), "quantization_config.config_groups"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_refusal_names_the_field(name):
    fn, field = CASES[name]
    with pytest.raises(SchemeError) as exc:
        validate(_edit(fn), file="cfg.json")
    assert field in str(exc.value) and "cfg.json" in str(exc.value)
