"""Tessera's flash-attention kernels against PyTorch's best attention
(`scaled_dot_product_attention`: the fastest of its flash, cuDNN and
memory-efficient backends that run here, for the forward and for the
backward), causal, bf16, in the same run on the same GPU: forward, and
backward (dQ, dK, dV).

    python bench/attention_cuda.py                        # B=4 H=16 S=4096 D=64, 128
    python bench/attention_cuda.py --seq 2048 8192 --dims 64 --iters 20
    python bench/attention_cuda.py --variants mma.sync wgmma-cp.async   # without wgmma, TMA
    python bench/attention_cuda.py --variants wgmma wgmma:64x128   # forward blocks 64x128 too
    python bench/attention_cuda.py --kit gpu_kit --build-only   # compile here (no GPU)
    PYTHONPATH=runtime python bench/attention_cuda.py --kit gpu_kit   # run there

Tessera's times are its kernels alone (forward; `_dkdv` + `_dq` for the
backward, whose `delta = rowsum(dO * O)` is a separate small kernel in both
implementations and left out of both: torch's backward kernel computes it
inside, so torch's backward time includes it). Checks Tessera's output
against torch's, prints TFLOP/s and the ratio (torch time / Tessera time),
and writes bench/results/attention_cuda-<date>.{json,md}.

Variants of Tessera's kernels: `wgmma` (the default: on sm_90a every dot
of the three loops is a wgmma.mma_async, B from a 128-byte-swizzled ring
that the tensor memory accelerator fills where the kernel asks for it),
`wgmma-cp.async` (the same ring filled by cp.async), `mma.sync` (the
same loops on mma.sync.m16n8k16 with ldmatrix: what plain sm_90 runs) and
`wgmma-pingpong` (`wgmma`, with a forward block of two warpgroups taking
turns at the tensor cores: TargetOptions.pingpong) and `wgmma-ahead`
(`wgmma`, with each forward step issuing the next one's Q K^T under its
softmax: TargetOptions.issue_ahead); any
with `:BMxBN` times forward blocks of BM query rows and BN keys per step in
place of the compiler's (TargetOptions.attention_forward_blocks), at head widths
up to 128. By default the bench times the compiler's kernels on all three,
the wgmma forward at 64x32 and 64x128 around its 64x64, and at 128x64 and
128x128 (two warpgroups sharing each key/value tile), with and without
ping-pong, and issuing ahead at 64x64 and 128x64: the GPU's answer picks
the defaults.
"""

from __future__ import annotations

import argparse

import numpy as np

from cuda_bench import (add_kit_arguments, bundle_engine, gpu_bundle, results_meta, time_cuda,
                        torch_bf16, write_results)


def attention_step(q, k, v, do):
    """Causal attention and its gradients for the output gradient `do`."""
    import tessera as ts
    from tessera import op

    def loss(q, k, v):
        return op.sum(op.mul(op.cast(op.attention(q, k, v, causal=True), ts.f32),
                             op.cast(do, ts.f32)))
    return (op.attention(q, k, v, causal=True),) + tuple(ts.grad(loss(q, k, v), [q, k, v]))


#: The TargetOptions of each variant's loops (SWITCHES).
LOOPS = {"wgmma": (True, True, False, False), "wgmma-cp.async": (True, False, False, False),
         "mma.sync": (False, False, False, False), "wgmma-pingpong": (True, True, True, False),
         "wgmma-ahead": (True, True, False, True)}
SWITCHES = ("wgmma", "tma", "pingpong", "issue_ahead")
#: The results table: header -> a row's cell.
COLUMNS = {"B": lambda r: str(r["batch"]), "H": lambda r: str(r["heads"]),
           "S": lambda r: str(r["seq"]), "D": lambda r: str(r["d"]),
           "variant": lambda r: r["variant"],
           "fwd TFLOP/s": lambda r: f"{r['tessera_fwd_tflops']:.1f}",
           "torch fwd TFLOP/s": lambda r: f"{r['torch_fwd_tflops']:.1f}",
           "fwd ratio": lambda r: f"{r['fwd_ratio']:.2f}",
           "bwd ratio": lambda r: f"{r['bwd_ratio']:.2f}",
           "step ratio": lambda r: f"{r['step_ratio']:.2f}",
           "torch fwd / bwd / step backend":
               lambda r: f"{r['fwd_peer']} / {r['bwd_peer']} / {r['step_peer']}",
           "max rel err": lambda r: f"{r['max_rel_err']:.1e}" + ("" if r["valid"] else " WRONG")}
