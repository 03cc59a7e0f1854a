"""Nested dicts, lists and tuples of tensors (pytrees): flatten to a list of
leaves and rebuild, so compiled functions can take and return `weights` dicts
and `(loss, weights, state)` tuples as in the design docs."""

from __future__ import annotations


def flatten(tree) -> tuple[list, object]:
    """Leaves in a fixed order (dict keys sorted) and the structure to rebuild."""
    leaves: list = []
    return leaves, _walk(tree, leaves)


# Module-level recursion, not a nested function calling itself: such a
# closure is a reference cycle (function -> cell -> function) that keeps the
# leaves, every argument of a compiled call, alive until the cyclic GC runs;
# a training step's parameters and optimizer state then pile up step after
# step and each run page-faults fresh heap.
def _walk(node, leaves: list):
    if isinstance(node, dict):
        keys = sorted(node, key=str)
        return ("dict", tuple(keys), tuple(_walk(node[k], leaves) for k in keys))
    if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
        return (type(node).__name__, None, tuple(_walk(x, leaves) for x in node))
    leaves.append(node)
    return ("leaf", None, ())


def unflatten(structure, leaves) -> object:
    return _build(structure, iter(leaves))


def _build(node, it):
    kind, keys, children = node
    if kind == "leaf":
        return next(it)
    built = [_build(c, it) for c in children]
    if kind == "dict":
        return dict(zip(keys, built))
    return tuple(built) if kind == "tuple" else built


def paths(tree, prefix: str = "") -> list[str]:
    """A readable name per leaf, in `flatten` order: `weights.wq`, `batch.0`."""
    if isinstance(tree, dict):
        return [p for k in sorted(tree, key=str)
                for p in paths(tree[k], f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return [p for i, x in enumerate(tree) for p in paths(x, f"{prefix}.{i}" if prefix else str(i))]
    return [prefix or "arg"]
