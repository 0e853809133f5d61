"""Crafted conformance vectors: small W8A8 cases on which the formulas of audit/conform/formulas.py
give different bf16 outputs, plus accumulator and batch-invariance cases. Built
deterministically on CPU from one seed (the same bytes on every machine: seeded torch
generators, exact integer matmuls in float64, IEEE fp32 elementwise ops), and exportable
so that a kernel can be checked with numpy alone (export()).

Why each case separates what it separates: docs/conformance.md#vectors-auditconformvectorspy.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from requant.audit.conform.formulas import FORMULA_TITLES, FORMULAS, apply_formula, model_accumulator
from requant.io.output import write_files_atomic
from requant.io.safetensors_io import TORCH_TO_ST, serialize_header, tensor_to_bytes
from requant.kernels.reference import accumulate

__all__ = [
    "Case",
    "VectorSet",
    "build_vectors",
    "export",
    "describe",
    "tensors_of",
    "SEED",
    "PINNED_SHA256",
    "BATCH_MS",
]

SEED = 20261201
# VectorSet.digest() of build_vectors() as first built; a rebuild that differs (another torch's
# RNG, a changed construction) is reported by `requant conform` (vectors_pinned: false).
PINNED_SHA256 = "204462dfea82a51cdbd14a285d0001a2af402e303b9ec76d572002c9c61d2c03"
POOL_M, POOL_N, POOL_K = 1024, 256, 32
BATCH_MS = (1, 2, 3, 4, 8, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 1024, 2048, 4096)
BATCH_K, BATCH_N = POOL_K, 32  # K of the witness rows: the probes are two of them


@dataclass
class Case:
    name: str
    kind: str  # "epilogue" | "accumulator" | "batch"
    a: torch.Tensor
    w: torch.Tensor
    s_a: torch.Tensor
    s_w: torch.Tensor
    expected: dict = field(default_factory=dict)  # formula -> bf16 [M, N] (exact int32 accumulator)
    probes: dict = field(default_factory=dict)  # batch cases: probe name -> row index

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.a.shape[0], self.a.shape[1], self.w.shape[0]


@dataclass
class VectorSet:
    cases: list
    seed: int = SEED
    unseparated: list = field(default_factory=list)  # formula pairs no case tells apart (should be empty)

    def by_kind(self, kind: str) -> list:
        return [c for c in self.cases if c.kind == kind]

    def digest(self) -> str:
        """sha256 over every tensor's name, dtype, shape and bytes, in case order."""
        h = hashlib.sha256()
        for name, t in tensors_of(self):
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def _gen(*parts) -> torch.Generator:
    import zlib

    return torch.Generator().manual_seed(zlib.crc32("|".join(str(p) for p in (SEED, *parts)).encode()))


def _int8(g, shape, lo=-128, hi=128) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=g).to(torch.int8)


def _token_scales(g, m) -> torch.Tensor:
    """fp32(absmax / 127) for bf16 absmax in [0.25, 8): as quantize_activations forms them."""
    absmax = (torch.rand(m, 1, generator=g) * 7.75 + 0.25).to(torch.bfloat16).to(torch.float32)
    return absmax / torch.full_like(absmax, 127.0)


def _weight_scales(g, n) -> torch.Tensor:
    """bf16 weight scales in [2**-10, 2**-6) upcast exactly, as a checkpoint stores them."""
    return torch.pow(2.0, torch.rand(n, 1, generator=g) * 4 - 10).to(torch.bfloat16).to(torch.float32)


def _pow2(g, n, lo, hi) -> torch.Tensor:
    return torch.pow(2.0, torch.randint(lo, hi, (n, 1), generator=g).to(torch.float32))


def _outputs(a, w, s_a, s_w) -> dict:
    acc = accumulate(a, w)
    return {f: apply_formula(f, acc, s_a, s_w) for f in FORMULAS}


def _pairs():
    return [(i, j) for i in range(len(FORMULAS)) for j in range(i + 1, len(FORMULAS))]


