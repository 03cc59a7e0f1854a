"""Finding the user's source line for error messages and IR locations."""

from __future__ import annotations

import inspect
import linecache
import re
from dataclasses import dataclass

from tessera_runtime.errors import user_frame as _user_frame
from tessera_runtime.errors import where


@dataclass(frozen=True)
class SourceLine:
    filename: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        return where(self.filename, self.line)


def user_frame() -> SourceLine:
    """The user's line: the innermost stack frame outside Tessera's packages
    (tessera, and the compiler and runtime it calls; a dataclass's generated
    `__init__` counts as its class's package)."""
    frame = _user_frame(inspect.currentframe())
    if frame is None:
        return SourceLine("<unknown>", 0)
    # linecache, not inspect.getframeinfo: the same line from the same cache,
    # without getframeinfo's search for the enclosing source (tracing calls
    # this for every op).
    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno, frame.f_globals).strip()
    return SourceLine(frame.f_code.co_filename, frame.f_lineno, text)


def assigned_name(src: SourceLine) -> str | None:
    """`W1` for a source line `W1 = dist.from_numpy(...)`."""
    m = re.match(r"\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)", src.text)
    return m.group(1) if m else None
