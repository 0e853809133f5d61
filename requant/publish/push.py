"""`requant push CKPT REPO_ID`: upload a checkpoint with its evidence, or refuse and say why.

Refusals (checked before anything is contacted, `--dry-run` included):
  * always: the checkpoint does not validate; its SHA256SUMS does not match its files; the
    arm is not servable (probe: scales rewritten without requantizing the weights; --force
    never overrides this); REPO_ID is not a valid `owner/name` repo id; a report beside it
    is not valid JSON or lacks a key.
  * unless --force: there is no audit report for exactly these bytes (CKPT/requant-audit.json
    whose manifest_digest is this checkpoint's), or that audit was scored against a matrix
    that is not the pinned one, or has a false positive or negative, or not every pow2 layer
    is bitwise equal; or not every weight scale of the checkpoint is a power of two (pushing
    an unconverted checkpoint would publish an audit of a conversion that is not in it).

What is uploaded, and the token: docs/publishing.md#push.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from requant.evidence import manifest as mf
from requant.io import hub_client
from requant.io.output import write_bytes_atomic
from requant.publish import PublishError, PushRefused
from requant.publish.card import audit_ok, card_marker, checkpoint_facts, render
from requant.publish.reports import DEFAULT_NAMES, collect, load_report

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass
class Upload:
    path_in_repo: str
    size: int
    sha256: str
    local: Path | None  # the file to upload, or None when `data` is uploaded (generated now)
    data: bytes | None = None
    note: str = ""


@dataclass
class Plan:
    ckpt: Path
    repo_id: str
    revision: str | None
    manifest_digest: str
    arm: str | None
    files: list[Upload]
    overridden: list[str]  # refusal reasons that --force overrode
    notes: list[str] = field(default_factory=list)
    write_back: dict[str, bytes] = field(default_factory=dict)  # written into CKPT after a successful commit

    @property
    def total_bytes(self) -> int:
        return sum(u.size for u in self.files)


def check_repo_id(repo_id: str) -> None:
    """`owner/name` (the owner is explicit so that the commit URL is known before pushing)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    bad = None
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        bad = str(exc).splitlines()[0]
    if bad is None and not _REPO_ID.match(repo_id):
        bad = "expected owner/name"
    if bad is not None:
        raise PublishError(f"not a valid Hub model repo id ({bad})", file=repo_id)


def _audit_reasons(ckpt: Path, digest: str) -> list[str]:
    path = ckpt / DEFAULT_NAMES["audit"]
    if not path.is_file():
        return [f"no audit report beside the checkpoint ({path.name}: `requant audit {ckpt} --json {path}`)"]
    rep = load_report("audit", path, False, digest, None)
    if rep.tie != "this":
        got = rep.data.get("manifest_digest")
        return [
            f"{path.name} is not an audit of these bytes ("
            + ("it records no manifest digest" if got is None else f"it audited {got}, this checkpoint is {digest}")
            + ")"
        ]
    bad = audit_ok(rep.data)
    return [f"{path.name}: {bad}"] if bad else []


