"""The misuse audit (issue 60 item 8): every public entry point of `tessera`,
`tessera.dist`, `tessera.op`, `tessera.nn`, `tessera.checkpoint` and
`tessera.pipeline` misused the ways users misuse it (a wrong type, a wrong
rank, a wrong axis name, a wrong dtype, a value out of range), each call
checked to end in a deliberate `ts.TesseraError` whose message names the
argument and the user's line, raised from no internal error, and returning
nothing. (`ts.optim`'s optimizers are audited too, though the coverage test
does not enumerate that module.)

`test_every_misuse_is_a_tessera_error_naming_the_argument_and_the_line`
runs the table `CASES`; `test_every_public_entry_point_is_audited`
enumerates every public name of the six modules (their `__all__`) and fails
for any callable without a case and without a reason in `EXEMPT`. So adding
an API makes this file fail until its misuses are added: append `Case`s for
it (one per kind that applies, called as a user calls it: eagerly, and
inside a `ts.jit` function for ops), make the library raise the right error
at its boundary, and run this file. docs/testing.md ("The misuse audit")
lists what it covers.

Everything runs in one process: meshes of more devices than the process has
are built and traced for (`dist.Mesh(axes=["tp"], devices=range(2))`, and
DTensors made by `from_numpy` on them hold the global value), and eager
collectives on numpy arrays use a 1-device mesh. Errors come from the checks
at the call and from tracing, so nothing here compiles a program.
"""

from __future__ import annotations

import os
import re
import types
from dataclasses import dataclass
from typing import Callable

from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import _dtensor, checkpoint, dist, nn, op, pipeline

KINDS = ("wrong type", "wrong rank", "wrong axis", "wrong dtype", "out of range", "other")
HERE = os.path.basename(__file__)


@dataclass
class Case:
    entry: str          # "op.matmul": the public name misused (aliases share cases)
    kind: str           # one of KINDS
    call: Callable      # the misuse, as a user writes it (eager, or inside ts.jit)
    names: str          # a substring of the message that names the argument

    def __str__(self) -> str:
        return f"{self.entry}-{self.kind}-{self.call.__code__.co_firstlineno}"


# -- values the cases misuse ------------------------------------------------------

F = np.ones((4, 6), np.float32)                 # a matrix
F3 = np.ones((2, 4, 6), np.float32)             # a batch of them
V6 = np.ones(6, np.float32)                     # a vector
V5 = np.ones(5, np.float32)
W = np.ones((6, 3), np.float32)                 # a weight
I4 = np.arange(4, dtype=np.int32)               # integer ids / targets
IM = np.ones((4, 6), np.int32)                  # an integer matrix
B = np.ones((4, 6), np.bool_)                   # a condition
Q = np.ones((2, 4, 8), np.float32)              # attention operands [B, S, D]
EXPERTS = {"router": np.ones((6, 4), np.float32), "w1": np.ones((4, 6, 8), np.float32),
           "w2": np.ones((4, 8, 6), np.float32)}
BAD_AXIS = dist.ShardSpec(("col",), ("zz",))     # an axis no mesh here has
COL = dist.ShardSpec(("col",), ("tp",))


def _meshes():
    made = list(_dtensor._CREATED)       # (a mesh made here must not become other tests' default)
    try:
        return (dist.Mesh(axes=["dp"], devices=range(1)), dist.Mesh(axes=["tp"], devices=range(2)),
                dist.Mesh(axes=["pp"], devices=range(2)))
    finally:
        _dtensor._CREATED[:] = made


MESH1, MESH2, MESH_PP = _meshes()
X2 = dist.from_numpy(F, COL, MESH2, name="X2")  # a DTensor holding its global value
CKPT = {}                                       # "dir": a checkpoint saved by the fixture


def annotated(x: ts.Tensor["B", 6, ts.f32]):    # for ts.function's annotation checks
    return x


def stage_fn(w, x):
    return op.tanh(op.matmul(x, w))


def pipelined_step(w, x):
    return op.mean(pipeline.Stage(stage_fn)(w, x))


def spmd2(body, **specs):
    """Traces (and only traces: `.lower`) a per-rank function of `body` over
    the 2-device mesh, called from a global function compiled for it: called
    in one process, a program for 2 ranks would be a LaunchError first."""
    return ts.jit(dist.spmd(body, mesh=MESH2, **specs), mesh=MESH2).lower


# -- the table -------------------------------------------------------------------

def _TINY_LLAMA():
    """The suite's tiny Llama checkpoint (test/fixtures/hf/llama)."""
    return ts.models.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "hf" /
                                     "llama")


CASES: list[Case] = []


def cases(*new: Case) -> None:
    CASES.extend(new)


# Elementwise binary ops: operands of any rank that broadcast, floats only.
for _name in ("add", "sub", "mul", "div", "maximum", "minimum"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, "a"), "b is a str"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: ts.jit(lambda x: f(None, x))(F),
             "a is a NoneType"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f([F], F), "a is a list"),
        Case(f"op.{_name}", "wrong rank", lambda f=_f: f(F, np.ones((5, 6), np.float32)),
             "[4, 6] and [5, 6]"),
        Case(f"op.{_name}", "wrong dtype", lambda f=_f: f(IM, IM), "int32"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f("a", "b"), "a='a'"),
    )

# Elementwise unary ops (and composites of them).
for _name in ("neg", "exp", "log", "tanh", "sqrt", "rsqrt", "relu", "gelu", "silu", "sigmoid",
              "square", "isfinite", "sin", "cos", "erf", "abs", "sign", "floor", "ceil"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "wrong type", lambda f=_f: ts.jit(lambda x: f("abc"))(F),
             "x is a str"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(["a"]), "x=['a']"),
        Case(f"op.{_name}", "wrong dtype", lambda f=_f: f(I4), "int32"),
        Case(f"op.{_name}", "wrong dtype", lambda f=_f: ts.jit(lambda x: f(x))(B), "bool"),
    )

# Comparisons: any dtype, operands that broadcast.
for _name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, "a"), "b is a str"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: ts.jit(lambda x: f(x, None))(F),
             "b is a NoneType"),
        Case(f"op.{_name}", "wrong rank", lambda f=_f: f(F, V5), "[4, 6] and [5]"),
    )

# Reductions: dim= / axis= in range, integers.
for _name in ("sum", "mean", "max", "min"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "out of range", lambda f=_f: f(F, dim=5), "dim 5"),
        Case(f"op.{_name}", "out of range", lambda f=_f: ts.jit(lambda x: f(x, axis=-3))(F),
             "dim -3"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, dim="a"), "dim 'a'"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, dim=1.0), "dim 1.0"),
        Case(f"op.{_name}", "other", lambda f=_f: f(F, dim=0, axis=1), "dim= or axis="),
        Case(f"op.{_name}", "wrong type", lambda f=_f: ts.jit(lambda x: f("x"))(F),
             "x is a str"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, 0, keepdim="no"), "keepdim='no'"),
    )

