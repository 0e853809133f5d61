"""Per-token perplexity of each arm of a `requant eval` run on requant-heldout (CPU, seconds).

    python3 -m benchmarks.token_perplexity EVAL_JSON [CKPT]

lm-eval reports word and byte perplexity only. Its rolling log-likelihood scores every token
of a document exactly once (requant/eval/lm.py), so exp(-sum ll / sum tokens) over the
per-document log-likelihoods the eval JSON keeps is the per-token perplexity, with the token
count from the checkpoint's own tokenizer (requant.models.tokenizer, what the eval's model used) on
the shipped held-out documents. CKPT defaults to the JSON's `checkpoint`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from requant.eval.heldout import DEFAULT_OUTPUT  # noqa: E402
from requant.models.tokenizer import load_tokenizer  # noqa: E402


def token_perplexity(result: dict, ckpt: Path) -> dict:
    per_doc = result["per_task"]["requant-heldout"]["per_document"]
    docs = [json.loads(line) for line in DEFAULT_OUTPUT.read_text(encoding="utf-8").splitlines()]
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(ckpt, config["vocab_size"])
    tokens = sum(len(tok.encode(docs[d["doc_id"]]["text"])) for d in per_doc)
    words = sum(d["words"] for d in per_doc)
    arms = {
        arm: math.exp(-sum(d["loglikelihood"][arm] for d in per_doc) / tokens) for arm in per_doc[0]["loglikelihood"]
    }
    return {"documents": len(per_doc), "tokens": tokens, "tokens_per_word": tokens / words, "token_perplexity": arms}


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    result = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    ckpt = Path(argv[1]) if len(argv) > 1 else ROOT / result["checkpoint"]
    out = token_perplexity(result, ckpt)
    print(f"{out['documents']} documents, {out['tokens']:,} tokens ({out['tokens_per_word']:.3f} per word)")
    for arm, ppl in out["token_perplexity"].items():
        print(f"{arm:10s} {ppl:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
