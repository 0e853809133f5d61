"""Evaluate a checkpoint's scale arms through lm-eval and compare them (what `requant eval` runs).

For each arm the model is a real checkpoint directory: `native` is CKPT as it is; every
other arm is written by the converter (`requant.convert.convert(CKPT, tmp/ARM, ARM)`, the
same bytes `requant convert --arm ARM` writes) into a private temporary directory that is
removed as soon as that arm is scored (one converted copy on disk at a time); `bf16`
(with a source) is the unquantized original with dense Linears. Each is scored by
`lm_eval.simple_evaluate(model="requant", ..., log_samples=True)` on the same tasks, and
the per-document samples of every perplexity task (loglikelihood_rolling: word and byte
counts) go to the paired bootstrap (requant.eval.bootstrap) against native. Other lm-eval
tasks pass through: their aggregate metrics are recorded per arm, without intervals.

Everything that can be refused is checked before any model is loaded: arm names, the
backend, CKPT (opened and validated by requant.checkpoint), the source directory (a bf16
Qwen3: config.json without quantization_config, Qwen3 fields, bf16 Linear weights, the
same vocabulary and tokenizer as CKPT) and the task names. Refusals are UsageError
(or CheckpointError), one line each.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np

from requant import DEFAULT_CHECKPOINT, kernels
from requant.backends import check_runnable
from requant.checkpoint import check_qwen3, open_checkpoint
from requant.convert import convert, file_states
from requant.errors import UsageError
from requant.eval.bootstrap import Docs, paired_bootstrap
from requant.eval.task import HELDOUT_TASK, task_manager
from requant.evidence.identity import bytes_to_hash, checkpoint_identity
from requant.io import leftovers, snapshot
from requant.io.safetensors_io import read_header
from requant.models.qwen3_moe import arch_of
from requant.models.tokenizer import load_tokenizer
from requant.runtime import ENGINES
from requant.scales.arms import ARMS, SERVABLE

NATIVE, BF16 = "native", "bf16"
PPL_KEYS = ("word_perplexity", "byte_perplexity")


def known_arms() -> list[str]:
    return [NATIVE] + [a for a in ARMS]


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if not arms:
        raise UsageError("--arms is empty")
    for a in arms:
        if a not in known_arms():
            raise UsageError(f"unknown arm {a!r}; known: {', '.join(known_arms())}")
    if len(set(arms)) != len(arms):
        raise UsageError(f"--arms names an arm twice: {text}")
    if NATIVE not in arms:
        arms = [NATIVE] + arms  # every delta is against native
    return arms


def check_backend(name: str, act_name: str = "reference") -> None:
    if name not in kernels.scaled_mm_backends():
        raise UsageError(f"unknown backend {name!r}; known: {', '.join(kernels.scaled_mm_backends())}")
    acts = kernels.quantize_backends()
    if act_name not in acts:
        raise UsageError(f"unknown act backend {act_name!r}; known: {', '.join(acts)}")


def _bf16_tensors(path: Path) -> dict[str, str]:
    """{tensor name: safetensors dtype} of a plain checkpoint directory (headers only)."""

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise UsageError(f"{index}: not a shard index with a weight_map") from None
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UsageError(f"--source {path}: no model.safetensors or model.safetensors.index.json")
    out = {}
    for f in files:
        if "/" in f or not f.endswith(".safetensors") or not (path / f).is_file():
            raise UsageError(f"--source {path}: shard {f!r} is missing or not a plain file name")
        for name, info in read_header(path / f).tensors.items():
            out[name] = info.dtype
    return out


def check_source(source: Path, ckpt_config: dict) -> None:
    """Refuse a --source that is not a bf16 Qwen3 (dense or MoE) with CKPT's vocabulary."""

    source = Path(source)
    cfg_path = source / "config.json"
    if not source.is_dir():
        raise UsageError(f"--source {source}: not a directory")
    if not cfg_path.is_file():
        raise UsageError(f"--source {source}: no config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"{cfg_path}: not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path}: not a JSON object")
    if "quantization_config" in cfg:
        raise UsageError(f"{cfg_path}: has a quantization_config; --source is the unquantized bf16 original")

    check_qwen3(cfg, cfg_path)
    try:
        arch = arch_of(cfg)  # a Qwen3-MoE source: its experts and routers too
    except ValueError as exc:
        raise UsageError(f"{cfg_path}: {exc}") from None
    if int(cfg["vocab_size"]) != int(ckpt_config.get("vocab_size", -1)):
        raise UsageError(
            f"{cfg_path}: vocab_size {cfg['vocab_size']} differs from the checkpoint's {ckpt_config.get('vocab_size')}"
        )
    tensors = _bf16_tensors(source)
    for name in arch.linear_shapes():
        dt = tensors.get(name + ".weight")
        if dt is None:
            raise UsageError(f"--source {source}: no tensor {name + '.weight'!r}")
        if dt != "BF16":
            raise UsageError(f"--source {source}: tensor {name + '.weight'!r} is {dt}, not BF16")


