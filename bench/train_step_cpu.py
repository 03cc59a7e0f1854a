"""One GPT training step on the CPU: Tessera against PyTorch (eager, float32)
and, when jax is installed, JAX (`jax.jit`, one CPU device).

What it measures: the wall time of ONE training step of the example GPT in
`examples/train_gpt.py` (forward, backward, global-norm gradient clipping at
1.0 and AdamW), compiled by Tessera (`ts.jit`), against the same model and
step written in plain PyTorch, eager mode, float32, in the same process on the
same batch. It prints the median step time of each and the ratio
Tessera / PyTorch (> 1: Tessera is slower).

Steps:
  1. correctness: one step of each from identical parameters on the identical
     batch; the two losses must agree (exit 1 if they differ by more than 1e-4
     relative), and the largest difference of an updated parameter is shown;
  2. timing: warm-up (Tessera's first call compiles and is left out), then
     --steps steps of Tessera here and of PyTorch in a process of its own, in
     --rounds rounds (the ratio is the median of the rounds' ratios: this
     VM's speed drifts by +-15% over minutes, alike for both peers of a round)
     (--peer alternate: alternating in this one, which shares the machine's
     drift but lets each framework's spinning idle threads slow the other:
     PyTorch's w128 step more than twice as slow alternating as alone); the
     median per-step time of each; then the same step under `jax.jit` in a
     process of its own (`bench/dp_tp_step.py`'s JAX worker on one device,
     the same parameters, batch and AdamW; its first loss must match too);
  3. where Tessera's time goes: a few more Tessera steps with the CPU engine's
     generated kernels and library routines (matmul, reshape,
     transpose, ... on numpy) timed; the rest of the step is the runtime's and
     the Python front end's overhead.

Results are printed and written to bench/results/train_step_cpu-<date>-<N>thread.json/.md.

Run it from the repository root (the script puts the checkout's packages on
sys.path itself; torch must be importable):

    .venv/bin/python bench/train_step_cpu.py                      # defaults: width 128, depth 2, ...
    .venv/bin/python bench/train_step_cpu.py --steps 5            # quick check
    .venv/bin/python bench/train_step_cpu.py --width 256 --batch 64

Threads: PyTorch uses --threads (default: all cores). Tessera runs its
generated kernels (a launch of >= 64 KiB) and its float32 GEMMs on one OpenMP
team of TESSERA_NUM_THREADS threads (default: all cores), each member calling
numpy's OpenBLAS one-threaded on a block of the GEMM's result
(`tessera_runtime.engines.cpu.team_sgemm`); where numpy's OpenBLAS lacks the
entry points for that, the GEMMs go to numpy.matmul on OpenBLAS's own
threads, the kernels thread from 4 MiB only, and for a step with GEMMs of
>= 8 MiB OpenBLAS's idle threads sleep after 2^4 cycles
(TESSERA_BLAS_THREAD_TIMEOUT). The PyTorch peer (MKL, OpenMP) runs in a
process started with this script's own environment. To pin both to N
threads: TESSERA_NUM_THREADS=N .venv/bin/python bench/train_step_cpu.py --threads N
With several threads each, OpenBLAS's and PyTorch's (OpenMP) idle threads
spin-wait and compete for the cores, all the more on a busy machine: the times
then swing widely. On a small or shared machine, pin both to 1 thread for a
steady comparison.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in ("examples", "runtime", "passes", ".", "build/dev/python_packages"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

# What OpenBLAS reads when numpy loads it (Tessera's CPU engine changes it
# unless it is set), and the environment the peer processes start with.
BLAS_TIMEOUT = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
START_ENV = dict(os.environ)

import numpy as np  # noqa: E402

import kernel_roofline  # noqa: E402  (bench/kernel_roofline.py)
import tessera as ts  # noqa: E402
import train_gpt  # noqa: E402  (examples/train_gpt.py)
from tessera_runtime import profiler  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402
except ImportError as e:
    sys.exit(f"train_step_cpu: cannot import torch ({e}); install a CPU build, e.g. "
             f"`.venv/bin/pip install torch==2.13.0`")

LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 3e-3, (0.9, 0.98), 1e-8, 0.01, 1.0


# -- the two training steps ---------------------------------------------------------

def tree_map(fn, tree):
    """fn over the leaves of nested dicts/lists (the parameter tree)."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [tree_map(fn, v) for v in tree]
    return fn(tree)


def tree_leaves(tree) -> list:
    out = []
    tree_map(out.append, tree)
    return out


