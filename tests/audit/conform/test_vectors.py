"""Exported conformance vectors (audit/conform/vectors.py export) re-checked by a reader that uses
numpy and the standard library only: it parses the safetensors header by hand, recomputes
every formula of the catalogue from the int8 operands with numpy's IEEE float32 arithmetic
(exact int64 accumulator; the exact value with Python fractions, or float64 away from bf16
rounding midpoints) and compares the bits with the exported expected tensors. The reader is
the independent reference; the exporter is what is tested."""

import json
import struct
from fractions import Fraction

import numpy as np
import pytest

from requant.audit.conform import vectors as V

NP = {"I8": np.int8, "F32": np.float32, "BF16": np.uint16}  # bf16 read as its 16 bits


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {
        k: np.frombuffer(raw[base + v["data_offsets"][0] : base + v["data_offsets"][1]], dtype=NP[v["dtype"]]).reshape(
            v["shape"]
        )
        for k, v in header.items()
    }


def rne(x):  # float32 -> bf16 bits, round half to even
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint16)


def trunc(x):
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def exact_bits(acc, sa, sw, fractions):
    v = acc.astype(np.float64) * sa.astype(np.float64) * sw.astype(np.float64)
    m, e = np.frexp(v)
    e = np.maximum(e, -125)
    t = np.ldexp(v, 8 - e)
    near = np.abs(np.abs(t - np.floor(t)) - 0.5) <= 2.0**-40
    out = rne(np.ldexp(np.round(t), e - 8).astype(np.float32))  # exact: <= 8 significant bits
    if fractions or near.any():
        idx = np.argwhere(np.ones_like(near) if fractions else near)
        for i, j in idx:
            x = Fraction(int(acc[i, j])) * Fraction(float(sa[i, 0])) * Fraction(float(sw[0, j]))
            out[i, j] = bf16_of_fraction(x)
    return out


def bf16_of_fraction(x):
    if x == 0:
        return 0
    sign, x = (0x8000, -x) if x < 0 else (0, x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    q = round(x / Fraction(2) ** (e - 7))  # half to even
    val = float(q * Fraction(2) ** (e - 7))
    return sign | int(rne(np.array([val], dtype=np.float32))[0])


def numpy_formulas(a, w, s_a, s_w, fractions):
    acc = a.astype(np.int64) @ w.astype(np.int64).T
    f = acc.astype(np.float64).astype(np.float32)
    sa, sw = s_a.reshape(-1, 1), s_w.reshape(1, -1)
    r = np.float32(1) / sw
    out = {"exact": exact_bits(acc, sa, sw, fractions)}
    for fault in ("", "+F1", "+F2", "+F4"):
        c = sw * f if fault != "+F1" else f / r
        c = f32(rne(c)) if fault == "+F2" else c
        t = sa * f
        t = f32(rne(t)) if fault == "+F2" else t
        t = t / r if fault == "+F1" else t * sw
        s = sa / r if fault == "+F1" else sa * sw
        s = f32(rne(s)) if fault == "+F2" else s
        rnd = trunc if fault == "+F4" else rne
        out["cutlass-order" + fault] = rnd(sa * c)
        out["triton-order" + fault] = rnd(t)
        out["fused-order" + fault] = rnd(f * s)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("vectors")
    vs = V.build_vectors()
    V.export(vs, d)
    return d, vs


def test_numpy_reader_rechecks_every_expected_tensor(exported):
    d, _ = exported
    t = read_safetensors(d / "vectors.safetensors")
    doc = json.loads((d / "vectors.json").read_text())
    assert set(doc["formulas"]) == set(doc["cases"][0]["expected"]) and len(doc["formulas"]) == 13
    names = {n for c in doc["cases"] for n in list(c["tensors"].values()) + list(c["expected"].values())}
    assert names == set(t)  # exactly the tensors the JSON names
    separated = set()
    for c in doc["cases"]:
        a, w, s_a, s_w = (t[c["tensors"][k]] for k in ("a", "w", "s_a", "s_w"))
        assert (
            a.dtype == np.int8 and w.dtype == np.int8 and s_a.shape == (a.shape[0], 1) and s_w.shape == (w.shape[0], 1)
        )
        mine = numpy_formulas(a, w, s_a, s_w, fractions=c["kind"] != "batch")
        for f, name in c["expected"].items():
            assert np.array_equal(mine[f], t[name]), (c["name"], f)
        if c["kind"] == "epilogue":
            fs = sorted(mine)
            separated |= {(x, y) for i, x in enumerate(fs) for y in fs[i + 1 :] if not np.array_equal(mine[x], mine[y])}
    n = len(doc["formulas"])
    assert len(separated) == n * (n - 1) // 2  # every pair of formulas differs on some epilogue element


def test_batch_cases_embed_the_probe_rows(exported):
    d, _ = exported
    t = read_safetensors(d / "vectors.safetensors")
    doc = json.loads((d / "vectors.json").read_text())
    p0, p1 = t["batch_m0001.a"][0], t["batch_m0001b.a"][0]
    ms = []
    for c in doc["cases"]:
        if c["kind"] == "batch" and c["name"] not in ("batch_m0001", "batch_m0001b"):
            a, s_a = t[c["tensors"]["a"]], t[c["tensors"]["s_a"]]
            assert np.array_equal(a[c["probes"]["P0"]], p0) and np.array_equal(a[c["probes"]["P1"]], p1)
            assert s_a[c["probes"]["P1"], 0] == t["batch_m0001b.s_a"][0, 0]
            ms.append(a.shape[0])
    assert ms == [m for m in V.BATCH_MS if m > 1] and max(ms) == 4096


def test_vectors_are_deterministic_and_pinned(exported):
    d, vs = exported
    assert vs.digest() == V.PINNED_SHA256 and vs.unseparated == []
    doc = json.loads((d / "vectors.json").read_text())
    assert doc["sha256"] == V.PINNED_SHA256 and doc["seed"] == V.SEED


def test_export_is_atomic(exported, tmp_path, monkeypatch):
    _, vs = exported
    V.export(vs, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    calls = {"n": 0}
    real = V.tensor_to_bytes

    def failing(t):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError("disk full")
        return real(t)

    monkeypatch.setattr(V, "tensor_to_bytes", failing)
    with pytest.raises(OSError):
        V.export(vs, tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # the old files intact, no temporary file left


def test_the_documented_numpy_check_runs(exported, capsys):
    """The few-line numpy check shown in docs/conformance.md, run as written on the export,
    with a numpy kernel of the CUTLASS order: it prints exactly that formula."""
    import re
    from pathlib import Path

    d, _ = exported
    doc = (Path(__file__).resolve().parents[3] / "docs" / "conformance.md").read_text()
    m = re.search(r"### Checking a kernel with numpy alone.*?```python\n(.*?)```", doc, re.S)
    assert m, "docs/conformance.md lost its numpy check"
    code = m.group(1).replace("DIR/", f"{d}/")

    def my_kernel(a, w, s_a, s_w):
        return numpy_formulas(a, w, s_a, s_w, fractions=False)["cutlass-order"]

    exec(code, {"my_kernel": my_kernel})
    assert capsys.readouterr().out.strip() == "['cutlass-order']"
