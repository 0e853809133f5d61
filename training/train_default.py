"""Train the embedded default model: a 6.8M-parameter Qwen3 on five Austen novels and the KJV.

On one GPU, from the repository root (the lead's run; well under the 150 s cap):
    PYTHONPATH=. python3 training/train_default.py --out $OUT --seed 0
On the CPU, for tests:
    PYTHONPATH=. python3 training/train_default.py --out /tmp/t --device cpu --tiny --max-steps 5

Data (training/texts.py, training/tokens.py): chapter documents of the five novels and the
KJV (Sense and Sensibility is never read into one), every 50th for validation, encoded by
the committed tokenizer into a training and a validation stream.

Model and numerics: transformers' Qwen3ForCausalLM built from training/arch.py's config and
initialised by transformers (normal(0, 0.02), unit norms) from a seeded CPU generator, so
the initial weights do not depend on the device. fp32 master weights; forward and backward
under bf16 autocast (on the CPU, for tests, plain fp32); the loss is the mean cross entropy
of fp32 logits. AdamW (betas
0.9/0.95, weight decay 0.1 on matrices and the embedding, none on norms; fused on CUDA),
gradient norm clipped at 1.0, linear warmup then cosine decay to 10% of the peak.

Schedule and stopping: the cosine's horizon is --epochs passes over the training stream
(default 5: the ~2M tokens overfit a 6.8M model within a few passes), cut to --max-steps if
given. The validation loss (every validation token, 512-token windows) is measured every
--eval-every steps and at the end; the best weights so far are kept as a bf16 copy on the
host. Training stops at the horizon, after --patience evaluations without improvement
(early stopping), or when the loop has run --max-seconds; a stop between evaluations
evaluates once more. The kept weights are then evaluated again in a pure bf16 model (the
shipped weights as they will run): `best_val_loss_bf16` in the summary.

Determinism: python, numpy and torch seeded; torch.use_deterministic_algorithms(True) with
CUBLAS_WORKSPACE_CONFIG set before CUDA starts. If some operation has no deterministic
implementation on the machine (the first step raises), the run continues in warn-only mode
and says so in the summary, with any nondeterminism warnings. The weights' sha256 is in the
summary, so two runs can be compared.

Outputs in --out (each written atomically): model.safetensors (the kept weights, bf16,
transformers' names, no lm_head.weight since it is tied), config.json, train_log.jsonl (one
JSON object per logged step: step, epoch, lr, train_loss, val_loss at evaluations,
tokens_per_s, tokens_seen, elapsed_s), summary.json, loss.png (when matplotlib imports).
Exit status: 0 done, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import os

# Before torch initialises CUDA: cuBLAS is deterministic only with a fixed workspace.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training import arch, outputs, texts, tokens  # noqa: E402
from training.tokens import UsageError  # noqa: E402
from training.train_tokenizer import TOKENIZER_SHA256  # noqa: E402

FILES = ("model.safetensors", "config.json", "train_log.jsonl", "summary.json", "loss.png")


# -- model --------------------------------------------------------------------------------
def build_model(p, seed: int):
    """Qwen3ForCausalLM from the config dict, initialised on the CPU after torch.manual_seed(seed)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**arch.config_dict(p)))  # attention: transformers' default (sdpa)
    want = p.rope_theta ** (-2 / p.head_dim)
    if abs(model.model.rotary_emb.inv_freq[1].item() - want) > 1e-6 * want:
        raise RuntimeError("transformers did not take rope_theta from the config")
    return model


def loss_of(model, batch: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, int]:
    """(summed next-token NLL, fp32 logits; number of targets) for token ids [B, T + 1]."""
    with torch.autocast(device_type=batch.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch[:, :-1]).logits
    nll = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
    )
    return nll, batch[:, 1:].numel()


