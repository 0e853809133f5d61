"""`requant generate`: text from a checkpoint, greedy or seeded sampling, with a verifiable record.

    requant generate [CKPT] (--prompt TEXT ... | --prompts FILE.jsonl) [--max-new-tokens 64]
                     [--eos/--no-eos] [--temperature T] [--top-k K] [--top-p P] [--seed S]
                     [--backend NAME] [--engine auto|fast|reference|portable] [--regime native|pow2]
                     [--device DEV] [--json OUT] [--revision REV] [--threads N] [--byte-tokens]

No CKPT: the embedded default. Greedy unless --temperature > 0 (requant.runtime.sampling: a counter-based
generator per request and position, so a sample cannot depend on the batch). All prompts run as
one batch. FILE.jsonl: one object a line, {"prompt": TEXT} or {"prompt_ids": [ids]}, optionally
"key", "seed", "temperature", "top_k", "top_p" (overriding the options for that request). One
prompt: its text is streamed to stdout token by token; several: each printed when done.
--json writes one record a prompt, JSON lines (requant.runtime.generation); `requant replay` re-checks it.
Exit status: 0 done; 2 could not run (one line: a bad option, prompt file or checkpoint, a
SHA256SUMS that does not match the files); 130 interrupted.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from requant import DEFAULT_CHECKPOINT
from requant.backends import check_runnable, default_backend
from requant.commands._common import (
    ByteTokensOpt,
    CkptArg,
    DeviceOpt,
    EngineOpt,
    JsonOpt,
    RevisionOpt,
    ThreadsOpt,
    UsageError,
    byte_tokens_option,
    cannot_run,
    check_device,
    check_engine,
    check_output_file,
    default_device,
    echo_command,
    err,
    plain,
    set_threads,
    text_out,
)
from requant.commands._limits import check_generation_memory
from requant.evidence.identity import with_progress
from requant.io.jsonlines import has_surrogate, read_json_lines
from requant.io.links import shown
from requant.io.output import write_bytes_atomic
from requant.regime import check_regime

__all__ = ["generate", "read_prompt_file", "default_backend", "Streamer"]

_OVERRIDES = ("key", "seed", "temperature", "top_k", "top_p")


def read_prompt_file(path: Path) -> list[dict]:
    """The requests of a prompts file: [{"prompt" or "prompt_ids", overrides..., "where"}], each
    field checked (requant.io.jsonlines reads the file: bounded, strict); UsageError naming the
    file and line. Token ids are checked against the vocabulary once the model is loaded
    (check_requests)."""

    label = f"--prompts {shown(path)}"
    reqs = []
    for n, obj in read_json_lines(path, label=label, error=UsageError):
        where = f"{label}:{n}"
        if not isinstance(obj, dict) or ("prompt" in obj) == ("prompt_ids" in obj):
            raise UsageError(f"{where}: an object with exactly one of 'prompt' and 'prompt_ids' is needed")
        if "prompt" in obj and not (isinstance(obj["prompt"], str) and obj["prompt"]):
            raise UsageError(f"{where}: field 'prompt' must be a non-empty string")
        ids = obj.get("prompt_ids")
        if ids is not None and not (
            isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise UsageError(f"{where}: field 'prompt_ids' must be a non-empty list of integers")
        if ids is not None and min(ids) < 0:
            raise UsageError(f"{where}: field 'prompt_ids' holds {min(ids)}; token ids are >= 0")
        unknown = sorted(set(obj) - {"prompt", "prompt_ids", *_OVERRIDES})
        if unknown:
            raise UsageError(
                f"{where}: unknown field {unknown[0][:40]!r} (known: prompt, prompt_ids, {', '.join(_OVERRIDES)})"
            )
        obj["where"] = where
        reqs.append(obj)
    if not reqs:
        raise UsageError(f"{label}: no prompts")
    from requant.commands._limits import MAX_BATCH

    if len(reqs) > MAX_BATCH:  # before any of them is tokenized
        raise UsageError(f"{label}: {len(reqs):,} prompts, more than the {MAX_BATCH:,} requant runs as one batch")
    return reqs


# The sampling options by the name a message gives them (SamplingParams.check's labels).
_OPTION_OF = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


def check_top_k(base, requests: list[dict], params: list, vocab: int) -> None:
    """top_k at most the vocabulary's size (more keeps every token, as 0 does: a value past it
    is a mistake, refused before the model loads): UsageError naming --top-k or the prompt's line."""
    if base.top_k > vocab:
        raise UsageError(
            f"--top-k must be an integer from 0 (every token) to the vocabulary's size, {vocab:,} here, got {base.top_k}"
        )
    for r, p in zip(requests, params):
        if "top_k" in r and p.top_k > vocab:
            raise UsageError(
                f"{r['where']}: field 'top_k' must be an integer from 0 (every token) to the vocabulary's size, "
                f"{vocab:,} here, got {p.top_k}"
            )