#: A forward output further than this from torch's (relative to its
#: largest element) marks the row wrong: its times do not count.
MAX_REL_ERR = 0.02
DEFAULT_VARIANTS = ["wgmma", "wgmma-cp.async", "mma.sync", "wgmma:64x32", "wgmma:64x128",
                    "wgmma:128x64", "wgmma:128x128", "wgmma-pingpong:128x64",
                    "wgmma-pingpong:128x128", "wgmma-ahead", "wgmma-ahead:128x64"]


def variant_spec(text: str) -> tuple[str, tuple[int, int] | None]:
    """A loop kind of LOOPS, alone or with `:BMxBN` forward blocks."""
    loops, _, blocks = text.partition(":")
    if loops not in LOOPS:
        raise argparse.ArgumentTypeError(f"variant {text!r}: loops are one of {', '.join(LOOPS)}")
    if loops == "wgmma-pingpong" and not blocks.startswith("128x"):
        raise argparse.ArgumentTypeError(f"variant {text!r}: ping-pong takes two warpgroups: "
                                         "forward blocks of 128 rows, e.g. wgmma-pingpong:128x64")
    if not blocks:
        return loops, None
    try:
        bm, bn = (int(n) for n in blocks.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"variant {text!r}: blocks are BMxBN, e.g. 64x128")
    if bm % 16 or bn % 16 or bm < 16 or bn < 16:
        raise argparse.ArgumentTypeError(
            f"variant {text!r}: BM and BN are multiples of 16 (a warp per 16 query rows; "
            "wgmma needs whole warpgroups: BM = 64 or 128)")
    return loops, (bm, bn)


def variant_name(spec) -> str:
    loops, blocks = spec
    return loops + (f":{blocks[0]}x{blocks[1]}" if blocks else "")


def attention_options(spec, **changes):
    """The TargetOptions attention is compiled with to run its loops and
    forward blocks as `spec` (from variant_spec) says, with `changes`; None
    where the compiler is not installed (on a GPU machine without it the
    bundles come from the kit)."""
    try:
        import tessera as ts
    except ImportError:
        return None
    loops, blocks = spec
    options = ts.TargetOptions(target="gpu", **dict(zip(SWITCHES, LOOPS[loops])), **changes)
    if blocks:
        options = options.with_(attention_forward_blocks=tuple(
            (width, blocks if width <= 128 else default)
            for width, default in options.attention_forward_blocks))
    return options


