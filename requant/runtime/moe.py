"""The Qwen3-MoE sparse block of the reference engine: a specified, batch-invariant router and
the experts it selects (the whole contract: docs/moe.md).

The router, for each token row x (bf16 [hidden]) and router weight W (bf16 [E, hidden]):
  1. logits[e] = tree_sum_halves(fp32(x) * fp32(W[e])) over hidden, in fp32. Each product of two
     bf16 values is exact in fp32; the adds follow the fixed pairwise tree of kernels.ops.tree_sum_halves.
     (transformers rounds the logits to bf16; here they stay fp32.)
  2. p = e / tree_sum_halves(e) over the experts, e = exp(logits - max(logits)) (max is exact).
  3. the top k of p by a stable descending sort: equal probabilities go to the lowest expert id.
  4. norm_topk_prob: w = p_top / tree_sum_halves(p_top) over the k slots in rank order; else w = p_top.
Every step is elementwise or a reduction over the row's own values in a fixed order, so a
token's experts and weights never depend on the other tokens of the call (alone == batched).

The experts: each selected expert e runs on its tokens' rows (ascending token order) as a Qwen3
MLP, bf16 out = down(bf16(silu(gate(x)) * up(x))), through the engine's Linears (W8A8 per-token
activation quantization of the rows, or fixed-chunk fp32 rows for a bf16 model); the capture
records each expert's operands, i.e. exactly the tokens the router sent it. The outputs are
combined per token in fp32 in ascending expert id, acc = 0; acc += fp32(y_e) * w_e, and rounded to
bf16 once (transformers adds in the same expert order, in bf16 after each expert). Per-token
activation quantization is a function of the row alone, so an expert's operands for a token are
the same bits whichever other tokens share the call.

With the backend reference-vllm-moe-order the block computes vLLM's int8 fused-MoE arithmetic from
the gate/up outputs on (kernels/fused_moe.py, _VllmCombine): alone == batched holds there too.
"""

from __future__ import annotations

import itertools

import torch

from requant import kernels
from requant.kernels.epilogue import int_mm
from requant.kernels.fused_moe import VLLM_MOE, down_vllm, moe_sum_vllm
from requant.kernels.ops import silu_mul, tree_sum_halves

# Token rows per router logits chunk: the [rows, experts, hidden] fp32 products of one chunk
# (64 x 128 x 4096 x 4 bytes = 128 MiB at Qwen3-235B's widest).
ROUTER_CHUNK = 64


def router_logits(x: torch.Tensor, w: torch.Tensor, chunk: int = ROUTER_CHUNK) -> torch.Tensor:
    """fp32 [T, E]: step 1 of the module docstring, in chunks of token rows (elementwise products,
    one tree per row and expert: the chunking cannot change a row's bits)."""
    w32 = w.to(torch.float32)
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for i in range(0, x.shape[0], chunk):
        xs = x[i : i + chunk].to(torch.float32)
        out[i : i + chunk] = tree_sum_halves(xs[:, None, :] * w32[None, :, :], -1).squeeze(-1)
    return out


