"""The `requant-heldout` lm-eval task: Sense and Sensibility, one document per chapter.

The task is a YAML file shipped in the package (requant/eval/tasks/requant_heldout.yaml);
`task_manager()` gives lm-eval a TaskManager that indexes that folder (and, for any other
task name, lm-eval's own tasks). Its documents are the 50 chapters in
requant/data/heldout/sense-and-sensibility.jsonl (made by requant.eval.heldout), loaded by
`heldout_dataset` from the path of this installed module, in memory: no Hub access, no
datasets cache, independent of the working directory.

Metrics are lm-eval's loglikelihood_rolling ones, counted as its wikitext task counts them:
each document contributes (log-likelihood, words) and (log-likelihood, UTF-8 bytes), with
words = len(re.split(r"\\s+", text)); lm-eval aggregates
  word_perplexity = exp(-sum ll / sum words), byte_perplexity = exp(-sum ll / sum bytes),
  bits_per_byte = -sum ll / sum bytes / ln 2
over the documents. The logged samples keep those per-document pairs, which is what the
paired bootstrap in requant.eval.bootstrap resamples.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HELDOUT_TASK = "requant-heldout"
OUR_TASKS = (HELDOUT_TASK,)  # the task names defined by the YAML files in TASKS_DIR
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
HELDOUT_FILE = Path(__file__).resolve().parent.parent / "data" / "heldout" / "sense-and-sensibility.jsonl"


def heldout_docs() -> list[dict]:
    """The documents as a list of {"title", "text"} dicts, in chapter order; ValueError naming
    the file and line for one that is not an object with a non-blank "text" (an empty document
    has no words or bytes to divide by)."""
    docs = []
    with open(HELDOUT_FILE, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{HELDOUT_FILE}: line {no} is not valid JSON: {exc}") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or not doc["text"].strip():
                raise ValueError(f'{HELDOUT_FILE}: line {no}: a document needs a non-empty "text" string')
            docs.append(doc)
    return docs


def heldout_dataset(**_metadata):
    """lm-eval's custom_dataset hook: a DatasetDict with one split, "test".

    lm-eval passes the task metadata (with simple_evaluate's model_args merged in) as
    keyword arguments; none of it changes the documents."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(heldout_docs())})


def doc_to_target(doc: dict) -> str:
    return doc["text"]


def word_count(text: str) -> int:
    return len(re.split(r"\s+", text))


def process_results(doc: dict, results) -> dict:
    (loglikelihood,) = results
    words, nbytes = word_count(doc["text"]), len(doc["text"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, nbytes),
        "bits_per_byte": (loglikelihood, nbytes),
    }


def task_manager(task_names=(HELDOUT_TASK,)):
    """An lm-eval TaskManager that knows `requant-heldout`.

    lm-eval's own task index (about 14,700 YAML files; ~20 s to build on a 2-core machine)
    is included only when some requested name is not one of ours."""
    from lm_eval.tasks import TaskManager

    defaults = any(n not in OUR_TASKS for n in task_names)
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=defaults)