class TesseraStep:
    """The example's compiled step (`train_gpt.make_step`), fp32, one microbatch."""

    def __init__(self, params: dict, batch: dict, heads: int):
        opt = ts.optim.AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        self.fn = train_gpt.make_step(opt, heads, "fp32", clip=CLIP)
        self.params, self.opt_state = params, opt.init(params)
        self.scaler = ts.optim.loss_scale_init(1.0)
        self.microbatches = [batch]

    def __call__(self):
        loss, self.params, self.opt_state, self.scaler, norm = self.fn(
            self.params, self.opt_state, self.scaler, self.microbatches)
        return float(loss), float(norm)


class TorchStep:
    """The same model and step in eager PyTorch, parameters copied from numpy."""

    def __init__(self, params: dict, batch: dict, heads: int):
        self.params = tree_map(lambda a: torch.tensor(a, dtype=torch.float32, requires_grad=True),
                               params)
        self.leaves = tree_leaves(self.params)
        self.opt = torch.optim.AdamW(self.leaves, lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY)
        self.inputs = torch.from_numpy(batch["inputs"]).long()
        self.targets = torch.from_numpy(batch["targets"]).long()
        self.heads = heads

    def loss(self) -> torch.Tensor:
        p, tokens = self.params, self.inputs
        B, S = tokens.shape
        D = p["wte"].shape[1]
        H, Dh = self.heads, D // self.heads
        x = F.embedding(tokens, p["wte"]) + p["wpe"]
        for blk in p["blocks"]:                 # op.transformer_block, pre-LayerNorm
            h = F.layer_norm(x, (D,), blk["ln1_w"], blk["ln1_b"], eps=1e-5)
            qkv = (h @ blk["wqkv"]).reshape(B, S, H, 3, Dh)     # columns grouped by head
            q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
            # Fused causal attention (PyTorch's CPU SDPA kernel), scale 1/sqrt(Dh):
            # the same maths as Tessera's masked softmax(q k^T * scale) v.
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(B, S, D) @ blk["wo"]
            h = F.layer_norm(x, (D,), blk["ln2_w"], blk["ln2_b"], eps=1e-5)
            x = x + (F.gelu(h @ blk["w1"] + blk["b1"], approximate="tanh") @ blk["w2"] + blk["b2"])
        x = F.layer_norm(x, (D,), p["lnf_w"], p["lnf_b"], eps=1e-5)
        logits = x @ p["head"]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1),
                               ignore_index=-100)

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.leaves, CLIP)
        self.opt.step()
        return float(loss.detach()), float(norm)


# -- where Tessera's time goes --------------------------------------------------------

class EngineProfile:
    """Time spent in the CPU engine's generated kernels and library routines."""

    def __init__(self):
        self.kernel_s = defaultdict(float)      # generated kernel name -> seconds
        self.kernel_n = defaultdict(int)        # generated kernel name -> calls
        self.library_s = defaultdict(float)     # library routine -> seconds
        self.kernel_calls = 0
        self.library_calls = defaultdict(int)

    @contextmanager
    def installed(self):
        """Turns on the runtime's per-launch timing (tessera_runtime.profiler)."""
        profiler.start()
        try:
            yield self
        finally:
            times = profiler.stop().totals()
            for key, (seconds, calls) in times.items():
                if key.startswith("library:"):
                    self.library_s[key[len("library:"):]] += seconds
                    self.library_calls[key[len("library:"):]] += calls
                else:
                    self.kernel_s[key] += seconds
                    self.kernel_n[key] += calls
                    self.kernel_calls += calls


def breakdown(step: TesseraStep, steps: int) -> dict:
    """Per-step milliseconds: generated kernels, each library routine, the rest."""
    prof = EngineProfile()
    total = 0.0
    with prof.installed():
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            total += time.perf_counter() - t0
    ms = lambda s: 1e3 * s / steps  # noqa: E731
    kernels = sum(prof.kernel_s.values())
    library = sum(prof.library_s.values())
    top = sorted(prof.kernel_s.items(), key=lambda kv: -kv[1])[:5]
    # Each kernel against this machine's roofline (bench/kernel_roofline.py).
    from tessera_runtime.engines.cpu import (THREADED_MIN_BYTES, THREADED_MIN_BYTES_BESIDE_OPENBLAS,
                                             default_threads, team_sgemm)
    fn = step.fn
    peaks = kernel_roofline.measure_peaks(default_threads())
    rows = kernel_roofline.kernel_rows(Path(fn._bundles[fn._last_key]), prof.kernel_s,
                                       prof.kernel_n, peaks, THREADED_MIN_BYTES if team_sgemm()
                                       else THREADED_MIN_BYTES_BESIDE_OPENBLAS)
    return {
        "profiled_steps": steps,
        "step_ms": ms(total),
        "generated_kernels_ms": ms(kernels),
        "generated_kernel_launches": prof.kernel_calls // steps,
        "library_ms": {r: ms(s) for r, s in sorted(prof.library_s.items(), key=lambda kv: -kv[1])},
        "library_calls": {r: n // steps for r, n in prof.library_calls.items()},
        "overhead_ms": ms(total - kernels - library),
        "top_kernels_ms": {k: ms(s) for k, s in top},
        "roofline": {"peaks": peaks, "kernels": rows,
                     "table": kernel_roofline.table(rows, peaks)},
    }


# -- reporting -------------------------------------------------------------------------

def machine() -> dict:
    processor = platform.processor()
    if not processor:                           # often empty on Linux
        try:
            processor = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                             if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"processor": processor, "cpu_count": os.cpu_count(), "platform": platform.platform()}


