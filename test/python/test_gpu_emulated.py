"""The GPU target without a GPU: generated CUDA kernels run in the CPU
emulator (`tessera_runtime.engines.cuda_emulator`: one thread per CUDA
thread, PTX warp instructions implemented from the ISA's definitions), and
are checked against numpy. What this proves: tile/fragment indexing,
pipeline-stage bookkeeping, register epilogues and shuffle reductions are
right. What it cannot: speed, and races a real GPU's timing would expose."""

import json
import os
import re

import numpy as np
import pytest

import tessera as ts
from tessera import op
from tessera_mlir import ir
from tessera_compiler.codegen import emit_cuda_kernels
from tessera_runtime.engines.cuda_emulator import EmulatedKernels

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16


def _gelu(h):
    return 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))


GEMM_CONFIGS = [(128, 256, 64, (8, 1), 4, True), (128, 128, 64, (8, 1), 3, True),
                (128, 128, 64, (8, 1), 2, True), (128, 128, 32, (2, 4), 3),
                (64, 64, 32, (2, 2), 3), (64, 32, 32, (2, 1), 3), (16, 16, 16, (1, 1), 2)]


def _gemm_options(config, **changes) -> ts.TargetOptions:
    """GPU options whose only GEMM configuration is `config` (GemmConfig's
    positional fields)."""
    return ts.TargetOptions(target="gpu", gemm_configs=(ts.GemmConfig(*config),), **changes)


def _config_id(c):
    return (f"{c[0]}x{c[1]}x{c[2]}-w{c[3][0]}x{c[3][1]}-s{c[4]}"
            + ("-wgmma" if len(c) > 5 else ""))


@pytest.mark.parametrize("config", GEMM_CONFIGS, ids=_config_id)
def test_tensor_core_gemm_with_fused_epilogue(config, monkeypatch, built_cleanly):
    """A batched bf16 GEMM + bias + GELU + residual, one kernel per config:
    tensor-core main loop (cp.async ring; ldmatrix and mma.sync, or
    wgmma from swizzled shared memory with 3+ stages keeping a group in
    flight) and the epilogue on the accumulator registers, against a
    float64 reference; built for sm_90a without spills where nvcc is."""
    options = _gemm_options(config, target_blocks=1)
    bm, bn, bk, _, stages = config[:5]
    rng = np.random.default_rng()
    batch, m, k, n = 2, 2 * bm, (stages + 2) * bk, bn      # more K steps than stages
    x = rng.standard_normal((batch, m, k)).astype(BF16)
    w = (rng.standard_normal((batch, k, n)) / np.sqrt(k)).astype(BF16)
    b = rng.standard_normal(n).astype(BF16)
    r = rng.standard_normal((batch, m, n)).astype(BF16)

    def layer(x, w, b, r):
        return op.gelu(op.matmul(x, w) + b) + r
    trace = ts.graph.trace(layer, x, w, b, r, target=options)
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu), options)
    gemm = [name for name in launches if "matmul" in name]
    assert len(gemm) == 1, launches
    assert f"block tile {bm}x{bn}x{bk}" in source and "tessera_mma_bf16(" in source
    assert (f"tessera_wgmma_bf16<{bn}, 1>(" in source) == (len(config) > 5)
    cfg = launches[gemm[0]]
    out = np.zeros((batch, m, n), BF16)
    EmulatedKernels(source).launch(gemm[0], [x, w, b.reshape(1, 1, n).copy(), r, out],
                                   cfg["grid"], cfg["block"], cfg["shared_bytes"],
                                   cfg.get("tensor_maps", ()))
    mm = (x.astype(np.float64) @ w.astype(np.float64))
    ref = _gelu(mm + b.astype(np.float64)) + r.astype(np.float64)
    # bf16: every op of the epilogue rounds to 8 bits of mantissa.
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0.04, atol=0.04)
    # Measured: the 2x4-warp mma.sync tile spills 24 bytes once the residual
    # add joins the epilogue (bias + GELU alone do not), at the 128
    # registers ptxas keeps for two blocks per SM; __launch_bounds__(256, 1)
    # would trade that for half the occupancy. Which is faster is the GPU's
    # answer.
    built_cleanly(source, spill_bytes=24 if config[3] == (2, 4) else 0)


@pytest.mark.parametrize("config", [(64, 64, 32, (2, 2), 3),
                                    (128, 128, 64, (8, 1), 3, True)], ids=_config_id)
def test_gemm_tiles_in_grouped_order(config, monkeypatch):
    """With more output tiles than blocks run at once (TargetOptions.target_blocks, here
    4), a GEMM's instances take its tiles in groups of tile rows (here 2 of
    the 4), column by column in a group: every tile of both batch entries is
    computed once, on mma.sync and on wgmma with a producer warpgroup's TMA
    copies (whose coordinates follow the grouped offsets)."""
    from tessera_passes.tile.gemm import gemm_group_rows
    options = _gemm_options(config, target_blocks=4)
    bm, bn, bk = config[:3]
    assert gemm_group_rows(4, 2, bm, bn, options) == 2
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 4 * bm, 2 * bk)).astype(BF16)
    w = (rng.standard_normal((2, 2 * bk, 2 * bn)) / 8).astype(BF16)
    trace = ts.graph.trace(lambda x, w: op.matmul(x, w), x, w, target=options)
    assert "arith.remui" in trace.tile
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu), options)
    (name, cfg), = launches.items()
    out = np.zeros((2, 4 * bm, 2 * bn), BF16)
    EmulatedKernels(source).launch(name, [x, w, out], cfg["grid"], cfg["block"],
                                   cfg["shared_bytes"], cfg.get("tensor_maps", ()))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0.02, atol=0.02)


