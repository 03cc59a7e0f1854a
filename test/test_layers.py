"""The compiler's layers, checked on its source (every import statement,
including those inside functions, so a lazy back edge is caught too):

    tessera_mlir          the generated bindings
    tessera_compiler.ir   the bottom layer: builders, types, attributes, options,
                          the op table, pass support; imports only tessera_mlir
    tessera_passes        passes (one module each) and their helpers
                          (sharding_rules, tile/): import the bottom layer and
                          the bindings; a pass never imports another pass
    tessera_compiler.codegen
                          Tile IR -> source; imports the bottom layer
    tessera_compiler      pipeline, bundle, tessera-opt/-translate: the top of
                          the compiler
    tessera               the user API: the compiler's top and bottom layers and
                          the runtime (the runtime imports none of them:
                          test/runtime/test_runtime_imports.py)
    tessera_runtime.env   the one module that reads the environment, which any
                          layer but the bottom one may import
    tessera_runtime.routines
                          the library routines' one declaration (a contract
                          between the compiler and the runtime, so it lives
                          in the package both may read): every layer may
                          import it, the bottom one included; it imports no
                          Tessera module (the standard library only)
    tessera_runtime.errors
                          the errors every layer raises at the user
                          (TesseraError, ArgumentError) and the walk to the
                          user's line: like routines, below every layer
    tessera_runtime.random
                          the counter-based generator dropout draws from (a
                          contract between the kernels the compiler prints
                          and the runtime's routine, like routines): the
                          compiler's layers above the bottom may import it;
                          it imports numpy only

No module imports a private name (`_x`) of another module, and the
compiler's modules import each other without cycles.

`tessera/`, the user API, has layers of its own (TESSERA_LAYERS; a module
imports its own layer and those below, and no module of it takes part in an
import cycle, except the edges of TESSERA_BACK_EDGES, each with its reason):

    base          errors, _source, _checks, dtypes, types, _pytree, _mpi,
                  _context (what is being traced or simulated now), profiling,
                  machine (machine descriptions for the cost model)
    tensors       _dtensor (meshes, layouts, DTensors), mesh, simulation,
                  _rank_agreement, checkpoint, elastic
    tracing       _trace (Python -> Graph IR), autodiff, remat
    compile       autotune, compiler
    ops           _primitives (the op primitives; eager through the compiler)
    per-rank      local_view (dist.spmd), collectives, strategy, pipeline, schedule
    models        _moe (moe), models (transformer_block), pretrained (Hugging Face checkpoints)
    namespaces    op, dist, nn: what the user imports, gathered from the layers below
    training      optim, graph
    top           tessera (the package), cli, __main__, calibration (runs programs
                  to measure this host)
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"tessera": REPO / "tessera", "tessera_compiler": REPO / "tessera_compiler",
            "tessera_passes": REPO / "passes" / "tessera_passes",
            "tessera_runtime": REPO / "runtime" / "tessera_runtime"}


def _modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    mods = {}
    for package, root in packages.items():
        for f in sorted(root.rglob("*.py")):
            parts = [package] + list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """`path` parsed (once: every check reads every module)."""
    return ast.parse(path.read_text(), str(path))


def _imports(name: str, path: Path, modules: dict) -> list[tuple[str, list[str], int]]:
    """(module imported, names imported from it, line) for every import in
    `path` (module `name`), relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [a.name for a in node.names]
            # `from pkg import module` imports the module pkg.module (and
            # runs pkg's __init__, as any import of a submodule does).
            submodules = [n for n in names if f"{target}.{n}" in modules]
            if len(submodules) < len(names):
                out.append((target, names, node.lineno))
            out += [(f"{target}.{n}", [], node.lineno) for n in submodules]
    return out


