"""Values that cannot fit are refused before any work: one `error:` line naming the option and the
limit, exit 2 (requant/commands/_limits.py); the manifest hashing starts a bounded number of threads and
hashes serially when none can be started.

Real CLI runs (CliRunner) on the embedded default (2,048 positions, 6 layers, 2 KV heads of 64,
vocabulary 8192). Where the limit is the memory available, the machine's free memory is set
(monkeypatch of requant.commands._limits.available_bytes) so the refusal does not depend on the host; the
KV cache a batch needs is computed here from config.json as the reference. The manifest's
reference is hashlib over each file.
"""

import hashlib
import json
import threading

import pytest

from requant import DEFAULT_CHECKPOINT
from requant.commands import _limits as limits
from requant.evidence import manifest
from tests.requant.commands.cli import invoke, refused

AUDIT = ["audit", "--prompts", "1"]
CONFIG = json.loads((DEFAULT_CHECKPOINT / "config.json").read_text())


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "r.jsonl"
    res = invoke("generate", "--prompt", "It is a truth", "--max-new-tokens", 2, "--no-eos", "--json", out)
    assert res.exit_code == 0, res.output
    return out


def _kv_bytes(batch: int, positions: int) -> int:
    cap = 1 << (positions - 1).bit_length()
    c = CONFIG
    return 2 * c["num_hidden_layers"] * batch * c["num_key_value_heads"] * cap * c["head_dim"] * 2


def test_replay_batch_with_1000000_refused_before_work(record, monkeypatch):
    # 1,000,001 sequences: the KV cache alone is more than the 1 GiB this test leaves free
    assert _kv_bytes(1_000_001, 3 + 2) > 1 << 30
    monkeypatch.setattr(limits, "available_bytes", lambda device: 1 << 30)
    refused(invoke("replay", record, "--batch-with", 1_000_000), "--batch-with 1000000", "GiB", "available")


def test_replay_batch_with_2_70_refused(record):
    refused(invoke("replay", record, "--batch-with", 2**70), f"--batch-with {2**70}", "1,048,576")


def test_audit_decode_batches_2_70_refused():
    refused(invoke(*AUDIT, "--decode-batches", 2**70), "--decode-batches", "1,048,576")


def test_audit_decode_batches_100000_refused(monkeypatch):
    assert _kv_bytes(100_000, 17 + 4) > 1 << 30
    monkeypatch.setattr(limits, "available_bytes", lambda device: 1 << 30)
    refused(invoke(*AUDIT, "--decode-batches", 100_000), "--decode-batches 100000", "GiB")


@pytest.mark.parametrize("n", [3000, 100_000])
def test_audit_decode_tokens_past_the_models_positions(n):
    refused(invoke(*AUDIT, "--decode-tokens", n), f"--decode-tokens {n}", "2,048", "max_position_embeddings")


def test_audit_injection_tokens_100000_refused():
    res = invoke(*AUDIT, "--phases", "prefill", "--injection", "--injection-tokens", 100_000)
    refused(res, "--injection-tokens 100000", "2,048")


def test_generate_max_new_tokens_past_the_models_positions():
    refused(invoke("generate", "--prompt", "hi", "--max-new-tokens", 3000), "--max-new-tokens 3000", "2048")


@pytest.mark.parametrize("cmd", [["generate", "--prompt", "hi"], AUDIT, ["determinism", "--prompts", "1"]])
def test_threads_100000_refused(cmd):
    refused(invoke(*cmd, "--threads", 100_000), "--threads 100000", f"at most {limits.max_threads()}")


# -- manifest hashing -----------------------------------------------------------------------------
def _files(tmp_path, n=6):
    for i in range(n):
        (tmp_path / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    return {f"f{i}.bin": hashlib.sha256(bytes([i]) * (1000 + i)).hexdigest() for i in range(n)}


def test_manifest_hashing_starts_at_most_four_threads(tmp_path, monkeypatch):
    want = _files(tmp_path, 12)
    started = []
    real = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real(self))[1])
    got = manifest.compute(tmp_path, jobs=100_000)
    assert {k: e.sha256 for k, e in got.items()} == want
    assert 0 < len([n for n in started if n.startswith("requant-sha256")]) <= 4


def test_manifest_hashing_when_no_thread_can_start(tmp_path, monkeypatch):
    want = _files(tmp_path)

    def cannot(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot)
    got = manifest.compute(tmp_path, jobs=4)
    assert {k: e.sha256 for k, e in got.items()} == want
    bg = manifest.BackgroundHashes(tmp_path, jobs=4)
    assert {k: e.sha256 for k, e in bg.result().items()} == want


@pytest.mark.parametrize(
    "exc, words",
    [
        (MemoryError(), "out of memory"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 16 GB"), "out of memory"),
        (RuntimeError("can't start new thread"), "refused to start a thread"),
    ],
)
def test_running_out_of_memory_or_threads_is_one_error_line(exc, words, capsys):
    import typer

    from requant.commands._common import cannot_run

    with pytest.raises(typer.Exit) as e:
        with cannot_run():
            raise exc
    assert e.value.exit_code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error:") and words in line


def test_another_runtime_error_keeps_its_traceback():
    from requant.commands._common import cannot_run

    with pytest.raises(RuntimeError, match="a bug"):
        with cannot_run():
            raise RuntimeError("a bug")


def test_determinism_new_tokens_past_the_models_positions():
    refused(invoke("determinism", "--prompts", 1, "--new-tokens", 2**70), "--new-tokens", "2,048")


def test_generate_more_prompts_than_one_batch_holds_refused_before_tokenizing(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_BATCH", 3)  # the cap itself is 2**20 lines; the rule is the same
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n' * 4)
    refused(invoke("generate", "--prompts", f), f"--prompts {f}", "4 prompts", "more than the 3")
