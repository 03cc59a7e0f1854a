"""Writes a compiled program as a bundle the runtime can execute without the
compiler (format: docs/bundle-format.md). No pickle: JSON, text and binaries.

`program.json` is a one-to-one serialization of the Schedule IR function:
every tsched op becomes one instruction, in order.
"""

from __future__ import annotations

import functools
import hashlib

import json
import math
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tessera_mlir import ir
from tessera_runtime import routines

from .codegen.build import build_cpu_library, build_cuda_cubin, nvcc, standalone_cpu_source
from .ir.routines import declaration, declarations
from .ir.options import TargetOptions
from .ir.locations import location_name, source_of
from .ir.pipeline import ACTION, HELD, INFO
from .ir.sharding import Sharding, meshes_of
from .ir.types import ELEMENT_TYPES, enum_of
from .lowering import Levels

FORMAT_VERSION = 1

#: instructions the runtime times and records (they carry `loc`)
_TIMED = ("launch", "collective_start", "send", "recv")


def _dtype(element: ir.Type) -> str:
    return ELEMENT_TYPES[str(element)]


def _arg_name(arg: ir.Value, index: int) -> str:
    return location_name(arg.location) or f"arg{index}"


class _Namer:
    """`%arg<i>` for arguments, streams by their name, `%<n>` for other values."""

    def __init__(self, arguments):
        self.names = {a: f"%arg{i}" for i, a in enumerate(arguments)}
        self.count = 0

    def __call__(self, value: ir.Value) -> str:
        if value not in self.names:
            self.names[value] = f"%{self.count}"
            self.count += 1
        return self.names[value]


def _schedule_function(module: ir.Module) -> ir.Operation:
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "tsched.kernel" not in op.attributes and any(
                o.operation.name.startswith("tsched.") for o in op.regions[0].blocks[0].operations):
            return op
    raise ValueError("module has no Schedule IR function")


def _tensor_spec(name, value_name, memref: ir.MemRefType, sharding: Sharding | None, mesh):
    local = list(memref.shape)
    spec = {"name": name, "value": value_name, "dtype": _dtype(memref.element_type),
            "local_shape": local, "global_shape": local}
    if sharding is not None:
        spec["global_shape"] = [n * mesh.parts(axes) for n, axes in zip(local, sharding.dims)]
        spec["sharding"] = {"dims": [list(d) for d in sharding.dims],
                            "partial": list(sharding.partial)}
    return spec


def _dict_attrs(func_op: ir.Operation, key: str, n: int):
    if key in func_op.attributes:
        return [ir.DictAttr(a) for a in ir.ArrayAttr(func_op.attributes[key])]
    return [None] * n


