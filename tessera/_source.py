"""Finding the user's source line for error messages and IR locations."""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
from dataclasses import dataclass

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class SourceLine:
    filename: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        return f"{os.path.relpath(self.filename) if not self.filename.startswith('<') else self.filename}:{self.line}"


@functools.lru_cache(maxsize=None)
def in_package(filename: str) -> bool:
    # (cached: tracing asks for every frame of every op, ~2,000 a GPT step,
    # and abspath costs more than the rest of the walk)
    return os.path.abspath(filename).startswith(PACKAGE_DIR + os.sep)


def generated_frame(frame) -> bool:
    """A frame of code a tessera module generated at run time: a dataclass's
    `__init__` (filename "<string>", the module's globals), as when a
    ShardSpec's `__post_init__` refuses its arguments."""
    return frame.f_code.co_filename == "<string>" and \
        str(frame.f_globals.get("__name__", "")).startswith(("tessera.", "tessera_compiler."))


def user_frame(outside: tuple[str, ...] = ()) -> SourceLine:
    """The innermost stack frame outside the tessera package (and outside
    code a tessera module generated, such as a dataclass's `__init__`, and
    the folders `outside`: another package of the project that tessera
    calls, such as tessera_compiler, raising an error that must name the
    user's line)."""
    frame = inspect.currentframe()
    while frame is not None:
        if not in_package(frame.f_code.co_filename) and not generated_frame(frame) and \
                not (outside and os.path.abspath(frame.f_code.co_filename).startswith(outside)):
            # linecache, not inspect.getframeinfo: the same line from the same
            # cache, without getframeinfo's search for the enclosing source
            # (tracing calls this for every op).
            text = linecache.getline(frame.f_code.co_filename, frame.f_lineno,
                                     frame.f_globals).strip()
            return SourceLine(frame.f_code.co_filename, frame.f_lineno, text)
        frame = frame.f_back
    return SourceLine("<unknown>", 0)


def assigned_name(src: SourceLine) -> str | None:
    """`W1` for a source line `W1 = dist.from_numpy(...)`."""
    m = re.match(r"\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)", src.text)
    return m.group(1) if m else None