def check_requests(ids: list[list[int]], wheres: list[str], vocab: int, max_positions: int, new: int) -> None:
    """Each prompt's ids inside 0..vocab-1 and its positions (prompt + --max-new-tokens) inside
    the model's: UsageError naming the prompt (file and line) before any generation."""
    for pids, where in zip(ids, wheres):
        bad = next((i for i in pids if not 0 <= i < vocab), None)
        if bad is not None:
            raise UsageError(f"{where}: token id {bad} is outside the vocabulary 0..{vocab - 1}")
        if len(pids) + new > max_positions:
            raise UsageError(
                f"{where}: {len(pids)} prompt tokens + --max-new-tokens {new} = {len(pids) + new} positions, "
                f"more than the model's {max_positions} (max_position_embeddings)"
            )


class Streamer:
    """on_token for one request: prints the decoded text as it grows (a suffix is printed once
    the decoding of all ids so far extends what was printed), and nothing of an eos (its token
    text, `<|endoftext|>`, is not generated text: requant.runtime.generation.text_ids) or after it."""

    def __init__(self, tokenizer, eos: set, write=None):
        self.tok, self.eos, self.ids, self.shown, self.done = tokenizer, eos, [], "", False
        self.write = write or (lambda s: (sys.stdout.write(text_out(s)), sys.stdout.flush()))

    def __call__(self, row: int, step: int, token: int) -> None:
        if self.done:
            return
        self.done = token in self.eos
        if self.done:
            return
        self.ids.append(token)
        text = self.tok.decode(self.ids)
        if text.startswith(self.shown) and not text.endswith("\ufffd"):  # not in the middle of a character
            self.write(text[len(self.shown) :])
            self.shown = text


