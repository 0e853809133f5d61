"""One Qwen3 W8A8 runtime for the audit, the evaluation and `requant determinism`.

    from requant.runtime import load_model
    model = load_model(src, regime="native", backend="reference-triton-order",
                       act_backend="reference", device="cpu", engine="auto")
    model.logits([[ids...], [ids...]])          # fp32 [T_i, vocab] per prompt
    model.generate(prompts, max_new_tokens=64, eos_id=None, keep_logits=False, choose=None)
    model.greedy(prompts, max_new_tokens=64)    # new ids per prompt
    model.prefill / extend / decode_step / new_cache   # the engine's methods, on a KVCache

Why our own and not transformers: every quantized Linear must go through requant.kernels by
name (CUTLASS, Triton or a reference emulation does the GEMM), the audit needs each Linear's
int8 operands, and determinism needs every other op to be batch-invariant.

Contract. `Model` (model.py) is a front over one engine chosen once (at construction or
with_backends(engine=...)); `model.engine` names it, `model.impl` is it. Both engines have
prefill(prompts, cache=None, capture=None, last_only=False), extend(chunks, cache),
decode_step(tokens, cache, capture=None), generate(...) -> Generation and new_cache(batch,
capacity) (exactly `capacity` positions; generate sizes its cache to a power of two):
  reference  reference.py + ops.py: plain torch ops, the CPU oracle; its quantized Linears are
             kernels.quantize_activations + kernels.scaled_mm(q, w, s, s_w, backend=model.backend)
             with w, s_w = model.linears[name]; the layer takes its Linears as a strategy, which
             is how requant.tp runs the same forward sharded.
  fast       fast.py: fused Triton kernels (kernels/triton/), CUDA-graph decode; "auto" picks
             it on CUDA for a checkpoint whose decoder Linears are all quantized.
Both are batch-invariant: a prompt's logits and tokens do not depend on the rest of the batch,
bit for bit. On the fast engine a token's logits are also the same bits prefilled, extended in
chunks, decoded, or replayed from a CUDA graph. The two engines agree closely, not bitwise.

Where the proofs live: docs/runtime.md (numerics, the invariance argument, where the engines
differ), each kernel's module docstring, the tests in tests/requant/runtime/ (test_reference.py,
test_fast.py under TRITON_INTERPRET=1, test_parity.py against transformers, *_gpu.py); the
measured figures: docs/results.md.

Modules: model.py (Model, load_model), cache.py (KVCache, Generation, the cache-size rule),
reference.py (the reference engine), fast.py (the fast engine), ops.py (numerical building
blocks), weights.py (loading a regime, or a bf16 directory). The fast kernels' torch
emulations: kernels/triton/emulation.py.
"""

import importlib

# Lazy (PEP 562): `import requant.runtime.sampling` must not import torch kernels or Triton.
_EXPORTS = {
    "Generation": "cache",
    "KVCache": "cache",
    "ENGINES": "model",
    "Model": "model",
    "load_model": "model",
    "DENSE_CHUNK": "ops",
    "apply_rope": "ops",
    "attend_decode": "ops",
    "attend_prompt": "ops",
    "dense_rows": "ops",
    "rms_norm": "ops",
    "rope": "ops",
    "rope_tables": "ops",
    "tree_sum_halves": "ops",
    "REGIMES": "weights",
    "arch_from_config": "weights",
    "check_layout": "weights",
    "dense_names": "weights",
    "load_dense": "weights",
    "load_linears": "weights",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"requant.runtime.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'requant.runtime' has no attribute {name!r}")


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
    "tree_sum_halves",
    "DENSE_CHUNK",
]
