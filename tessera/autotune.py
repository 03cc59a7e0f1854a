"""Autotuning: measure the compile options that matter for a function's
arguments, run the fastest, and remember the choice.

    step = ts.jit(train_step, autotune=True)     # or TESSERA_AUTOTUNE=1
    step(params, opt_state, batch)               # first call: search, then run
    $ tessera autotune --show                    # what was chosen, and how much it won

On the first call of a signature (shapes, dtypes, layouts), `tune` builds
the candidates of the target's search space (`SPACE`: each knob's values,
every combination, the function's own options first), ranks them by the
cost model's predicted step when this machine has a description (the
`tessera calibrate` of this host for the CPU, the H100 node's for the GPU;
lowering to Tile IR only, no kernel compile), compiles the best
TESSERA_AUTOTUNE_CANDIDATES (default 5, always with the function's own
options) and times each on the call's own arguments: one warm-up, then the
median of TESSERA_AUTOTUNE_REPS runs (default 5), the slowest rank's. A
candidate that fails to compile or run counts as infinitely slow; one
within MIN_GAIN (3%) of the function's own options does not replace them. In a
multi-rank job every rank runs the same candidates in the same order and
rank 0 decides.

The winner is stored in `<cache>/autotune.json` (TESSERA_CACHE_DIR moves
it), keyed by the architecture (CPU model and cores, or the GPU arch), the
arguments' shapes, dtypes and layouts, the mesh, the program and the
compiler version; a later process with the same key runs the stored choice
without searching, and says so.

What is tuned (`SPACE`):
  cpu  elementwise_tile_elements (the work of one instance of a fused
       kernel) and bucket_elements (the largest fused gradient all-reduce)
  gpu  gemm_configs: which tensor-core configuration the GEMMs prefer
       (each one first in turn), and elementwise_tile_elements
  pipelines  the microbatch count of `pipeline.run(microbatches="auto")`
       (`tune_microbatches`: the counts dividing the batch from one per
       stage rank to 8 per rank, each traced, compiled and timed the same
       way; a count the user gave is kept: it also sets the activations'
       memory)
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import tessera_runtime
from tessera_runtime import env
from tessera_compiler.bundle import compiler_fingerprint
from tessera_compiler.ir.context import new_context
from tessera_compiler.ir.options import TENSOR_CORE_CONFIGS, TargetOptions
from tessera_mlir import ir

from ._mpi import bcast_text, world_comm
from ._rank_agreement import agree_on_program
from ._trace import local_inputs
from .machine import cache_path, host_cpu, machine

__all__ = ["SPACE", "tune", "tune_microbatches", "cache_file", "entries", "show", "clear"]

#: Each target's knobs and the values tried (TargetOptions fields).
SPACE = {
    "cpu": {"elementwise_tile_elements": (1024, 4096, 16384),
            "bucket_elements": (1 << 16, 1 << 20, 1 << 24)},
    "gpu": {"gemm_configs": tuple(TENSOR_CORE_CONFIGS[i:] + TENSOR_CORE_CONFIGS[:i]
                                  for i in range(4)),
            "elementwise_tile_elements": (1024, 4096)},
}
_VERSION = 1
#: A candidate replaces the function's own options only when it is at least
#: this much faster (repeated timings of one program differ by a few percent).
MIN_GAIN = 0.03


def cache_file() -> Path:
    """Where the choices are kept (under TESSERA_CACHE_DIR)."""
    return env.cache_root() / "autotune.json"


def _arch(options: TargetOptions) -> str:
    if options.target == "gpu":
        return "sm_90a"          # what the CUDA emitter targets
    cpu, cores = host_cpu()
    return f"{platform.machine()} {cpu} x{cores}".strip()


def _key_fields(compiled, specs, mesh, graph_text: str, base: TargetOptions) -> dict:
    return {"function": compiled.fn.__qualname__, "arch": _arch(base),
            "arguments": [[s.name, list(s.shape), np.dtype(s.dtype).name,
                           [list(d) for d in s.dims]] for s in specs],
            "mesh": {"axes": list(mesh.axes), "shape": list(mesh.info.shape)},
            "program": hashlib.sha256(graph_text.encode()).hexdigest()[:16],
            "compiler": compiler_fingerprint(base)}


def _read() -> dict:
    try:
        data = json.loads(cache_file().read_text())
        return data if data.get("version") == _VERSION else {"version": _VERSION, "entries": {}}
    except (OSError, ValueError, AttributeError):
        return {"version": _VERSION, "entries": {}}


def entries() -> dict:
    """{key: entry} of every stored choice."""
    return _read()["entries"]


def _store(key: str, entry: dict) -> None:
    data = _read()
    data["entries"][key] = entry
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def clear() -> int:
    """Forgets every stored choice; returns how many there were."""
    n = len(entries())
    cache_file().unlink(missing_ok=True)
    return n


def _changes(options: TargetOptions, base: TargetOptions) -> dict:
    """{option name (kebab case): text} where `options` differs from `base`."""
    return {TargetOptions.option_name(f.name): options.option_text(f.name)
            for f in dataclasses.fields(options)
            if getattr(options, f.name) != getattr(base, f.name)}


def _describe(changes: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in changes.items()) or "the default options"


def show() -> str:
    """A table of the stored choices (`tessera autotune --show`)."""
    rows = entries()
    if not rows:
        return f"no autotuned choices in {cache_file()}"
    lines = [f"{len(rows)} autotuned choice(s) in {cache_file()}:"]
    for entry in rows.values():
        k = entry["key"]
        args = ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'} {d}" for n, s, d, _ in
                         k["arguments"])
        mesh = " x ".join(f"{a}={n}" for a, n in zip(k["mesh"]["axes"], k["mesh"]["shape"]))
        lines.append(f"- {k['function']} on {k['arch']}, mesh {mesh}, compiler {k['compiler']}")
        lines.append(f"    arguments: {args}")
        lines.append(f"    choice: {_describe(entry['choice'])}: {entry['best_s'] * 1e3:.2f} ms "
                     f"vs {entry['default_s'] * 1e3:.2f} ms with "
                     f"{entry.get('reference', 'the default')} "
                     f"({entry['best_s'] / entry['default_s']:.2f}x), "
                     f"{entry['measured']} of {entry['candidates']} candidates measured "
                     f"on {entry['date']}")
    return "\n".join(lines)


def _candidates(base: TargetOptions, devices: int) -> list[TargetOptions]:
    """The function's own options, then every other value of one knob at a
    time, then the combinations (the order measured when nothing ranks
    them, and the cost model's tie-break). On one device there is no
    all-reduce to bucket."""
    space = dict(SPACE[base.target or "cpu"])
    if devices == 1:
        space.pop("bucket_elements", None)
    out = [base]
    singles = [base.with_(**{n: v}) for n, values in space.items() for v in values]
    combos = [base.with_(**dict(zip(space, values)))
              for values in itertools.product(*space.values())]
    for option in singles + combos:
        if option not in out:
            out.append(option)
    return out


def _say(text: str) -> None:
    if tessera_runtime.world()[0] == 0:
        print(f"[tessera autotune] {text}", file=sys.stderr, flush=True)


def _fresh(traced):
    """`traced` with a module of its own (lowering changes a module in place)."""
    text = traced.module.operation.get_asm(enable_debug_info=True)
    return dataclasses.replace(traced, module=ir.Module.parse(text, new_context()))


def _ranked(compiled, traced, candidates, mesh) -> tuple[list, str]:
    """The candidates by the cost model's predicted step (fastest first; the
    function's own options stay in), and what ranked them."""
    from tessera_compiler.cost import estimate
    base = candidates[0]
    ranks = mesh.size
    if base.target == "gpu":
        description = machine("h100-node")
    elif cache_path(ranks).exists():
        description = machine("cpu", ranks)
    else:
        return candidates, (f"unranked: this host has no calibration for {ranks} rank(s), "
                            f"`tessera calibrate -n {ranks}` makes one")
    predicted = []
    for options in candidates:
        try:
            levels = compiled._lower(_fresh(traced).module, options, plan_only=True)
            predicted.append(estimate(levels.module, description).step_s)
        except Exception:                 # a candidate that does not compile
            predicted.append(math.inf)
    order = sorted(range(len(candidates)), key=lambda i: (predicted[i], i))
    return [candidates[i] for i in order], f"ranked by the cost model on {description.name}"


def _run_once(program, inputs) -> float:
    """Seconds of one run, its outputs left on the engine's device: a
    training loop keeps its state there, so the host copies (most of a GPU
    step, measured) are not what the candidates differ in."""
    t0 = time.perf_counter()
    program.run(inputs, device_outputs=True)
    return time.perf_counter() - t0


def _slowest(seconds: float) -> float:
    """The largest of every rank's `seconds` (inf if a rank failed)."""
    if tessera_runtime.world()[1] == 1:
        return seconds
    from mpi4py import MPI
    return float(world_comm().allreduce(seconds, op=MPI.MAX))


def _agree(text: str) -> str:
    """Rank 0's `text` on every rank."""
    if tessera_runtime.world()[1] == 1:
        return text
    return bcast_text(world_comm(), text, what="autotune's choice")


def _measure(name: str, candidates: list, load, describe, reps: int) -> list[float]:
    """Each candidate's seconds per run: the median of `reps` runs, each the
    slowest rank's; inf for one that failed to compile or run on any rank.
    `load(candidate)` compiles it: (program, its inputs on the device).

    Every candidate is compiled and run once (warm-up) first, then they are
    timed in turns, one run each per round: a machine that slows down or
    speeds up during the search (another process, caches, frequency)
    shifts every candidate alike instead of whichever ran last."""
    loaded: list = []
    for candidate in candidates:
        try:
            program, inputs = load(candidate)
            _run_once(program, inputs)
        except Exception as err:          # a failing candidate is infinitely slow
            _say(f"{name}: {describe(candidate)} failed: {type(err).__name__}: "
                 f"{str(err).splitlines()[0] if str(err) else ''}")
            program = inputs = None
        # A candidate that failed on any rank is dropped on every rank.
        failed_somewhere = not math.isfinite(_slowest(0.0 if program is not None else math.inf))
        loaded.append(None if failed_somewhere else (program, inputs))
    times: list = [[] for _ in candidates]
    for _ in range(reps):
        for i, entry in enumerate(loaded):
            if entry is None:
                continue
            try:
                seconds = _run_once(*entry)
            except Exception as err:
                _say(f"{name}: {describe(candidates[i])} failed: {type(err).__name__}: {err}")
                seconds = math.inf
            times[i].append(_slowest(seconds))
            if not math.isfinite(times[i][-1]):
                loaded[i] = None
    out = []
    for candidate, runs, entry in zip(candidates, times, loaded):
        seconds = statistics.median(runs) if entry is not None and runs else math.inf
        out.append(seconds)
        _say(f"  {seconds * 1e3:9.2f} ms  {describe(candidate)}")
    return out


def _say_stored(name: str, stored: dict) -> None:
    _say(f"{name}: stored choice {_describe(stored['choice'])} ({stored['best_s'] * 1e3:.2f} ms "
         f"vs {stored['default_s'] * 1e3:.2f} ms with {stored.get('reference', 'the default')}, "
         f"measured {stored['date']}); no search")


def _lookup(fields: dict) -> tuple[str, dict | None]:
    """(the cache key of `fields`, rank 0's stored entry for it, on every rank)."""
    entry_key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]
    stored = _agree(json.dumps(entries().get(entry_key)) if tessera_runtime.world()[0] == 0
                    else "")
    return entry_key, json.loads(stored)


