"""Provenance a stranger can check: a plain sha256 of every file of a checkpoint.

The manifest is a file named `SHA256SUMS` beside config.json, in the format of GNU
coreutils' `sha256sum` (one line per file, `<64 lowercase hex>  <relative path>\\n`, sorted
by the path's UTF-8 bytes, no other content), so `sha256sum -c SHA256SUMS` checks a download.
Its digest is `sha256:` + sha256 of its bytes; only the canonical form is written or read.

It covers every file under the checkpoint directory (links into it are followed, a link out of
it is refused) except the evidence written about those bytes: NOT_COVERED at the top level (the
manifest, README.md, .gitattributes, REPORTS) and SKIP_DIRS (.git, .cache, .huggingface). The same
rule describes a converted checkpoint's source (SOURCE_MANIFEST). File names that the sha256sum
format cannot hold plainly (a newline, a carriage return or a backslash: GNU would escape them)
are refused, naming the file. Files are hashed in parallel, each read once.

Why this format, what exactly is covered and why: docs/publishing.md#the-manifest.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from requant.errors import CheckpointError
from requant.io import leftovers, snapshot
from requant.io.inputs import read_small
from requant.io.links import allowed_roots, check_inside, shown
from requant.io.output import write_bytes_atomic

MANIFEST = "SHA256SUMS"
SOURCE_MANIFEST = "SHA256SUMS.source"
CARD = "README.md"
REPORTS = ("requant-audit.json", "requant-eval.json", "requant-determinism.json", "requant-convert.json")
# Top-level names that are evidence about the checkpoint, not part of it.
NOT_COVERED = frozenset({MANIFEST, CARD, ".gitattributes", *REPORTS})
SKIP_DIRS = frozenset({".git", ".cache", ".huggingface"})
READ_BYTES = 8 << 20
_LINE = re.compile(r"^([0-9a-f]{64})  (.+)$")


class ManifestError(CheckpointError):
    """A manifest that is missing, malformed, or does not match the files."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative, POSIX separators
    sha256: str  # 64 lowercase hex
    size: int


def _check_name(rel: str, where) -> None:
    if any(c in rel for c in "\n\r\\"):
        raise ManifestError(
            f"file name {rel!r} holds a newline, carriage return or backslash, which a SHA256SUMS line cannot hold plainly",
            file=shown(where),
        )


def walk_files(root: str | os.PathLike, skip_dirs: frozenset[str] = SKIP_DIRS) -> dict[str, Path]:
    """{relative path: path} of every file under root (directories in skip_dirs left out),
    in walk order, refusing what a reader of the directory must not follow silently: a
    symlinked directory, a name that is not a regular file (a dangling link), and a link
    that resolves outside the checkpoint (requant.io.links; a Hub snapshot's blobs are inside).
    The one walk behind the manifest, convert's copying and verify's comparison."""
    root = Path(root)
    if not root.is_dir():
        raise ManifestError("not a directory", file=root)
    roots = allowed_roots(root)
    out: dict[str, Path] = {}
    for dirpath, dirs, files in os.walk(root):
        d = Path(dirpath)
        dirs[:] = sorted(x for x in dirs if x not in skip_dirs)
        for name in dirs:
            if (d / name).is_symlink():  # os.walk would skip it silently: never leave files out unsaid
                raise ManifestError("a symlinked directory inside a checkpoint is not supported", file=shown(d / name))
        for fn in sorted(files):
            p = d / fn
            if leftovers.is_temp(fn):  # a requant temporary is never part of a checkpoint; a dead one is swept
                if leftovers.dead_temp(fn) and p.is_file() and not p.is_symlink():
                    leftovers.sweep(p, shown(p))
                continue
            if not p.is_file():
                raise ManifestError("not a regular file (a dangling symlink?)", file=shown(p))
            if p.is_symlink():
                check_inside(root, p, roots)
            out[p.relative_to(root).as_posix()] = p
    return out


def covered_files(root: str | os.PathLike) -> dict[str, Path]:
    """{relative path: path} of every file the manifest covers, sorted by path (every file
    under root is checked by walk_files, the ones not covered too: push uploads them)."""
    root = Path(root)
    out: dict[str, Path] = {}
    for rel, p in walk_files(root).items():
        if "/" not in rel and rel in NOT_COVERED:
            continue
        _check_name(rel, p)
        out[rel] = p
    return dict(sorted(out.items(), key=lambda kv: kv[0].encode("utf-8")))