def tokenizer_files(path: Path) -> dict[str, bytes]:
    return {n: (Path(path) / n).read_bytes() for n in ("tokenizer.json",) if (Path(path) / n).is_file()}


def _quiet_git_hash() -> str | None:
    """lm-eval's git hash of the working directory, without git's "fatal: not a git repository"
    on stderr when there is none (requant records its own commit: requant.evidence.buildinfo)."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


@contextmanager
def quiet_lm_eval():
    """lm-eval logs at INFO/WARNING (e.g. a note on every custom_dataset task); the command
    shows its own progress and messages. Errors still get through. Two more of lm-eval's
    writes to stderr are silenced for the duration of the block, where its modules have them
    (other versions: left as they are): the tqdm bar of building each task's requests
    (lm_eval.api.task.tqdm; requant shows a bar over documents per arm) and git's complaint
    when the working directory is no git checkout (lm_eval.evaluator.get_git_commit_hash)."""
    import functools
    import importlib

    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    patched = []
    for modname, attr, make in (
        ("lm_eval.api.task", "tqdm", lambda f: functools.partial(f, disable=True)),
        ("lm_eval.evaluator", "get_git_commit_hash", lambda f: _quiet_git_hash),
    ):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        if callable(getattr(mod, attr, None)):
            patched.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, make(getattr(mod, attr)))
    try:
        yield
    finally:
        logger.setLevel(level)
        for mod, attr, original in reversed(patched):
            setattr(mod, attr, original)


def load_tasks(tasks: list[str]):
    """A TaskManager for these names; unknown names and tasks lm-eval cannot load are refused."""

    tm = task_manager(tasks)
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise UsageError(f"unknown task {unknown[0]!r} (neither {HELDOUT_TASK} nor an lm-eval task)")
    try:
        with quiet_lm_eval():
            tm.load(list(tasks))  # downloads / caches a Hub dataset now, before any model is loaded
    except Exception as exc:  # lm-eval and datasets raise many types; all mean "cannot load it"
        raise UsageError(
            f"task {','.join(tasks)} could not be loaded: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    return tm


def _samples_docs(samples: list[dict]) -> Docs | None:
    """Per-document (ll, words, bytes) of a perplexity task's logged samples, by doc_id."""
    if not samples or not all(k in samples[0] for k in PPL_KEYS):
        return None
    rows = sorted(samples, key=lambda s: s["doc_id"])
    ids = np.array([int(s["doc_id"]) for s in rows], dtype=np.int64)
    ll = np.array([float(s["word_perplexity"][0]) for s in rows], dtype=np.float64)
    if not np.array_equal(ll, np.array([float(s["byte_perplexity"][0]) for s in rows])):
        raise RuntimeError("word and byte perplexity samples disagree on a log-likelihood")
    return Docs(
        ll=ll,
        doc_ids=ids,
        words=np.array([int(s["word_perplexity"][1]) for s in rows], dtype=np.int64),
        nbytes=np.array([int(s["byte_perplexity"][1]) for s in rows], dtype=np.int64),
    )


