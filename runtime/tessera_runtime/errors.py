"""The base of the errors Tessera raises at its user, and how an error
finds the user's line.

They live here, at the bottom of the stack (Python -> compiler -> runtime),
because every layer raises them at the user: the runtime a failed value
check (`ValueCheckError`), a collective's timeout; the compiler a bad
`TargetOptions` (`ArgumentError`). Defined below all three, they are the
classes `tessera` exports (`ts.TesseraError`, `ts.ArgumentError`), with no
layer registering a class in another at import. The frontend's own errors
(`ts.ShapeError`, `ts.TracingError`, ...) build on `TesseraError` in
`tessera/errors.py`.
"""

from __future__ import annotations

import os
import sys

#: Tessera's own packages: a frame whose module is in one of them is not
#: the user's (a dataclass's generated `__init__` runs with its class's
#: module as globals, so it counts as that package's).
PACKAGES = frozenset({"tessera", "tessera_compiler", "tessera_passes", "tessera_runtime"})


class TesseraError(Exception):
    """Base class of every error Tessera raises on purpose."""


class ArgumentError(TesseraError, TypeError, ValueError):
    """An argument a Tessera API cannot take (a wrong type, rank, dtype, axis
    or a value out of range); the message names the argument and the user's
    line. (A TypeError and a ValueError: code that caught either from the API
    before still catches it.)"""


def in_tessera(frame) -> bool:
    """Whether `frame` runs code of one of Tessera's packages."""
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and name.partition(".")[0] in PACKAGES


def user_frame(frame=None):
    """The innermost frame, from `frame` (default: the caller's) outward,
    that is not Tessera's own; None when every frame is."""
    frame = frame or sys._getframe(1)
    while frame is not None and in_tessera(frame):
        frame = frame.f_back
    return frame


def where(filename: str, line: int) -> str:
    """`file:line` as errors name a line: the file relative to the working
    directory (`<stdin>` and other pseudo-files as they are)."""
    return f"{filename if filename.startswith('<') else os.path.relpath(filename)}:{line}"
