"""Errors raised by Tessera's Python API. Each names the tensor, dimension or
axis involved and the user's source line where it has one."""

from tessera_runtime.engines.library import ValueCheckError
from tessera_runtime.errors import ArgumentError, TesseraError
from tessera_runtime.flight import CollectiveTimeout

# TesseraError, ArgumentError, ValueCheckError and CollectiveTimeout are the
# runtime's: the compiler and the runtime raise them at the user too.
__all__ = ["TesseraError", "ArgumentError", "ValueCheckError", "CollectiveTimeout",
           "ShardingError", "ShapeError", "LaunchError", "CompileError", "TracingError",
           "CollectiveMismatch", "InputMismatch"]


class ShardingError(TesseraError, ValueError):
    """A layout that does not fit the tensor or the mesh."""


class ShapeError(TesseraError, ValueError):
    """Operands whose shapes an op cannot take."""


class LaunchError(TesseraError, RuntimeError):
    """The process layout does not match the mesh (wrong number of ranks, ...)."""


class CompileError(TesseraError, RuntimeError):
    """The compiler rejected the program; the message holds MLIR's diagnostics."""


class TracingError(TesseraError, TypeError):
    """A traced tensor used where Python needs its value (an `if` on it,
    `float()`, an index): it has none until the compiled program runs."""


class CollectiveMismatch(TesseraError, RuntimeError):
    """Ranks at different collectives (another kind, axis, shape or dtype)
    where they must make the same one; the message names each call."""


class InputMismatch(TesseraError, ValueError):
    """An argument of a global-view call that the ranks must pass alike (a
    numpy array, a replicated DTensor's block) differs between them."""
