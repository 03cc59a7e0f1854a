"""`tessera.compile`: trace, lower through every IR level, bundle, run.

The first call with a given signature (shapes, dtypes, layouts) traces the
function, lowers it, compiles its kernels and writes a bundle; later calls
reuse the loaded program. Execution always goes through the bundle and the
runtime, exactly as a bundle saved with `.save()` runs elsewhere.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import tessera_runtime
from tessera_compiler.bundle import write_bundle
from tessera_compiler.codegen.build import cache_dir
from tessera_compiler.pipeline import CompileError as _PipelineError
from tessera_compiler.pipeline import Levels, lower

from . import dist
from ._trace import ArgSpec, symbol_name, trace_function
from .errors import CompileError, ShardingError

DUMP_ENV = "TESSERA_DUMP_IR"


class CompiledFunction:
    """A function compiled for a mesh. Call it with DTensors (or numpy arrays,
    taken as replicated)."""

    def __init__(self, fn, mesh: dist.Mesh | None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mesh = mesh
        self.symbol = symbol_name(fn)          # safe in file names and C symbols
        self._params = list(inspect.signature(fn).parameters)
        self._programs: dict = {}
        self._bundles: dict = {}
        self._last_key = None

    # -- signature ----------------------------------------------------------
    def _mesh_for(self, args) -> dist.Mesh:
        meshes = {a.mesh for a in args if isinstance(a, dist.DTensor)}
        if self.mesh is not None:
            meshes.add(self.mesh)
        if len(meshes) > 1:
            raise ShardingError(f"{self.fn.__name__}: arguments live on different meshes "
                                f"({', '.join(m.topology for m in meshes)})")
        if not meshes:
            raise ShardingError(f"{self.fn.__name__}: give tessera.compile a mesh= or pass DTensors")
        return meshes.pop()

    def _as_dtensors(self, args, mesh) -> list[dist.DTensor]:
        params = list(self._param_names(len(args)))
        out = []
        for name, a in zip(params, args):
            if isinstance(a, dist.DTensor):
                out.append(a)
            elif isinstance(a, np.ndarray):
                out.append(dist.from_numpy(a, dist.ShardSpec(), mesh, name=name))
            else:
                raise TypeError(f"{self.fn.__name__}: argument '{name}' is a {type(a).__name__}; "
                                "pass a DTensor or a numpy array")
        return out

    def _param_names(self, n):
        return (self._params + [f"arg{i}" for i in range(len(self._params), n)])[:n]

    def _specs(self, tensors) -> list[ArgSpec]:
        return [ArgSpec(name, t.shape, t.dtype, tuple(t.dims), tuple(t.layout.partial))
                for name, t in zip(self._param_names(len(tensors)), tensors)]

    # -- compilation ----------------------------------------------------------
    def lower(self, *args) -> Levels:
        """Every IR level and the kernel sources for these arguments (no execution)."""
        mesh = self._mesh_for(args)
        return self._lower(self._specs(self._as_dtensors(args, mesh)), mesh)

    def _lower(self, specs, mesh) -> Levels:
        module, _ = trace_function(self.fn, specs, mesh)
        with module.context:
            try:
                return lower(module)
            except _PipelineError as err:
                raise CompileError(f"compiling {self.fn.__name__} failed:\n{err}") from None

    def _bundle(self, specs, mesh) -> Path:
        key = tuple(specs)
        if key in self._bundles:
            return self._bundles[key]
        levels = self._lower(specs, mesh)
        digest = hashlib.sha256(levels.graph.encode()).hexdigest()[:20]
        target = cache_dir().parent / "bundles" / f"{self.symbol}-{digest}.tsb"
        if not (target / "manifest.json").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
            write_bundle(tmp / "b", levels, devices=mesh.device_ids)
            try:
                os.rename(tmp / "b", target)
            except OSError:
                pass  # another rank wrote the same bundle first
            shutil.rmtree(tmp, ignore_errors=True)
        self._dump(levels, mesh)
        self._bundles[key] = target
        return target

    def _dump(self, levels: Levels, mesh) -> None:
        out = os.environ.get(DUMP_ENV)
        if not out or tessera_runtime.world()[0] != 0:
            return
        folder = Path(out) / self.symbol
        folder.mkdir(parents=True, exist_ok=True)
        for stage, text in levels.items():
            ext = {"cpp": "cpp", "cuda": "cu"}.get(stage, "mlir")
            (folder / f"{stage}.{ext}").write_text(text)
        print(f"[tessera] IR of {self.fn.__name__} at every level written to {folder}/",
              file=sys.stderr)

    # -- execution ------------------------------------------------------------
    def __call__(self, *args):
        mesh = self._mesh_for(args)
        tensors = self._as_dtensors(args, mesh)
        specs = self._specs(tensors)
        mesh.require_rank(f"calling {self.fn.__name__}")
        if mesh.size > 1:
            dist.install_abort_on_error()
        key = tuple(specs)
        program = self._programs.get(key)
        if program is None:
            program = tessera_runtime.load_bundle(self._bundle(specs, mesh))
            self._programs[key] = program
        self._last_key = key
        outputs = program.run([t.local() for t in tensors])
        results = []
        for spec, local in zip(program.outputs, outputs):
            layout = dist.ShardSpec.from_dims(spec.sharding.dims, spec.sharding.partial)
            results.append(dist.DTensor(local, spec.global_shape, local.dtype, layout, mesh,
                                        name=f"{self.fn.__name__}.{spec.name}"))
        return results[0] if len(results) == 1 else tuple(results)

    def save(self, path) -> Path:
        """Copies the bundle of the last call to `path` (a directory)."""
        if self._last_key is None:
            raise RuntimeError(f"{self.fn.__name__} has not been called yet; call it once "
                               "so its signature is known, then save()")
        path = Path(path)
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(self._bundles[self._last_key], path)
        return path


def compile(fn=None, *, mesh: dist.Mesh | None = None):
    """Compile `fn` for `mesh`. Use as `@tessera.compile(mesh=mesh)` or
    `tessera.compile(fn, mesh=mesh)`."""
    if fn is None:
        return lambda f: CompiledFunction(f, mesh)
    return CompiledFunction(fn, mesh)