def _owner(target: str, modules: dict) -> str | None:
    """The Tessera module `target` (a dotted name) is, or is inside."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _passes() -> set[str]:
    import tessera_passes
    return {f"tessera_passes.{info.module}" for info in tessera_passes.PASSES.values()}


def layer_of(module: str) -> str:
    if module == "tessera_runtime.env":
        return "env"
    if module == "tessera_runtime.routines":
        return "routines"
    if module == "tessera_runtime.errors":
        return "errors"
    if module == "tessera_runtime.random":
        return "random"
    if module.startswith("tessera_compiler.ir"):
        return "ir"
    if module.startswith("tessera_compiler.codegen"):
        return "codegen"
    if module.startswith("tessera_compiler"):
        return "compiler"
    return module.split(".")[0]


#: For each layer, the Tessera layers and top-level packages it may import.
#: `env` is tessera_runtime.env, the one module that reads the environment
#: (every layer above the bottom one may ask it).
#: `routines` is tessera_runtime.routines, the library routines' table
#: (every layer reads it; it reads no Tessera module).
#: `errors` is tessera_runtime.errors, the errors every layer raises at the
#: user (TesseraError, ArgumentError) and how one finds the user's line
#: (every layer reads it; it reads no Tessera module).
#: `random` is tessera_runtime.random, dropout's generator (printed kernels
#: and the runtime's routine draw the same words; it reads no Tessera module).
ALLOWED = {
    "ir": {"ir", "tessera_mlir", "routines", "errors"},
    "tessera_passes": {"ir", "tessera_passes", "tessera_mlir", "env", "routines", "errors",
                       "random"},
    "codegen": {"ir", "codegen", "tessera_mlir", "env", "routines", "errors", "random"},
    "compiler": {"ir", "codegen", "compiler", "tessera_passes", "tessera_mlir", "env", "routines",
                 "errors", "random"},
    "tessera": {"ir", "compiler", "codegen", "tessera", "tessera_runtime", "tessera_mlir", "env",
                "routines", "errors", "random"},
    "routines": set(),
    "errors": set(),
    "random": set(),
}
TESSERA_TOPS = {"tessera", "tessera_compiler", "tessera_passes", "tessera_runtime", "tessera_mlir"}


def _edges(modules: dict) -> tuple:
    """(module, path, module imported, names, line) of every import of a
    Tessera package by `modules`."""
    return _edges_of(tuple(modules.items()))


@functools.lru_cache(maxsize=None)
def _edges_of(items: tuple) -> tuple:
    modules = dict(items)
    return tuple((name, path, target, names, line) for name, path in items
                 for target, names, line in _imports(name, path, modules)
                 if target.split(".")[0] in TESSERA_TOPS)


def layering_violations(modules: dict) -> list[str]:
    """Imports of a layer its module's layer may not import."""
    bad = []
    for name, path, target, _, line in _edges(modules):
        layer = layer_of(name)
        if layer not in ALLOWED:
            continue
        owner = _owner(target, modules)
        to = layer_of(owner) if owner else target.split(".")[0]
        if to not in ALLOWED[layer]:
            bad.append(f"{path}:{line}: {name} ({layer}) imports {target} ({to})")
    return bad


def pass_imports(modules: dict, passes: set[str]) -> list[str]:
    """Imports of a pass module by another module of tessera_passes."""
    bad = []
    for name, path, target, _, line in _edges(modules):
        owner = _owner(target, modules)
        if name.startswith("tessera_passes") and owner in passes and owner != name:
            bad.append(f"{path}:{line}: {name} imports the pass {owner}")
    return bad


def private_imports(modules: dict) -> list[str]:
    """`from m import _x`, or `m._x` on an imported module m, where m is
    another Tessera module."""
    bad = []
    for name, path, target, names, line in _edges(modules):
        if target not in modules or target == name:
            continue
        for n in names:
            if n.startswith("_") and not n.startswith("__"):
                bad.append(f"{path}:{line}: {name} imports {target}.{n}")
    for name, path in modules.items():
        tree = _tree(path)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules and a.asname:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for a in node.names:
                    if f"{node.module}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                bad.append(f"{path}:{node.lineno}: {name} reads "
                           f"{aliases[node.value.id]}.{node.attr}")
    return bad


