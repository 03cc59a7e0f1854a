"""The library routines' one table (tessera_runtime/routines.py) and every
side that reads it agree: the lowering emits only declared routines and
copies the declared attributes of their Graph IR ops; each declared routine
has an implementation (library.ROUTINES, the CPU engine), a cost class and
a result rule the implementation honours; the verifier
(tessera-verify-schedule) and the runtime's bundle reader accept exactly
the declared routines. Also: the cost model's op classes come from the op
table (exp2 is transcendental) and its byte sizes from ir/types.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tessera_mlir import ir
from tessera_runtime import routines
from tessera_runtime.bundle import BundleError, read_program
from tessera_runtime.engines import library
from tessera_runtime.engines.cpu import CPUEngine

from tessera_compiler import cost
from tessera_compiler.ir import ops, routines as ir_routines
from tessera_compiler.ir.support import PassError
from tessera_compiler.ir.types import DTYPE_BYTES, ELEMENT_TYPES
import tessera_passes.lower_to_tile as lower_to_tile

TGRAPH_TD = Path(__file__).resolve().parents[2] / "dialects/include/tessera/TGraph/TGraph.td"

#: One launch of each routine that its declaration accepts: buffers
#: ((shape, dtype), operands then results) and attributes (JSON).
SAMPLES = {
    "matmul": ([((2, 8, 4), "float32"), ((4, 6), "float32"), ((2, 8, 6), "float32")], {}),
    "reshape": ([((2, 6), "float32"), ((3, 4), "float32")], {}),
    "transpose": ([((2, 3, 4), "float32"), ((4, 2, 3), "float32")], {"perm": [2, 0, 1]}),
    "slice": ([((6, 4), "float32"), ((2, 3), "float32")], {"offsets": [3, 1]}),
    "pad": ([((2, 3), "float32"), ((6, 4), "float32")], {"offsets": [3, 1]}),
    "concat": ([((2, 3), "float32"), ((2, 5), "float32"), ((2, 8), "float32")], {"dim": 1}),
    "gather": ([((16, 8), "float32"), ((2, 4), "int32"), ((2, 4, 8), "float32")], {}),
    "scatter_add": ([((2, 4, 8), "float32"), ((2, 4), "int32"), ((16, 8), "float32")], {}),
    "axis_slice": ([((4, 6), "float32"), ((4, 3), "float32")], {"axis": "tp", "dim": 1}),
    "dynamic_slice": ([((4, 6), "float32"), ((), "int32"), ((4, 2), "float32")], {"dim": 1}),
    "dynamic_update_slice": ([((4, 6), "float32"), ((), "int32"), ((4, 2), "float32"),
                              ((4, 6), "float32")], {"dim": 1}),
    "dropout": ([((4, 8), "float32"), ((2,), "int64"), ((4, 8), "float32")], {"p": 0.25}),
    "topk": ([((5, 8), "float32"), ((5, 2), "int32")], {"k": 2}),
    "moe_dispatch": ([((6, 4), "float32"), ((6, 2), "int32"), ((16, 4), "float32"),
                      ((4,), "int32")], {"num_experts": 4, "capacity": 0}),
    "moe_collect": ([((16, 4), "float32"), ((6, 2), "int32"), ((6, 2, 4), "float32")],
                    {"num_experts": 4, "capacity": 0}),
    "grouped_matmul": ([((8, 4), "float32"), ((2, 4, 6), "float32"), ((2,), "int32"),
                        ((8, 6), "float32")], {}),
    "grouped_outer": ([((8, 4), "float32"), ((8, 6), "float32"), ((2,), "int32"),
                       ((2, 4, 6), "float32")], {}),
    "check_range": ([((8,), "int32")], {"low": 0, "high": 7, "message": "{row} {value}"}),
}
#: Graph IR op attributes a declaration leaves behind (and why).
DROPPED = {
    "transport": "a matmul's transport is a GPU GEMM's, not BLAS's",
    "mesh": "axis_slice's mesh: the executor knows its mesh",
}
#: what the executor adds before a launch (Executor._with_block)
RUNTIME_ATTRS = {"block": (0, 2)}


def test_every_routine_the_lowering_emits_is_declared_with_its_ops_attributes():
    """lower-to-tile's routines come from the table, each from an op of
    Graph IR whose every attribute the declaration lists (or DROPPED says
    why not)."""
    emitted = set(lower_to_tile.LIBRARY.values()) | {"matmul"}
    assert emitted == set(routines.ROUTINES)
    td = TGRAPH_TD.read_text()
    for r in routines.ROUTINES.values():
        assert r.graph_op is not None, r.name
        m = re.search(r'TGraph_\w*Op<"%s"[^{]*\{.*?let arguments = \(ins(.*?)\);' %
                      r.graph_op.split(".", 1)[1], td, re.S)
        assert m, f"{r.graph_op} is not an op of TGraph.td"
        op_attrs = set(re.findall(r"Attr[^:]*:\$(\w+)", m.group(1)))
        assert op_attrs - set(r.attributes) <= set(DROPPED), (r.name, op_attrs)


def test_every_declared_routine_is_implemented_priced_and_honours_its_result_rule():
    engine = CPUEngine()
    assert set(library.ROUTINES) == set(routines.ROUTINES) == set(SAMPLES)
    machine = cost.BUILTIN["h100-node"]
    for name, (buffers, attrs) in SAMPLES.items():
        declared = routines.ROUTINES[name]
        declared.check(buffers, attrs)
        assert engine.has_library(name)
        # The implementation writes exactly the buffers the rule gives.
        arrays = [np.zeros(s, dtype=d) for s, d in buffers]
        library.ROUTINES[name](np, {**attrs, **RUNTIME_ATTRS} if "axis" in attrs else attrs,
                               *arrays)
        # The cost model prices it by its class.
        args = [f"%{i}" for i in range(len(buffers))]
        seconds = cost._launch_seconds({"library": name, "args": args, "attrs": attrs,
                                        "kernel": name}, {}, dict(zip(args, buffers)), machine)
        assert seconds >= 0 and (seconds == 0) == (declared.cost == "view"), (name, seconds)
        if declared.cost in ("gemm", "grouped_gemm"):        # at least its FLOPs at peak
            flops = {"matmul": 2 * 2 * 8 * 4 * 6}.get(name, 2 * 8 * 4 * 6)    # 2 (batch) m k n
            assert seconds >= machine.gemm_call_s + flops / machine.gemm_rate("float32"), name
    with pytest.raises(routines.ContractError, match="unknown library routine 'sort'"):
        routines.implementations({"sort": None})


def test_a_result_rule_refuses_what_its_implementation_would_not_write():
    buffers, attrs = SAMPLES["gather"]
    with pytest.raises(routines.ContractError, match="the result rule gives"):
        routines.ROUTINES["gather"].check(buffers[:2] + [((2, 4, 9), "float32")], attrs)
    with pytest.raises(routines.ContractError, match="must be a list of integers"):
        routines.ROUTINES["transpose"].check(SAMPLES["transpose"][0], {"perm": "021"})


def _declaration(name, buffers, attrs) -> str:
    def attr(v):
        if v is True:
            return None
        if isinstance(v, int):
            return f"{v} : i64"
        if isinstance(v, float):
            return f"{v!r} : f64"
        if isinstance(v, str):
            return json.dumps(v)
        if v and isinstance(v[0], str):
            return "[" + ", ".join(json.dumps(x) for x in v) + "]"
        return "array<i64" + "".join(f", {x}" if i else f": {x}" for i, x in enumerate(v)) + ">"
    mlir = {d: t for t, d in ELEMENT_TYPES.items()}
    types = ", ".join(f"memref<{''.join(f'{n}x' for n in s)}{mlir[d]}>" for s, d in buffers)
    entries = ", ".join(k if attr(v) is None else f"{k} = {attr(v)}" for k, v in attrs.items())
    return (f'func.func private @f({types}) attributes {{tsched.library = "{name}", '
            f"tsched.library_attrs = {{{entries}}}}}")


def test_the_verifier_accepts_exactly_the_declared_routines():
    with ir.Context():
        for name, (buffers, attrs) in SAMPLES.items():
            module = ir.Module.parse(_declaration(name, buffers, attrs))
            (decl,) = ir_routines.declarations(module.operation)
            assert ir_routines.declaration(decl) == (name, attrs)
        module = ir.Module.parse(_declaration("sort", *SAMPLES["reshape"]))
        with pytest.raises(PassError, match="unknown library routine 'sort'"):
            ir_routines.declaration(ir_routines.declarations(module.operation)[0])


def _program(library_name: str, attrs: dict, nargs: int) -> dict:
    return {"mesh": {"name": "mesh", "axes": ["tp"], "shape": [1], "devices": [0]},
            "inputs": [], "outputs": [], "streams": ["compute"],
            "instructions": [{"op": "launch", "kernel": "k", "library": library_name,
                              "attrs": attrs, "stream": "compute",
                              "args": [f"%{i}" for i in range(nargs)]}]}


def test_the_bundle_reader_accepts_exactly_the_declared_routines(tmp_path):
    path = tmp_path / "program.json"
    for name, (buffers, attrs) in SAMPLES.items():
        path.write_text(json.dumps(_program(name, attrs, len(buffers))))
        (ins,) = read_program(path).instructions
        assert ins["library"] == name
    for name, attrs, nargs, message in [
            ("sort", {}, 2, "unknown library routine 'sort'"),
            ("transpose", {}, 2, "needs attribute 'perm'"),
            ("concat", {"dim": "1"}, 3, "must be an integer"),
            ("gather", {}, 2, "takes 3 buffers")]:
        path.write_text(json.dumps(_program(name, attrs, nargs)))
        with pytest.raises(BundleError, match=re.escape(message)):
            read_program(path)


def test_exp2_is_priced_as_transcendental():
    """Flash attention's base-2 exponentials (ttile.exp2) cost what exp
    does, from the op table, not a list in the cost model."""
    assert ops.op_class("ttile.exp2") == ops.op_class("ttile.exp") == "transcendental"
    assert ops.op_class("ttile.add") == "compute" and ops.op_class("ttile.load") == "move"
    kernel = """
ttile.kernel @k(%a: memref<4x16xf32>, %b: memref<4x16xf32>) attributes {grid = array<i64: 3>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %t = ttile.load %a[%c0, %c0] : memref<4x16xf32> -> !ttile.tile<4x16xf32>
  %e = ttile.exp2 %t : !ttile.tile<4x16xf32>
  %s = ttile.add %e, %t : !ttile.tile<4x16xf32>
  ttile.store %s, %b[%c0, %c0] : !ttile.tile<4x16xf32>, memref<4x16xf32>
  ttile.return
}"""
    with ir.Context():
        (work,) = cost.kernel_work(ir.Module.parse(kernel)).values()
    assert work.transcendental == 3 * 64 and work.vector == 3 * 64


def test_cost_model_byte_sizes_are_the_type_tables():
    assert not hasattr(cost, "_BYTES") and not hasattr(cost, "load_machine")
    for dtype, n in DTYPE_BYTES.items():
        assert cost._buffer_bytes((3, 5), dtype) == 15 * n
