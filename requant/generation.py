"""Generation records (`requant generate --json`) and their replay (`requant replay`).

A record is one JSON object per prompt (a file holds one per line, JSON lines). It ties the
generated ids to everything that made them:
    format, tool, checkpoint (as given; null: the embedded default), checkpoint_path, revision,
    manifest, manifest_digest, tool_version, git_commit    (requant.evidence.identity)
    tokenizer                                              (Tokenizer.describe())
    engine, backend, epilogue_order (kernels.EMULATION_OF), act_backend, reduction, regime, device
    arithmetic, portable_kernels (only from the portable engine: "portable/1", the arithmetic that
    made every bit, and which of its forms computed it, "triton" or "torch")
    sampling {temperature, top_k, top_p, seed, method}, key, max_new_tokens, eos_ids
    prompt (text or null), prompt_ids, ids, text, stop ("eos" or "length")
    steps [{position, token, logits_sha256, logprob}]    (requant.sampling.Step; logprob: float.hex)
Replaying a record runs the same prompt ids, params, key, regime, reduction and eos again, with
the record's backend and engine or others, optionally inside a batch of filler prompts, and
compares every step: the token, then the logits digest, then the logprob.
"""

from __future__ import annotations

import json
from pathlib import Path

from requant.sampling import METHOD, Sampled, SamplingParams

__all__ = [
    "FORMAT",
    "make_record",
    "read_records",
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


def make_record(*, sampled: Sampled, prompt_ids, prompt_text, model, context: dict, tokenizer) -> dict:
    """One record. context: the keys shared by a run (checkpoint, identity, device, ...)."""
    from requant import kernels

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
        "epilogue_order": kernels.EMULATION_OF.get(model.backend),
        "act_backend": model.act_backend,
        "reduction": "tree" if model.tree else "torch",
        "regime": model.regime,
        "sampling": sampled.params.as_dict(),
        "key": sampled.params.key,
        "prompt": prompt_text,
        "prompt_ids": [int(i) for i in prompt_ids],
        "ids": list(sampled.ids),
        "text": tokenizer.decode(sampled.ids),
        "stop": "eos" if sampled.ids and sampled.ids[-1] in eos else "length",
        "steps": [
            {"position": s.position, "token": s.token, "logits_sha256": s.logits_sha256, "logprob": s.logprob}
            for s in sampled.steps
        ],
    }


def _ints(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{where}: must be a list of integers")
    return value


def read_records(path: str | Path) -> list[dict]:
    """The records of a JSON-lines file, checked: ValueError naming the file, line and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: a record must be a JSON object")
        for name, kind in _REQUIRED.items():
            if name not in rec:
                raise ValueError(f"{where}: field {name!r} is missing")
            if not isinstance(rec[name], kind) or isinstance(rec[name], bool):
                raise ValueError(f"{where}: field {name!r} must be a {kind.__name__}")
        if rec["format"] != FORMAT:
            raise ValueError(f"{where}: field 'format' is {rec['format']!r}; this requant replays {FORMAT!r}")
        _check_arithmetic(rec, where)
        method = rec["sampling"].get("method")
        if method not in ("greedy", METHOD):
            raise ValueError(f"{where}: field 'sampling.method' is {method!r}; known: greedy, {METHOD}")
        _ints(rec["prompt_ids"], f"{where}: field 'prompt_ids'")
        _ints(rec["ids"], f"{where}: field 'ids'")
        _ints(rec["eos_ids"], f"{where}: field 'eos_ids'")
        if not rec["prompt_ids"]:
            raise ValueError(f"{where}: field 'prompt_ids' is empty")
        for i, s in enumerate(rec["steps"]):
            if not isinstance(s, dict) or not {"position", "token", "logits_sha256", "logprob"} <= set(s):
                raise ValueError(f"{where}: field 'steps[{i}]' needs position, token, logits_sha256 and logprob")
        if [s["token"] for s in rec["steps"]] != rec["ids"]:
            raise ValueError(f"{where}: field 'steps' does not hold the tokens of field 'ids'")
        record_params(rec, where)
        if records:
            for name in SHARED:
                if rec.get(name) != records[0].get(name):
                    raise ValueError(f"{where}: field {name!r} differs from the first record's (one run per file)")
        records.append(rec)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def _check_arithmetic(rec: dict, where: str) -> None:
    # a portable record names the arithmetic that made it; this requant computes exactly one
    from requant.kernels.portable import ARITHMETIC

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
    return params.check(f"{where}: field 'sampling'")


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
    """n deterministic filler requests: the calibration prompts (requant.prompts) in turn, a
    number appended from the 17th on, each sampled (FILLER_SAMPLING) with seed i, key filler-i."""
    from requant.prompts import CALIBRATION_PROMPTS

    ids, params = [], []
    for i in range(n):
        text = CALIBRATION_PROMPTS[i % len(CALIBRATION_PROMPTS)]
        if i >= len(CALIBRATION_PROMPTS):
            text = f"{text} ({i})"
        ids.append(tokenizer.encode(text))
        params.append(SamplingParams(seed=i, key=f"filler-{i}", **FILLER_SAMPLING))
    return ids, params