#: tessera/'s layers, lowest first (see the module docstring); a module not
#: listed is an error (test_every_tessera_module_has_a_layer).
TESSERA_LAYERS = {
    "base": {"errors", "_source", "_checks", "dtypes", "types", "_pytree", "_mpi", "_context",
             "profiling", "machine"},
    "tensors": {"_dtensor", "mesh", "simulation", "_rank_agreement", "checkpoint", "elastic"},
    "tracing": {"_trace", "autodiff", "remat"},
    "compile": {"autotune", "compiler"},
    "ops": {"_primitives"},
    "per-rank": {"local_view", "collectives", "strategy", "pipeline", "schedule"},
    "models": {"_moe", "models", "pretrained"},
    "namespaces": {"op", "dist", "nn"},
    "training": {"optim", "graph"},
    "top": {"", "cli", "__main__", "calibration"},
}
#: The imports of tessera/ that go down against the layers (each inside the
#: function that needs it), with why; the cycle checks leave them out.
TESSERA_BACK_EDGES = {
    ("tessera._trace", "tessera._primitives"):
        "a traced tensor's operators (a + b, a @ b, a[i]) are the op primitives, which "
        "build on Traced",
    ("tessera._dtensor", "tessera.compiler"):
        "DTensor.redistribute (.replicate, .shard) moves a tensor by running a small "
        "compiled program, and the compiler takes DTensors",
}


def tessera_layer_of(module: str, layers: dict = TESSERA_LAYERS) -> str | None:
    rest = module.partition(".")[2]
    return next((layer for layer, names in layers.items() if rest in names), None)


def tessera_layer_violations(modules: dict, layers: dict = TESSERA_LAYERS,
                             back_edges=TESSERA_BACK_EDGES) -> list[str]:
    """Imports between tessera/'s modules against TESSERA_LAYERS' order."""
    order = list(layers)
    bad = []
    for name, path, target, _, line in _edges(modules):
        owner = _owner(target, modules)
        if name.split(".")[0] != "tessera" or not owner or owner.split(".")[0] != "tessera" \
                or owner == name or (name, owner) in back_edges:
            continue
        frm, to = tessera_layer_of(name, layers), tessera_layer_of(owner, layers)
        if frm is None or to is None:
            bad.append(f"{path}:{line}: {name} or {owner} has no layer in TESSERA_LAYERS")
        elif order.index(to) > order.index(frm):
            bad.append(f"{path}:{line}: {name} ({frm}) imports {owner} ({to})")
    return bad


def import_cycles(modules: dict, packages=("tessera_compiler", "tessera_passes"),
                  back_edges=frozenset()) -> list[str]:
    """Cycles among the imports of `packages`' modules, imports inside
    functions included, leaving out `back_edges` (a package's __init__
    importing its own submodules is none)."""
    graph: dict[str, set[str]] = {}
    for name, _, target, _, _ in _edges(modules):
        owner = _owner(target, modules)
        if owner and owner != name and name.split(".")[0] in packages \
                and owner.split(".")[0] in packages and (name, owner) not in back_edges:
            graph.setdefault(name, set()).add(owner)
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if m.startswith(n + ".") or n.startswith(m + "."):
                continue
            if state.get(n) == "open":
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_each_layer_imports_only_the_layers_below_it():
    bad = layering_violations(MODULES)
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_passes_import_no_other_pass():
    """Passes share code through the bottom layer or this package's helper
    modules (sharding_rules, tile/), never by importing each other; helpers
    import no pass."""
    passes = _passes()
    assert len(passes) >= 6, passes
    bad = pass_imports(MODULES, passes)
    assert not bad, "\n".join(bad)


def test_no_private_name_crosses_a_module_boundary():
    """`from m import _x` (or `m._x` on an imported module m) reaches into
    another module's internals: make the name public where it belongs."""
    bad = private_imports(MODULES)
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_compiler_modules_import_each_other_without_cycles():
    cycles = import_cycles(MODULES)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_every_tessera_module_has_a_layer():
    missing = [m for m in MODULES if m.split(".")[0] == "tessera" and tessera_layer_of(m) is None]
    assert not missing, f"add these to TESSERA_LAYERS (test/test_layers.py): {missing}"


def test_tessera_modules_import_only_their_layer_and_those_below():
    bad = tessera_layer_violations(MODULES)
    assert not bad, "imports against tessera/'s layers:\n" + "\n".join(bad)


def test_tessera_modules_import_each_other_without_cycles():
    """Counting imports inside functions: a lazy import hides a cycle from
    Python, not from the reader. A module-level cycle is caught as well."""
    cycles = import_cycles(MODULES, ("tessera",), TESSERA_BACK_EDGES)
    assert not cycles, "import cycles in tessera/:\n" + "\n".join(cycles)


