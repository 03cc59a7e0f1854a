"""An all_to_all over NVSHMEM: one kernel that puts each piece straight into
the peer's symmetric receive buffer (an MoE layer's dispatch and combine).

`tgraph.all_to_all` with `transport = nvshmem` on a mesh axis of P ranks
(tessera-lower-to-schedule makes it a kernel of its own) becomes a
`ttile.kernel` of P instances:

* Arguments: the operand `x`, the result `out`, then two symmetric buffers:
  `received` (the result's type: piece `i` is what rank `i` of the axis
  sent) and `arrived [P] i64`, one signal word per source, also marked
  `ttile.signals` (the runtime zeroes it and runs a barrier over all PEs
  before each launch, so no rank still reads the previous call's
  `received`).
* Instance `j` puts piece `j` of `x` into `received` on the peer at
  coordinate `j`, at this rank's slot; completes the puts (`ttile.quiet`)
  and sets `arrived[me]` on that peer; then waits for `arrived[j]` here
  and copies piece `j` of `received` into `out` (`ttile.get` from its own
  PE, which completes before the block reads on).
* In place (what `tessera-lower-to-tile` builds unless the result leaves
  the function): `received` is the result itself, allocated symmetric
  where the result was and freed where it was (the runtime keeps a
  symmetric allocation for its instruction from run to run), so the expert
  GEMMs read the rows where the peers put them: no `out`, no copy. Safe
  from run to run: a peer puts into it again only in the next call of the
  exchange, after the barrier the runtime runs before each exchange launch,
  which this rank reaches only after its reads of the previous call.

Pieces are contiguous (`_exchangeable` in lower_to_schedule checks it) and
the same shape in `x` and `out`, so each put and get is one call.

With `channels = C` (the MoE transport's `multi_qp`) the kernel has P x C
instances: instance (j, c) moves the c-th of C equal row ranges of piece j
and signals its own word (`arrived` has P x C), so C copies per peer run at
once (more SMs and NVLink/IB streams on one peer, as DeepEP's queue pairs).
The ranges split the piece's rows (its next-to-last dimension; the others
before it must be 1); C is lowered to the largest divisor of the rows.

A ragged exchange (the all_to_all's `counts`: an MoE layer's) takes the
`send` and `receive` row counts after `x`: instance j puts only the first
send[j] rows of its piece and copies out only the receive[j] that arrived
(`ttile.load_scalar`, then `rows` on the put and the get), so the bytes on
the wire are the routed rows, not the padded blocks.

Deadlock freedom: instance j of rank p waits only for instance p of the
rank at coordinate j, which puts before it waits. In the CPU emulator a
rank's instances run one after another: instance j of rank p waits for
instances 0..p-1 of rank j to finish, and they wait for instances of lower
(coordinate + instance) sums, so the waits bottom out; on a GPU the P
instances are resident together.

Peers are addressed by PE number (`collective_gemm.instance`).
"""

from __future__ import annotations

from tessera_mlir import ir
from tessera_mlir.dialects import arith, ttile

from tessera_compiler.ir.sharding import Mesh
from tessera_compiler.ir.tile_builder import (THREADS_PER_BLOCK, i64_array, index,
                                              largest_divisor, mark_symmetric, new_kernel)
from tessera_compiler.ir.types import memref_of, shape_of

from .collective_gemm import instance


def piece_shape(exchange: ir.Operation, parts: int) -> list[int]:
    """The shape of one piece of `exchange`'s operand (`split_dim` / parts)."""
    shape = shape_of(exchange.operands[0])
    shape[ir.IntegerAttr(exchange.attributes["split_dim"]).value] //= parts
    return shape


def _piece_offsets(shape: list[int], dim: int, piece: list[int], which) -> list[ir.Value]:
    """Offsets of piece `which` (an index value) along `dim` of a buffer of `shape`."""
    offsets = [index(0)] * len(shape)
    offsets[dim] = arith.MulIOp(which, index(piece[dim])).result if piece[dim] != 1 else which
    return offsets


