"""Shape-annotated signatures: `ts.Tensor["B", "S", ts.int32]`.

A string dimension is a symbol bound at call time: every argument using "B"
must agree on it. An int dimension is fixed. A dtype entry fixes the element
type. Checked on every call of a `@ts.function` / `ts.jit` function, with an
error naming the function, the argument, the dimension and the call site.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import numpy as np

from ._source import user_frame
from .dtypes import as_dtype
from .errors import ArgumentError, ShapeError


@dataclass(frozen=True)
class TensorSpec:
    dims: tuple
    dtype: np.dtype | None

    def __repr__(self) -> str:
        parts = [repr(d) for d in self.dims] + ([self.dtype.name] if self.dtype is not None else [])
        return f"Tensor[{', '.join(parts)}]"


class Tensor:
    """`Tensor["B", "S", ts.int32]`, `Tensor["D", ts.f32]`, `Tensor[ts.f32]` (a scalar)."""

    def __class_getitem__(cls, items) -> TensorSpec:
        items = items if isinstance(items, tuple) else (items,)
        dims, dtype = [], None
        for it in items:
            if isinstance(it, bool):
                dtype = as_dtype(it, f"ts.Tensor{list(items)}: entry {it!r}")
            elif isinstance(it, (str, int)):
                if isinstance(it, int) and it < 0:
                    raise ArgumentError(f"ts.Tensor{list(items)}: dimension {it} must be a size "
                                        f"(an int >= 0) or a symbol (a str)  [{user_frame()}]")
                dims.append(it)
            else:
                dtype = as_dtype(it, f"ts.Tensor{list(items)}: entry {it!r}")
        return TensorSpec(tuple(dims), dtype)


def _shape_dtype(value):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    return tuple(shape), np.dtype(dtype)


def check_annotations(fn, signature, arguments: dict) -> None:
    """Checks tensor arguments against their `Tensor[...]` annotations."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations are not ours to check
        hints = dict(getattr(fn, "__annotations__", {}))
    bound_dims: dict[str, tuple[int, str]] = {}
    for name, value in arguments.items():
        spec = hints.get(name)
        if not isinstance(spec, TensorSpec):
            continue
        sd = _shape_dtype(value)
        if sd is None:
            continue
        shape, dtype = sd
        where = user_frame()
        if len(shape) != len(spec.dims):
            raise ShapeError(f"{fn.__name__}: argument '{name}' has shape {list(shape)} but is "
                             f"annotated {spec} (rank {len(spec.dims)})  [{where}]")
        if spec.dtype is not None and dtype != spec.dtype:
            raise ShapeError(f"{fn.__name__}: argument '{name}' has dtype {dtype.name} but is "
                             f"annotated {spec}  [{where}]")
        for i, (dim, size) in enumerate(zip(spec.dims, shape)):
            if isinstance(dim, int):
                if dim != size:
                    raise ShapeError(f"{fn.__name__}: argument '{name}' dimension {i} is {size}, "
                                     f"annotated {dim}  [{where}]")
            elif dim in bound_dims and bound_dims[dim][0] != size:
                first_size, first_arg = bound_dims[dim]
                raise ShapeError(f"{fn.__name__}: argument '{name}' dimension {i} ('{dim}') is "
                                 f"{size}, but '{first_arg}' has {dim} = {first_size}  [{where}]")
            else:
                bound_dims.setdefault(dim, (size, name))
