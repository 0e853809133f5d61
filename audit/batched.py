"""Batched evaluation of one Linear's cells: every variant and check at once, on the operands' device.

Equal, cell by cell, to suite.evaluate_cell over audit_layer's cells (the per-cell path, kept as
the oracle; REQUANT_AUDIT_PER_CELL=1 forces it). How, and why the two agree (docs/audit.md,
"Batched evaluation"):

  * A Linear's operand sets (one per prefill, one per decode batch size and step: "segments")
    are concatenated along M. Every computation of a cell before its statistics is row-wise (the
    exact accumulator, each fp32 epilogue, F6's tile accumulation, F7's wrap), so on the
    concatenation it gives each segment's rows bit for bit; the accumulator is computed once and
    shared by every epilogue variant and every declared-order emulation.
  * What is not row-wise is drawn per segment from the same seeded generators, with the same
    calls, as audit/faults.py: `one` needs the count of changed elements (F1..F5) or of non-zero
    activation scales (F9a), brought back in one small tensor per Linear; `1pct` and F9b are
    index draws that depend on M*N or M*K alone.
  * Statistics (mismatches, largest distance, ULP histogram) and check flags (C1, C4, C5, C6, C8)
    are reduced per (cell, segment) on the device into one int64 tensor per Linear, read back
    once. C2 and C7 cannot fire on per-layer cells (every run shares the weight tensors; no
    logits) and C3 is static: they are decided by the per-cell check functions, on host metadata.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from requant.audit.checks import CHECKS, FIRE, NOT_APPLICABLE, ORDER_EPILOGUES, SILENT
from requant.audit.device_acc import exact_accumulate
from requant.audit.f6_tiles import f6_accumulator
from requant.audit.faults import (
    _EPILOGUE_FAULTS,
    F9A_FACTOR,
    FAULT_KERNELS,
    VARIANTS,
    LayerCase,
    seed_for,
    shift_int8_by_one,
    wrap_int16,
)
from requant.audit.matrix import baseline_variant
from requant.audit.records import REFERENCE_KERNEL, Activations, KernelDesc, Run, Weights
from requant.audit.scoring import HIST_BINS, CellResult
from requant.kernels.bf16 import is_power_of_two
from requant.kernels.reference import epilogue_triton_order

PER_CELL_ENV = "REQUANT_AUDIT_PER_CELL"
_EPI = ("F1", "F2", "F3", "F4", "F5")
_STAT = 5 + HIST_BINS  # mismatches, max_ulp, c1, c4, c8, histogram
_CHUNK_ELEMENTS = 1 << 25  # cells x rows x columns per statistics pass (bounds device memory)


def per_cell_forced() -> bool:
    """The per-cell path (the oracle) when REQUANT_AUDIT_PER_CELL is set to anything but 0."""
    return os.environ.get(PER_CELL_ENV, "0") not in ("", "0")


@dataclass
class Segment:
    """One operand set of a Linear: `label` is the cell's layer name (and its seed)."""

    label: str
    act: Activations
    outs: dict  # backend -> bf16 [M, N], the real kernels' outputs on these operands


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without a stream synchronisation (pinned, non-blocking) on CUDA."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _gen(label: str, regime: str, variant_id: str) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed_for(label, regime, variant_id))


def _ordinal(bits16: torch.Tensor) -> torch.Tensor:
    b = bits16.to(torch.int32) & 0xFFFF
    return torch.where(b >= 0x8000, 0x8000 - b, b)


def _seg_reduce(rows: torch.Tensor, seg: torch.Tensor, n_seg: int, how: str) -> torch.Tensor:
    """[C, R] per-row values -> [C, S] per segment (sum or amax)."""
    c = rows.shape[0]
    out = torch.zeros(c, n_seg, dtype=torch.int64, device=rows.device)
    if how == "sum":
        return out.index_add_(1, seg, rows.to(torch.int64))
    return out.scatter_reduce_(1, seg.expand(c, -1), rows.to(torch.int64), "amax", include_self=True)


