"""Batched evaluation of one Linear's cells: every variant and check at once, on the operands' device.

Equal, cell by cell, to cells.evaluate_cell over audit_layer's cells (the per-cell path, kept as
the oracle; REQUANT_AUDIT_PER_CELL=1 forces it). start_linear queues a Linear's work (its operand
sets, one per prefill or decode step, concatenated along M); Started.finish reads the counts a
`one` severity needs once the next Linear is queued; Read brings a window of Linears' results
back without blocking, and resolves them into per-layer rows and cells.

How, and why the two agree: docs/audit.md#batched-evaluation.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from dataclasses import dataclass

import torch

from requant.audit.batched_stats import any_diff, cell_stats, seg_reduce, value_diff
from requant.audit.catalogue.checks import CHECKS, FIRE, NOT_APPLICABLE, ORDER_EPILOGUES, SILENT
from requant.audit.catalogue.faults import (
    _EPILOGUE_FAULTS,
    F9A_FACTOR,
    FAULT_KERNELS,
    VARIANTS,
    LayerCase,
    seed_for,
    shift_int8_by_one,
    wrap_int16,
)
from requant.audit.catalogue.matrix import baseline_variant
from requant.audit.catalogue.scoring import HIST_BINS, CellResult, kernel_fault
from requant.audit.compare import layer_row
from requant.audit.device_acc import exact_accumulate
from requant.audit.f6_tiles import f6_accumulator
from requant.audit.records import REFERENCE_KERNEL, Activations, KernelDesc, Run, Weights
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


_GEN = threading.local()


def _gen(label: str, regime: str, variant_id: str) -> torch.Generator:
    """The cell's seeded CPU generator (faults._generator's seed and draws). One generator per
    thread, reseeded: the draws are a function of the seed alone, and a new generator costs as
    much as the draw (about 1.5 us of 5, tens of thousands of draws a regime on an MoE model)."""
    g = getattr(_GEN, "g", None)
    if g is None:
        g = _GEN.g = torch.Generator(device="cpu")
    return g.manual_seed(seed_for(label, regime, variant_id))


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
    backend: str | None = None  # a baseline cell's backend: its cell, whatever order it declares

    @property
    def key(self) -> str:
        """The cell's name within its Linear: a baseline belongs to a backend, not to an order (two
        backends that declare one order have two cells, and the pair compares theirs)."""
        return self.variant if self.backend is None else f"B:{self.backend}"


class Pending:
    """One Linear's device results, waiting for the host read (Pending.resolve)."""

    def __init__(self, regime, segments, cells, packed, k, wt):
        self.regime, self.packed, self.k, self.wt = regime, packed, k, wt
        self._static: dict = {}  # (check, kernel) -> outcome of a check that reads K and the kernel only
        self._outcomes: dict = {}  # resolve's key -> its outcomes dict, shared by the cells of that key
        # keep what resolve reads, not the [R, N] tensors (a window of Linears waits for one read)
        self.segments = [Segment(s.label, s.act, {}) for s in segments]
        self.cells = [
            _Cell(c.variant, c.family, c.severity, c.kernel, None, c.want is not None, None, None, c.has_acc, c.backend)
            for c in cells
        ]

    def resolve(self, values: list[int], checks: tuple[str, ...]) -> list[tuple[dict, list[CellResult]]]:
        """Per segment: (the pair's per_layer row, its cells in audit_layer's order)."""

        n_seg = len(self.segments)
        pow2s = values[:n_seg]  # per segment: its Linear's weight scales all powers of two
        pair = values[n_seg : 3 * n_seg]
        end = 3 * n_seg + len(self.cells) * n_seg * _STAT
        stats = values[3 * n_seg : end]
        evidence = values[end:]  # [baseline cell, S, 5]: differing elements, first row, column, bits
        out = []
        n = self.wt.w.shape[0]
        memo, regime = self._outcomes, self.regime
        for s, seg in enumerate(self.segments):
            m = seg.act.a.shape[0]
            shape = (m, self.k, n)
            pow2 = bool(pow2s[s])
            mism, mx = pair[2 * s], pair[2 * s + 1]
            row = layer_row(seg.label, regime, mism == 0, mism, mx if mism else 0, shape)
            cells = []
            for c, cell in enumerate(self.cells):
                base = (c * n_seg + s) * _STAT
                mism, mx, c1, c4, c8 = stats[base : base + 5]
                observable = mism > 0
                # The outcomes are a function of the cell (its kernel and what it hands the checks),
                # these few statistics and the segment's pow2 flag: built once per distinct key and
                # shared, read only (about 9 us a cell in all, 1.7 M cells in a 30B-A3B audit).
                key = (c, c1 != 0, c4 != 0, c8 != 0, observable, mx > 1, pow2)
                outcomes = memo.get(key)
                if outcomes is None:
                    outcomes = memo[key] = self._outcomes_of(seg, cell, c1, c4, c8, observable, mx, pow2, checks)
                res = CellResult(
                    seg.label, regime, cell.variant, cell.family, cell.severity, observable, mism,
                    mx if observable else 0, outcomes, stats[base + 5 : base + _STAT] if observable else [], shape=shape,
                )  # fmt: skip
                if cell.backend is not None:  # the baseline cells come first (finish's order)
                    count, *first = evidence[(c * n_seg + s) * 5 : (c * n_seg + s + 1) * 5]
                    res.backend = cell.backend
                    res.fault = kernel_fault(outcomes, m, count, tuple(first) if count else None)
                cells.append(res)
            out.append((row, cells))
        return out

    def _outcomes_of(self, seg, cell: _Cell, c1, c4, c8, observable, mx, pow2, checks) -> dict:
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
        return outcomes


