"""The cells of one Linear: the pair compared, the baseline rows and the 21 fault variants, checked
and scored. Shared by the prefill and decode phases (audit/phases/).

A Linear's cells are evaluated together (audit/batched.py: every variant, check and decode
step at once on the operands' device, one small tensor read back per window of Linears);
the per-cell path (layer_cells: each cell on its own through audit.catalogue.faults.reference_case and
audit/catalogue/checks.py) is the oracle it equals, kept and forced by REQUANT_AUDIT_PER_CELL=1.

Cells: 21 variants x 2 regimes per quantized Linear (a Qwen3-1.7B config: 196 Linears,
8,232 cells). Baseline rows (each backend of the pair as the kernel under test, no fault)
are run on every (layer, regime) too and reported beside the cells, not counted among them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from requant import kernels
from requant.audit.batched import Pending, Read, Segment, Started, per_cell_forced, start_linear
from requant.audit.catalogue.checks import CHECK_IDS, declared_output, run_checks
from requant.audit.catalogue.faults import VARIANTS, LayerCase, inject, reference_case
from requant.audit.catalogue.matrix import baseline_variant
from requant.audit.catalogue.scoring import CellResult, Scorer, kernel_fault, ulp_histogram
from requant.audit.compare import compare_layer
from requant.audit.records import BACKEND_KERNELS, Activations, KernelDesc, Run, Weights, output_distance, output_equal
from requant.regime import REGIMES

CELLS_PER_LAYER = len(VARIANTS) * len(REGIMES)


def backend_kernel(name: str) -> KernelDesc:
    """The documented description of a registered backend (audit.records.BACKEND_KERNELS);
    every backend in kernels/ accumulates in int32 and returns no accumulator. A backend
    registered at run time (a MODULE:FUNCTION kernel) is described by the order it declares
    (kernels.emulation_of); its accumulator is not visible, so int32 is its claim, not a fact."""
    if name in BACKEND_KERNELS:
        return BACKEND_KERNELS[name]
    emu = kernels.emulation_of(name)
    order = "unknown" if emu is None else ("exact" if emu == "reference" else emu.removeprefix("reference-"))
    return KernelDesc(name, "int", 32, order, False)


def evaluate_cell(case: LayerCase, variant: str, family: str, severity: str, test: Run, checks=CHECK_IDS) -> CellResult:
    outcomes = {cid: r.outcome for cid, r in run_checks(case.ref, test, checks=checks).items()}
    if output_equal(case.ref, test):
        return CellResult(
            case.name, case.regime, variant, family, severity, False, 0, 0, outcomes, [], shape=case.shape
        )
    dist = output_distance(case.ref, test)
    mism = int((test.y.view(torch.int16) != case.ref.y.view(torch.int16)).sum())
    return CellResult(
        case.name, case.regime, variant, family, severity, True, mism, int(dist.max()), outcomes, ulp_histogram(dist),
        shape=case.shape,
    )  # fmt: skip


def layer_cells(
    name: str, regime: str, act: Activations, wt: Weights, backends: tuple[str, str], checks=CHECK_IDS, outs=None
) -> tuple[dict, list[CellResult]]:
    """The per-cell path (the oracle of audit/batched.py): pair row, baseline rows and the 21
    fault cells of one (layer, regime), each cell evaluated on its own."""
    case = reference_case(name, regime, act, wt)
    if outs is None:
        outs = {b: kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend=b) for b in dict.fromkeys(backends)}
    row = compare_layer(name, regime, outs[backends[0]], outs[backends[1]], case.shape)
    cells = [
        baseline_cell(case, b, Run(act, wt, None, outs[b], backend_kernel(b)), checks) for b in dict.fromkeys(backends)
    ]
    cells += [evaluate_cell(case, v.id, v.family, v.severity, inject(v, case), checks) for v in VARIANTS]
    return row, cells


def baseline_cell(case: LayerCase, backend: str, run: Run, checks=CHECK_IDS) -> CellResult:
    """The baseline row of one backend (the kernel under test, no fault): its cell, named by the
    backend, with its kernel-fault evidence (scoring.kernel_fault) against its declared order."""
    cell = evaluate_cell(case, baseline_variant(backend), "B", "none", run, checks)
    cell.backend = backend
    cell.fault = kernel_fault(cell.outcomes, run.act.a.shape[0], *declared_difference(case.ref, run))
    return cell


def declared_difference(ref: Run, run: Run) -> tuple[int, tuple[int, int, int, int] | None]:
    """(elements of the run's output that differ from its declared order emulated on its own
    operands, (row, column, got bits, want bits) of the first in row-major order); (0, None)
    for a kernel that declares no order."""
    order = run.kernel.declared_order
    if order is None:
        return 0, None
    want = declared_output(ref, run, order)
    if want.shape != run.y.shape or want.dtype != run.y.dtype:
        return max(want.numel(), 1), None
    ne = want.view(torch.int16) != run.y.view(torch.int16)
    if not bool(ne.any()):
        return 0, None
    idx = int(ne.reshape(-1).nonzero()[0])
    r, c = divmod(idx, want.shape[1])
    return int(ne.sum()), (r, c, int(run.y.view(torch.int16)[r, c]), int(want.view(torch.int16)[r, c]))


def audit_layer(
    name: str,
    regime: str,
    act: Activations,
    wt: Weights,
    backends: tuple[str, str],
    scorer: Scorer,
    advance: Callable[[int], None] | None = None,
) -> dict:
    """Pair comparison, baseline rows and the 21 fault cells of one (layer, regime), per cell."""
    row, cells = layer_cells(name, regime, act, wt, backends, scorer.checks)
    for cell in cells:
        scorer.add(cell)
    if advance is not None:
        advance(len(VARIANTS))
    return row


# Linears of one weight shape are evaluated together (batched.start_linear's parts). A group is
# evaluated once its rows x N reach GROUP_ELEMENTS, so it holds less than that plus one Linear's
# rows x N: a Qwen3-30B-A3B layer's 128 gate (or up, or down) projections at 8 prompts are about one
# group; a dense prefill Linear of Qwen3-32B (about 240 x 25,600 = 6.1M) is a group of two, of
# Qwen3-1.7B (240 x 6,144) six; its decode Linears (36 rows at batches 1 and 8, 4 steps) groups of
# 10 to 40. Memory: the members' pair outputs wait in the group (2 bf16 [M, N] each: < 64 MiB a
# shape at the bound), and its evaluation holds about 20 [R, N] cell tensors and a few int32/fp32
# [R, N] intermediates at once (on the order of 100 bytes an element: about 1 GB at the bound,
# whatever the model's size).
GROUP_ELEMENTS = 1 << 23


GROUPS_ENV = "REQUANT_AUDIT_GROUPS"  # 0: every Linear evaluated alone (the A/B of the benchmarks)

# Dense Linears grouped: None = on CUDA only, True = everywhere (the tests and op counts, on the
# CPU), False = never. On CUDA the audit is dispatch bound (about 700 launching ops a Linear) and a
# group dispatches those once. On the CPU there is no launch to save and the torch statistics pass
# (batched_stats: a dozen passes over [cells, R, N], where CUDA's Triton pass reads each element
# once) runs out of cache on a group's larger tensors: grouping the embedded default's dense
# Linears made its prefill cells 1.5x slower (benchmarks/audit_whole_ops.py, docs/audit.md).
DENSE_GROUPS: bool | None = None


def groupable(name, device: torch.device | None = None) -> bool:
    """Whether a Linear joins the group of its weight shape: a Qwen3-MoE expert Linear
    (model.layers.L.mlp.experts.E.*: many Linears of one shape, each with few rows) everywhere;
    any other quantized Linear where DENSE_GROUPS says so (on CUDA by default)."""
    if not isinstance(name, str):
        return False
    if ".mlp.experts." in name:
        return True
    if DENSE_GROUPS is not None:
        return DENSE_GROUPS
    return device is not None and device.type == "cuda"


class _Group:
    """The keys of one grouped evaluation and how many segments each holds."""

    def __init__(self, keys: list, counts: list[int]):
        self.keys, self.counts = keys, counts

    def split(self, res: list) -> dict:
        out, at = {}, 0
        for key, c in zip(self.keys, self.counts):
            out[key] = res[at : at + c]
            at += c
        return out


class LinearQueue:
    """Evaluates Linears through audit/batched.py (or per cell when REQUANT_AUDIT_PER_CELL is set,
    or when a Linear needs it), reading results back once per `window` evaluations; Linears of one
    weight shape that are groupable (experts; dense Linears on CUDA) are evaluated as one group, up
    to GROUP_ELEMENTS, or each alone with REQUANT_AUDIT_GROUPS=0. The results, their order and the
    progress advanced in all (21 a segment) are the same either way; a group advances at once.

    put(key, labelled, wt): labelled = [(label, Activations)], one per segment; results() then
    maps each key to [(per_layer row, cells)] in segment order, keys in put order."""

    def __init__(self, regime: str, backends: tuple[str, str], checks, advance=None, window: int = 16):
        self.regime, self.backends, self.checks, self.advance, self.window = regime, backends, checks, advance, window
        self.per_cell = per_cell_forced()
        self.queued: list = []
        self.reading: list = []  # (entries, Read): windows whose results are on their way
        self.done: dict = {}
        self.order: list = []  # keys in put order (a group is evaluated after keys put behind it)
        self.groups: dict = {}  # weight shape -> ([(key, segments, wt)], [rows]) waiting to be grouped
        self.grouping = not self.per_cell and os.environ.get(GROUPS_ENV, "1") != "0"

    def put(self, key, labelled: list, wt: Weights) -> None:
        pair = tuple(dict.fromkeys(self.backends))
        segs = [
            Segment(label, act, {b: kernels.scaled_mm(act.a, wt.w, act.s_a, wt.s_w, backend=b) for b in pair})
            for label, act in labelled
        ]
        self.order.append(key)
        if self.grouping and groupable(key, wt.w.device):
            shape = (tuple(wt.w.shape), wt.w.device)
            group = self.groups.setdefault(shape, ([], [0]))
            group[0].append((key, segs, wt))
            group[1][0] += sum(sg.act.a.shape[0] for sg in segs)  # the group's rows
            if group[1][0] * wt.w.shape[0] >= GROUP_ELEMENTS:
                self._put_group(self.groups.pop(shape)[0])
            return
        self._put_one(key, segs, wt)

    def _put_one(self, key, segs: list, wt: Weights) -> None:
        """One Linear's segments: batched, or per cell (forced, or a Linear the batched path refuses)."""
        work = None if self.per_cell else start_linear(self.regime, segs, wt, self.backends, backend_kernel)
        # The Linear queued before this one reads its counts now: its copy is done or nearly, and the
        # device has this Linear's work queued behind it (no idle device while the host reads).
        self._finish_started()
        if work is None:
            work = [layer_cells(sg.label, self.regime, sg.act, wt, self.backends, self.checks, sg.outs) for sg in segs]
        self.queued.append((key, work, len(segs)))
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if sum(isinstance(r, (Pending, Started)) for _, r, _ in self.queued) >= self.window:
            self.flush()

    def _put_group(self, members: list) -> None:
        """One batched evaluation of several Linears of one shape (batched.start_linear's parts);
        each Linear on its own when the group cannot run batched."""
        segs = [sg for _, s, _ in members for sg in s]
        parts = [wt for _, s, wt in members for _ in s]
        work = start_linear(self.regime, segs, members[0][2], self.backends, backend_kernel, parts)
        self._finish_started()
        if work is None:
            for key, s, wt in members:
                self._put_one(key, s, wt)
            return
        self.queued.append((_Group([k for k, _, _ in members], [len(s) for _, s, _ in members]), work, len(segs)))
        self._maybe_flush()

    def _put_groups(self) -> None:
        while self.groups:
            self._put_group(self.groups.pop(next(iter(self.groups)))[0])

    def _finish_started(self) -> None:
        self.queued = [(k, r.finish() if isinstance(r, Started) else r, n) for k, r, n in self.queued]

    def flush(self, wait: bool = False) -> None:
        """Send the queued Linears' results to the host; resolve the window sent before (or, with
        `wait`, every window): the device works on while the host reads and scores."""
        if wait:
            self._put_groups()
        self._finish_started()
        if self.queued:
            self.reading.append((self.queued, Read([r for _, r, _ in self.queued if isinstance(r, Pending)])))
        self.queued = []
        while self.reading and (wait or len(self.reading) > 1):
            entries, read = self.reading.pop(0)
            resolved = iter(read.resolve(self.checks))
            for key, r, n_seg in entries:
                res = next(resolved) if isinstance(r, Pending) else r
                if isinstance(key, _Group):
                    self.done.update(key.split(res))
                else:
                    self.done[key] = res
                if self.advance is not None:
                    self.advance(len(VARIANTS) * n_seg)

    def results(self) -> dict:
        self.flush(wait=True)
        return {key: self.done[key] for key in self.order}
