"""Sharded, atomic, asynchronous checkpoints in safetensors (the collectives
guide 5.1):

    from tessera import checkpoint
    handle = checkpoint.save("step_100", tensors=params, optimizer=opt_state,
                             extra={"step": 100, "rng": rng}, directory="ckpt",
                             atomic=True, async_io=True, keep=3)
    ...                                   # training goes on; params may change
    handle.wait()
    restored = checkpoint.load("latest", directory="ckpt", mesh=new_mesh)
    params, opt_state = restored.tensors, restored.optimizer

Every process of the job calls `save` (it is collective). Each rank writes
only the blocks it owns (a DTensor's shard once per set of replicas, numpy
arrays from rank 0) into `rank<NNNNN>.safetensors` in a temporary directory,
fsyncs it, and reports; after every rank's part is durable, rank 0 writes the
JSON manifest and makes the tag visible with one rename. A checkpoint is
therefore either whole or absent: `latest` is the committed tag with the
highest sequence number, so a crash at any moment leaves the previous one.
The format is in docs/checkpoint-format.md. No pickle: tensors are
safetensors, everything else JSON.

`load` reads a tag onto any mesh and layouts (other dp/tp/pp/ep sizes, other
ShardSpecs, or one process without MPI), each rank reading only the parts of
the saved blocks its own shard needs, after checking every file's sha256.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import reprlib
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tessera_runtime import world

from ._checks import is_int
from ._dtensor import DTensor, Mesh, ShardSpec, check_mesh, from_numpy, summand
from ._mpi import allgather_text, bcast_text, world_comm
from ._pytree import flatten, paths, unflatten
from ._source import user_frame
from .dtypes import bf16
from .errors import ArgumentError, CollectiveTimeout, TesseraError

__all__ = ["save", "load", "tags", "latest", "manifest", "Checkpoint", "SaveHandle",
           "CheckpointError"]
# (`checkpoint.list`, the same as `tags`, is public too but not exported by
# `import *`, where it would hide the builtin list.)

FORMAT = "tessera-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
TREES = ("tensors", "optimizer", "extra")


class CheckpointError(TesseraError, RuntimeError):
    """A checkpoint that cannot be saved or loaded (names the tag, tensor, file)."""


# -- the job's processes ------------------------------------------------------------

_COMM = None                   # a duplicate of MPI_COMM_WORLD for the writer threads


def _comm():
    """The job's own communicator for checkpoints (None in one process): the
    background writer talks over it while the main thread runs collectives
    on COMM_WORLD (MPI_THREAD_MULTIPLE)."""
    global _COMM
    if world()[1] == 1:
        return None
    if _COMM is None:
        _COMM = world_comm().Dup()
    return _COMM


# -- durable files ------------------------------------------------------------------

def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- trees as JSON ------------------------------------------------------------------

def _structure_json(node, where: str):
    kind, keys, children = node
    if kind == "dict":
        bad = [k for k in keys if not isinstance(k, str)]
        if bad:
            raise CheckpointError(f"checkpoint: {where} has a non-string key {bad[0]!r} "
                                  "(a checkpoint's tree keys are strings)")
        keys = list(keys)
    return [kind, keys, [_structure_json(c, where) for c in children]]


def _structure_from_json(node):
    kind, keys, children = node
    return (kind, tuple(keys) if keys is not None else None,
            tuple(_structure_from_json(c) for c in children))


# -- saving -------------------------------------------------------------------------

@dataclass
class _Part:
    """What this rank writes: safetensors blocks and the manifest's leaf entries."""
    blocks: dict = field(default_factory=dict)            # key -> numpy array (a snapshot)
    leaves: dict = field(default_factory=dict)            # tree -> [leaf entry]
    structures: dict = field(default_factory=dict)        # tree -> JSON structure


def _layout_json(layout: ShardSpec, mesh: Mesh) -> dict:
    return {"partition": list(layout.partition), "mesh_axes": list(layout.mesh_axes),
            "mesh": {"axes": list(mesh.axes), "shape": [mesh.axis_size(a) for a in mesh.axes]}}


