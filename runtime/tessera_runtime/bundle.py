"""Read and validate a bundle directory (manifest.json + program.json).

This is the only place that knows the JSON layout of docs/bundle-format.md.
Everything is checked here, up front, so that a malformed bundle fails with
the file and the field at fault instead of a KeyError deep in the executor.
No pickle: bundles are JSON plus files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from . import routines
from .mesh import MeshError, MeshInfo

FORMAT = "tessera-bundle"
SUPPORTED_VERSIONS = (1,)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "shift")
REDUCTIONS = ("sum", "max", "min", "prod")


class BundleError(ValueError):
    """The bundle on disk is missing a file or a file is malformed."""


# --------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Sharding:
    dims: tuple[tuple[str, ...], ...]   # per tensor dim: mesh axes it is split over
    partial: tuple[str, ...]            # axes over which the value is a pending sum


@dataclass(frozen=True)
class TensorSpec:
    """An entry of program.json `inputs` / `outputs`."""
    name: str
    value: str
    dtype: np.dtype
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    sharding: Sharding
    #: (axis, rank): an output only that rank of the axis holds (a
    #: pipeline's results="stage"); None: every rank
    on: tuple | None = None


@dataclass(frozen=True)
class Instr:
    """One schedule instruction: `op` plus its (validated, normalized) fields."""
    index: int
    op: str
    fields: dict = field(hash=False)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def where(self) -> str:
        """Human-readable location used in error messages."""
        tag = self.fields.get("result") or self.fields.get("kernel") or ""
        return f"instructions[{self.index}] ({self.op}{' ' + tag if tag else ''})"


@dataclass
class ProgramSpec:
    path: Path
    mesh: MeshInfo
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    streams: list[str]
    instructions: list[Instr]
    #: a pipeline's schedule (axis, schedule, ranks, stages, microbatches,
    #: each action's cost), or None
    pipeline: dict | None = None
    #: the compiled function's name
    entry: str = "main"

    @property
    def sub_axes(self) -> list[str]:
        """The sub-axes (`"dp:(1)2"`) the program's collectives run over
        (hierarchical collectives), which need communicators of their own."""
        return sorted({ins["axis"] for ins in self.instructions
                       if "axis" in ins.fields and ins["axis"] not in self.mesh.axes})


@dataclass
class Manifest:
    path: Path
    entry: str
    engine: str
    program: str
    kernels: dict[str, str]
    raw: dict


@dataclass
class Bundle:
    root: Path
    manifest: Manifest
    program: ProgramSpec

    def kernel_library(self, engine: str) -> Path | None:
        """Absolute path of the kernel library for `engine`, or None if absent."""
        rel = self.manifest.kernels.get(engine)
        return None if rel is None else self.root / rel


# --------------------------------------------------------------------------
# Field readers: each one names the file and the field on failure.
# --------------------------------------------------------------------------

class _Reader:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, msg: str) -> BundleError:
        return BundleError(f"{self.path}: field '{where}': {msg}")

    def get(self, obj: dict, key: str, where: str, kind, default=...):
        if not isinstance(obj, dict):
            raise self.fail(where, f"expected an object, got {type(obj).__name__}")
        if key not in obj:
            if default is ...:
                raise self.fail(f"{where}.{key}" if where else key, "missing")
            return default
        v = obj[key]
        name = f"{where}.{key}" if where else key
        if kind is not None and (not isinstance(v, kind) or
                                 (kind is int and isinstance(v, bool))):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            raise self.fail(name, f"expected {'/'.join(k.__name__ for k in kinds)}, "
                                  f"got {type(v).__name__} {v!r}")
        return v

    def str_list(self, v, where: str) -> list[str]:
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise self.fail(where, f"expected a list of strings, got {v!r}")
        return list(v)

    def shape(self, v, where: str) -> tuple[int, ...]:
        if not isinstance(v, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v):
            raise self.fail(where, f"expected a list of non-negative ints, got {v!r}")
        return tuple(v)

    def dtype(self, v, where: str) -> np.dtype:
        try:
            dt = (_ML_DTYPES.get(v) or np.dtype(v)) if isinstance(v, str) else None
        except TypeError:
            dt = None
        if dt is None or (dt.kind not in "biufc" and dt not in _ML_DTYPES.values()):
            raise self.fail(where, f"unknown dtype {v!r} (expected a numpy dtype "
                                   f"name such as 'float32')")
        return dt


# numpy has no bfloat16 or 8-bit floats; ml_dtypes provides the standard ones.
_ML_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16),
              "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn)}


def _load_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise BundleError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a JSON object at top level")
    return data


# --------------------------------------------------------------------------
# manifest.json
# --------------------------------------------------------------------------

def read_manifest(root: Path) -> Manifest:
    path = root / "manifest.json"
    m = _load_json(path, "bundle manifest")
    r = _Reader(path)
    fmt = r.get(m, "format", "", str)
    if fmt != FORMAT:
        raise r.fail("format", f"expected '{FORMAT}', got {fmt!r}")
    version = r.get(m, "version", "", int)
    if version not in SUPPORTED_VERSIONS:
        raise r.fail("version", f"unsupported version {version} "
                                f"(this runtime reads {list(SUPPORTED_VERSIONS)})")
    kernels = r.get(m, "kernels", "", dict, default={})
    for k, v in kernels.items():
        if not isinstance(v, str):
            raise r.fail(f"kernels.{k}", f"expected a path string, got {v!r}")
    return Manifest(path=path,
                    entry=r.get(m, "entry", "", str),
                    engine=r.get(m, "engine", "", str),
                    program=r.get(m, "program", "", str),
                    kernels=dict(kernels),
                    raw=m)


# --------------------------------------------------------------------------
# program.json
# --------------------------------------------------------------------------

# Required fields per op, with the reader used to check each one.
_STR, _STRS, _SHAPE, _DTYPE = "str", "strs", "shape", "dtype"
_OPS: dict[str, dict[str, str]] = {
    "alloc": {"result": _STR, "shape": _SHAPE, "dtype": _DTYPE},
    "free": {"buffer": _STR},
    "launch": {"kernel": _STR, "stream": _STR, "args": _STRS},
    "event_record": {"result": _STR, "stream": _STR},
    "event_wait": {"event": _STR, "stream": _STR},
    "collective_start": {"result": _STR, "stream": _STR, "collective": _STR,
                         "axis": _STR, "src": _STR, "dst": _STR},
    "collective_wait": {"token": _STR, "stream": _STR},
    "send": {"result": _STR, "stream": _STR, "buffer": _STR, "axis": _STR},
    "recv": {"result": _STR, "stream": _STR, "buffer": _STR, "axis": _STR},
    "return": {"values": _STRS},
}


def _read_instr(r: _Reader, i: int, raw) -> Instr:
    where = f"instructions[{i}]"
    op = r.get(raw, "op", where, str)
    if op not in _OPS:
        raise r.fail(f"{where}.op", f"unknown op {op!r} (known: {sorted(_OPS)})")
    fields: dict[str, Any] = {}
    for key, kind in _OPS[op].items():
        name = f"{where}.{key}"
        if kind == _STR:
            fields[key] = r.get(raw, key, where, str)
        elif kind == _STRS:
            fields[key] = r.str_list(r.get(raw, key, where, None), name)
        elif kind == _SHAPE:
            fields[key] = r.shape(r.get(raw, key, where, None), name)
        elif kind == _DTYPE:
            fields[key] = r.dtype(r.get(raw, key, where, None), name)
    if op == "collective_start":
        kind = fields["collective"]
        if kind not in COLLECTIVES:
            raise r.fail(f"{where}.collective", f"unknown collective {kind!r} "
                                                f"(known: {list(COLLECTIVES)})")
        # `reduction` only means something for reducing collectives and `dim`
        # only for gather/scatter; require each exactly where it matters so a
        # forgotten field is an error rather than a silent default.
        if kind in ("all_reduce", "reduce_scatter"):
            red = r.get(raw, "reduction", where, str)
            if red not in REDUCTIONS:
                raise r.fail(f"{where}.reduction", f"unknown reduction {red!r} "
                                                   f"(known: {list(REDUCTIONS)})")
            fields["reduction"] = red
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):
            fields["dim"] = r.get(raw, "dim", where, int)
        else:
            fields["dim"] = r.get(raw, "dim", where, int, default=0)
        if kind == "all_to_all":
            fields["concat_dim"] = r.get(raw, "concat_dim", where, int)
            if "counts" in raw:           # a ragged exchange: (send, receive) row counts
                counts = r.str_list(raw["counts"], f"{where}.counts")
                if len(counts) != 2:
                    raise r.fail(f"{where}.counts", f"expected the (send, receive) buffers, "
                                                    f"got {len(counts)}")
                fields["counts"] = counts
        fields["deterministic"] = r.get(raw, "deterministic", where, bool, default=False)
        if kind == "broadcast":
            fields["root"] = r.get(raw, "root", where, int)
        if kind == "shift":             # to rank r + offset, from rank r - offset
            fields["offset"] = r.get(raw, "offset", where, int)
    if op in ("send", "recv"):
        fields["peer"] = r.get(raw, "peer", where, int)
    if "on" in raw:
        # Run only by one rank along a mesh axis (a pipeline stage's action).
        on = r.get(raw, "on", where, dict)
        fields["on"] = (r.get(on, "axis", f"{where}.on", str), r.get(on, "rank", f"{where}.on", int))
    if op == "alloc":
        fields["symmetric"] = r.get(raw, "symmetric", where, bool, default=False)
    if "loc" in raw:
        # The user's Python line behind the instruction (profiles, flight recorder).
        fields["loc"] = r.get(raw, "loc", where, str)
    if op == "launch" and "outs" in raw:
        # How many of `args` (the last ones) the launch writes; without it,
        # every argument counts as written.
        outs = r.get(raw, "outs", where, int)
        if not 0 <= outs <= len(fields["args"]):
            raise r.fail(f"{where}.outs", f"{outs} outputs of {len(fields['args'])} arguments")
        fields["outs"] = outs
    if op == "launch" and "library" in raw:
        fields["library"] = r.get(raw, "library", where, str)
        fields["attrs"] = r.get(raw, "attrs", where, dict, default={})
        # The routine's declaration (routines.py): its name, attributes and
        # number of buffers, checked here rather than at its first launch.
        try:
            declared = routines.routine(fields["library"])
            declared.check_attributes(fields["attrs"])
            declared.split(fields["args"])
        except routines.ContractError as e:
            raise r.fail(f"{where}.library", str(e)) from None
    return Instr(index=i, op=op, fields=fields)


def _read_tensor(r: _Reader, raw, where: str, mesh: MeshInfo) -> TensorSpec:
    gshape = r.shape(r.get(raw, "global_shape", where, None), f"{where}.global_shape")
    lshape = r.shape(r.get(raw, "local_shape", where, None), f"{where}.local_shape")
    if len(gshape) != len(lshape):
        raise r.fail(f"{where}.local_shape", f"rank {len(lshape)} differs from "
                                             f"global_shape {list(gshape)}")
    sh = r.get(raw, "sharding", where, dict,
               default={"dims": [[] for _ in gshape], "partial": []})
    dims_raw = r.get(sh, "dims", f"{where}.sharding", list)
    if len(dims_raw) != len(gshape):
        raise r.fail(f"{where}.sharding.dims", f"has {len(dims_raw)} entries but the "
                                               f"tensor has rank {len(gshape)}")
    dims = tuple(tuple(r.str_list(d, f"{where}.sharding.dims[{k}]"))
                 for k, d in enumerate(dims_raw))
    partial = tuple(r.str_list(r.get(sh, "partial", f"{where}.sharding", list, default=[]),
                               f"{where}.sharding.partial"))
    for a in [a for d in dims for a in d] + list(partial):
        if a not in mesh.axes:
            raise r.fail(f"{where}.sharding", f"axis {a!r} is not a mesh axis "
                                              f"{list(mesh.axes)}")
    try:
        expect = mesh.local_shape(gshape, dims)
    except MeshError as e:
        raise r.fail(f"{where}.sharding", str(e)) from None
    if expect != lshape:
        raise r.fail(f"{where}.local_shape", f"{list(lshape)} does not match global_shape "
                                             f"{list(gshape)} split as {[list(d) for d in dims]} "
                                             f"(expected {list(expect)})")
    on = r.get(raw, "on", where, list, default=None)
    if on is not None:
        if len(on) != 2 or on[0] not in mesh.axes or not isinstance(on[1], int) or \
                not 0 <= on[1] < mesh.shape[mesh.axes.index(on[0])]:
            raise r.fail(f"{where}.on", f"{on!r} must be [a mesh axis, one of its ranks]")
        on = (on[0], on[1])
    return TensorSpec(name=r.get(raw, "name", where, str),
                      value=r.get(raw, "value", where, str),
                      dtype=r.dtype(r.get(raw, "dtype", where, None), f"{where}.dtype"),
                      global_shape=gshape, local_shape=lshape,
                      sharding=Sharding(dims=dims, partial=partial), on=on)


def read_program(path: Path) -> ProgramSpec:
    p = _load_json(path, "bundle program")
    r = _Reader(path)
    mesh_raw = r.get(p, "mesh", "", dict, default=None)
    if mesh_raw is None:
        mesh = MeshInfo.single()   # a non-distributed program may omit the mesh
    else:
        # `shape` may be left out when `devices` is nested (it is implied).
        shape = r.get(mesh_raw, "shape", "mesh", list, default=None)
        try:
            mesh = MeshInfo(axes=r.str_list(r.get(mesh_raw, "axes", "mesh", list), "mesh.axes"),
                            shape=None if shape is None else r.shape(shape, "mesh.shape"),
                            devices=r.get(mesh_raw, "devices", "mesh", list),
                            name=r.get(mesh_raw, "name", "mesh", str, default="mesh"))
        except MeshError as e:
            raise r.fail("mesh", str(e)) from None
    inputs = [_read_tensor(r, t, f"inputs[{i}]", mesh)
              for i, t in enumerate(r.get(p, "inputs", "", list))]
    outputs = [_read_tensor(r, t, f"outputs[{i}]", mesh)
               for i, t in enumerate(r.get(p, "outputs", "", list))]
    for kind, specs in (("inputs", inputs), ("outputs", outputs)):
        names = [t.name for t in specs]
        if len(set(names)) != len(names):
            raise r.fail(kind, f"duplicate names {names}")
    if len({t.value for t in inputs}) != len(inputs):
        raise r.fail("inputs", "two inputs bind the same value")
    streams = r.str_list(r.get(p, "streams", "", list), "streams")
    instrs = [_read_instr(r, i, raw)
              for i, raw in enumerate(r.get(p, "instructions", "", list))]
    return ProgramSpec(path=path, mesh=mesh, inputs=inputs, outputs=outputs,
                       streams=streams, instructions=instrs,
                       pipeline=r.get(p, "pipeline", "", dict, default=None),
                       entry=r.get(p, "entry", "", str, default=path.parent.name))


def read_bundle(path) -> Bundle:
    """Read and validate the bundle directory at `path`."""
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"bundle directory not found: {root}")
    manifest = read_manifest(root)
    program = read_program(root / manifest.program)
    return Bundle(root=root, manifest=manifest, program=program)
