"""What the training run leaves in --out: atomic file writes, the loss plot, the environment.

Every file is written to a temporary name in the output directory and renamed into place,
so an interrupted run never leaves a truncated model.safetensors or summary.json behind.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import torch

from requant.io.output import write_bytes_atomic, write_files_atomic


def atomic_write(path: Path, write) -> None:
    """write(tmp_path) then rename to path (requant.io.output's writer: a temporary beside it with
    the permissions a plain open() gives, removed on failure)."""
    write_files_atomic([(Path(path), lambda tmp: write(str(tmp)))])


def write_json(path: Path, obj) -> None:
    """Indent 2, sorted keys, trailing newline (transformers' formatting)."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_bytes_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode("utf-8"))


def save_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    """The safetensors library's own layout, `__metadata__` {"format": "pt"}."""
    from safetensors.torch import save_file

    atomic_write(path, lambda t: save_file(state, t, metadata={"format": "pt"}))


def plot_losses(log: list[dict], path: Path, best_step: int | None) -> bool:
    """Training and validation loss against tokens seen; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tr = [(r["tokens_seen"], r["train_loss"]) for r in log if "train_loss" in r]
    va = [(r["tokens_seen"], r["val_loss"]) for r in log if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if tr:
        ax.plot(*zip(*tr), label="training batch", lw=1)
    if va:
        ax.plot(*zip(*va), "o-", label="validation (every token)", ms=3)
    best = [r for r in log if r.get("step") == best_step and "val_loss" in r]
    if best:
        ax.axvline(best[0]["tokens_seen"], color="grey", ls="--", lw=1, label="kept (best validation)")
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("cross entropy (nats / token)")
    ax.set_title("default model: training and validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda t: fig.savefig(t, format="png", dpi=110))
    plt.close(fig)
    return True


def environment(device: torch.device) -> dict:
    """Versions and the device, for the summary."""
    import safetensors
    import tokenizers
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "device": str(device),
        "torch_cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    return env
