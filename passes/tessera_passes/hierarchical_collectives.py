"""tessera-hierarchical-collectives: all-reduces across nodes in three steps.

A ring all-reduce of B bytes over n ranks takes 2(n-1) steps and moves
2(n-1)/n B per rank; when its ranks sit on several nodes, every step of the
flat ring runs at the speed of the slowest link it crosses (the network
between nodes). With the ranks of an axis grouped L to a node (m = n / L
nodes), this pass rewrites

    %r = all_reduce %x on @mesh["dp"]
      ->  %flat = reshape %x to [N] (padded with zeros to a multiple of L)
          %part = reduce_scatter %flat on @mesh["dp:(m)L"] dim 0   inside each node
          %sum  = all_reduce %part on @mesh["dp:(1)m"]              across nodes
          %all  = all_gather %sum on @mesh["dp:(m)L"] dim 0         inside each node
          %r    = reshape (slice %all to [N]) to x's shape

(`"dp:(m)L"` and `"dp:(1)m"` are sub-axes in Shardy's notation: the minor
part of `dp` of size L, ranks on one node, and the major part of size m.)
Under the cost model's ring alpha-beta (`tessera_compiler.cost`) the three
steps move the same 2(n-1)/n B per rank as the flat ring, in 2(L-1) + 2(m-1)
steps instead of 2(n-1), and only 2(m-1)/(mL) B of it crosses nodes: never
slower, and L times less traffic on the network. So wherever the nodes
allow it (every group of the axis splits into runs of the same L > 1
consecutive ranks per node, L < n) it applies; `hierarchical-collectives=
false` keeps flat all-reduces.

Nodes come from `ranks-per-node` (consecutive world ranks; `tessera.compile`
takes TESSERA_RANKS_PER_NODE): 0 or a job on one node leaves the module as
it is. Deterministic all-reduces keep their bits: the flat tree
((r0+r1)+(r2+r3))... over n ranks is the tree over each node's L ranks
followed by the tree over the m node sums when L is a power of two, so only
then are they rewritten (both steps keep the fixed order); otherwise they
stay flat. Runs after tessera-bucket-collectives (on its buckets), on
partitioned functions except pipelined ones (as bucketing).
"""

from __future__ import annotations

import math

from tessera_mlir import ir

from tessera_compiler.ir import graph_builder as gb
from tessera_compiler.ir.options import TargetOptions
from tessera_compiler.ir.sharding import meshes_of, sub_axis_name
from tessera_compiler.ir.support import functions, partitioned_all_reduces, run_reporting


def ranks_per_node_of_axis(shape, axis_index: int, ranks_per_node: int) -> int:
    """How many consecutive ranks of each group along mesh axis `axis_index`
    (of a mesh of `shape`, devices in row-major world order) share a node of
    `ranks_per_node` consecutive world ranks, when that is the same number L
    for every group and each node holds whole runs of L; 0 when the groups
    and the nodes do not line up that way."""
    n = shape[axis_index]
    stride = math.prod(shape[axis_index + 1:])
    block = stride * n                      # the world ranks one group's members span
    if ranks_per_node <= 0 or ranks_per_node % block == 0:
        return n                            # one node holds whole groups
    if stride % ranks_per_node == 0:
        return 1                            # every member on a node of its own
    if ranks_per_node % stride == 0 and block % ranks_per_node == 0:
        return ranks_per_node // stride
    return 0


def _rewrite(op: ir.Operation, mesh, axis: str, per_node: int) -> None:
    n = mesh.axis_size(axis)
    nodes = n // per_node
    inside, across = sub_axis_name(axis, nodes, per_node), sub_axis_name(axis, 1, nodes)
    x = op.operands[0]
    kind = op.attributes["kind"]
    mesh_name = ir.FlatSymbolRefAttr(op.attributes["mesh"]).value
    deterministic = "deterministic" in op.attributes
    shape = gb.shape_of(x)
    total = math.prod(shape)
    padded = -(-total // per_node) * per_node
    with ir.InsertionPoint(op), op.location:
        flat = gb.pad(gb.reshape(x, [total]), [0], [padded])
        part = gb.reduce_scatter(flat, mesh_name, inside, 0, per_node, deterministic, kind=kind)
        summed = gb.all_reduce(part, kind, mesh_name, across, deterministic)
        gathered = gb.all_gather(summed, mesh_name, inside, 0, per_node)
        result = gb.reshape(gb.slice_(gathered, [0], [total]), shape)
    op.results[0].replace_all_uses_with(result)
    op.erase()


def run(op, pass_, options: TargetOptions):
    def body():
        enabled = options.ranks_per_node > 0 and options.hierarchical_collectives
        meshes = meshes_of(op)
        for f in list(functions(op)):
            reduces = partitioned_all_reduces(f, "tessera-hierarchical-collectives")
            if not enabled:
                continue
            todo = []
            for inner in reduces:
                mesh = meshes.get(ir.FlatSymbolRefAttr(inner.attributes["mesh"]).value)
                axis = ir.StringAttr(inner.attributes["axis"]).value
                if mesh is None or axis not in mesh.axes or \
                        not ir.RankedTensorType(inner.results[0].type).has_static_shape:
                    continue            # a sub-axis already, or a shape to leave alone
                per_node = ranks_per_node_of_axis(mesh.shape, mesh.axes.index(axis),
                                                  options.ranks_per_node)
                n = mesh.axis_size(axis)
                if not 1 < per_node < n:
                    continue
                if "deterministic" in inner.attributes and per_node & (per_node - 1):
                    continue            # the node trees would not be the flat tree's
                todo.append((inner, mesh, axis, per_node))
            for inner, mesh, axis, per_node in todo:
                _rewrite(inner, mesh, axis, per_node)
    run_reporting(op, pass_, body)