cases(
    Case("op.max", "out of range", lambda: op.max(np.ones((0, 3), np.float32), dim=0),
         "zero-size dimension of [0, 3]"),
    Case("op.sum", "wrong dtype", lambda: op.sum(np.ones(3, np.complex64)), "complex64"),

    Case("op.pow", "wrong type", lambda: ts.jit(lambda x: op.pow(x, "2"))(F), "p is a str"),
    Case("op.pow", "wrong type", lambda: ts.jit(lambda x: op.pow("a", 2))(F), "x is a str"),
    Case("op.pow", "wrong dtype", lambda: op.pow(I4, 2), "int32"),
    Case("op.pow", "wrong rank", lambda: op.pow(F, V5), "[4, 6] and [5]"),
    Case("op.gelu", "other", lambda: op.gelu(F, approximate="exact"), "approximate='exact'"),

    Case("op.where", "wrong dtype", lambda: op.where(F, F, F), "condition must be boolean"),
    Case("op.where", "wrong type", lambda: op.where(B, F, "a"), "b is a str"),
    Case("op.where", "wrong type", lambda: ts.jit(lambda x: op.where(None, x, x))(F),
         "cond is a NoneType"),
    Case("op.where", "wrong rank", lambda: op.where(np.ones((5, 6), np.bool_), F, F),
         "[5, 6] and [4, 6]"),

    Case("op.cast", "wrong dtype", lambda: op.cast(F, "float33"), "dtype: unknown dtype 'float33'"),
    Case("op.cast", "wrong dtype", lambda: op.cast(F, np.complex64), "dtype complex64"),
    Case("op.cast", "wrong dtype", lambda: ts.jit(lambda x: op.cast(x, None))(F),
         "dtype: None is not a dtype"),
    Case("op.cast", "wrong type", lambda: ts.jit(lambda x: op.cast("a", ts.f32))(F),
         "x is a str"),

    Case("op.reshape", "out of range", lambda: op.reshape(F, 5, 5), "to [5, 5]"),
    Case("op.reshape", "out of range", lambda: ts.jit(lambda x: x.reshape(-1, 5))(F),
         "to [-1, 5]"),
    Case("op.reshape", "out of range", lambda: op.reshape(F, -2, -12), "shape entry -2"),
    Case("op.reshape", "wrong type", lambda: op.reshape(F, "a"), "shape entry 'a'"),
    Case("op.reshape", "wrong type", lambda: op.reshape(F, 4.0, 6), "shape entry 4.0"),
    Case("op.reshape", "wrong type", lambda: ts.jit(lambda x: op.reshape(None, 6))(F),
         "x is a NoneType"),

    Case("op.transpose", "out of range", lambda: op.transpose(F, 0, 5), "dimension 5"),
    Case("op.transpose", "wrong rank", lambda: op.transpose(V6, 0, 1), "dimension 1"),
    Case("op.transpose", "out of range", lambda: op.transpose(F, (0, 0)), "[(0, 0)]"),
    Case("op.transpose", "wrong type", lambda: op.transpose(F, "a", 0), "dimension 'a'"),
    Case("op.transpose", "out of range", lambda: ts.jit(lambda x: x.transpose(1, 2, 0))(F),
         "[1, 2, 0]"),
    Case("op.transpose", "wrong type", lambda: ts.jit(lambda x: op.transpose([x]))(F),
         "x is a list"),

    Case("op.split", "out of range", lambda: op.split(F, 4), "does not split into 4"),
    Case("op.split", "wrong rank", lambda: op.split(np.float32(1.0), 2), "dim -1"),
    Case("op.split", "out of range", lambda: op.split(F, [2, 3]), "into [2, 3]"),
    Case("op.split", "out of range", lambda: op.split(F, 2, dim=5), "dim 5"),
    Case("op.split", "out of range", lambda: op.split(F, 0), "sections 0"),
    Case("op.split", "out of range", lambda: op.split(F, [-1, 7]), "sections [-1, 7]"),
    Case("op.split", "wrong type", lambda: op.split(F, "a"), "sections 'a'"),
    Case("op.split", "wrong type", lambda: ts.jit(lambda x: op.split(x, 2.0))(F),
         "sections 2.0"),

    Case("op.index", "out of range", lambda: op.index(F, (0, 9)), "index 9"),
    Case("op.index", "out of range", lambda: ts.jit(lambda x: x[-5])(F), "index -5"),
    Case("op.index", "wrong rank", lambda: op.index(F, (0, 0, 0)), "3 indices for shape [4, 6]"),
    Case("op.index", "wrong type", lambda: op.index(F, "a"), "dimension 0 of [4, 6] with a str"),
    Case("op.index", "wrong type", lambda: ts.jit(lambda x: x[1.5])(F), "dimension 0 of [4, 6] with a float"),
    Case("op.index", "other", lambda: ts.jit(lambda x: x[::-1])(F), "negative steps"),
    Case("op.index", "other", lambda: ts.jit(lambda x: x[..., ...])(F), "one ellipsis"),
    Case("op.index", "wrong type", lambda: ts.jit(lambda x: x[:, [0, 1]])(F),
         "dimension 1 of [4, 6] with a list"),
    Case("op.arange", "wrong type", lambda: op.arange("5"), "stop='5'"),
    Case("models.from_pretrained", "wrong type", lambda: ts.models.from_pretrained(None),
         "path=None"),
    Case("models.from_pretrained", "other", lambda: ts.models.from_pretrained("/nonexistent"),
         "/nonexistent has no config.json"),
    Case("models.from_pretrained", "wrong type",
         lambda: ts.models.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" /
                                           "hf" / "llama", mesh="tp"), "mesh='tp'"),
    Case("models.from_pretrained", "out of range",
         lambda: _TINY_LLAMA().generate(np.zeros((1, 2), np.int32), temperature=-1.0),
         "temperature=-1.0"),
    Case("models.from_pretrained", "other",
         lambda: _TINY_LLAMA().generate(np.zeros((1, 2), np.int32), top_p=0.9),
         "top_p=0.9 samples: pass temperature="),
    Case("models.from_pretrained", "wrong type",
         lambda: ts.jit(lambda p, i: _TINY_LLAMA().forward(p, i, dropout_key=1.5))(
             _TINY_LLAMA().params, np.zeros((1, 2), np.int32)), "dropout_key=1.5 must be"),
    Case("models.from_pretrained", "wrong type", lambda: _TINY_LLAMA().to_checkpoint([1.0]),
         "tree is a list"),
    Case("models.from_pretrained", "other",
         lambda: _TINY_LLAMA().to_checkpoint({"model.norm.weight": np.ones(32, np.float32)}),
         "the tree has no model.embed_tokens.weight"),
    Case("models.from_pretrained", "wrong type", lambda: _TINY_LLAMA().layout(("tp", 2)),
         "mesh=('tp', 2) must be a dist.Mesh"),
    Case("models.from_pretrained", "other",
         lambda: ts.models.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" /
                                           "hf" / "llama",
                                           mesh=dist.Mesh(axes=["pp"], devices=range(3))),
         "num_hidden_layers=2 layers do not split evenly over the 3 ranks"),
    Case("models.from_pretrained", "other",
         lambda: ts.models.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" /
                                           "hf" / "llama", mesh=MESH_PP),
         "needs the pp mesh, 2 to run as 2 processes"),
    Case("op.argmax", "out of range", lambda: op.argmax(F, 2), "dim=2"),
    Case("op.cumsum", "out of range", lambda: op.cumsum(F, 2), "dim=2"),
    Case("op.cumsum", "wrong dtype", lambda: op.cumsum(I4), "int32"),
    Case("op.cumsum", "wrong type", lambda: ts.jit(lambda x: op.cumsum(x, "0"))(F), "dim='0'"),
    Case("op.dynamic_slice", "out of range", lambda: op.dynamic_slice(F, 5, 2, dim=1),
         "start=5 leaves no room for 2"),
    Case("op.dynamic_slice", "out of range", lambda: op.dynamic_slice(F, 0, 7, dim=1),
         "size=7"),
    Case("op.dynamic_slice", "wrong dtype", lambda: op.dynamic_slice(F, np.float32(1), 2),
         "start must be an integer scalar"),
    Case("op.dynamic_slice", "wrong rank", lambda: op.dynamic_slice(F, np.zeros(2, np.int32), 2),
         "start must be an integer scalar"),
    Case("op.dynamic_slice", "out of range", lambda: op.dynamic_slice(F, 0, 2, dim=4), "dim=4"),
    Case("op.dynamic_update_slice", "wrong rank",
         lambda: op.dynamic_update_slice(F, np.ones((4, 2, 1), np.float32), 0, dim=1),
         "update [4, 2, 1] must have x's shape"),
    Case("op.dynamic_update_slice", "wrong dtype",
         lambda: op.dynamic_update_slice(F, np.ones((4, 1), np.float64), 0, dim=1),
         "one dtype"),
    Case("op.dynamic_update_slice", "out of range",
         lambda: ts.jit(lambda x, t: op.dynamic_update_slice(x, x[:, :2], t, dim=1))(
             F, np.int64(5)), "start 5 leaves no room"),
    Case("op.dynamic_update_slice", "wrong type",
         lambda: op.dynamic_update_slice(F, "u", 0), "update is a str"),
    Case("op.dropout", "out of range", lambda: op.dropout(F, 1.5, 0), "p=1.5"),
    Case("op.dropout", "wrong type", lambda: op.dropout(F, "0.1", 0), "p='0.1'"),
    Case("op.dropout", "wrong dtype", lambda: op.dropout(I4, 0.1, 0),
         "needs floating-point operands"),
    Case("op.dropout", "out of range", lambda: op.dropout(F, 0.1, -1),
         "must hold integers in [0, 2**63)"),
    Case("op.dropout", "wrong rank", lambda: op.dropout(F, 0.1, (1, 2, 3)), "has 3 parts"),
    Case("op.dropout", "wrong dtype", lambda: op.dropout(F, 0.1, np.ones(2, np.float32)),
         "not an integer [2] tensor"),
    Case("op.dropout", "wrong type",
         lambda: ts.jit(lambda x, s: op.dropout(x, 0.1, (0, s)))(F, np.float32(1)),
         "not an integer scalar"),
    Case("op.attention", "out of range",
         lambda: op.attention(Q, Q, Q, dropout_p=1.0, dropout_key=0), "dropout_p=1.0"),
    Case("op.attention", "other", lambda: op.attention(Q, Q, Q, dropout_p=0.1),
         "dropout_p=0.1 needs dropout_key"),
    Case("op.attention", "wrong type",
         lambda: op.attention(Q, Q, Q, dropout_p=0.1, dropout_key="a"),
         "op.attention: dropout_key is a str"),
    Case("op.take_along_axis", "wrong dtype", lambda: op.take_along_axis(F, F, 1),
         "indices must be int32 or int64"),
    Case("op.take_along_axis", "wrong rank", lambda: op.take_along_axis(F, I4, 0),
         "must have the rank of x [4, 6]"),
    Case("op.take_along_axis", "out of range",
         lambda: op.take_along_axis(F, I4.reshape(4, 1), 2), "dim=2"),
    Case("op.take_along_axis", "wrong rank",
         lambda: op.take_along_axis(F, np.zeros((3, 1), np.int32), 1), "do not broadcast"),
    Case("op.argmax", "wrong dtype", lambda: op.argmax(I4), "int32"),
    Case("op.argmax", "out of range", lambda: op.argmax(np.ones((3, 0), np.float32)),
         "dimension 1 of [3, 0] is empty"),
    Case("op.argmin", "wrong type", lambda: op.argmin(F, keepdim="yes"), "keepdim='yes'"),
    Case("op.argmin", "wrong type", lambda: op.argmin(F, dim=0.5), "dim=0.5"),
    Case("op.arange", "out of range", lambda: op.arange(0, 5, 0), "step=0"),
    Case("op.arange", "wrong dtype", lambda: ts.jit(lambda x: x + op.arange(6, dtype="s"))(F),
         "'s'"),
    Case("op.broadcast_to", "wrong rank", lambda: op.broadcast_to(F, (4, 5)),
         "[4, 6] does not broadcast to [4, 5]"),
    Case("op.broadcast_to", "wrong type", lambda: op.broadcast_to(F, (4, "6")), "'6'"),
    Case("op.broadcast_to", "wrong type", lambda: op.broadcast_to("F", (4, 6)),
         "no operand is a tensor (x='F'"),
    Case("op.broadcast_to", "wrong type",
         lambda: ts.jit(lambda x: op.broadcast_to("F", (4, 6)) + x)(F), "x is a str"),

    Case("op.concat", "wrong rank", lambda: op.concat([F, np.ones((4, 5), np.float32)]),
         "[4, 5] float32 differ outside dim 0"),
    Case("op.concat", "wrong type", lambda: op.concat([F, "a"]), "xs[1] is a str"),
    Case("op.concat", "wrong type", lambda: op.concat(F), "xs must be a list or tuple"),
    Case("op.concat", "out of range", lambda: ts.jit(lambda x: op.concat([]))(F), "no tensors"),
    Case("op.concat", "out of range", lambda: op.concat([F, F], dim=3), "dim 3"),
    Case("op.concat", "wrong dtype", lambda: op.concat([F, IM]), "dtypes differ"),

    Case("op.matmul", "wrong type", lambda: op.matmul(F, "a"), "b is a str"),
    Case("op.matmul", "wrong type", lambda: ts.jit(lambda x: op.matmul(x, [[1.0]]))(F),
         "b is a list"),
    Case("op.matmul", "wrong rank", lambda: op.matmul(F3, np.ones(4, np.float32)),
         "rhs [4] has K = 4"),
    Case("op.matmul", "wrong rank", lambda: ts.jit(lambda x: x @ x)(F), "lhs [4, 6] has K = 6"),
    Case("op.matmul", "wrong rank", lambda: op.matmul(F, np.float32(2.0)), "rank >= 1"),
    Case("op.matmul", "wrong rank",
         lambda: op.matmul(F3, np.ones((3, 6, 2), np.float32)), "[2] and [3] do not broadcast"),
    Case("op.matmul", "wrong dtype", lambda: op.matmul(IM, IM.T), "int32"),
    Case("op.matmul", "wrong dtype", lambda: op.matmul(F, W.astype(np.float64)), "float64"),
    Case("op.matmul", "out of range", lambda: op.matmul(F, W, transport="fast"),
         "transport must be one of"),

    Case("op.linear", "wrong type", lambda: op.linear(F, "w"), "w is a str"),
    Case("op.linear", "other", lambda: op.linear(F, W, weight_layout="io"), "weight_layout='io'"),
    Case("op.linear", "wrong rank", lambda: op.linear(F, F3, weight_layout="out_in"),
         "2-D weight [out, in]"),
    Case("op.linear", "wrong rank", lambda: op.linear(F, W, np.ones(4, np.float32)),
         "b has shape [4]"),
    Case("op.linear", "wrong rank", lambda: op.linear(F, np.ones((5, 3), np.float32)),
         "rhs [5, 3]"),
    Case("op.linear", "wrong dtype", lambda: op.linear(IM, W), "int32"),
    Case("op.linear", "out of range", lambda: op.linear(F, W, transport="nvlink"), "transport"),
    Case("op.linear", "wrong type", lambda: ts.jit(lambda x: op.linear(x, W, b="b"))(F),
         "b is a str"),
)