def tune(compiled, key, traced, mesh, specs, inputs) -> TargetOptions:
    """The options `compiled` runs with for this signature: the stored
    choice, or the fastest candidate measured now on `inputs` (this rank's
    local inputs); every rank returns the same."""
    base = compiled._target()
    text = traced.module.operation.get_asm(enable_debug_info=True)
    fields = _key_fields(compiled, specs, mesh, text, base)
    entry_key, stored = _lookup(fields)
    name = compiled.fn.__name__
    if stored is not None:
        _say_stored(name, stored)
        return base.with_text(stored["choice"])
    candidates = _candidates(base, mesh.size)
    budget = max(1, env.integer("TESSERA_AUTOTUNE_CANDIDATES"))
    reps = max(1, env.integer("TESSERA_AUTOTUNE_REPS"))
    ranked, how = _ranked(compiled, traced, candidates, mesh) if len(candidates) > budget \
        else (candidates, "all measured")
    chosen = ranked[:budget]
    if base not in chosen:
        chosen = [base] + chosen[:budget - 1]
    _say(f"{name}: measuring {len(chosen)} of {len(candidates)} candidates ({how}), "
         f"{reps} runs each")
    started = time.perf_counter()
    resident: list = []                  # the inputs on the engine's device, once

    def load(options):
        program = tessera_runtime.load_bundle(
            compiled._bundle(key, _fresh(traced), mesh, options))
        if not resident:
            resident.append([program.engine.from_host(a) for a in inputs])
        return program, resident[0]
    seconds = _measure(name, chosen, load, lambda o: _describe(_changes(o, base)), reps)
    best = _choose(list(zip(seconds, chosen)), base, fields, entry_key, name, started, how,
                   len(candidates), lambda o: _changes(o, base), "the default")
    if best is None:
        _say(f"{name}: every candidate failed; compiling with the function's own options")
        return base
    return best


