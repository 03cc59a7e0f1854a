"""Causal grouped-query attention, forward and backward, on the CPU: Tessera's
flash kernels (`op.attention`) against PyTorch's
`scaled_dot_product_attention` (its CPU flash kernel) in one run, at the
Llama example's shape (batch 8, 128 positions, 4 query heads over 2
key/value heads of 32) or another. Prints each side's time per call (the
median of `--repeats` after a warm-up) and the ratio; both check their
results against float64 numpy first.

    python bench/cpu_attention.py                       # the example's shape, 1 thread
    python bench/cpu_attention.py --seq 512 --threads 2

`--threads` sets Tessera's and torch's threads alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def reference(q, k, v, do):
    """float64 (out, dq, dk, dv) of causal GQA attention, [B, S, H, D]."""
    import numpy as np
    q, k, v, do = (t.astype(np.float64) for t in (q, k, v, do))
    group = q.shape[2] // k.shape[2]
    kk, vv = (np.repeat(t, group, axis=2) for t in (k, v))
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p, vv)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(q.shape[-1])
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk)
    dkk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    dvv = np.einsum("bhqk,bqhd->bkhd", p, do)
    fold = (lambda t: t.reshape(*t.shape[:2], k.shape[2], group, t.shape[-1]).sum(3))
    return out, dq, fold(dkk), fold(dvv)


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for var in ("TESSERA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    import numpy as np
    import tessera as ts
    from tessera import op

    rng = np.random.default_rng(0)
    b, s, d = args.batch, args.seq, args.head_dim
    q, do = (rng.standard_normal((b, s, args.heads, d)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((b, s, args.kv_heads, d)).astype(np.float32) for _ in range(2))
    want = reference(q, k, v, do)

    @ts.jit
    def ours(q, k, v, do):
        out = op.attention(q, k, v, causal=True, seq_dim=1)
        return (out, *ts.grad(op.sum(out * do), [q, k, v]))
    got = [np.asarray(t) for t in ours(q, k, v, do)]
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err < 1e-4, (name, err)
    tessera_s = timed(lambda: ours(q, k, v, do), args.repeats)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {args.threads} thread(s); "
          f"tessera {commit}")
    print(f"causal GQA attention [B={b}, S={s}, H={args.heads}/{args.kv_heads}, D={d}], "
          f"forward and backward")
    print(f"tessera {tessera_s * 1e3:.2f} ms per call")
    try:
        import torch
    except ImportError:
        print("torch is not installed: no comparison (pip install torch)")
        return 0
    torch.set_num_threads(args.threads)
    tq, tk, tv = (torch.tensor(t).transpose(1, 2).contiguous().requires_grad_()
                  for t in (q, k, v))
    tdo = torch.tensor(do).transpose(1, 2)

    def theirs():
        for t in (tq, tk, tv):
            t.grad = None
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                               enable_gqa=True)
        out.backward(tdo)
        return out
    out = theirs()
    for name, g, w in zip(("out", "dq", "dk", "dv"),
                          (out.detach(), tq.grad, tk.grad, tv.grad), want):
        err = np.abs(g.transpose(1, 2).numpy() - w).max() / np.abs(w).max()
        assert err < 1e-4, (name, err)
    torch_s = timed(theirs, args.repeats)
    print(f"torch {torch.__version__} {torch_s * 1e3:.2f} ms per call; "
          f"torch / tessera time {torch_s / tessera_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