def route(x: torch.Tensor, w: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids long [T, k], weights fp32 [T, k]) in rank order (the highest probability
    first, ties to the lowest id): steps 1-4 of the module docstring."""
    logits = router_logits(x, w)
    e = torch.exp(logits - logits.amax(-1, keepdim=True))
    p = e / tree_sum_halves(e, -1)
    # stable: among equal probabilities the original (expert id) order is kept
    p_sorted, ids = torch.sort(p, dim=-1, descending=True, stable=True)
    top, ids = p_sorted[:, :top_k], ids[:, :top_k]
    if norm_topk_prob:
        top = top / tree_sum_halves(top, -1)
    return ids, top


def sparse_block(engine, i: int, h: torch.Tensor, capture) -> torch.Tensor:
    """Layer i's MoE block on the normed hidden states h (bf16 [T, hidden]) -> bf16 [T, hidden]:
    route, run each selected expert on its rows, combine in ascending expert id; with the backend
    reference-vllm-moe-order, vLLM's fused-MoE arithmetic instead (_VllmCombine)."""
    model, lin = engine.model, engine.linears
    a = model.arch
    p = f"model.layers.{i}.mlp."
    ids, weights = route(h, model.dense[p + "gate.weight"], a.top_k, a.norm_topk_prob)
    if capture is not None and hasattr(capture, "record_route"):  # the audit's combine comparison
        capture.record_route(p.rstrip("."), ids, weights)
    vllm = str(model.backend) == VLLM_MOE and f"{p}experts.0.down_proj" in model.linears
    comb = _VllmCombine(model, ids, capture) if vllm else None
    # The tokens are quantized once for every expert's gate/up (each expert gets its rows: the
    # same bits as quantizing those rows alone; one quantization per layer, not per expert).
    q8 = None
    if f"{p}experts.0.gate_proj" in model.linears:
        q8, s8 = kernels.quantize_activations(h, backend=model.act_backend)

    def expert(e: int, rows, slots):
        with lin.rows_of(rows, h.shape[0]):
            return _expert(e, rows, slots)

    def _gate_up(e: int, rows, q=None, s=None):
        ex = f"{p}experts.{e}."
        names = (ex + "gate_proj", ex + "up_proj")
        if q8 is None:
            return lin.column(h[rows], names, capture)
        dense = any(n not in model.linears for n in names)  # x is read for an unquantized Linear only
        q, s = (q8[rows], s8[rows]) if q is None else (q, s)
        return lin.quantized(q, s, names, capture, h[rows] if dense else None)

    def _expert(e: int, rows, slots):
        gate, up = _gate_up(e, rows)
        if comb is not None:
            return comb.expert(f"{p}experts.{e}.down_proj", rows, slots, gate, up, weights[rows, slots])
        return lin.row(silu_mul(gate, up), f"{p}experts.{e}.down_proj", capture)

    routes, order, by_expert = _routed(ids)  # by_expert: each route's token row, in expert order
    downs = {e: f"{p}experts.{e}.down_proj" for e, _, _ in routes}
    if comb is not None or q8 is None or not routes or not all(n in model.linears for n in downs.values()):
        out = combine(ids, weights, h.shape[1], expert, routes)
        return comb.out() if comb is not None else out
    # Every routed expert's down projection quantized: the layer runs in passes over all its
    # routed experts at once, each expert a slice of the routed rows in expert order (by_expert:
    # one gather for every expert's gate/up operands, not two per expert). silu(gate) * up and
    # the per-token quantization are functions of a row alone, so each expert's slice has the bits
    # its own call would have (the quantizer's row locality: tests/requant/runtime/test_moe.py);
    # the GEMMs run per expert in ascending id, the combine adds in combine's order
    # (combine_routed). The gate/up outputs of every routed expert are held at once
    # ([T x top_k, moe_intermediate] bf16).
    qg, sg = q8[by_expert], s8[by_expert]
    starts = list(itertools.accumulate((len(rows) for _, rows, _ in routes), initial=0))
    gates, ups = [], []
    for (e, rows, _), at in zip(routes, starts):
        cut = slice(at, at + len(rows))
        with lin.rows_of(rows, h.shape[0]):
            gate, up = _gate_up(e, rows, qg[cut], sg[cut])
        gates.append(gate)
        ups.append(up)
    qd, sd = kernels.quantize_activations(silu_mul(torch.cat(gates), torch.cat(ups)), backend=model.act_backend)
    ys = []
    for (e, rows, _), at in zip(routes, starts):
        cut = slice(at, at + len(rows))
        with lin.rows_of(rows, h.shape[0]):
            (y,) = lin.quantized(qd[cut], sd[cut], (downs[e],), capture)
        ys.append(y)
    return combine_routed(ids, weights, torch.cat(ys), order)


def _route_order(ids: torch.Tensor) -> torch.Tensor:
    """The flat positions t * k + slot of every route, in ascending expert id and, within an expert,
    ascending position (a stable sort of the flat ids)."""
    return torch.sort(ids.reshape(-1), stable=True).indices


