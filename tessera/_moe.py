"""The mixture-of-experts layer (`ts.models.moe`, `op.moe`): its own module
so that `pretrained` (Mixtral) and `models` (the transformer block) both
build on it without importing each other."""

from __future__ import annotations

import math

import numpy as np
from tessera_compiler.ir import graph_builder as gb
from tessera_mlir import ir

from . import dtypes
from ._checks import is_number
from ._dtensor import ShardSpec
from ._primitives import (add, cast, concat, div, eager, equal, exp, gelu, greater, log, matmul,
                          max, maximum, mean, mul, neg, one_hot, require_float, reshape,
                          result_of, silu, softmax, sub, sum, topk, where, where_called)
from ._source import user_frame
from ._trace import Traced, as_traced, current, current_location, element_type
from .errors import ArgumentError, ShapeError
from .local_view import collective, spmd

__all__ = ["moe", "MULTI_QP_CHANNELS"]


# ----------------------------------------------------------------------------
# Mixture of experts (`op.moe`) and top-k selection (`op.topk`)
# ----------------------------------------------------------------------------
# `op.moe(x, experts={"router": Wr, "w1": W1, "w2": W2[, "w3": W3]}, k=2)`
# routes each token of `x[..., D]` to the `k` experts with the largest router
# logits `x @ Wr` and returns the sum of their outputs weighted by the softmax
# of those k logits. Each expert is `gelu(x @ w1[e]) @ w2[e]`, or SwiGLU
# `(silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]` when `w3` is given.
#
# In Graph IR it is a composite: `tgraph.topk` picks the experts,
# `tgraph.moe_dispatch` copies each token's row into an expert-ordered buffer,
# `tgraph.grouped_matmul` runs one GEMM per expert over its rows,
# `tgraph.moe_collect` reads each token's results back, and elementwise ops
# weight and sum them. The gates' derivative flows through a one-hot read of
# the chosen logits; routing itself (which experts) has none, as everywhere.
#
# Capacity (`capacity_factor=c`): each expert keeps
# `ceil(tokens * k * c / E)` rows, filled first choices first, each in token
# order; a dropped choice contributes zero (its gate is not renormalised).
# `capacity_factor=None` drops nothing.
#
# The combine adds a token's k weighted expert outputs in the order of their
# expert indices (`_by_expert_index`): a fixed order, whatever the routing,
# the ranks or the transport, so results are bitwise reproducible.
#
# Expert parallelism (an 'ep' mesh axis): the rows move to their experts'
# ranks and back in two all_to_alls, whatever the transport, so every
# transport gives the same values. The dispatch layout pads each rank's
# block to its worst case (every token to that rank), so the exchanges are
# ragged (`tgraph.all_to_all` with counts, exchanged first): the
# communicator moves only the routed rows, and the elementwise kernels
# between the grouped GEMMs skip the padding (`ttile.kernel` row_segments).
# `transport` picks how they move: "nccl"/"mpi" (the communicator),
# "nvshmem" (GPU target: a kernel that puts each piece into the peer's
# symmetric receive buffer and signals it, see
# passes/tessera_passes/tile/exchange.py; on the CPU the communicator) or
# "auto" (NVSHMEM on the GPU when its buffers fit
# `TargetOptions.nvshmem_auto_max_bytes`). `pack_dtype` rounds what travels:
# "bf16" sends the dispatched rows and the experts' outputs as bf16 (half
# the bytes); "fp8_e4m3" sends the dispatched rows as e4m3 with a float32
# scale per row and the outputs as bf16; None sends them in their own dtype.
# The backward's exchanges move bf16 whenever a pack is asked for.
# `multi_qp` (NVSHMEM): True (MULTI_QP_CHANNELS) or a number of copies per
# peer, each of a range of rows with its own signal (`channels` on the
# all_to_all); False or absent: one. It never changes results.

_TRANSPORTS = ("nccl", "mpi", "nvshmem", "auto")
#: copies per peer of an NVSHMEM exchange with `multi_qp: True`: each moves a
#: quarter of the rows, signalled on its own (DeepEP spreads a peer's traffic
#: over several queue pairs and SMs alike).
MULTI_QP_CHANNELS = 4
_PACK_DTYPES = (None, "fp8_e4m3", "bf16")


