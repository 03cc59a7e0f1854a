"""The checks the API's entry points share: what counts as an integer or a
number argument, and the errors for an argument that is not a function or
a mesh. (True is not a size, so a bool is neither an integer nor a number.)"""

from __future__ import annotations

import numpy as np

from ._source import SourceLine, user_frame
from .errors import ArgumentError


def is_int(x) -> bool:
    """An integer argument (Python's or numpy's), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_number(x) -> bool:
    """A real number argument (Python's or numpy's), not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) \
        and not isinstance(x, (bool, np.bool_))


def check_callable(api: str, fn, param: str = "fn", where: SourceLine | None = None) -> None:
    """`fn` (the `param` argument of `api`) must be a function."""
    if not callable(fn):
        raise ArgumentError(f"{api}: {param} is a {type(fn).__name__} ({fn!r:.40}), not a "
                            f"function  [{where or user_frame()}]")
