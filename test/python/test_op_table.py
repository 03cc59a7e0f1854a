"""The elementwise op table (tessera_compiler/ir/ops.py) covers every `Pure`,
`Elementwise` op of Graph IR and Tile IR (read from their ODS), and every
consumer takes the op from it: the tracer, the sharding rules, autodiff, the
tile lowering and both emitters; each op computes what its numpy reference
says, on fresh random inputs, through the whole compiler on the CPU and on
the emulated GPU, and as a Tile IR kernel through both emitters."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera_compiler.ir import ops

REPO = Path(__file__).resolve().parents[2]
TD = {"tgraph": REPO / "dialects/include/tessera/TGraph/TGraph.td",
      "ttile": REPO / "dialects/include/tessera/TTile/TTile.td"}

#: How the tracer (tessera.op) reaches each Graph IR op of the table.
TRACER = {
    "add": lambda a, b: op.add(a, b), "sub": lambda a, b: op.sub(a, b),
    "mul": lambda a, b: op.mul(a, b), "div": lambda a, b: op.div(a, b),
    "max": lambda a, b: op.maximum(a, b), "neg": op.neg, "relu": op.relu, "exp": op.exp,
    "log": op.log, "tanh": op.tanh, "gelu": op.gelu, "sqrt": op.sqrt, "rsqrt": op.rsqrt,
    "pow": lambda a, b: op.pow(a, b), "sin": op.sin, "cos": op.cos, "erf": op.erf,
    "abs": op.abs, "sign": op.sign, "floor": op.floor, "ceil": op.ceil,
    "compare": lambda a, b: op.less(a, b),
    "select": lambda a, b: op.where(op.greater(a, b), a, b),
    "cast": lambda a: op.cast(a, ts.f64),
}


def _inputs(e: ops.Elementwise, shape, rng) -> list[np.ndarray]:
    n = 2 if e.name == "select" else e.operands
    return [ops.sample_inputs(e.domain, shape, rng).astype(np.float32) for _ in range(n)]


def _reference(e: ops.Elementwise, xs: list[np.ndarray]) -> np.ndarray:
    """What TRACER[e.name] computes, from the table's numpy reference."""
    x64 = [x.astype(np.float64) for x in xs]
    if e.name == "compare":
        return (x64[0] < x64[1]).astype(np.float64)
    if e.name == "select":
        return e.numpy(x64[0] > x64[1], *x64, None)
    return e.numpy(*x64, None)


def _ods_elementwise(dialect: str) -> set[str]:
    """Mnemonics of the ops of `dialect`'s ODS with the Pure and Elementwise
    traits (llvm-tblgen's JSON dump of the records)."""
    import llvm
    import mlir
    tblgen = Path(llvm.__file__).parent / "bin" / "llvm-tblgen"
    include = Path(list(mlir.__path__)[0]) / "include"     # (xtc-mlir-dev)
    out = subprocess.run([str(tblgen), "--dump-json", "-I", str(include),
                          "-I", str(REPO / "dialects/include"), str(TD[dialect])],
                         capture_output=True, text=True, check=True).stdout
    records = json.loads(out)
    found = set()
    for name in records["!instanceof"]["Op"]:
        r = records[name]
        if records[r["opDialect"]["def"]]["name"] != dialect:
            continue
        traits = set()
        stack = list(r["traits"])
        while stack:                    # Pure is a list of traits: flatten
            t = stack.pop()
            d = records[t["def"]]
            traits.add(t["def"])
            stack += d.get("traits", [])
        if {"Elementwise", "AlwaysSpeculatableImplTrait"} <= traits:
            found.add(r["opName"])
    return found


def test_every_pure_elementwise_op_of_the_dialects_is_in_the_table():
    graph, tile = _ods_elementwise("tgraph"), _ods_elementwise("ttile")
    assert {"add", "rsqrt", "select", "cast"} <= graph, graph
    assert graph == {e.name for e in ops.ELEMENTWISE.values() if e.graph}
    assert tile == set(ops.ELEMENTWISE)


def test_every_consumer_takes_the_table():
    """Structure: the sharding rules, autodiff, the tile lowering and both
    emitters reach every op through the table (the numeric tests below show
    what they do with it)."""
    from tessera_compiler.ir.gpu_schedule import POINTWISE
    from tessera_compiler.codegen.printer import ELEMENTWISE_EXPRESSIONS
    from tessera_compiler.ir import graph_builder as gb
    from tessera_passes import sharding_rules
    assert set(TRACER) == {e.name for e in ops.ELEMENTWISE.values() if e.graph}
    for name, e in ops.GRAPH_ELEMENTWISE.items():
        assert sharding_rules.RULES[name] is sharding_rules.elementwise_rule, name
        assert name in ops.TILEABLE, name
        assert e.linear in ("", "same", "unary", "one", "first", "select"), name
        if e.name not in ("compare", "select", "cast"):     # (built with their types)
            assert gb.op_class(e.name).OPERATION_NAME == name
    for name in ops.TILE_ELEMENTWISE:
        assert ELEMENTWISE_EXPRESSIONS[name] is ops.TILE_ELEMENTWISE[name].c
        assert name in POINTWISE


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_every_graph_op_computes_its_reference(target, monkeypatch):
    """All of Graph IR's elementwise ops in one compiled function (one fused
    kernel), on the CPU and on the emulated GPU, against float64 numpy."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    rng = np.random.default_rng()
    entries = [e for e in ops.ELEMENTWISE.values() if e.graph]
    inputs = [_inputs(e, (4, 32), rng) for e in entries]

    def everything(*flat):
        it = iter(flat)
        return [TRACER[e.name](*[next(it) for _ in xs]) for e, xs in zip(entries, inputs)]
    outs = ts.jit(everything, target=target)(*[x for xs in inputs for x in xs])
    for e, xs, got in zip(entries, inputs, outs):
        np.testing.assert_allclose(np.asarray(got, np.float64), _reference(e, xs),
                                   rtol=2e-6, atol=2e-6, err_msg=f"{e.name} on {target}")


@pytest.mark.parametrize("name", sorted(n for n, e in ops.ELEMENTWISE.items()
                                         if e.vjp and n != "cast"))
def test_every_vjp_matches_finite_differences(name):
    """The table's VJP, as tessera-autodiff runs it, against float64 central
    differences of the op."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_autodiff import _fd_check
    e = ops.ELEMENTWISE[name]
    rng = np.random.default_rng()
    xs = [x.astype(np.float64) for x in _inputs(e, (3, 4), rng)]
    wrt = (0,) if e.operands == 1 else (0, 1)
    _fd_check(TRACER[name], xs, wrt)