_BIN_BOUNDS: dict = {}
# Host shortcuts (read-backs that cost nothing without a device queue): None = on CPU tensors only;
# False forces the device code path everywhere (the tests run it on the CPU too).
HOST_SHORTCUTS: bool | None = None


def _host(dev: torch.device) -> bool:
    return dev.type == "cpu" if HOST_SHORTCUTS is None else HOST_SHORTCUTS


def _stats(ys: torch.Tensor, ref: torch.Tensor, seg: torch.Tensor, n_seg: int, subset: bool = True) -> torch.Tensor:
    """[C, S, 2 + HIST_BINS]: mismatching elements, largest bf16 distance (ulp_distance: NaN on
    either side is 2**31) and scoring.ulp_histogram's bins (floor(log2 d) of every d > 0), per cell
    and segment."""
    c, r, n = ys.shape
    dev = ys.device
    yb, rb = ys.view(torch.int16), ref.view(torch.int16)
    neq = _seg_reduce((yb != rb).sum(dim=2), seg, n_seg, "sum")
    if _host(dev) and subset:  # no device to keep busy: distances only for cells that changed
        changed = (neq > 0).any(dim=1).nonzero().reshape(-1)
        out = torch.zeros(c, n_seg, 2 + HIST_BINS, dtype=torch.int64)
        out[:, :, 0] = neq
        if changed.numel():  # unchanged cells: distance and histogram are never read (not observable)
            out[changed] = _stats(ys[changed], ref, seg, n_seg, subset=False)
        return out
    d = (_ordinal(yb) - _ordinal(rb)).abs_()  # int32, <= 2**16 where neither side is NaN
    nan = torch.isnan(ys) | torch.isnan(ref)
    row_max = torch.where(nan.any(dim=2), 2**31, d.amax(dim=2).to(torch.int64))
    mx = _seg_reduce(row_max, seg, n_seg, "amax")
    if dev not in _BIN_BOUNDS:
        _BIN_BOUNDS[dev] = torch.tensor([2**j for j in range(1, 17)], dtype=torch.int32, device=dev)
    # floor(log2 d) for 1 <= d <= 2**16 (the number of powers of two 2..2**16 not above d); NaN: 31
    b = torch.bucketize(d, _BIN_BOUNDS[dev], right=True).masked_fill_(nan, 31)
    row_key = (torch.arange(c, device=dev).view(c, 1) * n_seg + seg.view(1, r)) * HIST_BINS  # [C, R]
    keep = (d > 0) | nan
    if _host(dev):  # only the changed elements (few); no device to keep busy
        key = (row_key.unsqueeze(2) + b)[keep]
        hist = torch.bincount(key, minlength=c * n_seg * HIST_BINS)
    else:  # every element, the unchanged ones into a spare bin: no host synchronisation
        key = torch.where(keep, row_key.unsqueeze(2) + b, c * n_seg * HIST_BINS)
        hist = torch.zeros(c * n_seg * HIST_BINS + 1, dtype=torch.int64, device=dev)
        hist.index_add_(0, key.reshape(-1), torch.ones(key.numel(), dtype=torch.int64, device=dev))
    hist = hist[: c * n_seg * HIST_BINS].view(c, n_seg, HIST_BINS)
    return torch.cat([neq.unsqueeze(2), mx.unsqueeze(2), hist], dim=2)


def _any_diff(x: torch.Tensor, y: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """[S] 0/1: does any element of a segment's rows differ (bitwise, same dtype)?"""
    if x.dtype.is_floating_point:
        x, y = (
            x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]),
            y.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[y.element_size()]),
        )
    ne = (x != y).reshape(x.shape[0], -1).sum(dim=1)
    return (_seg_reduce(ne.unsqueeze(0), seg, n_seg, "sum")[0] > 0).to(torch.int64)


def _value_diff(acc_test: torch.Tensor, acc: torch.Tensor, seg: torch.Tensor, n_seg: int) -> torch.Tensor:
    """C4's comparison: the accumulators as exact values (float64 holds int32 and bf16/fp32)."""
    ne = (acc_test.to(torch.float64) != acc.to(torch.float64)).sum(dim=1)
    return (_seg_reduce(ne.unsqueeze(0), seg, n_seg, "sum")[0] > 0).to(torch.int64)