def _weight(experts: dict, name: str, src) -> Traced:
    if name not in experts:
        raise ShapeError(f"op.moe: experts has no '{name}' (expected keys 'router', 'w1', 'w2' "
                         f"and optionally 'w3'; got {sorted(experts)})  [{src}]")
    return as_traced(f"op.moe experts['{name}']", experts[name], src)


def _check_transport(transport, src) -> None:
    kind = transport.get("type") if isinstance(transport, dict) else transport
    if kind is not None and kind not in _TRANSPORTS:
        raise ShapeError(f"op.moe: transport {transport!r}: the type must be one of "
                         f"{', '.join(_TRANSPORTS)}  [{src}]")
    if isinstance(transport, dict):
        unknown = set(transport) - {"type", "multi_qp", "pack_dtype"}
        if unknown:
            raise ShapeError(f"op.moe: transport has unknown keys {sorted(unknown)} (known: "
                             f"type, multi_qp, pack_dtype)  [{src}]")
        if transport.get("pack_dtype") not in _PACK_DTYPES:
            raise ShapeError(f"op.moe: pack_dtype {transport['pack_dtype']!r} must be one of "
                             f"{_PACK_DTYPES}  [{src}]")
        qp = transport.get("multi_qp")
        if not (qp is None or isinstance(qp, bool) or (isinstance(qp, int) and 1 <= qp <= 64)):
            raise ShapeError(f"op.moe: multi_qp {qp!r} must be True, False or a number of "
                             f"channels per peer from 1 to 64  [{src}]")


def _expert_mesh(mesh):
    """(mesh, ep size): the mesh `mesh=` names, else the one the function is
    compiled for; ep > 1 when it has an 'ep' axis of more than one rank."""
    if mesh is None:
        mesh = current().mesh
    if mesh is None or "ep" not in mesh.axes:
        return mesh, 1
    return mesh, mesh.axis_size("ep")


def _expert_outputs(tokens: Traced, chosen: Traced, gates: Traced, weights, layout,
                    src, exchange=None) -> tuple[Traced, Traced]:
    """(y [T, D] in the gates' dtype, the kept rows per expert [E]): dispatch,
    the experts' grouped GEMMs, collect, and the gate-weighted sum over each
    token's choices (in expert-index order). `exchange` (expert parallelism) moves
    the dispatched rows to the ranks holding their experts and back."""
    T, k = chosen.shape
    with current_location(src):
        rows, sizes = gb.moe_dispatch(tokens.value, chosen.value, layout)
        rows, kept = result_of(rows, src), result_of(sizes, src)
    segments = kept
    if exchange is not None:
        segments = exchange.counts(kept)            # first: the exchanges read them
        rows = exchange(rows)

    def grouped(a: Traced, w: Traced) -> Traced:
        with current_location(src):
            return result_of(gb.grouped_matmul(a.value, w.value, segments.value), src)

    w1, w2, *w3 = weights
    h = grouped(rows, w1)
    act = gelu(h) if not w3 else mul(silu(h), grouped(rows, w3[0]))
    outs = grouped(act, w2)                                                       # [N, D]
    if exchange is not None:
        outs = exchange(outs, combine=True)                     # back to the rows' ranks
    with current_location(src):
        picked = result_of(gb.moe_collect(outs.value, chosen.value, layout), src)     # [T, k, D]
    weighted = mul(cast(picked, gates.dtype), reshape(gates, T, k, 1))
    return sum(_by_expert_index(weighted, chosen), 1), kept


def _by_expert_index(weighted: Traced, chosen: Traced) -> Traced:
    """`weighted` [T, k, D] with each token's k rows in the order of their
    expert indices, so that the combine adds them in that fixed order. Up
    to two rows need no reordering: a + b and b + a are the same bits.
    Otherwise each slot selects its row (exact: a select, not a product)."""
    T, k = chosen.shape
    if k <= 2:
        return weighted
    # The ascending expert order of each token's choices: top-k of -index
    # (distinct experts: no ties).
    _, order = topk(neg(cast(chosen, dtypes.f32)), k)                          # [T, k]
    rows = []
    for slot in range(k):
        row = None
        for j in range(k):
            take = reshape(equal(order[:, slot], np.int32(j)), T, 1)
            row = weighted[:, j] if row is None else where(take, weighted[:, j], row)
        rows.append(reshape(row, T, 1, weighted.shape[-1]))
    return concat(rows, 1)


