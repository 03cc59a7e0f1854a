"""Errors raised by Tessera's Python API. Each names the tensor, dimension or
axis involved and the user's source line where it has one."""


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
