"""Differential fuzzing across ranks: random programs with random ShardSpecs
on 2 ranks (1-D mesh) and 4 ranks (2 x 2 mesh), one mpiexec per mesh, each
program checked against its replicated run and float64 numpy
(distributed_worker.py); random expert-parallel MoE layers on an `ep` mesh
of 2 ranks against one device (moe_ep_worker.py). The ShardSpecs that do not divide a dimension
are checked to be refused with an error naming the tensor."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import oracles

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("ranks, kind, examples", [(2, "1d", 30), (4, "2d", 16)])
def test_random_sharded_programs_match_one_device(run_mpi, tmp_path, ranks, kind, examples):
    """Every program, sharded at random over the mesh (gradient programs
    too), gives the replicated run's results and numpy's; a failure names the
    rank and prints the shrunk program as a script for mpiexec."""
    examples = oracles.DEVELOPER_EXAMPLES or examples
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = run_mpi(ranks, HERE / "distributed_worker.py", kind, examples, tmp_path, env=env,
                   timeout=60 + 30 * examples)
    current = tmp_path / "current.py"
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:] + "\n--- running ---\n"
                                  + (current.read_text() if current.exists() else ""))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["failure"] is None, result["failure"]
    assert result["programs"] >= examples


def test_random_expert_parallel_moe_layers_match_one_device(run_mpi, tmp_path):
    """op.moe layers drawn at random (sizes, k, capacity, GELU or SwiGLU,
    with gradients or not), experts split over an `ep` mesh of 2 ranks, give
    the one-device layer's results and the float64 reference's output
    (moe_ep_worker.py); a failure names the rank and the layer."""
    examples = oracles.DEVELOPER_EXAMPLES or 6
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = run_mpi(2, HERE / "moe_ep_worker.py", examples, tmp_path, env=env,
                   timeout=60 + 40 * examples)
    current = tmp_path / "current.json"
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:] + "\n--- running ---\n"
                                  + (current.read_text() if current.exists() else ""))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["failure"] is None, result["failure"]
    assert result["programs"] >= examples


def test_indivisible_shard_spec_is_an_error_naming_the_tensor():
    """A ShardSpec splitting a dimension its mesh axes do not divide is
    refused where the tensor is made, naming it, the dimension, the axes
    and the line."""
    from tessera import dist
    from tessera.errors import ShardingError
    mesh = dist.Mesh(axes=["dp", "tp"], devices=[[0, 1], [2, 3]])
    rng = np.random.default_rng(0)
    for shape, spec, wrong in [
            ((3, 4), dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),
             "dimension 0 (size 3) is not divisible by mesh axis 'dp' (size 2)"),
            ((4, 5), dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),
             "dimension 1 (size 5) is not divisible by mesh axis 'tp' (size 2)"),
            ((2, 4), dist.ShardSpec(partition=(0, 0), mesh_axes=("dp", "tp")),
             "dimension 0 (size 2) is not divisible by mesh axis 'dp' (size 2) × 'tp' (size 2)")]:
        x = rng.standard_normal(shape).astype(np.float32)
        with pytest.raises(ShardingError) as err:
            activations = dist.from_numpy(x, spec, mesh)      # noqa: F841
        assert str(err.value).startswith(f"activations: {wrong}  [") \
            and "test_fuzz_distributed.py:" in str(err.value), str(err.value)