def _routed(ids: torch.Tensor) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """(expert_rows(ids), _route_order(ids), every route's token row in that order: the rows of
    expert_rows concatenated)."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = _route_order(ids)
    rows, slots = order // k, order % k
    out, start = [], 0
    for e, n in enumerate(torch.bincount(flat).tolist()):
        if n:
            out.append((e, rows[start : start + n], slots[start : start + n]))
            start += n
    return out, order, rows


def expert_rows(ids: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """[(expert id, rows, slots)] for each routed expert in ascending id, its (row, slot) positions
    in ascending row order, exactly as (ids == e).nonzero() lists them. One host read (the counts),
    not one per expert: a stable sort of the flat [T, k] ids lists each expert's positions in
    ascending flat index."""
    return _routed(ids)[0]


def combine(ids: torch.Tensor, weights: torch.Tensor, hidden: int, expert, routes=None) -> torch.Tensor:
    """bf16 [T, hidden]: expert(e, rows, slots) -> bf16 [len(rows), hidden] (None: nothing to add)
    called for each routed expert in ascending id (expert_rows; `routes` if already listed); the
    outputs added per token in fp32 in that order, acc += fp32(y) * w, rounded to bf16 once (step 5)."""
    acc = torch.zeros(ids.shape[0], hidden, dtype=torch.float32, device=ids.device)
    for e, rows, slots in expert_rows(ids) if routes is None else routes:
        y = expert(e, rows, slots)
        if y is not None:
            acc[rows] += y.to(torch.float32) * weights[rows, slots][:, None]
    return acc.to(torch.bfloat16)


# Tokens per combine_routed pass: its [tokens, top_k, hidden] fp32 products (1024 x 8 x 4096 x 4
# bytes = 128 MiB at Qwen3-235B's width).
COMBINE_CHUNK = 1024


def combine_routed(ids: torch.Tensor, weights: torch.Tensor, y: torch.Tensor, order=None) -> torch.Tensor:
    """combine's bits when every route has an output, in a few ops whatever the number of experts:
    y bf16 [T x k, hidden] holds the routed experts' outputs concatenated in expert_rows' order
    (`order`: _route_order's, when the caller has it; else sorted here).
    Each token's k products fp32(y) * w are gathered in ascending expert id (a token's experts are
    distinct) and added to acc = 0 in that order, slot by slot: per token the same fp32 products,
    added in the same order, as combine's per-expert loop (tests/requant/runtime/test_moe.py)."""
    t, k = ids.shape
    out = torch.empty(t, y.shape[1], dtype=torch.bfloat16, device=y.device)
    if t == 0:
        return out
    if order is None:
        order = _route_order(ids)  # route (t, slot) -> its row of y
    at = torch.empty_like(order)
    at[order] = torch.arange(order.numel(), device=order.device)
    ranked = torch.sort(ids, dim=1, stable=True).indices  # each token's slots in ascending expert id
    src = at.view(t, k).gather(1, ranked)  # [T, k]: the rows of y, per token in expert order
    w = weights.gather(1, ranked)
    for c in range(0, t, COMBINE_CHUNK):
        part = y[src[c : c + COMBINE_CHUNK]].to(torch.float32) * w[c : c + COMBINE_CHUNK, :, None]
        acc = torch.zeros(part.shape[0], y.shape[1], dtype=torch.float32, device=y.device)
        for j in range(k):
            acc += part[:, j]
        out[c : c + COMBINE_CHUNK] = acc.to(torch.bfloat16)
    return out


class _VllmCombine:
    """vLLM's int8 fused-MoE path after the gate/up GEMM (the Triton order: the plain backend):
    silu_and_mul in bf16 arithmetic, bf16(bf16(silu(g)) * u) (vLLM's act_and_mul_kernel computes in
    scalar_t; silu in fp32 here, expf is the device's there), the down GEMM with the routed weight
    in its epilogue (kernels.fused_moe.down_vllm) into the token's slot, then moe_sum over the slots
    in rank order. docs/moe.md says what this does and does not share with the reference combine."""

    def __init__(self, model, ids: torch.Tensor, capture):
        self.model, self.capture = model, capture
        self.z = torch.zeros(*ids.shape, model.arch.hidden, dtype=torch.bfloat16, device=ids.device)

    def expert(self, name: str, rows, slots, gate, up, route) -> None:
        silu = torch.nn.functional.silu(gate.to(torch.float32)).to(torch.bfloat16)
        act = (silu.to(torch.float32) * up.to(torch.float32)).to(torch.bfloat16)
        q, s = kernels.quantize_activations(act, backend=self.model.act_backend)
        if self.capture is not None:
            self.capture.record((name,), q, s)
        w, s_w = self.model.linears[name]
        self.z[rows, slots] = down_vllm(int_mm(q, w), s, s_w, route)  # nothing for the reference combine

    def out(self) -> torch.Tensor:
        return moe_sum_vllm(self.z)


def expert_load(engine, i: int, h: torch.Tensor) -> list[int]:
    """Tokens routed to each expert of layer i (index = expert id) for hidden states h."""
    a = engine.model.arch
    ids, _ = route(h, engine.model.dense[f"model.layers.{i}.mlp.gate.weight"], a.top_k, a.norm_topk_prob)
    return torch.bincount(ids.reshape(-1), minlength=a.experts).tolist()