def evaluate_linear(
    regime: str, segments: list[Segment], wt: Weights, backends: tuple[str, str], backend_kernel, parts=None
) -> Pending | None:
    """The batched evaluation of one Linear's segments, queued on the device; None when the
    per-cell path must run instead (an empty operand, an output that is not bf16 [M, N], M*N
    beyond 2**31). start_linear + Started.finish in one call."""
    work = start_linear(regime, segments, wt, backends, backend_kernel, parts)
    return None if work is None else work.finish()


def start_linear(
    regime: str, segments: list[Segment], wt: Weights, backends: tuple[str, str], backend_kernel, parts=None
) -> Started | None:
    """Queue every cell that needs no host read; Started.finish() reads the six `one` draws' counts
    (copied back without blocking, so that a caller can queue the next Linear first) and queues the
    rest. None: as evaluate_linear.

    parts: None (every segment is an operand set of `wt`), or one Weights per segment: Linears of
    one weight shape evaluated together (Qwen3-MoE experts), `wt` then only names the shape and
    device; segments of one Linear must be adjacent and share its Weights object."""
    n = wt.w.shape[0]
    k = wt.w.shape[1]
    dev = wt.w.device
    pair = tuple(dict.fromkeys(backends))
    if parts is not None:
        if len(parts) != len(segments):
            return None
        for p in parts:
            if p.w.shape != wt.w.shape or p.w.device != dev or tuple(p.s_w.shape) != (n, 1) or p.s_w.device != dev:
                return None
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
    w = Started(regime, segments, wt, backends, dev, parts)
    w.start(backend_kernel)
    return w


