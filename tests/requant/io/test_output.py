"""requant.io.output's report writer (write_files_atomic and the writers on it): a target that is
not a regular file is never replaced, a set of files is published all or nothing, errors name
the destination, permissions are cp's, JSON has no NaN literal. References: os.lstat of the
targets before and after, the directory listing (no temporary left), Python's json parser
with parse_constant refusing NaN/Infinity, and the permission arithmetic cp uses
(0666 & ~umask for a new file, the old mode for a replaced one)."""

import errno
import json
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import requant.io.output as output
from requant.errors import CheckpointError
from requant.io.output import json_bytes, report_target, write_bytes_atomic, write_files_atomic, write_json_atomic


def _listing(d):
    return sorted(p.name for p in d.iterdir())


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_report_into_a_fifo_is_refused_and_the_fifo_stays(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="FIFO"):
        write_json_atomic(fifo, {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _listing(tmp_path) == ["fifo.json"]


def test_report_into_a_device_node_is_refused(tmp_path):
    node = tmp_path / "fakenull"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root here")
    with pytest.raises(CheckpointError, match="device"):
        write_json_atomic(node, {"a": 1})
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_report_through_a_link_to_proc_self_fd_1_is_refused(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to("/proc/self/fd/1")
    with pytest.raises(CheckpointError, match="/proc"):
        report_target(link)
    assert os.readlink(link) == "/proc/self/fd/1"


def test_report_through_a_link_out_of_its_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.write_text("keep")
    d = tmp_path / "reports"
    d.mkdir()
    (d / "r.json").symlink_to(victim)
    with pytest.raises(CheckpointError, match="outside its own directory"):
        write_json_atomic(d / "r.json", {"a": 1})
    assert victim.read_text() == "keep"


def test_report_through_a_link_inside_its_directory_replaces_the_file_it_names(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    write_json_atomic(tmp_path / "link.json", {"a": 1})
    assert os.readlink(tmp_path / "link.json") == "real.json" and json.loads(real.read_text()) == {"a": 1}


def test_report_onto_a_directory_is_refused(tmp_path):
    (tmp_path / "d.json").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        write_json_atomic(tmp_path / "d.json", {})
    assert (tmp_path / "d.json").is_dir() and _listing(tmp_path) == ["d.json"]


def test_a_target_that_becomes_a_fifo_while_rendering_is_not_renamed_over(tmp_path):
    dest = tmp_path / "r.json"

    def render(tmp):
        tmp.write_text("x")
        os.mkfifo(dest)  # swapped in after the first check

    with pytest.raises(CheckpointError, match="FIFO"):
        write_files_atomic([(dest, render)])
    assert stat.S_ISFIFO(os.lstat(dest).st_mode) and _listing(tmp_path) == ["r.json"]


def test_a_set_with_a_directory_among_its_targets_writes_nothing(tmp_path):
    (tmp_path / "audit.json").write_text("old")
    (tmp_path / "audit.md").mkdir()
    rendered = []
    with pytest.raises(CheckpointError, match="audit.md"):
        write_files_atomic(
            [(tmp_path / "audit.json", lambda t: rendered.append(t)), (tmp_path / "audit.md", rendered.append)]
        )
    assert rendered == []  # refused before any work
    assert (tmp_path / "audit.json").read_text() == "old" and _listing(tmp_path) == ["audit.json", "audit.md"]


def test_a_set_whose_second_render_fails_leaves_the_first_old_and_no_temporary(tmp_path):
    (tmp_path / "a.json").write_text("old a")

    def fail(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=r"b\.png: writing failed: No space left on device"):
        write_files_atomic([(tmp_path / "a.json", lambda t: t.write_text("new a")), (tmp_path / "b.png", fail)])
    assert (tmp_path / "a.json").read_text() == "old a" and _listing(tmp_path) == ["a.json"]


def test_a_set_whose_second_rename_fails_puts_the_first_back(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text("old a")
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(src, dst)

    monkeypatch.setattr(output.os, "replace", replace)
    with pytest.raises(CheckpointError, match=r"b\.json: renaming into place failed"):
        write_files_atomic(
            [(tmp_path / "a.json", lambda t: t.write_text("new a")), (tmp_path / "b.json", lambda t: t.write_text("b"))]
        )
    monkeypatch.undo()
    assert (tmp_path / "a.json").read_text() == "old a" and _listing(tmp_path) == ["a.json"]


def test_an_unwritable_directory_names_the_target_not_the_temporary(tmp_path, monkeypatch):
    def mkstemp(prefix, suffix, dir):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, prefix + "abc" + suffix))

    monkeypatch.setattr(output.tempfile, "mkstemp", mkstemp)
    with pytest.raises(CheckpointError) as info:
        write_json_atomic(tmp_path / "r.json", {})
    assert str(info.value) == f"{tmp_path / 'r.json'}: cannot be written: Permission denied"
    assert ".tmp" not in str(info.value)


def test_write_errors_are_oserrors_too(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        write_files_atomic([(tmp_path / "x", lambda t: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))])


def test_a_new_report_gets_0666_less_the_umask_as_cp_gives(tmp_path):
    old = os.umask(0o002)
    try:
        write_bytes_atomic(tmp_path / "new.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o664


def test_a_replaced_report_keeps_its_mode_as_cp_keeps_it(tmp_path, umask022):
    p = tmp_path / "r.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    write_bytes_atomic(p, b"new")
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640 and p.read_bytes() == b"new"


def test_json_reports_never_contain_nan_or_infinity_literals(tmp_path):
    obj = {"ppl": float("inf"), "d": [float("nan"), -float("inf"), 1.5], "n": {"x": float("nan")}}
    write_json_atomic(tmp_path / "r.json", obj)

    def refuse(name):
        raise AssertionError(f"non-standard JSON literal {name}")

    back = json.loads((tmp_path / "r.json").read_text(), parse_constant=refuse)
    assert back == {"ppl": None, "d": [None, None, 1.5], "n": {"x": None}}
    assert json_bytes({"a": 1.0}) == b'{\n "a": 1.0\n}\n'  # finite values as json.dumps writes them


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6))
_KEYS = st.one_of(
    st.text(max_size=4), st.integers(-5, 5), st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False)
)
_ROWS = st.lists(st.dictionaries(_KEYS, _SCALARS, max_size=3), min_size=60, max_size=80)
_DOCS = st.recursive(
    _SCALARS | _ROWS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_DOCS)
def test_row_lines_write_the_document_json_writes(doc):
    """json_bytes(row_lines=True) against json.dumps (through json_bytes without it): the same
    document once parsed (NaN and infinities as null), drawn over nesting, long lists of dicts
    around ROW_LINES, non-string keys and every scalar; byte for byte when no list is that long."""
    plain, rows = json_bytes(doc), json_bytes(doc, row_lines=True)

    def refuse(name):
        raise AssertionError(f"non-standard JSON literal {name}")

    assert json.loads(rows, parse_constant=refuse) == json.loads(plain)
    long_lists = []

    def walk(o):
        if isinstance(o, dict):
            o = list(o.values())
        if isinstance(o, list):
            long_lists.append(len(o) > output.ROW_LINES and all(isinstance(v, dict) for v in o))
            for v in o:
                walk(v)

    walk(doc)
    if not any(long_lists):
        assert rows == plain
    else:
        assert rows.count(b"\n") < plain.count(b"\n") or not plain.strip(b"[]{}\n ")


def test_two_outputs_naming_the_same_file_are_refused_before_any_work(tmp_path):
    (tmp_path / "link.json").symlink_to("r.json")
    rendered = []
    with pytest.raises(CheckpointError, match="names the same file as"):
        write_files_atomic([(tmp_path / "r.json", rendered.append), (tmp_path / "link.json", rendered.append)])
    assert rendered == [] and _listing(tmp_path) == ["link.json"]
