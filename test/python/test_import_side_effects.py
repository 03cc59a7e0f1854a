"""`import tessera` changes nothing in the layers below it.

The frontend once installed its own error classes in the compiler (the
exception bad `TargetOptions` raised) and in the runtime (the class of a
failed value check) as it was imported, so the compiler and the runtime
behaved differently with tessera imported than without. Those errors now
live below all three (`tessera_runtime.errors`); this test keeps any such
registration from coming back: it imports every module of the compiler,
the passes and the runtime, then tessera, and finds no module attribute
rebound and no module-level table (dict, list, set) grown or changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_PROBE = r"""
import importlib, json, pkgutil, sys
import tessera_compiler, tessera_passes, tessera_runtime

modules, skipped = {}, {}
for package in (tessera_compiler, tessera_passes, tessera_runtime):
    modules[package.__name__] = package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            modules[info.name] = importlib.import_module(info.name)
        except ImportError as err:      # a GPU engine on a machine without cupy
            skipped[info.name] = str(err)
assert "tessera" not in sys.modules, "a layer below tessera imported it"

def contents(value):
    if isinstance(value, dict):
        return sorted(map(repr, value.items()))
    if isinstance(value, (list, set)):
        return sorted(map(repr, value))
    return None

before = {name: {key: (value, contents(value)) for key, value in vars(module).items()}
          for name, module in modules.items()}
import tessera
changed = []
for name, module in modules.items():
    for key, (value, seen) in before[name].items():
        now = vars(module).get(key)
        if now is not value or contents(now) != seen:
            changed.append(f"{name}.{key}")
print(json.dumps({"modules": sorted(modules), "skipped": skipped, "changed": changed}))
"""


def test_importing_tessera_rebinds_and_fills_nothing_below_it():
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    files = [p for d in ("tessera_compiler", "passes/tessera_passes", "runtime/tessera_runtime")
             for p in (REPO / d).rglob("*.py")]
    assert len(report["modules"]) + len(report["skipped"]) == len(files)
    assert all("cupy" in why for why in report["skipped"].values()), report["skipped"]
    assert report["changed"] == [], f"import tessera changed {report['changed']}"


def test_the_errors_users_catch_are_the_ones_the_layers_below_raise():
    """ts.ArgumentError from a bad ts.TargetOptions, ts.ValueCheckError from
    a failed check: the same classes with tessera imported or not."""
    import tessera as ts
    from tessera_compiler.ir import options
    from tessera_runtime import errors, flight
    from tessera_runtime.engines import library

    assert ts.TesseraError is errors.TesseraError and ts.ArgumentError is errors.ArgumentError
    assert ts.ValueCheckError is library.ValueCheckError
    assert ts.errors.CollectiveTimeout is flight.CollectiveTimeout
    try:
        options.TargetOptions(target="tpu")
    except ts.ArgumentError as err:
        assert str(err).endswith(f"[{os.path.relpath(__file__)}:{err.__traceback__.tb_lineno}]")
    else:
        raise AssertionError("TargetOptions(target='tpu') was accepted")
