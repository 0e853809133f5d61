"""The shipped `requant-heldout` task through lm-eval's real TaskManager, offline, from any
working directory. Independent references: the JSON lines file read directly, str.split
word counts and UTF-8 byte counts."""

import json

import pytest

from requant.eval.task import HELDOUT_FILE, HELDOUT_TASK, process_results, task_manager


def test_task_resolves_offline_from_any_directory(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)  # nothing relative to the checkout may matter
    tm = task_manager()
    assert HELDOUT_TASK in tm.all_tasks
    task = tm.load([HELDOUT_TASK])["tasks"][HELDOUT_TASK]
    assert task.OUTPUT_TYPE == "loglikelihood_rolling"
    docs = list(task.test_docs())
    want = [json.loads(line) for line in HELDOUT_FILE.read_text().splitlines()]
    assert len(docs) == 50 and [dict(d) for d in docs] == want
    assert task.doc_to_target(docs[3]) == want[3]["text"]
    assert sorted(task.aggregation()) == ["bits_per_byte", "byte_perplexity", "word_perplexity"]
    assert {p.name for p in tmp_path.iterdir()} <= {"hf-datasets-cache"}  # wrote nothing into the working directory


def test_process_results_counts_words_and_bytes():
    text = "Elinor, this eldest daughter,\nwhose advice was so effectual, possessed  a strength — of understanding"
    out = process_results({"text": text}, [-123.5])
    words, nbytes = len(text.split()), len(text.encode("utf-8"))
    assert nbytes > len(text)  # the dash is three bytes
    assert out == {
        "word_perplexity": (-123.5, words),
        "byte_perplexity": (-123.5, nbytes),
        "bits_per_byte": (-123.5, nbytes),
    }


def test_other_task_names_bring_in_lm_evals_index(monkeypatch):
    """A name that is not ours asks lm-eval for its own index as well (include_defaults)."""
    pytest.importorskip("lm_eval")
    seen = {}

    import lm_eval.tasks

    class Recorder:
        def __init__(self, include_path=None, include_defaults=True, **kw):
            seen.update(include_path=include_path, include_defaults=include_defaults)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Recorder)
    task_manager(["wikitext"])
    assert seen["include_defaults"] is True and seen["include_path"].endswith("tasks")
    task_manager([HELDOUT_TASK])
    assert seen["include_defaults"] is False