@dataclass
class _Cell:
    variant: str
    family: str
    severity: str
    kernel: KernelDesc
    y: torch.Tensor  # [R, N] bf16
    want: torch.Tensor | bool | None  # the declared order's output on the run's own operands (C8)
    c1: torch.Tensor | None  # [S] 0/1 operands differ from the reference's; None: shared operands
    c4: torch.Tensor | None  # [S] 0/1 accumulator differs; None: the reference's own accumulator
    has_acc: bool  # the run hands an accumulator to the checks (C4 applicable if the kernel exposes it)


class Pending:
    """One Linear's device results, waiting for the host read (Pending.resolve)."""

    def __init__(self, regime, segments, cells, packed, k, wt):
        self.regime, self.packed, self.k, self.wt = regime, packed, k, wt
        self._static: dict = {}  # (check, kernel) -> outcome of a check that reads K and the kernel only
        # keep what resolve reads, not the [R, N] tensors (a window of Linears waits for one read)
        self.segments = [Segment(s.label, s.act, {}) for s in segments]
        self.cells = [
            _Cell(c.variant, c.family, c.severity, c.kernel, None, c.want is not None, None, None, c.has_acc)
            for c in cells
        ]

    def resolve(self, values: list[int], checks: tuple[str, ...]) -> list[tuple[dict, list[CellResult]]]:
        """Per segment: (the pair's per_layer row, its cells in audit_layer's order)."""
        from requant.audit.compare import layer_row

        n_seg = len(self.segments)
        pow2 = bool(values[0])
        pair = values[1 : 1 + 2 * n_seg]
        stats = values[1 + 2 * n_seg :]
        out = []
        for s, seg in enumerate(self.segments):
            m = seg.act.a.shape[0]
            n = self.wt.w.shape[0]
            mism, mx = pair[2 * s], pair[2 * s + 1]
            row = layer_row(seg.label, self.regime, mism == 0, mism, mx if mism else 0, (m, self.k, n))
            cells = []
            for c, cell in enumerate(self.cells):
                base = (c * n_seg + s) * _STAT
                st = stats[base : base + _STAT]
                cells.append(self._cell(seg, cell, st, pow2, checks))
            out.append((row, cells))
        return out

    def _cell(self, seg: Segment, cell: _Cell, st: list[int], pow2: bool, checks) -> CellResult:
        mism, mx, c1, c4, c8 = st[:5]
        observable = mism > 0
        outcomes = {}
        for cid in checks:
            if cid == "C1":
                outcomes[cid] = FIRE if c1 else SILENT
            elif cid == "C4":
                applicable = cell.has_acc and cell.kernel.exposes_acc
                outcomes[cid] = (FIRE if c4 else SILENT) if applicable else NOT_APPLICABLE
            elif cid == "C5":
                outcomes[cid] = (FIRE if observable else SILENT) if pow2 else NOT_APPLICABLE
            elif cid == "C6":
                outcomes[cid] = FIRE if observable and mx > 1 else SILENT
            elif cid == "C2":  # every run holds the reference's own Weights object: one digest
                outcomes[cid] = SILENT
            elif cid == "C8":
                outcomes[cid] = (FIRE if c8 else SILENT) if cell.want else NOT_APPLICABLE
            else:  # C3, C7: decided on host metadata (K, the kernel) by the per-cell functions themselves
                key = (cid, cell.kernel)
                if key not in self._static:
                    ref = Run(seg.act, self.wt, None, None, REFERENCE_KERNEL)
                    test = Run(seg.act, self.wt, None, None, cell.kernel)
                    self._static[key] = CHECKS[cid](ref, test, cell.kernel).outcome
                outcomes[cid] = self._static[key]
        hist = list(st[5:]) if observable else []
        return CellResult(
            seg.label, self.regime, cell.variant, cell.family, cell.severity, observable, mism, mx if observable else 0,
            outcomes, hist,
        )  # fmt: skip


