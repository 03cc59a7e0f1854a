"""Environment variables are read in one module, `tessera_runtime/env.py`,
which documents them all; `tessera --env` lists them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = [REPO / "tessera", REPO / "tessera_compiler", REPO / "passes", REPO / "runtime"]
ENV_MODULE = REPO / "runtime" / "tessera_runtime" / "env.py"
READERS = {"get", "raw", "is_set", "flag", "integer", "number"}


def _is_os_environ(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" \
        and isinstance(node.value, ast.Name) and node.value.id == "os"


def environment_reads(path: Path) -> list[str]:
    """Reads of one variable from the environment in `path`: os.environ.get,
    os.environ[...], `in os.environ`, os.getenv. (Copying the whole
    environment for a child process, {**os.environ}, reads no variable.)"""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _is_os_environ(node.func.value):
                found.append(f"{path}:{node.lineno}: os.environ.get")
            if node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "os":
                found.append(f"{path}:{node.lineno}: os.getenv")
        if isinstance(node, ast.Subscript) and _is_os_environ(node.value) \
                and isinstance(node.ctx, ast.Load):
            found.append(f"{path}:{node.lineno}: os.environ[...]")
        if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                 for o in node.ops) \
                and any(_is_os_environ(c) for c in node.comparators):
            found.append(f"{path}:{node.lineno}: in os.environ")
    return found


def test_only_the_env_module_reads_the_environment():
    files = [f for root in SOURCES for f in root.rglob("*.py")]
    assert len(files) > 50
    reads = [r for f in files if f != ENV_MODULE for r in environment_reads(f)]
    assert not reads, "read tessera_runtime.env instead:\n" + "\n".join(reads)
    assert environment_reads(ENV_MODULE), "the check finds no read at all"


def test_every_variable_read_is_documented():
    """Each `env.get("NAME")` (and flag, integer, ...) names a documented
    variable (env raises KeyError at run time too; this finds it earlier)."""
    from tessera_runtime import env
    named = []
    for f in (f for root in SOURCES for f in root.rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in READERS and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "env" and node.args:
                arg = node.args[0]
                name = arg.value if isinstance(arg, ast.Constant) else \
                    constants.get(arg.id) if isinstance(arg, ast.Name) else None
                if name is not None:
                    named.append((f"{f}:{node.lineno}", name))
    assert len(named) > 10, named
    unknown = [f"{where}: {name}" for where, name in named if name not in env.VARIABLES]
    assert not unknown, f"undocumented variables (in {env.__file__}):\n" + "\n".join(unknown)


def test_tessera_env_lists_every_variable_with_its_value():
    from tessera_runtime import env
    run = subprocess.run([sys.executable, "-m", "tessera", "--env"], capture_output=True,
                         text=True, env={**os.environ, "TESSERA_COMM_TRACE": "1"}, timeout=60)
    assert run.returncode == 0, run.stderr
    for name in env.VARIABLES:
        assert name in run.stdout, name
    line = next(l for l in run.stdout.splitlines() if "TESSERA_COMM_TRACE" in l)
    assert "'1'" in line and "collective" in line
    assert "TESSERA_TARGET" in run.stdout and "unset" in run.stdout