@torch.no_grad()
def evaluate(model, windows: list[torch.Tensor], batch: int, autocast: bool) -> float:
    """Mean NLL per target token over every window (equal-length windows batched together)."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=windows[0].device)
    count = 0
    by_len: dict[int, list[torch.Tensor]] = {}
    for w in windows:
        by_len.setdefault(len(w), []).append(w)
    for ws in by_len.values():
        for i in range(0, len(ws), batch):
            nll, n = loss_of(model, torch.stack(ws[i : i + batch]), autocast)
            total += nll.double()
            count += n
    model.train(was_training)
    return float(total) / count


def lr_at(step: int, peak: float, warmup: int, horizon: int, min_ratio: float) -> float:
    """Step `step` (0-based): linear warmup to peak over `warmup` steps, then cosine to
    min_ratio * peak at `horizon`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, horizon - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def export_state(model) -> dict[str, torch.Tensor]:
    """transformers' tensor names, bf16, on the host; lm_head.weight left out (tied)."""
    sd = model.state_dict()
    if sd["lm_head.weight"].data_ptr() != sd["model.embed_tokens.weight"].data_ptr():
        raise RuntimeError("lm_head is not tied to the embeddings")
    return {
        k: v.detach().to(device="cpu", dtype=torch.bfloat16).clone() for k, v in sd.items() if k != "lm_head.weight"
    }