def _wgmma_gemm(monkeypatch, stages=4, k_steps=6, tma=True, producer=True, **changes):
    """A 256 x 6*64 x 256 bf16 GEMM traced with the 128x256x64 wgmma
    configuration (TMA copies issued by a producer warpgroup, by thread 0
    between the computing warps' iterations, or cp.async), and other
    TargetOptions `changes`: inputs, CUDA source, kernel name, launch and
    reference."""
    options = ts.TargetOptions(
        target="gpu", target_blocks=1, **changes,
        gemm_configs=(ts.GemmConfig(128, 256, 64, (8, 1), stages, wgmma=True, tma=tma,
                                    producer=producer),))
    rng = np.random.default_rng()
    x = rng.standard_normal((256, 64 * k_steps)).astype(BF16)
    w = (rng.standard_normal((64 * k_steps, 256)) / 8).astype(BF16)
    trace = ts.graph.trace(lambda x, w: op.matmul(x, w), x, w, target=options)
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu), options)
    (name, cfg), = launches.items()
    return x, w, source, name, cfg, x.astype(np.float64) @ w.astype(np.float64)


def _emulate(source, name, cfg, x, w, defines=()):
    out = np.zeros((x.shape[0], w.shape[1]), BF16)
    EmulatedKernels(source, defines).launch(name, [x, w, out], cfg["grid"], cfg["block"],
                                            cfg["shared_bytes"], cfg.get("tensor_maps", ()))
    return out.astype(np.float64)


def _emulate_in_child(source, name, cfg, x, w, tmp_path):
    """`_emulate` in a forked process, for kernels the emulator may stop (it
    aborts on a broken mbarrier protocol rather than hang): (the output, or
    None if the process died, and what it wrote to stderr)."""
    return _in_child(lambda: _emulate(source, name, cfg, x, w), tmp_path)


def _in_child(run, tmp_path):
    """The array `run()` returns, computed in a forked process (None if the
    process died), and what the process wrote to stderr."""
    import faulthandler
    import gc
    import multiprocessing
    import os
    err, result = tmp_path / "stderr", tmp_path / "out.npy"

    def child():
        # A forked child has only the forking thread: the collector must not
        # destroy an MLIR context here, whose destructor joins its thread
        # pool's threads (they exist only in the parent; it segfaults).
        gc.disable()
        faulthandler.disable()      # the abort is expected: no Python traceback dump
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        np.save(result, run())
    gc.collect()                    # the parent's garbage dies in the parent
    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(300)
    assert process.exitcode is not None, "the emulated kernel hung"
    return (np.load(result) if process.exitcode == 0 else None), err.read_text()


def test_an_edited_emulator_header_builds_anew(tmp_path, monkeypatch):
    """The emulator's sources name its headers (engines/emulator/, found with
    -I): the cache key holds their contents, so an edited header compiles
    anew instead of reusing an object of the old."""
    import shutil
    from tessera_runtime import env
    from tessera_runtime.engines import cuda_emulator
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    headers = tmp_path / "emulator"
    shutil.copytree(cuda_emulator.EMULATOR_DIR, headers)
    monkeypatch.setattr(cuda_emulator, "EMULATOR_DIR", headers)
    src = '#include "tessera_emulator.h"\nint answer() { return 42; }\n'

    def build():
        return cuda_emulator._cached_compile(env.host_compiler(), src, ".o", ["-c"])
    first = build()
    assert build() == first
    common = headers / "tessera_emulator.h"
    common.write_text(common.read_text() + "// edited\n")
    assert build() != first


def test_emulator_gives_up_on_a_wait_nobody_completes(monkeypatch, tmp_path):
    """A kernel whose mbarrier phase never gets its second arrival would hang
    a GPU; the emulator stops it after TESSERA_EMULATOR_WAIT_S seconds with
    a message naming the barrier and what is missing."""
    source = r"""
extern "C" __global__ void lonely_wait(float* out) {
  uint64_t* bar = reinterpret_cast<uint64_t*>(tessera_smem + 64);
  if (threadIdx.x == 0) tessera_mbarrier_init(bar, 2);
  __syncthreads();
  if (threadIdx.x == 0) tessera_mbarrier_arrive(bar);
  tessera_mbarrier_wait(bar, 0);
  out[threadIdx.x] = 1.0f;
}
"""
    monkeypatch.setenv("TESSERA_EMULATOR_WAIT_S", "1")
    out, stderr = _in_child(lambda: _launch_one(source, "lonely_wait", 32), tmp_path)
    assert out is None
    assert re.search(r"mbarrier emulation: thread \d+ waited 1 s for phase parity 0 of the "
                     r"barrier at shared byte 64: 1 arrivals missing", stderr), stderr


