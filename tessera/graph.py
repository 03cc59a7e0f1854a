"""Inspecting what the compiler does (`tessera.graph`)."""

from __future__ import annotations

from tessera_compiler.pipeline import Levels

from .compiler import CompiledFunction


class Trace:
    """The IR of a function at every level: `graph` (as traced), `partitioned`,
    `schedule`, `tile`, and the generated `cpp` and `cuda` kernel sources."""

    def __init__(self, name: str, levels: Levels):
        self.name = name
        self.levels = levels

    def __getattr__(self, stage):
        levels = self.__dict__.get("levels")
        if levels is not None and stage in dict(levels.items()):
            return getattr(levels, stage)
        raise AttributeError(stage)

    def __getitem__(self, stage):
        return dict(self.levels.items())[stage]

    def __str__(self) -> str:
        parts = []
        for stage, text in self.levels.items():
            parts.append(f"// ===== {self.name}: {stage} =====\n{text}")
        return "\n".join(parts)


def trace(fn, *args, mesh=None) -> Trace:
    """Lowers `fn` on `args` (DTensors or numpy arrays) through every level
    without running it; works in a single process for any mesh."""
    compiled = fn if isinstance(fn, CompiledFunction) else CompiledFunction(fn, mesh)
    return Trace(compiled.fn.__name__, compiled.lower(*args))
