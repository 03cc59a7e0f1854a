"""Compiles generated kernel sources, cached on disk by content.

The cache key is the hash of (source, compiler, flags, compiler version), so
a changed emitter, flag or toolchain never reuses a stale binary. Writes are
atomic (compile to a temporary name, then rename), so ranks compiling the same
kernels at once do not see half-written files.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from tessera_runtime import env

# -march=native: kernels are compiled on the machine that runs them (bundles
# record the source, so another machine rebuilds). No -ffast-math: isfinite
# checks (x - x == 0) and inf masks must keep IEEE semantics. -fno-trapping-math
# (we never enable FP traps) lets GCC if-convert the selects in exp/tanh and so
# vectorize them: 6x on a GELU. -ffp-contract=off: every op rounds its result
# (as numpy does), so a value's bits do not depend on which ops a kernel fused
# it with; GCC's default for C++ contracts a*b+c across statements into an FMA,
# and a recomputed value (ts.remat) fused differently would change bits.
#
# -O2, not -O3: g++ takes markedly less time on the example's kernels and the
# step's generated kernels run no slower (the measurement:
# bench/results/docstring-timings-moved-2026-12-02.md). GCC 12's -O2 still
# vectorizes (its "very cheap" cost model: the loops that need no runtime
# checks or epilogue, which is what the emitter writes).
CXX_FLAGS = ["-O2", "-march=native", "-fno-math-errno", "-fno-trapping-math",
             "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC", "-fopenmp"]
# sm_90a: Hopper with its arch-specific features (wgmma.mma_async); such a
# cubin runs on compute capability 9.0 (H100, H200) only. Kernels guard their
# wgmma loops, so the same source also builds for plain sm_90.
CUDA_ARCH = "sm_90a"
NVCC_OPTIONS = ["-std=c++17", "-O3"]


class KernelBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return env.cache_dir("kernels")


def host_compiler() -> str:
    cxx = env.host_compiler()
    if not cxx:
        raise KernelBuildError("no C++ compiler found: install g++ or set CXX")
    return cxx


@lru_cache(maxsize=None)
def _version(tool: str) -> str:
    """Everything `tool --version` prints: nvcc's first line is the same for
    every release (its build line, last, names the version)."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True)
    return (out.stdout + out.stderr) or tool


