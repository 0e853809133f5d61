"""One Qwen3 W8A8 runtime for the audit, the evaluation and `requant determinism`.

    from requant.runtime import load_model
    model = load_model(src, regime="native", backend="reference-triton-order",
                       act_backend="reference", device="cpu", engine="auto")
    model.logits([[ids...], [ids...]])          # fp32 [T_i, vocab] per prompt
    model.generate(prompts, max_new_tokens=64, eos_id=None, keep_logits=False, choose=None)
    model.greedy(prompts, max_new_tokens=64)    # new ids per prompt
    model.prefill / extend / decode_step / new_cache   # the engine's methods, on a KVCache
    requant.runtime.engine: the Engine protocol and the one decode loop (generate)

  model       Model (a front over one engine chosen at load), load_model, ENGINES
  engine      the Engine and Decoder protocols and generate, the one decode loop
  cache       KVCache, Generation, the cache-size rule
  reference   the reference engine: torch ops (kernels/ops.py), the layer over a Linear strategy
  fast        the fast engine: fused Triton kernels, one attention, CUDA-graph decode
  portable    the portable engine: the fast layer in a machine-independent arithmetic
  moe         the Qwen3-MoE sparse block of the reference engine
  weights     loading a regime of a W8A8 checkpoint, or a bf16 directory
  sampling, sampling_batch, _sampling_core   seeded batch-invariant sampling
  generation  generation records and their replay
  invariance  bitwise invariance checks of a Model

Imports kernels/, models, checkpoint, io, regime and errors only (tests/test_layers.py).
Why our own runtime, the engines and their proofs: docs/runtime.md.
"""

import importlib

# Lazy (PEP 562): `import requant.runtime.sampling` must not import torch kernels or Triton.
_EXPORTS = {
    "Decoder": "engine",
    "Engine": "engine",
    "Generation": "cache",
    "KVCache": "cache",
    "ENGINES": "model",
    "Model": "model",
    "load_model": "model",
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
    "Engine",
    "Decoder",
    "Model",
    "KVCache",
    "Generation",
    "REGIMES",
    "arch_from_config",
    "check_layout",
    "dense_names",
    "load_dense",
    "load_linears",
]