def _snapshot(tree_name: str, tree, rank: int, part: _Part) -> None:
    """Copy this rank's blocks of `tree` (so the caller may change them at
    once) and describe every leaf."""
    leaves, structure = flatten(tree)
    part.structures[tree_name] = _structure_json(structure, tree_name)
    entries = []
    for path, leaf in zip(paths(tree, tree_name), leaves):
        if isinstance(leaf, DTensor):
            if leaf.layout.partial:
                leaf = leaf.redistribute(ShardSpec(leaf.layout.partition, leaf.layout.mesh_axes))
            entry = {"kind": "tensor", "shape": list(leaf.shape), "dtype": leaf.dtype.name,
                     "layout": _layout_json(leaf.layout, leaf.mesh), "blocks": []}
            own = leaf.mesh._process_rank()
            if own is None and world()[1] > 1:
                raise CheckpointError(f"checkpoint: {path} is a DTensor on a {leaf.mesh.size}-"
                                      f"device mesh, but this job runs {world()[1]} processes; "
                                      "save it from a job of its mesh's size")
            if own is None:                       # one process holding the global value
                owned = [(np.ascontiguousarray(leaf.numpy()), [0] * leaf.ndim)]
            else:
                split = {a for d in leaf.dims for a in d}
                coords = leaf.mesh.coords
                # (A pipeline stage's tensor: written by the first of its holders.)
                first = {leaf.held[0]: min(leaf.held[1])} if leaf.held is not None else {}
                first_replica = leaf.holds() and all(
                    c == first.get(a, 0) for a, c in coords.items() if a not in split)
                index = leaf.mesh.info.local_slices(leaf.shape, leaf.dims, own)
                owned = [(np.array(leaf.local(), order="C"), [s.start for s in index])] \
                    if first_replica else []
        elif isinstance(leaf, (np.ndarray, np.generic)):
            array = np.asarray(leaf)
            if array.dtype.kind in "OSUMm":
                raise CheckpointError(f"checkpoint: {path} is an array of dtype {array.dtype}; "
                                      "a checkpoint's tensors hold numbers (strings and other "
                                      f"values go in extra, as JSON values)  [{user_frame()}]")
            entry = {"kind": "tensor", "shape": list(array.shape), "dtype": array.dtype.name,
                     "layout": None, "numpy_scalar": isinstance(leaf, np.generic), "blocks": []}
            owned = [(np.array(array, order="C"), [0] * array.ndim)] if rank == 0 else []
        elif isinstance(leaf, np.random.Generator):
            entries.append({"kind": "rng", "path": path,
                            "bit_generator": type(leaf.bit_generator).__name__,
                            "state": leaf.bit_generator.state})
            continue
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            entries.append({"kind": "value", "path": path, "value": leaf})
            continue
        else:
            raise CheckpointError(f"checkpoint: {path} is a {type(leaf).__name__}; a checkpoint "
                                  "holds numpy arrays, DTensors, numpy Generators and JSON "
                                  f"values (None, bool, int, float, str)  [{user_frame()}]")
        entry["path"] = path
        for block, start in owned:
            key = f"{path}@{','.join(map(str, start))}"
            part.blocks[key] = block
            entry["blocks"].append({"key": key, "start": start, "shape": list(block.shape)})
        entries.append(entry)
    part.leaves[tree_name] = entries


class SaveHandle:
    """A save in flight (`async_io=True`) or done. `wait()` returns when the
    tag is committed on every rank (or raises why it was not); `done()`
    says whether it has."""

    def __init__(self, tag: str, directory: Path):
        self.tag, self.directory = tag, directory
        self.error: str | None = None
        self.blocked_s = 0.0                    # how long `save` held the caller
        self._thread: threading.Thread | None = None

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> "SaveHandle":
        if self._thread is not None:
            self._thread.join()
        if self.error:
            raise CheckpointError(f"checkpoint '{self.tag}' in {self.directory}: {self.error}")
        return self

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"SaveHandle({self.tag!r}, {state}{', failed' if self.error else ''})"


_PENDING: SaveHandle | None = None