@byte_tokens_option
def generate(
    ckpt: CkptArg = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt (repeatable).")] = None,
    prompts_file: Annotated[
        Optional[Path], typer.Option("--prompts", help="JSON lines: {'prompt': TEXT} or {'prompt_ids': [...]}.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens to generate at most.")] = 64,
    eos: Annotated[bool, typer.Option("--eos/--no-eos", help="Stop a prompt at the tokenizer's eos.")] = True,
    temperature: Annotated[
        float, typer.Option("--temperature", help="Sampling temperature; 0 is greedy (the default).")
    ] = 0.0,
    top_k: Annotated[
        int, typer.Option("--top-k", help="Keep the k most likely tokens, 0 to the vocabulary size (0: all).")
    ] = 0,
    top_p: Annotated[
        float, typer.Option("--top-p", help="Keep the smallest set of probability >= p, p in (0, 1].")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed, 0 to 2**64-1.")] = 0,
    backend: Annotated[
        Optional[str],
        typer.Option(
            "--backend", help="The scaled_mm backend (default: triton on a GPU, reference-triton-order on CPU)."
        ),
    ] = None,
    engine: EngineOpt = "auto",
    regime: Annotated[str, typer.Option("--regime", help="native (the checkpoint's scales) or pow2.")] = "native",
    device: DeviceOpt = None,
    json_out: JsonOpt = None,
    revision: RevisionOpt = None,
    threads: ThreadsOpt = None,
    byte_tokens: ByteTokensOpt = False,
) -> None:
    """Generate from prompts (greedy or seeded sampling); --json records it for `requant replay`."""
    console = err()
    with cannot_run():
        check_output_file(json_out, "--json")
        from requant.checkpoint import open_checkpoint
        from requant.runtime import check_layout, load_model
        from requant.runtime.sampling import SamplingParams

        dev = check_device(device or default_device())
        if prompt is None and prompts_file is None:
            raise UsageError("no prompt: give --prompt TEXT (repeatable) or --prompts FILE.jsonl")
        if prompt is not None and prompts_file is not None:
            raise UsageError("give --prompt TEXT (repeatable) or --prompts FILE.jsonl, not both")
        if max_new_tokens < 1:
            raise UsageError("--max-new-tokens must be at least 1")
        check_regime(regime, "--regime")
        base = SamplingParams(temperature, top_k, top_p, seed).check("", labels=_OPTION_OF)
        be = backend or default_backend(dev)
        from requant import kernels

        if be not in kernels.scaled_mm_backends():
            raise UsageError(f"--backend: unknown backend {be!r}; known: {', '.join(kernels.scaled_mm_backends())}")
        check_runnable((be,), dev, "reference", option="--backend")
        check_engine(engine, dev)
        requests = [{"prompt": p, "where": f"--prompt {i}"} for i, p in enumerate(prompt or [])]

        for r in requests:  # bytes that are not UTF-8 on the command line arrive as lone surrogates
            if has_surrogate(r["prompt"]):
                raise UsageError(f"{r['where']}: the text is not valid UTF-8")
        if prompts_file is not None:
            requests = read_prompt_file(prompts_file)
        params = [
            SamplingParams(**{**base.__dict__, **{k: r[k] for k in _OVERRIDES if k in r}}).check(
                r["where"], labels={k: f"field {k!r}" for k in _OVERRIDES if k in r}
            )
            for r in requests
        ]
        set_threads(threads, dev)
        checkpoint = open_checkpoint(DEFAULT_CHECKPOINT if ckpt is None else ckpt, revision=revision)
        check_layout(checkpoint)
        check_top_k(base, requests, params, int(checkpoint.config["vocab_size"]))
        identity = with_progress(checkpoint, console)
        model = load_model(checkpoint, regime=regime, backend=be, device=dev, engine=engine)
        tok = model.tokenizer
        ids, texts = [], []
        for r in requests:
            pids = tok.encode(r["prompt"]) if "prompt" in r else r["prompt_ids"]
            if not pids:
                raise UsageError(f"{r['where']}: the prompt has no tokens")
            ids.append(pids)
            texts.append(r.get("prompt"))
        check_requests(ids, [r["where"] for r in requests], model.arch.vocab, model.max_length, max_new_tokens)

        longest = max(len(p) for p in ids) + max_new_tokens
        check_generation_memory(checkpoint.config, len(ids), longest, dev, f"{len(ids)} prompts")
        eos_ids = list(tok.eos_ids) if eos else []

    from requant.runtime.generation import make_record, text_ids
    from requant.runtime.sampling import generate as sample

    stream = None
    if len(ids) == 1:
        print(text_out(tok.decode(ids[0])), end="", flush=True)
        stream = Streamer(tok, set(eos_ids))
    t0 = time.perf_counter()
    with cannot_run():
        # without --json nothing reads the logits digests or logprobs: the chooser skips them
        out = sample(
            model, ids, params, max_new_tokens, eos_id=eos_ids or None, on_token=stream, record=json_out is not None
        )
    wall = time.perf_counter() - t0
    if stream is not None:
        print(text_out(tok.decode(text_ids(out[0].ids, eos_ids))[len(stream.shown) :]))
    else:
        for pids, s in zip(ids, out):
            print(text_out(tok.decode(pids) + tok.decode(text_ids(s.ids, eos_ids))))
            print()
    n_new = sum(len(s.ids) for s in out)
    mode = "greedy" if all(p.greedy for p in params) else "sampled"
    console.print(
        f"{len(ids)} prompt(s), {n_new} new tokens in {wall:.2f} s; {model.engine} engine, {plain(be)}, {regime}, {mode}"
    )
    if json_out is not None:
        cmd = echo_command("generate")
        context = {
            "checkpoint": None if ckpt is None else str(ckpt),
            "checkpoint_path": str(checkpoint.path),
            "revision": revision,
            **identity,
            "device": dev,
            "max_new_tokens": max_new_tokens,
            "eos_ids": eos_ids,
            "command": cmd,
        }
        lines = [
            json.dumps(
                make_record(sampled=s, prompt_ids=pids, prompt_text=t, model=model, context=context, tokenizer=tok)
            )
            for s, pids, t in zip(out, ids, texts)
        ]

        with cannot_run():
            write_bytes_atomic(json_out, ("\n".join(lines) + "\n").encode("utf-8"))
        console.print(f"wrote {plain(json_out)} ({len(lines)} record{'s' if len(lines) > 1 else ''})")
