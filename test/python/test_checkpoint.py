"""tessera.checkpoint: sharded safetensors checkpoints, committed by one
rename, saved asynchronously from a snapshot, loaded onto other meshes and
layouts, surviving a rank killed mid-save, with errors that name the tag,
tensor and file."""

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tessera import checkpoint, dist
from tessera._pytree import flatten, paths
from tessera.checkpoint import CheckpointError
from tessera.errors import TesseraError

WORKER = Path(__file__).resolve().parent / "workers" / "checkpoint_worker.py"


def worker_model(seed):
    rng = np.random.default_rng(seed)        # as checkpoint_worker.model draws them
    return {"wqkv": rng.standard_normal((8, 12)).astype(np.float32),
            "wo": rng.standard_normal((12, 8)).astype(np.float32),
            "ln": rng.standard_normal(8).astype(np.float32)}


def test_async_sharded_save_loads_onto_other_meshes(run_mpi, tmp_path):
    from safetensors.numpy import load_file
    out = tmp_path / "verdict.json"
    proc = run_mpi(4, WORKER, "save", tmp_path / "ck", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads(out.read_text())
    errors = verdict["errors"]
    # Every rank's shard on the saving mesh and on tp=4 / dp=4 equals the values
    # at the call, though the caller overwrote them as soon as save returned.
    for name in ("same mesh", "tp=4", "dp=4"):
        assert errors[name] == 0.0, name
        assert errors[f"{name} extra"] == [7, {"epoch": 1, "offset": 96}, True], name
    assert "('tp',)" in errors["tp=4 wqkv layout"]          # the saved layout where it fits
    assert errors["dp=4 wqkv layout"] == str(dist.ShardSpec())   # replicated where not
    assert errors["tree wo"] == 0.0 and "(0,)" in errors["tree wo layout"]   # layouts tree
    assert errors["pending-sum ln"] == 0.0             # a partial `like`: the value once
    assert len(verdict["typo"]) == 4                       # every rank refused the typo
    for refused in verdict["typo"]:
        assert "'tensors.wqvk', which is not a tensor" in refused, refused
        assert "the closest saved path is tensors.wqkv" in refused, refused
    # One writer per block: the dp=1 replicas (ranks 2, 3) write nothing.
    assert verdict["files"] == ["manifest.json", "rank00000.safetensors", "rank00001.safetensors"]
    # Without MPI, one process: global numpy values, or a mesh's DTensors.
    values = worker_model(0)
    tensors, optimizer, extra = checkpoint.load("step_7", directory=tmp_path / "ck")
    for k, v in values.items():
        np.testing.assert_array_equal(tensors[k], v)
    assert optimizer["step"] == np.float32(7) and isinstance(optimizer["step"], np.float32)
    mesh = dist.Mesh(axes=["tp"], shape=(2,))
    on_mesh = checkpoint.load("latest", directory=tmp_path / "ck", mesh=mesh,
                              layouts={"tensors.wo": dist.ShardSpec((1,), ("tp",))}).tensors
    np.testing.assert_array_equal(on_mesh["wo"].block(1), values["wo"][:, 4:])
    # The files are plain safetensors; the manifest names each block's file.
    manifest = json.loads((tmp_path / "ck" / "step_7" / "manifest.json").read_text())
    wqkv = next(e for e in manifest["leaves"]["tensors"] if e["path"] == "tensors.wqkv")
    assert wqkv["shape"] == [8, 12] and wqkv["layout"]["mesh_axes"] == ["tp"]
    for block in wqkv["blocks"]:
        saved = load_file(str(tmp_path / "ck" / "step_7" / block["file"]))[block["key"]]
        c = block["start"][1]
        np.testing.assert_array_equal(saved, values["wqkv"][:, c:c + 6])


def test_rank_killed_during_async_save_leaves_previous_checkpoint(run_mpi, tmp_path):
    directory = tmp_path / "ck"
    proc = run_mpi(2, WORKER, "crash", directory, timeout=120)
    assert proc.returncode != 0                      # rank 1 died by SIGKILL mid-save
    assert checkpoint.latest(directory) == "good"
    assert checkpoint.list(directory) == ["good"]
    tensors = checkpoint.load("latest", directory=directory).tensors
    for k, v in worker_model(1).items():
        np.testing.assert_array_equal(tensors[k], v)
    stale = list(directory.glob(".tmp-*"))
    assert stale, "the killed save left no temporary directory (did it finish?)"
    checkpoint.save("next", tensors={"x": np.zeros(3, np.float32)}, directory=directory)
    assert not list(directory.glob(".tmp-*"))        # cleaned up by the next save
    assert checkpoint.list(directory) == ["good", "next"]


def test_round_trip_dtypes_extras_and_retention(tmp_path):
    from safetensors.numpy import load_file
    rng = np.random.default_rng()
    tree = {"w": rng.standard_normal((3, 5)).astype(np.float32),
            "half": rng.standard_normal((4,)).astype(ml_dtypes.bfloat16),
            "ids": rng.integers(0, 9, (2, 2)).astype(np.int32),
            "layers": [{"g": rng.standard_normal(2)}, (np.float64(2.5), None)]}
    scaler = {"scale": np.float32(1024.0), "good_steps": np.float32(3)}
    data = np.random.default_rng(5)
    data.standard_normal(10)
    for step in range(4):
        checkpoint.save(f"step_{step}", tensors=tree, extra={"step": step, "scaler": scaler,
                        "rng": data, "note": "ok"}, directory=tmp_path, keep=2)
    assert checkpoint.list(tmp_path) == ["step_2", "step_3"]        # keep=2, oldest first
    assert checkpoint.latest(tmp_path) == "step_3"
    back = checkpoint.load("step_2", directory=tmp_path)
    assert back.tag == "step_2" and back.optimizer is None
    assert back.tensors["half"].dtype == ml_dtypes.bfloat16
    for got, want in ((back.tensors["w"], tree["w"]), (back.tensors["half"], tree["half"]),
                      (back.tensors["ids"], tree["ids"]),
                      (back.tensors["layers"][0]["g"], tree["layers"][0]["g"])):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert back.tensors["layers"][1] == (2.5, None) and isinstance(back.tensors["layers"], list)
    assert back.extra["step"] == 2 and back.extra["note"] == "ok"
    assert back.extra["scaler"]["scale"] == np.float32(1024.0)
    assert back.extra["rng"].standard_normal() == data.standard_normal()   # same stream
    on_disk = load_file(str(tmp_path / "step_2" / "rank00000.safetensors"))
    assert on_disk["tensors.half@0"].dtype == ml_dtypes.bfloat16          # bf16 stays bf16
    # A tag saved again replaces the old one.
    checkpoint.save("step_3", tensors={"w": tree["w"] * 2}, directory=tmp_path)
    np.testing.assert_array_equal(checkpoint.load("step_3", directory=tmp_path).tensors["w"],
                                  tree["w"] * 2)


def test_errors_name_tag_tensor_and_file(tmp_path):
    w = np.random.default_rng().standard_normal((4, 4)).astype(np.float32)
    checkpoint.save("a", tensors={"w": w, "b": np.ones(4, np.float32)}, directory=tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint 'zz' does not exist in .*committed "
                                              r"tags: a"):
        checkpoint.load("zz", directory=tmp_path)
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        checkpoint.load(directory=tmp_path / "empty")
    with pytest.raises(CheckpointError, match=r"tensor tensors.v is missing"):
        checkpoint.load("a", directory=tmp_path, like={"tensors": {"v": w, "w": w}})
    with pytest.raises(CheckpointError, match=r"tensor tensors.w has global shape \[4, 4\], "
                                              r"but the target expects \[4, 8\]"):
        checkpoint.load("a", directory=tmp_path, like={"tensors": {"w": np.zeros((4, 8))}})
    with pytest.raises(CheckpointError, match=r"tensors.w .* does not fit layout"):
        checkpoint.load("a", directory=tmp_path, mesh=dist.Mesh(axes=["tp"], shape=(3,)),
                        layouts={"tensors.w": dist.ShardSpec((0,), ("tp",))})
    with pytest.raises(CheckpointError, match=r"tensors.step is a object"):
        checkpoint.save("b", tensors={"step": object()}, directory=tmp_path)
    with pytest.raises(CheckpointError, match="must be a non-empty name"):
        checkpoint.save("../up", tensors={"w": w}, directory=tmp_path)
    manifest = tmp_path / "a" / "manifest.json"
    good = manifest.read_text()
    manifest.write_text(good.replace('"version": 1', '"version": 99'))
    with pytest.raises(CheckpointError, match="format version 99, newer than"):
        checkpoint.load("a", directory=tmp_path)
    manifest.write_text(good)
    data = tmp_path / "a" / "rank00000.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF                                       # one flipped byte
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"checkpoint 'a': file .*rank00000.safetensors is "
                                              r"corrupt or truncated"):
        checkpoint.load("a", directory=tmp_path)
    data.write_bytes(bytes(raw[:100]))                    # truncated
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        checkpoint.load("a", directory=tmp_path)