def _settle() -> None:
    """Wait for this process' save in flight: a later save, load, `latest`
    or `list` sees it committed (or raises why it was not)."""
    global _PENDING
    pending, _PENDING = _PENDING, None
    if pending is not None:
        pending.wait()


def _committed(directory: Path) -> list[tuple[int, str]]:
    """(sequence, tag) of every committed tag, oldest first."""
    out = []
    if directory.is_dir():
        for d in directory.iterdir():
            if d.name.startswith(".") or not (d / MANIFEST).is_file():
                continue
            try:
                out.append((int(json.loads((d / MANIFEST).read_text())["sequence"]), d.name))
            except (ValueError, KeyError, TypeError):
                continue                              # not ours, or unreadable: not a tag
    return sorted(out)


def _remove(directory: Path, name: str, nonce: str) -> None:
    """Delete a tag directory: renamed away first, so no half-deleted
    directory ever looks like a tag."""
    trash = directory / f".trash-{nonce}-{name}"
    os.rename(directory / name, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _write_part(tmp: Path, rank: int, part: _Part) -> dict:
    """This rank's safetensors file and manifest fragment, durable."""
    from safetensors.numpy import save_file
    name = f"rank{rank:05d}.safetensors"
    fragment = {"rank": rank, "leaves": part.leaves, "structures": part.structures, "files": {}}
    if part.blocks:
        path = tmp / name
        save_file(part.blocks, str(path), metadata={"format": FORMAT})   # one key: same bytes
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        fragment["files"][name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
        for entries in part.leaves.values():
            for e in entries:
                for b in e.get("blocks", ()):
                    b["file"] = name
    _write_durable(tmp / f"rank{rank:05d}.json", json.dumps(fragment).encode())
    return fragment


def _commit(directory: Path, tmp: Path, tag: str, size: int, nonce: str, keep) -> None:
    """Rank 0, once every rank's part is durable: merge the fragments into the
    manifest, then make the tag visible by renaming the directory."""
    fragments = [json.loads((tmp / f"rank{r:05d}.json").read_text()) for r in range(size)]
    manifest = {"format": FORMAT, "version": VERSION, "tag": tag,
                "sequence": 1 + max((s for s, _ in _committed(directory)), default=0),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "world_size": size,
                "trees": fragments[0]["structures"], "leaves": {}, "files": {}}
    for name in TREES:
        if name not in fragments[0]["leaves"]:
            continue
        merged = fragments[0]["leaves"][name]
        for f in fragments[1:]:
            for mine, theirs in zip(merged, f["leaves"][name]):
                if mine["kind"] == "tensor":
                    mine["blocks"] += theirs["blocks"]
        manifest["leaves"][name] = merged
    for f in fragments:
        manifest["files"].update(f["files"])
        os.unlink(tmp / f"rank{f['rank']:05d}.json")
    _write_durable(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    _fsync_dir(tmp)
    if (directory / tag).exists():
        _remove(directory, tag, nonce)               # a re-saved tag replaces the old one
    os.rename(tmp, directory / tag)
    _fsync_dir(directory)
    if keep is not None:
        for _, old in _committed(directory)[:-keep]:
            _remove(directory, old, nonce)


def _check_tag(tag: str) -> None:
    if not isinstance(tag, str) or not tag or tag.startswith(".") or "/" in tag \
            or tag in ("latest", ".", ".."):
        raise CheckpointError(f"checkpoint: tag {tag!r} must be a non-empty name without '/', "
                              f"not starting with '.', and not 'latest'  [{user_frame()}]")


def _directory(directory, what: str) -> Path:
    """`directory=` as a Path: a str or a path, or an error at the user's line."""
    if not isinstance(directory, (str, os.PathLike)):
        raise ArgumentError(f"{what}: directory={directory!r:.60} must be a folder's path (a str "
                            f"or a Path)  [{user_frame()}]")
    return Path(directory)


def save(tag: str, tensors=None, optimizer=None, extra=None, directory="checkpoints",
         atomic: bool = True, async_io: bool = False, keep: int | None = None) -> SaveHandle:
    """Save the pytrees `tensors` (the model), `optimizer` (its state) and
    `extra` (step counter, loss scaler, numpy Generators, data position: JSON
    values, arrays and Generators) as checkpoint `tag` in `directory`.

    Collective: every process of the job calls it with the same trees. With
    `async_io=True` it returns once the values are copied; the files are
    written and committed by a background thread (`handle.wait()`; the next
    save waits for it). `keep=N` keeps the N newest tags. `atomic=False` is
    not offered: a checkpoint is always committed by one rename."""
    global _PENDING
    _check_tag(tag)
    if not atomic:
        raise CheckpointError("checkpoint.save: atomic=False is not offered: the tag is "
                              f"committed by one rename, which costs nothing  [{user_frame()}]")
    if keep is not None and (not is_int(keep) or keep < 1):
        raise CheckpointError(f"checkpoint.save: keep={keep!r} must be a positive integer  "
                              f"[{user_frame()}]")
    directory = _directory(directory, "checkpoint.save")
    started = time.perf_counter()
    _settle()                                # one save at a time, in call order
    rank, size = world()
    comm = _comm()
    handle = SaveHandle(tag, directory)
    part = _Part()
    for name, tree in zip(TREES, (tensors, optimizer, extra)):
        if tree is not None:
            _snapshot(name, tree, rank, part)
    nonce = uuid.uuid4().hex[:12]
    if comm is not None:
        nonce = bcast_text(comm, nonce, what=f"checkpoint.save({tag!r})", axis="checkpoint")
    tmp = directory / f".tmp-{nonce}-{tag}"

    def write():
        status = ""
        try:
            if rank == 0:
                directory.mkdir(parents=True, exist_ok=True)
                for stale in directory.glob(".tmp-*"):    # a crashed save's leftovers
                    if stale != tmp:
                        shutil.rmtree(stale, ignore_errors=True)
                for stale in directory.glob(".trash-*"):
                    shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True, exist_ok=True)
            _write_part(tmp, rank, part)
        except Exception as e:                                   # noqa: BLE001
            status = f"rank {rank}: {type(e).__name__}: {e}"
        try:
            statuses = allgather_text(comm, status, what=f"the commit of checkpoint {tag!r}",
                                      axis="checkpoint") if comm is not None else [status]
            failed = [s for s in statuses if s]
            outcome = "; ".join(failed)
            if rank == 0 and not failed:
                try:
                    _commit(directory, tmp, tag, size, nonce, keep)
                except Exception as e:                           # noqa: BLE001
                    outcome = f"rank 0 could not commit: {type(e).__name__}: {e}"
            if comm is not None:
                outcome = bcast_text(comm, outcome, what=f"the outcome of checkpoint {tag!r}",
                                     axis="checkpoint")
        except CollectiveTimeout as e:
            # A rank that never came to the commit: nothing was committed,
            # and wait() (or the save itself) says why on this rank.
            outcome = str(e)
        handle.error = outcome or None

    if async_io:
        handle._thread = threading.Thread(target=write, name=f"checkpoint-{tag}")
        handle._thread.start()
        _PENDING = handle
        handle.blocked_s = time.perf_counter() - started
        return handle
    write()
    handle.blocked_s = time.perf_counter() - started
    return handle.wait()


# -- reading ------------------------------------------------------------------------

def tags(directory="checkpoints") -> list[str]:
    """The committed tags in `directory`, oldest first (also `checkpoint.list`)."""
    directory = _directory(directory, "checkpoint.tags")
    _settle()
    return [tag for _, tag in _committed(directory)]


def __getattr__(name: str):
    # `checkpoint.list(directory)` as users write it, without shadowing the
    # builtin inside this module.
    if name == "list":
        return tags
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def latest(directory="checkpoints") -> str | None:
    """The newest committed tag (None when there is none)."""
    directory = _directory(directory, "checkpoint.latest")
    _settle()
    tags = _committed(directory)
    return tags[-1][1] if tags else None


def manifest(tag: str = "latest", directory="checkpoints") -> dict:
    """The JSON manifest of committed checkpoint `tag` (its trees, leaves,
    blocks and the JSON values of `extra`), without reading any tensor."""
    directory = _directory(directory, "checkpoint.manifest")
    _settle()
    return _read_manifest(directory, tag)[1]


@dataclass
class Checkpoint:
    """A loaded checkpoint: its trees (None where not saved) and manifest."""
    tag: str
    tensors: object
    optimizer: object
    extra: object
    manifest: dict

    def __iter__(self):                     # tensors, optimizer, extra = checkpoint.load(...)
        return iter((self.tensors, self.optimizer, self.extra))


def _read_manifest(directory: Path, tag: str) -> tuple[str, dict]:
    if not isinstance(tag, str) or not tag or "/" in tag or tag.startswith("."):
        raise CheckpointError(f"checkpoint: tag {tag!r} must be the name of a saved checkpoint "
                              f"(a str) or 'latest'  [{user_frame()}]")
    if tag == "latest":
        found = latest(directory)
        if found is None:
            raise CheckpointError(f"checkpoint: no committed checkpoint in {directory}  "
                                  f"[{user_frame()}]")
        tag = found
    path = directory / tag / MANIFEST
    if not path.is_file():
        have = tags(directory)
        raise CheckpointError(f"checkpoint '{tag}' does not exist in {directory} (committed "
                              f"tags: {', '.join(have) if have else 'none'})  [{user_frame()}]")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint '{tag}': {path} is not readable JSON: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint '{tag}': {path} is not a Tessera checkpoint manifest")
    if int(manifest.get("version", 0)) > VERSION:
        raise CheckpointError(f"checkpoint '{tag}': {path} has format version "
                              f"{manifest['version']}, newer than this Tessera reads ({VERSION})")
    return tag, manifest


def _saved_leaves(manifest: dict) -> dict[str, dict]:
    """Every saved leaf's manifest entry, by path (`tensors.blocks.0.wq`)."""
    return {e["path"]: e for name in TREES for e in manifest["leaves"].get(name, ())}


def _layout_leaves(node, path: str, saved: dict, subtrees: set):
    """(path, value) for each leaf of a `layouts` dict, flat or nested: keys
    are joined with "." and list positions are numbers, as `_pytree.paths`
    spells the saved paths, so `{"tensors": {"blocks": [{"wq": s}]}}`,
    `{"tensors.blocks": [{"wq": s}]}` and `{"tensors.blocks.0.wq": s}` are
    one layout. A node at a saved leaf's path is a leaf whatever it is (a
    tuple there is a wrong value, not more tree); an empty dict or list at a
    path that leads to no saved leaf is one too, so that its typo is reported."""
    if path in saved or not isinstance(node, (dict, list, tuple)) \
            or (not node and path not in subtrees):
        yield path, node
        return
    for key, child in (node.items() if isinstance(node, dict) else enumerate(node)):
        yield from _layout_leaves(child, f"{path}.{key}" if path else str(key), saved, subtrees)


def _unknown_path(tag: str, path: str, value, saved: dict, subtrees: set, where) -> CheckpointError:
    """The error for a `layouts` path that names no saved leaf: the closest
    saved tensor path (a typo, or the tree nested one level off), else a few."""
    tensors = [p for p, e in saved.items() if e["kind"] == "tensor"]
    if path in subtrees:                    # e.g. {"tensors": spec}: one spec for a whole tree
        inside = [p for p in tensors if p.startswith(path + ".")]
        return CheckpointError(
            f"checkpoint '{tag}': layouts gives {path} a {type(value).__name__}, but {path} is "
            f"a subtree of the checkpoint ({_some(inside)}), not one tensor: give each of its "
            f"tensors a ShardSpec or None  [{where}]")
    close = difflib.get_close_matches(path, tensors, n=1)
    hint = f"the closest saved path is {close[0]}" if close else \
        f"its tensors are {_some(tensors)}" if tensors else "it holds no tensor"
    return CheckpointError(f"checkpoint '{tag}': layouts names {path!r}, which is not a tensor "
                           f"of the checkpoint; {hint}  [{where}]")


def _some(items: list, n: int = 4) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items)} in all)" if len(items) > n else "")


