"""The `requant` model for lm-eval: a W8A8 (or bf16) Qwen3 on requant's own runtime.

Importing this module registers it (`@register_model("requant")`):

    import lm_eval, requant.eval.lm
    from requant.eval.task import task_manager
    lm_eval.simple_evaluate(model="requant", model_args="pretrained=DIR,backend=triton",
                            tasks=["requant-heldout"], task_manager=task_manager())

model_args and the scoring (lm-eval's HF model's rules): docs/eval.md#scoring.
"""

from __future__ import annotations

from typing import Callable

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from requant import DEFAULT_CHECKPOINT
from requant.backends import default_backend
from requant.runtime import load_model

AUTO_BATCH = 8  # what batch_size=auto means here (no memory probing)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _int_arg(name: str, value, minimum: int = 1) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"model_args {name}={value!r} is not an integer") from None
    if v < minimum:
        raise ValueError(f"model_args {name}={v} must be at least {minimum}")
    return v


@register_model("requant")
class RequantLM(TemplateLM):
    def __init__(
        self,
        pretrained=None,
        backend: str | None = None,
        act_backend: str = "reference",
        regime: str = "native",
        device: str | None = None,
        engine: str = "auto",
        batch_size=1,
        max_batch_size=None,
        max_length=None,
        prefix_token_id=None,
        progress: Callable[[int, int], None] | None = None,
        **unused,
    ):
        super().__init__()
        if unused:
            raise ValueError(f"unknown model_args for the requant model: {', '.join(sorted(unused))}")

        self.pretrained = str(DEFAULT_CHECKPOINT if pretrained in (None, "") else pretrained)
        self.device_name = str(device or default_device())
        self.backend_name = backend or default_backend(self.device_name)
        self.act_backend = act_backend
        self.regime = regime
        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            self.batch_size = AUTO_BATCH
        else:
            self.batch_size = _int_arg("batch_size", batch_size)
        self.model = load_model(
            self.pretrained,
            regime=regime,
            backend=self.backend_name,
            act_backend=act_backend,
            device=self.device_name,
            engine=engine or "auto",
        )
        self.tokenizer = self.model.tokenizer
        self._max_length = int(self.model.max_length)
        if max_length not in (None, ""):
            ml = _int_arg("max_length", max_length)
            if ml > self._max_length:
                raise ValueError(f"model_args max_length={ml} exceeds the model's {self._max_length} positions")
            self._max_length = ml
        vocab = int(self.model.config["vocab_size"])
        cfg = self.model.config
        eos = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        self._eot = None if eos is None else int(eos)
        if prefix_token_id not in (None, ""):
            prefix = _int_arg("prefix_token_id", prefix_token_id, minimum=0)
        else:
            prefix = cfg.get("bos_token_id")
            prefix = self._eot if prefix is None else int(prefix)
        if prefix is None:
            raise ValueError(
                f"{self.pretrained}: config.json has no bos_token_id or eos_token_id; pass model_args prefix_token_id=N"
            )
        if not 0 <= prefix < vocab:
            raise ValueError(f"prefix token id {prefix} is outside the vocabulary (0..{vocab - 1})")
        self._prefix = prefix
        self.progress = progress
        self._device = torch.device(self.device_name)

    # -- what lm-eval asks of a TemplateLM -------------------------------------------
    @property
    def eot_token_id(self) -> int | None:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        d = self.tokenizer.describe()
        return f"{d['kind']}:{d.get('sha256') or d.get('vocab_size')}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return list(self.tokenizer.encode(string))

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens))

    def get_model_info(self) -> dict:
        """Merged into simple_evaluate's results["config"]."""
        return {
            "requant": {
                "pretrained": self.pretrained,
                "backend": self.backend_name,
                "act_backend": self.act_backend,
                "regime": self.regime,
                "device": self.device_name,
                "engine": self.model.engine,
                "max_length": self.max_length,
                "prefix_token_id": self.prefix_token_id,
                "batch_size": self.batch_size,
                "tokenizer": self.tokenizer.describe(),
            }
        }

    # -- scoring ---------------------------------------------------------------------
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(log-probability, is_greedy) of each continuation given its context, one runtime
        call per batch_size pairs."""
        out: list[tuple[float, bool]] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            inputs = []
            for ctx, cont in chunk:
                if not cont:
                    raise ValueError("an empty continuation has no log-likelihood")
                if len(cont) > self.max_length:
                    raise ValueError(
                        f"a continuation of {len(cont)} tokens does not fit in max_length={self.max_length}"
                    )
                inputs.append((list(ctx) + list(cont))[-(self.max_length + 1) :][:-1])
            logits = self.model.logits(inputs)
            for (ctx, cont), lg in zip(chunk, logits):
                rows = lg[-len(cont) :].to(torch.float32)
                target = torch.tensor(cont, dtype=torch.long, device=rows.device)
                logp = torch.log_softmax(rows, dim=-1).gather(1, target[:, None])[:, 0]
                greedy = bool(torch.equal(rows.argmax(dim=-1), target))
                out.append((float(logp.to(torch.float64).sum()), greedy))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        res = self._score([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), r in zip(requests, res):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, r)
        return res

    def rolling_windows(self, tokens: list[int]) -> list[tuple[list[int], list[int]]]:
        """lm-eval's disjoint rolling windows (context, continuation) of one document."""
        return [
            lm_utils.make_disjoint_window(w)
            for w in lm_utils.get_rolling_token_windows(
                token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1
            )
        ]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        docs = [self.rolling_windows(self.tok_encode(req.args[0])) for req in requests]
        flat = [(d, w) for d, windows in enumerate(docs) for w in windows]
        remaining = [len(w) for w in docs]
        totals = [0.0] * len(docs)
        done = sum(1 for n in remaining if n == 0)
        if self.progress is not None:
            self.progress(done, len(docs))
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start : start + self.batch_size]
            for (d, _), (ll, _) in zip(chunk, self._score([w for _, w in chunk])):
                totals[d] += ll
                remaining[d] -= 1
                if remaining[d] == 0:
                    done += 1
                    self.cache_hook.add_partial("loglikelihood_rolling", requests[d].args, totals[d])
                    if self.progress is not None:
                        self.progress(done, len(docs))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            groups: dict[tuple, list[int]] = {}
            for i, req in enumerate(chunk):
                context, kw = req.args
                kw = dict(kw or {})
                if kw.get("do_sample") or float(kw.get("temperature", 0.0) or 0.0) > 0.0:
                    raise ValueError("the requant model decodes greedily only (do_sample/temperature > 0 requested)")
                until = kw.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                max_gen = int(kw.get("max_gen_toks", 256))
                groups.setdefault((tuple(until), max_gen), []).append(i)
            texts: dict[int, str] = {}
            for (until, max_gen), idx in groups.items():
                keep = max(1, self.max_length - max_gen)
                prompts = []
                for i in idx:
                    ids = self.tok_encode(chunk[i].args[0])[-keep:]
                    prompts.append(ids if ids else [self.prefix_token_id])
                new = self.model.greedy(prompts, max_new_tokens=max_gen, eos_id=self.eot_token_id)
                for i, ids in zip(idx, new):
                    ids = list(ids)
                    if self.eot_token_id is not None and self.eot_token_id in ids:
                        ids = ids[: ids.index(self.eot_token_id)]
                    text = self.tok_decode(ids)
                    for stop in until:
                        if stop and stop in text:
                            text = text[: text.index(stop)]
                    texts[i] = text
                    self.cache_hook.add_partial("generate_until", chunk[i].args, text)
            out.extend(texts[i] for i in range(len(chunk)))
        return out