def _file_identity(path: Path) -> str:
    """A library the build links, as it stands: path, size and modification
    time (a different NVSHMEM wheel gives a different key)."""
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _key(*parts: str) -> str:
    """A cache file's name: the hash of what it is made of."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _cached_build(source: str, suffix: str, tool: str, flags: list[str], out_ext: str,
                  inputs: tuple[Path, ...] = (), depends: tuple[str, ...] = (),
                  log_ext: str | None = None) -> Path:
    """`tool flags <source or inputs> -o out`, cached by content: the source,
    the tool and its version, the flags, and `depends` (what else the output
    is made of, e.g. a linked library's identity). With `log_ext` what the
    tool printed is kept beside the output (same name, that extension)."""
    target = cache_dir() / f"{_key(source, tool, _version(tool), *flags, *depends)}{out_ext}"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        files = [str(p) for p in inputs]
        if not inputs:
            src = Path(tmp) / f"kernels{suffix}"
            src.write_text(source)
            files = [str(src)]
        out = Path(tmp) / f"out{out_ext}"
        proc = subprocess.run([tool, *flags, *files, "-o", str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise KernelBuildError(f"{Path(tool).name} failed on generated kernels "
                                   f"({Path(files[0]).name}):\n{proc.stderr[-4000:]}")
        if log_ext:              # before the output: whoever finds it finds its log
            log = Path(tmp) / "out.log"
            log.write_text(proc.stdout + proc.stderr)
            os.replace(log, target.with_suffix(log_ext))
        os.replace(out, target)
    return target


#: The comment that opens each kernel in the emitted C++ (tile_emitter
#: writes it): what comes before the first is the shared preamble (includes,
#: static inline helpers); each kernel after it stands alone.
KERNEL_HEADER = "// ttile.kernel @"
#: Ends the part of a CPU source's preamble that every translation unit
#: includes; what follows it up to the first kernel (functions with external
#: linkage, defined once per library: the OpenMP team, the GEMM, the row
#: copies) is the same in every library: its object is built once.
PREAMBLE_END = "// -- end of the shared preamble\n"
#: Below this much kernel code one compile is quicker than several (each
#: translation unit re-parses <cmath> and the preamble: ~0.15 s).
SPLIT_MIN_CHARS = 40_000
#: Where `prebuild_cpu_runtime` (tools/bootstrap.sh, at install) puts the
#: object of a CPU library's runtime part; the kernel cache is the fallback.
PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
#: The C++ an emitted CPU source includes (compiled with -I at this folder):
#: CPU_HEADER before its kernels, CPU_RUNTIME as its runtime part.
CPU_INCLUDE_DIR = Path(__file__).resolve().parent / "cpu"
CPU_HEADER, CPU_RUNTIME = "tessera_cpu.h", "tessera_cpu_runtime.cpp"


def inline_includes(text: str, folder: Path) -> str:
    """`text` with each `#include "file"` line replaced by that file's text
    (found beside its includer, else in `folder`: the -I), itself inlined,
    once per file as include guards would have it; system includes stay.
    For a source that must stand alone: NVRTC's, a bundle's."""
    seen: set[Path] = set()

    def inline(text: str, here: Path) -> str:
        def replace(match: re.Match) -> str:
            path = here / match[1] if (here / match[1]).exists() else folder / match[1]
            path = path.resolve()
            if path in seen:
                return ""
            seen.add(path)
            return inline(path.read_text(), path.parent)
        return re.sub(r'^#include "([^"]+)"\n', replace, text, flags=re.M)
    return inline(text, folder)


def standalone_cpu_source(source: str) -> str:
    """Emitted CPU source `source` with its headers pasted in: what a bundle
    records, which g++ compiles without Tessera's headers."""
    return inline_includes(source, CPU_INCLUDE_DIR)


def cpu_include_digest() -> str:
    """The hash of every file in CPU_INCLUDE_DIR (names and contents): part of
    each CPU build's cache key, so an edited header never reuses an object
    built from the old one (the source text names the headers only)."""
    return env.folder_digest(CPU_INCLUDE_DIR)


def dump_kernels(kernels: list[str], suffix: str) -> None:
    """With TESSERA_DUMP_KERNELS set, writes each emitted kernel's text to
    that folder as <hash of the text><suffix>: the same kernel, the same
    file, so two runs' folders differ exactly in the kernels that changed."""
    folder = env.get("TESSERA_DUMP_KERNELS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for text in kernels:
        path = Path(folder) / f"{_key(text)}{suffix}"
        if not path.exists():
            path.write_text(text)


def build_jobs() -> int:
    """Host compiles at once: TESSERA_BUILD_JOBS, else the cores this
    process may run on."""
    try:
        return env.count("TESSERA_BUILD_JOBS") or env.cores()
    except ValueError as err:
        raise KernelBuildError(str(err)) from None


def _parts(source: str) -> tuple[str, str, list[str]] | None:
    """(shared preamble, runtime part, kernels) of an emitted CPU source, or
    None for a source not split that way."""
    mark = "\n" + KERNEL_HEADER
    head, found, rest = source.partition(mark)
    shared, end, runtime = head.partition(PREAMBLE_END)
    if not found or not end:
        return None
    return shared, shared + end + runtime, [mark + k for k in rest.split(mark)]


def _translation_units(source: str, parts: int) -> list[str]:
    """The kernels of `source` as up to `parts` sources of about equal size,
    each the shared preamble and a share of the kernels (largest first onto
    the lightest); the runtime part is compiled on its own (`_runtime_object`)."""
    shared, _, kernels = _parts(source)
    units: list[list[str]] = [[] for _ in range(min(parts, len(kernels)))]
    sizes = [0] * len(units)
    for k in sorted(kernels, key=len, reverse=True):
        i = sizes.index(min(sizes))
        units[i].append(k)
        sizes[i] += len(k)
    return [shared + "".join(u) for u in units]


def _object_flags() -> list[str]:
    return [f for f in CXX_FLAGS if f != "-shared"] + ["-c"]


def _runtime_object(runtime: str, cxx: str) -> Path:
    """The object of a library's runtime part (the same text in every
    library, 0.16 s of g++): prebuilt at install, else built into the cache
    once."""
    flags = _object_flags()
    name = f"{_key(runtime, cxx, _version(cxx), *flags, cpu_include_digest())}.o"
    if (PREBUILT_DIR / name).exists():
        return PREBUILT_DIR / name
    return _compile_objects([runtime], cxx, flags)[0]


def _header_name(cxx: str, flags: list[str]) -> str:
    """The folder name of CPU_HEADER precompiled by `cxx` with `flags`."""
    return f"pch-{_key(cxx, _version(cxx), *flags, cpu_include_digest())}"


def _build_precompiled_header(folder: Path, cxx: str, flags: list[str]) -> Path | None:
    """CPU_HEADER precompiled into `folder` (written whole or not at all:
    ranks building at once each write their own and rename it); None if
    the compiler cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{os.getpid()}.{CPU_HEADER}.gch"
    proc = subprocess.run([cxx, *(f for f in flags if f != "-c"), "-x", "c++-header",
                           str(CPU_INCLUDE_DIR / CPU_HEADER), "-o", str(tmp)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, folder / f"{CPU_HEADER}.gch")
    return folder


def _precompiled_header(cxx: str, flags: list[str]) -> Path | None:
    """A folder holding CPU_HEADER precompiled for `flags`, searched before
    CPU_INCLUDE_DIR: g++ reads FOLDER/tessera_cpu.h.gch in place of the
    header when it was made by the same compiler with the same flags, and
    the header otherwise, so the objects are the same either way. Parsing
    the header's standard includes was most of a small kernel's compile
    (bench/results/cpu-attention-backward-2026-12-03.md). Made at install
    (prebuild_cpu_runtime), else once into the cache."""
    name = _header_name(cxx, flags)
    for base in (PREBUILT_DIR, cache_dir()):
        if (base / name / f"{CPU_HEADER}.gch").exists():
            return base / name
    return _build_precompiled_header(cache_dir() / name, cxx, flags)


def prebuild_cpu_runtime(source: str) -> Path:
    """Builds the runtime part of emitted CPU source `source` (of no kernels:
    `tile_emitter.cpu_runtime_source()`) and the precompiled CPU_HEADER
    into PREBUILT_DIR, so that no first compile pays for them;
    tools/bootstrap.sh does, at install."""
    cxx, flags = host_compiler(), _object_flags()
    PREBUILT_DIR.mkdir(exist_ok=True)
    _build_precompiled_header(PREBUILT_DIR / _header_name(cxx, flags), cxx, flags)
    # (The header that would open a first kernel ends the runtime part.)
    runtime = _parts(source + "\n" + KERNEL_HEADER)[1]
    return _compile_objects([runtime], cxx, flags, directory=PREBUILT_DIR)[0]


def build_cpu_library(source: str) -> Path:
    """Compiles C++ kernels into a shared library; returns its cached path.

    The kernels are compiled as several translation units at once when the
    source is large (one per core, TESSERA_BUILD_JOBS), each cached by its
    content, and linked with the runtime part's object (`_runtime_object`):
    the example GPT's training step (96 kernels, 343 KB of C++) took 10.5 s
    of g++ in one unit and 6.5 s in two on the 2-core CI machine. A source
    not split into preamble, runtime and kernels is built as it is."""
    cxx, jobs = host_compiler(), build_jobs()
    parts = _parts(source)
    if parts is None:
        return _cached_build(source, ".cpp", cxx, [*CXX_FLAGS, f"-I{CPU_INCLUDE_DIR}"], ".so",
                             depends=(cpu_include_digest(),))
    units = _translation_units(source, jobs if jobs > 1 and len(source) >= SPLIT_MIN_CHARS
                               else 1)
    objects = _compile_objects(units, cxx, _object_flags()) + [_runtime_object(parts[1], cxx)]
    # Linked and cached by the objects' names, which are their contents' hashes.
    return _cached_build(" ".join(o.name for o in objects), "", cxx,
                         ["-shared", "-fopenmp", *_linker_flags(cxx)], ".so", inputs=tuple(objects))


@lru_cache(maxsize=None)
def _linker_flags(cxx: str) -> tuple[str, ...]:
    """`-fuse-ld=gold` where `cxx` can link with gold: it links a kernel
    library (a few objects and the runtime part's) in about a quarter of
    GNU ld's time, and the suite links one library per program it compiles
    (bench/results/suite-time-2026-12-03.md). The same objects either way;
    GNU ld where gold is missing."""
    proc = subprocess.run([cxx, "-fuse-ld=gold", "-Wl,--version"], capture_output=True, text=True)
    return ("-fuse-ld=gold",) if proc.returncode == 0 and "gold" in proc.stdout.lower() else ()


def _compile_objects(units: list[str], cxx: str, flags: list[str],
                     directory: Path | None = None) -> list[Path]:
    """Each CPU source in `units` compiled to an object file in `directory`
    (the cache), all at once; cached by content, the included headers'
    too (a kernel set that changes in one unit recompiles one)."""
    directory = directory or cache_dir()
    objects, running = [], []
    header, looked = None, False
    for unit in units:
        target = directory / f"{_key(unit, cxx, _version(cxx), *flags, cpu_include_digest())}.o"
        objects.append(target)
        if target.exists():
            continue
        tmp = Path(tempfile.mkdtemp(dir=directory))
        (tmp / "kernels.cpp").write_text(unit)
        if not looked:                  # (once: a compiler that cannot is asked once)
            header, looked = _precompiled_header(cxx, flags), True
        include = [f"-I{header}"] if header else []
        proc = subprocess.Popen([cxx, *flags, *include, f"-I{CPU_INCLUDE_DIR}",
                                 str(tmp / "kernels.cpp"), "-o", str(tmp / "out.o")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        running.append((proc, tmp, target))
    failures = []
    for proc, tmp, target in running:
        _, err = proc.communicate()
        if proc.returncode == 0:
            os.replace(tmp / "out.o", target)
        else:
            failures.append(err)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        raise KernelBuildError(f"{Path(cxx).name} failed on generated kernels "
                               f"(kernels.cpp):\n{failures[0][-4000:]}")
    return objects


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def nvshmem_home() -> Path | None:
    """The NVSHMEM installation with `include/nvshmem.h` and
    `lib/libnvshmem_device.a`: NVSHMEM_HOME, else the `nvidia-nvshmem-cu13`
    (or -cu12) wheel's directory."""
    candidates = [env.get("NVSHMEM_HOME")]
    try:
        import nvidia.nvshmem as wheel
        candidates += [str(Path(p)) for p in wheel.__path__]
    except ImportError:
        pass
    for c in candidates:
        if c and (Path(c) / "include" / "nvshmem.h").exists() and \
                (Path(c) / "lib" / "libnvshmem_device.a").exists():
            return Path(c)
    return None


def kernel_resources(source: str, arch: str = CUDA_ARCH) -> dict[str, dict[str, int]]:
    """What ptxas reports for each kernel of a CUDA source compiled for
    `arch`: {kernel: {"registers", "spill_stores", "spill_loads"}}, plus
    "wgmma_serialized" (ptxas's reason) for a kernel whose wgmma.mma_async
    instructions ptxas serialized (it then waits for each one at issue:
    correct, but the asynchronous overlap the kernel was written for is
    gone). Raises KernelBuildError when nvcc is missing or fails."""
    printed = _device_code(source, arch).with_suffix(PTXAS_REPORT).read_text()
    report, kernel = {}, None
    for line in printed.splitlines():
        if "wgmma.mma_async instructions are serialized" in line:
            # "... serialized due to <reason> in the function '<name>'"
            reason, _, name = line.partition(" in the function ")
            report.setdefault(name.strip(" '.\""), {})["wgmma_serialized"] = \
                reason.split("serialized ", 1)[-1]
        elif "Function properties for" in line:
            kernel = line.split()[-1]
            report.setdefault(kernel, {})
        elif kernel and "spill stores" in line:
            stores, loads = (int(line.split(" bytes spill ")[i].split()[-1]) for i in (0, 1))
            report[kernel].update(spill_stores=stores, spill_loads=loads)
        elif kernel and "Used" in line and "registers" in line:
            report[kernel]["registers"] = int(line.split("Used")[1].split()[0])
    return report


PTXAS_REPORT = ".ptxas.txt"


def _nvcc_tool(purpose: str) -> str:
    tool = nvcc()
    if tool is None:
        raise KernelBuildError("nvcc not found: install the CUDA toolkit (or the "
                               f"nvidia-cuda-nvcc wheel) {purpose}")
    return tool


def _device_code(source: str, arch: str) -> Path:
    """`source` compiled for `arch` into a cubin (relocatable when it calls
    NVSHMEM), cached, with ptxas's report beside it (PTXAS_REPORT): the
    bundle's build and kernel_resources' check share one compile. Device
    code only, never `-c`: the host pass (cudafe++, g++) and the second cicc
    run for compute PTX that `-c` adds took 60% of an NVSHMEM build."""
    tool = _nvcc_tool("to build GPU kernels ahead of time")
    flags = _nvshmem_flags(source)          # raises when NVSHMEM is not installed
    return _cached_build(source, ".cu", tool,
                         [f"-arch={arch}", *NVCC_OPTIONS, *flags, "-cubin", "-Xptxas", "-v"],
                         ".cubin", depends=_device_library() if flags else (),
                         log_ext=PTXAS_REPORT)


def _device_library() -> tuple[str]:
    """NVSHMEM's device library as a build depends on it (its identity)."""
    return (_file_identity(nvshmem_home() / "lib" / "libnvshmem_device.a"),)


def build_cuda_cubin(source: str) -> Path:
    """Compiles CUDA kernels for sm_90a into a cubin the GPU engine loads;
    returns its cached path. Kernels calling NVSHMEM's device API are compiled
    relocatable and device-linked with libnvshmem_device into one cubin."""
    code = _device_code(source, CUDA_ARCH)
    if "#include <nvshmem.h>" not in source:
        return code
    return _cached_build(code.name, "", _nvcc_tool("to link NVSHMEM kernels"),
                         [f"-arch={CUDA_ARCH}", "-dlink", "-cubin",
                          f"-L{nvshmem_home() / 'lib'}", "-lnvshmem_device"],
                         ".cubin", inputs=(code,), depends=_device_library())


def _nvshmem_flags(source: str) -> list[str]:
    """nvcc flags for a source calling NVSHMEM's device API (relocatable
    device code against NVSHMEM's headers); none for other sources."""
    if "#include <nvshmem.h>" not in source:
        return []
    home = nvshmem_home()
    if home is None:
        raise KernelBuildError("these kernels call NVSHMEM: pip install nvidia-nvshmem-cu13 "
                               "(or set NVSHMEM_HOME to an NVSHMEM installation)")
    return ["-rdc=true", f"-I{home / 'include'}"]
