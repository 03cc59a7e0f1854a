"""Optimizers and training utilities (`ts.optim`), written with `tessera.op`
so they compile into the training step: AdamW and SGD updates become fused
elementwise kernels, the global norm a few reductions.

State lives in plain dicts of numpy arrays (created outside compiled
functions with `init`), passed in and returned by the step, as in the design
docs' training guide:

    opt = ts.optim.AdamW(lr=3e-4, weight_decay=0.1)
    state = opt.init(params)

    @ts.jit
    def step(params, state, batch):
        loss = loss_fn(params, batch)
        grads = ts.grad(loss, params)
        grads, norm = ts.optim.clip_by_global_norm(grads, 1.0)
        params, state = opt.update(params, grads, state)
        return loss, params, state
"""

from __future__ import annotations

import math

import numpy as np

from . import op, simulation
from ._checks import is_number
from ._dtensor import DTensor, held_by
from ._pytree import flatten, unflatten
from ._source import user_frame
from ._trace import is_tensor
from .autodiff import grad
from .errors import ArgumentError
from .mesh import current

__all__ = ["AdamW", "SGD", "global_norm", "clip_by_global_norm", "accumulate", "tree_sum",
           "accumulate_grad",
           "loss_scale_init", "unscale", "update_loss_scale", "where_finite"]


def _map(fn, *trees):
    leaves = [flatten(t)[0] for t in trees]
    structure = flatten(trees[0])[1]
    return unflatten(structure, [fn(*xs) for xs in zip(*leaves)])


def _check_hyper(api: str, name: str, value, low: float, high: float | None = None,
                 low_open: bool = False) -> None:
    """A hyperparameter given as a Python number must lie in its range
    (`low` <= value, or < with `low_open`; value < `high`); a tensor (a
    traced learning-rate schedule) is taken as is."""
    if is_tensor(value):
        return
    if not is_number(value):
        raise ArgumentError(f"{api}: {name}={value!r:.40} must be a number  [{user_frame()}]")
    if value < low or (low_open and value == low) or (high is not None and not value < high):
        span = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'})"
        raise ArgumentError(f"{api}: {name}={value!r} is out of range {span}  [{user_frame()}]")


def _zeros_like(tree):
    if simulation.active() is not None:         # `tessera simulate`: shapes only
        return _map(lambda x: simulation.placeholder(np.shape(x)), tree)
    return _map(_zeros, tree)