class Started:
    """One Linear's batched evaluation between its two halves (start_linear, finish)."""

    def __init__(self, regime, segments, wt, backends, dev, parts=None):
        self.regime, self.segments, self.wt, self.backends, self.dev = regime, segments, wt, backends, dev
        self.n_seg = len(segments)
        self.ms = [sg.act.a.shape[0] for sg in segments]
        self.r0 = [0, *itertools.accumulate(self.ms)][:-1]
        # row ranges [r0, r1) of one weight (adjacent segments of one Linear merged): the accumulators
        # are computed per range, the epilogues over every row at once with per-row scales
        self.runs = [(0, sum(self.ms), wt)]
        if parts is not None:
            runs = []
            for p, r, m in zip(parts, self.r0, self.ms):
                if runs and runs[-1][2] is p:
                    runs[-1][1] = r + m
                else:
                    runs.append([r, r + m, p])
            self.runs = [tuple(x) for x in runs]
        # a group of one Linear (a shape's last few puts, a Linear over the group bound) is that
        # Linear alone: its [N, 1] scales, not a materialised [R, N, 1] of one row repeated
        self.grouped = len(self.runs) > 1
        if parts is not None and not self.grouped:
            self.wt = self.runs[0][2]
        self.stat_of: dict = {}  # variant -> [S, _STAT] device tensor
        self.cells: dict = {}  # variant -> _Cell

    def accumulate(self, fn, x: torch.Tensor) -> torch.Tensor:
        """fn(rows, w) (an exact accumulator: each output row depends on its own row alone) over
        every row range with its own weight, concatenated."""
        if len(self.runs) == 1:
            return fn(x, self.runs[0][2].w)
        return torch.cat([fn(x[r0:r1], p.w) for r0, r1, p in self.runs])

    def start(self, backend_kernel) -> None:
        segments, regime, dev, wt, n_seg, ms, r0 = (
            self.segments, self.regime, self.dev, self.wt, self.n_seg, self.ms, self.r0,
        )  # fmt: skip
        n, k = wt.w.shape
        seg = torch.repeat_interleave(torch.arange(n_seg), torch.tensor(ms))
        self.seg = seg = _to_device(seg, dev)
        a = torch.cat([sg.act.a for sg in segments]) if n_seg > 1 else segments[0].act.a
        s_a = torch.cat([sg.act.s_a for sg in segments]) if n_seg > 1 else segments[0].act.s_a
        self.a, self.s_a = a, s_a
        self.acc = acc = self.accumulate(exact_accumulate, a)
        if self.grouped:  # each row's own Linear's scales, [R, N, 1] (kernels.reference.scale_row)
            s_w = torch.cat([p.s_w.reshape(1, n, 1).expand(r1 - r0, n, 1) for r0, r1, p in self.runs])
            self.wt = wt = Weights(wt.w, s_w)
        self.ref_y = ref_y = epilogue_triton_order(acc, s_a, wt.s_w)
        case = LayerCase("batched", regime, Activations(a, s_a), wt, acc, Run(None, wt, acc, ref_y, REFERENCE_KERNEL))
        self.faulty = faulty = {fam: _EPILOGUE_FAULTS[fam](case) for fam in _EPI}
        # The declared orders' outputs on the shared operands: triton-order is the reference's own
        # epilogue (ref_y: C8 is then "the output differs from the reference", the statistics' count)
        # and cutlass-order is F3's.
        self.want = {"triton-order": ref_y, "cutlass-order": faulty["F3"]}
        declared = self.declared

        # changed elements per (segment, F1..F5) and non-zero activation scales per segment: the
        # `one` draws' counts, copied to the host without blocking (read by finish)
        ref16 = ref_y.view(torch.int16)
        counts = torch.stack(
            [(faulty[f].view(torch.int16) != ref16).sum(dim=1) for f in _EPI] + [(s_a.reshape(-1) != 0).to(torch.int64)]
        )  # [6, R]
        counts = seg_reduce(counts, seg, n_seg, "sum")  # [6, S]
        if dev.type == "cuda":
            self.counts = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
            self.counts.copy_(counts, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.counts, self.event = counts, None
        # data-independent draws (1pct, F9b) on the host
        draws = [_draw_indices(segments, regime, f"{f}.1pct", ms, r0, n) for f in _EPI]
        *pct_list, pct_f9 = _to_device_many(draws + [_draw_indices(segments, regime, "F9.1pct", ms, r0, k)], dev)
        pct = dict(zip(_EPI, pct_list))

        cells = self.cells
        evidence = []
        r0_dev = _to_device(torch.tensor(r0, dtype=torch.int64), dev)  # pinned, non-blocking on CUDA
        for b in dict.fromkeys(self.backends):
            kd = backend_kernel(b)
            y = torch.cat([sg.outs[b] for sg in segments]) if n_seg > 1 else segments[0].outs[b]
            cell = _Cell(baseline_variant(b), "B", "none", kd, y, declared(kd.declared_order), None, None, False, b)
            cells[cell.key] = cell
            evidence.append(_first_difference(y, cell.want, seg, n_seg, r0_dev))
        self.evidence = torch.stack(evidence).reshape(-1)  # [baseline cells * S * 5]
        for fam in _EPI:
            kd = FAULT_KERNELS[fam]
            y_pct = ref_y.clone().reshape(-1)
            y_pct[pct[fam]] = faulty[fam].reshape(-1)[pct[fam]]
            for sev, y in (("1pct", y_pct.view_as(ref_y)), ("all", faulty[fam])):
                cells[f"{fam}.{sev}"] = _Cell(
                    f"{fam}.{sev}", fam, sev, kd, y, declared(kd.declared_order), None, None, True
                )
        acc6 = self.accumulate(f6_accumulator, a)  # one Triton launch per weight on CUDA (audit/f6_tiles.py)
        kd = FAULT_KERNELS["F6"]
        y6 = epilogue_triton_order(acc6, s_a, wt.s_w)
        cells["F6.all"] = _Cell(
            "F6.all", "F6", "all", kd, y6, declared(kd.declared_order), None, value_diff(acc6, acc, seg, n_seg), True
        )
        acc7 = wrap_int16(acc)
        kd = FAULT_KERNELS["F7"]
        y7 = epilogue_triton_order(acc7, s_a, wt.s_w)
        cells["F7.all"] = _Cell(
            "F7.all", "F7", "all", kd, y7, declared(kd.declared_order), None, value_diff(acc7, acc, seg, n_seg), True
        )
        kd = FAULT_KERNELS["F8"]  # the reference pipeline itself: its output is ref_y's computation
        cells["F8.all"] = _Cell("F8.all", "F8", "all", kd, ref_y, declared(kd.declared_order), None, None, True)
        cells.update(_operand_faults_bc(a, s_a, acc, wt, pct_f9, seg, n_seg, self.accumulate))
        # the pair compares its two backends' outputs (their own cells; one cell when A is B)
        y_a = cells[f"B:{self.backends[0]}"].y
        y_b = cells[f"B:{self.backends[1]}"].y
        self.pair_stats = cell_stats(y_b.unsqueeze(0), y_a, seg, n_seg, hist=False)[0, :, :2].reshape(-1)  # [S * 2]
        if self.grouped:  # [S]: each segment's Linear's scales all powers of two
            bad = (~is_power_of_two(wt.s_w[..., 0]).all(dim=1)).unsqueeze(0)
            self.pow2 = (seg_reduce(bad, seg, n_seg, "sum")[0] == 0).to(torch.int64)
        else:
            self.pow2 = is_power_of_two(wt.s_w).all().to(torch.int64).reshape(1).expand(n_seg)
        self._stats_of(list(cells.values()))

    def declared(self, order: str | None) -> torch.Tensor | None:
        """The declared order's output on the shared operands (C8's expectation), computed once."""
        if order is None:
            return None
        if order not in self.want:
            self.want[order] = ORDER_EPILOGUES[order](self.acc, self.s_a, self.wt.s_w)
        return self.want[order]

    def _stats_of(self, chunk_cells: list[_Cell]) -> None:
        """Each cell's [S, _STAT] row block (statistics and check flags), chunked over cells."""
        seg, n_seg, ref_y = self.seg, self.n_seg, self.ref_y
        rows, n = ref_y.shape
        step = max(1, _CHUNK_ELEMENTS // max(1, rows * n))
        zero = torch.zeros(n_seg, dtype=torch.int64, device=self.dev)
        for c0 in range(0, len(chunk_cells), step):
            chunk = chunk_cells[c0 : c0 + step]
            st = cell_stats(torch.stack([c.y for c in chunk]), ref_y, seg, n_seg)  # [C, S, 2 + HIST]
            differs = (st[:, :, 0] > 0).to(torch.int64)  # [C, S]: output differs from the reference's
            flags = []
            for i, c in enumerate(chunk):
                c1 = zero if c.c1 is None else c.c1
                c4 = zero if c.c4 is None else c.c4
                if c.want is None:
                    c8 = zero
                elif c.want is ref_y:
                    c8 = differs[i]
                elif c.want is c.y:  # the run's output is the declared order's computation itself
                    c8 = zero
                else:
                    c8 = any_diff(c.y, c.want, seg, n_seg)
                flags.append(torch.stack([c1, c4, c8], dim=1))  # [S, 3]
            full = torch.cat([st[:, :, :2], torch.stack(flags), st[:, :, 2:]], dim=2)  # [C, S, _STAT]
            for c, block in zip(chunk, full.unbind(0)):
                self.stat_of[c.key] = block
                # the [R, N] tensors are done with (the next Linear is queued before finish)
                c.y, c.want = None, (None if c.want is None else True)

    def finish(self) -> Pending:
        """Read the counts (waiting for them alone), queue the six `one` cells, pack the results."""
        if self.event is not None:
            self.event.synchronize()
        counts = self.counts.tolist()  # [6][S]
        segments, regime, n_seg, ms, r0 = self.segments, self.regime, self.n_seg, self.ms, self.r0
        ref_y = self.ref_y
        n = ref_y.shape[1]
        plans = [_one_plan(f"{fam}.one", counts[i], segments, regime, ms, r0, n) for i, fam in enumerate(_EPI)]
        plans.append(_one_plan("F9.one", counts[5], segments, regime, ms, r0, 1))
        flat = _to_device_many([t for plan in plans for t in plan], self.dev)  # one copy
        plans = [tuple(flat[3 * i : 3 * i + 3]) for i in range(len(plans))]
        new = []
        for i, fam in enumerate(_EPI):
            kd = FAULT_KERNELS[fam]
            y = _one(self.faulty[fam], ref_y, *plans[i])
            new.append(_Cell(f"{fam}.one", fam, "one", kd, y, self.declared(kd.declared_order), None, None, True))
        new.append(_operand_fault_a(self.s_a, self.acc, self.wt, plans[5], self.seg, n_seg))
        for c in new:
            self.cells[c.key] = c
        self._stats_of(new)
        order = [f"B:{b}" for b in dict.fromkeys(self.backends)] + [v.id for v in VARIANTS]
        packed = torch.cat([self.pow2, self.pair_stats, *(self.stat_of[v].reshape(-1) for v in order), self.evidence])
        wt = self.runs[0][2] if self.grouped else self.wt  # the shape (static checks read K alone)
        return Pending(regime, segments, [self.cells[v] for v in order], packed, wt.w.shape[1], wt)


def _first_difference(y, want, seg, n_seg, r0) -> torch.Tensor:
    """[S, 5] per segment: elements of y that differ from `want` (the declared order's output on the
    shared operands; None: no order, nothing counted), and the first of them in row-major order
    (row within the segment, column, y's bits, want's bits; zeros when none). On the device, no
    host read; r0: [S] each segment's first row, on the device."""
    r, n = y.shape
    out = torch.zeros(n_seg, 5, dtype=torch.int64, device=y.device)
    if want is None:
        return out
    yb, wb = y.view(torch.int16), want.view(torch.int16)
    ne = yb != wb  # [R, N]
    out[:, 0] = seg_reduce(ne.sum(dim=1).unsqueeze(0), seg, n_seg, "sum")[0]
    col = ne.to(torch.uint8).argmax(dim=1)  # the first differing column of each row (0 where none)
    rows = torch.arange(r, device=y.device)
    # the first differing row of each segment: the largest r - row among rows that differ (0: none)
    key = torch.where(ne.any(dim=1), r - rows, 0)
    g = (r - seg_reduce(key.unsqueeze(0), seg, n_seg, "amax")[0]).clamp_(max=r - 1)  # [S] global rows
    c = col[g]
    out[:, 1] = g - r0
    out[:, 2] = c
    out[:, 3] = yb[g, c].to(torch.int64) & 0xFFFF
    out[:, 4] = wb[g, c].to(torch.int64) & 0xFFFF
    return out


def _to_device_many(host: list[torch.Tensor], dev: torch.device) -> list[torch.Tensor]:
    """Host int64 tensors -> device tensors, in one copy (then views of it)."""
    flat = _to_device(torch.cat([t.reshape(-1) for t in host]), dev)
    return list(flat.split([t.numel() for t in host]))


def _draw_indices(segments, regime, variant_id, ms, r0, width) -> torch.Tensor:
    """The `1pct` draws of every segment (ceil(1% of M * width) seeded indices of its [M, width]
    block, faults.severity_mask / F9b), as flat indices of the concatenation (host int64).
    F9b's torch.unique is left out: assigning a shifted value twice writes the same bits."""
    draws = []
    for s, sg in enumerate(segments):
        g = _gen(sg.label, regime, variant_id)
        size = ms[s] * width
        draws.append(torch.randint(0, size, (math.ceil(0.01 * size),), generator=g) + r0[s] * width)
    return torch.cat(draws)


def _one_plan(variant_id, counts, segments, regime, ms, r0, width) -> tuple[torch.Tensor, ...]:
    """The `one` draws of every segment (faults.severity_mask for F1..F5, the F9a row): with
    counts[s] > 0 the pick-th counted element of segment s (a search target into the cumulative
    count of the concatenation), else the draw over the segment's M * width positions. Host
    int64 (positions with 0 where searched, targets, the searched segments)."""
    pos, need, targets, base = [], [], [], 0
    for s, sg in enumerate(segments):
        g = _gen(sg.label, regime, variant_id)
        if counts[s]:
            pick = int(torch.randint(0, counts[s], (1,), generator=g))
            need.append(s)
            targets.append(base + pick + 1)
            pos.append(0)
        else:
            pos.append(r0[s] * width + int(torch.randint(0, ms[s] * width, (1,), generator=g)))
        base += counts[s]
    return tuple(torch.tensor(v, dtype=torch.int64) for v in (pos, targets, need))


def _one_positions(counted: torch.Tensor, pos, targets, need) -> torch.Tensor:
    """The plan's positions on the device: searched ones found in the cumulative count of `counted`
    (flat 0/1 over the concatenation)."""
    if need.numel():
        csum = torch.cumsum(counted.to(torch.int64), 0)
        pos = pos.index_copy(0, need, torch.searchsorted(csum, targets))
    return pos


def _one(y_fault, ref_y, pos, targets, need) -> torch.Tensor:
    """F1..F5 at `one`: the reference with the planned element (a changed one of its segment when
    any changed) taken from the faulty output."""
    changed_flat = (y_fault.view(torch.int16) != ref_y.view(torch.int16)).reshape(-1)
    pos = _one_positions(changed_flat, pos, targets, need)
    y_one = ref_y.clone().reshape(-1)
    y_one[pos] = y_fault.reshape(-1)[pos]
    return y_one.view_as(ref_y)


def _declared_on_own_operands(kd, y, acc, s_a, wt) -> torch.Tensor:
    """C8's expectation for an operand fault: the declared order on the run's own operands. The
    run's output y is epilogue_triton_order on those very tensors, so for that order it is y."""
    if kd.declared_order == "triton-order":
        return y
    return ORDER_EPILOGUES[kd.declared_order](acc, s_a, wt.s_w)


def _operand_fault_a(s_a, acc, wt, plan, seg, n_seg) -> _Cell:
    """F9a (faults._operand_fault's draw, per segment): one activation scale x F9A_FACTOR, a seeded
    row among the non-zero ones (among all rows when every scale is zero)."""
    kd = FAULT_KERNELS["F9"]
    rows_t = _one_positions(s_a.reshape(-1) != 0, *plan)
    s_new = s_a.clone()
    s_new[rows_t] = s_new[rows_t] * F9A_FACTOR
    y = epilogue_triton_order(acc, s_new, wt.s_w)
    c1 = any_diff(s_new, s_a, seg, n_seg)
    want = _declared_on_own_operands(kd, y, acc, s_new, wt)
    return _Cell("F9.one", "F9", "one", kd, y, want, c1, None, True)


def _operand_faults_bc(a, s_a, acc, wt, idx, seg, n_seg, accumulate) -> dict:
    """F9b (1% of the int8 activations shifted by one, `idx` drawn per segment) and F9c (every one);
    accumulate: Started.accumulate."""
    kd = FAULT_KERNELS["F9"]
    out = {}
    flat = a.reshape(-1).clone()
    flat[idx] = shift_int8_by_one(flat[idx])
    for sev, a_x in (("1pct", flat.view_as(a)), ("all", shift_int8_by_one(a))):
        acc_x = accumulate(exact_accumulate, a_x)
        y = epilogue_triton_order(acc_x, s_a, wt.s_w)
        want = _declared_on_own_operands(kd, y, acc_x, s_a, wt)
        out[f"F9.{sev}"] = _Cell(
            f"F9.{sev}",
            "F9",
            sev,
            kd,
            y,
            want,
            any_diff(a_x, a, seg, n_seg),
            value_diff(acc_x, acc, seg, n_seg),
            True,
        )
    return out


class Read:
    """The packed results of several Linears on their way to the host: on CUDA a non-blocking copy
    into pinned memory, so that the device goes on with the next Linears meanwhile; resolve()
    waits for that copy alone."""

    def __init__(self, pendings: list[Pending]):
        self.pendings = pendings
        packed = torch.cat([p.packed for p in pendings]) if pendings else torch.zeros(0, dtype=torch.int64)
        if packed.is_cuda:
            self.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self.host.copy_(packed, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = packed, None

    def resolve(self, checks: tuple[str, ...]) -> list[list[tuple[dict, list[CellResult]]]]:
        if self.event is not None:
            self.event.synchronize()
        values = self.host.tolist()
        out, at = [], 0
        for p in self.pendings:
            n = p.packed.numel()
            out.append(p.resolve(values[at : at + n], checks))
            at += n
        return out


def resolve_all(pendings: list[Pending], checks: tuple[str, ...]) -> list[list[tuple[dict, list[CellResult]]]]:
    """One host read for several Linears' results."""
    return Read(pendings).resolve(checks)