for _name in ("softmax", "log_softmax"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "out of range", lambda f=_f: f(F, dim=5), "dim 5"),
        Case(f"op.{_name}", "out of range", lambda f=_f: ts.jit(lambda x: f(x, axis=2))(F),
             "dim 2"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, dim="last"), "dim 'last'"),
        Case(f"op.{_name}", "wrong dtype", lambda f=_f: f(IM), "int32"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: ts.jit(lambda x: f({"x": x}))(F),
             "x is a dict"),
        Case(f"op.{_name}", "other", lambda f=_f: f(F, dim=0, axis=1), "dim= or axis="),
    )

for _name in ("layernorm", "rmsnorm"):
    _f = getattr(op, _name)
    cases(
        Case(f"op.{_name}", "wrong rank", lambda f=_f: f(F, V5), "weight has shape [5]"),
        Case(f"op.{_name}", "wrong rank", lambda f=_f: ts.jit(lambda x: f(x, F))(F),
             "weight has shape [4, 6]"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, "w"), "weight is a str"),
        Case(f"op.{_name}", "wrong dtype", lambda f=_f: f(IM), "int32"),
        Case(f"op.{_name}", "wrong type", lambda f=_f: f(F, eps="small"), "eps='small'"),
        Case(f"op.{_name}", "out of range", lambda f=_f: f(F, eps=-1.0), "eps=-1.0"),
    )