def _launch_one(source, name, threads):
    out = np.zeros(threads, np.float32)
    EmulatedKernels(source).launch(name, [out], (1,), (threads,))
    return out


def test_wgmma_kernel_on_plain_sm90_runs_its_mma_sync_loop(monkeypatch):
    """A wgmma GEMM compiled without sm_90a's features (NVRTC through cupy
    targets plain sm_90) takes its mma.sync branch, which leaves the same
    accumulator layout: emulated with that branch, the result is right."""
    x, w, source, name, cfg, ref = _wgmma_gemm(monkeypatch)
    out = _emulate(source, name, cfg, x, w, defines=["TESSERA_EMULATE_NO_WGMMA"])
    np.testing.assert_allclose(out, ref, rtol=0.02, atol=0.05)


@pytest.mark.parametrize("copies", ["producer", "tma", "cp.async"])
def test_emulator_catches_a_slot_refilled_under_a_wgmma_in_flight(monkeypatch, copies, tmp_path):
    """The emulator runs TMA, cp.async and wgmma as late as PTX allows (and a
    copy's destination reads as NaN until it lands): a ring that refills the
    slot the still-running wgmma group reads gives wrong results, while the
    real kernel is right. Producer warpgroup: it refills without waiting for
    the computing warps to release the slot (the emulator stops: a slot's
    barrier gets a new phase's arrival before its last phase was waited
    for, or, when the other computing threads complete two phases first, a
    lagging thread waits for a parity that has come round again and the
    emulator gives up on that wait, as a GPU would hang); TMA from thread 0:
    copies one
    iteration further ahead; cp.async (the ring without `tma` loads): no lag
    for the group in flight."""
    from tessera_compiler.codegen.cuda import CudaKernelEmitter
    tma, producer = copies != "cp.async", copies == "producer"
    x, w, source, name, cfg, ref = _wgmma_gemm(monkeypatch, tma=tma, producer=producer)
    assert ("tessera_tma_load_2d(sa + " in source) == tma
    assert ("tessera_mbarrier_arrive(&empty" in source) == producer
    assert cfg["block"] == [384 if producer else 256]
    np.testing.assert_allclose(_emulate(source, name, cfg, x, w), ref, rtol=0.02, atol=0.05)
    if producer:
        feed = CudaKernelEmitter._producer_warpgroup
        monkeypatch.setattr(CudaKernelEmitter, "_producer_warpgroup",
                            lambda self, *a: feed(self, *a, skip_empty_wait=True))
    elif tma:
        staged = CudaKernelEmitter._tma_staged_loop
        monkeypatch.setattr(CudaKernelEmitter, "_tma_staged_loop",
                            lambda self, *a: staged(self, *a, ahead=self.stages))
    else:
        staged = CudaKernelEmitter.staged_loop
        monkeypatch.setattr(CudaKernelEmitter, "staged_loop",
                            lambda self, *a, lag=0, **kw: staged(self, *a, **kw))
    x, w, broken, name, cfg, ref = _wgmma_gemm(monkeypatch, tma=tma, producer=producer)
    assert "tessera_wgmma_wait<1>();" in broken and broken != source
    monkeypatch.setenv("TESSERA_EMULATOR_WAIT_S", "10")    # the hang is the broken kernel's
    out, stderr = _emulate_in_child(broken, name, cfg, x, w, tmp_path)
    if out is None:
        assert re.search(r"mbarrier emulation: (more arrivals than the barrier's count|"
                         r"thread \d+ waited 10 s for phase parity)", stderr), stderr
    else:
        assert not np.isfinite(out).all() or np.abs(out - ref).max() > 1.0


def _attention_forward(seq=128, d=64, **changes):
    """The causal bf16 attention forward kernel on wgmma (K and V through the
    ring, by TMA or cp.async as TargetOptions.tma says; Q's swizzled copy by
    cp.async), compiled with the TargetOptions `changes`: inputs, CUDA
    source, kernel name and launch."""
    options = ts.TargetOptions(target="gpu", **changes)
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 1, seq, d)).astype(BF16) for _ in range(3))
    trace = ts.graph.trace(lambda q, k, v: op.attention(q, k, v, causal=True), q, k, v,
                           target=options)
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu), options)
    (name, cfg), = ((n, c) for n, c in launches.items() if "_attention_" in n)
    return (q, k, v), source, name, cfg


def _attention_outputs(inputs) -> list:
    """Zeroed outputs of the attention forward kernel: out and lse."""
    return [np.zeros_like(inputs[0]), np.zeros(inputs[0].shape[:-1] + (1,), np.float32)]


def _launch_in_child(source, name, cfg, inputs, outputs, tmp_path):
    """Kernel `name` of `source` on the emulator over copies of `inputs` and
    `outputs`, in a forked process: (its first output as f32, or None if
    the process died; what it wrote to stderr)."""
    def launch():
        bufs = [a.copy() for a in list(inputs) + outputs]
        EmulatedKernels(source).launch(name, bufs, cfg["grid"], cfg["block"],
                                       cfg["shared_bytes"], cfg.get("tensor_maps", ()))
        return bufs[len(inputs)].astype(np.float32)
    return _in_child(launch, tmp_path)


