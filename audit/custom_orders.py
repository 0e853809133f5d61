"""The order a MODULE:FUNCTION member of the audit's pair declares, or the audit's failure when its
fingerprint names no legal formula (docs/audit.md, "Custom kernels").

declare_custom_orders wraps requant.backends.declare_orders: with --order it is that function;
without, conform's fingerprint (the identification cases of the crafted vectors) runs here once per
custom member. A kernel that cannot be run (KernelError) stays a usage error (ValueError: exit 2).
A kernel that runs but implements no declarable order (cutlass-order, triton-order, fused-order)
is a finding, returned as `failure`: the kernel, the nearest declarable formula and its first
differing element; the command records it in the JSON and exits 1.
"""

from __future__ import annotations

from requant.backends import ORDERS, declare_orders, is_custom


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


def declare_custom_orders(pair: tuple[str, ...], order: str | None, device: str) -> tuple[dict, dict | None]:
    """(custom_kernels record, None), or ({...}, failure) for the first member whose fingerprint
    names no declarable order. ValueError (exit 2) when a kernel cannot be run or --order is bad."""
    custom = [n for n in dict.fromkeys(pair) if is_custom(n)]
    if order is not None or not custom:
        return declare_orders(pair, order, device), None
    from requant import kernels
    from requant.audit.conform import KernelError, fingerprint, run_cases
    from requant.audit.conform import vectors as V

    vs = V.build_vectors(batch_ms=())
    ident = {c.name for c in vs.cases if c.kind in ("epilogue", "accumulator")}
    reps = {}
    for name in custom:
        fn = kernels._RESOLVED[("scaled_mm", name)]
        fn = getattr(fn, "user_fn", fn)
        try:
            rep = fingerprint(name, run_cases(name, fn, vs, device, cases=ident), vs)
        except KernelError as exc:
            raise ValueError(f"--backends {name}: {exc}") from None
        if not rep["identified"] or len(rep["formulas_agreeing"]) != 1 or rep["formula"] not in ORDERS:
            near, row = nearest_order(rep)
            fail = {
                "kernel": name,
                "verdict": rep["verdict"],
                "nearest": near,
                "mismatches": row["mismatches"],
                "elements": row["elements"],
                "first_difference": row["first"],
            }
            return {name: {"order": None, "source": "fingerprint", "verdict": rep["verdict"]}}, fail
        reps[name] = rep
    out = declare_orders(pair, ",".join(reps[n]["formula"] for n in custom), device)
    for name, rep in reps.items():
        out[name].update(source="fingerprint", verdict=rep["verdict"])
    return out, None