def test_example_resumes_bitwise_as_if_never_stopped(tmp_path):
    """train_gpt.py --checkpoint-dir: 3 steps, stop, --resume to 6 ends with
    the same bits (parameters, AdamW state, loss scale, data position) as 6
    steps in one go."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
    common = [sys.executable, str(example), "--width", "32", "--depth", "1", "--heads", "2",
              "--batch", "8", "--length", "4", "--save-every", "3",
              "--plot", str(tmp_path / "loss.png")]

    def run(*args):
        proc = subprocess.run(common + list(args), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout
    run("--steps", "6", "--checkpoint-dir", tmp_path / "straight")
    run("--steps", "3", "--checkpoint-dir", tmp_path / "stopped")
    out = run("--steps", "6", "--checkpoint-dir", tmp_path / "stopped", "--resume")
    assert "resumed from checkpoint step_3" in out
    a = checkpoint.load("step_6", directory=tmp_path / "straight")
    b = checkpoint.load("step_6", directory=tmp_path / "stopped")
    for name in ("tensors", "optimizer"):
        for path, x, y in zip(paths(getattr(a, name), name), flatten(getattr(a, name))[0],
                              flatten(getattr(b, name))[0]):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), path
    assert a.extra["step"] == b.extra["step"] == 6
    assert a.extra["rng"].bit_generator.state == b.extra["rng"].bit_generator.state
    # The files hold the same bytes too.
    assert (tmp_path / "straight" / "step_6" / "rank00000.safetensors").read_bytes() == \
        (tmp_path / "stopped" / "step_6" / "rank00000.safetensors").read_bytes()


def test_docs_examples_run(capsys):
    """docs/checkpoint-format.md's examples, as written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "checkpoint-format.md").read_text()
    examples = [part.split("```", 1)[0] for part in text.split("```python\n")[1:]]
    assert len(examples) == 2
    for code in examples:
        exec(compile(code, "docs/checkpoint-format.md", "exec"), {})
    assert "the closest saved path is tensors.blocks.0.wq" in capsys.readouterr().out