def _lm_eval_values(row: dict, metrics: dict, task: str, arm: str) -> None:
    """Report lm-eval's own aggregates, after checking that the samples the bootstrap used
    reproduce them (the same sums in another order: 1e-9 relative is rounding only)."""
    for key in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        theirs = next((v for k, v in metrics.items() if k.split(",")[0] == key and isinstance(v, (int, float))), None)
        if theirs is None:
            continue
        if not math.isclose(theirs, row[key], rel_tol=1e-9):
            raise RuntimeError(
                f"{task}/{arm}: lm-eval's {key} {theirs!r} disagrees with its own samples ({row[key]!r})"
            )
        row[key] = float(theirs)


def evaluate_row(
    path: str,
    tm,
    tasks: list[str],
    *,
    backend: str,
    act_backend: str,
    device: str,
    engine: str,
    limit: int | None,
    batch_size: int,
    max_length: int | None,
    progress: Callable[[int, int], None] | None,
    passthrough_bootstrap: int,
) -> dict:
    """One simple_evaluate run: per task, aggregate metrics and (perplexity tasks) per-document samples."""
    import lm_eval

    import requant.eval.lm  # noqa: F401  (registers the "requant" model)

    model_args = {
        "pretrained": path,
        "backend": backend,
        "act_backend": act_backend,
        "device": device,
        "engine": engine,
        "batch_size": batch_size,
        "progress": progress,
    }
    if max_length is not None:
        model_args["max_length"] = max_length
    ours = all(t == HELDOUT_TASK for t in tasks)
    with quiet_lm_eval():
        res = lm_eval.simple_evaluate(
            model="requant",
            model_args=model_args,
            tasks=list(tasks),
            task_manager=tm,
            limit=limit,
            log_samples=True,
            bootstrap_iters=0 if ours else passthrough_bootstrap,
        )
    out = {"config": res["config"].get("requant", {}), "tasks": {}}
    for t in tasks:
        metrics = {k: v for k, v in res["results"].get(t, {}).items() if k not in ("name", "alias")}
        out["tasks"][t] = {"metrics": metrics, "docs": _samples_docs(res["samples"].get(t, []))}
    return out


def _identity(checkpoint, hash_progress: Callable[[int, int], None] | None, entries_out: dict) -> dict:
    """requant.evidence.identity.checkpoint_identity, reporting (bytes done, bytes total); the files'
    hashes go into entries_out (every arm's conversion reuses them)."""

    if hash_progress is None:
        return checkpoint_identity(checkpoint, entries_out=entries_out)
    total = bytes_to_hash(checkpoint)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        hash_progress(done, total)

    hash_progress(0, total)
    ident = checkpoint_identity(checkpoint, progress=advance, entries_out=entries_out)
    hash_progress(total, total)  # complete, so that the bar (and its timer) stops here, not at the end of the eval
    return ident