_KINDS = {"value": "JSON value", "rng": "numpy Generator"}     # saved leaves


def _layout_rule(layouts, manifest: dict, tag: str, where):
    """`layouts` as a function (path, shape) -> ShardSpec or None, after
    checking every ShardSpec/None it holds against the manifest. A dict (flat
    paths or a tree) must name only saved leaves: a key that names none would
    otherwise leave its tensor replicated without a word."""
    if isinstance(layouts, ShardSpec):
        return lambda path, shape: layouts
    if callable(layouts):
        def rule(path, shape):
            spec = layouts(path, shape)
            if spec is not None and not isinstance(spec, ShardSpec):
                raise CheckpointError(f"checkpoint '{tag}': layouts({path!r}, {shape}) returned "
                                      f"a {type(spec).__name__}, not a ShardSpec or None  "
                                      f"[{where}]")
            return spec
        return rule
    if not isinstance(layouts, dict):
        raise CheckpointError(f"checkpoint '{tag}': layouts is a {type(layouts).__name__}; give "
                              "one ShardSpec, a dict {path: ShardSpec or None} or a tree of them "
                              "shaped like the saved trees, or a function (path, shape) -> "
                              f"ShardSpec  [{where}]")
    saved = _saved_leaves(manifest)
    subtrees = {p[:i] for p in saved for i, c in enumerate(p) if c == "."}
    by_path = {}
    for path, spec in _layout_leaves(layouts, "", saved, subtrees):
        entry = saved.get(path)
        if spec is None and (entry is not None or path in subtrees):
            continue        # the default, for any saved leaf or subtree: a tree mapped
                            # over `like` may hold None for extra's values too
        if entry is None:
            raise _unknown_path(tag, path, spec, saved, subtrees, where)
        if not isinstance(spec, ShardSpec):
            raise CheckpointError(f"checkpoint '{tag}': layouts gives {path} a "
                                  f"{type(spec).__name__} ({reprlib.repr(spec)}), not a "
                                  f"ShardSpec or None  [{where}]")
        if entry["kind"] != "tensor":
            raise CheckpointError(f"checkpoint '{tag}': layouts gives {path} a ShardSpec, but "
                                  f"it is a saved {_KINDS[entry['kind']]}, not a tensor  [{where}]")
        by_path[path] = spec
    return lambda path, shape: by_path.get(path)


