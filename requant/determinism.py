"""`requant determinism`: are greedy generations byte-identical across the GEMM pair?

For each regime (native: the checkpoint's scales; pow2: the converter's nearest arm, made
in memory) the built-in calibration prompts (requant.models.prompts), tokenized with the
checkpoint's tokenizer, are decoded greedily with the KV cache (requant.runtime), as one
batch, once with each backend of the pair. Nothing else differs between the two runs: the
same weights, the same activation quantizer, the same attention and norms; only the
scaled_mm epilogue order. Every prompt decodes exactly `new_tokens` tokens (no stop at
eos), so both sides are compared over the same positions.

What is compared, and the already-pow2 checkpoint: docs/runtime.md#requant-determinism.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from requant.backends import environment
from requant.evidence.identity import checkpoint_identity
from requant.evidence.identity import markdown_lines as identity_lines
from requant.io.markdown import table
from requant.kernels.bf16 import is_power_of_two
from requant.models.prompts import prompts as calibration_prompts
from requant.models.tokenizer import summary as tokenizer_summary
from requant.regime import REGIMES
from requant.runtime import check_layout, load_model

SHA_ENCODING = "sha256 of the new token ids as little-endian int64 bytes"
CONSTRAINED_ARMS = ("nearest", "ceiling", "mse", "probe")


def ids_sha256(ids) -> str:
    """sha256 hex of token ids serialized as little-endian int64 (8 bytes per id)."""
    return hashlib.sha256(np.asarray(list(ids), dtype="<i8").tobytes()).hexdigest()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts at
    the shorter length); None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def converted_arm(config: dict) -> str | None:
    """The constrained arm a `requant convert` output records in config.json, if any."""
    prov = config.get("requant")
    arm = prov.get("arm") if isinstance(prov, dict) else None
    return arm if arm in CONSTRAINED_ARMS else None


def all_scales_pow2(ckpt) -> bool:
    return all(bool(is_power_of_two(ckpt.weight_and_scale(n)[1]).all()) for n in ckpt.quantized_linears)


def _pair_row(i: int, text: str, prompt_ids: list[int], outs: dict[str, list[int]], tok) -> dict:
    a, b = outs.values()
    div = first_divergence(a, b)
    return {
        "index": i,
        "prompt": text,
        "prompt_tokens": len(prompt_ids),
        "identical": div is None,
        "first_divergence": div,
        "sha256": {k: ids_sha256(v) for k, v in outs.items()},
        "text": {k: tok.decode(v) for k, v in outs.items()},
        "tokens": {k: list(v) for k, v in outs.items()},
    }


def run_regime(
    model_a, backends: tuple[str, str], texts: list[str], token_lists: list[list[int]], new_tokens: int, advance=None
) -> tuple[dict, dict]:
    """(pair result, batch invariance per backend) for one regime; model_a runs backends[0]."""
    tick = advance or (lambda n=1: None)
    batch = {}
    invariance = {}
    for b in backends:
        model = model_a.with_backends(b)
        batch[b] = model.greedy(token_lists, max_new_tokens=new_tokens)
        tick()
        differing = []
        for i, t in enumerate(token_lists):
            if model.greedy([t], max_new_tokens=new_tokens)[0] != batch[b][i]:
                differing.append(i)
            tick()
        invariance[b] = {
            "identical": len(token_lists) - len(differing),
            "total": len(token_lists),
            "differing_prompts": differing,
        }
    rows = [
        _pair_row(i, texts[i], token_lists[i], {b: batch[b][i] for b in backends}, model_a.tokenizer)
        for i in range(len(texts))
    ]
    pair = {"identical": sum(r["identical"] for r in rows), "total": len(rows), "prompts": rows}
    return pair, invariance


def work_units(n_prompts: int, regimes: int = 2) -> int:
    """Greedy calls per run (for a progress bar): per regime and backend, one batch and one per prompt."""
    return regimes * 2 * (1 + n_prompts)


def run_determinism(
    ckpt,
    backends: tuple[str, str],
    n_prompts: int = 8,
    new_tokens: int = 64,
    device: str = "cpu",
    act_backend: str = "reference",
    reduction: str = "auto",
    advance=None,
    on_phase=None,
    models: dict | None = None,
    identity: dict | None = None,
    engine: str = "auto",
) -> dict:
    """The whole measurement on an opened checkpoint (requant.checkpoint.Checkpoint).
    models: already loaded {"native": Model, "pow2": Model} of this checkpoint (the
    benchmark's), used with backends set by name instead of loading the weights again.
    identity: requant.evidence.identity.checkpoint_identity(ckpt) when the caller computed it
    already (the command does, before the run); computed here otherwise. engine: the runtime
    engine of the models loaded here ("auto": the fast engine on CUDA; requant.runtime)."""

    t0 = time.perf_counter()
    say = on_phase or (lambda msg: None)
    if new_tokens < 1:
        raise ValueError("--new-tokens must be at least 1")
    identity = identity if identity is not None else checkpoint_identity(ckpt)
    texts = calibration_prompts(n_prompts)
    check_layout(ckpt)
    arm = converted_arm(ckpt.config)
    pow2_native = all_scales_pow2(ckpt)
    models = dict(models or {})
    if "native" not in models:
        say(f"native: loading to {device}")
        models["native"] = load_model(
            ckpt,
            regime="native",
            backend=backends[0],
            act_backend=act_backend,
            device=device,
            reduction=reduction,
            engine=engine,
        )
    native = models["native"].with_backends(backends[0], act_backend)
    tok = native.tokenizer
    token_lists = [tok.encode(t) for t in texts]
    regimes, invariance = {}, {}
    for regime in REGIMES:
        if regime == "pow2" and pow2_native:
            regimes["pow2"] = dict(regimes["native"], same_as="native")
            invariance["pow2"] = dict(invariance["native"])
            continue
        if regime not in models:
            models[regime] = load_model(
                ckpt,
                regime=regime,
                backend=backends[0],
                act_backend=act_backend,
                device=device,
                share=native,
                reduction=reduction,
                engine=engine,
            )
        model = models[regime].with_backends(backends[0], act_backend)
        say(
            f"{regime}: greedy decoding, {len(texts)} prompts x {new_tokens} tokens, {backends[0]} and {backends[1]}, batch and alone"
        )
        regimes[regime], invariance[regime] = run_regime(model, backends, texts, token_lists, new_tokens, advance)
    batch_ok = all(v["identical"] == v["total"] for r in invariance.values() for v in r.values())
    summary = f"pow2: {regimes['pow2']['identical']}/{regimes['pow2']['total']} identical; native: {regimes['native']['identical']}/{regimes['native']['total']}"
    return {
        "tool": "requant determinism",
        "checkpoint": str(getattr(ckpt, "path", "")),
        **identity,  # manifest, manifest_digest, tool_version, git_commit
        "backends": list(backends),
        "act_backend": act_backend,
        "device": str(device),
        "engine": native.engine,
        "reduction": "tree" if native.tree else "torch",
        "prompts": len(texts),
        "prompt_tokens": sum(len(t) for t in token_lists),
        "new_tokens": new_tokens,
        "eos_stop": False,
        "sha256_encoding": SHA_ENCODING,
        "tokenizer": tok.describe(),
        "converted": {
            "arm": arm,
            "all_scales_pow2": pow2_native,
            "note": "every weight scale is already a power of two: native is the pow2 regime" if pow2_native else None,
        },
        "regimes": regimes,
        "batch_invariance": invariance,
        "batch_invariant": batch_ok,
        "summary": summary,
        "ok": regimes["pow2"]["identical"] == regimes["pow2"]["total"] and batch_ok,
        "environment": environment(device),
        "wall_seconds": round(time.perf_counter() - t0, 3),
    }


def _cell(text: str, width: int = 60) -> str:
    text = text.replace("|", "\\|").replace("\n", "\\n").replace("`", "'")
    return text if len(text) <= width else text[: width - 1] + "…"


def markdown(result: dict, command: str | None = None) -> str:
    """A Markdown summary for people (the JSON is the record)."""

    a, b = result["backends"]
    lines = ["# requant determinism", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    conv = result["converted"]
    lines += [
        f"**{result['summary']}**",
        "",
        f"- checkpoint: `{result['checkpoint']}`",
        f"- backends: `{a}` vs `{b}` (activations: `{result['act_backend']}`) on `{result['device']}`; norms: {result['reduction']} reduction",
        f"- prompts: {result['prompts']} ({result['prompt_tokens']} tokens), {result['new_tokens']} new tokens each, greedy, KV cache, no stop at eos",
        f"- tokenizer: {tokenizer_summary(result['tokenizer'])}",
        f"- token digests: {result['sha256_encoding']}",
        *identity_lines(result),
        f"- wall time {result['wall_seconds']} s",
    ]
    if conv["all_scales_pow2"]:
        lines.append(f"- converted checkpoint (arm: {conv['arm'] or 'unknown'}): {conv['note']}")
    lines.append("")
    for regime in REGIMES:
        r = result["regimes"][regime]
        lines += [
            f"## {regime}: {r['identical']}/{r['total']} identical" + (" (same as native)" if r.get("same_as") else ""),
            "",
        ]
        rows = []
        for p in r["prompts"]:
            div = "" if p["first_divergence"] is None else str(p["first_divergence"])
            other = "" if p["identical"] else _cell(p["text"][b])
            same = "yes" if p["identical"] else "**no**"
            rows.append(
                [
                    p["index"],
                    same,
                    div,
                    f"`{p['sha256'][a][:16]}`",
                    f"`{p['sha256'][b][:16]}`",
                    _cell(p["text"][a]),
                    other,
                ]
            )
        header = ["#", "identical", "first divergence", f"sha256 {a}", f"sha256 {b}", f"text ({a})"]
        lines += [*table([*header, f"text ({b}), where it differs"], rows, align="rlr"), ""]
    lines += [
        "## Batch invariance (each prompt alone vs inside the batch, same backend)",
        "",
    ]
    rows = [
        [regime, backend, f"{v['identical']}/{v['total']}", ", ".join(map(str, v["differing_prompts"])) or "-"]
        for regime in REGIMES
        for backend, v in result["batch_invariance"][regime].items()
    ]
    lines += table(["regime", "backend", "identical", "differing prompts"], rows, align="llr")
    lines.append("")
    return "\n".join(lines)