def _choose(measured: list, reference, fields: dict, entry_key: str, name: str, started: float,
            ranking: str, candidates: int, describe, reference_text: str):
    """The fastest of `measured` [(seconds, candidate)] unless it beats
    `reference` by less than MIN_GAIN; stored (rank 0) and reported.
    None when every candidate failed."""
    best_s, best = min(measured, key=lambda m: m[0])
    default_s = next(s for s, c in measured if c == reference)
    if best_s > (1 - MIN_GAIN) * default_s:
        best_s, best = default_s, reference     # within the timing noise: keep the reference
    if not math.isfinite(best_s):
        return None
    entry = {"key": fields, "choice": describe(best), "best_s": best_s, "default_s": default_s,
             "reference": reference_text, "measured": len(measured), "candidates": candidates,
             "ranking": ranking, "search_s": time.perf_counter() - started,
             "date": time.strftime("%Y-%m-%d")}
    if tessera_runtime.world()[0] == 0:
        _store(entry_key, entry)
    _say(f"{name}: chose {_describe(entry['choice'])}: {best_s * 1e3:.2f} ms vs "
         f"{default_s * 1e3:.2f} ms with {reference_text} ({best_s / default_s:.2f}x); searched "
         f"in {entry['search_s']:.1f} s, stored in {cache_file()}")
    return best


