"""One Qwen3 W8A8 runtime for the audit, the evaluation and `requant determinism`.

    from requant.runtime import load_model
    model = load_model(src, regime="native", backend="reference-triton-order",
                       act_backend="reference", device="cpu")
    model.logits([[ids...], [ids...]])          # fp32 [T_i, vocab] per prompt
    model.greedy([[ids...], ...], max_new_tokens=64, eos_id=None)   # new ids per prompt
    model.config, model.arch, model.max_length, model.tokenizer

Why our own and not transformers: every quantized Linear must go through requant.kernels
by name (CUTLASS, Triton or a reference emulation does the GEMM), the audit needs each
Linear's int8 operands, and determinism needs every other op to be batch-invariant. Plain
torch, device-agnostic (CPU and CUDA), no monkey-patching.

The forward (Qwen3, transformers' Qwen3ForCausalLM layout):
  embeddings -> L x [RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual]
  -> final RMSNorm -> lm_head
  attention: q/k/v projections, per-head RMSNorm on q and k, rotate-half RoPE
  (rope_theta, also read from transformers 5's rope_parameters), grouped-query attention,
  causal, o projection.
Prompts of different lengths are packed along the token axis: every Linear, norm and the
MLP act per token; attention runs per sequence (no mask across the batch).

NUMERICS. Activations (the residual stream, every Linear input and output) are bf16
between ops. Computed in fp32 and rounded to bf16 once: RMSNorm (then the weight product,
rounded again, as transformers does), RoPE (tables and rotation in fp32), the attention
scores, softmax (the probabilities are rounded to bf16 before P @ V, as in transformers'
bf16 model), P @ V, and SiLU(gate) * up. Residual adds are bf16 + bf16 (rounded once).
Why: bf16 storage is what a served W8A8 model holds between kernels (and what the GEMMs
consume and produce); doing each op's arithmetic in fp32 with a single rounding keeps the
runtime's own error at the level of transformers' bf16 model's (measured by the parity test), so
that what differs between two GEMM backends is the GEMM, not the glue around it.
Every quantized Linear is
    (q, s) = kernels.quantize_activations(x, backend=act_backend)   # per token, int8
    y      = kernels.scaled_mm(q, w, s, s_w, backend=backend)        # exact int32, bf16 out
with one quantization shared by the Linears that read the same input (q/k/v, gate/up).
A Linear the checkpoint does not quantize (usually lm_head; every Linear of a bf16
model) is bf16(fp32(x) @ fp32(W)^T): bf16 weights, fp32 products and accumulation, one
rounding. Logits are the bf16 result as fp32. Greedy decoding picks the lowest id among
equal maxima.
Where this differs from transformers' bf16 Qwen3 (so logits agree closely, not bitwise):
transformers applies RoPE in bf16 (cos/sin and both products rounded to bf16), runs the
score and P @ V matmuls with bf16 inputs and bf16 outputs, and its dense Linears are bf16
GEMMs; here those run in fp32 with one rounding. The parity test
(tests/requant/test_runtime_parity.py) measures the difference against an fp32
transformers model with the same (dequantized) weights and fake-quantized Linear inputs.
On the reference engine, decoding with the KV cache computes attention differently from
prefill (attend_decode's tree sums instead of matmuls), so a decoded token's logits may differ
from prefilling the whole sequence in the last bits; the fast engine (below) has one attention
for both, and there they are the same bits.

BATCH INVARIANCE (a sequence's tokens must not depend on what else is in the batch).
Invariant by construction, on every device:
  * the quantized GEMMs: per-token activation scales, exact int32 accumulation (no order
    dependence), element-wise epilogue; activation quantization is per row (max is exact);
  * attention: prefill attends each prompt alone (the same shapes and data alone or in a
    batch); decode (attend_decode) is elementwise plus fixed pairwise tree sums over one
    sequence's row, with exact zero padding;
  * RoPE, SiLU, residual adds, the embedding lookup: elementwise;
  * RMSNorm with the tree reduction (ops.tree_sum): the default on CUDA, where torch's own
    reduction kernel picks its per-row thread layout from the number of rows.
Invariant by a fixed call shape, with row independence inside a GEMM call measured:
  * dense Linears (a non-quantized lm_head, every Linear of a bf16 model): fp32 matmuls in
    fixed [64, K] row blocks, zero-padded, so cuBLAS/MKL run the same kernel for every batch.
Only measured: RMSNorm with torch's reduction (the CPU default, `reduction="torch"`), which
is serial per row at these sizes (kept on the CPU so that the audit's CPU results stay
bit-identical with what it reported before this runtime existed). The tests check, on the
CPU, that prefill and decode of a prompt alone equal its part of a batch, bit for bit, with
both reductions; `requant determinism` measures it on any device.

load_model(..., reduction="auto" | "torch" | "tree") picks the RMSNorm reduction ("auto":
tree on CUDA, torch on the CPU).

TWO ENGINES. load_model(..., engine="auto" | "fast" | "reference"). "reference" is everything
above: plain torch ops, the CPU oracle, and the path the audit's capture always takes
(Model.logits(capture=...) runs it on any engine, since it records every Linear's operands).
"fast" (requant/runtime/fast.py; "auto" picks it on CUDA for a W8A8 checkpoint whose decoder
Linears are all quantized) runs fused Triton kernels (kernels/triton/fused.py, attention.py,
dense.py), with the same int8 GEMMs by backend name, and replays decode steps from CUDA graphs.
Its numerics differ from the reference path's in three documented places, so the two engines
agree closely (the parity figures below), not bitwise:
  * RMSNorm sums the squares by a fixed adjacent pairwise tree (fast_ops.pairwise_sum) and
    takes 1 / sqrt(var + eps) with IEEE square root and division;
  * attention is one flash-style kernel with an online softmax: P is rounded to bf16
    unnormalised before P @ V and divided by the fp32 row sum at the end, exp2 is the
    device's (an approximation on a GPU), and the score and P @ V products run on the MMA;
  * the dense lm_head is a bf16 x bf16 MMA with fp32 accumulation over fixed tiles (the same
    exact products, summed in another order than the reference's fp32 matmul).
Everything else (bf16 between ops, one quantization shared by q/k/v and by gate/up, RoPE
tables, SiLU(gate) * up rounded once) is the contract above, and each fused kernel equals a
torch emulation of its arithmetic bit for bit (requant/runtime/fast_ops.py; the CPU tests run
the kernels under TRITON_INTERPRET=1). The fast engine is invariant by construction: every
kernel's configuration depends on the model's shapes only, never on the number of tokens, and
attention reads K/V from the cache with one tile walk for prefill, chunked prefill (Model.extend)
and decode, so a token's logits are the same bits prefilled whole, in chunks after a cached
prefix, or decoded, alone or in any batch, from a CUDA graph or eagerly. Parity against
transformers' fp32 Qwen3 on the trained default (tests/requant/test_runtime_fast_gpu.py, H200):
prefill relative RMS 0.0105, top-1 98.3% (transformers' own bf16 model: 0.0112, 96.0%);
decode 0.0100, 97.9% (bf16 model: 0.0106, 97.9%).

Package layout: ops.py (norms, RoPE, attention, dense rows), weights.py (loading and
checks), model.py (Model, KVCache, load_model), fast.py (the fast engine), fast_ops.py (torch
emulations of the fast engine's fused kernels).
"""

from requant.runtime.model import ENGINES, Generation, KVCache, Model, load_model
from requant.runtime.ops import (
    DENSE_CHUNK,
    apply_rope,
    attend_decode,
    attend_prompt,
    dense_rows,
    rms_norm,
    rope,
    rope_tables,
    tree_sum,
)
from requant.runtime.weights import REGIMES, arch_from_config, check_layout, dense_names, load_dense, load_linears

__all__ = [
    "load_model",
    "ENGINES",
    "Model",
    "KVCache",
    "Generation",
    "REGIMES",
    "arch_from_config",
    "check_layout",
    "dense_names",
    "load_dense",
    "load_linears",
    "rms_norm",
    "rope",
    "rope_tables",
    "apply_rope",
    "attend_prompt",
    "attend_decode",
    "dense_rows",
    "tree_sum",
    "DENSE_CHUNK",
]