def _witnesses(max_pools: int = 8) -> tuple[list, list, list]:
    """Greedy witness elements (row operands, column operands) separating every formula pair."""
    uncovered = set(_pairs())
    rows, cols = [], []
    for p in range(max_pools):
        if not uncovered:
            break
        g = _gen("pool", p)
        a, w = _int8(g, (POOL_M, POOL_K)), _int8(g, (POOL_N, POOL_K))
        s_a, s_w = _token_scales(g, POOL_M), _weight_scales(g, POOL_N)
        out = _outputs(a, w, s_a, s_w)
        bits = torch.stack([out[f].view(torch.int16).reshape(-1) for f in FORMULAS])
        diff = {pair: bits[pair[0]] != bits[pair[1]] for pair in uncovered}
        while uncovered:
            score = torch.zeros(bits.shape[1], dtype=torch.int32)
            for pair in uncovered:
                score += diff[pair]
            best = int(torch.argmax(score))  # first maximum: deterministic
            if int(score[best]) == 0:
                break
            uncovered = {pair for pair in uncovered if not bool(diff[pair][best])}
            i, j = divmod(best, POOL_N)
            rows.append((a[i], s_a[i]))
            cols.append((w[j], s_w[j]))
    return rows, cols, sorted(uncovered)


def _case(name, kind, a, w, s_a, s_w, probes=None) -> Case:
    return Case(
        name,
        kind,
        a.contiguous(),
        w.contiguous(),
        s_a.contiguous(),
        s_w.contiguous(),
        _outputs(a, w, s_a, s_w),
        probes or {},
    )


def _fp32_case() -> tuple:
    m, n, k = 8, 16, 4096
    half = k // 2
    for attempt in range(32):
        g = _gen("acc_fp32", attempt)
        a = torch.full((m, k), 127, dtype=torch.int16)
        w = torch.full((n, k), 127, dtype=torch.int16)
        w[:, half:] = -127
        # perturb a few positions per row / column, in both halves, so that the exact sum is small
        for t, rows in ((a, m), (w, n)):
            for r in range(rows):
                pos = torch.randperm(k, generator=g)[:6]
                t[r, pos] -= torch.randint(1, 4, (6,), generator=g).to(torch.int16) * torch.sign(t[r, pos])
        a8, w8 = a.to(torch.int8), w.to(torch.int8)
        s_a, s_w = _pow2(g, m, -14, -10), _pow2(g, n, -12, -8)
        exact = apply_formula("triton-order", accumulate(a8, w8), s_a, s_w)
        fp32 = apply_formula("triton-order", model_accumulator("fp32-tiles", a8, w8), s_a, s_w)
        if int((exact.view(torch.int16) != fp32.view(torch.int16)).sum()) * 4 >= m * n:
            return a8, w8, s_a, s_w
    raise RuntimeError("no fp32 cancellation case found")  # the seed is fixed: never at run time


def _probe_rows(ep: Case) -> list:
    """The two witness rows of the epilogue case that separate the most formula pairs in
    their own row (the first must separate the CUTLASS and Triton orders): an M-dependent
    switch between formulas shows in a probe row's outputs."""
    bits = torch.stack([ep.expected[f].view(torch.int16) for f in FORMULAS])  # [F, W, W]
    sep = [{(i, j) for i, j in _pairs() if bool((bits[i, r] != bits[j, r]).any())} for r in range(ep.shape[0])]
    ct = (FORMULAS.index("cutlass-order"), FORMULAS.index("triton-order"))
    first = max((r for r in range(len(sep)) if ct in sep[r]), key=lambda r: (len(sep[r]), -r))
    second = max((r for r in range(len(sep)) if r != first), key=lambda r: (len(sep[r] - sep[first]), -r))
    return [(ep.a[r : r + 1], ep.s_a[r : r + 1]) for r in (first, second)]


