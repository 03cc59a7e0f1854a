"""The library routines: launches the runtime runs itself (BLAS, the array
library, its kernel library) instead of a generated kernel. One declaration
per routine, read by every side of the contract:

    tessera-lower-to-tile     which Graph IR op becomes which routine, and
                              which of the op's attributes it copies
    tessera-verify-schedule   rejects a declaration (`func.func` with
                              `tsched.library`) naming an unknown routine, or
                              with a missing, unknown or ill-typed attribute,
                              a wrong number of buffers, or buffers the
                              result rule refuses
    the bundle (both ends)    the compiler writes `library`/`attrs` from the
                              declaration; the runtime's reader refuses a
                              launch of an undeclared routine or bad attributes
    the cost model            prices a launch by the routine's `cost` class
    the engines               implement the declared names (`library.py`'s
                              ROUTINES, registered through `implementations`)

`test/python/test_library_contract.py` checks that every side agrees.

It lives in the runtime because the runtime is the package every other one
imports (a bundle runs where only the runtime is installed; the compiler
may read it, the runtime may not read the compiler); like `env`, it imports
nothing but the standard library. Buffers here are (shape, dtype) pairs,
dtype a numpy name ("float32"); attribute values are JSON values, as the
bundle holds them.

Adding a routine: its declaration here and its implementation in
`engines/library.py` (and a Graph IR op, if a new one lowers to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

#: Attribute types: the JSON value a bundle holds for each, and (in the
#: compiler, `tessera_compiler/ir/routines.py`) the MLIR attribute.
ATTRIBUTE_TYPES = {
    "i64": "an integer (IntegerAttr i64)",
    "i64[]": "a list of integers (DenseI64ArrayAttr)",
    "f64": "a number (FloatAttr f64)",
    "str": "a string (StringAttr)",
    "str[]": "a list of strings (ArrayAttr of StringAttr)",
    "unit": "true (UnitAttr: present or absent)",
    "symbol": "a kernel's name (FlatSymbolRefAttr)",
}

#: How the cost model prices a launch of the routine (tessera_compiler/cost.py).
COST_CLASSES = {
    "gemm": "gemm_call_s + 2 m n k / the GEMM rate (with its epilogue kernel's time)",
    "grouped_gemm": "gemm_call_s per group + 2 rows k n / the GEMM rate (rows: the first "
                    "operand's [rows, k]; n: the result's last dimension)",
    "view": "free: the runtime makes the result a view of its input",
    "read": "launch_s + its input's bytes / the memory rate (a check: writes nothing)",
    "copy": "launch_s + 2 x its output's bytes / the copy rate",
    "transpose": "launch_s + 2 x its output's bytes / the transpose rate",
}


class ContractError(ValueError):
    """A launch or declaration that does not match its routine's declaration."""


@dataclass(frozen=True)
class Attribute:
    type: str                   # a key of ATTRIBUTE_TYPES
    required: bool = False
    doc: str = ""


Buffer = tuple  # (shape tuple, numpy dtype name)


