"""Generation records (`requant generate --json`) and their replay (`requant replay`).

A record is one JSON object per prompt (a file holds one per line, JSON lines). It ties the
generated ids to everything that made them:
    format, tool, checkpoint (as given; null: the embedded default), checkpoint_path, revision,
    manifest, manifest_digest, tool_version, git_commit    (requant.evidence.identity)
    tokenizer                                              (Tokenizer.describe())
    engine, backend, epilogue_order (kernels.emulation_of), act_backend, reduction, regime, device
    arithmetic, portable_kernels (only from the portable engine: "portable/1", the arithmetic that
    made every bit, and which of its forms computed it, "triton" or "torch")
    sampling {temperature, top_k, top_p, seed, method}, key, max_new_tokens, eos_ids
    prompt (text or null), prompt_ids, ids, text, stop ("eos" or "length")
    (text: the decoding of ids without the eos that stopped it, as generate prints it: the eos
    token's text, `<|endoftext|>`, is not generated text; ids keep the eos id, stop says it)
    steps [{position, token, logits_sha256, logprob}]    (requant.sampling.Step; logprob: float.hex)
Replaying a record runs the same prompt ids, params, key, regime, reduction and eos again, with
the record's backend and engine or others, optionally inside a batch of filler prompts, and
compares every step: the token, then the logits digest, then the logprob.
"""

from __future__ import annotations

import re
from pathlib import Path

from requant import kernels
from requant.kernels.portable import ARITHMETIC
from requant.models.prompts import CALIBRATION_PROMPTS
from requant.regime import REGIMES
from requant.runtime.sampling import METHOD, Sampled, SamplingParams

__all__ = [
    "FORMAT",
    "make_record",
    "text_ids",
    "read_records",
    "check_record",
    "check_against_model",
    "record_params",
    "first_difference",
    "first_token_difference",
    "describe_difference",
    "filler_prompts",
    "FILLER_SAMPLING",
]

FORMAT = "requant-generation/1"
# What must agree between the records of one file (they are replayed as one batch).
SHARED = (
    "checkpoint",
    "revision",
    "manifest_digest",
    "tokenizer",
    "engine",
    "backend",
    "act_backend",
    "reduction",
    "regime",
    "max_new_tokens",
    "eos_ids",
    "arithmetic",
)
_REQUIRED = {
    "format": str,
    "manifest_digest": str,
    "tokenizer": dict,
    "engine": str,
    "backend": str,
    "act_backend": str,
    "reduction": str,
    "regime": str,
    "sampling": dict,
    "key": str,
    "max_new_tokens": int,
    "eos_ids": list,
    "prompt_ids": list,
    "ids": list,
    "steps": list,
}
# Filler requests of a replay batch: sampled, each with its own seed and key (see filler_prompts).
FILLER_SAMPLING = {"temperature": 1.0, "top_k": 40, "top_p": 0.95}


