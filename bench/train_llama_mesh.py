"""The example Llama's training step on 4 ranks, data parallel x tensor
parallel (dp = 2, tp = 2: Megatron's column/row splits over whole heads,
the batch over dp), in Tessera, PyTorch and JAX in one run: Tessera as 4
MPI ranks (`tessera launch -n 4` of examples/train_llama.py's step);
PyTorch as 4 processes over gloo (`torch.distributed.run`), transformers'
LlamaForCausalLM with TorchTitan's recipe: `parallelize_module` over the
tp sub-mesh (q, k, v, gate, up column-wise; o and down row-wise; the
embedding and head replicated, as transformers' own tp plan has them),
gradients all-reduced over dp, clipping by the global norm, AdamW; JAX as
4 host devices of one process (`--xla_force_host_platform_device_count=4`,
Tessera's parameter layouts as `NamedSharding`s, the step compiled by
GSPMD). All train the same checkpoint on the same batches with AdamW and
torch's gradient clipping. Prints each side's time per step (the median
after the first, which compiles), the ratios, and the loss curves' largest
relative gaps to Tessera's. A peer that is not installed is said so.

    pip install torch transformers jax optax      # beside Tessera
    python bench/train_llama_mesh.py              # 30 steps, the example's model
    python bench/train_llama_mesh.py --steps 30 --width 256

On a machine with fewer than 4 cores the sides share them: the ranks (and
XLA's devices) are oversubscribed alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

DP, TP = 2, 2


def _batches(args):
    import numpy as np
    import train_llama
    train_bytes, _, _ = train_llama.stdlib_text(2.0)
    rng = np.random.default_rng(0)
    return [train_llama.windows(train_bytes, rng.integers(0, len(train_bytes) - args.seq - 1,
                                                         args.batch), args.seq)
            for _ in range(args.steps)]


def tessera_rank(args) -> None:
    """One rank of the Tessera run (under tessera launch -n 4): rank 0 writes
    the losses and step times to args.out."""
    import numpy as np

    import tessera as ts
    from tessera import dist, models
    import train_llama

    mesh = dist.Mesh(axes=["dp", "tp"], shape=(DP, TP))
    model = models.from_pretrained(args.checkpoint)
    opt = ts.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    layout = model.layout(mesh)
    params = dist.from_tree(model.params, layout, mesh)
    state = dist.from_tree(opt.init(model.params), layout, mesh)
    step = train_llama.make_step(model, opt, clip=1.0)
    losses, seconds = [], []
    for batch in _batches(args):
        start = time.perf_counter()
        loss, params, state = step(params, state,
                                   dist.from_tree(batch, dist.ShardSpec((0,), ("dp",)), mesh))
        losses.append(float(loss))
        seconds.append(time.perf_counter() - start)
    if mesh.rank == 0:
        Path(args.out).write_text(json.dumps({"losses": losses, "seconds": seconds}))


def torch_rank(args) -> None:
    """One rank of the PyTorch run (under torch.distributed.run, 4
    processes over gloo): rank 0 writes the losses and step times."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    # Tessera's layout of the projections (parallel_layout: a dimension tp
    # does not divide, like the MLP's 341 columns, stays whole).
    from tessera.pretrained import LlamaConfig, parallel_layout
    config = LlamaConfig.from_json(json.loads((Path(args.checkpoint) / "config.json")
                                              .read_text()), args.checkpoint)
    shapes, plan = config.parameter_shapes(), {}
    for name, shape in shapes.items():
        layout = parallel_layout(config, name, shape, tp=TP)
        module = name.rsplit(".", 1)[0]
        if layout is not None and module.startswith("model.layers."):
            plan[module] = ColwiseParallel() if layout.partition[0] == 0 else RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=False)
    dp_group, tp_group = mesh["dp"].get_group(), mesh["tp"].get_group()
    rows = args.batch // DP
    first = mesh.get_local_rank("dp") * rows
    losses, seconds = [], []
    for batch in _batches(args):
        start = time.perf_counter()
        opt.zero_grad()
        ids = torch.tensor(batch["inputs"][first:first + rows]).long()
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            torch.tensor(batch["targets"][first:first + rows]).long().reshape(-1))
        loss.backward()
        # dp: the gradients' mean over the batch's halves; then torch's
        # clip_grad_norm_ rule over the global norm (a split gradient's
        # squares summed over tp, a replicated one's counted once).
        sharded, whole = torch.zeros(()), torch.zeros(())
        for q in params:
            local = q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad
            dist.all_reduce(local, group=dp_group)
            local /= DP
            if isinstance(q.grad, DTensor):
                sharded += local.pow(2).sum()
            else:
                whole += local.pow(2).sum()
        dist.all_reduce(sharded, group=tp_group)
        scale = min(1.0, 1.0 / (float((sharded + whole).sqrt()) + 1e-6))
        for q in params:
            (q.grad.to_local() if isinstance(q.grad, DTensor) else q.grad).mul_(scale)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=dp_group)
        losses.append(float(mean) / DP)
        seconds.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({
            "losses": losses, "seconds": seconds,
            "version": f"torch {torch.__version__}, transformers {transformers.__version__}"}))
    dist.destroy_process_group()