def test_every_allowed_back_edge_is_still_an_import():
    """An allowed back edge that no longer exists is a stale excuse."""
    edges = {(n, _owner(t, MODULES)) for n, _, t, _, _ in _edges(MODULES)}
    stale = [f"{a} -> {b}" for a, b in TESSERA_BACK_EDGES if (a, b) not in edges]
    assert not stale, "remove from TESSERA_BACK_EDGES: " + ", ".join(stale)


def test_the_tessera_checks_catch_a_lazy_back_edge_and_a_cycle(tmp_path):
    """The tessera/ checks on a small tree: a lazy import up the layers (and
    the cycle it closes) is caught, an allowed one is not."""
    files = {
        "tessera/__init__.py": "from . import op\n",
        "tessera/errors.py": "",
        "tessera/_trace.py": "def f():\n    from . import op\n",                 # allowed
        "tessera/compiler.py": "from . import _trace\n"
                               "def g():\n    from .op import relu\n",          # back edge
        "tessera/op.py": "from . import compiler, errors\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    fake = _modules({"tessera": tmp_path / "tessera"})
    layers = {"base": {"errors"}, "tracing": {"_trace"}, "compile": {"compiler"},
              "namespaces": {"op"}, "top": {""}}
    allowed = {("tessera._trace", "tessera.op"): "(a reason)"}
    assert [v.split(": ", 1)[1] for v in tessera_layer_violations(fake, layers, allowed)] == [
        "tessera.compiler (compile) imports tessera.op (namespaces)"]
    assert import_cycles(fake, ("tessera",), allowed) == [
        "tessera.compiler -> tessera.op -> tessera.compiler"]
    assert len(import_cycles(fake, ("tessera",))) == 2


def test_the_checks_catch_a_back_edge_a_pass_import_a_private_name_and_a_cycle(tmp_path):
    """The checks above, on a small tree that breaks each rule once (they
    would pass vacuously on a tree they cannot read)."""
    files = {
        "tessera_compiler/__init__.py": "",
        "tessera_compiler/ir/__init__.py": "",
        "tessera_compiler/ir/types.py": "import tessera_passes.alpha\n"           # back edge
                                        "from tessera_runtime import routines\n",  # allowed
        "tessera_compiler/codegen/__init__.py": "",
        "tessera_compiler/codegen/a.py": "from .b import _helper\n",            # private; cycle
        "tessera_compiler/codegen/b.py": "from . import a\n_helper = 1\n",
        "tessera_passes/__init__.py": "",
        "tessera_passes/alpha.py": "from tessera_compiler.ir import types\n",
        "tessera_passes/beta.py": "from . import alpha\n",                       # pass -> pass
        "tessera_runtime/__init__.py": "",
        "tessera_runtime/env.py": "",
        "tessera_runtime/routines.py": "from . import env\n",         # the table imports
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    fake = _modules({"tessera_compiler": tmp_path / "tessera_compiler",
                     "tessera_passes": tmp_path / "tessera_passes",
                     "tessera_runtime": tmp_path / "tessera_runtime"})
    assert [v.split(": ", 1)[1] for v in layering_violations(fake)] == [
        "tessera_compiler.ir.types (ir) imports tessera_passes.alpha (tessera_passes)",
        "tessera_runtime.routines (routines) imports tessera_runtime.env (env)"]
    assert [v.split(": ", 1)[1] for v in pass_imports(
        fake, {"tessera_passes.alpha", "tessera_passes.beta"})] == [
        "tessera_passes.beta imports the pass tessera_passes.alpha"]
    assert [v.split(": ", 1)[1] for v in private_imports(fake)] == [
        "tessera_compiler.codegen.a imports tessera_compiler.codegen.b._helper"]
    assert import_cycles(fake) == [
        "tessera_compiler.codegen.a -> tessera_compiler.codegen.b -> tessera_compiler.codegen.a",
        "tessera_compiler.ir.types -> tessera_passes.alpha -> tessera_compiler.ir.types"]
    # ... and see the real tree's layers and edges.
    layers = {layer_of(m) for m in MODULES}
    assert {"ir", "codegen", "compiler", "tessera_passes", "tessera"} <= layers
    edges = {(layer_of(n), layer_of(_owner(t, MODULES) or t)) for n, _, t, _, _ in _edges(MODULES)}
    assert ("tessera_passes", "ir") in edges and ("compiler", "tessera_passes") in edges