def _target_layout(entry: dict, mesh: Mesh | None, rule, like) -> ShardSpec | None:
    """The layout `entry` is loaded in: `like`'s leaf, then `layouts` (as
    `rule`; a tensor it gives None loads replicated, or as numpy when saved
    as numpy), then the saved layout where the mesh has its axes, else
    replicated; None: numpy."""
    path, shape = entry["path"], tuple(entry["shape"])
    if isinstance(like, DTensor):
        return like.layout
    if mesh is None:
        return None
    if rule is not None:
        spec = rule(path, shape)
        return spec if spec is not None else (ShardSpec() if entry["layout"] else None)
    saved = entry["layout"]
    if saved is None:
        return None
    spec = ShardSpec(tuple(saved["partition"]), tuple(saved["mesh_axes"]))
    try:
        mesh.info.local_shape(shape, spec.dims_for(len(shape), mesh, path))
        return spec
    except Exception:                       # noqa: BLE001 (no such axis, or not divisible)
        return ShardSpec()                  # replicated on the new mesh


@dataclass
class _Plan:
    """How one leaf is loaded, decided from the manifest and the arguments
    alone (see `load`)."""
    entry: dict
    layout: ShardSpec | None = None         # None: a numpy array (or not a tensor)
    mesh: Mesh | None = None
    rank: int | None = None                 # this process' rank on `mesh` (None: one
                                            # process, which holds the global value)
    box: tuple = ()                         # the part of the tensor that rank holds