def build_vectors(batch_ms=BATCH_MS) -> VectorSet:
    """Every case, deterministically (a second call gives the same bytes)."""
    rows, cols, unseparated = _witnesses()
    cases = [
        _case(
            "epilogue",
            "epilogue",
            torch.stack([r[0] for r in rows]),
            torch.stack([c[0] for c in cols]),
            torch.stack([r[1] for r in rows]),
            torch.stack([c[1] for c in cols]),
        )
    ]
    g = _gen("epilogue_random")
    cases.append(
        _case(
            "epilogue_random",
            "epilogue",
            _int8(g, (16, 64)),
            _int8(g, (24, 64)),
            _token_scales(g, 16),
            _weight_scales(g, 24),
        )
    )
    g = _gen("acc_int16")
    sign = torch.where(torch.rand(8, 1, generator=g) < 0.25, -1, 1)
    a = (torch.randint(64, 128, (8, 64), generator=g) * sign).to(torch.int8)
    cases.append(
        _case("acc_int16", "accumulator", a, _int8(g, (16, 64), 64, 128), _pow2(g, 8, -14, -10), _pow2(g, 16, -12, -8))
    )
    g = _gen("acc_bf16")
    cases.append(
        _case(
            "acc_bf16",
            "accumulator",
            _int8(g, (8, 1024)),
            _int8(g, (16, 1024)),
            _pow2(g, 8, -14, -10),
            _pow2(g, 16, -12, -8),
        )
    )
    cases.append(_case("acc_fp32", "accumulator", *_fp32_case()))
    ep = cases[0]
    g = _gen("batch")
    extra = BATCH_N - ep.shape[2]
    w = torch.cat([ep.w, _int8(g, (extra, BATCH_K))])
    s_w = torch.cat([ep.s_w, _weight_scales(g, extra)])
    (p0, s0), (p1, s1) = _probe_rows(ep)
    cases.append(_case("batch_m0001", "batch", p0, w, s0, s_w, {"P0": 0}))
    cases.append(_case("batch_m0001b", "batch", p1, w, s1, s_w, {"P1": 0}))
    for m in batch_ms:
        if m < 2:
            continue
        gm = _gen("batch", m)
        a, s_a = _int8(gm, (m, BATCH_K)), _token_scales(gm, m)
        a[0], a[m - 1], s_a[0], s_a[m - 1] = p0[0], p1[0], s0[0], s1[0]
        cases.append(_case(f"batch_m{m:04d}", "batch", a, w, s_a, s_w, {"P0": 0, "P1": m - 1}))
    return VectorSet(cases, SEED, [(FORMULAS[i], FORMULAS[j]) for i, j in unseparated])


def tensors_of(vs: VectorSet) -> list:
    """(name, tensor) pairs of the export, in case order: CASE.a/.w/.s_a/.s_w/.expected.FORMULA."""
    out = []
    for c in vs.cases:
        out += [(f"{c.name}.a", c.a), (f"{c.name}.w", c.w), (f"{c.name}.s_a", c.s_a), (f"{c.name}.s_w", c.s_w)]
        out += [(f"{c.name}.expected.{f}", c.expected[f]) for f in FORMULAS]
    return out


def describe(vs: VectorSet) -> dict:
    """The vectors.json document."""
    cases = []
    for c in vs.cases:
        m, k, n = c.shape
        row = {
            "name": c.name,
            "kind": c.kind,
            "shape": {"m": m, "k": k, "n": n},
            "tensors": {t: f"{c.name}.{t}" for t in ("a", "w", "s_a", "s_w")},
            "expected": {f: f"{c.name}.expected.{f}" for f in FORMULAS},
        }
        if c.probes:
            row["probes"] = dict(c.probes)
        cases.append(row)
    return {
        "tool": "requant conform vectors",
        "seed": vs.seed,
        "sha256": vs.digest(),
        "contract": "a int8 [M, K], w int8 [N, K], s_a fp32 [M, 1], s_w fp32 [N, 1] -> y bf16 [M, N] = scaled_mm(a, w, s_a, s_w); "
        "expected tensors hold each formula's bf16 bits on the exact int32 accumulator",
        "how_to_check": "a kernel implements FORMULA on these vectors iff its output equals CASE.expected.FORMULA bit for bit "
        "in every case; batch cases also hold probe rows whose outputs must equal those of batch_m0001 (P0) "
        "and batch_m0001b (P1)",
        "cases": cases,
        "formulas": {f: FORMULA_TITLES[f] for f in FORMULAS},
    }


EXPORT_FILES = ("vectors.safetensors", "vectors.json")


def export_items(vs: VectorSet, directory: Path | str) -> list:
    """The (destination, render) pairs of DIR/vectors.safetensors and DIR/vectors.json, for
    requant.io.output.write_files_atomic (so that they can be published with other files as one set)."""

    d = Path(directory)
    tensors = tensors_of(vs)
    digest = vs.digest()
    prefix, _ = serialize_header(
        [(n, TORCH_TO_ST[t.dtype], tuple(t.shape)) for n, t in tensors],
        {"format": "pt", "seed": str(vs.seed), "sha256": digest},
    )

    def write_st(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(prefix)
            for _, t in tensors:
                f.write(tensor_to_bytes(t))

    def write_js(tmp: Path) -> None:
        tmp.write_text(json.dumps(describe(vs), indent=1) + "\n")

    return [(d / EXPORT_FILES[0], write_st), (d / EXPORT_FILES[1], write_js)]


def export(vs: VectorSet, directory: Path | str) -> list[Path]:
    """DIR/vectors.safetensors and DIR/vectors.json, both rendered to temporaries in DIR
    first and renamed only when both are complete (requant.io.output.write_files_atomic): a
    reader sees the old pair or the new pair, never a partial file."""

    return write_files_atomic(export_items(vs, directory))
