"""`@ts.distribute(strategy=...)`: parallelism strategies as layouts.

A strategy only decides where the arrays passed to a compiled function live;
the compiler derives every collective from those layouts, as for hand-written
ShardSpecs.

    @ts.jit
    @ts.distribute(strategy="data_parallel")
    def step(params, opt_state, batch):
        loss, grads = ts.value_and_grad(loss_fn)(params, batch)
        params, opt_state = opt.update(params, grads, opt_state)
        return loss, params, opt_state

data_parallel
    A mesh of every rank on one axis (`axis`, default "dp"), unless `mesh=` is
    given. Arrays under the `batch` arguments are split along their first
    dimension over it; everything else is replicated. The loss is a mean over
    the global batch, so the gradient each rank contributes is a pending
    partial sum that the compiler all-reduces: averaged gradients. The batch
    every rank passes is the global one (the ranks check they agree); with
    `batch_is_local=True` each rank passes its own rows instead and the
    global batch is all of them (`dist.from_local`).

zero_redundancy_optimizer
    As data_parallel, and arrays under the `state` arguments (optimizer
    moments) are split over the axis along their first evenly divisible
    dimension. Gradients are then reduce-scattered rather than all-reduced,
    the optimizer updates each rank's block, and parameters come back split:
    the next step all-gathers them where it uses them. Optimizer memory per
    rank falls by the axis size. A function with no batch argument is an
    optimizer step written per rank (the training guide's
    `zero_optimizer_step`: each rank updates the parameters it owns and
    `ts.distributed.recv_from(owner, name)` the others): per-rank code
    (`dist.spmd`) over its arguments.

tensor_parallel
    Arrays are placed by `layouts` (a function `(path, array) -> ShardSpec`),
    e.g. the Megatron layout in examples/train_gpt.py. Without `layouts` the
    function is per-rank code (`dist.spmd`) over the blocks of its DTensor
    arguments, with explicit collectives, as the training guide writes
    `tensor_parallel_linear`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from . import _dtensor
from ._checks import check_callable
from ._source import user_frame
from .compiler import CompiledFunction
from .errors import ArgumentError
from .local_view import spmd
from .mesh import auto

STRATEGIES = ("data_parallel", "zero_redundancy_optimizer", "tensor_parallel")


@dataclass(frozen=True)
class Strategy:
    name: str
    mesh: _dtensor.Mesh | None
    axis: str
    batch: tuple[str, ...]
    state: tuple[str, ...]
    layouts: object = None
    #: the batch arguments hold each rank's own rows (dist.from_local), not
    #: the global batch every rank passes alike
    batch_is_local: bool = False

    @property
    def scatter_axes(self) -> tuple[str, ...]:
        return (self.axis,) if self.name == "zero_redundancy_optimizer" else ()

    def mesh_for(self) -> _dtensor.Mesh:
        if self.mesh is not None:
            return self.mesh
        return auto((self.axis,))

    def place_all(self, paths: list, leaves: list, mesh: _dtensor.Mesh) -> tuple[list, list]:
        """Every leaf as the strategy lays it out (see `place`), and each as
        the ranks must agree on it: a global array as passed, a local batch
        (`batch_is_local`: each rank's blocks of the global batch, placed
        together with one agreement between the ranks) as its DTensor."""
        if not self.batch_is_local:
            return [self.place(p, leaf, mesh) for p, leaf in zip(paths, leaves)], leaves
        local = [i for i, (p, leaf) in enumerate(zip(paths, leaves))
                 if p.split(".")[0] in self.batch and isinstance(leaf, (np.ndarray, np.generic))
                 and np.ndim(leaf)]
        placed = [leaf if i in local else self.place(p, leaf, mesh)
                  for i, (p, leaf) in enumerate(zip(paths, leaves))]
        if local:
            blocks = _dtensor.local_blocks([(paths[i], leaves[i]) for i in local], self.axis, 0,
                                       mesh, "ts.distribute(batch_is_local=True)", user_frame())
            for i, block in zip(local, blocks):
                placed[i] = block
        return placed, [placed[i] if i in local else leaf for i, leaf in enumerate(leaves)]

    def place(self, path: str, leaf, mesh: _dtensor.Mesh):
        """`leaf` (the argument at `path`, e.g. `batch.inputs`) as the strategy
        lays it out; DTensors and non-arrays pass through."""
        if isinstance(leaf, _dtensor.DTensor) or not isinstance(leaf, (np.ndarray, np.generic)):
            return leaf
        arg = path.split(".")[0]
        array = np.asarray(leaf)
        spec = None
        if self.layouts is not None:
            spec = self.layouts(path, array)
        elif arg in self.batch and array.ndim:
            spec = _dtensor.ShardSpec((0,), (self.axis,))
        elif arg in self.state and self.name == "zero_redundancy_optimizer":
            n = mesh.axis_size(self.axis)
            dim = next((d for d, size in enumerate(array.shape) if size % n == 0 and size >= n),
                       None)
            spec = _dtensor.ShardSpec((dim,), (self.axis,)) if dim is not None else None
        return _dtensor.from_numpy(array, layout=spec or _dtensor.ShardSpec(), mesh=mesh, name=path)


    def check_split(self, fn_name: str, arg_names, placed) -> None:
        """A data-parallel strategy that splits nothing would run the whole
        batch on every rank, silently: refuse it, naming what it saw."""
        if self.name not in ("data_parallel", "zero_redundancy_optimizer"):
            return
        if any(isinstance(leaf, _dtensor.DTensor) and any(self.axis in d for d in leaf.dims)
               for leaf in placed):
            return
        seen = ", ".join(dict.fromkeys(arg_names)) or "none"
        raise _dtensor.ShardingError(
            f"{fn_name}: ts.distribute(strategy={self.name!r}) found no batch to split over "
            f"'{self.axis}': it splits the arrays under the arguments named "
            f"{', '.join(repr(b) for b in self.batch)}, and {fn_name} takes {seen}. Name the "
            f"batch argument: ts.distribute(strategy={self.name!r}, batch=(\"mbs\",)).")


def _takes(f, names) -> bool:
    """Whether `f` has a parameter named in `names`."""
    try:
        params = inspect.signature(f).parameters
    except (TypeError, ValueError):
        return True
    return any(n in params for n in names)


def distribute(fn=None, *, strategy: str = "data_parallel", mesh: _dtensor.Mesh | None = None,
               axis: str = "dp", batch=("batch", "microbatches"),
               state=("opt_state", "optimizer_state", "state"), layouts=None,
               mesh_axes=None, batch_is_local: bool = False):
    """Compile `fn` with a parallelism strategy (see the module docstring).
    `batch` and `state` name the arguments that hold the batch and the
    optimizer state; `mesh_axes=["tp"]` is accepted as the design docs write
    it and names the axis. `batch_is_local=True`: each rank passes its own
    batch (the DDP habit), and the global batch is every rank's rows in
    axis order (`dist.from_local`), so a mean loss is the mean over all of
    them; by default the batch is global, the same on every rank, and split."""
    if strategy not in STRATEGIES:
        raise ArgumentError(f"ts.distribute: unknown strategy {strategy!r} (known: "
                            f"{', '.join(STRATEGIES)})  [{user_frame()}]")
    if mesh is not None:
        _dtensor.check_mesh("ts.distribute", mesh)
    if mesh_axes:
        axis = list(mesh_axes)[0]
    if not isinstance(axis, str):
        raise ArgumentError(f"ts.distribute: axis {axis!r} must be a mesh axis name (a str)  "
                            f"[{user_frame()}]")
    if mesh is not None and axis not in mesh.axes:
        raise _dtensor.ShardingError(f"ts.distribute: axis {axis!r} is not in the {mesh.topology} "
                                 f"(axes: {', '.join(mesh.axes)})  [{user_frame()}]")
    if batch_is_local and strategy not in ("data_parallel", "zero_redundancy_optimizer"):
        raise ArgumentError(f"ts.distribute: batch_is_local=True is for the data-parallel "
                            f"strategies, not {strategy!r}  [{user_frame()}]")
    # One name is one argument (batch="mbs"), not its letters.
    batch = (batch,) if isinstance(batch, str) else batch
    state = (state,) if isinstance(state, str) else state
    for name, names in (("batch", batch), ("state", state)):
        if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
            raise ArgumentError(f"ts.distribute: {name}={names!r} must name arguments (a str or a "
                                f"tuple of strs)  [{user_frame()}]")
    if layouts is not None and not callable(layouts):
        raise ArgumentError(f"ts.distribute: layouts={layouts!r:.40} must be a function "
                            f"(path, array) -> ShardSpec or None  [{user_frame()}]")
    plan = Strategy(strategy, mesh, axis, tuple(batch), tuple(state), layouts,
                    bool(batch_is_local))

    def wrap(f):
        check_callable("ts.distribute", f)
        if (strategy == "tensor_parallel" and layouts is None) or (
                strategy == "zero_redundancy_optimizer" and not _takes(f, batch)):
            # Per-rank code over its arguments' blocks (the training guide's
            # tensor_parallel_linear; its zero_optimizer_step, which takes no
            # batch and updates the parameters its rank owns): the local view.
            return CompiledFunction(spmd(f, mesh=mesh), mesh)
        if isinstance(f, CompiledFunction):
            f.strategy = plan
            return f
        return CompiledFunction(f, mesh, strategy=plan)
    return wrap(fn) if fn is not None else wrap