def evaluate_linear(
    regime: str, segments: list[Segment], wt: Weights, backends: tuple[str, str], backend_kernel
) -> Pending | None:
    """Queue the batched evaluation of one Linear's segments; None when the per-cell path must
    run instead (an empty operand, an output that is not bf16 [M, N], M*N beyond 2**31)."""
    n = wt.w.shape[0]
    k = wt.w.shape[1]
    dev = wt.w.device
    pair = tuple(dict.fromkeys(backends))
    for sg in segments:
        m = sg.act.a.shape[0]
        if m == 0 or n == 0 or k == 0 or m * max(n, k) >= 2**31:
            return None
        for b in pair:
            y = sg.outs[b]
            if not isinstance(y, torch.Tensor) or y.dtype != torch.bfloat16 or tuple(y.shape) != (m, n):
                return None
            if y.device != dev:
                return None
    n_seg = len(segments)
    ms = [sg.act.a.shape[0] for sg in segments]
    r0 = [sum(ms[:i]) for i in range(n_seg)]
    seg = torch.repeat_interleave(torch.arange(n_seg), torch.tensor(ms))
    seg = _to_device(seg, dev)
    a = torch.cat([sg.act.a for sg in segments]) if n_seg > 1 else segments[0].act.a
    s_a = torch.cat([sg.act.s_a for sg in segments]) if n_seg > 1 else segments[0].act.s_a
    acc = exact_accumulate(a, wt.w)
    ref_y = epilogue_triton_order(acc, s_a, wt.s_w)
    case = LayerCase("batched", regime, Activations(a, s_a), wt, acc, Run(None, wt, acc, ref_y, REFERENCE_KERNEL))
    faulty = {fam: _EPILOGUE_FAULTS[fam](case) for fam in _EPI}
    want: dict[str, torch.Tensor] = {}

    def declared(order):
        if order is None:
            return None
        if order not in want:
            want[order] = ORDER_EPILOGUES[order](acc, s_a, wt.s_w)
        return want[order]

    # One read-back: changed elements per (segment, F1..F5) and non-zero activation scales per segment.
    counts = [
        _seg_reduce((faulty[f].view(torch.int16) != ref_y.view(torch.int16)).sum(dim=1).unsqueeze(0), seg, n_seg, "sum")
        for f in _EPI
    ]
    counts.append(_seg_reduce((s_a.reshape(1, -1) != 0).to(torch.int64), seg, n_seg, "sum"))
    # Data-independent draws (1pct, F9b) on the host while the device works, then the one read-back.
    pct = {f: _draw_indices(segments, regime, f"{f}.1pct", ms, r0, n, dev) for f in _EPI}
    pct["F9"] = _draw_indices(segments, regime, "F9.1pct", ms, r0, k, dev)
    counts = torch.cat(counts).tolist()  # [6][S]

    cells: list[_Cell] = []
    for b in pair:
        kd = backend_kernel(b)
        y = torch.cat([sg.outs[b] for sg in segments]) if n_seg > 1 else segments[0].outs[b]
        cells.append(_Cell(baseline_variant(b), "B", "none", kd, y, declared(kd.declared_order), None, None, False))
    by_variant = {}
    for i, fam in enumerate(_EPI):
        kd = FAULT_KERNELS[fam]
        ys = _severities(fam, faulty[fam], ref_y, counts[i], pct[fam], segments, regime, ms, r0, n)
        for sev, y in ys.items():
            by_variant[f"{fam}.{sev}"] = _Cell(
                f"{fam}.{sev}", fam, sev, kd, y, declared(kd.declared_order), None, None, True
            )
    acc6 = f6_accumulator(a, wt.w)  # one Triton launch on CUDA (audit/f6_tiles.py)
    kd = FAULT_KERNELS["F6"]
    y6 = epilogue_triton_order(acc6, s_a, wt.s_w)
    by_variant["F6.all"] = _Cell(
        "F6.all", "F6", "all", kd, y6, declared(kd.declared_order), None, _value_diff(acc6, acc, seg, n_seg), True
    )
    acc7 = wrap_int16(acc)
    kd = FAULT_KERNELS["F7"]
    y7 = epilogue_triton_order(acc7, s_a, wt.s_w)
    by_variant["F7.all"] = _Cell(
        "F7.all", "F7", "all", kd, y7, declared(kd.declared_order), None, _value_diff(acc7, acc, seg, n_seg), True
    )
    kd = FAULT_KERNELS["F8"]
    y8 = epilogue_triton_order(acc, s_a, wt.s_w)
    by_variant["F8.all"] = _Cell("F8.all", "F8", "all", kd, y8, declared(kd.declared_order), None, None, True)
    by_variant.update(_operand_faults(regime, segments, a, s_a, acc, wt, counts[5], pct["F9"], ms, r0, seg, n_seg))
    cells += [by_variant[v.id] for v in VARIANTS]

    y_a = torch.cat([sg.outs[backends[0]] for sg in segments]) if n_seg > 1 else segments[0].outs[backends[0]]
    y_b = torch.cat([sg.outs[backends[1]] for sg in segments]) if n_seg > 1 else segments[0].outs[backends[1]]
    pair_stats = _stats(y_b.unsqueeze(0), y_a, seg, n_seg)[0, :, :2].reshape(-1)  # [S * 2]
    per_cell = []
    rows = a.shape[0]
    step = max(1, _CHUNK_ELEMENTS // max(1, rows * n))
    for c0 in range(0, len(cells), step):
        chunk = cells[c0 : c0 + step]
        st = _stats(torch.stack([c.y for c in chunk]), ref_y, seg, n_seg)  # [C, S, 2 + HIST]
        zero = torch.zeros(n_seg, dtype=torch.int64, device=dev)
        flags = []
        for c in chunk:
            c1 = zero if c.c1 is None else c.c1
            c4 = zero if c.c4 is None else c.c4
            c8 = zero if c.want is None else _any_diff(c.y, c.want, seg, n_seg)
            flags.append(torch.stack([c1, c4, c8], dim=1))  # [S, 3]
        fl = torch.stack(flags)  # [C, S, 3]
        per_cell.append(torch.cat([st[:, :, :2], fl, st[:, :, 2:]], dim=2).reshape(-1))
    pow2 = is_power_of_two(wt.s_w).all().to(torch.int64).reshape(1)
    packed = torch.cat([pow2, pair_stats, *per_cell])
    return Pending(regime, segments, cells, packed, k, wt)


def _draw_indices(segments, regime, variant_id, ms, r0, width, dev) -> torch.Tensor:
    """The `1pct` draws of every segment (ceil(1% of M * width) seeded indices of its [M, width]
    block, faults.severity_mask / F9b), as flat indices of the concatenation, on the device.
    F9b's torch.unique is left out: assigning a shifted value twice writes the same bits."""
    draws = []
    for s, sg in enumerate(segments):
        g = _gen(sg.label, regime, variant_id)
        size = ms[s] * width
        draws.append(torch.randint(0, size, (math.ceil(0.01 * size),), generator=g) + r0[s] * width)
    return _to_device(torch.cat(draws), dev)


def _severities(fam, y_fault, ref_y, changed, idx, segments, regime, ms, r0, n) -> dict:
    """F1..F5 at `one`, `1pct` and `all` (faults.severity_mask's draws, per segment)."""
    dev = ref_y.device
    flat_f = y_fault.reshape(-1)
    one_pos = []
    need_search, targets = [], []
    base = 0
    for s, sg in enumerate(segments):
        mn = ms[s] * n
        g = _gen(sg.label, regime, f"{fam}.one")
        if changed[s]:
            pick = int(torch.randint(0, changed[s], (1,), generator=g))
            need_search.append(s)
            targets.append(base + pick + 1)
            one_pos.append(None)
        else:
            one_pos.append(r0[s] * n + int(torch.randint(0, mn, (1,), generator=g)))
        base += changed[s]
    pos = torch.tensor([p if p is not None else 0 for p in one_pos], dtype=torch.int64)
    pos = _to_device(pos, dev)
    if need_search:
        changed_flat = (y_fault.view(torch.int16) != ref_y.view(torch.int16)).reshape(-1)
        csum = torch.cumsum(changed_flat.to(torch.int64), 0)
        found = torch.searchsorted(csum, _to_device(torch.tensor(targets, dtype=torch.int64), dev))
        pos = pos.index_copy(0, _to_device(torch.tensor(need_search, dtype=torch.int64), dev), found)
    y_one = ref_y.clone().reshape(-1)
    y_one[pos] = flat_f[pos]
    y_pct = ref_y.clone().reshape(-1)
    y_pct[idx] = flat_f[idx]
    return {"one": y_one.view_as(ref_y), "1pct": y_pct.view_as(ref_y), "all": y_fault}


def _operand_faults(regime, segments, a, s_a, acc, wt, nonzero, idx, ms, r0, seg, n_seg) -> dict:
    """F9a, F9b, F9c (faults._operand_fault's draws, per segment) on the concatenation."""
    dev = a.device
    kd = FAULT_KERNELS["F9"]
    out = {}
    # F9a: one activation scale x F9A_FACTOR, a seeded row among the non-zero ones
    rows, need, targets, base = [], [], [], 0
    for s, sg in enumerate(segments):
        g = _gen(sg.label, regime, "F9.one")
        cnt = nonzero[s] if nonzero[s] else ms[s]
        pick = int(torch.randint(0, cnt, (1,), generator=g))
        if nonzero[s]:
            need.append(s)
            targets.append(base + pick + 1)
            rows.append(0)
        else:
            rows.append(r0[s] + pick)
        base += nonzero[s]
    rows_t = _to_device(torch.tensor(rows, dtype=torch.int64), dev)
    if need:
        csum = torch.cumsum((s_a.reshape(-1) != 0).to(torch.int64), 0)
        found = torch.searchsorted(csum, _to_device(torch.tensor(targets, dtype=torch.int64), dev))
        rows_t = rows_t.index_copy(0, _to_device(torch.tensor(need, dtype=torch.int64), dev), found)
    s_new = s_a.clone()
    s_new[rows_t] = s_new[rows_t] * F9A_FACTOR
    y = epilogue_triton_order(acc, s_new, wt.s_w)
    c1 = _any_diff(s_new, s_a, seg, n_seg)
    want = ORDER_EPILOGUES[kd.declared_order](acc, s_new, wt.s_w)
    out["F9.one"] = _Cell("F9.one", "F9", "one", kd, y, want, c1, None, True)
    # F9b: 1% of the int8 activations shifted by one
    flat = a.reshape(-1).clone()
    flat[idx] = shift_int8_by_one(flat[idx])
    a_b = flat.view_as(a)
    acc_b = exact_accumulate(a_b, wt.w)
    y = epilogue_triton_order(acc_b, s_a, wt.s_w)
    want = ORDER_EPILOGUES[kd.declared_order](acc_b, s_a, wt.s_w)
    out["F9.1pct"] = _Cell(
        "F9.1pct", "F9", "1pct", kd, y, want, _any_diff(a_b, a, seg, n_seg), _value_diff(acc_b, acc, seg, n_seg), True
    )
    # F9c: every int8 activation shifted by one
    a_c = shift_int8_by_one(a)
    acc_c = exact_accumulate(a_c, wt.w)
    y = epilogue_triton_order(acc_c, s_a, wt.s_w)
    want = ORDER_EPILOGUES[kd.declared_order](acc_c, s_a, wt.s_w)
    out["F9.all"] = _Cell(
        "F9.all", "F9", "all", kd, y, want, _any_diff(a_c, a, seg, n_seg), _value_diff(acc_c, acc, seg, n_seg), True
    )
    return out


def resolve_all(pendings: list[Pending], checks: tuple[str, ...]) -> list[list[tuple[dict, list[CellResult]]]]:
    """One host read for several Linears' results."""
    if not pendings:
        return []
    values = torch.cat([p.packed for p in pendings]).tolist()
    out, at = [], 0
    for p in pendings:
        n = p.packed.numel()
        out.append(p.resolve(values[at : at + n], checks))
        at += n
    return out