def bf16_model(p, state: dict[str, torch.Tensor], device: torch.device):
    """A pure bf16 model holding exactly the exported weights."""
    model = build_model(p, 0).to(dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if list(missing) != ["lm_head.weight"] or unexpected:
        raise RuntimeError(f"exported state does not match the model: missing {missing}, unexpected {unexpected}")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("lm_head lost its tie after loading")
    return model.to(device)


def optimizer(model, lr: float, weight_decay: float, device: torch.device):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


# -- the run ------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _progress(total: int):
    """A rich progress bar on stderr, or None where rich is not installed (the GPU machine)."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        return None, None
    prog = Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    return prog, prog.add_task("train", total=total, info="")


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a torch device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device here")
    if dev.type not in ("cuda", "cpu"):
        raise UsageError(f"--device {name!r}: only cuda and cpu are supported")
    return dev


def run(a) -> int:
    """Train as `a` says (parsed arguments). The process-wide torch settings it changes (CPU
    threads, deterministic algorithms) are restored on return, so callers in the same
    process (tests) are not affected."""
    saved = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        return _run(a)
    finally:
        torch.set_num_threads(saved[0])
        torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])


def _run(a) -> int:
    t_process = time.perf_counter()
    device = resolve_device(a.device)
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    p = arch.preset(a.tiny)
    seed_everything(a.seed)
    # bf16 autocast on CUDA. On the CPU (tests only) fp32: CPU bf16 matmuls without bf16
    # hardware ran 7x slower here. One CPU thread unless told otherwise: on the shared
    # 2-core machine, intra-op threads made small steps several times slower (as in the audit).
    autocast = device.type == "cuda"
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    elif device.type == "cpu":
        torch.set_num_threads(1)

    streams = tokens.token_streams()
    digests = {k: tokens.stream_digest(v) for k, v in streams.items()}
    digests_match = digests == tokens.STREAM_SHA256
    if not digests_match:
        print(
            f"warning: token streams differ from the pinned ones (tokenizers here: {digests}); "
            "training continues on this machine's encoding",
            file=sys.stderr,
        )
    train = torch.from_numpy(streams["train"].astype(np.int32)).to(device)
    val = torch.from_numpy(streams["val"].astype(np.int32)).to(device)
    batches = tokens.Batches(train, a.seq_len, a.batch_size, a.seed)
    windows = tokens.val_windows(val, a.seq_len, a.val_windows)
    steps_per_epoch = batches.steps_per_epoch()
    horizon = max(1, math.ceil(a.epochs * steps_per_epoch))
    if a.max_steps is not None:
        horizon = min(horizon, a.max_steps)

    model = build_model(p, a.seed).to(device)
    model.train()
    opt = optimizer(model, a.lr, a.weight_decay, device)
    n_params = sum(t.numel() for t in model.parameters())
    if n_params != arch.parameter_count(p):
        raise RuntimeError(f"model has {n_params} parameters, arch.py says {arch.parameter_count(p)}")

    mode = {"deterministic": "strict"}
    torch.use_deterministic_algorithms(True)

    def guarded(fn):
        """fn() under deterministic algorithms; if an operation has no deterministic
        implementation here, fall back to warn-only once (recorded) and run fn() again
        (every guarded fn starts from zeroed gradients and changes nothing before it fails)."""
        try:
            return fn()
        except RuntimeError as exc:
            if mode["deterministic"] != "strict" or "determinis" not in str(exc):
                raise
            mode["deterministic"] = f"warn_only ({str(exc).splitlines()[0][:300]})"
            torch.use_deterministic_algorithms(True, warn_only=True)
            return fn()

    def train_step(batch):
        opt.zero_grad(set_to_none=True)
        nll, n = loss_of(model, batch, autocast=autocast)
        (nll / n).backward()
        return nll, n

    log: list[dict] = []
    best = {"val_loss": math.inf, "step": None, "state": None}
    state = {"since_best": 0, "last_eval": None, "eval_time": 0.0}
    step, tokens_seen, stop = 0, 0, "horizon"
    prog, task = _progress(horizon)
    if prog:
        prog.start()

    def record(row: dict) -> None:
        log.append(row)
        print(json.dumps(row, sort_keys=True), flush=True)

    def validate(row: dict) -> None:
        """Evaluate the current weights into row; keep them if they are the best so far."""
        t0 = time.perf_counter()
        v = guarded(lambda: evaluate(model, windows, a.batch_size, autocast=autocast))
        state["last_eval"] = step
        if v < best["val_loss"]:
            best.update(val_loss=v, step=step, state=export_state(model))
            state["since_best"] = 0
        else:
            state["since_best"] += 1
        state["eval_time"] += time.perf_counter() - t0
        row.update(val_loss=v, best_step=best["step"])

    t_loop = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            row = {"step": 0, "epoch": 0.0, "tokens_seen": 0, "elapsed_s": 0.0}
            validate(row)  # the initial weights: a baseline (about ln 8192 = 9.01) and a first run of the eval ops
            record(row)
            t_mark, tok_mark = time.perf_counter(), 0
            while step < horizon:
                if time.perf_counter() - t_loop >= a.max_seconds:
                    stop = "max_seconds"
                    break
                lr = lr_at(step, a.lr, a.warmup_steps, horizon, a.min_lr_ratio)
                for g in opt.param_groups:
                    g["lr"] = lr
                batch = batches.next()
                nll, n = guarded(lambda: train_step(batch))
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                step += 1
                tokens_seen += n
                evaluate_now = step % a.eval_every == 0 or step == horizon
                if step % a.log_every == 0 or evaluate_now:
                    now = time.perf_counter()
                    row = {
                        "step": step,
                        "epoch": round(tokens_seen / len(train), 4),
                        "lr": lr,
                        "train_loss": nll.item() / n,
                        "tokens_seen": tokens_seen,
                        "tokens_per_s": round((tokens_seen - tok_mark) / max(now - t_mark, 1e-9)),
                        "elapsed_s": round(now - t_loop, 3),
                    }
                    if evaluate_now:
                        validate(row)
                    record(row)
                    t_mark, tok_mark = time.perf_counter(), tokens_seen
                    if prog:
                        prog.update(
                            task, completed=step, info=f"loss {row['train_loss']:.3f} best val {best['val_loss']:.3f}"
                        )
                    if evaluate_now and state["since_best"] >= a.patience:
                        stop = "early_stopping"
                        break
            if state["last_eval"] != step:  # stopped between evaluations: the last weights get a say too
                row = {"step": step, "epoch": round(tokens_seen / len(train), 4), "tokens_seen": tokens_seen}
                validate(row)
                row["elapsed_s"] = round(time.perf_counter() - t_loop, 3)
                record(row)
    finally:
        if prog:
            prog.update(task, completed=step)
            prog.stop()
    train_seconds = time.perf_counter() - t_loop
    nondet = sorted({str(w.message)[:300] for w in caught if "determinis" in str(w.message)})
    for w in caught:
        if "determinis" not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)

    kept = best["state"]
    bf16_val = guarded(lambda: evaluate(bf16_model(p, kept, device), windows, a.batch_size, autocast=False))
    outputs.save_weights(out / "model.safetensors", kept)
    outputs.write_json(out / "config.json", arch.config_dict(p))
    outputs.write_jsonl(out / "train_log.jsonl", log)
    plotted = outputs.plot_losses(log, out / "loss.png", best["step"])
    summary = {
        "best_val_loss": best["val_loss"],
        "best_val_ppl": math.exp(best["val_loss"]),
        "best_step": best["step"],
        "best_val_loss_bf16": bf16_val,
        "best_val_ppl_bf16": math.exp(bf16_val),
        "steps": step,
        "planned_steps": horizon,
        "steps_per_epoch": steps_per_epoch,
        "stop": stop,
        "tokens_seen": tokens_seen,
        "epochs_seen": tokens_seen / len(train),
        "train_seconds": round(train_seconds, 2),
        "eval_seconds": round(state["eval_time"], 2),
        "total_seconds": round(time.perf_counter() - t_process, 2),
        "mean_tokens_per_s": round(tokens_seen / max(train_seconds - state["eval_time"], 1e-9)),
        "seed": a.seed,
        "autocast_bf16": autocast,
        "deterministic": mode["deterministic"],
        "nondeterminism_warnings": nondet,
        "parameters": n_params,
        "model": "tiny" if a.tiny else "default",
        "attention": model.config._attn_implementation,
        "config": arch.config_dict(p),
        "hyperparameters": {
            k: getattr(a, k)
            for k in (
                "seq_len",
                "batch_size",
                "epochs",
                "max_steps",
                "max_seconds",
                "lr",
                "min_lr_ratio",
                "warmup_steps",
                "weight_decay",
                "eval_every",
                "patience",
                "val_windows",
            )
        },
        "data": {
            "train_tokens": int(len(train)),
            "val_tokens": int(len(val)),
            "val_windows": len(windows),
            "stream_sha256": digests,
            "stream_sha256_pinned": digests_match,
            "tokenizer_sha256": TOKENIZER_SHA256,
        },
        "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
        "files": [f for f in FILES if f != "loss.png" or plotted],
        "environment": outputs.environment(device),
    }
    outputs.write_json(out / "summary.json", summary)
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "best_val_loss",
                    "best_val_ppl",
                    "best_val_ppl_bf16",
                    "best_step",
                    "steps",
                    "stop",
                    "train_seconds",
                    "total_seconds",
                    "deterministic",
                    "weights_sha256",
                )
            }
        )
    )
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (created; its files are replaced)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="cuda (default where available) or cpu")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer, 64-wide test model")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per window (512; --tiny: 128)")
    ap.add_argument("--batch-size", type=int, default=None, help="windows per step (32; --tiny: 8)")
    ap.add_argument(
        "--epochs", type=float, default=5.0, help="planned passes over the training stream (the cosine horizon)"
    )
    ap.add_argument("--max-steps", type=int, default=None, help="step cap (shortens the cosine horizon too)")
    ap.add_argument("--max-seconds", type=float, default=150.0, help="wall-clock cap on the training loop")
    ap.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=25, help="steps between validation evaluations")
    ap.add_argument("--patience", type=int, default=6, help="evaluations without improvement before stopping")
    ap.add_argument("--log-every", type=int, default=5, help="steps between log lines")
    ap.add_argument("--val-windows", type=int, default=None, help="only the first N validation windows (--tiny: 16)")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: 1 on the CPU, unchanged on CUDA)"
    )
    a = ap.parse_args(argv)
    # --tiny is for CPU tests: test-sized batches and validation unless given explicitly
    for name, full, tiny in (("seq_len", 512, 128), ("batch_size", 32, 8), ("val_windows", None, 16)):
        if getattr(a, name) is None:
            setattr(a, name, tiny if a.tiny else full)
    for name in ("seq_len", "batch_size", "eval_every", "patience", "log_every", "warmup_steps"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.max_steps is not None and a.max_steps < 1:
        raise UsageError(f"--max-steps must be at least 1, got {a.max_steps}")
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {a.threads}")
    if a.val_windows is not None and a.val_windows < 1:
        raise UsageError(f"--val-windows must be at least 1, got {a.val_windows}")
    if not (a.epochs > 0 and a.lr > 0 and a.max_seconds > 0 and 0 <= a.min_lr_ratio <= 1 and a.weight_decay >= 0):
        raise UsageError(
            "--epochs, --lr and --max-seconds must be positive, --weight-decay >= 0, --min-lr-ratio in [0, 1]"
        )
    return a


def main(argv: list[str] | None = None) -> int:
    try:
        return run(parse_args(argv))
    except (UsageError, texts.CorpusError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