COL = dist.ShardSpec(("col",), ("tp",))          # split the last dimension over tp
ROW = dist.ShardSpec((0,), ("tp",))


def saved_blocks(directory):
    """A two-block model (numpy, and `ln` a tp-split DTensor), its optimizer
    state and extras, saved from one process as tag `s`."""
    rng = np.random.default_rng(3)
    tp = dist.Mesh(axes=["tp"], shape=(2,))
    blocks = [{"wq": rng.standard_normal((4, 8)).astype(np.float32),
               "wo": rng.standard_normal((8, 4)).astype(np.float32)} for _ in range(2)]
    ln = rng.standard_normal(8).astype(np.float32)
    checkpoint.save("s", tensors={"blocks": blocks, "ln": dist.from_numpy(ln, ROW, tp)},
                    optimizer={"m": {"blocks": [{k: v * 0.5 for k, v in b.items()}
                                                for b in blocks]}, "step": np.float32(3)},
                    extra={"step": 3}, directory=directory)
    return blocks, ln


def test_layouts_tree_or_flat_paths_load_each_tensor_in_its_layout(tmp_path):
    blocks, ln = saved_blocks(tmp_path)
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    tree = {"tensors": {"blocks": [{"wq": COL}, {"wo": ROW, "wq": None}]},
            "optimizer": {"m": {"blocks": [{"wq": COL}]}, "step": None},
            "extra": {"step": None}}                 # None: the default, on any saved leaf
    flat = {"tensors.blocks.0.wq": COL, "tensors.blocks.1.wo": ROW,
            "optimizer.m.blocks.0.wq": COL}
    mixed = {"tensors.blocks": [{"wq": COL}, {"wo": ROW}], "optimizer.m": {"blocks": [{"wq": COL}]}}
    for layouts in (tree, flat, mixed):
        tensors, optimizer, extra = checkpoint.load("s", directory=tmp_path, mesh=mesh,
                                                    layouts=layouts)
        b0, b1 = tensors["blocks"]
        assert b0["wq"].layout == COL and b0["wq"].dims == [(), ("tp",)]
        assert b1["wo"].layout == ROW and b1["wo"].dims == [("tp",), ()]
        assert optimizer["m"]["blocks"][0]["wq"].dims == [(), ("tp",)]
        # Today's default for a tensor layouts leaves out: replicated if saved
        # as a DTensor, numpy if saved as numpy.
        assert tensors["ln"].layout == dist.ShardSpec() and isinstance(b0["wo"], np.ndarray)
        np.testing.assert_array_equal(b0["wq"].numpy(), blocks[0]["wq"])
        np.testing.assert_array_equal(b0["wq"].block(1), blocks[0]["wq"][:, 4:])  # tp=1
        np.testing.assert_array_equal(b1["wo"].block(1), blocks[1]["wo"][4:])
        np.testing.assert_array_equal(optimizer["m"]["blocks"][0]["wq"].numpy(),
                                      blocks[0]["wq"] * 0.5)
        np.testing.assert_array_equal(tensors["ln"].numpy(), ln)
        assert extra["step"] == 3 and optimizer["step"] == np.float32(3)
    # Without layouts, the saved layout where the mesh has its axes.
    assert checkpoint.load("s", directory=tmp_path, mesh=mesh).tensors["ln"].layout == ROW