def file_sha256(
    path: str | os.PathLike,
    progress: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
    pin: bool = False,
) -> tuple[str, int]:
    """(sha256 hex, size) of one file, read once in 8 MB pieces (ManifestError when `stop` is set meanwhile).
    With `pin` the file is an input (requant.io.snapshot): the digest is of the bytes between two
    fstats of the one descriptor read, and a file that changed meanwhile is an InputChanged."""
    h = hashlib.sha256()
    buf = bytearray(READ_BYTES)
    view = memoryview(buf)
    size = 0
    try:
        with open(path, "rb", buffering=0) as f:
            if pin:
                first = os.fstat(f.fileno())
                snapshot.pin(path, first)
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                size += n
                if stop is not None and stop.is_set():
                    raise ManifestError("hashing stopped", file=path)
                if progress is not None:
                    progress(n)
            if pin and (snapshot.key(os.fstat(f.fileno())) != snapshot.key(first) or size != first.st_size):
                raise snapshot.InputChanged(str(path))
    except OSError as exc:
        raise ManifestError(f"reading failed: {exc.strerror or exc}", file=path) from None
    return h.hexdigest(), size


MAX_HASH_THREADS = 4  # sequential reads of a few files at once; more only contend for the disk


def _workers(jobs: int | None, n_files: int) -> int:
    return max(1, min(jobs or MAX_HASH_THREADS, os.cpu_count() or 1, MAX_HASH_THREADS, n_files or 1))


def _submit_all(pool: cf.ThreadPoolExecutor, files: dict[str, Path], *args) -> tuple[dict[str, cf.Future], bool]:
    """({file: future}, True) with every file submitted to `pool`; when a thread could not be
    started (memory pressure: "can't start new thread"), nothing is left queued, the futures
    that a started thread finished are returned with False, and the caller hashes the rest
    itself, in turn."""
    futures = {}
    try:
        for rel, p in files.items():
            futures[rel] = pool.submit(file_sha256, p, *args)
    except RuntimeError:
        pool.shutdown(wait=True, cancel_futures=True)
        return {rel: f for rel, f in futures.items() if f.done() and not f.cancelled()}, False
    return futures, True


def _hash_all(files: dict[str, Path], jobs: int | None, progress, pin: bool = True) -> dict[str, Entry]:
    if not files:
        return {}
    hashed: dict[str, tuple[str, int]] = {}
    workers = _workers(jobs, len(files))
    if workers > 1:
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="requant-sha256") as pool:
            futures, _ = _submit_all(pool, files, progress, None, pin)
            hashed = {rel: fut.result() for rel, fut in futures.items()}
    for rel, p in files.items():  # one thread, or no thread could be started: here, in turn
        if rel not in hashed:
            hashed[rel] = file_sha256(p, progress, None, pin)
    return {rel: Entry(rel, h, n) for rel, (h, n) in hashed.items()}


def compute(
    root: str | os.PathLike,
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
    known: dict[str, Entry] | None = None,
    pin: bool = True,
) -> dict[str, Entry]:
    """The manifest entries of a directory as it is now: {path: Entry}, sorted by path.
    `known` entries (hashed already, e.g. by BackgroundHashes) are taken as they are; `pin`:
    the files are inputs (requant.io.snapshot), False for an output being written."""
    known = known or {}
    files = covered_files(root)
    hashed = _hash_all({rel: p for rel, p in files.items() if rel not in known}, jobs, progress, pin)
    return {rel: known[rel] if rel in known else hashed[rel] for rel in files}