def git_commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def markdown(r: dict) -> str:
    c, b = r["config"], r["tessera_breakdown"]
    lines = [
        f"# Training step on the CPU: Tessera vs PyTorch ({r['date']})",
        "",
        f"- machine: {r['machine']['processor']}, {r['machine']['cpu_count']} cores, "
        f"{r['machine']['platform']}",
        f"- commit {r['git_commit']}, torch {r['torch_version']}, numpy {r['numpy_version']}; "
        f"torch threads {r['torch_threads']}, OPENBLAS_NUM_THREADS {r['openblas_num_threads']}",
        f"- GPT: width {c['width']}, depth {c['depth']}, heads {c['heads']}, seq {c['seq']}, "
        f"batch {c['batch']}, {c['parameters']:,} parameters; fp32; AdamW + clip 1.0",
        f"- correctness: loss Tessera {r['check']['loss_tessera']:.7f}, PyTorch "
        f"{r['check']['loss_torch']:.7f}; max |d blocks.0.wqkv| after the step "
        f"{r['check']['max_abs_diff_blocks0_wqkv']:.2e}",
        "",
        "| | median ms / step |",
        "| --- | ---: |",
        f"| Tessera | {r['tessera_ms']:.2f} |",
        f"| PyTorch (eager) | {r['torch_ms']:.2f} |",
        f"| **ratio Tessera / PyTorch** | **{r['ratio']:.2f}** |",
    ]
    if r.get("jax_ms"):
        lines += [f"| JAX {r['jax_version']} jit (one device, own process) | {r['jax_ms']:.2f} |",
                  f"| **ratio Tessera / JAX** | **{r['ratio_jax']:.2f}** |"]
    lines += [
        "",
        f"Medians of {c['steps']} steps each, "
        + ("alternating." if r.get("peer") == "alternate" else
           f"PyTorch in a process of its own, in {len(r.get('rounds', [1]))} rounds after "
           "Tessera's (the step times are the medians over the rounds, the ratio the median "
           "of the rounds' ratios: " + " / ".join(f"{x['ratio']:.2f}" for x in r.get("rounds", []))
           + ")."),
        "",
        f"## Where Tessera's time goes (mean of {b['profiled_steps']} instrumented steps)",
        "",
        "| part | ms / step | calls / step |",
        "| --- | ---: | ---: |",
        f"| generated kernels | {b['generated_kernels_ms']:.2f} | {b['generated_kernel_launches']} |",
    ]
    lines += [f"| library: {name} | {ms:.2f} | {b['library_calls'][name]} |"
              for name, ms in b["library_ms"].items()]
    lines += [f"| runtime / Python overhead | {b['overhead_ms']:.2f} | |",
              f"| **step** | **{b['step_ms']:.2f}** | |", ""]
    if "roofline" in b:
        lines += ["## Generated kernels against the roofline (the instrumented steps)", "",
                  b["roofline"]["table"], ""]
    return "\n".join(lines)


