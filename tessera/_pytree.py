"""Nested dicts, lists and tuples of tensors (pytrees): flatten to a list of
leaves and rebuild, so compiled functions can take and return `weights` dicts
and `(loss, weights, state)` tuples as in the design docs."""

from __future__ import annotations


def flatten(tree) -> tuple[list, object]:
    """Leaves in a fixed order (dict keys sorted) and the structure to rebuild."""
    leaves: list = []

    def walk(node):
        if isinstance(node, dict):
            keys = sorted(node, key=str)
            return ("dict", tuple(keys), tuple(walk(node[k]) for k in keys))
        if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
            return (type(node).__name__, None, tuple(walk(x) for x in node))
        leaves.append(node)
        return ("leaf", None, ())

    return leaves, walk(tree)


def unflatten(structure, leaves) -> object:
    it = iter(leaves)

    def build(node):
        kind, keys, children = node
        if kind == "leaf":
            return next(it)
        built = [build(c) for c in children]
        if kind == "dict":
            return dict(zip(keys, built))
        return tuple(built) if kind == "tuple" else built

    return build(structure)


def paths(tree, prefix: str = "") -> list[str]:
    """A readable name per leaf, in `flatten` order: `weights.wq`, `batch.0`."""
    if isinstance(tree, dict):
        return [p for k in sorted(tree, key=str)
                for p in paths(tree[k], f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return [p for i, x in enumerate(tree) for p in paths(x, f"{prefix}.{i}" if prefix else str(i))]
    return [prefix or "arg"]