@pytest.mark.parametrize("kernel", ["gemm-cp.async", "attention-cp.async", "attention-tma"])
def test_emulator_catches_cp_async_data_wgmma_reads_unfenced(kernel, monkeypatch, tmp_path):
    """cp.async lands through the generic proxy, wgmma reads through the
    async proxy: each thread must fence.proxy.async its landed copies before
    the barrier that hands them to wgmma. The emulator tracks which thread's
    copies are unfenced and stops a wgmma that reads them: the generated
    kernels run, and the same kernels without their fences stop with a
    message naming the operand and the threads. (With TMA filling the
    attention ring, Q's copy is the cp.async data left to fence.)"""
    if kernel.startswith("attention"):
        inputs, source, name, cfg = _attention_forward(tma=kernel == "attention-tma")
        assert ("(TMA for wgmma, cp.async for mma.sync," in source) == (kernel == "attention-tma")
        outputs = _attention_outputs(inputs)
        assert " on wgmma: A from its swizzled shared-memory copy" in source
    else:
        x, w, source, name, cfg, _ = _wgmma_gemm(monkeypatch, tma=False, producer=False)
        inputs, outputs = (x, w), [np.zeros((x.shape[0], w.shape[1]), BF16)]

    def run(src):
        return _launch_in_child(src, name, cfg, inputs, outputs, tmp_path)
    out, stderr = run(source)
    assert out is not None and np.isfinite(out).all(), stderr
    # Calls only: the PTX header's declaration of the fence stays.
    broken = re.sub(r"(?<!void )tessera_fence_proxy_async\(\);", "", source)
    assert broken != source
    out, stderr = run(broken)
    assert out is None, "the emulator ran wgmma on unfenced cp.async data"
    assert "cp.async wrote with no fence.proxy.async since" in stderr, stderr


@pytest.mark.parametrize("broken", ["last hand-over kept", "turns on one barrier"])
def test_emulator_catches_a_broken_pingpong_protocol(broken, monkeypatch, tmp_path):
    """The attention forward whose two warpgroups take turns at the tensor
    cores (TargetOptions.pingpong, blocks of 128 rows) runs on the
    emulator; with warpgroup 0 not taking warpgroup 1's last hand-over,
    the block ends with an arrival pending on the barrier, and with both
    warpgroups waiting on one barrier, they hand each other arrivals for
    barriers of the wrong size: the emulator stops with a message
    naming the barrier either way (a GPU would hang or misbehave)."""
    inputs, source, name, cfg = _attention_forward(
        seq=256, pingpong=True,
        attention_forward_blocks={64: (128, 64), 128: (128, 64), 256: (16, 16)})
    assert cfg["block"] == [256] and "take turns issuing their wgmmas" in source
    outputs = _attention_outputs(inputs)

    def run(src):
        return _launch_in_child(src, name, cfg, inputs, outputs, tmp_path)
    out, stderr = run(source)
    assert out is not None and np.isfinite(out).all(), stderr
    if broken == "last hand-over kept":
        taken = "if (n_it > 0 && (threadIdx.x >> 7) == 0) tessera_named_barrier_sync(1, 256);"
        wrong, message = source.replace(taken, ""), "arrivals pending at the end of block"
    else:
        wrong = source.replace("tessera_named_barrier_sync(1 + (threadIdx.x >> 7), 256);",
                               "tessera_named_barrier_sync(1, 128);")
        message = "named barrier emulation: barrier 1 used with"
    assert wrong != source
    out, stderr = run(wrong)
    assert out is None and message in stderr, stderr


def test_emulator_catches_scores_issued_ahead_of_their_tile(monkeypatch, tmp_path):
    """The forward that issues the next iteration's Q K^T ahead
    (TargetOptions.issue_ahead) must first wait for the next slot's
    TMA phase: without that wait the wgmma reads a tile that has not
    landed, which the emulator shows as NaN (a TMA destination reads as
    NaN until its phase is waited for)."""
    inputs, source, name, cfg = _attention_forward(seq=256, issue_ahead=True)
    outputs = _attention_outputs(inputs)

    def run(src):
        return _launch_in_child(src, name, cfg, inputs, outputs, tmp_path)
    out, stderr = run(source)
    assert out is not None and np.isfinite(out).all(), stderr
    landed = "tessera_mbarrier_wait(&full[(it + 1) % 3], (unsigned)((it + 1) / 3) & 1);"
    assert landed in source
    out, stderr = run(source.replace(landed, ""))
    assert out is not None and not np.isfinite(out).all(), stderr