def test_layouts_that_name_no_saved_tensor_are_errors(tmp_path):
    saved_blocks(tmp_path)
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    data = tmp_path / "s" / "rank00000.safetensors"
    data.write_bytes(data.read_bytes()[:100])  # truncated: each error below comes before any read

    def refused(layouts, message, on=mesh):
        with pytest.raises(CheckpointError, match=message) as caught:
            checkpoint.load("s", directory=tmp_path, mesh=on, layouts=layouts)
        assert isinstance(caught.value, TesseraError)
        assert re.search(r"\[.*test_checkpoint\.py:\d+\]$", str(caught.value)), caught.value

    closest = "which is not a tensor of the checkpoint; the closest saved path is"
    refused({"tensors.blocks.0.wqq": COL}, f"'tensors.blocks.0.wqq', {closest} tensors.blocks.0.wq")
    refused({"tensors": {"blocks": [{"q": COL}]}}, f"'tensors.blocks.0.q', {closest} "
                                                   "tensors.blocks.0.wq")
    refused({"tensor": {"ln": ROW}}, f"'tensor.ln', {closest} tensors.ln")       # tree name
    refused({"tensors": {"ln": ROW, "typo": {}}}, "'tensors.typo', which is not a tensor")
    refused({"zzzzzz": ROW}, r"'zzzzzz', which is not a tensor of the checkpoint; its tensors "
                             r"are tensors.blocks.0.wo, .*\(10 in all\)")
    refused({"tensors": {"blocks": COL}}, r"gives tensors.blocks a ShardSpec, but tensors.blocks "
                                          r"is a subtree of the checkpoint \(tensors.blocks.0.wo, ")
    # Values that are not a ShardSpec or None, in every form.
    refused({"tensors": {"ln": ("tp",)}}, r"layouts gives tensors.ln a tuple \(\('tp',\)\), "
                                          r"not a ShardSpec or None")
    refused({"tensors.ln": "tp"}, "layouts gives tensors.ln a str")
    refused(lambda path, shape: "tp", r"layouts\('tensors.blocks.0.wo', \(8, 4\)\) returned "
                                      "a str, not a ShardSpec")
    refused([ROW], "layouts is a list; give one ShardSpec, a dict")
    refused({"extra": {"step": ROW}}, "gives extra.step a ShardSpec, but it is a saved JSON "
                                      "value, not a tensor")
    refused({"tensors.ln": ROW}, "layouts= lays tensors out on a mesh, but no mesh= was given",
            on=None)
    # A ShardSpec that does not fit its tensor names the tensor.
    refused({"tensors.ln": dist.ShardSpec((0,), ("ep",))},
            r"tensor tensors.ln \(global shape \[8\]\) does not fit layout .*mesh axis 'ep'")
    refused({"tensors.ln": dist.ShardSpec((1,), ("tp",))},
            r"tensor tensors.ln .* names dimension 1, but the tensor has rank 1")
    refused({"tensors.ln": dist.ShardSpec((0,), ("tp",))},
            r"tensor tensors.ln .* not divisible", on=dist.Mesh(axes=["tp"], shape=(3,)))