def plan(
    ckpt_dir: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    force: bool = False,
    progress=None,
    fault_titles: Mapping[str, str] = MappingProxyType({}),
) -> Plan:
    """Everything about a push that needs no network: refusals, the card (fault_titles: as
    card.render), the file list."""
    check_repo_id(repo_id)
    if revision is not None and (not revision or revision.startswith("refs/pr/")):
        raise PublishError("--revision must name a branch", file=revision or "''")
    facts = checkpoint_facts(ckpt_dir, progress=progress)
    ckpt = facts.path
    if not facts.servable or facts.arm == "probe":
        raise PushRefused(
            f"arm {facts.arm!r} is not servable (an ablation); requant never pushes it, --force included", file=ckpt
        )
    reasons = _audit_reasons(ckpt, facts.manifest_digest)
    if not facts.all_pow2:
        reasons.append(
            f"only {facts.pow2_channels:,} of {facts.channels:,} weight scales are powers of two "
            "(not a power-of-two checkpoint: `requant convert` it first)"
        )
    if reasons and not force:
        raise PushRefused("refusing to push: " + "; ".join(reasons) + " (--force overrides)", file=ckpt)
    out = Plan(ckpt, repo_id, revision, facts.manifest_digest, facts.arm, [], reasons if force else [])
    for e in facts.entries.values():
        out.files.append(Upload(e.path, e.size, e.sha256, ckpt / e.path))
    if facts.manifest_stored:
        data = (ckpt / mf.MANIFEST).read_bytes()
        out.files.append(Upload(mf.MANIFEST, len(data), hashlib.sha256(data).hexdigest(), ckpt / mf.MANIFEST))
    else:
        data = mf.render(facts.entries)
        out.files.append(Upload(mf.MANIFEST, len(data), hashlib.sha256(data).hexdigest(), None, data, "computed now"))
        out.write_back[mf.MANIFEST] = data
    readme = ckpt / mf.CARD
    existing = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else None
    marker = card_marker(existing) if existing is not None else None
    if marker == (facts.manifest_digest, repo_id):
        data = readme.read_bytes()
        out.files.append(Upload(mf.CARD, len(data), hashlib.sha256(data).hexdigest(), readme))
    else:
        why = (
            "missing"
            if existing is None
            else "not a requant card (the source's README?)"
            if marker is None
            else "a requant card for other bytes"
            if marker[0] != facts.manifest_digest
            else f"a requant card rendered for {marker[1] or 'no repo id'}"
        )
        card = render(ckpt, repo_id=repo_id, facts=facts, fault_titles=fault_titles)
        out.notes += card.warnings
        out.notes.append(f"README.md {why}: the card was rendered now")
        data = card.text.encode("utf-8")
        out.files.append(Upload(mf.CARD, len(data), hashlib.sha256(data).hexdigest(), None, data, "card rendered now"))
        out.write_back[mf.CARD] = data
    reports = collect(ckpt, {}, facts.manifest_digest, facts.source_digest)
    out.notes += [w.replace("; its section says not measured", "; not uploaded") for w in reports.warnings]
    for kind, rep in reports.found.items():
        if rep.path.parent.resolve() == ckpt.resolve():
            sha, size = mf.file_sha256(rep.path)
            out.files.append(Upload(rep.path.name, size, sha, rep.path, note=f"{kind} report"))
    out.files.sort(key=lambda u: u.path_in_repo.encode("utf-8"))
    return out