def _plan(entry: dict, tag: str, mesh, rule, like, where) -> _Plan:
    if entry["kind"] != "tensor":
        return _Plan(entry)
    path, shape = entry["path"], tuple(entry["shape"])
    if like is not None and tuple(np.shape(like)) != shape:
        raise CheckpointError(f"checkpoint '{tag}': tensor {path} has global shape "
                              f"{list(shape)}, but the target expects {list(np.shape(like))}  "
                              f"[{where}]")
    layout = _target_layout(entry, mesh, rule, like)
    if layout is None:
        return _Plan(entry)
    target = like.mesh if isinstance(like, DTensor) else mesh
    try:
        # dims_for and local_shape check only the layout, the shape and the
        # mesh (the same on every rank); the box is this rank's own.
        dims = layout.dims_for(len(shape), target, path)
        target.info.local_shape(shape, dims)
        rank = target._process_rank()
        box = target.info.local_slices(shape, dims, rank) if rank is not None else ()
    except Exception as e:                                       # noqa: BLE001
        raise CheckpointError(f"checkpoint '{tag}': tensor {path} (global shape "
                              f"{list(shape)}) does not fit layout {layout} on the "
                              f"{target.topology}: {e}  [{where}]") from None
    return _Plan(entry, layout, target, rank, box)