def print_summary(r: dict) -> None:
    b = r["tessera_breakdown"]
    print(f"\nmedian per step over {r['config']['steps']} steps:")
    print(f"  Tessera  {r['tessera_ms']:9.2f} ms")
    print(f"  PyTorch  {r['torch_ms']:9.2f} ms")
    print(f"  ratio Tessera / PyTorch: {r['ratio']:.2f}")
    if r.get("jax_ms"):
        print(f"  JAX jit  {r['jax_ms']:9.2f} ms  (jax {r['jax_version']}, one device)")
        print(f"  ratio Tessera / JAX: {r['ratio_jax']:.2f}")
    print(f"\nwhere Tessera's time goes (ms per step, mean of {b['profiled_steps']} "
          f"instrumented steps, {b['step_ms']:.2f} ms each):")
    print(f"  generated kernels          {b['generated_kernels_ms']:8.2f}   "
          f"({b['generated_kernel_launches']} launches)")
    for name, ms in b["library_ms"].items():
        print(f"  library {name:<18} {ms:8.2f}   ({b['library_calls'][name]} calls)")
    print(f"  runtime / Python overhead  {b['overhead_ms']:8.2f}")
    print("  slowest generated kernels: " + ", ".join(
        f"{k} {ms:.2f}" for k, ms in b["top_kernels_ms"].items()))
    print("\ngenerated kernels against the roofline:\n" + b["roofline"]["table"])


# -- main ---------------------------------------------------------------------------------

def jax_peer(args) -> dict | None:
    """The same step under `jax.jit` on one CPU device, in a process of its
    own (`bench/dp_tp_step.py`'s JAX worker at dp = tp = 1: the same
    parameters, batch and AdamW); None without jax."""
    try:
        import jax  # noqa: F401
    except ImportError:
        print("(jax is not installed: no JAX column; pip install jax)")
        return None
    import dp_tp_step
    return dp_tp_step.run_jax({"width": args.width, "depth": args.depth, "heads": args.heads,
                               "batch": args.batch, "length": args.length, "dp": 1, "tp": 1,
                               "seed": args.seed}, args.steps)


