"""`requant push` against a loopback Hub (tests/hubserver.py, a real HTTP server on 127.0.0.1),
driven through the installed huggingface_hub exactly as a user's push would be.

Independent references: the bytes the server received (decoded from the commit's NDJSON by
the server, compared with the files on disk), huggingface_hub.ModelCard parsing the README
the server holds, hashlib over the local files for the dry run's listing, and the server's
request log for "contacts nothing"."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from typer.testing import CliRunner

from requant import DEFAULT_CHECKPOINT
from requant.cli import app
from requant.evidence import manifest as mf
from tests.conftest import TOKEN, point_hub_library_at
from tests.hubserver import FakeHub

from ..conftest import tree_bytes

runner = CliRunner()
REPO = "requant-test/tiny-pow2"


def _push(ckpt, *args, repo=REPO):
    return runner.invoke(app, ["push", str(ckpt), repo, *args])


def _no_leak(res, *more: str):
    for text in (res.stdout, res.stderr, *more):
        assert TOKEN not in text


def _error_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]


def test_push_uploads_exactly_these_bytes(hub, pow2_copy):
    before = tree_bytes(pow2_copy)
    res = _push(pow2_copy)
    assert res.exit_code == 0, res.output
    commit = hub.repos[REPO].branches["main"]
    assert res.stdout.strip() == f"{hub.url}/{REPO}/commit/{commit}"
    got = hub.files(REPO)
    local = tree_bytes(pow2_copy)
    # every local file went up byte for byte; the card was written locally only now, in place
    # of the source's README that convert copied (whose license it carries)
    assert set(local) == set(before) and local["README.md"] != before["README.md"]
    assert {k: v for k, v in local.items() if k != "README.md"} == {k: v for k, v in before.items() if k != "README.md"}
    assert {"SHA256SUMS", "SHA256SUMS.source", "requant-convert.json", "requant-audit.json"} <= set(got)
    assert {k: v for k, v in got.items() if k != ".gitattributes"} == local
    # the manifest lists every file but the evidence about them (its documented rule), by hashlib
    evidence = {"SHA256SUMS", "README.md", "requant-convert.json", "requant-audit.json"}
    listed = sorted(set(local) - evidence)
    assert {"SHA256SUMS.source", "config.json", "model.safetensors"} <= set(listed)
    assert mf.parse(got["SHA256SUMS"]) == {rel: hashlib.sha256(local[rel]).hexdigest() for rel in listed}
    card = ModelCard(got["README.md"].decode())
    assert card.data.to_dict() == {
        "license": "apache-2.0",
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        # no deterministic: the fixture's audit is by the reference emulations
        "tags": ["int8", "w8a8", "compressed-tensors", "requant", "power-of-two-scales"],
    }
    assert f"vllm serve {REPO}" in card.text
    # the token went to the Hub, as a Bearer credential on every write, and nowhere else
    writes = [(m, p, a) for m, p, a in hub.requests if m == "POST"]
    assert writes and all(a == f"Bearer {TOKEN}" for _, _, a in writes)
    _no_leak(res, *(v.decode("utf-8", "replace") for v in got.values()))


def test_close_the_loop(hub, pow2_copy, tmp_path):
    """What was pushed, served back: `requant audit REPO --plan` reads it and `requant convert
    REPO --arm unconstrained` reproduces the pushed files byte for byte (README, LICENSE and the
    manifest included: open_checkpoint keeps them; .gitattributes is the Hub's own)."""
    (pow2_copy / "LICENSE").write_text("Apache License\nVersion 2.0\n")
    (pow2_copy / "generation_config.json").write_text('{"do_sample": false}\n')
    mf.write(pow2_copy)
    assert _push(pow2_copy, "--force").exit_code == 0  # --force: LICENSE is new, so the audit is of other bytes
    pushed = {k: v for k, v in hub.files(REPO).items() if k != ".gitattributes"}
    assert {"LICENSE", "README.md", "SHA256SUMS", "generation_config.json"} <= set(pushed)
    res = runner.invoke(app, ["audit", REPO, "--plan", "--json", str(tmp_path / "plan.json")])
    assert res.exit_code == 0, res.output
    from requant.audit.suite import plan_from_config

    local_plan = plan_from_config(json.loads((pow2_copy / "config.json").read_text()))
    assert json.loads((tmp_path / "plan.json").read_text())["cells"] == local_plan["cells"] > 0
    out = tmp_path / "back"
    res = runner.invoke(app, ["convert", REPO, "--arm", "unconstrained", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert tree_bytes(out) == pushed
    assert runner.invoke(app, ["manifest", str(out)]).exit_code == 0


def test_dry_run_contacts_nothing_and_writes_nothing(hub, pow2_copy):
    before = tree_bytes(pow2_copy)
    res = _push(pow2_copy, "--dry-run")
    assert res.exit_code == 0, res.output
    assert hub.requests == [] and tree_bytes(pow2_copy) == before
    for rel, data in before.items():
        if rel == "README.md":  # the source's README (copied by convert) is not what would go up
            assert hashlib.sha256(data).hexdigest() not in res.stdout
            continue
        assert rel in res.stdout and f"{len(data):,}" in res.stdout and hashlib.sha256(data).hexdigest() in res.stdout
    assert "README.md" in res.stdout and "card rendered now" in res.stdout
    assert "nothing was contacted" in res.stdout


def _tamper_audit(ckpt, **changes):
    p = ckpt / "requant-audit.json"
    d = json.loads(p.read_text())
    for dotted, value in changes.items():
        cur = d
        *path, last = dotted.split(".")
        for part in path:
            cur = cur[part]
        cur[last] = value
    p.write_text(json.dumps(d))


@pytest.mark.parametrize(
    "case, expect",
    [
        ("no audit", "no audit report"),
        ("other bytes", "not an audit of these bytes"),
        ("false positive", "1 false positives"),
        ("unpinned", "unpinned prediction matrix"),
        ("pow2 layer differs", "pow2 layers are bitwise equal"),
        ("kernel fault", "a kernel breaks its declared order in 3 layers"),  # not scored as false positives
    ],
)
def test_refusals_without_force(hub, pow2_copy, case, expect):
    ck = pow2_copy
    if case == "no audit":
        (ck / "requant-audit.json").unlink()
    elif case == "other bytes":
        _tamper_audit(ck, manifest_digest="sha256:" + "0" * 64)
    elif case == "false positive":
        _tamper_audit(ck, **{"scorecard.false_positives": 1})
    elif case == "unpinned":
        _tamper_audit(ck, **{"scorecard.matrix_pinned": False})
    elif case == "kernel fault":
        _tamper_audit(ck, **{"scorecard.kernel_faults": 3, "verdict": "audit failed: kernel m:k is faulty"})
    else:
        layers = json.loads((ck / "requant-audit.json").read_text())["per_layer_summary"]["pow2"]["layers"]
        _tamper_audit(ck, **{"per_layer_summary.pow2.bitwise_equal": layers - 1})
        expect = f"only {layers - 1}/{layers} pow2 layers"
    before = tree_bytes(ck)
    res = _push(ck)
    assert res.exit_code == 1 and expect in res.stderr and "--force overrides" in res.stderr, res.output
    assert len(_error_lines(res)) == 1 and "Traceback" not in res.output
    assert hub.requests == [] and tree_bytes(ck) == before
    if case == "false positive":  # --force overrides, and says so
        res = _push(ck, "--force")
        assert res.exit_code == 0 and "--force: pushing although" in res.stderr
        assert hub.files(REPO)["requant-audit.json"] == before["requant-audit.json"]
        assert (
            "deterministic" not in ModelCard(hub.files(REPO)["README.md"].decode()).data.tags
        )  # no claim without evidence


def test_broken_audit_report_is_never_overridden(hub, tmp_path):
    """An audit report with this checkpoint's digest but none of an audit's keys: an error
    naming the file and the key, with or without --force."""
    import shutil

    ck = tmp_path / "native"
    shutil.copytree(DEFAULT_CHECKPOINT, ck)
    audit = {"manifest_digest": mf.identity(ck)["manifest_digest"]}
    (ck / "requant-audit.json").write_text(json.dumps(audit))
    res = _push(ck)
    assert res.exit_code == 2 and "requant-audit.json" in res.stderr and "missing key" in res.stderr  # not a real audit
    res = _push(ck, "--force", "--dry-run")
    assert res.exit_code == 2  # a broken report is never overridden


def test_non_pow2_scales_refused(hub, pow2_copy):
    ck = pow2_copy
    from safetensors.torch import load_file, save_file

    t = load_file(str(ck / "model.safetensors"))
    name = next(k for k in t if k.endswith("weight_scale"))
    t[name] = t[name] * 1.5
    save_file(t, str(ck / "model.safetensors"), metadata={"format": "pt"})
    res = _push(ck)
    assert res.exit_code == 2 and "model.safetensors differs" in res.stderr  # first, the manifest
    _, digest = mf.write(ck)
    _tamper_audit(ck, manifest_digest=digest)  # isolate the scale rule
    res = _push(ck)
    assert res.exit_code == 1 and "weight scales are powers of two" in res.stderr and hub.requests == []


def test_probe_is_never_pushed(hub, tmp_path):
    from requant.convert import convert

    ck = tmp_path / "probe"
    convert(DEFAULT_CHECKPOINT, ck, "probe")
    for args in ([], ["--force"], ["--force", "--dry-run"]):
        res = _push(ck, *args)
        assert res.exit_code == 1 and "not servable" in res.stderr and "--force included" in res.stderr
    assert hub.requests == []


def test_manifest_mismatch_refused(hub, pow2_copy):
    (pow2_copy / "config.json").write_bytes((pow2_copy / "config.json").read_bytes() + b" ")
    res = _push(pow2_copy, "--force")
    assert res.exit_code == 2 and "config.json differs" in res.stderr and hub.requests == []


@pytest.mark.parametrize("repo", ["noslash", "a/b/c", "bad name/x", "ab/-y", "x/", "a/b..c"])
def test_bad_repo_ids(hub, pow2_copy, repo):
    res = _push(pow2_copy, repo=repo)
    assert res.exit_code == 2 and len(_error_lines(res)) == 1 and "repo id" in res.stderr, res.output
    assert hub.requests == []


@pytest.mark.parametrize(
    "method, kind, status, expect",
    [
        ("POST", "commit", 500, "the Hub answered 500"),
        ("POST", "create", 401, "rejected the credentials (401)"),
        ("POST", "create", 403, "no write access"),
        ("POST", "commit", 409, "conflict (409)"),
    ],
)
def test_failed_upload_changes_nothing_local(hub, pow2_copy, method, kind, status, expect):
    """The server echoes the request's Authorization header in its error message (as a careless
    server might): the token must still not appear."""
    hub.fail(method, kind, status, "injected", echo_auth=True)
    before = tree_bytes(pow2_copy)
    res = _push(pow2_copy)
    assert res.exit_code == 2 and expect in res.stderr, res.output
    assert len(_error_lines(res)) == 1 and "Traceback" not in res.output
    assert tree_bytes(pow2_copy) == before  # no card, no manifest written
    assert f"Bearer {TOKEN}" in [a for _, _, a in hub.requests]  # the token was sent...
    _no_leak(res)  # ...and is not shown
    if kind == "commit":
        assert hub.files(REPO).keys() == {".gitattributes"}  # the repo exists, nothing was committed


def test_network_failure(pow2_copy, tmp_path, monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    point_hub_library_at(
        monkeypatch, {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "home"), "HF_TOKEN": TOKEN}
    )
    before = tree_bytes(pow2_copy)
    res = _push(pow2_copy)
    assert res.exit_code == 2 and "could not reach the Hub" in res.stderr and len(_error_lines(res)) == 1, res.output
    assert tree_bytes(pow2_copy) == before
    _no_leak(res)


def test_no_token(hub, pow2_copy, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    res = _push(pow2_copy)
    assert res.exit_code == 2 and "no Hugging Face token" in res.stderr and hub.requests == []


def test_revision_branch_and_private(hub, pow2_copy):
    res = _push(pow2_copy, "--revision", "pow2", "--private", "--commit-message", "my message")
    assert res.exit_code == 0, res.output
    repo = hub.repos[REPO]
    assert repo.private and set(repo.branches) == {"main", "pow2"}
    assert hub.files(REPO, "main").keys() == {".gitattributes"}
    assert "model.safetensors" in hub.files(REPO, "pow2")
    assert repo.commits[repo.branches["pow2"]].message == "my message"
    # pushing again to an existing repo and branch: create_repo answers 409 (exist_ok), no error
    res = _push(pow2_copy, "--revision", "pow2")
    assert res.exit_code == 0, res.output


def test_push_from_a_shell(pow2_copy, tmp_path):
    """The user's path, in a separate process: only HF_ENDPOINT, HF_HOME and HF_TOKEN set."""
    hub = FakeHub(token=TOKEN).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        root = str(Path(__file__).resolve().parents[3])  # this checkout, as PYTHONPATH=$PWD gives it
        env.update(
            HF_ENDPOINT=hub.url,
            HF_HOME=str(tmp_path / "home"),
            HF_TOKEN=TOKEN,
            PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p),
        )
        res = subprocess.run(
            [sys.executable, "-m", "requant.cli", "push", str(pow2_copy), REPO],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().startswith(f"{hub.url}/{REPO}/commit/")
        assert TOKEN not in res.stdout + res.stderr
        assert hub.files(REPO)["model.safetensors"] == (pow2_copy / "model.safetensors").read_bytes()
        assert not (tmp_path / "home").joinpath("token").exists()  # nothing stored
    finally:
        hub.stop()


def test_card_policy(hub, pow2_copy):
    """The source's README (copied by convert) is replaced by a card that carries its license; a
    current card, hand edits included, goes up as is; a card for another repo is re-rendered."""
    ck = pow2_copy
    (ck / "README.md").write_text("---\nlicense: mit\n---\n# The source model\n")
    assert _push(ck).exit_code == 0
    up = hub.files(REPO)["README.md"]
    assert ModelCard(up.decode()).data.license == "mit" and b"The source model" not in up
    assert (ck / "README.md").read_bytes() == up
    (ck / "README.md").write_bytes(up + b"\nA note by hand.\n")
    res = _push(ck)
    assert res.exit_code == 0 and "rendered now" not in res.stderr
    assert hub.files(REPO)["README.md"].endswith(b"A note by hand.\n")
    res = _push(ck, repo="requant-test/other")
    assert res.exit_code == 0 and "rendered for requant-test/tiny-pow2" in res.stderr
    other = hub.files("requant-test/other")["README.md"]
    assert b"A note by hand." not in other and b"vllm serve requant-test/other" in other


def test_missing_manifest_is_computed_and_written_after_the_push(hub, pow2_copy):
    """Without SHA256SUMS the digest is the same (it is defined by the files), so the audit still
    matches; the manifest goes up and is written locally only after the commit. Reference: the
    SHA256SUMS that convert wrote."""
    written = (pow2_copy / "SHA256SUMS").read_bytes()
    (pow2_copy / "SHA256SUMS").unlink()
    res = _push(pow2_copy)
    assert res.exit_code == 0, res.output
    assert hub.files(REPO)["SHA256SUMS"] == written == (pow2_copy / "SHA256SUMS").read_bytes()


def test_push_uploads_the_real_reports(hub, micro_reported, tmp_path):
    """The reports of `requant eval` and `requant determinism` (conftest.micro_reported) go up
    byte for byte beside the card that quotes them (--force: the micro conversion has no
    audit). Reference: the bytes the server received against the local files."""
    import shutil

    ck = tmp_path / "pow2"
    shutil.copytree(micro_reported, ck)
    res = _push(ck, "--force")
    assert res.exit_code == 0, res.output
    got = hub.files(REPO)
    for name in ("requant-eval.json", "requant-determinism.json"):
        assert got[name] == (ck / name).read_bytes()
        assert json.loads(got[name])["manifest_digest"] in got["README.md"].decode()
    assert "requant-audit.json" not in got
    _no_leak(res)
