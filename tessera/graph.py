"""Inspecting what the compiler does (`tessera.graph`)."""

from __future__ import annotations

from tessera_compiler.lowering import Levels, collective_report

from .autodiff import grad
from .compiler import CompiledFunction, compile as _compile
from .machine import machine as describe
from .pipeline import pipeline, stage

__all__ = ["Trace", "trace", "backward", "training_step", "stage", "pipeline"]


class Trace:
    """The IR of a function at every level: `graph` (as traced), `partitioned`,
    `schedule`, `tile`, and the generated `cpp` and `cuda` kernel sources."""

    def __init__(self, name: str, levels: Levels):
        self.name = name
        self.levels = levels

    def __getattr__(self, level):
        levels = self.__dict__.get("levels")
        if levels is not None and level in dict(levels.items()):
            return getattr(levels, level)
        raise AttributeError(level)

    def __getitem__(self, level):
        return dict(self.levels.items())[level]

    @property
    def collectives(self) -> list:
        """Every collective the partitioner inserted (op, axis, bytes per rank,
        local shape, the Python line that needed it), in program order."""
        return self.levels.collectives

    @property
    def attention(self) -> list[str]:
        """How each attention whose sequence is split (context parallelism)
        is partitioned, with its Python line: exchanged for heads by
        all-to-all (Ulysses), or gathered."""
        return self.levels.attention

    def report(self, min_bytes: int = 0) -> str:
        """A table of the collectives moving at least `min_bytes` per rank,
        largest first: where an expensive reshard (a full gather) comes from."""
        return collective_report(self.name, self.collectives, min_bytes)

    def cost(self, machine="cpu", ranks_per_node: int | None = None):
        """The cost model's prediction of one call on every rank of the mesh
        (`tessera_compiler.cost`): `.step_s`, `.ranks[r].parts` (compute,
        comm exposed / hidden, runtime, call, in seconds), `.table()`.
        `machine`: "cpu" (this host, calibrated once with as many ranks as
        the mesh has, or `ranks_per_node`), "h100-node", "h200-node" or a
        `Machine`."""
        from tessera_compiler.cost import estimate
        ranks = 1
        mesh = self.levels.module and _mesh_size(self.levels.module)
        if mesh:
            ranks = mesh
        return estimate(self.levels.module, describe(machine, ranks=ranks_per_node or ranks))

    def __str__(self) -> str:
        parts = []
        for level, text in self.levels.items():
            parts.append(f"// ===== {self.name}: {level} =====\n{text}")
        return "\n".join(parts)


def _mesh_size(module) -> int:
    from tessera_compiler.ir.sharding import meshes_of
    import math
    meshes = meshes_of(module)
    return math.prod(next(iter(meshes.values())).shape) if meshes else 1


def trace(fn, *args, mesh=None, target=None, **kwargs) -> Trace:
    """Lowers `fn` on `args` (DTensors or numpy arrays) through every level
    without running it; works in a single process for any mesh. `target`
    is "cpu" (matmuls call BLAS), "gpu" (matmuls are Tile IR GEMMs) or a
    `ts.TargetOptions`; by default a compiled `fn`'s own target (else
    TESSERA_TARGET, else "cpu")."""
    compiled = fn if isinstance(fn, CompiledFunction) else CompiledFunction(fn, mesh)
    return Trace(compiled.fn.__name__, compiled.lower(*args, target=target, **kwargs))


#: `graph.backward(loss)` (in a `training_step`): the training guide's name
#: for `ts.grad` (with respect to the parameters the step captures, or `wrt`).
backward = grad


def training_step(fn=None, *, module: str | None = None, mesh=None):
    """`@graph.training_step(module="Transformer")`: compiles a step that calls
    `graph.backward(loss)` and returns `(grads, metrics)`; the parameters are
    the arrays/DTensors the step reads from outside, and `grads` is a dict by
    their names."""

    def wrap(f):
        compiled = _compile(f, mesh=mesh)
        compiled.module = module or f.__name__
        return compiled
    return wrap if fn is None else wrap(fn)