cases(
    Case("op.layernorm", "wrong rank", lambda: op.layernorm(F, V6, V5), "bias has shape [5]"),
    Case("op.layernorm", "wrong rank",
         lambda: ts.jit(lambda x: op.layernorm(x, V6, np.ones((1, 6), np.float32)))(F),
         "bias has shape [1, 6]"),

    Case("op.embedding", "wrong dtype", lambda: op.embedding(F, W), "ids must be integers"),
    Case("op.embedding", "wrong rank", lambda: op.embedding(I4, V6), "table must be [vocab, dim]"),
    Case("op.embedding", "wrong type", lambda: op.embedding("tokens", W), "ids is a str"),
    Case("op.embedding", "wrong type", lambda: ts.jit(lambda i: op.embedding(i, None))(I4),
         "table is a NoneType"),
    Case("op.embedding", "wrong dtype", lambda: ts.jit(lambda t: op.embedding(I4 * 0.5, t))(W),
         "ids must be integers"),

    Case("op.attention", "wrong rank", lambda: op.attention(Q, np.ones((2, 5, 8), np.float32), Q),
         "k [2, 5, 8]"),
    Case("op.attention", "wrong rank", lambda: op.attention(V6, V6, V6), "q [6]"),
    Case("op.attention", "wrong dtype", lambda: op.attention(Q, Q, Q.astype(np.float64)),
         "float64"),
    Case("op.attention", "wrong dtype", lambda: op.attention(*[Q.astype(np.int32)] * 3), "int32"),
    Case("op.attention", "out of range", lambda: op.attention(Q, Q, Q, seq_dim=5), "seq_dim=5"),
    Case("op.attention", "out of range", lambda: op.attention(Q, Q, Q, seq_dim=-1), "seq_dim=-1"),
    Case("op.attention", "out of range", lambda: op.attention(Q, Q, Q, scale=-1.0),
         "scale must be positive"),
    Case("op.attention", "wrong type", lambda: ts.jit(lambda q: op.attention(q, "k", q))(Q),
         "k is a str"),
    Case("op.attention", "wrong type", lambda: op.attention(Q, Q, Q, scale="big"), "scale"),
    Case("op.attention", "wrong type", lambda: op.attention(Q, Q, Q, causal="no"), "causal='no'"),
    Case("op.attention", "wrong rank", lambda: op.attention(Q, *[np.ones((3, 4, 8), np.float32)] * 2),
         "dimension 0 of k and v (3) must divide q's (2)"),
    Case("op.attention", "wrong rank", lambda: op.attention(Q, Q, Q, mask=np.ones((2, 5, 4), bool)),
         "mask [2, 5, 4] does not broadcast to [1|2, 1|4, 4]"),
    Case("op.attention", "wrong dtype", lambda: op.attention(Q, Q, Q, mask=np.ones((4, 4), np.int32)),
         "mask must be boolean"),
    Case("op.attention", "wrong type", lambda: op.attention(Q, Q, Q, mask="causal"),
         "mask is a str"),
    Case("op.attention", "out of range", lambda: op.attention(Q, Q, Q, softcap=-1.0),
         "softcap=-1.0 must be a positive number"),
    Case("op.attention", "wrong type", lambda: op.attention(Q, Q, Q, softcap="30"),
         "softcap='30'"),
    Case("op.attention", "other", lambda: op.attention(Q, Q, Q, window=2),
         "window=2 must be a positive integer, with causal=True"),
    Case("op.attention", "out of range", lambda: op.attention(Q, Q, Q, causal=True, window=0),
         "window=0"),
    Case("op.attention", "wrong type", lambda: op.attention(Q, Q, Q, causal=True, window=2.5),
         "window=2.5"),
    Case("op.attention", "wrong rank",
         lambda: op.attention(Q, Q, Q, segment_ids=np.zeros((2, 5), np.int32)),
         "segment_ids [2, 5] must be [2, 4]"),
    Case("op.attention", "wrong dtype",
         lambda: op.attention(Q, Q, Q, segment_ids=np.zeros((2, 4), np.float32)),
         "segment_ids must be int32 or int64"),
    Case("op.attention", "wrong type",
         lambda: op.attention(Q, Q, Q, segment_ids=(np.zeros((2, 4), np.int32),) * 3),
         "one array or a pair"),
    Case("op.attention", "out of range",
         lambda: op.attention(Q, Q, Q, segment_ids=np.full((2, 4), 1 << 40, np.int64)),
         "does not fit in int32"),

    Case("op.cross_entropy", "wrong dtype", lambda: op.cross_entropy(F, F),
         "targets must be integers"),
    Case("op.cross_entropy", "wrong rank", lambda: op.cross_entropy(F, np.zeros(5, np.int32)),
         "got [5]"),
    Case("op.cross_entropy", "wrong rank",
         lambda: ts.jit(lambda x, t: op.cross_entropy(x, t))(F, np.zeros((4, 1), np.int32)),
         "got [4, 1]"),
    Case("op.cross_entropy", "wrong type", lambda: op.cross_entropy("logits", I4),
         "logits is a str"),
    Case("op.cross_entropy", "wrong type",
         lambda: ts.jit(lambda x: op.cross_entropy(x, [0, 1, 2, 3]))(F), "targets is a list"),

    Case("op.transformer_block", "other", lambda: op.transformer_block(F3, heads=2),
         "params="),
    Case("op.transformer_block", "wrong rank",
         lambda: op.transformer_block(F, params=nn.init_transformer(1, 6)), "[B, S, D]"),
    Case("op.transformer_block", "out of range",
         lambda: op.transformer_block(F3, params=nn.init_transformer(1, 6), heads=4), "heads=4"),
    Case("op.transformer_block", "out of range",
         lambda: op.transformer_block(F3, params=nn.init_transformer(1, 6), heads=0), "heads=0"),
    Case("op.transformer_block", "out of range",
         lambda: op.transformer_block(F3, depth=2, params=nn.init_transformer(1, 6)), "depth=2"),
    Case("op.transformer_block", "out of range",
         lambda: op.transformer_block(F3, params=nn.init_transformer(1, 6), remat="half"),
         "remat policy 'half'"),
    Case("op.transformer_block", "out of range",
         lambda: op.transformer_block(F3, params=nn.init_transformer(1, 6), norm="batchnorm"),
         "norm='batchnorm'"),
    Case("op.transformer_block", "wrong dtype",
         lambda: op.transformer_block(F3.astype(np.int32), params=nn.init_transformer(1, 6)),
         "int32"),
    Case("op.transformer_block", "wrong type",
         lambda: ts.jit(lambda p: op.transformer_block("x", params=p))(nn.init_transformer(1, 6)),
         "x is a str"),

    Case("op.topk", "out of range", lambda: op.topk(F, 0), "k=0"),
    Case("op.topk", "out of range", lambda: op.topk(F, 7), "k=7"),
    Case("op.topk", "out of range", lambda: ts.jit(lambda x: op.topk(x, -2))(F), "k=-2"),
    Case("op.topk", "wrong type", lambda: op.topk(F, "2"), "k='2'"),
    Case("op.topk", "wrong dtype", lambda: op.topk(IM, 2), "int32"),
    Case("op.topk", "wrong type", lambda: ts.jit(lambda x: op.topk(None, 2))(F),
         "x is a NoneType"),

    Case("op.moe", "wrong type", lambda: op.moe(F, experts=[EXPERTS["w1"]]),
         "experts must be a dict"),
    Case("op.moe", "out of range", lambda: op.moe(F, experts=EXPERTS, k=9), "k=9"),
    Case("op.moe", "wrong type", lambda: op.moe(F, experts=EXPERTS, k="2"), "k='2'"),
    Case("op.moe", "out of range", lambda: op.moe(F, experts=EXPERTS, router="hash"),
         "router 'hash'"),
    Case("op.moe", "out of range", lambda: op.moe(F, experts=EXPERTS, capacity_factor=-1.0),
         "capacity_factor=-1.0"),
    Case("op.moe", "wrong type", lambda: op.moe(F, experts=EXPERTS, capacity_factor="1.25"),
         "capacity_factor='1.25'"),
    Case("op.moe", "other", lambda: op.moe(F, experts={"router": EXPERTS["router"]}),
         "experts has no 'w1'"),
    Case("op.moe", "wrong rank",
         lambda: op.moe(F, experts={**EXPERTS, "w1": np.ones((4, 5, 8), np.float32)}),
         "experts['w1']"),
    Case("op.moe", "wrong dtype", lambda: op.moe(IM, experts=EXPERTS), "int32"),
    Case("op.moe", "out of range", lambda: op.moe(F, experts=EXPERTS, transport="smoke"),
         "transport 'smoke'"),
    Case("op.moe", "wrong type",
         lambda: ts.jit(lambda x: op.moe(x, experts={**EXPERTS, "w2": "w2"}))(F),
         "experts['w2']"),

    Case("op.autodiff", "wrong rank", lambda: ts.jit(lambda x: op.autodiff(x * 2.0, wrt=x))(F),
         "loss must be a float scalar"),
    Case("op.autodiff", "wrong type", lambda: ts.jit(lambda x: op.autodiff(op.sum(x), wrt="w"))(F),
         "wrt leaf #0"),
    Case("op.autodiff", "wrong dtype", lambda: ts.jit(lambda x: op.autodiff(op.sum(x), wrt=x))(IM),
         "int32"),
    Case("op.autodiff", "other", lambda: op.autodiff(F), "loss is a ndarray"),

    Case("op.kernel", "wrong type", lambda: op.kernel(42), "fn is a int"),
    Case("op.kernel", "wrong axis",
         lambda: ts.jit(op.kernel(lambda x: x, mesh=MESH2, in_specs=BAD_AXIS), mesh=MESH2).lower(F),
         "'zz'"),
    Case("op.kernel", "wrong type", lambda: op.kernel(lambda x: x, mesh="tp"), "mesh="),
)

# -- tessera (ts.*) -----------------------------------------------------------------

for _api, _name in ((ts.jit, "ts.jit"), (ts.compile, "ts.compile"), (ts.function, "ts.function")):
    cases(
        Case(_name, "wrong type", lambda f=_api: f(42), "fn is a int"),
        Case(_name, "wrong type", lambda f=_api: f(lambda x: x, mesh="tp"), "mesh= is a str"),
        Case(_name, "out of range", lambda f=_api: f(lambda x: x, memory_budget="lots"),
             "memory_budget"),
        Case(_name, "out of range", lambda f=_api: f(lambda x: x, memory_budget=-5),
             "memory_budget"),
        Case(_name, "other", lambda f=_api: f(lambda x: x, dynamic=("lr",)),
             "dynamic= names ['lr']"),
        Case(_name, "out of range", lambda f=_api: f(lambda x: x, target="tpu"), "target 'tpu'"),
        Case(_name, "wrong type", lambda f=_api: f(lambda x: x, deterministic="yes"),
             "deterministic="),
        Case(_name, "other", lambda f=_api: f(lambda x: x)(F, F), "too many positional"),
        Case(_name, "wrong dtype", lambda f=_api: f(lambda x: x)(np.ones(3, np.complex64)),
             "argument x has dtype complex64"),
        Case(_name, "wrong rank", lambda f=_api: f(annotated)(F3), "argument 'x' has shape"),
        Case(_name, "wrong dtype", lambda f=_api: f(annotated)(IM), "argument 'x' has dtype int32"),
        Case(_name, "other", lambda f=_api: f(lambda x: "a")(F), "output #0 is a str"),
        Case(_name, "other", lambda f=_api: f(lambda x: x, mesh=MESH2)(F),
             "needs the tp mesh, 2 to run as 2 processes"),
        Case(_name, "wrong axis",
             lambda f=_api: f(lambda x: dist.redistribute(x, BAD_AXIS), mesh=MESH2).lower(F), "'zz'"),
    )

