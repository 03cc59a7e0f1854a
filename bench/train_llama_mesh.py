"""The example Llama's training step on 4 ranks, data parallel x tensor
parallel (dp = 2, tp = 2: Megatron's column/row splits over whole heads,
the batch over dp), in Tessera and in JAX in one run: Tessera as 4 MPI
ranks (`tessera launch -n 4` of examples/train_llama.py's step), JAX as 4
host devices of one process (`--xla_force_host_platform_device_count=4`,
the same parameter layouts as `NamedSharding`s, the step compiled by GSPMD).
Both train the same checkpoint on the same batches with AdamW and torch's
gradient clipping. Prints each side's time per step (the median after the
first, which compiles), the ratio, and the two loss curves' largest
relative gap. PyTorch's 2-D parallelism (DTensor tensor parallelism inside
DDP over gloo) is not measured here.

    pip install jax optax                         # beside Tessera
    python bench/train_llama_mesh.py              # 30 steps, the example's model
    python bench/train_llama_mesh.py --steps 30 --width 256

On a machine with fewer than 4 cores both sides share them: the ranks (and
XLA's devices) are oversubscribed alike.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--checkpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        tessera_rank(args)
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
        model = models.from_pretrained(folder)
        theirs_losses, theirs_seconds, version = jax_run(args, model.params, model.config)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    ours_s, theirs_s = np.median(ours["seconds"][1:]), np.median(theirs_seconds[1:])
    a, b = np.array(ours["losses"]), np.array(theirs_losses)
    gap = np.abs(a - b) / np.abs(b)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores; tessera {commit}; {version}")
    print(f"Llama {args.depth} layers, width {args.width}, {args.heads} heads ({args.kv_heads} "
          f"key/value); batch {args.batch} x {args.seq}; dp={DP} x tp={TP}; {args.steps} AdamW "
          f"steps")
    print(f"loss: step 1 {a[0]:.4f} / {b[0]:.4f}, step {args.steps} {a[-1]:.4f} / {b[-1]:.4f} "
          f"(tessera / jax); largest relative gap {gap.max():.2e}")
    print(f"time per step (median after the first): tessera {ours_s * 1e3:.1f} ms (4 ranks), "
          f"jax {theirs_s * 1e3:.1f} ms (4 host devices); ratio (jax / tessera) "
          f"{theirs_s / ours_s:.2f}")


if __name__ == "__main__":
    main()