def tune_microbatches(compiled, prepared, counts: list, reference: int) -> int:
    """The microbatch count a pipelined step (`pipeline.run(microbatches=
    "auto")`) runs with for the call's signature: the stored choice, or the
    fastest of `counts` measured now, each traced and compiled with the
    step's own options and timed on the call's arguments as `tune` times
    options (`reference`, one microbatch per stage, is kept unless another
    count is MIN_GAIN faster). The choice is stored beside the options'
    choices, keyed by the program as traced with `reference` microbatches.
    Every rank returns the same count."""
    bound, leaves, mesh, tensors, specs, key = (prepared.bound, prepared.leaves, prepared.mesh,
                                                prepared.tensors, prepared.specs, prepared.key)
    base = compiled._target()
    name = compiled.fn.__name__
    traced: dict = {}

    def trace(m):
        if m not in traced:
            compiled.microbatches = m
            traced[m] = compiled._trace(bound, leaves, specs, mesh)
        return traced[m]
    text = trace(reference).module.operation.get_asm(enable_debug_info=True)
    fields = dict(_key_fields(compiled, specs, mesh, text, base), tuned="microbatches",
                  counts=list(counts))
    entry_key, stored = _lookup(fields)
    if stored is not None:
        _say_stored(name, stored)
        return int(stored["choice"]["microbatches"])
    reps = max(1, env.integer("TESSERA_AUTOTUNE_REPS"))
    _say(f"{name}: measuring {len(counts)} microbatch counts ({', '.join(map(str, counts))}), "
         f"{reps} runs each")
    started = time.perf_counter()
    resident: list = []

    def load(m):
        program_of = trace(m)
        if tessera_runtime.world()[1] > 1:
            agree_on_program(name, program_of.module, repr(base))
        program = tessera_runtime.load_bundle(
            compiled._bundle(key + (("microbatches", m),), program_of, mesh, base))
        if not resident:
            resident.append([program.engine.from_host(a)
                             for a in local_inputs(tensors, program_of)])
        return program, resident[0]
    seconds = _measure(name, counts, load, lambda m: f"microbatches={m}", reps)
    best = _choose(list(zip(seconds, counts)), reference, fields, entry_key, name, started,
                   "all measured", len(counts), lambda m: {"microbatches": str(m)},
                   f"microbatches={reference}")
    if best is None:
        _say(f"{name}: every microbatch count failed; running {reference}")
        return reference
    return best