def _zeros(x):
    """float32 zeros shaped like `x`; for a pipeline stage's parameter (a
    DTensor only some ranks hold), zeros held by the same ranks, in its
    layout: a stage's optimizer state is made where the stage runs."""
    if isinstance(x, DTensor) and x.held is not None:
        local = np.zeros(x.local_shape, np.float32) if x.holds() else None
        return held_by(local, x.shape, np.float32, x.layout, x.mesh, x.name, *x.held)
    return np.zeros(np.shape(x), np.float32)


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    p -= lr (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd p).
    Moments are fp32 whatever the parameters' dtype."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        _check_hyper("ts.optim.AdamW", "lr", lr, 0.0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ArgumentError(f"ts.optim.AdamW: betas={betas!r} must be two numbers (beta1, "
                                f"beta2)  [{user_frame()}]")
        for i, b in enumerate(betas):
            _check_hyper("ts.optim.AdamW", f"betas[{i}]", b, 0.0, 1.0)
        _check_hyper("ts.optim.AdamW", "eps", eps, 0.0)
        _check_hyper("ts.optim.AdamW", "weight_decay", weight_decay, 0.0)
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay

    def init(self, params) -> dict:
        return {"step": np.zeros((), np.float32), "m": _zeros_like(params),
                "v": _zeros_like(params)}

    def update(self, params, grads, state, lr=None):
        """(new params, new state); `lr` may be a traced scalar (a schedule)."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        t = op.add(state["step"], 1.0)
        # 1 - b^t with t a tensor: b^t = exp(t log b).
        c1 = op.sub(1.0, op.exp(op.mul(t, math.log(b1))))
        c2 = op.sub(1.0, op.exp(op.mul(t, math.log(b2))))
        step_size = op.div(lr, c1)
        inv_sqrt_c2 = op.rsqrt(c2)
        decay = op.mul(lr, self.weight_decay) if not isinstance(lr, (int, float)) \
            else lr * self.weight_decay
        structure = flatten(params)[1]
        new_p, new_m, new_v = [], [], []
        for p, g, m, v in zip(flatten(params)[0], flatten(grads)[0], flatten(state["m"])[0],
                              flatten(state["v"])[0]):
            g32 = _at_least_f32(g)
            m = op.add(op.mul(m, b1), op.mul(g32, 1.0 - b1))
            v = op.add(op.mul(v, b2), op.mul(op.mul(g32, g32), 1.0 - b2))
            update = op.div(op.mul(m, step_size), op.add(op.mul(op.sqrt(v), inv_sqrt_c2), self.eps))
            if self.weight_decay:
                update = op.add(update, op.mul(p, decay))
            new_p.append(op.sub(p, update.astype(p.dtype) if p.dtype != update.dtype else update))
            new_m.append(m)
            new_v.append(v)
        return unflatten(structure, new_p), {"step": t, "m": unflatten(structure, new_m),
                                             "v": unflatten(structure, new_v)}


class SGD:
    """SGD with momentum and (coupled, L2) weight decay:
    g += wd p;  buf = momentum buf + g;  p -= lr buf."""

    def __init__(self, lr=1e-2, momentum=0.0, weight_decay=0.0):
        _check_hyper("ts.optim.SGD", "lr", lr, 0.0)
        _check_hyper("ts.optim.SGD", "momentum", momentum, 0.0)
        _check_hyper("ts.optim.SGD", "weight_decay", weight_decay, 0.0)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def init(self, params) -> dict:
        return {"momentum": _zeros_like(params)}

    def update(self, params, grads, state, lr=None):
        lr = self.lr if lr is None else lr
        new_p, new_buf = [], []
        p_leaves, structure = flatten(params)
        for p, g, buf in zip(p_leaves, flatten(grads)[0], flatten(state["momentum"])[0]):
            if self.weight_decay:
                g = op.add(g, op.mul(p, self.weight_decay))
            buf = op.add(op.mul(buf, self.momentum), g) if self.momentum else op.add(op.mul(buf, 0.0), g)
            new_buf.append(buf)
            new_p.append(op.sub(p, op.mul(buf, lr)))
        return unflatten(structure, new_p), {"momentum": unflatten(structure, new_buf)}


def _at_least_f32(x):
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


def global_norm(tree):
    """sqrt(sum of squares of every leaf), in fp32 (fp64 for fp64 leaves)."""
    # Every leaf's sum of squares first, then their sum (same order, same
    # bits): on a sharded mesh each leaf's sum is a partial sum that the
    # partitioner all-reduces, and all-reduces whose results are not used yet
    # are bucketed into one (tessera-bucket-collectives). Adding as they
    # came made each sum wait for the one before: 11 all-reduces of 4 bytes
    # a step of the dp x tp GPT.
    squares = [op.sum(op.mul(g, g)) for g in map(_at_least_f32, flatten(tree)[0])]
    total = squares[0]
    for s in squares[1:]:
        total = op.add(total, s)
    return op.sqrt(total)


def clip_by_global_norm(grads, max_norm: float, eps: float = 1e-6):
    """(grads scaled so their global norm is at most `max_norm`, the norm before)."""
    norm = global_norm(grads)
    scale = op.minimum(op.div(max_norm, op.add(norm, eps)), 1.0)
    return _map(lambda g: op.mul(g, scale.astype(g.dtype) if g.dtype != scale.dtype else scale),
                grads), norm


def accumulate(total, grads):
    """total + grads, leaf by leaf (gradient accumulation over microbatches)."""
    return grads if total is None else _map(op.add, total, grads)


def tree_sum(values):
    """The sum of a list of tensors (or pytrees of them) in a binary tree over
    list order, ((v0 + v1) + (v2 + v3)): the same tree a deterministic
    all-reduce uses over ranks, so a sum split across ranks in contiguous
    blocks (of a power-of-two size) gives the same bits as one rank's sum."""
    level = list(values)
    if not level:
        raise ArgumentError(f"ts.optim.tree_sum: values is empty: nothing to sum  "
                            f"[{user_frame()}]")
    while len(level) > 1:
        pairs = [_map(op.add, level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = pairs + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def accumulate_grad(loss_fn, params, microbatches, axis: str = "dp"):
    """(loss, grads): the mean of `loss_fn(params, mb)` over a stack of
    microbatches and its gradient with respect to `params`.

    `microbatches` is a pytree of arrays whose first dimension M counts the
    microbatches. On a mesh with axis `axis` of size d, rank r computes
    microbatches r*M/d ... (r+1)*M/d - 1, one per iteration, each exactly as a
    single device computes it; the gradients are summed over microbatches in a
    binary tree (`tree_sum`) and then across ranks in the same tree, so with M
    and d powers of two and under `dist.deterministic()`, the gradients (and
    the parameters after any number of steps) are the same bits for every d:
    batch-invariant data parallelism. `loss_fn` should average over its
    microbatch (a mean of equal-sized microbatch means is the batch mean)."""
    mesh = current()
    d = mesh.axis_size(axis) if axis in mesh.axes else 1
    leaves, structure = flatten(microbatches)
    count = leaves[0].shape[0]
    for x in leaves:
        if x.shape[0] != count:
            raise ArgumentError(f"ts.optim.accumulate_grad: every microbatch array needs the "
                                f"same leading dimension (microbatches), got {count} and "
                                f"{x.shape[0]}  [{user_frame()}]")
    if count % d:
        raise ArgumentError(f"ts.optim.accumulate_grad: {count} microbatches do not split over "
                            f"the {d} ranks of axis {axis!r}  [{user_frame()}]")
    per_rank = count // d
    # [M, ...] -> [d, M/d, ...]: rank r's block is row r.
    blocks = [op.reshape(x, d, per_rank, *x.shape[1:]) for x in leaves]
    losses, grads = [], []
    for j in range(per_rank):
        # Microbatch j of every rank side by side: [d * b, ...], split over `axis`.
        mb = [op.reshape(x[:, j], d * x.shape[2], *x.shape[3:]) for x in blocks]
        loss = loss_fn(params, unflatten(structure, mb))
        losses.append(loss)
        grads.append(grad(loss, params))
    scale = 1.0 / per_rank
    return (op.mul(tree_sum(losses), scale),
            _map(lambda g: op.mul(g, scale), tree_sum(grads)))


# -- dynamic loss scaling ---------------------------------------------------------

def loss_scale_init(scale: float = 2.0 ** 15) -> dict:
    """State of a dynamic loss scale: the scale and the count of good steps."""
    return {"scale": np.float32(scale), "good_steps": np.float32(0)}


def unscale(grads, scaler):
    """(grads / scale, finite): `finite` is a boolean scalar, false if any
    gradient holds an inf or nan (the step must then be skipped)."""
    inv = op.div(1.0, scaler["scale"])
    grads = _map(lambda g: op.mul(g, inv), grads)
    return grads, op.isfinite(global_norm(grads))


def where_finite(finite, new, old):
    """`new` where the step was finite, else `old` (leaf by leaf): skipping a step."""
    return _map(lambda a, b: op.where(finite, a, b), new, old)


def update_loss_scale(scaler, finite, growth_interval: int = 200, factor: float = 2.0):
    """Halves the scale on overflow (and resets the count); doubles it after
    `growth_interval` finite steps in a row."""
    good = op.add(scaler["good_steps"], 1.0)
    grow = op.greater_equal(good, float(growth_interval))
    scale = op.where(finite, op.where(grow, op.mul(scaler["scale"], factor), scaler["scale"]),
                     op.mul(scaler["scale"], 1.0 / factor))
    good = op.where(finite, op.where(grow, op.mul(good, 0.0), good), op.mul(good, 0.0))
    return {"scale": scale, "good_steps": good}