#: torch's fused attention backends, the fastest of which is the peer.
TORCH_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def torch_attention_times(q, k, v, do, iters: int, cp) -> tuple[dict, object]:
    """({backend: (forward s, backward s)}, the output of the first that
    ran) of torch's causal scaled_dot_product_attention on each fused
    backend of TORCH_BACKENDS that runs these tensors here (cuDNN's needs
    a recent cuDNN; the others may refuse a shape)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    times, reference = {}, None
    for name in TORCH_BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                forward = time_cuda(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                    iters, cp)
                backward = time_cuda(lambda: torch.autograd.grad(out, (q, k, v), do,
                                                                 retain_graph=True), iters, cp)
                torch.cuda.synchronize()    # a failed launch raises here, not in our kernels
        except RuntimeError as e:           # "No available kernel", an unsupported cuDNN
            print(f"torch SDPA {name.lower()}: not available here ({str(e).splitlines()[0]})")
            continue
        times[name.lower()] = (forward, backward)
        if reference is None:
            reference = out.detach().float().cpu().numpy()
    return times, reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, nargs="+", default=[4096])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variants", nargs="+", type=variant_spec,
                    default=[variant_spec(v) for v in DEFAULT_VARIANTS],
                    help="which of Tessera's kernels to time: loops of wgmma (on TMA), "
                         "wgmma-cp.async or mma.sync, any with :BMxBN forward blocks (default: "
                         f"{' '.join(DEFAULT_VARIANTS)})")
    add_kit_arguments(ap)
    args = ap.parse_args(argv)

    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    cases = [(seq, d) for seq in args.seq for d in args.dims]
    bundles = {}
    variants = [variant_name(spec) for spec in args.variants]
    for spec, variant in zip(args.variants, variants):
        options = attention_options(spec)
        for seq, d in cases:
            shape = (args.batch, args.heads, seq, d)
            name = f"attention-{'x'.join(map(str, shape))}" + \
                ("" if variant == "wgmma" else "-" + variant.replace(":", "-fwd"))
            bundles[seq, d, variant] = gpu_bundle(args.kit, name, attention_step,
                                                  *(np.zeros(shape, bf16) for _ in range(4)),
                                                  options=options)
    if args.build_only:
        print(f"compiled {', '.join(str(b) for b in bundles.values())}")
        return 0

    import cupy as cp

    from tessera_runtime.bf16 import to_f32 as bf16_to_f32

    rows, meta = [], results_meta(cp, args.kit)
    for seq, d in cases:
        shape = (args.batch, args.heads, seq, d)
        rng = np.random.default_rng(0)
        q, k, v, do = (rng.standard_normal(shape).astype(bf16) for _ in range(4))
        tq, tk, tv, tdo = (torch_bf16(x).requires_grad_(True) for x in (q, k, v, do))
        peers, want = torch_attention_times(tq, tk, tv, tdo, args.iters, cp)
        if not peers:
            raise SystemExit(f"no torch SDPA backend runs causal bf16 attention of {shape}")
        # The peer of each pass is the fastest backend at it; a training
        # step runs one backend for both (`step_peer`, the fastest sum).
        (fwd_peer, t_ref), (bwd_peer, t_ref_bwd) = (
            min(((name, t[i]) for name, t in peers.items()), key=lambda p: p[1]) for i in (0, 1))
        step_peer = min(peers, key=lambda name: sum(peers[name]))
        print(f"S={seq} D={d} torch: " + ", ".join(
            f"{name} forward {t[0] * 1e3:.2f} ms, backward {t[1] * 1e3:.2f} ms"
            for name, t in peers.items()), flush=True)
        for variant in variants:
            engine = bundle_engine(bundles[seq, d, variant])
            names = list(engine._launches)
            fwd = next(n for n in names if "_attention_" in n and "grad" not in n)
            dkdv = next(n for n in names if n.endswith("_dkdv"))
            dq = next(n for n in names if n.endswith("_dq"))
            stream = engine.stream("compute")
            dq_, dk_, dv_, dout = (engine.from_host(x) for x in (q, k, v, do))
            out = engine.alloc(shape, bf16)
            lse = engine.alloc(shape[:-1] + (1,), np.float32)
            grads = [engine.alloc(shape, bf16) for _ in range(3)]
            run_fwd = engine.prepare_launch(fwd, 5, stream)
            fwd_args = [dq_, dk_, dv_, out, lse]
            t_fwd = time_cuda(lambda: run_fwd(fwd_args), args.iters, cp, stream)
            stream.synchronize()
            o32 = bf16_to_f32(cp, out)
            delta = (o32 * bf16_to_f32(cp, dout)).sum(-1, keepdims=True).astype(cp.float32)
            run_kv = engine.prepare_launch(dkdv, 8, stream)
            run_q = engine.prepare_launch(dq, 7, stream)
            common = [dq_, dk_, dv_, dout, lse, delta]

            def backward():
                run_kv(common + [grads[1], grads[2]])
                run_q(common + [grads[0]])
            t_bwd = time_cuda(backward, args.iters, cp, stream)
            err = float(np.abs(cp.asnumpy(o32) - want).max() / np.abs(want).max())
            # Causal: half of the 4*B*H*S^2*D forward FLOPs; backward 2.5x forward.
            flops = 2.0 * args.batch * args.heads * seq * seq * d
            rows.append({"batch": args.batch, "heads": args.heads, "seq": seq, "d": d,
                         "variant": variant,
                         "tessera_fwd_ms": t_fwd * 1e3, "torch_fwd_ms": t_ref * 1e3,
                         "tessera_bwd_ms": t_bwd * 1e3, "torch_bwd_ms": t_ref_bwd * 1e3,
                         "tessera_fwd_tflops": flops / t_fwd / 1e12,
                         "torch_fwd_tflops": flops / t_ref / 1e12,
                         "fwd_ratio": t_ref / t_fwd, "bwd_ratio": t_ref_bwd / t_bwd,
                         "step_ratio": sum(peers[step_peer]) / (t_fwd + t_bwd),
                         "max_rel_err": err, "valid": err < MAX_REL_ERR,
                         "fwd_peer": fwd_peer, "bwd_peer": bwd_peer, "step_peer": step_peer,
                         "peers_ms": {name: [t[0] * 1e3, t[1] * 1e3]
                                      for name, t in peers.items()},
                         "config": {n: engine._launches[n] for n in (fwd, dkdv, dq)}})
            r = rows[-1]
            print(f"S={seq} D={d} {variant}: forward Tessera {r['tessera_fwd_tflops']:.1f} "
                  f"TFLOP/s, torch {r['torch_fwd_tflops']:.1f} TFLOP/s, ratio "
                  f"{r['fwd_ratio']:.2f}; backward ratio {r['bwd_ratio']:.2f}; step ratio "
                  f"{r['step_ratio']:.2f} (max rel err {err:.1e}"
                  + ("" if r["valid"] else f": WRONG, over {MAX_REL_ERR}; the times do not count")
                  + ")")
            # After every row: a later case that faults or hangs keeps these.
            write_results("attention_cuda",
                          "Tessera flash attention vs torch SDPA's fastest backend (causal, bf16)",
                          COLUMNS, rows, meta, ("batch", "heads", "seq", "d", "variant"),
                          args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