def torch_run(args, folder, scratch: Path):
    """The PyTorch run's (losses, seconds, version), or None where torch or
    transformers is not installed."""
    if not all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        print("torch or transformers is not installed: no PyTorch run "
              "(pip install torch transformers)")
        return None
    out = scratch / "torch.json"
    flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
             ("steps", "batch", "seq", "width", "depth", "heads", "kv_heads", "lr")]
    subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={DP * TP}",
                    "--master-addr=127.0.0.1", "--master-port=29517", __file__, "--torch-rank",
                    f"--checkpoint={folder}", f"--out={out}", *flags], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    theirs = json.loads(out.read_text())
    return theirs["losses"], theirs["seconds"], theirs["version"]


def jax_run(args, params, config):
    """Losses and seconds per step of the JAX step over a dp x tp mesh of
    host devices."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numpy as np
    from tessera.pretrained import parallel_layout
    from train_llama_peers import jax_losses, jax_training
    mesh = Mesh(np.array(jax.devices()[:DP * TP]).reshape(DP, TP), ("dp", "tp"))

    def spec(name, shape):          # the example's Megatron layout, as a NamedSharding
        layout = parallel_layout(config, name, shape, tp=TP)
        if layout is None:
            return NamedSharding(mesh, P())
        dim = layout.partition[0]
        return NamedSharding(mesh, P(*[("tp" if d == dim else None) for d in range(len(shape))]))
    p = {k: jax.device_put(jnp.asarray(v), spec(k, v.shape)) for k, v in params.items()}
    rows = NamedSharding(mesh, P("dp", None))
    tx, step = jax_training(config, args.lr)
    opt_state = tx.init(p)

    losses, seconds = jax_losses(step, p, opt_state, _batches(args),
                                 lambda x: jax.device_put(x, rows))
    return losses, seconds, f"jax {jax.__version__}, optax {optax.__version__}"


def main() -> None:
    from train_llama_peers import model_arguments
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(ap, steps=30)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--torch-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        tessera_rank(args)
        return
    if args.torch_rank:
        torch_rank(args)
        return
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={DP * TP}").strip()
    import numpy as np

    from tessera import models
    import train_llama

    with tempfile.TemporaryDirectory() as scratch:
        folder = train_llama.new_checkpoint(Path(scratch) / "init", args.width, args.depth,
                                            args.heads, args.kv_heads, args.seq, 0)
        out = Path(scratch) / "tessera.json"
        flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                 ("steps", "batch", "seq", "width", "depth", "heads", "kv_heads", "lr")]
        subprocess.run([sys.executable, "-m", "tessera", "launch", "-n", str(DP * TP),
                        __file__, "--rank", f"--checkpoint={folder}", f"--out={out}", *flags],
                       check=True)
        ours = json.loads(out.read_text())
        peers = {}
        torch_result = torch_run(args, folder, Path(scratch))
        if torch_result is not None:
            peers["torch"] = (torch_result, "4 processes over gloo")
        if all(importlib.util.find_spec(m) for m in ("jax", "optax")):
            model = models.from_pretrained(folder)
            peers["jax"] = (jax_run(args, model.params, model.config), "4 host devices")
        else:
            print("jax or optax is not installed: no JAX run (pip install jax optax)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    ours_s, a = np.median(ours["seconds"][1:]), np.array(ours["losses"])
    versions = "; ".join(version for (_, _, version), _ in peers.values())
    print(f"machine: {platform.machine()} {os.cpu_count()} cores; tessera {commit}; {versions}")
    print(f"Llama {args.depth} layers, width {args.width}, {args.heads} heads ({args.kv_heads} "
          f"key/value); batch {args.batch} x {args.seq}; dp={DP} x tp={TP}; {args.steps} AdamW "
          f"steps; time per step: the median after the first")
    print(f"tessera  loss: step 1 {a[0]:.4f}, step {args.steps} {a[-1]:.4f}; "
          f"{ours_s * 1e3:.1f} ms/step (4 MPI ranks)")
    for name, ((losses, seconds, _), how) in peers.items():
        b, theirs_s = np.array(losses), np.median(seconds[1:])
        gap = np.abs(a - b) / np.abs(b)
        print(f"{name:8s} loss: step 1 {b[0]:.4f}, step {args.steps} {b[-1]:.4f}; "
              f"{theirs_s * 1e3:.1f} ms/step ({how}); gap to tessera: largest {gap.max():.2e}; "
              f"{name} / tessera time {theirs_s / ours_s:.2f}")

if __name__ == "__main__":
    main()