@pytest.mark.parametrize("producer", [True, False], ids=["producer", "thread0"])
def test_wgmma_kernel_compiles_for_sm90a_and_plain_sm90(monkeypatch, producer, built_cleanly):
    """nvcc builds the 128x256 wgmma GEMM for sm_90a with wgmma.mma_async
    instructions fed by TMA copies (cp.async.bulk.tensor, counted on
    mbarriers; with a producer warpgroup, which hands its registers to the
    computing warps with setmaxnreg) and for plain sm_90 without any of
    them (its mma.sync branch on cp.async), all without register spills."""
    import subprocess
    from tessera_compiler.codegen.build import nvcc
    if nvcc() is None:
        pytest.skip("nvcc is not installed on this machine")
    _, _, source, name, _, _ = _wgmma_gemm(monkeypatch, producer=producer)
    for arch, has_wgmma in (("sm_90a", True), ("sm_90", False)):
        ptx = subprocess.run([nvcc(), f"-arch={arch}", "-std=c++17", "-O3", "-ptx", "-x", "cu", "-",
                              "-o", "-"], input=source, capture_output=True, text=True)
        assert ptx.returncode == 0, ptx.stderr[-2000:]
        issued = ptx.stdout.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16")
        assert (issued >= 4) if has_wgmma else issued == 0, (arch, issued)   # 4 per K step
        for tma in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                    "mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.expect_tx"):
            assert (tma in ptx.stdout) == has_wgmma, (arch, tma)
        for warp_specialized in ("setmaxnreg.dec.sync.aligned.u32 40", "setmaxnreg.inc.sync.aligned.u32 232",
                                 "mbarrier.arrive.shared::cta.b64"):
            assert (warp_specialized in ptx.stdout) == (has_wgmma and producer), (arch, warp_specialized)
        assert ("cp.async.cg.shared.global" in ptx.stdout) != has_wgmma, arch
        (report,) = built_cleanly(source, arch).values()
        # 384 threads at launch: 168 registers each (the producer's go to the others later).
        assert producer is False or report["registers"] <= 168, (arch, report)


@pytest.mark.parametrize("watchdog", [None, 5.0])
def test_mbarrier_watchdog_is_compiled_in_only_when_asked(monkeypatch, watchdog, built_cleanly):
    """TargetOptions.wait_watchdog_s (which bench/gpu_kit.py sets for its
    checks): the TMA GEMM's mbarrier waits read the global timer and trap
    after that many seconds; unset, the wait loop is the bare try_wait.
    Either builds for sm_90a without spills and without ptxas serializing
    the wgmmas (a call in the wait, such as a printf, would), so the checks
    test the asynchronous kernel; the emulator (which has its own limit)
    runs either."""
    import subprocess
    from tessera_compiler.codegen.build import nvcc
    x, w, source, name, cfg, ref = _wgmma_gemm(monkeypatch, k_steps=5, wait_watchdog_s=watchdog)
    assert ("#define TESSERA_WAIT_WATCHDOG_NS 5000000000ull" in source) == bool(watchdog)
    np.testing.assert_allclose(_emulate(source, name, cfg, x, w), ref, rtol=0.02, atol=0.05)
    if nvcc() is None:
        pytest.skip("nvcc is not installed on this machine")
    ptx = subprocess.run([nvcc(), "-arch=sm_90a", "-std=c++17", "-O3", "-ptx", "-x", "cu", "-",
                          "-o", "-"], input=source, capture_output=True, text=True)
    assert ptx.returncode == 0, ptx.stderr[-2000:]
    for watchdog_code in ("%globaltimer", "trap;"):
        assert (watchdog_code in ptx.stdout) == bool(watchdog), watchdog_code
    assert "call" not in ptx.stdout.split(".entry", 1)[1]
    assert len(built_cleanly(source)) == 1


def test_tma_gemm_runs_from_a_bundle_on_the_emulated_engine(monkeypatch):
    """ts.jit for the GPU with the Hopper configuration: the bundle's launch
    record lists the kernel's tensor maps (the batched operands' 3-D boxes),
    the engine builds them from the launch's buffers and passes them last,
    and the TMA-fed wgmma GEMM with its ReLU epilogue matches float64."""
    options = _gemm_options((128, 128, 64, (8, 1), 3, True), target_blocks=1)
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    rng = np.random.default_rng()
    x = rng.standard_normal((2, 128, 320)).astype(BF16)
    w = (rng.standard_normal((2, 320, 256)) / 16).astype(BF16)
    f = ts.jit(lambda x, w: op.relu(op.matmul(x, w)), target=options)
    out = f(x, w)
    source = _cuda_source(f)
    assert "tessera_tma_load_3d(sa + " in source and "tessera_tmaps" in source
    launches = json.loads((f._bundles[f._last_key] / "manifest.json").read_text())["launch"]
    assert [l["tensor_maps"] for l in launches.values() if "tensor_maps" in l] == \
        [[{"arg": 0, "box": [1, 128, 64]}, {"arg": 1, "box": [1, 64, 64]}]]
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=0.02, atol=0.03)


def test_bundle_cache_tells_gemm_configurations_apart(monkeypatch):
    """Bundles are cached by program and compiler: a tile configuration set
    at run time (as the GEMM benchmark's variants do) is part of the key,
    so the second build below is not the first one's kernel again."""
    x, w = np.zeros((128, 128), BF16), np.zeros((128, 256), BF16)
    blocks = []
    for producer in (True, False):
        options = ts.TargetOptions(target="gpu", target_blocks=1, gemm_configs=(ts.GemmConfig(
            128, 256, 64, (8, 1), 2, wgmma=True, producer=producer),))
        path, _ = ts.jit(lambda x, w: op.matmul(x, w), target=options).build(x, w)
        (launch,) = json.loads((path / "manifest.json").read_text())["launch"].values()
        blocks.append(launch["block"])
    assert blocks == [[384], [256]]


