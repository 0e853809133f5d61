"""Tensor parallelism that cannot change a bit: W8A8 Qwen3 sharded over torch.distributed,
with the row-parallel Linears' int32 accumulators all-reduced before the epilogue.

    from requant.tp import LaunchConfig, Spec, compare, run
    r = LaunchConfig("reference-triton-order", regime="native", reduce="int32")
    res = run(Spec(ckpt_dir, prompts=ids, degrees=(1, 2, 4), runs=(r,)))
    compare(res[(r, 1)], res[(r, 4)])["identical"]      # True
    # `requant tp-check [CKPT] --tp 1,2,4 --backend NAME` is this, from the command line

Modules: shard.py (which rank holds what; the weight slicing), engine.py (one rank's
forward: the runtime's reference engine with column- and row-parallel Linears), launch.py (spawned
processes: gloo on the CPU, NCCL on GPUs), compare.py (bitwise comparison with TP 1).
The int32 accumulator / epilogue split is kernels/epilogue.py (requant.kernels.epilogue).
Imports runtime, kernels/, models, checkpoint and io; never the audit nor the commands.

With reduce="int32" every TP degree gives the TP-1 bits; reduce="bf16" is the usual scheme. Why, and
what is only measured: docs/tensor-parallel.md (Numerics); what has run where: docs/tensor-parallel.md#measured.
"""

from requant.tp.compare import compare
from requant.tp.engine import REDUCES, Comm, ShardedModel
from requant.tp.launch import LaunchConfig, Result, Spec, run
from requant.tp.shard import Plan, check_degree, plan, shard

__all__ = [
    "REDUCES",
    "Comm",
    "Plan",
    "Result",
    "LaunchConfig",
    "ShardedModel",
    "Spec",
    "check_degree",
    "compare",
    "plan",
    "run",
    "shard",
]
