"""Misused programs: a valid random program (programs.py) with one misuse
planted as a step of its own, the way users get an op wrong: operands whose
shapes do not broadcast or multiply, a dimension or index out of range, a
reshape to another size, an integer tensor where floats are needed, split
sections that do not add up, a Python branch or number taken from a traced
value, a collective over an axis the mesh does not have.

The oracle (test_fuzz_misuse.py): the program never returns; it fails with a
`ts.TesseraError` whose message names the planted step's line of the
program's file (where the user would look), and never with an error from
inside Tessera. Each kind below returns the planted step's text for a value
it can misuse, or None when the value does not fit it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from programs import Program, Step, Value, _size, programs


def _float(v: Value) -> bool:
    return v.dtype in ("f32", "bf16")


def _shapes_do_not_broadcast(draw, v: Value):
    if not v.shape or v.shape[-1] == 1:              # (a size-1 dimension broadcasts)
        return None
    bad = v.shape[:-1] + (v.shape[-1] + 2,)         # never 1, never the same
    return f"op.add({v.name}, np.ones({bad}, np.float32))"


def _inner_dimensions_differ(draw, v: Value):
    if not v.shape:
        return None
    k = v.shape[-1]
    return f"op.matmul({v.name}, np.ones(({k + 1}, 2), np.float32))"


def _dimension_out_of_range(draw, v: Value):
    op = draw(st.sampled_from(["op.sum", "op.mean", "op.max", "op.softmax"]))
    dim = draw(st.sampled_from([len(v.shape), len(v.shape) + 3, -len(v.shape) - 1]))
    return f"{op}({v.name}, dim={dim})"


def _reshape_to_another_size(draw, v: Value):
    return f"op.reshape({v.name}, {_size(v.shape) + draw(st.integers(1, 3))})"


def _index_out_of_range(draw, v: Value):
    if not v.shape:
        return None
    n = v.shape[0]
    return f"{v.name}[{draw(st.sampled_from([n, n + 2, -n - 1]))}]"


def _integer_operand(draw, v: Value):
    op = draw(st.sampled_from(["op.exp", "op.tanh", "op.sqrt", "op.softmax"]))
    return f"{op}(op.cast({v.name}, ts.int32))"


def _split_sections_do_not_add_up(draw, v: Value):
    if not v.shape:
        return None
    n = v.shape[-1]
    return f"op.split({v.name}, [{n + 1}, 1], dim=-1)"


def _python_branch(draw, v: Value):
    test = draw(st.sampled_from(["op.sum({v}) > 0.0", "op.max({v}) == 1.0",
                                 "op.sum({v}) != 0.0"])).format(v=v.name)
    return f"({v.name} if {test} else op.neg({v.name}))"


def _python_number(draw, v: Value):
    conversion = draw(st.sampled_from(["float", "int"]))
    return f"op.mul({v.name}, {conversion}(op.sum({v.name})))"


def _axis_not_in_the_mesh(draw, v: Value):
    axis = draw(st.sampled_from(["tp", "dpp", "pp"]))
    return f"dist.all_reduce({v.name}, axis={axis!r})"


KINDS = [_shapes_do_not_broadcast, _inner_dimensions_differ, _dimension_out_of_range,
         _reshape_to_another_size, _index_out_of_range, _integer_operand,
         _split_sections_do_not_add_up, _python_branch, _python_number, _axis_not_in_the_mesh]


@dataclass
class Misuse:
    program: Program
    kind: str
    #: the planted step's line in the program's function source (1-based)
    line: int


@st.composite
def misused_programs(draw, max_steps: int = 4):
    """A valid program with one misuse planted after a random step, on a
    float value defined by then; the planted value is a result, so a misuse
    that only its run could find would be run."""
    p = draw(programs(max_steps=max_steps, allow_bf16=False))
    at = draw(st.integers(0, len(p.steps)))
    defined = [v for v in p.inputs if _float(v)] + [s.out for s in p.steps[:at] if _float(s.out)]
    v = draw(st.sampled_from(defined))
    kind = draw(st.sampled_from(KINDS))
    text = kind(draw, v)
    if text is None:
        kind, text = _reshape_to_another_size, _reshape_to_another_size(draw, v)
    bad = Value("planted", (), "f32", 1.0)
    p.steps.insert(at, Step(bad, text, None))
    p.results = [bad] + p.results
    p.remat = None
    # `def program(...):` is line 1, the steps follow in order.
    return Misuse(p, kind.__name__.strip("_").replace("_", " "), at + 2)