class BackgroundHashes:
    """The manifest entries of a directory, hashed in background threads from construction on
    (one sequential pass per file, several files at once), so that a caller can do other work
    on the same files meanwhile (`requant convert` hashes its source while converting it)."""

    def __init__(
        self, root: str | os.PathLike, jobs: int | None = None, only: set[str] | None = None, pin: bool = True
    ):
        self._pin = pin  # inputs are pinned (requant.io.snapshot); an output being written is not
        self._files = {rel: p for rel, p in covered_files(root).items() if only is None or rel in only}
        self._stop = threading.Event()
        self._pool = cf.ThreadPoolExecutor(
            max_workers=_workers(jobs, len(self._files)), thread_name_prefix="requant-sha256"
        )
        self._futures, _ = _submit_all(self._pool, self._files, None, self._stop, pin)

    def result(self) -> dict[str, Entry]:
        try:
            out = {rel: Entry(rel, *fut.result()) for rel, fut in self._futures.items()}
            for rel, p in self._files.items():  # no thread could be started for these: here, in turn
                if rel not in out:
                    out[rel] = Entry(rel, *file_sha256(p, None, self._stop, self._pin))
            return dict(sorted(out.items(), key=lambda kv: kv[0].encode("utf-8")))
        finally:
            self._pool.shutdown(wait=True)

    def cancel(self) -> None:
        """Stop within one 8 MB read: files not started are skipped, the ones being hashed abandoned."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def render(entries) -> bytes:
    """The canonical manifest bytes for entries ({path: Entry} or Entry objects or
    {path: sha256 hex})."""
    if isinstance(entries, dict):
        pairs = [(k, v.sha256 if isinstance(v, Entry) else v) for k, v in entries.items()]
    else:
        pairs = [(e.path, e.sha256) for e in entries]
    pairs.sort(key=lambda kv: kv[0].encode("utf-8"))
    lines = []
    for i, (rel, h) in enumerate(pairs):
        _check_name(rel, rel)
        if not re.fullmatch(r"[0-9a-f]{64}", h):
            raise ManifestError(f"not a sha256 hex digest: {h!r}", file=rel)
        if i and pairs[i - 1][0] == rel:
            raise ManifestError("listed twice", file=rel)
        lines.append(f"{h}  {rel}\n")
    return "".join(lines).encode("utf-8")


def digest_of(manifest_bytes: bytes) -> str:
    """The manifest digest: 'sha256:' + sha256 of the manifest's (canonical) bytes."""
    return "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()


