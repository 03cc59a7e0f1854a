"""Structure figures of Tessera's Python source, to compare a change before and
after (issue 61 quotes them): functions longer than 80 lines, and each
package's import-cycle groups (strongly connected components of the module
import graph, imports inside functions included).

The import graph is the one `test/test_layers.py` checks (its parsing is
reused, so the two never disagree about what an import is). Lines of C++ in
Python strings are counted by `bench/cpp_in_strings.py`.

    .venv/bin/python bench/code_stats.py             # the checkout
    .venv/bin/python bench/code_stats.py --root DIR  # another tree (e.g. a
                                                     # `git worktree` of the base)
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The packages measured, and where their source lives under a tree's root.
PACKAGES = {"tessera": "tessera", "tessera_compiler": "tessera_compiler",
            "tessera_passes": "passes/tessera_passes",
            "tessera_runtime": "runtime/tessera_runtime"}
LONG = 80


def _layers_module():
    """test/test_layers.py of this checkout, for its import parsing."""
    spec = importlib.util.spec_from_file_location("_test_layers", ROOT / "test" / "test_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def long_functions(modules: dict[str, Path], root: Path,
                   limit: int = LONG) -> tuple[int, list[tuple[str, int]]]:
    """(how many functions there are, [(file:line name, lines)] of those over
    `limit` lines, longest first). A function's lines run from its `def` (or
    first decorator) to its last statement; nested functions count on their own."""
    total, long = 0, []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                total += 1
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = node.end_lineno - first + 1
                if lines > limit:
                    long.append((f"{path.relative_to(root)}:{node.lineno} {node.name}", lines))
    return total, sorted(long, key=lambda item: (-item[1], item[0]))



def import_graph(layers, modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the Tessera modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, _, target, _, _ in layers._edges(modules):
        owner = layers._owner(target, modules)
        if owner and owner != name:
            graph[name].add(owner)
    return graph


def cycle_groups(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's,
    iterative), each sorted, largest first."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups, key=lambda g: (-len(g), g))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to measure (default: this checkout)")
    parser.add_argument("--list", action="store_true", help="list every cycle group's modules")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    layers = _layers_module()
    modules = layers._modules({p: root / d for p, d in PACKAGES.items()})
    total, long = long_functions(modules, root)
    print(f"functions over {LONG} lines: {len(long)} of {total}")
    for where, lines in long:
        print(f"  {lines:4d}  {where}")
    graph = import_graph(layers, modules)
    groups = cycle_groups(graph)
    # test/test_layers.py does not count a package's __init__ importing its
    # own submodules (or they it) as a cycle: the second figure leaves those
    # edges out.
    inner = cycle_groups({m: {n for n in ns if not (m.startswith(n + ".") or n.startswith(m + "."))}
                          for m, ns in graph.items()})
    print("import-cycle groups per package (sizes; without package <-> own submodule edges):")
    for package in PACKAGES:
        count = sum(1 for m in modules if m.split(".")[0] == package)
        mine = [g for g in groups if g[0].split(".")[0] == package]
        strict = [g for g in inner if g[0].split(".")[0] == package]
        sizes = ", ".join(str(len(g)) for g in mine) or "-"
        strict_sizes = ", ".join(str(len(g)) for g in strict) or "-"
        print(f"  {package:17s} {len(mine)} groups ({sizes}) of {count} modules; "
              f"{len(strict)} groups ({strict_sizes}) without")
    across = [g for g in groups if len({m.split('.')[0] for m in g}) > 1]
    print(f"  groups spanning packages: {len(across)}")
    if args.list:
        for g in groups:
            print("  group: " + " ".join(g))
    return 0


if __name__ == "__main__":
    sys.exit(main())