def timed(step, warmup: int, steps: int) -> list[float]:
    """Seconds of each of `steps` calls of `step`, after `warmup` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def time_peer(args) -> int:
    """(--peer process) The PyTorch step alone in this process: its first
    step and the warm-up untimed, then `steps` timed; seconds to --peer-times."""
    torch.set_num_threads(args.threads)
    params = train_gpt.init_params(args.width, args.depth, args.heads, 2 * args.length, args.seed)
    batch = train_gpt.make_batch(np.random.default_rng(args.seed), args.batch, args.length)
    pt_step = TorchStep(params, batch, args.heads)
    Path(args.peer_times).write_text(json.dumps(timed(pt_step, 1 + args.warmup, args.steps)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=8, help="digits to reverse (seq = 2 x length)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each after the first")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="instrumented Tessera steps for the breakdown")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer", choices=["process", "alternate"], default="process",
                    help="time PyTorch in a process of its own after Tessera (default), or "
                         "alternate steps in this one (each framework's idle threads, "
                         "OpenBLAS's and OpenMP's, then spin against the other's step)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="(--peer process) rounds of Tessera's steps here and PyTorch's in a "
                         "process of its own; the ratio is the median of the rounds' ratios, "
                         "so a drift of the machine's speed falls on both peers of a round")
    ap.add_argument("--peer-times", help=argparse.SUPPRESS)   # (internal) the peer process
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    if args.peer_times:
        return time_peer(args)

    torch.set_num_threads(args.threads)
    from tessera_runtime.engines.cpu import default_threads, team_sgemm
    blas_threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset (all cores)")
    blas_timeout = f"{BLAS_TIMEOUT} (set before the start)" if BLAS_TIMEOUT else \
        "spin 2^28 cycles, or 2^4 for a step with large GEMMs (Tessera's CPU engine)"
    if team_sgemm():
        blas_threads = "one per call, on Tessera's kernel threads"
        blas_timeout = "no OpenBLAS worker runs"
    seq = 2 * args.length
    params = train_gpt.init_params(args.width, args.depth, args.heads, seq, args.seed)
    batch = train_gpt.make_batch(np.random.default_rng(args.seed), args.batch, args.length)
    n_params = sum(a.size for a in tree_leaves(params))
    print(f"GPT: width {args.width}, depth {args.depth}, heads {args.heads}, seq {seq}, "
          f"batch {args.batch}, {n_params:,} parameters, fp32")
    print(f"torch {torch.__version__}: {torch.get_num_threads()} threads; numpy's BLAS "
          f"(Tessera's matmul): threads {blas_threads}, idle workers "
          f"{blas_timeout}; Tessera's kernels: {default_threads()} threads; "
          f"{os.cpu_count()} cores")

    # Both copy the same numpy parameters (PyTorch first: torch.tensor copies).
    pt_step = TorchStep(params, batch, args.heads)
    ts_step = TesseraStep(params, batch, args.heads)

    # 1. Correctness: the first step of each, from the same start.
    t0 = time.perf_counter()
    ts_loss, ts_norm = ts_step()
    compile_s = time.perf_counter() - t0
    pt_loss, pt_norm = pt_step()
    wqkv_diff = float(np.max(np.abs(ts_step.params["blocks"][0]["wqkv"]
                                    - pt_step.params["blocks"][0]["wqkv"].detach().numpy())))
    rel = abs(ts_loss - pt_loss) / max(abs(pt_loss), 1e-12)
    print(f"first Tessera step (compiles, or loads the cached build): {compile_s:.1f} s")
    print(f"check: loss Tessera {ts_loss:.7f}  PyTorch {pt_loss:.7f}  (rel diff {rel:.1e}); "
          f"grad norm {ts_norm:.6f} vs {pt_norm:.6f}; "
          f"max |d blocks.0.wqkv| after the step {wqkv_diff:.2e} (lr {LR:g})")
    if rel > 1e-4:
        print(f"FAIL: the losses differ by {rel:.2e} relative (> 1e-4)")
        return 1

    # 2. Timing: warm up, then alternate, or Tessera here and PyTorch in a
    # process of its own (from the same parameters and batch).
    if args.peer == "alternate":
        for _ in range(args.warmup):
            ts_step()
            pt_step()
        ts_times, pt_times = [], []
        for _ in range(args.steps):
            for step, times in ((ts_step, ts_times), (pt_step, pt_times)):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
        rounds = [(ts_times, pt_times)]
    else:
        del pt_step
        rounds = []
        for r in range(max(1, args.rounds)):
            ts_times = timed(ts_step, args.warmup if r == 0 else 1, args.steps)
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "peer.json"
                subprocess.run([sys.executable, __file__,
                                *(argv if argv is not None else sys.argv[1:]),
                                "--peer-times", str(out)], check=True, env=START_ENV)
                pt_times = json.loads(out.read_text())
            rounds.append((ts_times, pt_times))
            print(f"round {r + 1}: Tessera {1e3 * statistics.median(ts_times):.2f} ms, PyTorch "
                  f"{1e3 * statistics.median(pt_times):.2f} ms", flush=True)
    round_ms = [(1e3 * statistics.median(t), 1e3 * statistics.median(p)) for t, p in rounds]
    ts_ms = statistics.median(t for t, _ in round_ms)
    pt_ms = statistics.median(p for _, p in round_ms)
    ratio = statistics.median(t / p for t, p in round_ms)
    jx = jax_peer(args)
    if jx is not None and abs(jx["first_loss"] - pt_loss) > 1e-4 * abs(pt_loss):
        print(f"FAIL: JAX's first loss {jx['first_loss']:.7f} is not PyTorch's {pt_loss:.7f}")
        return 1

    # 3. Where Tessera's time goes.
    parts = breakdown(ts_step, args.profile_steps)

    date = datetime.date.today().isoformat()
    result = {
        "benchmark": "train_step_cpu",
        "date": date,
        "machine": machine(),
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "openblas_num_threads": blas_threads,
        "openblas_thread_timeout": blas_timeout,
        "tessera_kernel_threads": default_threads(),
        "peer": args.peer,
        "config": {"width": args.width, "depth": args.depth, "heads": args.heads,
                   "length": args.length, "seq": seq, "batch": args.batch,
                   "parameters": n_params, "steps": args.steps, "warmup": args.warmup,
                   "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY,
                   "clip": CLIP, "precision": "fp32",
                   "torch_attention": "F.scaled_dot_product_attention(is_causal=True)"},
        "check": {"loss_tessera": ts_loss, "loss_torch": pt_loss, "loss_rel_diff": rel,
                  "grad_norm_tessera": ts_norm, "grad_norm_torch": pt_norm,
                  "max_abs_diff_blocks0_wqkv": wqkv_diff},
        "tessera_compile_s": compile_s,
        "tessera_ms": ts_ms,
        "torch_ms": pt_ms,
        "ratio": ratio,
        "rounds": [{"tessera_ms": t, "torch_ms": p, "ratio": t / p} for t, p in round_ms],
        "jax_version": jx["jax"] if jx else None,
        "jax_ms": 1e3 * jx["median_step_s"] if jx else None,
        "ratio_jax": ts_ms / (1e3 * jx["median_step_s"]) if jx else None,
        "tessera_ms_all": [1e3 * t for times, _ in rounds for t in times],
        "torch_ms_all": [1e3 * t for _, times in rounds for t in times],
        "tessera_breakdown": parts,
    }
    print_summary(result)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from cpu_ranks import new_stem
    stem = new_stem(out, f"train_step_cpu-{date}-{torch.get_num_threads()}thread")
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown(result))
    print(f"\nwrote {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path} "
          f"and {md_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