class _ExpertExchange:
    """Inside the expert-parallel body: the kept-row counts' all-to-all over
    'ep', so each rank learns how many rows of each of its experts every
    source sends (the counts go first: the grouped GEMMs and the exchanges
    read them), then ragged all-to-alls of the dispatch layout's blocks
    (block r holds rank r's experts' rows, padded to the worst case): only
    the routed rows move, and what arrives from each source lies at the
    start of its block."""

    def __init__(self, ep: int, transport=None):
        self.ep = ep
        kind = transport.get("type") if isinstance(transport, dict) else transport
        self.transport = kind if kind in ("nvshmem", "auto") else None
        self.pack = transport.get("pack_dtype") if isinstance(transport, dict) else None
        qp = transport.get("multi_qp") if isinstance(transport, dict) else None
        # NVSHMEM copies per peer (the exchange kernel's instances per peer).
        self.channels = (MULTI_QP_CHANNELS if qp is True else qp or None) \
            if self.transport else None
        self.rows = None         # (sent to, received from) each rank: counts() sets them

    def _move(self, x: Traced, combine: bool, gradient: bool = True) -> Traced:
        """`x` [N, ...]: the rows of block r to rank r (the dispatch; with
        `combine` the rows each rank sent come back); what arrives lies side
        by side in source order. Without `gradient` the exchange sends no
        cotangent back (tessera-autodiff's NO_GRADIENT)."""
        n = x.shape[0]
        blocks = reshape(x, self.ep, n // self.ep, *x.shape[1:])
        sent, received = self.rows
        moved = collective("all_to_all", blocks, "ep", split_dim=0, concat_dim=1,
                           transport=self.transport, channels=self.channels,
                           counts=(received, sent) if combine else (sent, received))
        return reshape(moved if gradient else _no_gradient(moved), *x.shape)

    def __call__(self, rows: Traced, combine: bool = False) -> Traced:
        """`rows` [N, D] moved (the dispatch, or with `combine` the experts'
        outputs back), packed as `pack_dtype` asks: "bf16" both ways;
        "fp8_e4m3" the dispatch in FP8 with a float32 scale per row (its
        largest magnitude maps to 448, e4m3's largest finite) and the
        combine in bf16."""
        dtype, fp8 = rows.dtype, self.pack == "fp8_e4m3" and not combine
        if self.pack is None or dtype == dtypes.bf16:
            return self._move(rows, combine)
        if not fp8:
            return cast(self._move(cast(rows, dtypes.bf16), combine), dtype)
        wide = cast(rows, dtypes.f32)
        amax = max(maximum(wide, neg(wide)), -1, keepdim=True)                   # [N, 1]
        # The scale is a constant to the derivative (the rounding's gradient
        # is the identity, straight through), and moves with no backward.
        scale = _no_gradient(div(maximum(amax, np.float32(2.0 ** -126)), np.float32(448.0)))
        packed = cast(div(wide, scale), dtypes.fp8_e4m3)
        moved = cast(self._move(packed, combine), dtypes.f32)
        return cast(mul(moved, self._move(scale, combine, gradient=False)), dtype)

    def counts(self, kept: Traced) -> Traced:
        """[source, e]: the rows of this rank's expert e each source sends;
        sets `rows`, the rows of each block sent and received."""
        per_rank = reshape(kept, self.ep, kept.shape[0] // self.ep)               # [ep, E / ep]
        moved = collective("all_to_all", per_rank, "ep", split_dim=0, concat_dim=1)
        segments = reshape(moved, self.ep, kept.shape[0] // self.ep)              # [source, e]
        self.rows = (sum(per_rank, 1), sum(segments, 1))
        return segments


def _no_gradient(x: Traced) -> Traced:
    """Marks the op making `x` as carrying no gradient back
    (tessera-autodiff's NO_GRADIENT); returns `x`."""
    x.value.owner.attributes["tgraph.no_gradient"] = ir.UnitAttr.get()
    return x


def _fill_base(chosen: Traced, E: int, shards: int, src) -> Traced:
    """[shards, k, E] i32: for each token shard, the rows of each (choice j,
    expert e) that precede its own in the global fill order (every shard's
    choices j' < j of e, and shards before it of choice j), so that each
    rank drops exactly what one device would."""
    T, k = chosen.shape
    hit = one_hot(chosen, E, dtypes.f32, src)                                    # [T, k, E]
    per_shard = sum(reshape(hit, shards, T // shards, k, E), 1)                   # [S, k, E]

    def strictly_lower(n):                           # [n, n]: 1 where row > column
        with current_location(src):
            rows, cols = (result_of(gb.iota([n, n], d, element_type(np.dtype(np.int32))), src)
                          for d in (0, 1))
        return cast(greater(rows, cols), dtypes.f32)
    earlier_shards = matmul(strictly_lower(shards), reshape(per_shard, shards, k * E))
    earlier_choices = matmul(strictly_lower(k), sum(per_shard, 0))                # [k, E]
    base = add(reshape(earlier_shards, shards, k, E), reshape(earlier_choices, 1, k, E))
    return cast(base, np.int32)


def _expert_parallel(tokens, chosen, gates, weights, E: int, capacity: int, mesh, ep: int,
                     src, transport=None) -> tuple[Traced, Traced]:
    """The expert-parallel layer as a local-view body over `mesh`: tokens
    split over the 'ep' (and 'dp') axes, experts over 'ep'; each rank routes
    its tokens, exchanges counts then rows with one all-to-all each, runs its
    experts' grouped GEMMs, sends the results back and combines them."""
    T, D = tokens.shape
    token_axes = tuple(a for a in mesh.axes if a in ("ep", "dp"))
    shards = int(np.prod([mesh.axis_size(a) for a in token_axes]))
    if E % ep:
        raise ShapeError(f"op.moe: experts['w1'] dimension 0 (E={E} experts) does not split "
                         f"over mesh axis 'ep' (size {ep})  [{src}]")
    if T % shards:
        raise ShapeError(f"op.moe: {T} tokens do not split over mesh axes {list(token_axes)} "
                         f"({shards} shards)  [{src}]")
    by_token = ShardSpec(partition=(0,) * len(token_axes), mesh_axes=token_axes)
    by_expert = ShardSpec(partition=(0,), mesh_axes=("ep",))
    args = [tokens, chosen, gates] + list(weights)
    specs = [by_token] * 3 + [by_expert] * len(weights)
    if capacity:
        args.append(_fill_base(chosen, E, shards, src))
        specs.append(by_token)
    n_weights = len(weights)

    def body(tokens, chosen, gates, *rest):
        local_weights, base = rest[:n_weights], rest[n_weights:]
        layout = gb.DispatchLayout(E, capacity, blocks=ep,
                                   base=reshape(base[0], *base[0].shape[1:]).value
                                   if base else None)
        y, kept = _expert_outputs(tokens, chosen, gates, local_weights, layout, src,
                                  _ExpertExchange(ep, transport))
        return y, reshape(kept, 1, E)

    y, kept = spmd(body, mesh=mesh, in_specs=specs, out_specs=(by_token, by_token))(*args)
    return y, sum(kept, 0)


@eager
def moe(x, experts: dict, router: str = "topk", k: int = 2, capacity_factor=None,
        return_aux: bool = False, transport=None, deterministic: bool = True, mesh=None):
    """A mixture-of-experts layer over the last dimension of `x[..., D]`.

    `experts` holds `router [D, E]`, `w1 [E, D, F]`, `w2 [E, F, D]` and
    optionally `w3 [E, D, F]` (SwiGLU experts), as arrays, DTensors or traced
    tensors. `router="topk"` with `k` in `1..E`. `capacity_factor`: None
    (dropless) or a number (see the module's doc for the drop policy).
    `return_aux=True` returns `(y, aux)` with `aux["load_balance"]`
    (`E * sum_e f_e P_e`: f the fraction of routed choices that chose e, P
    the mean router probability), `aux["z_loss"]` (mean squared log-sum-exp
    of the router logits) and `aux["dropped"]` (the fraction of choices
    dropped by capacity), and `aux["expert_tokens"]`, the rows each expert
    processed (int32 [E]). The router logits and gates are float32 (float64
    for a float64 `x`).
    `transport` (expert parallelism): "nccl" / "mpi" / "nvshmem" / "auto",
    or a dict {"type": ..., "multi_qp": ..., "pack_dtype": None | "bf16" |
    "fp8_e4m3"}; see the comment above `_TRANSPORTS` for what each does.
    `deterministic=True` is the only mode: the combine order is fixed."""
    src = user_frame()
    where_called("moe")
    if router != "topk":
        raise ShapeError(f"op.moe: router {router!r} is not supported (router='topk')  [{src}]")
    if not isinstance(experts, dict):
        raise ShapeError(f"op.moe: experts must be a dict of weights, got "
                         f"{type(experts).__name__}  [{src}]")
    _check_transport(transport, src)
    mesh, ep = _expert_mesh(mesh)
    if not deterministic:
        raise ShapeError(f"op.moe: deterministic=False is not offered: the combine order is "
                         f"fixed, which costs nothing  [{src}]")
    x = as_traced("op.moe", x, src)
    wr, w1, w2 = (_weight(experts, n, src) for n in ("router", "w1", "w2"))
    w3 = _weight(experts, "w3", src) if "w3" in experts else None
    if x.ndim < 1:
        raise ShapeError(f"op.moe: x must be [..., D], got a scalar  [{src}]")
    D = x.shape[-1]
    if wr.ndim != 2 or wr.shape[0] != D:
        raise ShapeError(f"op.moe: experts['router'] must be [D={D}, E], got {list(wr.shape)} "
                         f"(dimension 0 must equal x's last dimension)  [{src}]")
    E = wr.shape[1]
    if w1.ndim != 3 or w1.shape[:2] != (E, D):
        raise ShapeError(f"op.moe: experts['w1'] must be [E={E}, D={D}, F], got "
                         f"{list(w1.shape)}  [{src}]")
    F = w1.shape[2]
    for name, w, want in (("w2", w2, (E, F, D)), ("w3", w3, (E, D, F))):
        if w is not None and tuple(w.shape) != want:
            which = next((d for d in range(3) if w.ndim != 3 or w.shape[d] != want[d]), 0)
            raise ShapeError(f"op.moe: experts['{name}'] must be {list(want)} (E from the "
                             f"router, D from x, F from w1), got {list(w.shape)}: dimension "
                             f"{which} differs  [{src}]")
    if not isinstance(k, int) or not 1 <= k <= E:
        raise ShapeError(f"op.moe: k={k!r} must be an integer in [1, E={E}]  [{src}]")
    if capacity_factor is not None and not is_number(capacity_factor):
        raise ArgumentError(f"op.moe: capacity_factor={capacity_factor!r} must be a positive "
                            f"number (or None for dropless)  [{src}]")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ShapeError(f"op.moe: capacity_factor={capacity_factor} must be positive (or None "
                         f"for dropless)  [{src}]")
    require_float("moe", src, x, wr, w1, w2, *([w3] if w3 is not None else []))

    T = int(np.prod(x.shape[:-1]))
    tokens = reshape(x, T, D)
    dtype = x.dtype
    route = dtypes.f64 if dtype == dtypes.f64 else dtypes.f32       # routing never in half
    logits = matmul(cast(tokens, route), cast(wr, route))                # [T, E]
    gates, chosen = topk(logits, k)                                               # [T, k]
    gates = softmax(gates, -1)       # = softmax over all E, renormalised over the k
    capacity = 0 if capacity_factor is None else math.ceil(T * k * capacity_factor / E)
    weights = [cast(w, dtype) for w in (w1, w2, w3) if w is not None]
    if ep == 1:
        y, sizes = _expert_outputs(tokens, chosen, gates, weights, gb.DispatchLayout(E, capacity),
                                   src)
    else:
        y, sizes = _expert_parallel(tokens, chosen, gates, weights, E, capacity, mesh, ep, src,
                                    transport)
    y = reshape(cast(y, dtype), *x.shape)
    if not return_aux:
        return y
    # Switch / GShard load balance: f_e (routed share, no gradient) times
    # P_e (mean router probability, differentiable), scaled so balance is 1.
    share = div(sum(one_hot(chosen, E, route, src), (0, 1)), float(T * k))    # [E]
    prob = mean(softmax(logits, -1), 0)                                     # [E]
    top = max(logits, -1, keepdim=True)
    lse = add(log(sum(exp(sub(logits, top)), -1)), reshape(top, T))
    kept = sum(cast(sizes, route))
    aux = {"load_balance": mul(sum(mul(share, prob)), float(E)),
           "z_loss": mean(mul(lse, lse)),
           "dropped": sub(1.0, div(kept, float(T * k))),
           "expert_tokens": sizes}
    return y, aux
