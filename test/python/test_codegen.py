"""Generated kernel sources compile: C++ with the host compiler (and run, in the
other tests), CUDA C++ with nvcc for sm_90a where nvcc exists."""

import re

import numpy as np
import pytest

import tessera as ts
from tessera import dist, graph, op
from tessera_compiler.codegen.build import KernelBuildError, build_cuda_cubin, nvcc


def _trace(target="gpu"):
    mesh = dist.Mesh(axes=["tp"], devices=range(2))
    rng = np.random.default_rng(0)
    x = dist.from_numpy(rng.standard_normal((64, 96)).astype(np.float32), mesh=mesh)
    w1 = dist.from_numpy(rng.standard_normal((96, 256)).astype(np.float32),
                         dist.ShardSpec(partition=("col",), mesh_axes=("tp",)), mesh)
    w2 = dist.from_numpy(rng.standard_normal((256, 96)).astype(np.float32),
                         dist.ShardSpec(partition=("row",), mesh_axes=("tp",)), mesh)

    def mlp(x, w1, w2):
        return op.matmul(op.relu(op.matmul(x, w1)), w2)
    return graph.trace(mlp, x, w1, w2, mesh=mesh, target=target)


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
def test_generated_cuda_compiles_for_sm90():
    trace = _trace()
    cubin = build_cuda_cubin(trace.cuda)
    data = cubin.read_bytes()
    assert data[:4] == b"\x7fELF"
    for kernel in (b"mlp_matmul_0_fused2", b"mlp_matmul_2"):
        assert kernel in data


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_kernel_of_the_gpt_training_step_compiles_for_sm90(precision, built_cleanly):
    """Every kernel of the example model's training step, for sm_90a, with no
    register spills (ptxas -v); in bf16 the GEMMs are tensor-core kernels."""
    import sys
    from pathlib import Path
    import tessera as ts
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import train_gpt as g
    params = g.init_params(128, 2, 4, 16, 0)
    opt = ts.optim.AdamW(lr=3e-3)
    step = g.make_step(opt, 4, precision, 1.0)
    levels = step.lower(params, opt.init(params), ts.optim.loss_scale_init(1.0),
                        [g.make_batch(np.random.default_rng(0), 32, 8)], target="gpu")
    # (the two blocks' identical kernels are one after tessera-merge-kernels;
    # broadcasts are computed inside the kernels that read them)
    assert len(levels.cuda_launches) > 80
    if precision == "bf16":
        assert levels.cuda.count("// tensor-core GEMM") >= 8     # (distinct GEMMs, merged)
    with open(Path(build_cuda_cubin(levels.cuda)), "rb") as f:
        assert f.read(4) == b"\x7fELF"
    assert set(built_cleanly(levels.cuda)) == set(levels.cuda_launches)


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
def test_nvcc_errors_are_reported():
    with pytest.raises(KernelBuildError, match="nvcc failed"):
        build_cuda_cubin('extern "C" __global__ void broken() { this is not cuda; }')


def test_kernel_library_is_cached_by_content(tmp_path, monkeypatch):
    from tessera_compiler.codegen.build import build_cpu_library
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    src = _trace("cpu").cpp
    assert 'extern "C" void' in src
    first = build_cpu_library(src)
    mtime = first.stat().st_mtime_ns
    assert build_cpu_library(src) == first and first.stat().st_mtime_ns == mtime
    assert build_cpu_library(src + "\n// changed\n") != first


def test_an_edited_cpu_header_builds_anew(tmp_path, monkeypatch):
    """An emitted CPU source names its headers (codegen/cpu/, found with -I)
    without their text: the cache key holds the headers' contents, so an
    edited header compiles anew instead of reusing an object of the old."""
    import shutil
    from tessera_compiler.codegen import build
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "cache"))
    headers = tmp_path / "cpu"
    shutil.copytree(build.CPU_INCLUDE_DIR, headers)
    monkeypatch.setattr(build, "CPU_INCLUDE_DIR", headers)
    src = f'#include "{build.CPU_HEADER}"\nextern "C" float f(float x) {{ return tessera_exp(x); }}\n'
    first = build.build_cpu_library(src)
    assert build.build_cpu_library(src) == first
    numerics = headers / "tessera_numerics.h"
    numerics.write_text(numerics.read_text() + "// edited\n")
    assert build.build_cpu_library(src) != first


def test_a_bundle_records_its_cpu_source_with_the_headers_pasted_in():
    """The source a bundle records stands alone (g++ needs no Tessera
    header): every quoted include replaced by its file, each file once."""
    from tessera_compiler.codegen import build
    from tessera_compiler.codegen.tile_emitter import cpu_runtime_source
    source = build.standalone_cpu_source(cpu_runtime_source())
    assert '#include "' not in source and "#include <cmath>" in source
    for defined in ("float tessera_exp(", "void tessera_parallel(", "float bf16_to_float("):
        assert source.count(defined) == 1, defined
    assert source.index("tessera_exp(") < source.index(build.PREAMBLE_END)


def test_a_large_kernel_source_builds_as_units_at_once_each_cached(tmp_path, monkeypatch):
    """build_cpu_library splits a source's kernels into one translation unit
    per build job (each the shared preamble and a share of the kernels),
    compiles them at once, caches each object by content, and links them
    with the runtime part's object (what follows PREAMBLE_END: the same in
    every library, built once) into one library exposing every kernel and
    the engine's GEMM; a change to one kernel recompiles one unit."""
    import ctypes
    import re
    from tessera_compiler.codegen import build
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_BUILD_JOBS", "2")
    monkeypatch.setattr(build, "SPLIT_MIN_CHARS", 0)
    monkeypatch.setattr(build, "PREBUILT_DIR", tmp_path / "prebuilt")    # none prebuilt
    one = _trace("cpu").cpp
    (name,) = re.findall(re.escape(build.KERNEL_HEADER) + r"(\w+)", one)
    kernel = one[one.index(build.KERNEL_HEADER):]
    src = one + "\n" + kernel.replace(name, name + "_again")    # two kernels
    names = [name, name + "_again"]
    units = build._translation_units(src, 2)
    shared, once = src.split(build.KERNEL_HEADER)[0].split(build.PREAMBLE_END)
    assert build.CPU_RUNTIME in once and build.CPU_RUNTIME not in shared
    assert len(units) == 2 and all(u.startswith(shared) and once.strip() not in u for u in units)
    lib = build.build_cpu_library(src)
    assert len(list(tmp_path.rglob("*.o"))) == 3                # two units, the runtime part
    loaded = ctypes.CDLL(str(lib))
    for name in names + ["tessera_gemm_f32"]:
        getattr(loaded, name)                       # every kernel is in the library
    # Edit the last kernel only: one of the two units is new.
    changed = src.rstrip() + "\n// changed\n"
    assert build.build_cpu_library(changed) != lib
    assert len(list(tmp_path.rglob("*.o"))) == 4
    broken = src + f"\n{build.KERNEL_HEADER}broken\nthis is not C++;\n"
    with pytest.raises(KernelBuildError, match="failed on generated kernels"):
        build.build_cpu_library(broken)


def test_the_runtime_part_is_prebuilt_once_for_every_library(tmp_path, monkeypatch):
    """prebuild_cpu_runtime (tools/bootstrap.sh runs it) compiles the runtime
    part into PREBUILT_DIR; a library then compiles its kernels only."""
    import ctypes
    from tessera_compiler.codegen import build
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "own"))    # (not the shared builds)
    monkeypatch.setattr(build, "PREBUILT_DIR", tmp_path / "prebuilt")
    from tessera_compiler.codegen.tile_emitter import cpu_runtime_source
    prebuilt = build.prebuild_cpu_runtime(cpu_runtime_source())
    assert prebuilt.parent == tmp_path / "prebuilt"
    lib = build.build_cpu_library(_trace("cpu").cpp)
    assert len(list((tmp_path / "own").rglob("*.o"))) == 1          # the kernels' unit only
    ctypes.CDLL(str(lib)).tessera_parallel                          # linked in


