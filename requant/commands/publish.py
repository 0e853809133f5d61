"""`requant manifest | card | push`: the publishing commands.

Thin typer wrappers over requant.evidence.manifest, requant.publish.card and requant.publish.push:
progress (rich, stderr) while hashing, tables for people on stdout, JSON with --json. Exit
codes as in requant.commands._common: a manifest mismatch or a push its rules refuse is 1,
an input that cannot be read 2. Nothing here ever prints a token.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from requant.commands._common import (
    EXIT_FAILED,
    EXIT_PUSHED,
    UsageError,
    cannot_run,
    check_outputs,
    err,
    fail,
    out,
    plain,
    warn,
)
from requant.errors import CheckpointError
from requant.evidence import manifest as mf
from requant.io import snapshot
from requant.io.output import report_target
from requant.publish import PublishError, PushRefused


def _run(fn):
    """fn() with refusals as the error line: a push that requant's rules refuse
    (requant.publish.PushRefused) exits 1; an input that cannot be read or written exits 2."""

    with cannot_run():
        try:
            return fn()
        except PushRefused as exc:
            fail(str(exc), EXIT_FAILED)


@contextmanager
def _hashing(root: Path, what: str):
    """A byte progress bar (stderr, only on a terminal) for hashing the files under root."""
    console = err()
    total = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file()) if Path(root).is_dir() else 0
    with Progress(
        TextColumn(what),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(what, total=total)
        yield lambda n: progress.advance(task, n)


def aligned_columns(header: tuple[str, ...], rows: list[tuple[str, ...]], right: set[int] = frozenset()) -> list[str]:
    """Named columns as plain lines, each column as wide as its widest cell (never cut, whatever
    the terminal's width: a sha256 must stay whole), no trailing spaces."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = []
    for r in (header, *rows):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return lines


def _warn(lines) -> None:
    for line in lines:
        warn(line)


def manifest(
    ckpt: Annotated[Path, typer.Argument(help="Checkpoint directory.", metavar="CKPT")],
    write: Annotated[
        bool, typer.Option("--write", help="Compute and write CKPT/SHA256SUMS (atomically; replaces an existing one).")
    ] = False,
    against: Annotated[
        Optional[Path],
        typer.Option(
            "--against",
            help="Check CKPT against this manifest file instead (e.g. OUT/SHA256SUMS.source to check a converted checkpoint's source).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
):
    """Check a checkpoint against its SHA256SUMS (sha256sum -c compatible), or write one.

    Exit 0 when every file matches (or after --write); 1 naming the first missing, unlisted
    or differing file. Without SHA256SUMS (and without --write) it prints the manifest that
    would be written and its digest. README.md, .gitattributes and the requant-*.json reports
    are not covered (they are written about the checkpoint, after it)."""

    stdout = out()
    if write:
        with _hashing(ckpt, "sha256") as cb:
            entries = _run(lambda: mf.compute(ckpt, progress=cb))
        path, digest = _run(lambda: mf.write(ckpt, entries))
        if as_json:
            stdout.file.write(
                json.dumps({"written": str(path), "manifest_digest": digest, "files": len(entries)}, indent=2) + "\n"
            )
        else:
            stdout.print(f"wrote {plain(str(path))}: {len(entries)} files, manifest digest {digest}")
        return
    if against is None and not (ckpt / mf.MANIFEST).exists():
        with _hashing(ckpt, "sha256") as cb:
            entries = _run(lambda: mf.compute(ckpt, progress=cb))
        digest = mf.digest_of(mf.render(entries))
        if as_json:
            stdout.file.write(
                json.dumps(
                    {
                        "manifest": None,
                        "manifest_digest": digest,
                        "files": {e.path: {"sha256": e.sha256, "size": e.size} for e in entries.values()},
                    },
                    indent=2,
                )
                + "\n"
            )
            return
        text = mf.render(entries).decode(
            "utf-8"
        )  # piped: the exact manifest bytes; on a terminal no raw control character
        if stdout.file.isatty():
            text = "".join(c if c == "\n" or (ord(c) >= 32 and ord(c) != 127) else repr(c)[1:-1] for c in text)
        stdout.file.write(text)
        stdout.print(f"no {mf.MANIFEST} in {plain(str(ckpt))}; the one above has digest {digest} (--write writes it)")
        return
    name = against.resolve() if against is not None else mf.MANIFEST
    with _hashing(ckpt, "sha256") as cb:
        check = _run(lambda: mf.verify(ckpt, name, progress=cb))
    if as_json:
        stdout.file.write(
            json.dumps(
                {
                    "manifest": str(check.manifest),
                    "manifest_digest": check.digest,
                    "ok": check.ok,
                    "first_problem": check.first_problem,
                    "missing": check.missing,
                    "not_listed": check.extra,
                    "differing": check.differing,
                },
                indent=2,
            )
            + "\n"
        )
    elif check.ok:
        stdout.print(f"[green]ok[/]: {plain(check.describe())}")
    else:
        stdout.print(f"[red]mismatch[/]: {plain(check.describe())}")
        for kind, rels in (("missing", check.missing), ("not listed", check.extra), ("differs", check.differing)):
            for rel in rels:
                stdout.print(f"  {kind}: {plain(rel)}")
    if not check.ok:
        raise typer.Exit(EXIT_FAILED)


def card(
    ckpt: Annotated[Path, typer.Argument(help="Checkpoint directory.", metavar="CKPT")],
    audit: Annotated[
        Optional[Path],
        typer.Option(
            "--audit", help="Audit JSON (default: CKPT/requant-audit.json if present; must be of these bytes)."
        ),
    ] = None,
    eval_report: Annotated[
        Optional[Path],
        typer.Option(
            "--eval", help="Eval JSON (default: CKPT/requant-eval.json if present; these bytes or their source)."
        ),
    ] = None,
    determinism: Annotated[
        Optional[Path],
        typer.Option("--determinism", help="Determinism JSON (default: CKPT/requant-determinism.json if present)."),
    ] = None,
    convert_report: Annotated[
        Optional[Path],
        typer.Option(
            "--convert",
            help="Conversion statistics JSON (default: CKPT/requant-convert.json, which `requant convert` writes).",
        ),
    ] = None,
    repo_id: Annotated[
        Optional[str], typer.Option("--repo-id", help="The Hub repo the card will live in (for its usage lines).")
    ] = None,
    stdout: Annotated[bool, typer.Option("--stdout", help="Print the card instead of writing CKPT/README.md.")] = False,
):
    """Render the model card CKPT/README.md (atomically) from the checkpoint and its reports.

    Reports are found beside the checkpoint by default: requant-audit.json,
    requant-eval.json, requant-determinism.json, requant-convert.json. A missing report is
    named in the card as not measured. Also writes CKPT/SHA256SUMS when there is none (the
    card quotes its digest)."""
    from requant.audit.catalogue.faults import FAMILY_TITLES
    from requant.publish.card import checkpoint_facts, render, write_card
    from requant.publish.push import check_repo_id

    if repo_id is not None:  # the rule push applies, before any work: a card must not name a repo push would refuse
        with cannot_run():
            try:
                check_repo_id(repo_id)
            except PublishError as exc:
                raise UsageError(f"--repo-id {repo_id!r}: {exc.detail}") from None
    if not stdout:  # a README.md that is not a file, or one read as a report: refused before any work
        _run(lambda: report_target(ckpt / mf.CARD))
        reports = [("--audit", audit), ("--eval", eval_report), ("--determinism", determinism)]
        _run(
            lambda: check_outputs(
                [("the card", ckpt / mf.CARD, None), ("the manifest", ckpt / mf.MANIFEST, None)],
                [(option, path, ()) for option, path in reports + [("--convert", convert_report)]],
            )
        )
    with _hashing(ckpt, "sha256") as cb:
        facts = _run(lambda: checkpoint_facts(ckpt, progress=cb))
    rendered = _run(
        lambda: render(
            ckpt,
            audit=audit,
            eval=eval_report,
            determinism=determinism,
            convert=convert_report,
            repo_id=repo_id,
            facts=facts,
            fault_titles=FAMILY_TITLES,
        )
    )
    _warn(rendered.warnings)
    if stdout:
        sys.stdout.write(rendered.text)
        return
    if not facts.manifest_stored:
        path, digest = _run(lambda: mf.write(ckpt, facts.entries))
        out().print(f"wrote {plain(str(path))} (manifest digest {digest})")
    path = _run(lambda: write_card(ckpt, rendered))
    measured = ", ".join(
        f"{k} {'measured' if k in rendered.reports.found else 'not measured'}" for k in ("audit", "determinism", "eval")
    )
    out().print(f"wrote {plain(str(path))} ({measured}; license {rendered.metadata.get('license')})")


def push(
    ckpt: Annotated[Path, typer.Argument(help="Checkpoint directory.", metavar="CKPT")],
    repo_id: Annotated[str, typer.Argument(help="Hub model repo, owner/name (created if missing).", metavar="REPO_ID")],
    private: Annotated[
        bool, typer.Option("--private", help="Create the repo private (an existing repo keeps its visibility).")
    ] = False,
    revision: Annotated[
        Optional[str], typer.Option("--revision", help="Branch to commit to (created if missing; default main).")
    ] = None,
    commit_message: Annotated[
        Optional[str],
        typer.Option("--commit-message", help="Commit message (default names the arm and the manifest digest)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List what would be uploaded (size, sha256); contact nothing, write nothing."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Push without a clean audit of these bytes or with non-power-of-two scales (never the probe arm).",
        ),
    ] = False,
):
    """Upload an audited checkpoint with its card, manifest and reports, in one commit.

    Refuses, saying why, unless CKPT/requant-audit.json audits exactly these bytes (its
    manifest digest) with the pinned matrix, no false positive or negative and every pow2
    layer bitwise equal, and every weight scale is a power of two (--force overrides these,
    never the probe arm). The token comes from HF_TOKEN or the stored login; HF_ENDPOINT
    selects the Hub. Prints the commit URL."""
    from requant.audit.catalogue.faults import FAMILY_TITLES
    from requant.publish import push as push_mod

    with _hashing(ckpt, "sha256") as cb:
        p = _run(
            lambda: push_mod.plan(
                ckpt, repo_id, revision=revision, force=force, progress=cb, fault_titles=FAMILY_TITLES
            )
        )
    if p.overridden:
        _warn([f"--force: pushing although {r}" for r in p.overridden])
    for note in p.notes:
        err().print(f"note: {plain(note)}")
    stdout = out()
    if dry_run:
        stdout.print(f"would upload to {plain(repo_id)}" + (f" (branch {plain(revision)})" if revision else ""))
        rows = [(u.path_in_repo, f"{u.size:,}", u.sha256, u.note) for u in p.files]
        for line in aligned_columns(("file", "bytes", "sha256", "note"), rows, right={1}):
            stdout.print(plain(line))
        stdout.print(
            f"{len(p.files)} files, {p.total_bytes:,} bytes; manifest digest {p.manifest_digest}. "
            "Dry run: nothing was contacted or written."
        )
        return
    url, oid = _run(lambda: push_mod.upload(p, private=private, commit_message=commit_message))
    stdout.print(plain(url))  # the commit landed: say so first, whatever fails after it
    stdout.file.flush()
    landed = f"pushed to {url} (commit {oid[:12]})"
    with cannot_run():
        try:  # the Hub's own hashes of what it holds, against what was hashed (a file rewritten after)
            mismatch = push_mod.check_landed(p, oid)
        except PublishError as exc:
            fail(f"{landed}, but its files could not be checked: {exc.detail}", EXIT_PUSHED)
    if mismatch is not None:
        fail(f"{landed}, but its files are not the bytes SHA256SUMS lists: {mismatch}", EXIT_FAILED)
    snapshot.forget()  # what landed is proven by the Hub's hashes; a local change after it is not this push's
    try:
        written = push_mod.write_back(p)
    except (OSError, CheckpointError) as exc:
        fail(f"{landed}; {' and '.join(p.write_back)} could not be written back: {_reason(exc)}", EXIT_PUSHED)
    for path in written:
        err().print(f"wrote {plain(str(path))} (as pushed)")


def _reason(exc: BaseException) -> str:
    return getattr(exc, "detail", None) or (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc))