cases(
    Case("ts.CompiledFunction", "wrong type", lambda: ts.CompiledFunction(42, None), "fn is a int"),
    Case("ts.CompiledFunction", "wrong type", lambda: ts.CompiledFunction(lambda x: x, "tp"),
         "mesh= is a str"),
    Case("ts.CompiledFunction", "out of range",
         lambda: ts.jit(lambda x: x).lower(F, target="tpu"), "target 'tpu'"),
    Case("ts.CompiledFunction", "other", lambda: ts.jit(lambda x: x).memory_report(),
         "pass the arguments"),

    Case("ts.grad", "out of range",
         lambda: ts.jit(lambda x: ts.grad(lambda a: op.sum(a), argnums=3)(x))(F),
         "argument number 3 is out of range"),
    Case("ts.grad", "other", lambda: ts.grad(lambda a: a, wrt=0, argnums=0), "both wrt=0"),
    Case("ts.grad", "wrong type", lambda: ts.grad(lambda a: a, argnums="a"), "argnums="),
    Case("ts.grad", "wrong rank", lambda: ts.jit(lambda x: ts.grad(lambda a: a * 2.0)(x))(F),
         "the loss must be a float scalar (shape [])"),
    Case("ts.grad", "wrong dtype", lambda: ts.jit(lambda x: ts.grad(op.sum(x), x))(IM),
         "int32"),
    Case("ts.grad", "wrong type", lambda: ts.jit(lambda x: ts.grad(op.sum(x), [x, "b"]))(F),
         "wrt leaf #1"),
    Case("ts.grad", "other", lambda: ts.grad(F, F), "loss is a ndarray"),
    Case("ts.grad", "wrong type", lambda: ts.jit(lambda x: ts.grad(op.sum(x), x, argnums=0))(F),
         "argnums="),

    Case("ts.value_and_grad", "out of range",
         lambda: ts.jit(lambda x: ts.value_and_grad(lambda a: op.sum(a), 2)(x))(F),
         "argument number 2 is out of range"),
    Case("ts.value_and_grad", "other", lambda: ts.value_and_grad(lambda a: a, 0, argnums=1),
         "both wrt=0"),
    Case("ts.value_and_grad", "wrong type", lambda: ts.value_and_grad(lambda a: a, wrt=1.5),
         "wrt="),
    Case("ts.value_and_grad", "wrong rank",
         lambda: ts.jit(lambda x: ts.value_and_grad(lambda a: a)(x))(F), "float scalar"),
    Case("ts.value_and_grad", "wrong dtype",
         lambda: ts.jit(lambda x: ts.value_and_grad(op.sum)(x))(IM), "int32"),
    Case("ts.value_and_grad", "wrong type", lambda: ts.value_and_grad("loss"), "fn is a str"),

    Case("ts.remat", "out of range", lambda: ts.remat(lambda x: x, policy="sometimes"),
         "remat policy 'sometimes'"),
    Case("ts.remat", "wrong type", lambda: ts.remat(42), "fn is a int"),
    Case("ts.remat", "wrong type", lambda: ts.remat(policy=["full"]), "remat policy ['full']"),

    Case("ts.autocast", "wrong dtype", lambda: ts.autocast(dtype="float33"),
         "dtype: unknown dtype 'float33'"),
    Case("ts.autocast", "wrong dtype", lambda: ts.autocast(dtype=ts.int32), "int32"),
    Case("ts.autocast", "wrong type", lambda: ts.autocast(dtype=3.5), "3.5"),

    Case("ts.distribute", "out of range", lambda: ts.distribute(strategy="pipeline"),
         "unknown strategy 'pipeline'"),
    Case("ts.distribute", "wrong axis", lambda: ts.distribute(mesh=MESH2, axis="dp"),
         "axis 'dp' is not in"),
    Case("ts.distribute", "wrong axis", lambda: ts.distribute(mesh=MESH2, mesh_axes=["zz"]),
         "axis 'zz' is not in"),
    Case("ts.distribute", "wrong type", lambda: ts.distribute(mesh="tp"), "mesh= is a str"),
    Case("ts.distribute", "other",
         lambda: ts.distribute(strategy="tensor_parallel", batch_is_local=True),
         "batch_is_local=True"),
    Case("ts.distribute", "wrong type", lambda: ts.distribute(batch=3), "batch="),
    Case("ts.distribute", "wrong type", lambda: ts.distribute(lambda x: x, layouts="col"),
         "layouts="),

    Case("ts.Tensor", "wrong dtype", lambda: ts.Tensor["B", 2.5], "2.5"),
    Case("ts.Tensor", "out of range", lambda: ts.Tensor["B", -3, ts.f32], "-3"),
    Case("ts.Tensor", "wrong type", lambda: ts.Tensor["B", None], "None"),

    Case("ts.tensor", "wrong type", lambda: ts.tensor("abc"), "value is a str"),
    Case("ts.tensor", "wrong dtype", lambda: ts.tensor(1.0, dtype="float33"),
         "dtype: unknown dtype 'float33'"),
    Case("ts.tensor", "wrong type", lambda: ts.tensor(None), "value is a NoneType"),

    Case("ts.TargetOptions", "out of range", lambda: ts.TargetOptions(target="tpu"),
         "unknown target 'tpu'"),
    Case("ts.TargetOptions", "out of range", lambda: ts.TargetOptions(context_parallel="rings"),
         "unknown context_parallel 'rings'; choose one of auto, ring, ulysses"),
    Case("ts.TargetOptions", "out of range", lambda: ts.TargetOptions(bucket_elements=0),
         "bucket_elements"),
    Case("ts.TargetOptions", "out of range", lambda: ts.TargetOptions(ranks_per_node=-1),
         "ranks_per_node"),
    Case("ts.TargetOptions", "wrong type", lambda: ts.TargetOptions(target_blocks="many"),
         "target_blocks"),
    Case("ts.TargetOptions", "wrong type", lambda: ts.TargetOptions(gemm_configs="128x128x32"),
         "gemm_configs"),

    Case("ts.GemmConfig", "out of range", lambda: ts.GemmConfig(0, 64, 32), "bm"),
    Case("ts.GemmConfig", "wrong type", lambda: ts.GemmConfig("128", 64, 32), "bm"),
    Case("ts.GemmConfig", "wrong rank", lambda: ts.GemmConfig(128, 64, 32, warps=(4,)), "warps"),
    Case("ts.GemmConfig", "out of range", lambda: ts.GemmConfig(128, 64, 32, stages=0), "stages"),

    Case("ts.schedule", "other", lambda: ts.schedule(pipline=True), "pipline"),
    Case("ts.schedule", "wrong type", lambda: ts.schedule(overlap="yes"), "overlap"),
)

# -- tessera.dist --------------------------------------------------------------------