def test_build_cache_key_holds_the_compiler_version_and_linked_libraries(tmp_path, monkeypatch):
    """A compiler upgrade (anywhere in its --version output: nvcc's first line
    is the same for every release) or a different library to link builds
    anew instead of reusing a stale object."""
    from tessera_compiler.codegen import build
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    if nvcc() is not None:
        first, *_, last = build._version(nvcc()).splitlines()
        assert first.startswith("nvcc: NVIDIA") and "Build cuda_" in last
    src = 'extern "C" int tessera_answer() { return 42; }\n'
    cxx, flags = build.host_compiler(), [*build.CXX_FLAGS]
    built = build._cached_build(src, ".cpp", cxx, flags, ".so")
    assert build._cached_build(src, ".cpp", cxx, flags, ".so") == built
    lib = tmp_path / "libdep.a"
    lib.write_bytes(b"one")
    with_lib = build._cached_build(src, ".cpp", cxx, flags, ".so",
                                   depends=(build._file_identity(lib),))
    assert with_lib != built
    lib.write_bytes(b"other")
    assert build._cached_build(src, ".cpp", cxx, flags, ".so",
                               depends=(build._file_identity(lib),)) != with_lib
    monkeypatch.setattr(build, "_version", lambda tool: "c++ (upgraded) 99.0")
    assert build._cached_build(src, ".cpp", cxx, flags, ".so") != built


def test_nvshmem_builds_are_keyed_by_the_device_library(monkeypatch):
    """Both steps of an NVSHMEM kernel's build (compile, device-link) name the
    libnvshmem_device.a they use in their cache key; without NVSHMEM the
    build says what to install."""
    from tessera_compiler.codegen import build
    if nvcc() is None or build.nvshmem_home() is None:
        pytest.skip("needs nvcc and NVSHMEM (pip install nvidia-nvshmem-cu13)")
    steps = []

    def record(source, suffix, tool, flags, out_ext, inputs=(), depends=(), log_ext=None):
        steps.append(depends)
        return build.Path(f"/nonexistent/step{len(steps)}{out_ext}")
    monkeypatch.setattr(build, "_cached_build", record)
    build.build_cuda_cubin("#include <nvshmem.h>\n")
    library = build._file_identity(build.nvshmem_home() / "lib" / "libnvshmem_device.a")
    assert steps == [(library,), (library,)]
    monkeypatch.setattr(build, "nvshmem_home", lambda: None)
    with pytest.raises(KernelBuildError, match="pip install nvidia-nvshmem-cu13"):
        build.build_cuda_cubin("#include <nvshmem.h>\n")


def test_nvshmem_kernel_links_into_one_cubin():
    """The fused all-gather + GEMM kernel of the ttile-to-cuda lit test
    (puts, fence, signals, waits, then a tensor-core loop) compiles
    relocatable and device-links with libnvshmem_device into one sm_90a cubin."""
    from pathlib import Path
    from tessera_mlir import ir
    from tessera_compiler.translate import ttile_to_cuda
    from tessera_compiler.codegen.build import nvshmem_home
    if nvcc() is None or nvshmem_home() is None:
        pytest.skip("needs nvcc and NVSHMEM (pip install nvidia-nvshmem-cu13)")
    text = (Path(__file__).resolve().parents[1] / "Target" / "ttile-to-cuda.mlir").read_text()
    chunk = next(c for c in text.split("// -----") if "@ag_gemm" in c)
    with ir.Context():
        source, _ = ttile_to_cuda(ir.Module.parse(chunk))
    assert "#include <nvshmem.h>" in source
    cubin = build_cuda_cubin(source).read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"ag_gemm" in cubin
    assert b"nvshmemi_device_state_d" in cubin        # NVSHMEM's device library is linked in