def _channels(exchange: ir.Operation, piece: list[int]) -> int:
    """Copies per peer: the op's `channels`, lowered to a divisor of the
    piece's rows; 1 unless the piece is rows of its last dimension (every
    dimension before the next-to-last of size 1)."""
    asked = ir.IntegerAttr(exchange.attributes["channels"]).value \
        if "channels" in exchange.attributes else 1
    if asked == 1 or len(piece) < 2 or any(d != 1 for d in piece[:-2]):
        return 1
    return largest_divisor(piece[-2], asked)


def exchange_kernel(exchange: ir.Operation, name: str, mesh: Mesh, module_block,
                    in_place: bool = False) -> tuple[ir.Operation, list[ir.MemRefType]]:
    """The NVSHMEM kernel of `exchange` (see the module) and the types of its
    symmetric buffers (received pieces, signal words). `in_place`: the
    received pieces are the result (the caller allocates it symmetric and
    passes it as `received`): no `out`, no copy out, and what reads the
    result (an MoE layer's expert GEMMs) reads the symmetric buffer."""
    axis = ir.StringAttr(exchange.attributes["axis"]).value
    parts = mesh.axis_size(axis)
    split = ir.IntegerAttr(exchange.attributes["split_dim"]).value
    concat = ir.IntegerAttr(exchange.attributes["concat_dim"]).value
    ins = [memref_of(v.type) for v in exchange.operands]     # x[, send, receive]
    out_type = memref_of(exchange.results[0].type)
    piece = piece_shape(exchange, parts)
    channels = _channels(exchange, piece)
    symmetric = [out_type, ir.MemRefType.get([parts * channels],
                                             ir.IntegerType.get_signless(64))]
    loc = exchange.location
    args = ins + ([] if in_place else [out_type]) + symmetric
    kernel, entry = new_kernel(name, args, parts * channels, THREADS_PER_BLOCK, [1],
                               module_block, loc)
    mark_symmetric(kernel, len(args), 2)
    if in_place:
        x, *counts, received, arrived = entry.arguments
    else:
        x, *counts, out, received, arrived = entry.arguments
    out_shape = shape_of(exchange.results[0])
    box = list(piece)
    box[-2] //= channels                       # this instance's rows of the piece
    with ir.InsertionPoint(entry), loc:
        at = instance(exchange, mesh, channels)
        j, c = at.mi, at.ni                    # the peer's coordinate, the channel
        peer = at.pe_at(j)

        def rows_of(piece_at: list[ir.Value]) -> list[ir.Value]:
            """The offsets of channel c's rows in a piece at `piece_at`."""
            if channels == 1:
                return piece_at
            return piece_at[:-2] + [arith.AddIOp(piece_at[-2], arith.MulIOp(
                c, index(box[-2])).result).result, piece_at[-1]]

        def rows_left(count: ir.Value) -> ir.Value:
            """The counted rows from channel c's first on (`rows` moves at most
            the box's, none when this is not positive)."""
            if channels == 1:
                return count
            return arith.SubIOp(count, arith.MulIOp(c, index(box[-2])).result).result

        def counted(n: ir.Value) -> ir.Value:
            return rows_left(ttile.LoadScalarOp(n, [j]).result)

        sent = counted(counts[0]) if counts else None
        got = counted(counts[1]) if counts and not in_place else None     # what to copy out
        word = arith.AddIOp(arith.MulIOp(at.coord, index(channels)).result, c).result \
            if channels > 1 else at.coord
        ttile.PutOp(x, rows_of(_piece_offsets(shape_of(exchange.operands[0]), split, piece, j)),
                    received, rows_of(_piece_offsets(out_shape, concat, piece, at.coord)),
                    peer, i64_array(box), rows=sent)
        ttile.QuietOp()
        ttile.SignalOp(arrived, word, index(1), peer, ir.StringAttr.get("set"))
        ttile.WaitOp(arrived, at.pid, index(1), ir.StringAttr.get("ge"))
        if not in_place:
            slot = rows_of(_piece_offsets(out_shape, concat, piece, j))
            ttile.GetOp(received, slot, out, slot, ttile.MyPeOp().result, i64_array(box),
                        rows=got)
        ttile.ReturnOp()
    return kernel, symmetric