class _Reader:
    """Regions of saved tensors, read from the blocks that overlap them."""

    def __init__(self, directory: Path, tag: str, manifest: dict):
        self.root, self.tag, self.manifest = directory / tag, tag, manifest
        self._open: dict = {}

    def _file(self, name: str):
        handle = self._open.get(name)
        if handle is None:
            from safetensors import safe_open
            path = self.root / name
            want = self.manifest["files"].get(name)
            if want is None or not path.is_file():
                raise CheckpointError(f"checkpoint '{self.tag}': file {path} is missing")
            if path.stat().st_size != want["bytes"] or _sha256(path) != want["sha256"]:
                raise CheckpointError(f"checkpoint '{self.tag}': file {path} is corrupt or "
                                      f"truncated (its sha256 or size differs from the manifest's)")
            try:
                handle = self._open[name] = safe_open(str(path), framework="numpy")
            except Exception as e:                               # noqa: BLE001
                raise CheckpointError(f"checkpoint '{self.tag}': {path}: {e}") from None
        return handle

    def region(self, entry: dict, box: tuple[slice, ...]) -> np.ndarray:
        out = np.empty([s.stop - s.start for s in box], dtype=_dtype(entry["dtype"]))
        filled = 0
        for b in entry["blocks"]:
            lo = [max(s.start, st) for s, st in zip(box, b["start"])]
            hi = [min(s.stop, st + n) for s, st, n in zip(box, b["start"], b["shape"])]
            if any(h <= l for l, h in zip(lo, hi)) and out.size:
                continue
            src = tuple(slice(l - st, h - st) for l, h, st in zip(lo, hi, b["start"]))
            dst = tuple(slice(l - s.start, h - s.start) for l, h, s in zip(lo, hi, box))
            saved = self._file(b["file"])
            try:
                piece = saved.get_slice(b["key"])[src] if src else saved.get_tensor(b["key"])
            except Exception as e:                               # noqa: BLE001
                raise CheckpointError(f"checkpoint '{self.tag}': tensor {entry['path']}: "
                                      f"block {b['key']} of {b['file']}: {e}") from None
            out[dst] = piece
            filled += int(np.prod([h - l for l, h in zip(lo, hi)]))
        if filled != out.size:
            raise CheckpointError(f"checkpoint '{self.tag}': tensor {entry['path']}: the saved "
                                  f"blocks cover {filled} of the {out.size} elements needed")
        return out


def _dtype(name: str) -> np.dtype:
    return bf16 if name == "bfloat16" else np.dtype(name)      # numpy has no bfloat16 name