def text_ids(ids, eos) -> list[int]:
    """The ids whose decoding is the generated text: `ids` without a last id in `eos` (the stop)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in set(eos) else ids


def make_record(*, sampled: Sampled, prompt_ids, prompt_text, model, context: dict, tokenizer) -> dict:
    """One record. context: the keys shared by a run (checkpoint, identity, device, ...)."""

    eos = set(context.get("eos_ids") or [])
    return {
        "format": FORMAT,
        "tool": "requant generate",
        **context,
        "tokenizer": tokenizer.describe(),
        "engine": model.engine,
        **(
            {"arithmetic": model.impl.arithmetic, "portable_kernels": model.impl.kernels}
            if getattr(model.impl, "arithmetic", None)
            else {}
        ),
        "backend": model.backend,
        "epilogue_order": kernels.emulation_of(model.backend),
        "act_backend": model.act_backend,
        "reduction": "tree" if model.tree else "torch",
        "regime": model.regime,
        "sampling": sampled.params.as_dict(),
        "key": sampled.params.key,
        "prompt": prompt_text,
        "prompt_ids": [int(i) for i in prompt_ids],
        "ids": list(sampled.ids),
        "text": tokenizer.decode(text_ids(sampled.ids, eos)),
        "stop": "eos" if sampled.ids and sampled.ids[-1] in eos else "length",
        "steps": [
            {"position": s.position, "token": s.token, "logits_sha256": s.logits_sha256, "logprob": s.logprob}
            for s in sampled.steps
        ],
    }


_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Optional fields that, when present, have one type (None allowed).
_OPTIONAL_STR = (
    "checkpoint",
    "checkpoint_path",
    "revision",
    "manifest",
    "device",
    "prompt",
    "text",
    "stop",
    "arithmetic",
    "portable_kernels",
)
_KNOWN = {"engine": ("fast", "portable", "reference"), "reduction": ("tree", "torch"), "regime": REGIMES}
MAX_ID = 2**31 - 1  # a token id beyond any vocabulary (the checkpoint's own bound is checked when it is loaded)


def _ints(value, where: str, lo: int = 0, hi: int = MAX_ID) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{where}: must be a list of integers")
    bad = next((i for i in value if not lo <= i <= hi), None)
    if bad is not None:
        raise ValueError(f"{where}: holds {bad}, outside {lo}..{hi}")
    return value


def _check_steps(rec: dict, where: str) -> None:
    for i, s in enumerate(rec["steps"]):
        at = f"{where}: field 'steps[{i}]"
        if not isinstance(s, dict) or not {"position", "token", "logits_sha256", "logprob"} <= set(s):
            raise ValueError(f"{at}' needs position, token, logits_sha256 and logprob")
        for k in ("position", "token"):
            if isinstance(s[k], bool) or not isinstance(s[k], int) or not 0 <= s[k] <= MAX_ID:
                raise ValueError(f"{at}.{k}' must be an integer in 0..{MAX_ID}, got {str(s[k])[:40]}")
        if not isinstance(s["logits_sha256"], str) or not _HEX64.fullmatch(s["logits_sha256"]):
            raise ValueError(f"{at}.logits_sha256' must be 64 lowercase hex digits (a sha256)")
        if not isinstance(s["logprob"], str) or len(s["logprob"]) > 64:
            raise ValueError(f"{at}.logprob' must be a hex float string (float.hex)")
        try:
            float.fromhex(s["logprob"])
        except ValueError:
            raise ValueError(f"{at}.logprob' must be a hex float string (float.hex)") from None
        if s["position"] != len(rec["prompt_ids"]) + i:
            raise ValueError(f"{at}.position' is {s['position']}, expected {len(rec['prompt_ids']) + i}")


def check_record(rec, where: str) -> dict:
    """One record's fields, each of its type and range: ValueError naming `where` and the field."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a record must be a JSON object")
    for name, kind in _REQUIRED.items():
        if name not in rec:
            raise ValueError(f"{where}: field {name!r} is missing")
        if not isinstance(rec[name], kind) or isinstance(rec[name], bool):
            raise ValueError(f"{where}: field {name!r} must be a {kind.__name__}")
    for name in _OPTIONAL_STR:
        if rec.get(name) is not None and not isinstance(rec[name], str):
            raise ValueError(f"{where}: field {name!r} must be a string or null")
    if rec["format"] != FORMAT:
        raise ValueError(f"{where}: field 'format' is {rec['format'][:40]!r}; this requant replays {FORMAT!r}")
    _check_arithmetic(rec, where)
    if not _DIGEST.fullmatch(rec["manifest_digest"]):
        raise ValueError(f"{where}: field 'manifest_digest' must be 'sha256:' and 64 lowercase hex digits")
    for name, known in _KNOWN.items():
        if rec[name] not in known:
            raise ValueError(f"{where}: field {name!r} is {rec[name][:40]!r}; known: {', '.join(known)}")
    method = rec["sampling"].get("method")
    if method not in ("greedy", METHOD):
        raise ValueError(f"{where}: field 'sampling.method' is {str(method)[:40]!r}; known: greedy, {METHOD}")
    if not 1 <= rec["max_new_tokens"] <= MAX_ID:
        raise ValueError(f"{where}: field 'max_new_tokens' must be in 1..{MAX_ID}, got {rec['max_new_tokens']}")
    _ints(rec["prompt_ids"], f"{where}: field 'prompt_ids'")
    _ints(rec["ids"], f"{where}: field 'ids'")
    _ints(rec["eos_ids"], f"{where}: field 'eos_ids'")
    if not rec["prompt_ids"]:
        raise ValueError(f"{where}: field 'prompt_ids' is empty")
    if len(rec["ids"]) > rec["max_new_tokens"]:
        raise ValueError(f"{where}: field 'ids' holds more than max_new_tokens ({rec['max_new_tokens']}) tokens")
    _check_steps(rec, where)
    if [s["token"] for s in rec["steps"]] != rec["ids"]:
        raise ValueError(f"{where}: field 'steps' does not hold the tokens of field 'ids'")
    record_params(rec, where)
    return rec


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSON-lines file (requant.io.jsonlines: bounded, strict), each checked
    (check_record): ValueError naming the file, line and field."""
    from requant.io.jsonlines import read_json_lines, where

    records = []
    label = str(path)
    for n, rec in read_json_lines(path, label=label):
        at = where(label, n)
        check_record(rec, at)
        if records:
            for name in SHARED:
                if rec.get(name) != records[0].get(name):
                    raise ValueError(f"{at}: field {name!r} differs from the first record's (one run per file)")
        rec["where"] = at
        records.append(rec)
    if not records:
        raise ValueError(f"{label}: no records")
    return records


def check_against_model(records: list[dict], vocab: int, max_positions: int) -> None:
    """Every id (and top_k) of every record inside the loaded model's vocabulary, every record's prompt plus
    max_new_tokens inside its positions: ValueError naming the record's file and line."""
    for rec in records:
        for field in ("prompt_ids", "ids", "eos_ids"):
            _ints(rec[field], f"{rec['where']}: field {field!r}", 0, vocab - 1)
        top_k = rec["sampling"]["top_k"]  # past the vocabulary: no record requant writes (generate refuses it)
        if top_k > vocab:
            raise ValueError(
                f"{rec['where']}: field 'sampling.top_k' must be an integer from 0 (every token) to the "
                f"vocabulary's size, {vocab:,} here, got {top_k}"
            )
        need = len(rec["prompt_ids"]) + rec["max_new_tokens"]
        if need > max_positions:
            raise ValueError(
                f"{rec['where']}: prompt_ids ({len(rec['prompt_ids'])}) + max_new_tokens ({rec['max_new_tokens']}) "
                f"= {need} positions, more than the model's {max_positions}"
            )