def _lit_cuda_kernels():
    """The kernels of the ttile-to-cuda lit test that emit (its chunks with
    no expected error), named by their first kernel."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "Target" / "ttile-to-cuda.mlir").read_text()
    chunks = [c for c in text.split("// -----") if "expected-error" not in c]
    return [pytest.param(c, id=re.search(r"^ttile\.kernel @(\w+)", c, re.M).group(1))
            for c in chunks]


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("chunk", _lit_cuda_kernels())
def test_every_lit_kernel_compiles_for_sm90a_without_spills(chunk, built_cleanly):
    """Every kernel the ttile-to-cuda lit test pins lines of also builds:
    nvcc compiles it for sm_90a, and ptxas reports registers for each
    kernel, no spills and no serialized wgmma (the lit test checks the
    text; this checks the text is CUDA that compiles as intended)."""
    from tessera_mlir import ir
    from tessera_compiler.translate import ttile_to_cuda
    from tessera_compiler.codegen.build import nvshmem_home
    with ir.Context():
        module = ir.Module.parse(chunk)
        names = [ir.StringAttr(o.attributes["sym_name"]).value for o in module.body.operations
                 if o.operation.name == "ttile.kernel"]
        source, _ = ttile_to_cuda(module)
    if "#include <nvshmem.h>" in source and nvshmem_home() is None:
        pytest.skip("needs NVSHMEM's headers (pip install nvidia-nvshmem-cu13)")
    report = built_cleanly(source)
    for name in names:
        assert name in report and report[name].get("registers", 0) > 0, (name, report)


def test_nvrtc_compiles_every_lit_kernel_for_sm90a(tmp_path, monkeypatch):
    """The runtime's fallback for bundles built without nvcc: NVRTC (no GPU
    needed) compiles the CUDA source of every ttile-to-cuda lit kernel for
    sm_90a (the wgmma, TMA and register-loop kernels included). A kernel
    calling NVSHMEM is refused with the reason (NVRTC cannot link
    NVSHMEM's device library), as is a source NVRTC rejects."""
    from tessera_mlir import ir
    from tessera_compiler.translate import ttile_to_cuda
    from tessera_runtime.engines import EngineError, nvrtc
    if nvrtc.library() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    assert nvrtc.arch_of("90") == "sm_90a" and nvrtc.arch_of("100") == "sm_100"
    built = 0
    for param in _lit_cuda_kernels():
        chunk, = param.values
        with ir.Context():
            source, _ = ttile_to_cuda(ir.Module.parse(chunk))
        if "#include <nvshmem.h>" in source:
            with pytest.raises(EngineError, match="calls NVSHMEM, whose device library only nvcc"):
                nvrtc.compile_cubin(source, "sm_90a")
            continue
        cubin = nvrtc.compile_cubin(source, "sm_90a").read_bytes()
        assert cubin[:4] == b"\x7fELF" and param.id.encode() in cubin, param.id
        built += 1
    assert built >= 15
    with pytest.raises(EngineError, match="NVRTC .* failed on kernels.cu for sm_90a"):
        nvrtc.compile_cubin('extern "C" __global__ void k() { not cuda; }', "sm_90a")



# -- the PTX header (tessera_compiler/codegen/cuda/tessera_ptx.cuh) -----------------------
# Its functions by the sections of the header: those of sm_80 and later, those
# of sm_90a (wgmma, TMA, mbarriers; with the wgmma templates and descriptor),
# and the declarations the CPU emulator defines.
_SM80 = ("// -- sm_80 and later", "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n")
_SM90A = ("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n", "#endif  // TESSERA_PTX_CUH")
_EMULATED = ("#ifdef TESSERA_EMULATED_PTX\n// -- the emulator's", "#else\n")
_BOTH = ("#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(TESSERA_EMULATED_PTX)\n",
         "#endif  // TESSERA_PTX_CUH")
#: Defined for sm_90a, used only inside the header.
_HEADER_INTERNAL = {"tessera_globaltimer_ns"}
#: An instance of each template (ptxas checks the immediates: setmaxnreg takes
#: 24 to 256 in steps of 8). A new template needs one here.
_INSTANCES = {"tessera_cp_async_wait": "<0>", "tessera_wgmma_wait": "<1>",
              "tessera_wgmma_fence_operands": "<32>", "tessera_setmaxnreg_inc": "<232>",
              "tessera_setmaxnreg_dec": "<40>", "tessera_wgmma_bf16": "<64, 1>",
              "tessera_wgmma_f16": "<64, 1>", "tessera_wgmma_rs_bf16": "<64, 0>",
              "tessera_wgmma_rs_f16": "<64, 0>"}


def _functions(text: str) -> set[str]:
    """The tessera_* functions `text` declares or defines."""
    return set(re.findall(r"^(?:template <[^>]*> )?(?:__device__ |TESSERA_FN )?"
                          r"(?:__forceinline__ |inline )?"
                          r"\w+ (tessera_\w+)\(", text, re.M)
               + re.findall(r"^TESSERA_MMA\((tessera_\w+),", text, re.M))


def _section(header: str, bounds) -> str:
    start, end = bounds
    return header[header.index(start):header.index(end, header.index(start) + len(start))]


def _every_function_source(extra: str = "") -> str:
    """The prelude, the wgmma instructions of both element types, and a
    kernel that takes the address of every function the header declares
    (so that each is compiled, and for the emulator, must be defined)."""
    from tessera_compiler.codegen.cuda.prelude import CUDA_PRELUDE, PTX_HEADER, wgmma_wrapper
    sm80 = sorted(_functions(_section(PTX_HEADER, _SM80)) | {"tessera_ex2"})
    sm90a = sorted(_functions(_section(PTX_HEADER, _SM90A)) - _HEADER_INTERNAL - set(sm80))

    def take(names):
        return [f"  out[i++] = (unsigned long long)&{n}{_INSTANCES.get(n, '')};" for n in names]
    wrappers = [wgmma_wrapper(64, elt, registers_a=rs, mn_major_b=not rs)
                for elt in ("bf16", "f16") for rs in (False, True)]
    return "\n".join([CUDA_PRELUDE, *wrappers, extra,
                      'extern "C" __global__ void every_function(unsigned long long* out) {',
                      "  int i = 0;", *take(sm80),
                      "#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(TESSERA_EMULATED_PTX)",
                      *take(sm90a), "#endif", "}", ""])


def test_the_ptx_header_declares_what_the_printer_calls():
    """One header holds the PTX the printer calls: every tessera_* function
    a lit kernel's source calls is the prelude's (the header's, or a bf16
    helper), and the header declares for the CPU emulator exactly the
    functions it defines as PTX (but its internal timer)."""
    from tessera_mlir import ir
    from tessera_compiler.codegen.cuda.prelude import CUDA_PRELUDE, PTX_HEADER
    from tessera_compiler.translate import ttile_to_cuda
    called = set()
    for param in _lit_cuda_kernels():
        chunk, = param.values
        with ir.Context():
            source, _ = ttile_to_cuda(ir.Module.parse(chunk))
        kernels = source.split(CUDA_PRELUDE, 1)[1]
        called |= set(re.findall(r"\b(tessera_[a-z0-9_]+)\s*[(<]", kernels))
    provided = _functions(CUDA_PRELUDE)
    assert {"tessera_mma_bf16", "tessera_wgmma_bf16", "tessera_tma_load_2d",
            "tessera_mbarrier_wait", "tessera_named_barrier_sync"} <= called
    assert called <= provided, sorted(called - provided)
    ptx = _functions(_section(PTX_HEADER, _SM80)) | _functions(_section(PTX_HEADER, _SM90A))
    emulated = _functions(_section(PTX_HEADER, _EMULATED)) | _functions(_section(PTX_HEADER, _BOTH))
    assert "tessera_wgmma_desc" in emulated and "tessera_mbarrier_wait" in emulated
    assert emulated | _HEADER_INTERNAL == ptx, sorted(emulated ^ (ptx - _HEADER_INTERNAL))


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_90"])
def test_the_ptx_header_compiles_with_nvcc(arch, tmp_path):
    """nvcc (ptxas included) compiles every function of the header: those of
    sm_90a for sm_90a only, the others for plain sm_90 too."""
    import subprocess
    src = tmp_path / "every_function.cu"
    src.write_text(_every_function_source())
    proc = subprocess.run([nvcc(), f"-arch={arch}", "-std=c++17", "-cubin", str(src),
                           "-o", str(tmp_path / "every_function.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_ptx_header_compiles_with_nvrtc(tmp_path, monkeypatch):
    """So does NVRTC (the runtime's compiler for bundles built without nvcc)."""
    from tessera_runtime.engines import nvrtc
    if nvrtc.library() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    for arch in ("sm_90a", "sm_90"):
        assert nvrtc.compile_cubin(_every_function_source(), arch).read_bytes()[:4] == b"\x7fELF"


def test_the_emulator_defines_every_function_the_header_declares(tmp_path, monkeypatch):
    """The CPU emulator compiles the header with its own definitions: the
    kernel taking every function's address loads, so each declaration has a
    matching definition; a declared function nobody defines fails to load."""
    from tessera_runtime.engines.cuda_emulator import EmulatedKernels
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    EmulatedKernels(_every_function_source())
    missing = "__device__ __forceinline__ void tessera_not_defined(uint64_t* bar);\n"
    with pytest.raises(OSError, match="undefined symbol: .*tessera_not_defined"):
        EmulatedKernels(_every_function_source(missing).replace(
            "  int i = 0;", "  int i = 0;\n  out[i++] = (unsigned long long)&tessera_not_defined;"))


@pytest.mark.parametrize("k", [32, 64, 128])
def test_short_k_gemms_get_the_tensor_core_main_loop(k):
    """A bf16 GEMM whose K is one step of the largest fitting tile (K = 64
    for wgmma's 64-wide steps, 32 for mma.sync's) still gets the pipelined
    tensor-core main loop: a one-step loop would be folded away by
    canonicalization and run from shared memory."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, 512)).astype(ml_dtypes.bfloat16)
    source = graph.trace(lambda a, b: op.matmul(a, b), a, b, target="gpu").cuda
    assert source.count("// tensor-core GEMM") == 1, source[-3000:]
    assert "from shared memory" not in source


def test_scattered_gemm_compiles_for_sm90_without_spills(monkeypatch, built_cleanly):
    """gelu(r + x @ w) with the reduce-scatter in the GEMM (transport =
    "nvshmem") on a 4-rank tp mesh with 128x256 wgmma tiles: the loop over
    ranks holds the one tensor-core main loop (with its 4-stage ring), the
    staging store and the put; then the signals, the wait, the sum and the
    GELU. It links with NVSHMEM into one sm_90a cubin, and ptxas spills
    nothing in it."""
    import ml_dtypes
    from tessera_compiler.codegen.build import nvshmem_home
    if nvcc() is None or nvshmem_home() is None:
        pytest.skip("needs nvcc and NVSHMEM (pip install nvidia-nvshmem-cu13)")
    options = ts.TargetOptions(target="gpu", target_blocks=1)     # the largest tiles
    mesh = dist.Mesh(axes=["tp"], devices=range(4))
    rng = np.random.default_rng(0)

    def split(shape, part):
        return dist.from_numpy(rng.standard_normal(shape).astype(ml_dtypes.bfloat16),
                               dist.ShardSpec(partition=(part,), mesh_axes=("tp",)), mesh)
    x, w, r = split((512, 1024), "col"), split((1024, 512), "row"), split((512, 512), "row")
    levels = graph.trace(lambda x, w, r: op.gelu(r + op.matmul(x, w, transport="nvshmem")),
                         x, w, r, mesh=mesh, target=options)
    (kernel,) = [k for k in levels.levels.cuda_launches if "matmul_scatter" in k]
    assert "nvshmemx_signal_op" in levels.cuda and "NVSHMEM_SIGNAL_ADD" in levels.cuda
    source = levels.cuda.split(f"// ttile.kernel @{kernel}")[1]
    assert source.count("// tensor-core GEMM: block tile 128x256x64") == 1, source[:2000]
    cubin = build_cuda_cubin(levels.cuda).read_bytes()
    assert cubin[:4] == b"\x7fELF" and kernel.encode() in cubin
    # Measured: ptxas serializes the wgmmas of a kernel that calls NVSHMEM
    # (the calls into libnvshmem_device are extern in a relocatable build;
    # inlining them, NVSHMEM_ENABLE_ALL_DEVICE_INLINING, needs InfiniBand's
    # mlx5dv.h). Any other reason fails here.
    assert kernel in built_cleanly(levels.cuda, serialized_by="due to the presence of Extern calls")


def _cpu_kernels(text: str):
    """(C++ source, loaded library) of the Tile IR kernels in `text`."""
    import ctypes
    from tessera_mlir import ir
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_compiler.translate import ttile_to_cpp
    with ir.Context():
        source = ttile_to_cpp(ir.Module.parse(text))
    return source, ctypes.CDLL(str(build_cpu_library(source)))


@pytest.mark.parametrize("m,k,n,element", [(16, 32, 16, "f32"), (7, 5, 13, "f32"),
                                           (5, 33, 24, "f32"), (1, 3, 1, "f32"),
                                           (9, 16, 40, "bf16")])
def test_cpu_dot_matches_numpy(m, k, n, element):
    """`ttile.dot` on the CPU (the register-blocked `tessera_dot`): full
    4-row x 16-column blocks, 8-column blocks and the scalar edges, with the
    accumulator carried through an `scf.for` over two K halves."""
    import ctypes
    import ml_dtypes
    kk = k * 2
    text = f"""
ttile.kernel @dot(%a: memref<{m}x{kk}x{element}>, %b: memref<{kk}x{n}x{element}>,
                  %c: memref<{m}x{n}xf32>) attributes {{grid = array<i64: 1>, block = array<i64: 32>}} {{
  %c0 = arith.constant 0 : index
  %step = arith.constant {k} : index
  %end = arith.constant {kk} : index
  %zero = ttile.fill 0.0 : !ttile.tile<{m}x{n}xf32>
  %acc = scf.for %i = %c0 to %end step %step iter_args(%it = %zero) -> (!ttile.tile<{m}x{n}xf32>) {{
    %ta = ttile.load %a[%c0, %i] : memref<{m}x{kk}x{element}> -> !ttile.tile<{m}x{k}x{element}>
    %tb = ttile.load %b[%i, %c0] : memref<{kk}x{n}x{element}> -> !ttile.tile<{k}x{n}x{element}>
    %d = ttile.dot %ta, %tb, %it : !ttile.tile<{m}x{k}x{element}>, !ttile.tile<{k}x{n}x{element}> -> !ttile.tile<{m}x{n}xf32>
    scf.yield %d : !ttile.tile<{m}x{n}xf32>
  }}
  ttile.store %acc, %c[%c0, %c0] : !ttile.tile<{m}x{n}xf32>, memref<{m}x{n}xf32>
  ttile.return
}}"""
    source, lib = _cpu_kernels(text)
    assert "tessera_dot(" in source
    assert "++e)" not in source          # the carried accumulator: added to in place
    rng = np.random.default_rng()
    dtype = ml_dtypes.bfloat16 if element == "bf16" else np.float32
    a = rng.standard_normal((m, kk)).astype(dtype)
    b = rng.standard_normal((kk, n)).astype(dtype)
    c = np.full((m, n), np.nan, np.float32)
    lib.dot(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * np.sqrt(kk))


@pytest.mark.parametrize("start", [0.0, -0.0, 1.5])
def test_cpu_dot_starts_from_its_accumulator_without_a_copy_where_it_can(start):
    """A CPU dot whose accumulator has other uses starts from a copy of it,
    or from a memset where it is a fill of +0.0 (not -0.0: its bits are not
    zero); one that is its accumulator's last use adds into its array (the
    loop-carried one of test_cpu_dot_matches_numpy too: no copy at all),
    unless the dot runs in a loop under it (each iteration starts afresh).
    Against float64 numpy: c = 5 (start + a b), three dots in a row and one
    in a 2-step loop."""
    import ctypes
    m, k, n = 8, 24, 16
    text = f"""
ttile.kernel @dots(%a: memref<{m}x{k}xf32>, %b: memref<{k}x{n}xf32>,
                   %c: memref<{m}x{n}xf32>) attributes {{grid = array<i64: 1>, block = array<i64: 32>}} {{
  %c0 = arith.constant 0 : index
  %acc = ttile.fill {start!r} : !ttile.tile<{m}x{n}xf32>
  %ta = ttile.load %a[%c0, %c0] : memref<{m}x{k}xf32> -> !ttile.tile<{m}x{k}xf32>
  %tb = ttile.load %b[%c0, %c0] : memref<{k}x{n}xf32> -> !ttile.tile<{k}x{n}xf32>
  %d1 = ttile.dot %ta, %tb, %acc : !ttile.tile<{m}x{k}xf32>, !ttile.tile<{k}x{n}xf32> -> !ttile.tile<{m}x{n}xf32>
  %d2 = ttile.dot %ta, %tb, %acc : !ttile.tile<{m}x{k}xf32>, !ttile.tile<{k}x{n}xf32> -> !ttile.tile<{m}x{n}xf32>
  %one = ttile.fill {start!r} : !ttile.tile<{m}x{n}xf32>
  %one4 = ttile.fill {start!r} : !ttile.tile<{m}x{n}xf32>
  %d3 = ttile.dot %ta, %tb, %one : !ttile.tile<{m}x{k}xf32>, !ttile.tile<{k}x{n}xf32> -> !ttile.tile<{m}x{n}xf32>
  %s = ttile.add %d1, %d2 : !ttile.tile<{m}x{n}xf32>
  %t = ttile.add %s, %d3 : !ttile.tile<{m}x{n}xf32>
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %u = scf.for %i = %c0 to %c2 step %c1 iter_args(%it = %t) -> (!ttile.tile<{m}x{n}xf32>) {{
    %d4 = ttile.dot %ta, %tb, %one4 : !ttile.tile<{m}x{k}xf32>, !ttile.tile<{k}x{n}xf32> -> !ttile.tile<{m}x{n}xf32>
    %v = ttile.add %it, %d4 : !ttile.tile<{m}x{n}xf32>
    scf.yield %v : !ttile.tile<{m}x{n}xf32>
  }}
  ttile.store %u, %c[%c0, %c0] : !ttile.tile<{m}x{n}xf32>, memref<{m}x{n}xf32>
  ttile.return
}}"""
    source, lib = _cpu_kernels(text)
    body = source[source.index("// ttile.kernel @dots"):]
    zero = start == 0.0 and str(start) == "0.0"
    assert body.count("std::memset(") == (3 if zero else 0), body
    assert body.count("++e)") == (0 if zero else 3), body       # %d3 adds in place
    assert body.count("tessera_dot(") == 4
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    lib.dots(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)))
    want = 5 * (start + a.astype(np.float64) @ b.astype(np.float64))
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_cpu_row_reductions_combine_eight_lanes_in_a_fixed_tree():
    """A CPU row reduction (sum, max over the last dimension) keeps eight
    partial results, lane l taking elements l, l + 8, ... in order, and
    combines them as ((l0 l1) (l2 l3)) ((l4 l5) (l6 l7)): the exact bits
    of that order (not of a left-to-right sum), NaN propagating through max.
    A reduction over a leading dimension still adds the rows in order, with
    the loop over the outputs innermost."""
    import ctypes
    text = """
ttile.kernel @rows(%x: memref<6x37xf32>, %y: memref<5x24xf32>, %sum: memref<6x1xf32>,
                   %mx: memref<6x1xf32>, %col: memref<1x24xf32>)
    attributes {grid = array<i64: 1>, block = array<i64: 32>} {
  %c0 = arith.constant 0 : index
  %tx = ttile.load %x[%c0, %c0] : memref<6x37xf32> -> !ttile.tile<6x37xf32>
  %ty = ttile.load %y[%c0, %c0] : memref<5x24xf32> -> !ttile.tile<5x24xf32>
  %s = ttile.reduce %tx {kind = #tgraph.reduction<sum>, dim = 1 : i64} : !ttile.tile<6x37xf32> -> !ttile.tile<6x1xf32>
  %m = ttile.reduce %tx {kind = #tgraph.reduction<max>, dim = 1 : i64} : !ttile.tile<6x37xf32> -> !ttile.tile<6x1xf32>
  %c = ttile.reduce %ty {kind = #tgraph.reduction<sum>, dim = 0 : i64} : !ttile.tile<5x24xf32> -> !ttile.tile<1x24xf32>
  ttile.store %s, %sum[%c0, %c0] : !ttile.tile<6x1xf32>, memref<6x1xf32>
  ttile.store %m, %mx[%c0, %c0] : !ttile.tile<6x1xf32>, memref<6x1xf32>
  ttile.store %c, %col[%c0, %c0] : !ttile.tile<1x24xf32>, memref<1x24xf32>
  ttile.return
}"""
    source, lib = _cpu_kernels(text)
    rng = np.random.default_rng()
    # Magnitudes spread over 1e-3..1e4: the order of the additions shows in the bits.
    x = (rng.standard_normal((6, 37)) * 10.0 ** rng.integers(-3, 5, (6, 37))).astype(np.float32)
    x[5, 11] = np.nan
    y = rng.standard_normal((5, 24)).astype(np.float32)
    out = [np.full(s, np.nan, np.float32) for s in ((6, 1), (6, 1), (1, 24))]
    lib.rows(*(v.ctypes.data_as(ctypes.c_void_p) for v in (x, y, *out)))

    def lanes(row, combine):
        lane = list(row[:8])
        for q in range(8, len(row)):
            lane[q % 8] = combine(lane[q % 8], row[q])
        for step in (1, 2, 4):
            for k in range(0, 8, 2 * step):
                lane[k] = combine(lane[k], lane[k + step])
        return lane[0]
    add = lambda a, b: np.float32(a + b)  # noqa: E731
    for r in range(5):     # (a left-to-right sum differs in 3 rows of 4)
        assert out[0][r, 0].tobytes() == lanes(x[r], add).tobytes(), r
        # float32 rounding bound of a 37-term sum: it scales with sum(|x|), not
        # with the sum itself, which cancellation can make small.
        exact = x[r].astype(np.float64)
        assert abs(out[0][r, 0] - exact.sum()) <= 37 * 2.0 ** -24 * np.abs(exact).sum(), r
        assert out[1][r, 0] == x[r].max()
    assert np.isnan(out[1][5, 0]) and np.isnan(out[0][5, 0])
    in_order = y[0].copy()
    for q in range(1, 5):
        in_order = in_order + y[q]
    assert out[2].tobytes() == in_order.reshape(1, 24).tobytes()


def test_cpu_kernel_skips_the_bands_past_its_row_segments():
    """A kernel with `row_segments` (what tessera-lower-to-tile gives the
    elementwise kernels between a MoE layer's grouped GEMMs) computes the
    bands of rows inside each block's segments and leaves the others as
    they were: 2 blocks of 32 rows, 8-row bands, fresh random segment
    sizes; the whole grid and a sub-range (a thread's slice)."""
    import ctypes
    text = """
ttile.kernel @padded(%n: memref<2x2xi32>, %x: memref<64x8xf32>, %y: memref<64x8xf32>) attributes {grid = array<i64: 8>, block = array<i64: 32>, row_segments = array<i64: 0, 64, 8>} {
  %pid = ttile.program_id 0
  %c8 = arith.constant 8 : index
  %c0 = arith.constant 0 : index
  %row = arith.muli %pid, %c8 : index
  %t = ttile.load %x[%row, %c0] : memref<64x8xf32> -> !ttile.tile<8x8xf32>
  %e = ttile.exp %t : !ttile.tile<8x8xf32>
  ttile.store %e, %y[%row, %c0] : !ttile.tile<8x8xf32>, memref<64x8xf32>
  ttile.return
}"""
    source, lib = _cpu_kernels(text)
    rng = np.random.default_rng()
    x = rng.standard_normal((64, 8)).astype(np.float32)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)        # noqa: E731
    for sizes in (np.array([[5, 3], [0, 2]], np.int32), rng.integers(0, 17, (2, 2), np.int32)):
        used = sizes.sum(1)
        live = np.array([band * 8 - (band // 4) * 32 < used[band // 4] for band in range(8)])
        y = np.full((64, 8), np.nan, np.float32)
        lib.padded(ptr(sizes), ptr(x), ptr(y))
        rows = np.repeat(live, 8)
        np.testing.assert_allclose(y[rows], np.exp(x[rows].astype(np.float64)), rtol=1e-6)
        assert np.isnan(y[~rows]).all()
        y = np.full((64, 8), np.nan, np.float32)
        lib.padded__range(ptr(sizes), ptr(x), ptr(y), ctypes.c_int64(2), ctypes.c_int64(6))
        rows = np.repeat(live & (np.arange(8) >= 2) & (np.arange(8) < 6), 8)
        np.testing.assert_allclose(y[rows], np.exp(x[rows].astype(np.float64)), rtol=1e-6)
        assert np.isnan(y[~rows]).all()


def test_cpu_kernels_read_and_write_contiguous_blocks_in_place():
    """On the CPU a load of a contiguous block of a buffer the kernel never
    stores to is a pointer into it (no copy), and a tile whose one store
    is the only store to a buffer nothing loads is computed in place, its
    other uses reading it there (`%m`, also multiplied into `out2`). A
    strided block (half rows) is copied, and a buffer loaded and stored
    (updated in place) is copied in and stored from a tile of its own, so
    the update reads the old values. Numerics against float64 numpy."""
    import ctypes
    text = """
ttile.kernel @blocks(%x: memref<8x64xf32>, %y: memref<8x128xf32>, %acc: memref<8x64xf32>,
                     %out: memref<8x64xf32>, %out2: memref<8x64xf32>)
    attributes {grid = array<i64: 4>, block = array<i64: 32>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c64 = arith.constant 64 : index
  %row = arith.muli %pid, %c2 : index
  %tx = ttile.load %x[%row, %c0] : memref<8x64xf32> -> !ttile.tile<2x64xf32>
  %ty = ttile.load %y[%row, %c64] : memref<8x128xf32> -> !ttile.tile<2x64xf32>
  %ta = ttile.load %acc[%row, %c0] : memref<8x64xf32> -> !ttile.tile<2x64xf32>
  %s = ttile.add %tx, %ty : !ttile.tile<2x64xf32>
  %m = ttile.mul %s, %ta : !ttile.tile<2x64xf32>
  ttile.store %m, %out[%row, %c0] : !ttile.tile<2x64xf32>, memref<8x64xf32>
  %k = ttile.mul %m, %tx : !ttile.tile<2x64xf32>
  ttile.store %k, %out2[%row, %c0] : !ttile.tile<2x64xf32>, memref<8x64xf32>
  %n = ttile.add %ta, %tx : !ttile.tile<2x64xf32>
  ttile.store %n, %acc[%row, %c0] : !ttile.tile<2x64xf32>, memref<8x64xf32>
  ttile.return
}"""
    source, lib = _cpu_kernels(text)
    body = source[source.index("blocks__range"):]
    assert re.search(r"const float\* __restrict__ t\d+ = arg0 \+", body), body   # x: viewed
    assert not re.search(r"= arg1 \+", body), body                   # y's half rows: copied
    assert re.search(r"(?<!const )float\* __restrict__ t\d+ = arg3 \+", body), body  # out
    assert re.search(r"(?<!const )float\* __restrict__ t\d+ = arg4 \+", body), body  # out2
    assert re.search(r"arg2\[.*\] = t\d+\[", body), body              # acc: a real store
    assert not re.search(r"arg[034]\[", body), body                  # no copy of x or outs
    rng = np.random.default_rng()
    x, y, acc = (rng.standard_normal(s).astype(np.float32) for s in ((8, 64), (8, 128), (8, 64)))
    old, out, out2 = acc.copy(), *(np.full((8, 64), np.nan, np.float32) for _ in range(2))
    lib.blocks(*(a.ctypes.data_as(ctypes.c_void_p) for a in (x, y, acc, out, out2)))
    x64, y64, a64 = (a.astype(np.float64) for a in (x, y[:, 64:], old))
    np.testing.assert_allclose(out, (x64 + y64) * a64, rtol=1e-6)
    np.testing.assert_allclose(out2, (x64 + y64) * a64 * x64, rtol=1e-6)
    np.testing.assert_allclose(acc, a64 + x64, rtol=1e-6)


_GELU_BIAS = """
ttile.kernel @k(%x: memref<8x64xf32>, %b: memref<8x64xf32>, %y: memref<8x64xf32>)
    attributes {grid = array<i64: 4>, block = array<i64: 32>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %row = arith.muli %pid, %c2 : index
  %tx = ttile.load %x[%row, %c0] : memref<8x64xf32> -> !ttile.tile<2x64xf32>
  %tb = ttile.load %b[%row, %c0] : memref<8x64xf32> -> !ttile.tile<2x64xf32>
  %s = ttile.add %tx, %tb : !ttile.tile<2x64xf32>
  %g = ttile.gelu %s : !ttile.tile<2x64xf32>
  ttile.store %g, %y[%row, %c0] : !ttile.tile<2x64xf32>, memref<8x64xf32>
  ttile.return
}"""


def test_the_cpp_printer_prints_the_cpu_schedule_and_the_plain_form_without_it():
    """The C++ printer decides nothing: without tessera-cpu-in-place and
    tessera-cpu-fuse it copies both loads and the store and gives each op a
    loop of its own; with them (ttile_to_cpp) the loads are pointers into
    x and b, the GELU is computed in y, and add and GELU share one loop in
    which the sum is a scalar."""
    from tessera_mlir import ir
    from tessera_compiler.codegen import emit_cpp
    from tessera_compiler.translate import ttile_to_cpp
    with ir.Context():
        plain = emit_cpp(ir.Module.parse(_GELU_BIAS))
        scheduled = ttile_to_cpp(ir.Module.parse(_GELU_BIAS))
    plain, scheduled = (s[s.index("k__range"):] for s in (plain, scheduled))
    assert "__restrict__ t" not in plain and "const float v" not in plain, plain
    assert len(re.findall(r"for \(int64_t e\d+ = 0; e\d+ < 128;", plain)) == 2, plain
    assert re.search(r"const float\* __restrict__ t\d+ = arg0 \+", scheduled), scheduled
    assert re.search(r"const float\* __restrict__ t\d+ = arg1 \+", scheduled), scheduled
    assert re.search(r"(?<!const )float\* __restrict__ t\d+ = arg2 \+", scheduled), scheduled
    assert len(re.findall(r"for \(int64_t e\d+ = 0; e\d+ < 128;", scheduled)) == 1, scheduled
    assert re.search(r"const float v\d+ = ", scheduled), scheduled


def test_the_cuda_printer_rejects_a_kernel_with_a_cpu_schedule():
    from tessera_mlir import ir
    from tessera_compiler.codegen.tile_emitter import EmitError
    from tessera_compiler.translate import schedule_for_cpu, ttile_to_cuda
    with ir.Context():
        module = ir.Module.parse(_GELU_BIAS)
        schedule_for_cpu(module.operation)
        with pytest.raises(EmitError, match="has a CPU schedule attribute"):
            ttile_to_cuda(module)


def test_cpu_broadcasts_join_the_elementwise_loop():
    """Broadcasts of a column, a row, the trailing dimensions (a [1, 4, 8]
    table over a [2, 4, 8] tile) and one value are read by index inside the
    elementwise loop (rows of the last dimension) rather than copied into
    tiles of their own; numerics against float64 numpy."""
    import ctypes
    text = """
ttile.kernel @bcast(%x: memref<4x4x8xf32>, %a: memref<4x4x1xf32>, %b: memref<1x1x8xf32>,
                    %c: memref<1x4x8xf32>, %d: memref<1x1x1xf32>, %out: memref<4x4x8xf32>)
    attributes {grid = array<i64: 2>, block = array<i64: 32>} {
  %pid = ttile.program_id 0
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %i = arith.muli %pid, %c2 : index
  %tx = ttile.load %x[%i, %c0, %c0] : memref<4x4x8xf32> -> !ttile.tile<2x4x8xf32>
  %ta = ttile.load %a[%i, %c0, %c0] : memref<4x4x1xf32> -> !ttile.tile<2x4x1xf32>
  %tb = ttile.load %b[%c0, %c0, %c0] : memref<1x1x8xf32> -> !ttile.tile<1x1x8xf32>
  %tc = ttile.load %c[%c0, %c0, %c0] : memref<1x4x8xf32> -> !ttile.tile<1x4x8xf32>
  %td = ttile.load %d[%c0, %c0, %c0] : memref<1x1x1xf32> -> !ttile.tile<1x1x1xf32>
  %ba = ttile.broadcast %ta : !ttile.tile<2x4x1xf32> to !ttile.tile<2x4x8xf32>
  %bb = ttile.broadcast %tb : !ttile.tile<1x1x8xf32> to !ttile.tile<2x4x8xf32>
  %bc = ttile.broadcast %tc : !ttile.tile<1x4x8xf32> to !ttile.tile<2x4x8xf32>
  %bd = ttile.broadcast %td : !ttile.tile<1x1x1xf32> to !ttile.tile<2x4x8xf32>
  %s = ttile.add %tx, %ba : !ttile.tile<2x4x8xf32>
  %m = ttile.mul %s, %bb : !ttile.tile<2x4x8xf32>
  %u = ttile.sub %m, %bc : !ttile.tile<2x4x8xf32>
  %y = ttile.add %u, %bd : !ttile.tile<2x4x8xf32>
  ttile.store %y, %out[%i, %c0, %c0] : !ttile.tile<2x4x8xf32>, memref<4x4x8xf32>
  ttile.return
}"""
    source, lib = _cpu_kernels(text)
    body = source[source.index("bcast__range"):]
    assert not re.search(r"float t\d+\[", body), body          # no tile arrays at all
    assert body.count("for (int64_t r") == 1, body                # one loop nest
    rng = np.random.default_rng()
    x, a, b, c, d = (rng.standard_normal(s).astype(np.float32)
                     for s in ((4, 4, 8), (4, 4, 1), (1, 1, 8), (1, 4, 8), (1, 1, 1)))
    out = np.full((4, 4, 8), np.nan, np.float32)
    lib.bcast(*(v.ctypes.data_as(ctypes.c_void_p) for v in (x, a, b, c, d, out)))
    x64, a64, b64, c64, d64 = (v.astype(np.float64) for v in (x, a, b, c, d))
    np.testing.assert_allclose(out, (x64 + a64) * b64 - c64 + d64, rtol=1e-5, atol=1e-6)


_TEAM_PROBE = """
import os, sys
import numpy as np
import tessera as ts
from tessera import op
from tessera_runtime.engines import cpu
x, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert x.nbytes >= max(cpu.THREADED_MIN_BYTES, cpu.THREADED_MIN_BYTES_BESIDE_OPENBLAS)
before = len(os.listdir("/proc/self/task"))
np.save(sys.argv[3], np.asarray(ts.jit(lambda x, b: op.tanh(x + b) * 0.5 + x)(x, b)))
print(len(os.listdir("/proc/self/task")) - before, os.environ.get("GOMP_SPINCOUNT"))
"""


def test_a_large_cpu_launch_splits_its_grid_over_an_openmp_team(tmp_path):
    """A generated CPU kernel touching >= THREADED_MIN_BYTES runs its
    outermost grid loop in slices on an OpenMP team of TESSERA_NUM_THREADS
    threads (its NAME__slice through tessera_parallel: the process has one
    thread more than with TESSERA_NUM_THREADS=1); the result is bitwise that
    of one thread and matches float64 numpy. Where the GEMMs run on OpenBLAS's
    own threads (no team_sgemm), the team sleeps between launches
    (GOMP_SPINCOUNT=0) unless the user chose libgomp's waiting."""
    import os
    import subprocess
    import sys
    rng = np.random.default_rng()
    x = rng.standard_normal((1024, 1024), dtype=np.float32)       # 4 MiB in, 4 MiB out
    b = rng.standard_normal((1, 1024), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "b.npy", b)
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}

    def run(threads, **env):
        out = tmp_path / f"out{threads}.npy"
        printed = subprocess.run(
            [sys.executable, "-c", _TEAM_PROBE, str(tmp_path / "x.npy"), str(tmp_path / "b.npy"),
             str(out)], env={**clean, "TESSERA_NUM_THREADS": threads, **env},
            capture_output=True, text=True, check=True).stdout.split()
        return np.load(out), int(printed[0]), printed[1]
    one, new_threads_1, spin_1 = run("1")
    two, new_threads_2, spin_2 = run("2")
    assert new_threads_2 == new_threads_1 + 1
    from tessera_runtime.engines.cpu import team_sgemm
    assert spin_1 == spin_2 == ("None" if team_sgemm() else "0")
    assert run("2", OMP_WAIT_POLICY="active")[2] == "None"         # the user's choice
    np.testing.assert_array_equal(one, two)
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(two, np.tanh(x64 + b64) * 0.5 + x64, rtol=1e-5, atol=1e-6)


def test_a_forked_child_runs_the_kernels_and_gemms_on_one_thread(monkeypatch):
    """libgomp's threads do not survive fork(): a child forked after the
    team ran would hang in its first parallel region. The kernel library
    notices the fork (pthread_atfork) and the child runs each launch and
    GEMM on its one thread: the same bits, no hang."""
    import os
    import time
    monkeypatch.setenv("TESSERA_NUM_THREADS", "2")
    rng = np.random.default_rng()
    x = rng.standard_normal((512, 1024), dtype=np.float32)      # 2 MiB: threaded
    w = rng.standard_normal((1024, 256), dtype=np.float32)
    step = ts.jit(lambda x, w: op.matmul(op.tanh(x) * 0.5 + x, w))
    parent = np.asarray(step(x, w))
    pid = os.fork()
    if pid == 0:                                    # the child: no pytest, no cleanup
        os._exit(0 if np.asarray(step(x, w)).tobytes() == parent.tobytes() else 3)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid, "the forked child hung"
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the child's result differs"

def test_value_checks_run_in_the_kernel_library_and_find_what_numpy_finds():
    """The CPU engine's value check (tgraph.check_range) of int32 and int64
    is one call of the kernel library's tessera_check_range_*: on random
    blocks of up to three 4096-element blocks and a tail, with failing
    elements anywhere (or none), ranges reaching the type's ends, an allowed
    value or none, and a block offset, it returns the numpy routine's flag;
    a form it does not take (two allowed values) is left to numpy."""
    from tessera_mlir import ir
    from tessera_compiler.codegen import emit_cpp
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_runtime.engines import cpu, library
    with ir.Context():
        source = emit_cpp(ir.Module.parse("module {}"))
    engine = cpu.CPUEngine()
    engine.load_kernels(build_cpu_library(source))
    rng = np.random.default_rng()
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        for low, high, allowed in ((0, 7, ()), (0, 11, (-100,)), (-5, 3, (2**31 - 1,)),
                                   (int(info.min), int(info.max) + 1, ()),
                                   (int(info.min), 0, (7,)), (3, int(info.max) + 1, (-1,))):
            attrs = {"low": low, "high": high, "allowed": allowed, "block": (3, 4)}
            for n in (1, 5, 4095, 4096, 4097, 3 * 4096 + 5):
                x = rng.integers(max(low, -2**40), min(high, 2**40), n).astype(dtype)
                if allowed and info.min <= allowed[0] <= info.max:
                    x[rng.integers(0, n, 3)] = allowed[0]
                for bad in ([], [int(rng.integers(0, n))], list(rng.integers(0, n, 3))):
                    y = x.copy()
                    for i in bad:
                        y[i] = rng.choice([v for v in (low - 1, high, info.min, info.max, -2)
                                           if info.min <= v <= info.max and not low <= v < high
                                           and v not in allowed] or [low])
                    check = engine.prepare_library_by_address(
                        "check_range", attrs, [(y.shape, y.dtype)])
                    assert check is not None, (dtype, low, high, allowed)
                    assert check([cpu.address(y)]) == library.check_range(np, attrs, y), \
                        (dtype, low, high, allowed, n, bad)
    two = {"low": 0, "high": 7, "allowed": (-1, -2)}
    assert engine.prepare_library_by_address("check_range", two, [((4,), np.int32)]) is None


def test_transposes_slices_pads_and_concats_run_in_the_kernel_library_with_the_host_bits():
    """The CPU engine runs the library's transpose, slice and pad as one
    tessera_copy_box call each, and a concat as one per input: random boxes
    of rank 1-5, every dtype size (int8, bf16's uint16, float32, int32,
    float64), on 1, 2 and 3 threads, give the numpy routines' bytes exactly
    (a pad's outside zeroed, a NaN's bits kept, a zero-size concat input
    skipped), a multi-threaded copy too (a box over THREADED_MIN_BYTES)."""
    from tessera_mlir import ir
    from tessera_compiler.codegen import emit_cpp
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_runtime.engines import cpu, library
    with ir.Context():
        source = emit_cpp(ir.Module.parse("module {}"))
    engine = cpu.CPUEngine()
    engine.load_kernels(build_cpu_library(source))
    rng = np.random.default_rng()

    def cases(shape):
        rank = len(shape)
        yield "transpose", {"perm": tuple(int(p) for p in rng.permutation(rank))}, None
        offsets = tuple(int(rng.integers(0, n)) for n in shape)
        yield "slice", {"offsets": offsets}, tuple(int(rng.integers(1, n - o + 1))
                                                     for n, o in zip(shape, offsets))
        padded = tuple(n + int(rng.integers(0, 3)) for n in shape)
        yield "pad", {"offsets": tuple(int(rng.integers(0, p - n + 1))
                                       for p, n in zip(padded, shape))}, padded

    shapes = [tuple(int(n) for n in rng.integers(1, 6, rank)) for rank in range(1, 6)
              for _ in range(3)] + [(16, 64, 4, 32)]          # 512 KiB of float32: threaded
    for dtype in (np.int8, np.uint16, np.float32, np.int32, np.float64):
        for shape in shapes:
            a = (rng.standard_normal(shape) * 100).astype(dtype)
            if dtype == np.float32:
                a.flat[0] = np.float32("nan")
            for routine, attrs, out_shape in cases(shape):
                if routine == "transpose":
                    out_shape = tuple(shape[p] for p in attrs["perm"])
                want = np.full(out_shape, 7, dtype)
                library.ROUTINES[routine](np, attrs, a, want)
                for threads in (1, 2, 3):
                    engine._threads = threads
                    got = np.full(out_shape, 7, dtype)
                    call = engine.prepare_library_by_address(
                        routine, attrs, [(a.shape, a.dtype), (got.shape, got.dtype)])
                    assert call is not None, (routine, shape, dtype)
                    call([cpu.address(a), cpu.address(got)])
                    assert got.tobytes() == want.tobytes(), (routine, attrs, shape, dtype, threads)
            dim = int(rng.integers(0, len(shape)))
            pieces = [(rng.standard_normal(shape[:dim] + (int(n),) + shape[dim + 1:]) * 100)
                      .astype(dtype) for n in rng.integers(0, 4, int(rng.integers(1, 4)))]
            want = np.concatenate(pieces, axis=dim)
            if not want.size:
                continue
            for threads in (1, 2, 3):
                engine._threads = threads
                got = np.full(want.shape, 7, dtype)
                call = engine.prepare_library_by_address(
                    "concat", {"dim": dim}, [(p.shape, p.dtype) for p in pieces + [got]])
                call([cpu.address(p) for p in pieces + [got]])
                assert got.tobytes() == want.tobytes(), ("concat", dim, shape, dtype, threads)
    # q, k and v's cotangents into one [B, S, H, 3, Dh] (1.5 MiB: threaded)
    pieces = [rng.standard_normal((16, 64, 4, 1, 32)).astype(np.float32) for _ in range(3)]
    got = np.empty((16, 64, 4, 3, 32), np.float32)
    engine._threads = 2
    engine.prepare_library_by_address("concat", {"dim": 3}, [(p.shape, p.dtype) for p in
                                                             pieces + [got]])(
        [cpu.address(p) for p in pieces + [got]])
    assert np.array_equal(got, np.concatenate(pieces, axis=3))


def test_embedding_rows_run_in_the_kernel_library_with_the_bits_of_the_host_routines():
    """The CPU engine runs a float32 embedding lookup (gather) and its
    gradient (scatter_add) with int32 ids as one call into the kernel
    library, on the whole table and on each rank's block of a vocab-parallel
    one: the same bits as the numpy routines (repeated ids summed in order),
    the blocks' lookups summing to the whole table's exactly, the gradient
    within float32 rounding of float64; an id out of range is the numpy
    routine's error, naming the id and the table's rows; other dtypes stay
    with numpy."""
    from tessera_mlir import ir
    from tessera_compiler.codegen import emit_cpp
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_runtime.engines import cpu, library
    with ir.Context():
        source = emit_cpp(ir.Module.parse("module {}"))
    engine = cpu.CPUEngine()
    engine.load_kernels(build_cpu_library(source))
    rng = np.random.default_rng()
    vocab, width = 12, 16
    table = rng.standard_normal((vocab, width), dtype=np.float32)
    ids = rng.integers(0, vocab, (5, 7)).astype(np.int32)      # (repeats: 35 ids, 12 rows)
    updates = rng.standard_normal((5, 7, width), dtype=np.float32)

    def run(routine, attrs, args):
        metas = [(a.shape, a.dtype) for a in args]
        call = engine.prepare_library_by_address(routine, attrs, metas)
        assert call is not None, (routine, metas)
        call([cpu.address(a) for a in args])

    for count in (1, 2, 3):
        rows = vocab // count
        looked_up = []
        for index in range(count):
            attrs = {"block": (index, count)} if count > 1 else {}
            block = np.ascontiguousarray(table[index * rows:(index + 1) * rows])
            got, want = (np.full((5, 7, width), np.nan, np.float32) for _ in range(2))
            run("gather", attrs, (block, ids, got))
            library.gather(np, attrs, block, ids, want)
            assert got.tobytes() == want.tobytes(), (count, index)
            looked_up.append(got)
            grad, want = (np.full((rows, width), np.nan, np.float32) for _ in range(2))
            run("scatter_add", attrs, (updates, ids, grad))
            library.scatter_add(np, attrs, updates, ids, want)
            assert grad.tobytes() == want.tobytes(), (count, index)
            exact = np.zeros((vocab, width))
            np.add.at(exact, ids.ravel(), updates.reshape(-1, width).astype(np.float64))
            np.testing.assert_allclose(grad, exact[index * rows:(index + 1) * rows],
                                       rtol=1e-5, atol=1e-5)
        assert sum(looked_up[1:], looked_up[0]).tobytes() == table[ids].tobytes()
    bad = ids.copy()
    bad[2, 3] = vocab
    for routine, args in (("gather", (table, bad, np.empty((5, 7, width), np.float32))),
                          ("scatter_add", (updates, bad, np.empty((vocab, width), np.float32)))):
        with pytest.raises(library.LibraryError, match=f"index {vocab} is out of range for a "
                           f"table of {vocab} rows"):
            run(routine, {}, args)
    for metas in ([((vocab, width), np.dtype(np.float64)), ((5, 7), np.dtype(np.int32)),
                   ((5, 7, width), np.dtype(np.float64))],
                  [((vocab, width), np.dtype(np.float32)), ((5, 7), np.dtype(np.int64)),
                   ((5, 7, width), np.dtype(np.float32))]):
        assert engine.prepare_library_by_address("gather", {}, metas) is None, metas


def test_float32_gemms_run_on_the_kernel_team_with_bits_independent_of_its_size():
    """The CPU engine's matmul runs 2-D float32 GEMMs through the kernel
    library's tessera_gemm_f32 (numpy's OpenBLAS, one-threaded, on blocks
    of the result that the OpenMP team shares): every transpose flag, a
    shape cut by rows, one cut by columns (2 blocks each), a square one cut
    in 4 (by columns where B is transposed), one too small to cut; the same
    bits on 1, 2 and 3 threads, within float32 rounding of float64 numpy.
    OpenBLAS's own thread count (the user's numpy) is as it was after each
    call. So do the MoE routines' per-expert GEMMs; batched and empty
    operands still go to numpy."""
    from tessera_mlir import ir
    from tessera_compiler.codegen import emit_cpp
    from tessera_compiler.codegen.build import build_cpu_library
    from tessera_runtime.engines import cpu
    if cpu.team_sgemm() is None:
        pytest.skip("numpy's BLAS here lacks cblas_sgemm64_ / openblas_set_num_threads_local")
    with ir.Context():
        source = emit_cpp(ir.Module.parse("module {}"))
    engine = cpu.CPUEngine()
    engine.load_kernels(build_cpu_library(source))
    import ctypes
    openblas = ctypes.CDLL(cpu._openblas_paths()[0])
    blas_threads = next(getattr(openblas, f) for f in ("scipy_openblas_get_num_threads64_",
                                                      "openblas_get_num_threads")
                        if hasattr(openblas, f))
    users = blas_threads()
    rng = np.random.default_rng()
    assert [cpu.gemm_pieces(*s) for s in ((200, 72, 40), (256, 256, 256), (7, 5, 3))] \
        == [2, cpu.GEMM_PIECES, 1]
    # Never more blocks than the machine's cores per local rank.
    assert [cpu.gemm_pieces(256, 256, 256, most) for most in (1, 2, 3)] == [1, 2, 3]
    assert cpu.gemm_pieces(200, 72, 40, 1) == 1
    engine._gemm_blocks = cpu.GEMM_PIECES          # the 4-block cut, on any machine
    for m, n, k in ((200, 72, 40), (24, 300, 56), (256, 256, 256), (7, 5, 3)):
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
            b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
            attrs = {"transpose_lhs": ta, "transpose_rhs": tb}
            out = {}
            for threads in (1, 2, 3):
                engine._threads = threads
                out[threads] = np.full((m, n), np.nan, np.float32)
                engine.prepare_library("matmul", attrs)((a, b, out[threads]))
                assert blas_threads() == users
                # The executor's way (by address, as a kernel): the same bits.
                direct = np.full((m, n), np.nan, np.float32)
                engine.prepare_library_by_address(
                    "matmul", attrs, [(x.shape, x.dtype) for x in (a, b, direct)])(
                    [cpu.address(x) for x in (a, b, direct)])
                assert direct.tobytes() == out[threads].tobytes(), (m, n, k, ta, tb, threads)
            assert out[1].tobytes() == out[2].tobytes() == out[3].tobytes(), (m, n, k, ta, tb)
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            want = (a64.T if ta else a64) @ (b64.T if tb else b64)
            np.testing.assert_allclose(out[2], want, rtol=1e-4, atol=1e-5 * k)
    batched = rng.standard_normal((3, 8, 5), dtype=np.float32)
    square = rng.standard_normal((5, 5), dtype=np.float32)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    for metas in ([((3, 8, 5), f32), ((5, 5), f32), ((3, 8, 5), f32)],     # batched
                  [((8, 5), f64), ((5, 5), f64), ((8, 5), f64)],            # float64
                  [((8, 0), f32), ((0, 5), f32), ((8, 5), f32)]):           # empty
        assert engine.prepare_library_by_address("matmul", {}, metas) is None, metas
    got = np.empty((3, 8, 5), np.float32)
    engine.prepare_library("matmul", {})((batched, square, got))
    np.testing.assert_allclose(got, batched @ square, rtol=1e-5, atol=1e-5)
    # The MoE routines' per-expert GEMMs (rows of x, w[e] or its transpose;
    # x^T g summed per expert) reach the team through the engine's numpy.
    x = rng.standard_normal((40, 24), dtype=np.float32)
    w = rng.standard_normal((3, 16, 24), dtype=np.float32)
    sizes = np.array([10, 0, 22], np.int32)                     # rows 32..39: padding
    grouped = np.full((40, 16), np.nan, np.float32)
    engine.prepare_library("grouped_matmul", {"transpose_rhs": True})((x, w, sizes, grouped))
    bounds = [0, 10, 10, 32]
    for e in range(3):
        np.testing.assert_allclose(grouped[bounds[e]:bounds[e + 1]],
                                   x[bounds[e]:bounds[e + 1]].astype(np.float64) @ w[e].T,
                                   rtol=1e-4, atol=1e-4)
    assert not grouped[32:].any()
    g = rng.standard_normal((40, 16), dtype=np.float32)
    outer = np.full((3, 24, 16), np.nan, np.float32)
    engine.prepare_library("grouped_outer", {})((x, g, sizes, outer))
    for e in range(3):
        rows = slice(bounds[e], bounds[e + 1])
        np.testing.assert_allclose(outer[e], x[rows].astype(np.float64).T @ g[rows],
                                   rtol=1e-4, atol=1e-4)
    assert blas_threads() == users
    empty = np.full((4, 3), np.nan, np.float32)                 # k = 0: zeros
    engine.prepare_library("matmul", {})((np.ones((4, 0), np.float32),
                                          np.ones((0, 3), np.float32), empty))
    assert not empty.any()


def test_a_cpu_gemm_runs_the_kernel_after_it_on_the_rows_it_wrote(monkeypatch, tmp_path):
    """tessera-fuse-gemm-epilogues: `layernorm(x + gelu(x @ w1 + b1) @ w2)`
    runs as two launches, each GEMM running the kernel after it as its
    epilogue (tessera_gemm_f32_then). The first's kernel is one program of
    all 128 rows, more than a block of 64 (the team runs it after a
    barrier); the second's programs are 64 rows, one per block. The result
    is within float32 rounding of float64 numpy and has the bits of the
    GEMM and the kernel launched one after the other (the engine's way for a
    library without the fused entry)."""
    from tessera_runtime.engines import cpu
    if cpu.team_sgemm() is None:
        pytest.skip("numpy's BLAS here lacks cblas_sgemm64_ / openblas_set_num_threads_local")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TESSERA_GEMM_BLOCKS", "2")      # 2 blocks of rows on any machine
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 32, 64)).astype(np.float32)
    w1 = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    b1 = rng.standard_normal(32).astype(np.float32)
    w2 = (rng.standard_normal((32, 64)) / 6).astype(np.float32)
    lw, lb = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)

    def block(x, w1, b1, w2, lw, lb):
        return op.layernorm(x + op.matmul(op.gelu(op.matmul(x, w1) + b1), w2), lw, lb)

    fused = ts.jit(block)
    got = np.asarray(fused(x, w1, b1, w2, lw, lb))
    tile = fused.lower(x, w1, b1, w2, lw, lb).tile
    launches = [n for n in re.findall(r"tsched\.launch @(\w+)", tile) if "reshape" not in n]
    assert len(launches) == 2 and all("_then_" in n for n in launches), launches
    assert sorted(int(r) for r in re.findall(r"epilogue_rows = (\d+) : i64", tile)) == [64, 128]
    x64 = x.astype(np.float64)
    h = x64 @ w1 + b1
    y = x64 + 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3))) @ w2
    want = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5) * lw + lb
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # The same bundle on an engine without tessera_gemm_f32_then.
    load = cpu.CPUEngine.load_kernels

    def without_fused_entry(self, path, launches=None):
        load(self, path, launches)
        self._gemm_then = None
    monkeypatch.setattr(cpu.CPUEngine, "load_kernels", without_fused_entry)
    separate = np.asarray(ts.jit(block)(x, w1, b1, w2, lw, lb))
    assert separate.tobytes() == got.tobytes()