def compiler_fingerprint(options: TargetOptions) -> str:
    """A hash of the compiler's own code (passes, emitters, dialect library)
    and of the options it compiles with (`TargetOptions.digest()`: every
    knob that changes kernels), part of every bundle's cache key: a changed
    compiler, or the same one given other options, never reuses a bundle
    written before."""
    return hashlib.sha256((_code_fingerprint() + options.digest()).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _code_fingerprint() -> str:
    import tessera_mlir
    import tessera_passes
    h = hashlib.sha256()
    roots = [Path(__file__).parent, Path(tessera_passes.__file__).parent]
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(f.read_bytes())
    # The routines' table decides which ops become library calls.
    h.update(Path(routines.__file__).read_bytes())
    for lib in sorted(Path(list(tessera_mlir.__path__)[0]).rglob("*Tessera*")):
        st = lib.stat()
        h.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _library_declarations(module: ir.Module) -> dict:
    """kernel symbol -> (runtime routine, its attributes as JSON) for the
    launches tessera-lower-to-tile turned into library calls, each checked
    against its routine's declaration (`tessera_runtime.routines`)."""
    return {ir.StringAttr(d.attributes["sym_name"]).value: declaration(d)
            for d in declarations(module.operation)}


def program_json(module: ir.Module, devices: list[int] | None = None) -> dict:
    func_op = _schedule_function(module)
    entry = func_op.regions[0].blocks[0]
    meshes = meshes_of(module)
    mesh = next(iter(meshes.values())) if meshes else None
    name = _Namer(entry.arguments)

    def sharding_of(d):
        return Sharding.from_attr(d["tsched.sharding"]) if d is not None and "tsched.sharding" in d else None

    arg_dicts = _dict_attrs(func_op, "arg_attrs", len(entry.arguments))
    inputs = [_tensor_spec(_arg_name(a, i), name(a), ir.MemRefType(a.type), sharding_of(d), mesh)
              for i, (a, d) in enumerate(zip(entry.arguments, arg_dicts))]

    libraries = _library_declarations(module)
    instructions, outputs = [], []
    streams = []
    for op in entry.operations:
        op = op.operation
        kind = op.name
        ins = {}
        if kind == "tsched.stream":
            stream = ir.StringAttr(op.attributes["name"]).value
            streams.append(stream)
            name.names[op.results[0]] = stream
            continue
        if kind == "tsched.alloc":
            t = ir.MemRefType(op.results[0].type)
            ins = {"op": "alloc", "result": name(op.results[0]), "shape": list(t.shape),
                   "dtype": _dtype(t.element_type)}
            if "symmetric" in op.attributes:
                ins["symmetric"] = True
        elif kind == "tsched.free":
            ins = {"op": "free", "buffer": name(op.operands[0])}
        elif kind == "tsched.launch":
            view = op.opview
            kernel = ir.FlatSymbolRefAttr(op.attributes["kernel"]).value
            ins = {"op": "launch", "kernel": kernel, "stream": name.names[view.stream],
                   "args": [name(v) for v in list(view.ins) + list(view.outs)],
                   "outs": len(view.outs)}
            if kernel in libraries:
                ins["library"], ins["attrs"] = libraries[kernel]
        elif kind == "tsched.event_record":
            ins = {"op": "event_record", "result": name(op.results[0]),
                   "stream": name.names[op.operands[0]]}
        elif kind == "tsched.event_wait":
            ins = {"op": "event_wait", "event": name(op.operands[0]),
                   "stream": name.names[op.operands[1]]}
        elif kind == "tsched.collective_start":
            view = op.opview
            attrs = op.attributes
            ins = {"op": "collective_start", "result": name(op.results[0]),
                   "stream": name.names[view.stream],
                   "collective": enum_of(op),
                   "axis": ir.StringAttr(attrs["axis"]).value,
                   "deterministic": "deterministic" in attrs,
                   "src": name(view.src), "dst": name(view.dst)}
            if "reduction" in attrs:
                ins["reduction"] = enum_of(op, "reduction")
            if "dim" in attrs:
                ins["dim"] = ir.IntegerAttr(attrs["dim"]).value
            if "concat_dim" in attrs:
                ins["concat_dim"] = ir.IntegerAttr(attrs["concat_dim"]).value
            if "root" in attrs:
                ins["root"] = ir.IntegerAttr(attrs["root"]).value
            if "offset" in attrs:
                ins["offset"] = ir.IntegerAttr(attrs["offset"]).value
            if len(view.counts):
                ins["counts"] = [name(v) for v in view.counts]
        elif kind in ("tsched.send", "tsched.recv"):
            view = op.opview
            ins = {"op": kind.split(".")[1], "result": name(op.results[0]),
                   "stream": name.names[view.stream], "buffer": name(view.buffer),
                   "peer": ir.IntegerAttr(op.attributes["peer"]).value,
                   "axis": ir.StringAttr(op.attributes["axis"]).value}
        elif kind == "tsched.collective_wait":
            ins = {"op": "collective_wait", "token": name(op.operands[0]),
                   "stream": name.names[op.operands[1]]}
        elif kind == "func.return":
            res_dicts = _dict_attrs(func_op, "res_attrs", len(op.operands))
            for i, (v, d) in enumerate(zip(op.operands, res_dicts)):
                outputs.append(_tensor_spec(f"result{i}", name(v), ir.MemRefType(v.type),
                                            sharding_of(d), mesh))
                if d is not None and HELD in d:     # (results="stage": on one pp rank)
                    held = ir.DictAttr(d[HELD])
                    outputs[-1]["on"] = [ir.StringAttr(held["axis"]).value,
                                         ir.IntegerAttr(held["rank"]).value]
            ins = {"op": "return", "values": [name(v) for v in op.operands]}
        else:
            raise ValueError(f"cannot serialize '{kind}' into a bundle program")
        if ACTION in op.attributes:
            ins["on"] = _action_json(ir.DictAttr(op.attributes[ACTION]))
        if ins["op"] in _TIMED:
            # The user's Python line, for the profiler's timeline and the
            # flight recorder (absent where the op has no file location).
            loc = source_of(op.location)
            if loc:
                ins["loc"] = loc
        instructions.append(ins)

    program = {"entry": ir.StringAttr(func_op.attributes["sym_name"]).value,
               "inputs": inputs, "outputs": outputs, "streams": streams,
               "instructions": instructions}
    if INFO in func_op.attributes:
        program["pipeline"] = _pipeline_json(ir.DictAttr(func_op.attributes[INFO]))
    if mesh is not None:
        program["mesh"] = {"name": mesh.name, "axes": list(mesh.axes), "shape": list(mesh.shape),
                           "devices": devices if devices is not None
                           else list(range(math.prod(mesh.shape)))}
    return program


def _action_json(d: ir.DictAttr) -> dict:
    """The rank that runs an instruction (`axis`, `rank`) and, for a stage
    action, which (`kind`, `stage`, `chunk`, `microbatch`)."""
    out = {}
    for entry in d:
        a = entry.attr
        out[entry.name] = ir.StringAttr(a).value if isinstance(a, ir.StringAttr) \
            else ir.IntegerAttr(a).value
    return out


def _pipeline_json(d: ir.DictAttr) -> dict:
    out = {"axis": ir.StringAttr(d["axis"]).value,
           "schedule": ir.StringAttr(d["schedule"]).value,
           "overlap": ir.BoolAttr(d["overlap"]).value}
    for key in ("ranks", "stages", "microbatches"):
        out[key] = ir.IntegerAttr(d[key]).value
    out["costs"] = [{"kind": ir.StringAttr(ir.DictAttr(c)["kind"]).value,
                     "stage": ir.IntegerAttr(ir.DictAttr(c)["stage"]).value,
                     "cost": ir.FloatAttr(ir.DictAttr(c)["cost"]).value}
                    for c in ir.ArrayAttr(d["costs"])]
    return out


def write_bundle(path: str | Path, levels: Levels, devices: list[int] | None = None,
                 cubin: bool = True) -> Path:
    """Writes `levels` (a fully lowered program) as a bundle directory at `path`.

    CPU target: the kernels' C++ and the shared library built from it (engine
    `cpu`). GPU target: the kernels' CUDA C++, each kernel's launch
    configuration (`launch` in the manifest), and a cubin for sm_90 when nvcc
    is installed and `cubin` is true (engine `cuda`; without a cubin the
    engine compiles the source with NVRTC at load time). The `cuda-emulated`
    engine runs the same source on the CPU (tests)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    (path / "ir").mkdir(parents=True)
    (path / "kernels").mkdir()
    # The kernels build (g++ or nvcc processes) while this thread prints the
    # IR levels into the bundle (otherwise added to every first call).
    with ThreadPoolExecutor(1) as pool:
        if levels.target == "cpu":
            built = pool.submit(build_cpu_library, levels.cpp)
        elif cubin and nvcc() is not None:
            built = pool.submit(build_cuda_cubin, levels.cuda)
        else:
            built = None
        program = program_json(levels.module, devices)
        for stage in ("graph", "partitioned", "schedule", "tile"):
            (path / "ir" / f"{stage}.mlir").write_text(getattr(levels, stage))
        library = built.result() if built is not None else None
    manifest = {
        "format": "tessera-bundle", "version": FORMAT_VERSION, "entry": program["entry"],
        "program": "program.json",
        "ir": {s: f"ir/{s}.mlir" for s in ("graph", "partitioned", "schedule", "tile")},
    }
    if levels.target == "cpu":
        (path / "kernels" / "kernels.cpp").write_text(standalone_cpu_source(levels.cpp))
        shutil.copyfile(library, path / "kernels" / "libkernels.so")
        manifest.update(engine="cpu", kernels={"cpu": "kernels/libkernels.so"},
                        sources={"cpp": "kernels/kernels.cpp"})
    else:
        (path / "kernels" / "kernels.cu").write_text(levels.cuda)
        kernels = {"cuda-emulated": "kernels/kernels.cu"}
        if library is not None:
            shutil.copyfile(library, path / "kernels" / "kernels.cubin")
            kernels["cuda"] = "kernels/kernels.cubin"
        else:
            kernels["cuda"] = "kernels/kernels.cu"
        manifest.update(engine="cuda", kernels=kernels, sources={"cuda": "kernels/kernels.cu"},
                        launch=levels.cuda_launches)
    (path / "program.json").write_text(json.dumps(program, indent=1))
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return path