def run_eval(
    ckpt: str | None,
    arms: list[str],
    *,
    source: str | None = None,
    tasks: list[str] = (HELDOUT_TASK,),
    backend: str | None = None,
    act_backend: str = "reference",
    device: str | None = None,
    limit: int | None = None,
    replicates: int = 2000,
    seed: int = 0,
    batch_size: int = 4,
    max_length: int | None = None,
    progress_for: Callable[[str], Callable[[int, int], None]] | None = None,
    on_phase: Callable[[str], None] | None = None,
    passthrough_bootstrap: int = 100000,
    threads: int | None = None,
    hash_progress: Callable[[int, int], None] | None = None,
    engine: str = "auto",
) -> dict:
    """Validate, evaluate every arm (and bf16), bootstrap; return the result dict.

    After validation and before any arm runs, the checkpoint's identity (requant.evidence.identity:
    manifest digest, tool version, git commit) is computed: a SHA256SUMS that does not match
    the files stops the run there.

    Args:
        ckpt: W8A8 checkpoint directory or Hub repo id; None is the embedded default.
        arms: "native" and converter arms; native is added when missing (deltas are against it).
        source: the bf16 Qwen3 directory the checkpoint was quantized from: adds a "bf16" row.
        tasks: lm-eval task names (requant-heldout ships with requant and needs no network).
        backend, act_backend: scaled_mm and quantize_activations backends (default: triton on
            a GPU, reference-triton-order on CPU; reference).
        device: torch device (default: cuda if available).
        limit: score only the first N documents of each task.
        replicates, seed: the paired bootstrap over documents.
        batch_size, max_length: rolling windows per runtime call, and their length in tokens.
        progress_for(arm) -> update(done, total); on_phase(message); hash_progress(done, total).
        threads: torch CPU threads (see requant.commands._common.set_threads).
        engine: the runtime engine, "auto" (fast on CUDA), "fast" or "reference" (requant.runtime).

    Raises:
        UsageError for a bad request, CheckpointError for a bad checkpoint.
    """
    import importlib.metadata

    from requant.eval.lm import default_backend, default_device

    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    say = on_phase or (lambda msg: None)
    arms = list(arms)
    for a in arms:
        if a not in known_arms():
            raise UsageError(f"unknown arm {a!r}; known: {', '.join(known_arms())}")
    if NATIVE not in arms:
        arms = [NATIVE] + arms
    tasks = list(tasks)
    if not tasks:
        raise UsageError("--tasks is empty")
    if limit is not None and limit < 1:
        raise UsageError("--limit must be at least 1")
    if replicates < 1:
        raise UsageError("--bootstrap must be at least 1")
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    dev = device or default_device()
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {dev}: no CUDA device here")
    be = backend or default_backend(dev)
    check_backend(be, act_backend)

    check_runnable((be,), dev, act_backend, option="--backend")
    if not dev.startswith("cuda"):
        if be == "cutlass":
            raise UsageError(
                "the cutlass backend needs a CUDA GPU (sm90); on CPU use reference-triton-order or reference-cutlass-order"
            )
        if "triton" in (be, act_backend) and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise UsageError(
                "the triton backend on CPU needs TRITON_INTERPRET=1 (Triton's interpreter, slow); "
                "the CPU default is reference-triton-order, the same bits"
            )
    # On CPU one torch thread by default, as the audit: the runtime's tensors are small and,
    # measured on a loaded 2-core machine, intra-op threads spinning against other work made
    # a micro-model evaluation 3x slower (24 s vs 7 s of model time).
    n_threads = threads if threads is not None else (1 if dev == "cpu" else 0)
    if n_threads < 0:
        raise UsageError("--threads must be >= 0")
    src = str(DEFAULT_CHECKPOINT if ckpt is None else ckpt)
    checkpoint = open_checkpoint(src)  # CheckpointError: missing or invalid

    load_tokenizer(
        checkpoint.path, int(checkpoint.config["vocab_size"])
    )  # TokenizerError before any work: no silent byte ids
    if source is not None:
        check_source(Path(source), checkpoint.config)
        if tokenizer_files(Path(source)) != tokenizer_files(checkpoint.path):
            raise UsageError(
                f"--source {source}: its tokenizer.json differs from the checkpoint's (perplexities would not be comparable)"
            )
    positions = int(checkpoint.config.get("max_position_embeddings") or 2048)
    if max_length is not None and not 1 <= max_length <= positions:
        raise UsageError(f"--max-length must be between 1 and the model's {positions} positions")
    say("resolving tasks " + ",".join(tasks))
    tm = load_tasks(tasks)
    src_entries: dict = {}

    src_states = file_states(checkpoint)  # before the hashing: convert refuses a source changed since
    identity = _identity(checkpoint, hash_progress, src_entries)
    if n_threads:
        import torch

        torch.set_num_threads(n_threads)

    rows = arms + ([BF16] if source is not None else [])
    results: dict[str, dict] = {}
    walls: dict[str, float] = {}
    tmp_root = leftovers.eval_dir()  # $TMPDIR/requant-eval-PID-*: a dead eval's are swept first
    try:
        for name in rows:
            t0 = time.perf_counter()
            if name == NATIVE:
                path = str(checkpoint.path)
            elif name == BF16:
                path = str(source)
            else:
                say(f"converting {name}")
                path = str(tmp_root / name)
                convert(
                    str(checkpoint.path), path, name, src_entries=src_entries, src_states=src_states
                )  # hashed once, above
            say(f"evaluating {name}")
            # the fast engine runs W8A8 layers only: the bf16 row takes the reference engine unless told "reference"
            row_engine = engine if name != BF16 or engine == "reference" else "auto"
            results[name] = evaluate_row(
                path,
                tm,
                tasks,
                backend=be,
                act_backend=act_backend,
                device=dev,
                engine=row_engine,
                limit=limit,
                batch_size=batch_size,
                max_length=max_length,
                progress=progress_for(name) if progress_for else None,
                passthrough_bootstrap=passthrough_bootstrap,
            )
            if name not in (NATIVE, BF16):
                shutil.rmtree(path, ignore_errors=True)
                snapshot.unpin_under(path)  # read, then removed by this run: not an input that changed
            walls[name] = round(time.perf_counter() - t0, 3)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)

    per_task = {}
    for t in tasks:
        docs = {name: results[name]["tasks"][t]["docs"] for name in rows}
        entry: dict = {"metrics": {name: results[name]["tasks"][t]["metrics"] for name in rows}}
        if all(d is not None for d in docs.values()):
            entry.update(paired_bootstrap(docs, NATIVE, replicates, seed))
            for name in rows:
                _lm_eval_values(entry["arms"][name], entry["metrics"][name], t, name)
            base = docs[NATIVE]
            entry["per_document"] = [
                {
                    "doc_id": int(i),
                    "words": int(base.words[k]),
                    "bytes": int(base.nbytes[k]),
                    "loglikelihood": {name: float(docs[name].ll[k]) for name in rows},
                }
                for k, i in enumerate(base.doc_ids)
            ]
        per_task[t] = entry
    primary = next((t for t in tasks if "arms" in per_task[t]), None)
    cfg = results[NATIVE]["config"]

    result = {
        "tool": "requant eval",
        "checkpoint": str(checkpoint.path),
        **identity,  # manifest, manifest_digest (of the native checkpoint), tool_version, git_commit
        "lm_eval_version": importlib.metadata.version("lm_eval"),
        "source": None if source is None else str(source),
        "tasks": tasks,
        "primary_task": primary,
        "limit": limit,
        "backend": be,
        "act_backend": act_backend,
        "device": dev,
        "engine": cfg.get("engine"),
        "max_length": cfg.get("max_length"),
        "prefix_token_id": cfg.get("prefix_token_id"),
        "batch_size": batch_size,
        "threads": n_threads or None,
        "tokenizer": cfg.get("tokenizer"),
        "arm_order": rows,
        "servable": {name: (True if name in (NATIVE, BF16) else bool(SERVABLE.get(name, False))) for name in rows},
        "wall_seconds": walls,
        "bootstrap": {"replicates": replicates, "seed": seed, "level": 0.9, "unit": "document"},
        "arms": per_task[primary]["arms"] if primary else {},
        "documents": per_task[primary]["documents"] if primary else None,
        "decomposition": per_task[primary]["decomposition"] if primary else {"probe_mismatch_share": None},
        "per_task": per_task,
        "warnings": [],
    }
    n_docs = result["documents"]
    if n_docs is not None and n_docs < 2:  # every replicate resamples the one document: [x, x] says nothing
        result["warnings"].append(
            f"{n_docs} document{'s' if n_docs != 1 else ''} scored (--limit {limit}): the 90% "
            "intervals are degenerate (a bootstrap over documents needs several); use a larger "
            "--limit, or none, for an interval that means something"
        )
    return result
