"""The one place `--backends A,B` and `--order` become a resolved pair: which kernel, which declared
order (docs/audit.md, "Custom kernels").

requant.backends.parse_backends checks the names; resolve_pair turns them into two
requant.kernels.ScaledMM: a built-in backend by lookup, a MODULE:FUNCTION member imported here
(conform's resolve_kernel), wrapped so that every call is checked (requant.user_kernel.guarded)
and given its order: `--order`, or conform's fingerprint on the identification cases of the
crafted vectors (_fingerprint, the only one). Nothing is registered: the kernels live in the
returned pair, and end with the run.

A kernel that cannot be run (KernelError) is a usage error (ValueError: exit 2). A kernel that runs
but implements no declarable order (cutlass-order, triton-order, fused-order) is a finding for the
audit, returned as `failure`: the kernel, the nearest declarable formula and its first differing
element; the command records it in the JSON and exits 1. The determinism command, which needs no
order, resolves such a kernel with order None.
"""

from __future__ import annotations

from dataclasses import dataclass

from requant import kernels
from requant.audit.conform import KernelError, fingerprint, resolve_kernel, run_cases
from requant.audit.conform import vectors as V
from requant.backends import ORDERS, is_custom
from requant.kernels import ScaledMM
from requant.user_kernel import guarded

__all__ = ["ResolvedPair", "resolve_pair", "nearest_order", "failure_line"]


@dataclass(frozen=True)
class ResolvedPair:
    """kernels: the two members (ScaledMM: name, callable, declared order), in --backends order;
    custom: {name: {order, source, verdict}} of the MODULE:FUNCTION members (the JSON's
    custom_kernels); failure: the first member whose fingerprint names no declarable order, or
    None (then custom holds that member alone, as the audit records it)."""

    kernels: tuple[ScaledMM, ...]
    custom: dict
    failure: dict | None = None


def nearest_order(rep: dict) -> tuple[str, dict]:
    """The declarable order (exact accumulator) with the fewest differing elements, and its row."""
    rows = {o: rep["candidates"][f"exact/{o}"] for o in ORDERS}
    best = min(ORDERS, key=lambda o: (rows[o]["mismatches"], ORDERS.index(o)))
    return best, rows[best]


def failure_line(fail: dict) -> str:
    """One line: the kernel, the nearest legal formula and the first differing element."""
    fd = fail["first_difference"]
    where = (
        f"first at case {fd['case']} element {fd['element']} (got {fd['got']}, want {fd['want']})"
        if fd
        else "no element differs, yet the formulas that agree are several"
    )
    return (
        f"audit failed: kernel {fail['kernel']} implements no legal epilogue formula; nearest: {fail['nearest']} "
        f"({fail['mismatches']} of {fail['elements']} elements differ), {where}; "
        f"--order {fail['nearest']} audits it as that order"
    )


def _given_orders(custom: list[str], order: str | None) -> list[str]:
    """--order as one order per custom member ([] without --order); ValueError naming --order."""
    if order is None:
        return []
    if not custom:
        raise ValueError("--order applies to MODULE:FUNCTION members of --backends only")
    given = [o.strip() for o in order.split(",")]
    if len(given) not in (1, len(custom)):
        raise ValueError(f"--order takes one order or one per MODULE:FUNCTION member ({len(custom)}), got {order!r}")
    for o in given:
        if o not in ORDERS:
            raise ValueError(f"--order {o!r}: known orders are {', '.join(ORDERS)}")
    return given * len(custom) if len(given) == 1 else given


def _import(name: str):
    """The user's function of a MODULE:FUNCTION member (ValueError naming --backends)."""
    try:
        return resolve_kernel(None, name)[1]
    except ValueError as exc:
        raise ValueError(str(exc).replace("--kernel", "--backends", 1)) from None


def _fingerprint(name: str, fn, device: str, vs) -> dict:
    """conform's report of `fn` on the identification cases; ValueError when it cannot run."""
    ident = {c.name for c in vs.cases if c.kind in ("epilogue", "accumulator")}
    try:
        return fingerprint(name, run_cases(name, fn, vs, device, cases=ident), vs)
    except KernelError as exc:
        raise ValueError(f"--backends {name}: {exc}") from None


def _declarable(rep: dict) -> bool:
    return rep["identified"] and len(rep["formulas_agreeing"]) == 1 and rep["formula"] in ORDERS


def resolve_pair(names: tuple[str, ...], order: str | None, device: str, require_order: bool = True) -> ResolvedPair:
    """The pair parse_backends named, resolved (module docstring). require_order=False
    (determinism): a member that runs every case but implements no declarable order is resolved
    with order None instead of being the audit's failure."""
    custom = [n for n in dict.fromkeys(names) if is_custom(n)]
    given = _given_orders(custom, order)
    fns = {n: _import(n) for n in custom}
    vs = V.build_vectors(batch_ms=()) if custom and not given else None
    records, orders = {}, {}
    for i, name in enumerate(custom):
        if given:
            orders[name], records[name] = given[i], {"order": given[i], "source": "--order", "verdict": None}
            continue
        rep = _fingerprint(name, fns[name], device, vs)  # the user's function: run_cases checks each case
        if _declarable(rep):
            orders[name] = rep["formula"]
        elif require_order:
            near, row = nearest_order(rep)
            fail = {
                "kernel": name,
                "verdict": rep["verdict"],
                "nearest": near,
                "mismatches": row["mismatches"],
                "elements": row["elements"],
                "first_difference": row["first"],
            }
            return ResolvedPair((), {name: {"order": None, "source": "fingerprint", "verdict": rep["verdict"]}}, fail)
        else:
            orders[name] = None
        records[name] = {"order": orders[name], "source": "fingerprint", "verdict": rep["verdict"]}
    pair = tuple(ScaledMM(n, guarded(n, fns[n]), orders[n]) if is_custom(n) else kernels.lookup(n) for n in names)
    return ResolvedPair(pair, records)