@pytest.mark.parametrize("switch, value", [
    ("wgmma", False), ("tma", False), ("pingpong", True), ("issue_ahead", True),
    ("attention_forward_blocks", {64: (64, 128), 128: (64, 128)}),
    ("grouped_tile_order", False), ("wait_watchdog_s", 5.0)])
def test_compiler_fingerprint_counts_the_benchmarks_switches(switch, value):
    """The benchmarks time kernel variants by compiling with other options
    (attention on mma.sync or cp.async, other forward blocks, ping-pong; GEMM tiles in row-major
    order; the GPU kit's checks with the mbarrier watchdog): each must key a
    different bundle, not reuse the default one."""
    from tessera_compiler.bundle import compiler_fingerprint
    default = compiler_fingerprint(ts.TargetOptions(target="gpu"))
    assert compiler_fingerprint(ts.TargetOptions(target="gpu", **{switch: value})) != default


def test_emulator_catches_a_wrong_fragment_layout():
    """The emulator is a real check: swapping two accumulator rows in the
    generated code's fragment mapping gives wrong results."""
    rng = np.random.default_rng()
    x = rng.standard_normal((32, 32)).astype(BF16)
    w = rng.standard_normal((32, 32)).astype(BF16)
    trace = ts.graph.trace(lambda x, w: op.matmul(x, w), x, w, target="gpu")
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu))
    (name, cfg), = launches.items()
    broken = source.replace("+ 8 * (", "+ 0 * (")      # rows g+8 written as rows g
    assert broken != source
    outs = []
    for src in (source, broken):
        out = np.zeros((32, 32), BF16)
        EmulatedKernels(src).launch(name, [x, w, out], cfg["grid"], cfg["block"],
                                    cfg["shared_bytes"])
        outs.append(out.astype(np.float64))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(outs[0], ref, rtol=0.02, atol=0.05)
    assert np.abs(outs[1] - ref).max() > 1.0


def test_emulator_catches_wgmma_a_registers_changed_before_the_wait(tmp_path):
    """wgmma with A in registers reads them asynchronously: they must hold
    their values until the wait. The emulator gathers the operand at issue
    and checks, when the operation completes, that the thread's registers
    still hold it. The causal attention forward (wgmma: P from registers
    times V) is right as generated; changing P's registers between the
    issue and the wait stops the kernel, naming the cause."""
    rng = np.random.default_rng()
    seq, d = 128, 64
    q, k, v = (rng.standard_normal((1, seq, d)).astype(BF16) for _ in range(3))
    trace = ts.graph.trace(lambda q, k, v: op.attention(q, k, v, causal=True), q, k, v,
                           target="gpu")
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu))
    (name, cfg), = launches.items()
    issue = next(line for line in source.splitlines() if "ra[kk / 16], tessera_wgmma_desc(" in line)
    assert "tessera_wgmma_rs_bf16<64, 1>(" in issue       # P (registers) x V (N-major)
    broken = source.replace(issue, issue + "\n        ra[0][0] ^= 1u;")

    def forward(src):
        out, lse = np.zeros((1, seq, d), BF16), np.zeros((1, seq, 1), np.float32)
        EmulatedKernels(src).launch(name, [q, k, v, out, lse], cfg["grid"], cfg["block"],
                                    cfg["shared_bytes"], cfg.get("tensor_maps", ()))
        return out.astype(np.float64)
    q64, k64, v64 = (t.astype(np.float64)[0] for t in (q, k, v))
    s = np.where(np.tri(seq, dtype=bool), q64 @ k64.T / np.sqrt(d), -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p / p.sum(1, keepdims=True)) @ v64
    np.testing.assert_allclose(forward(source)[0], ref, rtol=0.03, atol=0.03)
    out, stderr = _in_child(lambda: forward(broken), tmp_path)
    assert out is None, "the emulator ran a wgmma whose A registers changed before its wait"
    assert "changed the A registers of a wgmma before waiting for it" in stderr, stderr


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_softmax_layernorm_and_rmsnorm_kernels_emulated(dtype, monkeypatch, built_cleanly):
    """Row reductions split over lanes and combined with warp shuffles, on
    rows longer than a warp's elements and not a multiple of 32: softmax,
    layernorm and rmsnorm on the emulated GPU against float64. In bf16 the
    loads and stores round (the statistics accumulate in f32)."""
    rng = np.random.default_rng()
    np_dtype, tol = (np.float32, 1e-4) if dtype == "f32" else (BF16, 2e-2)
    x = rng.standard_normal((48, 200)).astype(np_dtype)
    g = rng.standard_normal(200).astype(np_dtype)
    bias = rng.standard_normal(200).astype(np_dtype)

    def f(x, g, bias):
        return op.softmax(x), op.layernorm(x, g, bias), op.rmsnorm(x, g)
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    sm, ln, rms = (o.astype(np.float64) for o in ts.jit(f, target="gpu")(x, g, bias))
    xd, gd, bd = (a.astype(np.float64) for a in (x, g, bias))
    e = np.exp(xd - xd.max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=tol, atol=tol / 10)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    np.testing.assert_allclose(ln, (xd - mu) / np.sqrt(var + 1e-5) * gd + bd, rtol=tol, atol=tol)
    ref = xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-6) * gd
    np.testing.assert_allclose(rms, ref, rtol=tol, atol=tol)
    built_cleanly(ts.graph.trace(f, x, g, bias, target="gpu").cuda)