cases(
    Case("dist.Mesh", "wrong rank", lambda: dist.Mesh(axes=[]), "at least one axis"),
    Case("dist.Mesh", "wrong rank",
         lambda: dist.Mesh(axes=["dp", "tp"], devices=range(4), shape=(3, 2)), "shape [3, 2]"),
    Case("dist.Mesh", "wrong axis", lambda: dist.Mesh(axes=["dp", "dp"], devices=range(2)),
         "duplicate axis names"),
    Case("dist.Mesh", "wrong type", lambda: dist.Mesh(axes=[1], devices=range(1)), "axes"),
    Case("dist.Mesh", "out of range", lambda: dist.Mesh(axes=["dp"], shape=(0,)),
         "axis sizes must be >= 1"),
    Case("dist.Mesh", "out of range", lambda: dist.Mesh(axes=["dp"], devices=[-1]),
         "non-negative"),
    Case("dist.Mesh", "wrong type", lambda: dist.Mesh(axes=["dp"], devices="01"), "devices"),
    Case("dist.Mesh", "wrong axis", lambda: MESH2.axis_size("zz"), "'zz'"),
    Case("dist.Mesh", "wrong axis", lambda: MESH2.submesh("zz"), "'zz'"),

    Case("dist.ShardSpec", "wrong rank", lambda: dist.ShardSpec(("col",), ()),
         "partition ('col',) and mesh_axes ()"),
    Case("dist.ShardSpec", "wrong type",
         lambda: dist.from_numpy(F, dist.ShardSpec(("col",), (1,)), MESH2), "mesh axis 1 is not"),
    Case("dist.ShardSpec", "wrong type",
         lambda: dist.from_numpy(F, dist.ShardSpec((1.5,), ("tp",)), MESH2), "partition entry 1.5"),
    Case("dist.ShardSpec", "wrong type",
         lambda: dist.from_numpy(F, dist.ShardSpec(partial=(0,)), MESH2), "partial axis 0"),
    Case("dist.ShardSpec", "wrong type", lambda: dist.ShardSpec("col", None), "mesh_axes=None"),
    Case("dist.ShardSpec", "wrong axis", lambda: dist.from_numpy(F, BAD_AXIS, MESH2),
         "mesh axis 'zz'"),
    Case("dist.ShardSpec", "out of range",
         lambda: dist.from_numpy(V6, dist.ShardSpec(("row",), ("tp",)), MESH2),
         "partition entry 'row'"),
    Case("dist.ShardSpec", "out of range",
         lambda: dist.from_numpy(F, dist.ShardSpec((2,), ("tp",)), MESH2), "partition entry 2"),
    Case("dist.ShardSpec", "wrong axis",
         lambda: dist.from_numpy(F, dist.ShardSpec(partial=("zz",)), MESH2), "partial axis 'zz'"),

    Case("dist.DTensor", "wrong axis", lambda: X2.shard("col", "zz"), "mesh axis 'zz'"),
    Case("dist.DTensor", "out of range", lambda: X2.shard(5, "tp"), "partition entry 5"),
    Case("dist.DTensor", "out of range", lambda: X2.block(7), "rank 7"),
    Case("dist.DTensor", "wrong type", lambda: X2.redistribute("col"), "layout is a str"),

    Case("dist.from_numpy", "wrong axis", lambda: dist.from_numpy(F, BAD_AXIS, mesh=MESH2),
         "'zz'"),
    Case("dist.from_numpy", "out of range",
         lambda: dist.from_numpy(np.ones((4, 5), np.float32), COL, MESH2), "dimension 1 (size 5)"),
    Case("dist.from_numpy", "wrong type", lambda: dist.from_numpy("abc", mesh=MESH2),
         "array is a str"),
    Case("dist.from_numpy", "wrong dtype",
         lambda: dist.from_numpy(np.ones(2, np.complex64), mesh=MESH2), "complex64"),
    Case("dist.from_numpy", "wrong type", lambda: dist.from_numpy(F, COL, "tp"), "mesh= is a str"),
    Case("dist.from_numpy", "wrong type", lambda: dist.from_numpy(F, ("col",), MESH2),
         "layout is a tuple"),
    Case("dist.from_numpy", "other", lambda: dist.from_numpy(F, COL), "needs mesh="),
    Case("dist.from_numpy", "out of range", lambda: dist.from_numpy(F, mesh=MESH1, src=3),
         "src=3"),
    Case("dist.from_numpy", "wrong rank",
         lambda: dist.from_numpy(np.float32(1.0), COL, MESH2), "rank 0"),

    Case("dist.from_local", "wrong axis", lambda: dist.from_local(F, axis="zz", mesh=MESH1),
         "axis 'zz'"),
    Case("dist.from_local", "out of range", lambda: dist.from_local(F, "dp", dim=5, mesh=MESH1),
         "no dimension 5"),
    Case("dist.from_local", "wrong type", lambda: dist.from_local(F, "dp", mesh="dp"),
         "mesh= is a str"),
    Case("dist.from_local", "wrong type", lambda: dist.from_local("abc", "dp", mesh=MESH1),
         "x is a str"),
    Case("dist.from_local", "wrong type", lambda: dist.from_local(F, 0, mesh=MESH1), "axis 0"),

    Case("dist.from_tree", "wrong axis", lambda: dist.from_tree({"w": F}, BAD_AXIS, MESH2),
         "w: mesh axis 'zz'"),
    Case("dist.from_tree", "wrong type", lambda: dist.from_tree({"w": F}, lambda p, a: "col", MESH2),
         "layout is a str"),
    Case("dist.from_tree", "wrong type", lambda: dist.from_tree({"w": F}, COL, None),
         "needs mesh="),
    Case("dist.from_tree", "out of range",
         lambda: dist.from_tree({"w": np.ones((3, 3), np.float32)}, COL, MESH2),
         "w: dimension 1 (size 3)"),

    Case("dist.tensor", "out of range", lambda: dist.tensor((4, 6), mesh=MESH2, init="ones"),
         "init must be 'zeros' or 'random'"),
    Case("dist.tensor", "wrong dtype", lambda: dist.tensor((4, 6), mesh=MESH2, dtype="float33"),
         "dtype: unknown dtype 'float33'"),
    Case("dist.tensor", "out of range", lambda: dist.tensor((-1, 6), mesh=MESH2), "shape"),
    Case("dist.tensor", "wrong type", lambda: dist.tensor("ab", mesh=MESH2), "shape"),
    Case("dist.tensor", "wrong axis", lambda: dist.tensor((4, 6), BAD_AXIS, MESH2), "'zz'"),
    Case("dist.tensor", "other", lambda: dist.tensor((4, 6), COL), "needs mesh="),
    Case("dist.tensor", "out of range", lambda: dist.tensor((4, 5), COL, MESH2),
         "dimension 1 (size 5)"),
    Case("dist.tensor", "wrong type", lambda: dist.tensor((4, 6), mesh=MESH2, scale="x"), "scale"),

    Case("dist.inspect", "wrong type", lambda: dist.inspect(F), "t is a ndarray"),

    Case("dist.deterministic", "out of range", lambda: dist.deterministic(reduce_tree="linear"),
         "reduce_tree must be one of"),

    Case("dist.broadcast", "other", lambda: dist.broadcast(F), "needs mesh="),
    Case("dist.broadcast", "out of range", lambda: dist.broadcast(F, mesh=MESH1, src=3), "src=3"),
    Case("dist.broadcast", "wrong axis", lambda: spmd2(lambda x: dist.broadcast(x, axis="zz"))(F),
         "axis 'zz'"),
    Case("dist.broadcast", "out of range",
         lambda: spmd2(lambda x: dist.broadcast(x, axis="tp", src=5))(F), "src=5"),
    Case("dist.broadcast", "other", lambda: spmd2(lambda x: dist.broadcast(x))(F), "needs axis="),

    Case("dist.scatter", "out of range", lambda: dist.scatter(F, COL, MESH1, src=4), "src=4"),
    Case("dist.scatter", "wrong axis", lambda: dist.scatter(F, BAD_AXIS, MESH1), "'zz'"),
    Case("dist.scatter", "wrong type", lambda: dist.scatter(F, None, "dp"), "mesh= is a str"),

    Case("dist.redistribute", "wrong type", lambda: dist.redistribute(F, COL), "x is a ndarray"),
    Case("dist.redistribute", "wrong axis",
         lambda: ts.jit(lambda x: dist.redistribute(x, BAD_AXIS), mesh=MESH2).lower(F), "'zz'"),
    Case("dist.redistribute", "out of range",
         lambda: ts.jit(lambda x: dist.redistribute(x, COL), mesh=MESH2).lower(W), "(size 3)"),
    Case("dist.redistribute", "wrong type",
         lambda: ts.jit(lambda x: dist.redistribute(x, "col"), mesh=MESH2).lower(F), "layout is a str"),
    Case("dist.redistribute", "wrong type", lambda: dist.redistribute(X2, ("col", "tp")),
         "layout is a tuple"),
)

for _name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
    _f = getattr(dist, _name)
    _args = {"all_to_all": {"split_dim": 0, "concat_dim": 1}}.get(_name, {})
    cases(
        Case(f"dist.{_name}", "wrong axis",
             lambda f=_f, a=_args: ts.jit(lambda x: f(x, axis="zz", **a), mesh=MESH2).lower(F),
             "axis 'zz' is not in"),
        Case(f"dist.{_name}", "wrong axis",
             lambda f=_f, a=_args: f(F, axis="zz", mesh=MESH1, **a), "axis 'zz' is not in"),
        Case(f"dist.{_name}", "wrong axis", lambda f=_f, a=_args: f(X2, axis="dp", **a),
             "axis 'dp'"),
        Case(f"dist.{_name}", "wrong axis",
             lambda f=_f, a=_args: spmd2(lambda x: f(x, axis="zz", **a))(F), "axis 'zz'"),
        Case(f"dist.{_name}", "wrong type", lambda f=_f, a=_args: f(F, axis=0, mesh=MESH1, **a),
             "axis must be a mesh axis name"),
        Case(f"dist.{_name}", "wrong type", lambda f=_f, a=_args: f(F, axis="dp", mesh="dp", **a),
             "mesh= must be a dist.Mesh"),
    )