@dataclass(frozen=True)
class Routine:
    name: str
    summary: str
    #: Buffer names in launch order: operands then results. "x?" is an
    #: optional operand, "xs*" any number of them (at most one of either).
    operands: tuple
    results: tuple
    #: result(ins, outs, attrs) -> None, or what is wrong: the result rule,
    #: the results' shapes and dtypes from the operands (`ins`: name ->
    #: Buffer, a list of them for "xs*", None for an absent "x?") and
    #: attributes. A result dimension the operands do not fix (a reshape's
    #: shape, a table's row count) is read from `outs`.
    result: Callable
    cost: str                   # a key of COST_CLASSES
    attributes: dict = field(default_factory=dict)
    #: The Graph IR op tessera-lower-to-tile turns into this routine (None:
    #: another pass makes it), and whether only for the CPU target (other
    #: targets generate a kernel).
    graph_op: str | None = None
    cpu_only: bool = False
    #: How errors name the routine ("gather (embedding lookup)").
    title: str = ""

    def __post_init__(self):
        assert sum(o[-1] in "?*" for o in self.operands) <= 1, self.name
        for a in self.attributes.values():
            assert a.type in ATTRIBUTE_TYPES, (self.name, a)
        assert self.cost in COST_CLASSES, (self.name, self.cost)

    @property
    def what(self) -> str:
        return f"{self.name} ({self.title})" if self.title else self.name

    def split(self, buffers: list) -> tuple[dict, list]:
        """(operands by name, results) of a launch's buffers, or ContractError
        when their number does not fit the declaration."""
        loose = "".join(o[-1] for o in self.operands if o[-1] in "?*")     # "", "?" or "*"
        low = len(self.operands) - len(loose) + len(self.results)
        extra = len(buffers) - low
        if extra < 0 or extra > {"": 0, "?": 1}.get(loose, extra):
            want = {"": f"{low}", "?": f"{low} or {low + 1}", "*": f"{low} or more"}[loose]
            raise ContractError(f"routine '{self.name}' takes {want} buffers "
                                f"({', '.join(self.operands + self.results)}), got {len(buffers)}")
        ins, i = {}, 0
        for o in self.operands:
            if o[-1] == "*":
                ins[o[:-1]] = list(buffers[i:i + extra])
                i += extra
            elif o[-1] == "?":
                ins[o[:-1]] = buffers[i] if extra else None
                i += extra
            else:
                ins[o] = buffers[i]
                i += 1
        return ins, list(buffers[i:])

    def check_attributes(self, attrs: dict) -> None:
        """ContractError unless `attrs` (JSON values) are the declared ones,
        every required one present, each of its type."""
        for name in attrs:
            if name not in self.attributes:
                raise ContractError(f"routine '{self.name}' has no attribute '{name}' "
                                    f"(it has: {', '.join(sorted(self.attributes)) or 'none'})")
        for name, a in self.attributes.items():
            if name not in attrs:
                if a.required:
                    raise ContractError(f"routine '{self.name}' needs attribute '{name}' "
                                        f"({ATTRIBUTE_TYPES[a.type]})")
                continue
            if not _is_json(attrs[name], a.type):
                raise ContractError(f"attribute '{name}' of routine '{self.name}' must be "
                                    f"{ATTRIBUTE_TYPES[a.type]}, got {attrs[name]!r}")

    def check(self, buffers: list, attrs: dict) -> None:
        """ContractError unless a launch on `buffers` ((shape, dtype) each)
        with `attrs` (JSON values) fits the declaration and its result rule."""
        self.check_attributes(attrs)
        ins, outs = self.split(buffers)
        problem = self.result(ins, outs, attrs)
        if problem:
            raise ContractError(f"routine '{self.name}': {problem}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_json(v, kind: str) -> bool:
    if kind == "i64":
        return _is_int(v)
    if kind == "i64[]":
        return isinstance(v, (list, tuple)) and all(_is_int(x) for x in v)
    if kind == "f64":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind in ("str", "symbol"):
        return isinstance(v, str)
    if kind == "str[]":
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
    return v is True                                        # unit


# -- result rules ----------------------------------------------------------------------
# Each returns None when the results fit, else what is wrong (in words).

def _show(b) -> str:
    return f"{list(b[0])}x{b[1]}"


def _expect(outs, want: list) -> str | None:
    got = [(tuple(s), d) for s, d in outs]
    want = [(tuple(s), d) for s, d in want]
    if got != want:
        return (f"the result rule gives {', '.join(map(_show, want)) or 'no result'}, the "
                f"declaration has {', '.join(map(_show, got)) or 'none'}")
    return None


def _matmul(ins, outs, attrs):
    (a, da), (b, db) = ins["lhs"], ins["rhs"]
    if len(a) < 2 or len(b) < 2:
        return f"matmul operands need rank >= 2, got {_show(ins['lhs'])} and {_show(ins['rhs'])}"
    m, k = (a[-1], a[-2]) if attrs.get("transpose_lhs") else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if attrs.get("transpose_rhs") else (b[-2], b[-1])
    if k != k2:
        return f"contracted sizes differ: {k} and {k2}"
    if da != db:
        return f"operand dtypes differ: {da} and {db}"
    batch = _broadcast(tuple(a[:-2]), tuple(b[:-2]))
    if batch is None:
        return f"batch dimensions {list(a[:-2])} and {list(b[:-2])} do not broadcast"
    return _expect(outs, [(batch + (m, n), da)])


def _broadcast(x: tuple, y: tuple):
    n = max(len(x), len(y))
    x, y = (1,) * (n - len(x)) + x, (1,) * (n - len(y)) + y
    if any(p != q and 1 not in (p, q) for p, q in zip(x, y)):
        return None
    return tuple(max(p, q) for p, q in zip(x, y))


def _reshape(ins, outs, attrs):
    (s, d) = ins["input"]
    if len(outs) != 1 or math.prod(outs[0][0]) != math.prod(s):
        return (f"a reshape of {_show(ins['input'])} keeps its {math.prod(s)} elements, the "
                f"declaration has {', '.join(map(_show, outs)) or 'no result'}")
    return _expect(outs, [(outs[0][0], d)])


def _transpose(ins, outs, attrs):
    (s, d), perm = ins["input"], list(attrs["perm"])
    if sorted(perm) != list(range(len(s))):
        return f"perm {perm} is not a permutation of {len(s)} dimensions"
    return _expect(outs, [(tuple(s[p] for p in perm), d)])


def _boxed(inner, outer, offsets, what):
    if not (len(inner) == len(outer) == len(offsets)) or \
            any(o < 0 or o + i > n for i, n, o in zip(inner, outer, offsets)):
        return (f"{what}: a box of {list(inner)} at offsets {list(offsets)} does not fit "
                f"in {list(outer)}")
    return None


def _slice(ins, outs, attrs):
    (s, d) = ins["input"]
    if len(outs) != 1:
        return _expect(outs, [((), d)])
    return _boxed(outs[0][0], s, attrs["offsets"], "slice") or \
        _expect(outs, [(outs[0][0], d)])


def _pad(ins, outs, attrs):
    (s, d) = ins["input"]
    if len(outs) != 1:
        return _expect(outs, [((), d)])
    return _boxed(s, outs[0][0], attrs["offsets"], "pad") or \
        _expect(outs, [(outs[0][0], d)])


def _concat(ins, outs, attrs):
    parts, dim = ins["inputs"], attrs["dim"]
    if not parts:
        return "concat needs at least one input"
    s, d = parts[0]
    if not 0 <= dim < len(s):
        return f"dim {dim} is out of range for rank {len(s)}"
    for p, pd in parts[1:]:
        if len(p) != len(s) or any(x != y for i, (x, y) in enumerate(zip(p, s)) if i != dim) \
                or pd != d:
            return f"inputs {_show(parts[0])} and {_show((p, pd))} do not concatenate along {dim}"
    return _expect(outs, [(tuple(s[:dim]) + (sum(p[dim] for p, _ in parts),) +
                           tuple(s[dim + 1:]), d)])


def _integer(b) -> bool:
    return b[1].startswith(("int", "uint"))


def _gather(ins, outs, attrs):
    (t, d), ids = ins["table"], ins["indices"]
    if not _integer(ids):
        return f"indices must be integers, got {_show(ids)}"
    return _expect(outs, [(tuple(ids[0]) + tuple(t[1:]), d)])


def _scatter_add(ins, outs, attrs):
    (u, d), ids = ins["updates"], ins["indices"]
    if not _integer(ids):
        return f"indices must be integers, got {_show(ids)}"
    rows = outs[0][0][0] if len(outs) == 1 and outs[0][0] else 0
    return _expect(outs, [((rows,) + tuple(u[len(ids[0]):]), d)])


def _dynamic_block(x, start, block, dim):
    """Why `block` (a slice or an update) does not fit `x` along `dim` at a
    run-time `start`, or None."""
    (s, d), (b, bd) = x, block
    if start[0] != () or start[1] != "int32":
        return f"start must be an int32 scalar, got {_show(start)}"
    if not 0 <= dim < len(s):
        return f"dim {dim} is out of range for rank {len(s)}"
    if len(b) != len(s) or bd != d or b[dim] > s[dim] or \
            any(x != y for i, (x, y) in enumerate(zip(b, s)) if i != dim):
        return f"{_show(block)} is not a block of {_show(x)} along dim {dim}"
    return None


def _dynamic_slice(ins, outs, attrs):
    if len(outs) != 1:
        return f"one result, got {len(outs)}"
    return _dynamic_block(ins["input"], ins["start"], outs[0], attrs["dim"]) or \
        _expect(outs, [outs[0]])


def _dynamic_update_slice(ins, outs, attrs):
    return _dynamic_block(ins["input"], ins["start"], ins["update"], attrs["dim"]) or \
        _expect(outs, [ins["input"]])


def _dropout(ins, outs, attrs):
    key = ins["key"]
    if key != ((2,), "int64"):
        return f"key must be an int64 [seed, step] pair, got {_show(key)}"
    if not 0 < attrs["p"] < 1:
        return f"p={attrs['p']} must lie in (0, 1)"
    return _dim_axes_error(attrs, ins["input"][0]) or _expect(outs, [ins["input"]])


def _dim_axes_error(attrs, shape) -> str | None:
    """What is wrong with `dim_axes` for an input of `shape`, or None."""
    dims = attrs.get("dim_axes")
    if dims is not None and len(dims) != len(shape):
        return f"dim_axes {dims} must name the axes of each of {len(shape)} dimensions"
    return None


def _axis_slice(ins, outs, attrs):
    (s, d), dim = ins["input"], attrs["dim"]
    if not 0 <= dim < len(s):
        return f"dim {dim} is out of range for rank {len(s)}"
    part = outs[0][0][dim] if len(outs) == 1 and len(outs[0][0]) == len(s) else 0
    if not part or s[dim] % part:
        return f"the result must be a block of {_show(ins['input'])} along dim {dim}, " \
            f"got {', '.join(map(_show, outs))}"
    return _expect(outs, [(tuple(s[:dim]) + (part,) + tuple(s[dim + 1:]), d)])


def _topk(ins, outs, attrs):
    (s, _), k = ins["input"], attrs["k"]
    if not s or not 0 < k <= s[-1]:
        return f"k = {k} does not fit {_show(ins['input'])}"
    return _expect(outs, [(tuple(s[:-1]) + (k,), "int32")])


def _moe_routing(ins, attrs):
    (e, _) = ins["experts"]
    if len(e) != 2 or not _integer(ins["experts"]):
        return f"experts must be integers [tokens, k], got {_show(ins['experts'])}"
    if attrs["num_experts"] <= 0 or attrs["num_experts"] % attrs.get("blocks", 1):
        return (f"num_experts = {attrs['num_experts']} must be a positive multiple of blocks = "
                f"{attrs.get('blocks', 1)}")
    return None


def _moe_dispatch(ins, outs, attrs):
    (x, d) = ins["input"]
    bad = _moe_routing(ins, attrs)
    if bad:
        return bad
    rows = outs[0][0][0] if len(outs) == 2 and outs[0][0] else 0
    return _expect(outs, [((rows, x[-1]), d), ((attrs["num_experts"],), "int32")])


def _moe_collect(ins, outs, attrs):
    (r, d), (e, _) = ins["rows"], ins["experts"]
    bad = _moe_routing(ins, attrs)
    return bad or _expect(outs, [((e[0], e[1]) + tuple(r[1:]), d)])


def _grouped_matmul(ins, outs, attrs):
    (x, d), (w, _) = ins["lhs"], ins["rhs"]
    if len(x) != 2 or len(w) != 3:
        return f"grouped_matmul takes [rows, k] and [groups, k, n], got " \
            f"{_show(ins['lhs'])} and {_show(ins['rhs'])}"
    k, n = (w[2], w[1]) if attrs.get("transpose_rhs") else (w[1], w[2])
    if k != x[1]:
        return f"contracted sizes differ: {x[1]} and {k}"
    return _expect(outs, [((x[0], n), d)])


def _grouped_outer(ins, outs, attrs):
    (x, d), (g, _) = ins["lhs"], ins["rhs"]
    if len(x) != 2 or len(g) != 2 or x[0] != g[0]:
        return f"grouped_outer takes [rows, k] and [rows, n], got " \
            f"{_show(ins['lhs'])} and {_show(ins['rhs'])}"
    groups = outs[0][0][0] if len(outs) == 1 and outs[0][0] else 0
    return _expect(outs, [((groups, x[1], g[1]), d)])


def _check_range(ins, outs, attrs):
    if not _integer(ins["input"]):
        return f"check_range checks integers, got {_show(ins['input'])}"
    if attrs["low"] >= attrs["high"]:
        return f"the range [{attrs['low']}, {attrs['high']}) is empty"
    return _dim_axes_error(attrs, ins["input"][0]) or _expect(outs, [])


_MOE_ATTRS = {
    "num_experts": Attribute("i64", True, "experts in all"),
    "capacity": Attribute("i64", True, "rows kept per expert (0: all)"),
    "blocks": Attribute("i64", False, "blocks of experts, each padded to rows / blocks"),
}
#: `row_axes` names the mesh axes splitting a table's (or checked tensor's)
#: rows: the executor gives the routine this rank's `block` over them.
_ROW_AXES = Attribute("str[]", False, "mesh axes splitting the rows (the executor makes "
                                      "them `block`)")
#: `dim_axes` names, per dimension, the mesh axes splitting it: the
#: executor gives the routine this rank's `blocks` (one per dimension).
_DIM_AXES = Attribute("str[]", False, "per dimension, the mesh axes splitting it, "
                      "comma-separated (the executor makes them `blocks`)")

_ROUTINES = [
    Routine("matmul", "a @ b over the last two dimensions (BLAS), batch dimensions broadcast",
            ("lhs", "rhs", "epilogue_buffers*"), ("result",), _matmul, "gemm",
            {"transpose_lhs": Attribute("unit", doc="read lhs transposed (tessera-fold-transposes)"),
             "transpose_rhs": Attribute("unit", doc="read rhs transposed"),
             "epilogue": Attribute("symbol", doc="the kernel run on each block of rows written "
                                                 "(tessera-fuse-gemm-epilogues)"),
             "epilogue_args": Attribute("i64[]", doc="the buffer each epilogue argument is"),
             "epilogue_rows": Attribute("i64", doc="rows one epilogue program covers")},
            graph_op="tgraph.matmul", cpu_only=True),
    Routine("reshape", "the input's elements in a new shape", ("input",), ("result",),
            _reshape, "view", graph_op="tgraph.reshape"),
    Routine("transpose", "the input's dimensions permuted", ("input",), ("result",), _transpose,
            "transpose", {"perm": Attribute("i64[]", True, "result dim i is input dim perm[i]")},
            graph_op="tgraph.transpose"),
    Routine("slice", "the box of the result's shape at `offsets` of the input", ("input",),
            ("result",), _slice, "copy",
            {"offsets": Attribute("i64[]", True, "where the box starts")},
            graph_op="tgraph.slice"),
    Routine("pad", "the input at `offsets` of a zero result", ("input",), ("result",), _pad,
            "copy", {"offsets": Attribute("i64[]", True, "where the input goes")},
            graph_op="tgraph.pad"),
    Routine("concat", "the inputs joined along `dim`", ("inputs*",), ("result",), _concat, "copy",
            {"dim": Attribute("i64", True)}, graph_op="tgraph.concat"),
    Routine("gather", "rows of a table by index", ("table", "indices"), ("result",), _gather,
            "copy", {"row_axes": _ROW_AXES}, graph_op="tgraph.gather",
            title="embedding lookup"),
    Routine("scatter_add", "rows added into a zero table by index", ("updates", "indices"),
            ("result",), _scatter_add, "copy", {"row_axes": _ROW_AXES},
            graph_op="tgraph.scatter_add", title="embedding gradient"),
    Routine("dynamic_slice", "a block along `dim` from a start read at run time",
            ("input", "start"), ("result",), _dynamic_slice, "copy",
            {"dim": Attribute("i64", True)}, graph_op="tgraph.dynamic_slice"),
    Routine("dynamic_update_slice", "the input with a block along `dim` replaced at a start "
            "read at run time", ("input", "start", "update"), ("result",),
            _dynamic_update_slice, "copy", {"dim": Attribute("i64", True)},
            graph_op="tgraph.dynamic_update_slice"),
    Routine("dropout", "the input with elements dropped at rate p (scaled by 1/(1-p)), "
            "each by the counter-based random word of its global index (runtime/random.py)",
            ("input", "key"), ("result",), _dropout, "copy",
            {"p": Attribute("f64", True, "the rate, in (0, 1)"),
             "dim_axes": _DIM_AXES},
            graph_op="tgraph.dropout"),
    Routine("axis_slice", "this rank's block along `dim` of a value replicated over `axis`",
            ("input",), ("result",), _axis_slice, "copy",
            {"axis": Attribute("str", True, "the mesh axis (the executor makes it `block`)"),
             "dim": Attribute("i64", True)}, graph_op="tgraph.axis_slice"),
    Routine("topk", "indices of the k largest along the last dimension", ("input",),
            ("indices",), _topk, "copy", {"k": Attribute("i64", True)}, graph_op="tgraph.topk"),
    Routine("moe_dispatch", "token rows packed by expert, and each expert's row count",
            ("input", "experts", "base?"), ("rows", "sizes"), _moe_dispatch, "copy",
            _MOE_ATTRS, graph_op="tgraph.moe_dispatch"),
    Routine("moe_collect", "expert rows back in (token, choice) order", ("rows", "experts",
                                                                           "base?"),
            ("result",), _moe_collect, "copy", _MOE_ATTRS, graph_op="tgraph.moe_collect"),
    Routine("grouped_matmul", "each segment of rows times its group's matrix",
            ("lhs", "rhs", "sizes"), ("result",), _grouped_matmul, "grouped_gemm",
            {"transpose_rhs": Attribute("unit")}, graph_op="tgraph.grouped_matmul"),
    Routine("grouped_outer", "each segment's x^T g summed into its group's matrix",
            ("lhs", "rhs", "sizes"), ("result",), _grouped_outer, "grouped_gemm",
            graph_op="tgraph.grouped_outer"),
    Routine("check_range", "a value check: every element in [low, high) or in `allowed`; "
            "writes nothing, returns a flag", ("input",), (), _check_range, "read",
            {"low": Attribute("i64", True), "high": Attribute("i64", True),
             "allowed": Attribute("i64[]", False, "values allowed outside the range"),
             "message": Attribute("str", True, "the error, {row} {value} {where} filled in"),
             "row_axes": _ROW_AXES, "dim_axes": _DIM_AXES},
            graph_op="tgraph.check_range"),
]

#: Every library routine, by name.
ROUTINES: dict[str, Routine] = {r.name: r for r in _ROUTINES}
#: The routines that check values: they write no buffer and return a flag.
CHECKS = tuple(r.name for r in _ROUTINES if not r.results)


def routine(name: str) -> Routine:
    """The declaration of routine `name`; ContractError for an unknown one."""
    try:
        return ROUTINES[name]
    except KeyError:
        raise ContractError(f"unknown library routine '{name}' (known: "
                            f"{', '.join(sorted(ROUTINES))})") from None


def implementations(table: dict) -> dict:
    """`table` (routine name -> implementation), checked to name only
    declared routines: an engine registers against the declared names."""
    for name in table:
        routine(name)
    return dict(table)