# -- talking to the Hub ----------------------------------------------------------------------
def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network failures as each huggingface_hub generation raises them (httpx in 1.x, httpx2
    in 2.x, requests before 1.0), plus OSError."""
    errs: list[type[BaseException]] = [OSError]
    for mod, name in (("httpx", "TransportError"), ("httpx2", "TransportError"), ("requests", "RequestException")):
        try:
            errs.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def scrub(text: str, token: str | None) -> str:
    """The text with the token (and any 'Bearer ...' credential) replaced by ***."""
    if token:
        text = text.replace(token, "***")
    # a credential is one run of token characters: stop at the punctuation that follows it, so that
    # the scrub never swallows the separator before requant's own hint
    return re.sub(r"(?i)(bearer\s+)[^\s'\";,()\[\]{}]+", r"\1***", text)


def _hub_message(exc: BaseException, repo_id: str, endpoint: str) -> str:
    from huggingface_hub.utils import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError):
        resp = getattr(exc, "response", None)
        status = getattr(resp, "status_code", None)
        server = (getattr(exc, "server_message", None) or "").strip().splitlines()
        detail = f" (the Hub said: {server[0]!r})" if server else ""  # quoted: its words never run into ours
        if status == 401:
            return f"the Hub rejected the credentials (401){detail}. Hint: set HF_TOKEN or run `hf auth login` with a write token"
        if status == 403:
            return f"no write access to {repo_id} (403){detail}"
        if status == 404:
            return f"not found (404){detail}"
        if status == 409:
            return f"conflict (409){detail}"
        return f"the Hub answered {status}{detail}" if status else f"the Hub request failed: {str(exc).splitlines()[0]}"
    if isinstance(exc, ValueError):
        return f"the Hub refused the upload: {' '.join(str(exc).split())}"
    late = hub_client.timed_out(exc)
    if late is not None:
        return late
    return f"could not reach the Hub at {endpoint}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(
        ": "
    )


def upload(p: Plan, *, private: bool = False, commit_message: str | None = None) -> tuple[str, str]:
    """Create the repo (exist_ok), the branch (exist_ok), and one commit. Returns (commit URL, commit oid).
    Hub failures become a PublishError with one scrubbed line; nothing local is touched."""
    from huggingface_hub import CommitOperationAdd, HfApi, constants
    from huggingface_hub.utils import HfHubHTTPError

    if constants.HF_HUB_OFFLINE:
        raise PublishError("HF_HUB_OFFLINE is set: push needs the network", file=p.repo_id)
    token = _token()
    if not token:
        raise PublishError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login` (a token with write access)", file=p.repo_id
        )
    hub_client.install()  # connect/read timeouts, bounded retries (REQUANT_HUB_TIMEOUT)
    api = HfApi()
    message = commit_message or f"requant: {p.arm or 'checkpoint'}, manifest {p.manifest_digest}"
    try:
        ops = []
        for u in p.files:
            op = CommitOperationAdd(
                path_in_repo=u.path_in_repo, path_or_fileobj=u.data if u.data is not None else str(u.local)
            )
            if op.upload_info.sha256.hex() != u.sha256:
                raise PublishError(
                    "changed since it was hashed for the manifest; nothing was pushed", file=u.local or u.path_in_repo
                )
            ops.append(op)
        with hub_client.transfer():  # an interrupt ends a stalled upload promptly (its threads joined)
            api.create_repo(p.repo_id, private=True if private else None, exist_ok=True, repo_type="model")
            if p.revision and p.revision != "main":
                api.create_branch(p.repo_id, branch=p.revision, exist_ok=True, repo_type="model")
            info = api.create_commit(p.repo_id, ops, commit_message=message, revision=p.revision, repo_type="model")
    except PublishError:
        raise
    except (HfHubHTTPError, ValueError, *_transport_errors()) as exc:
        raise PublishError(
            scrub(f"push failed: {_hub_message(exc, p.repo_id, api.endpoint)}", token), file=p.repo_id
        ) from None
    return scrub(str(info.commit_url), token), str(info.oid)


def git_blob_sha1(data: bytes) -> str:
    """The Hub's (git's) id of a file stored plainly: sha1 of 'blob <size>\\0' + the bytes."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def check_landed(p: Plan, oid: str) -> str | None:
    """After the commit: the first uploaded file whose bytes on the Hub (its own hashes at commit
    `oid`: the LFS sha256, or for a file stored plainly its git blob id) are not the bytes this push
    hashed, as 'FILE: why'; None when every one matches. A local file is still the bytes hashed
    (requant.io.snapshot.check, by the caller), so its git blob id is taken from it now."""
    from huggingface_hub import HfApi

    hub_client.install()
    api = HfApi()
    try:
        tree = {
            f.path: f
            for f in api.list_repo_tree(p.repo_id, revision=oid, recursive=True, repo_type="model")
            if hasattr(f, "blob_id")
        }
    except Exception as exc:  # noqa: BLE001 (any Hub failure: the push landed, the check could not run)
        if not isinstance(exc, _hub_errors()):
            raise
        token = _token()
        raise PublishError(
            scrub(f"reading the commit's file hashes back failed: {_hub_message(exc, p.repo_id, api.endpoint)}", token),
            file=p.repo_id,
        ) from None
    for u in p.files:
        got = tree.get(u.path_in_repo)
        if got is None:
            return f"{u.path_in_repo}: not in the commit"
        lfs = getattr(got, "lfs", None)
        if lfs is not None:
            if lfs.sha256 != u.sha256:
                return f"{u.path_in_repo}: the Hub holds sha256 {lfs.sha256}, this push hashed {u.sha256}"
            continue
        data = u.data if u.data is not None else u.local.read_bytes()
        if got.blob_id != git_blob_sha1(data) or hashlib.sha256(data).hexdigest() != u.sha256:
            return f"{u.path_in_repo}: the Hub holds blob {got.blob_id}, not the bytes this push hashed"
    return None


def _hub_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub.utils import HfHubHTTPError

    return (HfHubHTTPError, ValueError, *_transport_errors())


def write_back(p: Plan) -> list[Path]:
    """After a successful commit: write the generated card and manifest into CKPT (atomically)."""
    return [write_bytes_atomic(p.ckpt / name, data) for name, data in p.write_back.items()]