def _load_leaf(plan: _Plan, reader: _Reader):
    entry = plan.entry
    if entry["kind"] == "value":
        return entry["value"]
    if entry["kind"] == "rng":
        bitgen = getattr(np.random, entry["bit_generator"])()
        bitgen.state = entry["state"]
        return np.random.Generator(bitgen)
    path, shape = entry["path"], tuple(entry["shape"])
    if plan.layout is None:
        value = reader.region(entry, tuple(slice(0, n) for n in shape))
        return value[()] if entry.get("numpy_scalar") else value
    if plan.rank is None:                         # one process: the global value
        return from_numpy(reader.region(entry, tuple(slice(0, n) for n in shape)),
                          plan.layout, plan.mesh, name=path)
    # A pending-sum layout (from `like`) holds the value once: the block at
    # coordinate 0 of its partial axes and zeros elsewhere, as from_numpy does.
    local = summand(reader.region(entry, plan.box), plan.layout, plan.mesh, plan.rank)
    return DTensor(local, shape, _dtype(entry["dtype"]), plan.layout, plan.mesh, name=path)


def load(tag: str = "latest", directory="checkpoints", mesh: Mesh | None = None,
         layouts=None, like=None) -> Checkpoint:
    """Checkpoint `tag` ("latest": the newest committed) from `directory`.

    Without `mesh`: numpy arrays (global values). With `mesh`: every saved
    DTensor as a DTensor on `mesh`, each rank reading only its shard, laid
    out by default in the saved layout where `mesh` has its axes and divides
    the shape, else replicated; `layouts` chooses instead:
      - one ShardSpec for every tensor;
      - a dict {path: ShardSpec or None}, paths as the manifest spells them
        ("tensors.blocks.0.wq"), or a tree shaped like the saved ones
        ({"tensors": {"blocks": [{"wq": spec}]}}), or a mix; every path must
        name a saved leaf;
      - a function (path, shape) -> ShardSpec or None.
    A tensor `layouts` gives None (or a dict does not name) loads replicated,
    or as numpy if it was saved as numpy. `like`: {"tensors": tree,
    "optimizer": tree, ...} of arrays or DTensors the checkpoint must match
    (same tree, same global shapes; a DTensor's layout and mesh are used).
    Collective when `mesh` is the job's. Nothing is returned unless
    everything loaded."""
    where = user_frame()
    directory = _directory(directory, "checkpoint.load")
    if mesh is not None:
        check_mesh("checkpoint.load", mesh, where)
    _settle()
    tag, manifest = _read_manifest(directory, tag)
    if layouts is not None and mesh is None:
        raise CheckpointError(f"checkpoint '{tag}': layouts= lays tensors out on a mesh, but "
                              f"no mesh= was given (without one, load returns numpy arrays)  "
                              f"[{where}]")
    like = like or {}
    # Every argument is checked against the manifest, and every leaf's layout
    # chosen, before any block is read: the verdict then depends only on what
    # every rank shares (the manifest, the arguments, the mesh), so in a
    # collective load all ranks raise the same error or none does, and no
    # rank goes on to a collective that the others never reach.
    rule = _layout_rule(layouts, manifest, tag, where) if layouts is not None else None
    plans = {}
    for name in TREES:
        if name not in manifest["trees"]:
            if like.get(name) is not None:
                raise CheckpointError(f"checkpoint '{tag}': it holds no '{name}' tree  [{where}]")
            continue
        entries = manifest["leaves"][name]
        likes = [None] * len(entries)
        if like.get(name) is not None:
            want = dict(zip(paths(like[name], name), flatten(like[name])[0]))
            have = {e["path"] for e in entries}
            missing = sorted(set(want) - have)
            if missing:
                raise CheckpointError(f"checkpoint '{tag}': tensor {missing[0]} is missing "
                                      f"({len(missing)} of the target's leaves are)  [{where}]")
            likes = [want.get(e["path"]) for e in entries]
        plans[name] = [_plan(e, tag, mesh, rule, w, where) for e, w in zip(entries, likes)]
    reader = _Reader(directory, tag, manifest)
    trees = dict.fromkeys(TREES)
    for name, leaf_plans in plans.items():
        structure = _structure_from_json(manifest["trees"][name])
        trees[name] = unflatten(structure, [_load_leaf(p, reader) for p in leaf_plans])
    return Checkpoint(tag, trees["tensors"], trees["optimizer"], trees["extra"], manifest)