cases(
    Case("dist.all_reduce", "out of range", lambda: dist.all_reduce(F, "dp", op="prod", mesh=MESH1),
         "op must be one of"),
    Case("dist.all_reduce", "out of range",
         lambda: spmd2(lambda x: dist.all_reduce(x, "tp", op="mean"))(F), "op must be one of"),
    Case("dist.all_gather", "out of range", lambda: dist.all_gather(F, "dp", dim=5, mesh=MESH1),
         "dim=5"),
    Case("dist.all_gather", "out of range",
         lambda: spmd2(lambda x: dist.all_gather(x, "tp", dim=2))(F), "dim=2"),
    Case("dist.all_gather", "wrong type", lambda: dist.all_gather(F, "dp", dim="col", mesh=MESH1),
         "dim='col'"),
    Case("dist.reduce_scatter", "out of range",
         lambda: dist.reduce_scatter(F, "dp", op="max", mesh=MESH1), "only op='sum'"),
    Case("dist.reduce_scatter", "out of range",
         lambda: spmd2(lambda x: dist.reduce_scatter(x, "tp", dim=-3))(F), "dim=-3"),
    Case("dist.reduce_scatter", "out of range",
         lambda: spmd2(lambda x: dist.reduce_scatter(x, "tp", dim=1))(W),
         "does not split over axis 'tp'"),
    Case("dist.all_to_all", "out of range",
         lambda: spmd2(lambda x: dist.all_to_all(x, "tp", 5, 0))(F), "split_dim=5"),
    Case("dist.all_to_all", "out of range",
         lambda: spmd2(lambda x: dist.all_to_all(x, "tp", 0, 9))(F), "concat_dim=9"),

    Case("dist.spmd", "wrong type", lambda: dist.spmd(42), "fn is a int"),
    Case("dist.spmd", "wrong type", lambda: dist.spmd(lambda x: x, mesh="tp"), "mesh= is a str"),
    Case("dist.spmd", "wrong rank",
         lambda: spmd2(lambda x: x, in_specs=[dist.ShardSpec(), dist.ShardSpec()])(F),
         "in_specs has 2 entries for 1"),
    Case("dist.spmd", "wrong axis", lambda: spmd2(lambda x: x, in_specs=BAD_AXIS)(F),
         "mesh axis 'zz'"),
    Case("dist.spmd", "wrong axis", lambda: spmd2(lambda x: x, out_specs=BAD_AXIS)(F),
         "mesh axis 'zz'"),
    Case("dist.spmd", "wrong type", lambda: dist.spmd(lambda x: x, mesh=MESH2, in_specs="col"),
         "in_specs= is a str"),
    Case("dist.spmd", "wrong type", lambda: spmd2(lambda x: x, in_specs=["col"])(F),
         "in_specs[0] is a str"),
    Case("dist.spmd", "out of range",
         lambda: spmd2(lambda x: x, in_specs=dist.ShardSpec((1,), ("tp",)))(W), "(size 3)"),

    Case("dist.axis_index", "wrong axis", lambda: spmd2(lambda x: x * dist.axis_index("zz"))(F),
         "'zz'"),
    Case("dist.axis_index", "wrong type", lambda: spmd2(lambda x: x * dist.axis_index(0))(F),
         "axis 0"),
    Case("dist.axis_index", "other", lambda: dist.axis_index("tp"), "per-rank code"),

    Case("dist.send", "out of range", lambda: spmd2(lambda x: dist.send(x, 5))(F),
         "5 is not a rank"),
    Case("dist.send", "wrong axis", lambda: spmd2(lambda x: dist.send(x, 1, axis="zz"))(F),
         "axis 'zz'"),
    Case("dist.send", "wrong type", lambda: spmd2(lambda x: dist.send("x", 1))(F), "x is a str"),
    Case("dist.send", "wrong type", lambda: spmd2(lambda x: dist.send(x, "one"))(F), "to='one'"),
    Case("dist.send", "other", lambda: dist.send(F, 1), "per-rank code"),

    Case("dist.recv", "out of range", lambda: spmd2(lambda x: dist.recv(-1, like=x))(F),
         "-1 is not a rank"),
    Case("dist.recv", "wrong axis", lambda: spmd2(lambda x: dist.recv(1, like=x, axis="zz"))(F),
         "axis 'zz'"),
    Case("dist.recv", "wrong dtype",
         lambda: spmd2(lambda x: dist.recv(1, shape=(2,), dtype="float33"))(F),
         "dtype: unknown dtype 'float33'"),
    Case("dist.recv", "wrong type", lambda: spmd2(lambda x: dist.recv(1, shape=(2,)))(F),
         "dtype"),
    Case("dist.recv", "wrong rank", lambda: spmd2(lambda x: dist.recv(1, shape=(-2,),
                                                                       dtype=ts.f32))(F),
         "shape"),
    Case("dist.recv", "other", lambda: spmd2(lambda x: dist.recv(1))(F), "give the value's type"),

    Case("dist.elastic", "out of range", lambda: dist.elastic(safe_point="epoch"),
         "safe_point='epoch'"),
    Case("dist.elastic", "out of range", lambda: dist.elastic(every=0), "every=0"),
    Case("dist.elastic", "wrong type", lambda: dist.elastic(world_sizes="24"), "world_sizes="),
    Case("dist.elastic", "out of range", lambda: dist.elastic(keep=0), "keep=0"),

    Case("dist.profile", "wrong type", lambda: dist.profile(trace=5), "trace="),
    Case("dist.profile", "out of range", lambda: dist.profile(steps=0), "steps=0"),
    Case("dist.profile", "wrong type", lambda: dist.profile(steps="all"), "steps="),
)

# -- tessera.nn ----------------------------------------------------------------------

cases(
    Case("nn.init_transformer", "out of range", lambda: nn.init_transformer(0, 8), "depth=0"),
    Case("nn.init_transformer", "out of range", lambda: nn.init_transformer(1, -8), "width=-8"),
    Case("nn.init_transformer", "wrong type", lambda: nn.init_transformer(1, 8.5), "width=8.5"),
    Case("nn.init_transformer", "wrong dtype", lambda: nn.init_transformer(1, 8, dtype="float33"),
         "dtype: unknown dtype 'float33'"),
    Case("nn.init_transformer", "wrong dtype", lambda: nn.init_transformer(1, 8, dtype=np.int32),
         "int32"),
    Case("nn.init_transformer", "out of range", lambda: nn.init_transformer(1, 8, mlp_ratio=0),
         "mlp_ratio=0"),
    Case("nn.init_transformer", "out of range", lambda: nn.init_transformer(1, 8, experts=-2),
         "experts=-2"),
)

# -- tessera.checkpoint --------------------------------------------------------------

cases(
    Case("checkpoint.save", "out of range", lambda: checkpoint.save("a/b", {"w": F}, directory=CKPT["dir"]),
         "tag 'a/b'"),
    Case("checkpoint.save", "wrong type", lambda: checkpoint.save(5, {"w": F}, directory=CKPT["dir"]),
         "tag 5"),
    Case("checkpoint.save", "out of range",
         lambda: checkpoint.save("t", {"w": F}, directory=CKPT["dir"], keep=0), "keep=0"),
    Case("checkpoint.save", "wrong type",
         lambda: checkpoint.save("t", {"w": {1, 2}}, directory=CKPT["dir"]), "tensors.w is a set"),
    Case("checkpoint.save", "wrong type", lambda: checkpoint.save("t", {"w": F}, directory=5),
         "directory="),
    Case("checkpoint.save", "other",
         lambda: checkpoint.save("t", {"w": F}, directory=CKPT["dir"], atomic=False),
         "atomic=False"),
    Case("checkpoint.save", "wrong dtype",
         lambda: checkpoint.save("t", {"w": np.array(["a", "b"])}, directory=CKPT["dir"]),
         "tensors.w is an array of dtype <U1"),

    Case("checkpoint.load", "out of range", lambda: checkpoint.load("nope", directory=CKPT["dir"]),
         "'nope' does not exist"),
    Case("checkpoint.load", "wrong type", lambda: checkpoint.load(7, directory=CKPT["dir"]),
         "tag 7"),
    Case("checkpoint.load", "other",
         lambda: checkpoint.load("base", directory=CKPT["dir"], mesh=MESH1,
                                 layouts={"tensors.v": dist.ShardSpec()}), "tensors.v"),
    Case("checkpoint.load", "wrong type",
         lambda: checkpoint.load("base", directory=CKPT["dir"], mesh=MESH1, layouts=5),
         "layouts is a int"),
    Case("checkpoint.load", "wrong type",
         lambda: checkpoint.load("base", directory=CKPT["dir"], mesh="dp"), "mesh= is a str"),
    Case("checkpoint.load", "other",
         lambda: checkpoint.load("base", directory=CKPT["dir"], layouts=dist.ShardSpec()),
         "no mesh= was given"),
    Case("checkpoint.load", "wrong axis",
         lambda: checkpoint.load("base", directory=CKPT["dir"], mesh=MESH1, layouts=BAD_AXIS),
         "mesh axis 'zz'"),
    Case("checkpoint.load", "wrong rank",
         lambda: checkpoint.load("base", directory=CKPT["dir"], like={"tensors": {"w": W}}),
         "tensors.w"),
    Case("checkpoint.load", "other",
         lambda: checkpoint.load("base", directory=CKPT["dir"], like={"tensors": {"x": F}}),
         "tensors.x is missing"),
    Case("checkpoint.load", "wrong type", lambda: checkpoint.load("base", directory=None),
         "directory="),

    Case("checkpoint.tags", "wrong type", lambda: checkpoint.tags(5), "directory="),
    Case("checkpoint.latest", "wrong type", lambda: checkpoint.latest(["ckpt"]), "directory="),
    Case("checkpoint.manifest", "out of range",
         lambda: checkpoint.manifest("nope", directory=CKPT["dir"]), "'nope' does not exist"),
    Case("checkpoint.manifest", "wrong type",
         lambda: checkpoint.manifest(None, directory=CKPT["dir"]), "tag None"),
    Case("checkpoint.manifest", "wrong type", lambda: checkpoint.manifest("base", directory=1.5),
         "directory="),
)