def _check_arithmetic(rec: dict, where: str) -> None:
    # a portable record names the arithmetic that made it; this requant computes exactly one

    arith = rec.get("arithmetic")
    if arith is None and rec["engine"] == "portable":
        raise ValueError(f"{where}: field 'arithmetic' is missing (a record of the portable engine names it)")
    if arith is not None and arith != ARITHMETIC:
        raise ValueError(f"{where}: field 'arithmetic' is {arith!r}; this requant computes {ARITHMETIC!r}")


def record_params(rec: dict, where: str = "record") -> SamplingParams:
    s = rec["sampling"]
    try:
        params = SamplingParams(
            temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], seed=s["seed"], key=rec["key"]
        )
    except KeyError as exc:
        raise ValueError(f"{where}: field 'sampling.{exc.args[0]}' is missing") from None
    return params.check(where, labels={f: f"field 'sampling.{f}'" for f in s} | {"key": "field 'key'"})


def first_difference(rec: dict, sampled: Sampled) -> dict | None:
    """None when every step matches bit for bit; else {step, position, what, recorded, replayed},
    what: "token" (the tokens differ, or one side has no token there), "logits" (same token,
    another logits digest) or "logprob"."""
    old = rec["steps"]
    new = [
        {"position": s.position, "token": s.token, "logits_sha256": s.logits_sha256, "logprob": s.logprob}
        for s in sampled.steps
    ]
    for i in range(max(len(old), len(new))):
        a = old[i] if i < len(old) else None
        b = new[i] if i < len(new) else None
        if a is None or b is None or a["token"] != b["token"]:
            what = "token"
        elif a["logits_sha256"] != b["logits_sha256"]:
            what = "logits"
        elif a["logprob"] != b["logprob"] or a["position"] != b["position"]:
            what = "logprob"
        else:
            continue
        pos = (a or b)["position"]
        return {"step": i, "position": pos, "what": what, "recorded": a, "replayed": b}
    return None


def first_token_difference(rec: dict, sampled: Sampled) -> int | None:
    """The first step whose token differs (a length difference counts at the shorter length)."""
    a, b = rec["ids"], sampled.ids
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return i if i is not None or len(a) == len(b) else min(len(a), len(b))


def describe_difference(index: int, rec: dict, diff: dict | None, token_step: int | None = None) -> str:
    """The one line replay prints for a record (token_step: first_token_difference)."""
    head = f"record {index} (key {rec['key'][:16]})"
    if diff is None:
        n = len(rec["steps"])
        return f"{head}: {n} tokens and their logits digests match bit for bit"
    at = f"first difference at step {diff['step']} (position {diff['position']})"
    a, b = diff["recorded"], diff["replayed"]
    if diff["what"] == "token":
        ta = "none" if a is None else a["token"]
        tb = "none (it stopped)" if b is None else b["token"]
        return f"{head}: {at}: token {tb} replayed, {ta} recorded"
    later = (
        "the tokens match at every step"
        if token_step is None
        else f"the tokens first differ at step {token_step} (position {len(rec['prompt_ids']) + token_step})"
    )
    if diff["what"] == "logits":
        return (
            f"{head}: {at}: only the logits differ (token {a['token']} on both sides; digest "
            f"{b['logits_sha256'][:16]} replayed, {a['logits_sha256'][:16]} recorded); {later}"
        )
    return f"{head}: {at}: the logprob differs ({b['logprob']} replayed, {a['logprob']} recorded); {later}"


def filler_prompts(tokenizer, n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """n deterministic filler requests: the calibration prompts (requant.models.prompts) in turn, a
    number appended from the 17th on, each sampled (FILLER_SAMPLING) with seed i, key filler-i."""

    ids, params = [], []
    for i in range(n):
        text = CALIBRATION_PROMPTS[i % len(CALIBRATION_PROMPTS)]
        if i >= len(CALIBRATION_PROMPTS):
            text = f"{text} ({i})"
        ids.append(tokenizer.encode(text))
        params.append(SamplingParams(seed=i, key=f"filler-{i}", **FILLER_SAMPLING))
    return ids, params