def parse(data: bytes, *, file: str | os.PathLike = MANIFEST) -> dict[str, str]:
    """{path: sha256 hex} from manifest bytes; anything but the canonical form is refused
    (naming the line), so that the file's own sha256 is the manifest digest."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError("not UTF-8 text", file=file) from None
    if text and not text.endswith("\n"):
        raise ManifestError("the last line has no newline (not canonical)", file=file)
    out: dict[str, str] = {}
    for no, line in enumerate(text.split("\n")[:-1], 1):
        if line.endswith("\r"):
            raise ManifestError(
                f"line {no} ends with CR LF (Windows line endings); a SHA256SUMS line ends with LF", file=file
            )
        m = _LINE.match(line)
        if m is None:
            raise ManifestError(f"line {no} is not '<64 lowercase hex>  <file>'", file=file)
        rel = m.group(2)
        if rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
            raise ManifestError(f"line {no}: {rel!r} is not a plain relative path", file=file)
        if rel in out:
            raise ManifestError(f"line {no}: {rel!r} is listed twice", file=file)
        out[rel] = m.group(1)
    if render(out) != data:
        raise ManifestError("not in canonical form (lines sorted by file name, LF endings, two spaces)", file=file)
    return out


def read(root: str | os.PathLike, name: str = MANIFEST) -> tuple[dict[str, str], bytes] | None:
    """({path: sha256}, bytes) of the manifest root/name (name may also be a path of its
    own, e.g. another checkpoint's SHA256SUMS.source), or None when there is none. Only a
    regular file of at most requant.inputs.MAX_TEXT_BYTES is read, and one inside root only
    through links that stay inside it (requant.io.links)."""
    p = Path(root) / name
    if not (p.exists() or p.is_symlink()):
        return None
    inside = not Path(name).is_absolute() and ".." not in Path(name).parts
    data = read_small(p, what="manifest", root=root if inside else None, error=ManifestError)
    return parse(data, file=p), data


def write(root: str | os.PathLike, entries: dict[str, Entry] | None = None, name: str = MANIFEST) -> tuple[Path, str]:
    """Write the manifest of root (computed now unless entries are given). Returns (path, digest)."""

    data = render(entries if entries is not None else compute(root))
    return write_bytes_atomic(Path(root) / name, data), digest_of(data)


@dataclass
class Check:
    """The result of checking a directory against its manifest."""

    manifest: str
    digest: str  # of the stored manifest
    missing: list[str]  # listed, not present
    extra: list[str]  # present (and covered), not listed
    differing: list[str]  # present, different bytes
    entries: dict[str, Entry]  # what was found (present and listed)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.differing)

    @property
    def first_problem(self) -> str | None:
        """'<kind>: <file>' for the first problem in file-name order, or None."""
        problems = (
            [(p, "missing") for p in self.missing]
            + [(p, "not listed") for p in self.extra]
            + [(p, "differs") for p in self.differing]
        )
        if not problems:
            return None
        rel, kind = min(problems, key=lambda pk: pk[0].encode("utf-8"))
        return f"{rel} {kind}"

    def describe(self) -> str:
        if self.ok:
            return f"{len(self.entries)} files match {self.manifest} ({self.digest})"
        n = len(self.missing) + len(self.extra) + len(self.differing)
        return f"{self.manifest} does not match the files: {self.first_problem}" + (
            f" (and {n - 1} more problem{'s' if n > 2 else ''})" if n > 1 else ""
        )


def verify(
    root: str | os.PathLike,
    name: str | os.PathLike = MANIFEST,
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Check:
    """Check root against a manifest: root/SHA256SUMS by default, or `name` (a file name in
    root, or any path: `verify(SRC, OUT / "SHA256SUMS.source")` checks a converted
    checkpoint's source). ManifestError if there is none."""
    root = Path(root)
    mpath = root / name
    stored = read(root, name)
    if stored is None:
        raise ManifestError("no manifest here (write one with `requant manifest DIR --write`)", file=mpath)
    listed, data = stored
    files = covered_files(root)
    for rel, p in list(files.items()):
        if p.resolve() == mpath.resolve():  # a manifest never lists itself
            del files[rel]
    missing = [p for p in listed if p not in files]
    extra = [p for p in files if p not in listed]
    found = _hash_all({p: files[p] for p in listed if p in files}, jobs, progress)
    differing = [p for p, e in found.items() if e.sha256 != listed[p]]
    return Check(str(name), digest_of(data), missing, extra, differing, found)


def check_against(
    root: str | os.PathLike, stored: tuple[dict[str, str], bytes], entries: dict[str, Entry] | None = None
) -> None:
    """ManifestError (naming the first missing, unlisted or differing file) unless root's files
    are what its stored manifest (read()'s pair) lists: by name only (entries None: a listing,
    no reading), or name and bytes from `entries` already hashed from those files (convert
    hashes its source beside the conversion, and must still refuse bytes the manifest does not
    vouch for)."""
    listed, data = stored
    names = entries if entries is not None else covered_files(root)
    differing = [p for p, e in entries.items() if p in listed and e.sha256 != listed[p]] if entries is not None else []
    missing, extra = [p for p in listed if p not in names], [p for p in names if p not in listed]
    check = Check(MANIFEST, digest_of(data), missing, extra, differing, entries or {})
    if not check.ok:
        raise ManifestError(check.describe() + cache_hint(root, check), file=shown(Path(root)))


def cache_hint(root: str | os.PathLike, check: Check) -> str:
    """For a Hub snapshot in the Hugging Face cache (.../models--ORG--NAME/snapshots/REV): the cache
    entry to remove so that the next run downloads the damaged file anew ('' elsewhere)."""
    root = Path(root)
    if root.parent.name != "snapshots" or not root.parent.parent.name.startswith("models--"):
        return ""
    bad = sorted(check.differing + check.missing, key=lambda r: r.encode("utf-8"))
    if not bad:
        return ""
    link = root / bad[0]
    entry = link.resolve() if link.is_symlink() else root
    return f"; the download in the Hugging Face cache is damaged: remove {entry} and run again to download it anew"


def identity(
    root: str | os.PathLike,
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
    entries_out: dict[str, Entry] | None = None,
) -> dict:
    """The fields a report records to tie itself to a checkpoint's bytes:
    {"manifest": "SHA256SUMS" or None, "manifest_digest": "sha256:..."}.

    With a stored manifest, the directory is checked against it first (a mismatch is a
    ManifestError naming the first differing, missing or unlisted file: a report must never
    claim a digest for bytes it did not read); without one, the digest of the manifest
    computed now (what `requant manifest --write` would write) and "manifest": None.
    entries_out, when given, receives the entries of every covered file (the hashes this
    call read, so that a caller converting the same directory need not read it again)."""
    if (Path(root) / MANIFEST).exists():
        check = verify(root, jobs=jobs, progress=progress)
        if not check.ok:
            raise ManifestError(check.describe() + cache_hint(root, check), file=root)
        if entries_out is not None:
            entries_out.update(check.entries)
        return {"manifest": MANIFEST, "manifest_digest": check.digest}
    entries = compute(root, jobs=jobs, progress=progress)
    if entries_out is not None:
        entries_out.update(entries)
    return {"manifest": None, "manifest_digest": digest_of(render(entries))}