# -- tessera.pipeline ----------------------------------------------------------------

cases(
    Case("pipeline.run", "out of range",
         lambda: pipeline.run(mesh=MESH_PP, schedule="2F2B", microbatches=2)(pipelined_step),
         "unknown pipeline schedule '2F2B'"),
    Case("pipeline.run", "out of range", lambda: pipeline.run(mesh=MESH_PP, microbatches=0),
         "microbatches=0"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(mesh=MESH_PP, microbatches="many"),
         "microbatches='many'"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(mesh=MESH_PP, microbatches=2.5),
         "microbatches=2.5"),
    Case("pipeline.run", "wrong axis", lambda: pipeline.run(mesh=MESH_PP, axis="zz"),
         "axis 'zz'"),
    Case("pipeline.run", "wrong axis", lambda: pipeline.run(mesh=MESH_PP, mesh_axes=("zz",)),
         "axis 'zz'"),
    Case("pipeline.run", "out of range", lambda: pipeline.run(mesh=MESH_PP, virtual_stages=0),
         "virtual_stages=0"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(mesh="pp"), "mesh= is a str"),
    Case("pipeline.run", "out of range", lambda: pipeline.run(mesh=MESH_PP, stages=0),
         "stages=0"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(42, mesh=MESH_PP), "fn is a int"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(mesh=MESH_PP, then=5),
         "then is a int"),
    Case("pipeline.run", "out of range", lambda: pipeline.run(mesh=MESH_PP, results="all"),
         "results='all' must be 'every'"),
    Case("pipeline.run", "wrong type", lambda: pipeline.run(mesh=MESH_PP, batch=1), "batch="),

    Case("pipeline.stage", "wrong type", lambda: pipeline.stage(5), "name=5"),
    Case("pipeline.stage", "wrong type", lambda: pipeline.stage("block")(42), "fn is a int"),

    Case("pipeline.Stage", "wrong type", lambda: pipeline.Stage(42), "fn is a int"),
    Case("pipeline.Stage", "wrong type", lambda: pipeline.Stage(stage_fn, name=["b"]), "name="),

    Case("pipeline.compose", "out of range", lambda: pipeline.compose(3, [stage_fn, stage_fn]),
         "stages=3"),
    Case("pipeline.compose", "wrong type", lambda: pipeline.compose(2, None), "assign="),
    Case("pipeline.compose", "wrong type", lambda: pipeline.compose(1, [42]), "assign[0]"),

    Case("pipeline.pipeline", "wrong type", lambda: pipeline.pipeline([stage_fn]),
         "is not a @graph.stage"),
    Case("pipeline.pipeline", "wrong type", lambda: pipeline.pipeline(pipeline.Stage(stage_fn)),
         "stages="),
    Case("pipeline.pipeline", "out of range",
         lambda: pipeline.pipeline([pipeline.Stage(stage_fn)], mesh=MESH_PP, schedule="bogus"),
         "'bogus'"),

    Case("pipeline.PipelinedFunction", "out of range",
         lambda: pipeline.PipelinedFunction(pipelined_step, MESH_PP, "pp", "bogus", 2, None,
                                            None, None), "'bogus'"),
    Case("pipeline.PipelinedFunction", "wrong axis",
         lambda: pipeline.PipelinedFunction(pipelined_step, MESH_PP, "zz", "1F1B", 2, None,
                                            None, None), "axis 'zz'"),
)

# -- ts.optim (a module in ts.__all__: not enumerated by the coverage test, but audited
# where it checks its arguments) -------------------------------------------------------

cases(
    Case("optim.AdamW", "out of range", lambda: ts.optim.AdamW(lr=-1e-3), "lr=-0.001"),
    Case("optim.AdamW", "out of range", lambda: ts.optim.AdamW(betas=(0.9, 1.5)), "betas[1]=1.5"),
    Case("optim.AdamW", "wrong rank", lambda: ts.optim.AdamW(betas=0.9), "betas=0.9"),
    Case("optim.AdamW", "wrong type", lambda: ts.optim.AdamW(lr="3e-4"), "lr='3e-4'"),
    Case("optim.AdamW", "out of range", lambda: ts.optim.AdamW(weight_decay=-0.1),
         "weight_decay=-0.1"),
    Case("optim.SGD", "out of range", lambda: ts.optim.SGD(lr=-1.0), "lr=-1.0"),
    Case("optim.SGD", "out of range", lambda: ts.optim.SGD(momentum=-0.5), "momentum=-0.5"),
    Case("optim.SGD", "wrong type", lambda: ts.optim.SGD(momentum=None), "momentum=None"),
    Case("optim.tree_sum", "out of range", lambda: ts.optim.tree_sum([]), "values is empty"),
)

#: public callables with no case, and why
EXEMPT = {
    "dist.world_size": "takes no arguments",
    "checkpoint.Checkpoint": "what checkpoint.load returns; not made by users",
    "checkpoint.SaveHandle": "what checkpoint.save returns; not made by users",
    "pipeline.Report": "what step.pipeline_report() returns; not made by users",
}

MODULES = {"ts": ts, "dist": dist, "op": op, "nn": nn, "checkpoint": checkpoint,
           "pipeline": pipeline, "models": ts.models}


def _resolve(entry: str):
    module, _, name = entry.partition(".")
    return getattr({**MODULES, "optim": ts.optim}[module], name)


def _auto_exempt(obj) -> str | None:
    """Public names that take no arguments to misuse, by what they are."""
    if isinstance(obj, types.ModuleType) and not callable(obj):
        return "a module (its entry points are audited under their own names)"
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "an exception class"
    if isinstance(obj, np.dtype):
        return "a dtype constant"
    if not callable(obj):
        return "a constant"
    return None


# -- the tests -----------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _saved_checkpoint(tmp_path_factory):
    """A checkpoint ("base": tensors {"w": F}) that the load cases misread."""
    CKPT["dir"] = str(tmp_path_factory.mktemp("ckpt"))
    checkpoint.save("base", tensors={"w": F}, directory=CKPT["dir"])
    yield
    CKPT.clear()


@pytest.fixture(autouse=True)
def _keep_default_mesh():
    """A case that builds a mesh must not leave it the default mesh."""
    made = list(_dtensor._CREATED)
    yield
    _dtensor._CREATED[:] = made


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_misuse_is_a_tessera_error_naming_the_argument_and_the_line(case):
    assert case.kind in KINDS, case.kind
    first = case.call.__code__.co_firstlineno
    try:
        returned = case.call()
    except ts.TesseraError as e:
        error = e
    except Exception as e:          # noqa: BLE001 - the audit's subject
        pytest.fail(f"{case}: raised {type(e).__module__}.{type(e).__name__}, not a "
                    f"ts.TesseraError: {e}")
    else:
        pytest.fail(f"{case}: returned {returned!r:.200} instead of raising")
    message = str(error)
    assert case.names in message, f"{case}: the message does not name {case.names!r}: {message}"
    lines = [int(n) for n in re.findall(rf"{HERE}:(\d+)", message)]
    assert any(first <= n <= first + 6 for n in lines), \
        f"{case}: the message does not name the user's line ({HERE}:{first}): {message}"
    internal = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    assert internal is None, \
        f"{case}: raised from an internal {type(internal).__name__}: {internal}"


def test_every_public_entry_point_is_audited():
    """Every public name of the six modules has a case (aliases share the
    cases of the object they name), or is exempt by what it is or by a
    reason in EXEMPT. A new API fails this until its misuses are in CASES."""
    covered = {id(_resolve(c.entry)) for c in CASES}
    missing = []
    for prefix, module in MODULES.items():
        for name in module.__all__:
            entry, obj = f"{prefix}.{name}", getattr(module, name)
            if id(obj) in covered or entry in EXEMPT or _auto_exempt(obj):
                continue
            missing.append(entry)
    assert not missing, f"public entry points without a misuse case (add Cases, or a reason " \
                        f"in EXEMPT): {missing}"
    stale = [e for e in EXEMPT if id(_resolve(e)) in covered]
    assert not stale, f"EXEMPT entries that have cases: {stale}"


def test_the_audit_covers_the_five_kinds():
    kinds = {c.kind for c in CASES}
    assert set(KINDS[:5]) <= kinds