def test_a_cross_entropy_target_out_of_range_fails_the_emulated_gpu_step(monkeypatch):
    """The GPU target's value check: a library routine beside the loss's
    emulated kernels, which still match numpy; a target out of range fails
    the step once it has run, naming its row."""
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    rng = np.random.default_rng()
    x = rng.standard_normal((6, 40)).astype(np.float32)
    t = rng.integers(0, 40, 6).astype(np.int32)
    t[1] = -100
    loss = ts.jit(lambda x, t: op.cross_entropy(x, t), target="gpu")
    xd, keep = x.astype(np.float64), t != -100
    logp = xd - xd.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    np.testing.assert_allclose(loss(x, t), -logp[keep, t[keep]].mean(), rtol=1e-5)
    t[4] = 40
    with pytest.raises(ts.ValueCheckError, match=r"target 40 in row 4 is out of range for 40 "):
        loss(x, t)


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_gemm_with_relu_or_silu_epilogue(activation, monkeypatch, built_cleanly):
    """The other activations of the GEMM epilogue (GELU is in the test
    above): one tensor-core kernel computing act(x @ w + b), emulated,
    against float64, and built for sm_90a without spills."""
    options = _gemm_options((64, 64, 32, (2, 2), 3))
    rng = np.random.default_rng()
    x = rng.standard_normal((128, 128)).astype(BF16)
    w = (rng.standard_normal((128, 64)) / np.sqrt(128)).astype(BF16)
    b = rng.standard_normal(64).astype(BF16)
    act = getattr(op, activation)
    trace = ts.graph.trace(lambda x, w, b: act(op.matmul(x, w) + b), x, w, b, target=options)
    with ir.Context():
        source, launches = emit_cuda_kernels(ir.Module.parse(trace.gpu), options)
    (name, cfg), = launches.items()
    assert "tessera_mma_bf16(" in source
    out = np.zeros((128, 64), BF16)
    EmulatedKernels(source).launch(name, [x, w, b.reshape(1, 64).copy(), out], cfg["grid"],
                                   cfg["block"], cfg["shared_bytes"])
    h = x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
    ref = np.maximum(h, 0) if activation == "relu" else h / (1 + np.exp(-h))
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=0.03, atol=0.03)
    built_cleanly(source)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpt_training_step_on_gpu_target_matches_cpu(precision, monkeypatch):
    """The example GPT's whole training step (forward, backward, AdamW)
    compiled for the GPU and run on the emulated CUDA engine agrees with the
    CPU engine. bf16 autocast puts every matmul on tensor cores."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import train_gpt as g
    step, args = g.step_case(64, 1, 2, 4, 8, precision,
                             seed=int(np.random.default_rng().integers(1 << 30)))
    cpu = step(*args)
    monkeypatch.setenv("TESSERA_CUDA_EMULATE", "1")
    gpu_step = ts.jit(step.fn, target="gpu")
    gpu = gpu_step(*args)
    assert "tessera_mma_bf16(" in _cuda_source(gpu_step) or precision == "fp32"
    # bf16: the engines sum in different orders (and the GPU's exp is
    # 2^(x log2 e)), so an activation within rounding of a bf16 tie can round
    # the other way (2^-9 relative); a few such flips move the loss ~2e-5.
    np.testing.assert_allclose(float(gpu[0]), float(cpu[0]),
                               rtol=1e-5 if precision == "fp32" else 1e-4)
    # AdamW's first update is lr * sign(gradient) for every element, so a
    # gradient within rounding of zero may step either way: compare the
    # optimizer moments (m = 0.1 g, v = 0.001 g^2) to each tensor's largest,
    # and the parameters where the gradient is clearly nonzero.
    params = [ts._pytree.flatten(x)[0] for x in (gpu[1], cpu[1])]
    moments = [[np.asarray(m, np.float64) for m in ts._pytree.flatten(x)[0] if np.ndim(m)]
               for x in (gpu[2], cpu[2])]          # m of every parameter, then v
    rel = 0.02 if precision == "bf16" else 1e-4
    for a, c in zip(*moments):
        np.testing.assert_allclose(a, c, atol=rel * np.abs(c).max())
    for a, c, m in zip(*params, moments[1]):
        clear = np.abs(m) > rel * np.abs(m).max()
        np.testing.assert_allclose(np.asarray(a, np.float64)[clear],
                                   np.asarray(c, np.float64)[clear],
                                   atol=3e-4 if precision == "bf16" else 1e-4)


def _cuda_source(compiled) -> str:
    bundle = compiled._bundles[compiled._last_key]
    return (bundle / "kernels" / "kernels.cu").read_text()


@pytest.mark.parametrize("check, expected_file", [
    ("gemm-wgmma-tma-batched-relu", "expected.npz"),
    ("nvshmem-gathered-gemm-2-ranks", "expected.rank1.npz")])
def test_gpu_kit_checks_run_with_the_runtime_alone(tmp_path, check, expected_file):
    """bench/gpu_kit.py: `build` compiles a check's bundle with its inputs
    and expected outputs (per rank, for the NVSHMEM check that `run` starts
    under mpiexec); `run` (here on the emulated engine, with the compiler's
    packages made unimportable in every process; its kernels built with the
    mbarrier watchdog) passes it in a process of
    its own, reports FAIL with exit status 1 once the expectation (of one
    rank) is wrong, and kills a check that outlives its time limit, with
    every process it started (its ranks'), reporting it and going on."""
    import subprocess
    import sys
    import time
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    kit, out, site = tmp_path / "kit", tmp_path / "out", tmp_path / "site"
    built = subprocess.run([sys.executable, str(root / "bench" / "gpu_kit.py"), "build", str(kit),
                            "--only", check, "--no-benchmarks"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    # Checks trap a stuck mbarrier wait rather than hang (benchmarks do not).
    assert "#define TESSERA_WAIT_WATCHDOG_NS" in \
        (kit / "checks" / check / "bundle" / "kernels" / "kernels.cu").read_text()
    # The GPU machine has the runtime alone: so has every process here.
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "for m in ('tessera', 'tessera_compiler', 'tessera_mlir', 'tessera_passes'):\n"
        "    sys.modules[m] = None\n"
        "if os.environ.get('KIT_CHECKS_HANG') and sys.argv[1:2] == ['rank']:\n"
        "    time.sleep(300)                 # a check whose kernel never finishes\n")
    paths = [str(site), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}

    def run(*options, **extra_env):
        return subprocess.run([sys.executable, str(root / "bench" / "gpu_kit.py"), "run",
                               str(kit), str(out), "--engine", "cuda-emulated", *options],
                              capture_output=True, text=True, env={**env, **extra_env})
    ok = run()
    assert ok.returncode == 0 and f"PASS {check}" in ok.stdout, ok.stdout + ok.stderr[-3000:]
    assert json.loads((out / "gpu_checks.json").read_text())["checks"][0]["ok"]
    expected = kit / "checks" / check / expected_file
    with np.load(expected) as npz:
        right = npz["arr_0"]
    np.savez_compressed(expected, right * 1.5 + 1)
    bad = run()
    assert bad.returncode == 1 and f"FAIL {check}" in bad.stdout, bad.stdout + bad.stderr[-3000:]
    if "rank1" in expected_file:        # rank 0 still passes; rank 1 names its error
        verdict = next(line for line in bad.stdout.splitlines() if line.startswith("FAIL"))
        assert "rank 0: max |diff|" in verdict and "rank 1: out0: max |diff|" in verdict, verdict
    if "rank1" not in expected_file:
        return                          # (the time limit: on the check with most processes)
    start = time.monotonic()
    hung = run("--check-timeout", "5", KIT_CHECKS_HANG="1")
    report = json.loads((out / "gpu_checks.json").read_text())["checks"]
    assert hung.returncode == 1 and report[0]["detail"].startswith("killed after 5 s"), report
    assert time.monotonic() - start < 60
    leftover = subprocess.run(["pgrep", "-f", f"gpu_kit.py rank {kit}"], capture_output=True)
    assert leftover.returncode == 1, leftover.stdout


def test_bench_results_of_one_variant_per_process_add_up(tmp_path):
    """bench/cuda_bench.write_results with `append` (how gpu_kit gathers a
    benchmark run one variant per process): rows join the day's file,
    a row with the same key replaces the older one, and a file from
    another commit or device is replaced rather than mixed in."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from cuda_bench import write_results
    meta = {"device": "H100", "driver": 13000, "date": "2026-11-22", "commit": "abc"}
    columns = {"n": lambda r: str(r["n"]), "variant": lambda r: r["variant"],
               "ratio": lambda r: f"{r['ratio']:.2f}"}

    def write(rows, meta=meta, append=True):
        path = write_results("gemm_cuda", "GEMM", columns, rows, meta, ("n", "variant"), append,
                             folder=tmp_path)
        table = path.with_suffix(".md").read_text().splitlines()[4:]
        return json.loads(path.with_suffix(".json").read_text())["rows"], table
    write([{"n": 4096, "variant": "producer", "ratio": 0.9}], append=False)
    rows, _ = write([{"n": 4096, "variant": "thread0", "ratio": 0.8},
                     {"n": 8192, "variant": "thread0", "ratio": 0.7}])
    assert [(r["n"], r["variant"]) for r in rows] == [(4096, "producer"), (4096, "thread0"),
                                                      (8192, "thread0")]
    rows, table = write([{"n": 4096, "variant": "producer", "ratio": 0.95}])
    assert [r["ratio"] for r in rows] == [0.95, 0.8, 0.7]
    assert table == ["| 4096 | producer | 0.95 |", "| 4096 | thread0 | 0.80 |",
                     "| 8192 | thread0 | 0.70 |"]
    rows, _ = write([{"n": 4096, "variant": "row-major", "ratio": 1.0}], {**meta, "commit": "def"})
    assert rows == [{"n": 4096, "variant": "row-major", "ratio": 1.0}]
