"""Errors raised by Tessera's Python API. Each names the tensor, dimension or
axis involved and the user's source line where it has one."""

from tessera_runtime import flight as _flight
from tessera_runtime.engines import library as _library

from ._source import user_frame


class TesseraError(Exception):
    """Base class of every error Tessera raises on purpose."""


class ShardingError(TesseraError, ValueError):
    """A layout that does not fit the tensor or the mesh."""


class ShapeError(TesseraError, ValueError):
    """Operands whose shapes an op cannot take."""


class LaunchError(TesseraError, RuntimeError):
    """The process layout does not match the mesh (wrong number of ranks, ...)."""


class CompileError(TesseraError, RuntimeError):
    """The compiler rejected the program; the message holds MLIR's diagnostics."""


class ArgumentError(TesseraError, TypeError, ValueError):
    """An argument a Tessera API cannot take (a wrong type, rank, dtype, axis
    or a value out of range); the message names the argument and the user's
    line. (A TypeError and a ValueError: code that caught either from the API
    before still catches it.)"""


class TracingError(TesseraError, TypeError):
    """A traced tensor used where Python needs its value (an `if` on it,
    `float()`, an index): it has none until the compiled program runs."""


class CollectiveTimeout(TesseraError, _flight.CollectiveTimeout):
    """Ranks that never reached an exchange every rank must make (the
    program agreement, an eager collective, a checkpoint commit) within
    TESSERA_COLLECTIVE_TIMEOUT; the message names them."""


class CollectiveMismatch(TesseraError, RuntimeError):
    """Ranks at different collectives (another kind, axis, shape or dtype)
    where they must make the same one; the message names each call."""


class InputMismatch(TesseraError, ValueError):
    """An argument of a global-view call that the ranks must pass alike (a
    numpy array, a replicated DTensor's block) differs between them."""


def option_error(message: str) -> ArgumentError:
    """What a bad compile option (`ts.TargetOptions(...)`, `ts.GemmConfig(...)`)
    raises once tessera is imported: an ArgumentError at the user's line
    (installed as tessera_compiler.ir.options.invalid)."""
    import os

    import tessera_compiler

    where = user_frame(outside=(os.path.dirname(os.path.abspath(tessera_compiler.__file__)) + os.sep,))
    return ArgumentError(f"{message}  [{where}]")


class ValueCheckError(TesseraError, _library.ValueCheckError):
    """A value a compiled step checks was out of range: `ts.nn.cross_entropy`'s
    targets outside [0, C) that are not its ignore_index. Raised once the
    step has run (the check never stops a step half-way, on any device),
    naming the row of the flattened targets, the value, C and the user's
    line; `row`, `value`, `low`, `high`, `allowed` and `source` hold them.
    (The runtime raises this class once tessera is imported: `raise_checks_as`.)"""


_library.raise_checks_as(ValueCheckError)