def test_cast_vjp_is_the_cotangent_cast_back():
    """A float cast changes precision, so central differences at h = 1e-6
    cannot check it; exactly: d/dx sum(cast(x, f64) * R) = cast(R, f32)."""
    rng = np.random.default_rng()
    x, r = rng.standard_normal(12).astype(np.float32), rng.standard_normal(12)
    grad = ts.jit(lambda x: ts.grad(op.sum(op.mul(op.cast(x, ts.f64), r)), x))(x)
    assert grad.dtype == np.float32
    np.testing.assert_array_equal(grad, r.astype(np.float32))


def _tile_kernel(entries) -> str:
    """One Tile IR kernel applying every op of `entries` to tiles of its
    inputs (4x8 f32; compare < and cast to f64; select picks by a > b)."""
    args, body, n = [], [], 0
    tile, f64tile, i1tile = "!ttile.tile<4x8xf32>", "!ttile.tile<4x8xf64>", "!ttile.tile<4x8xi1>"
    for e in entries:
        ins = []
        for _ in range(2 if e.name == "select" else e.operands):
            args.append(f"%in{n}: memref<4x8xf32>")
            body.append(f"%x{n} = ttile.load %in{n}[%c0, %c0] : memref<4x8xf32> -> {tile}")
            ins.append(f"%x{n}")
            n += 1
        out = f"%out_{e.name}"
        if e.name == "compare":
            body.append(f"%c_{e.name} = ttile.compare %x{n - 2}, %x{n - 1} {{kind = #tgraph.compare<lt>}} : {tile} -> {i1tile}")
            body.append(f"%r_{e.name} = ttile.cast %c_{e.name} : {i1tile} to {f64tile}")
        elif e.name == "select":
            body.append(f"%s_{e.name} = ttile.compare %x{n - 2}, %x{n - 1} {{kind = #tgraph.compare<gt>}} : {tile} -> {i1tile}")
            body.append(f"%t_{e.name} = ttile.select %s_{e.name}, %x{n - 2}, %x{n - 1} : {i1tile}, {tile}")
            body.append(f"%r_{e.name} = ttile.cast %t_{e.name} : {tile} to {f64tile}")
        elif e.name == "cast":
            body.append(f"%r_{e.name} = ttile.cast {ins[0]} : {tile} to {f64tile}")
        else:
            body.append(f"%t_{e.name} = ttile.{e.name} {', '.join(ins)} : {tile}")
            body.append(f"%r_{e.name} = ttile.cast %t_{e.name} : {tile} to {f64tile}")
        args.append(f"{out}: memref<4x8xf64>")
        body.append(f"ttile.store %r_{e.name}, {out}[%c0, %c0] : {f64tile}, memref<4x8xf64>")
    lines = "\n  ".join(["%c0 = arith.constant 0 : index"] + body + ["ttile.return"])
    return (f"ttile.kernel @every({', '.join(args)}) attributes "
            f"{{grid = array<i64: 1>, block = array<i64: 32>}} {{\n  {lines}\n}}")


@pytest.mark.parametrize("emitter", ["cpp", "cuda"])
def test_every_tile_op_computes_its_reference(emitter):
    """Every op of the table as Tile IR (exp2, Tile IR's own, included)
    through the C++ emitter (built and run) and the CUDA emitter (run by the
    CPU emulator), against float64 numpy."""
    from tessera_mlir import ir
    from tessera_compiler.translate import ttile_to_cpp, ttile_to_cuda
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_runtime.engines.cuda_emulator import EmulatedKernels
    entries = list(ops.ELEMENTWISE.values())
    with ir.Context():
        module = ir.Module.parse(_tile_kernel(entries))
        if emitter == "cpp":
            source = ttile_to_cpp(module)
        else:
            source, launches = ttile_to_cuda(module)
    rng = np.random.default_rng()
    inputs = [_inputs(e, (4, 8), rng) for e in entries]
    outputs = [np.full((4, 8), np.nan) for _ in entries]
    buffers = [b for xs, out in zip(inputs, outputs) for b in xs + [out]]
    if emitter == "cpp":
        lib = ctypes.CDLL(str(build_cpu_library(source)))
        lib.every(*(b.ctypes.data_as(ctypes.c_void_p) for b in buffers))
    else:
        launch = launches["every"]
        EmulatedKernels(source).launch("every", buffers, launch["grid"], launch["block"],
                                       launch["shared_bytes"])
    for e, xs, got in zip(entries, inputs, outputs):
        # The GPU's exp and exp2 are the special-function unit's (2^-22 relative).
        tol = 1e-6 if e.name in ("exp", "exp2", "tanh", "gelu") and emitter == "cuda" else 2e-7
        np.testing.assert_allclose(got, _reference(e, xs), rtol=tol, atol=tol,
                                   err_msg=f"ttile.{e.name} via {emitter}")
