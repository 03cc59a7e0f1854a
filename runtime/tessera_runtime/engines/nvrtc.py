"""CUDA C++ to a cubin with NVRTC, for bundles built where nvcc was missing
(their kernels come as `kernels.cu` without `kernels.cubin`).

NVRTC is loaded with ctypes from the `nvidia-cuda-nvrtc` wheel (cu13:
`nvidia/cu13/lib`; cu12: `nvidia-cuda-nvrtc-cu12`, `nvidia/cuda_nvrtc/lib`),
CUDA_PATH or the system, so no Python binding is needed; the engine asks for
the one of its CUDA runtime's major version. It compiles for the
device's exact architecture, with the arch-specific features of sm_90a on
Hopper (wgmma, TMA), and needs no GPU: the tests compile the generated
kernels with it. Cubins are cached in TESSERA_CACHE_DIR by (source, arch,
the NVRTC library file, options).

NVRTC cannot device-link `libnvshmem_device`, so kernels calling NVSHMEM
need the bundle's nvcc-built cubin."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
from functools import lru_cache
from pathlib import Path

from .. import env
from ..env import cache_dir
from . import EngineError

OPTIONS = ("-std=c++17",)


def _candidates() -> list[Path]:
    """Directories that may hold libnvrtc, most specific first."""
    dirs = []
    try:
        import nvidia
        for root in nvidia.__path__:
            dirs += [Path(root) / "cu13" / "lib", Path(root) / "cuda_nvrtc" / "lib"]
    except ImportError:
        pass
    for name in ("CUDA_PATH", "CUDA_HOME"):
        if (path := env.get(name)):
            dirs.append(Path(path) / "lib64")
    dirs.append(Path("/usr/local/cuda/lib64"))
    return dirs


@lru_cache(maxsize=None)
def _load(cuda_major: int | None) -> tuple[ctypes.CDLL, Path] | None:
    for d in _candidates():
        pattern = f"libnvrtc.so.{cuda_major}*" if cuda_major else "libnvrtc.so.*"
        found = sorted(f for f in d.glob(pattern) if ".alt." not in f.name) if d.is_dir() else []
        if found:
            # libnvrtc opens its builtins library by name, which its own
            # directory may not be on the search path for: load it first.
            for builtins in sorted(d.glob("libnvrtc-builtins.so.*")):
                if ".alt." not in builtins.name:
                    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(str(found[-1])), found[-1]
    name = None if cuda_major else ctypes.util.find_library("nvrtc")
    return (ctypes.CDLL(name), Path(name)) if name else None


def library(cuda_major: int | None = None) -> ctypes.CDLL | None:
    """libnvrtc (of CUDA `cuda_major` when given: a cu12 and a cu13 wheel can
    both be installed, and a cubin must suit the driver and runtime in use),
    or None where none is installed."""
    loaded = _load(cuda_major)
    return loaded[0] if loaded else None


def _identity(cuda_major: int | None) -> str:
    """The loaded libnvrtc as it stands (path, size, mtime): nvrtcVersion says
    only major.minor, and a patch release must not reuse older cubins."""
    path = _load(cuda_major)[1]
    try:
        st = path.stat()
        return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:                     # a bare soname from find_library
        return str(path)


def version(cuda_major: int | None = None) -> str:
    lib = _require(cuda_major)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def arch_of(compute_capability: str) -> str:
    """The NVRTC architecture for a device of `compute_capability` (cupy's
    spelling: "90" for 9.0): sm_90a on Hopper, whose wgmma and TMA
    instructions exist only for the arch-specific target; the plain target
    elsewhere (generated kernels fall back to mma.sync where the sm_90a
    features are absent)."""
    return f"sm_{compute_capability}" + ("a" if compute_capability == "90" else "")


def _require(cuda_major: int | None = None) -> ctypes.CDLL:
    lib = library(cuda_major)
    if lib is None:
        wanted = f"CUDA {cuda_major}'s NVRTC" if cuda_major else "NVRTC"
        raise EngineError(f"this bundle has CUDA source but no cubin (it was built without "
                          f"nvcc), and {wanted} is not installed to compile it: pip install "
                          "nvidia-cuda-nvrtc (cu13) or nvidia-cuda-nvrtc-cu12, or rebuild "
                          "the bundle where nvcc is installed")
    return lib


def compile_cubin(source: str, arch: str, name: str = "kernels.cu",
                  cuda_major: int | None = None) -> Path:
    """`source` compiled by NVRTC (of CUDA `cuda_major` when given) for `arch`
    (e.g. "sm_90a"): the cached cubin's path. Raises EngineError with NVRTC's
    log when it fails."""
    if "#include <nvshmem.h>" in source:
        raise EngineError(f"{name} calls NVSHMEM, whose device library only nvcc links: "
                          "rebuild the bundle where nvcc is installed (it then carries "
                          "kernels.cubin)")
    lib = _require(cuda_major)
    options = (f"-arch={arch}", *OPTIONS)
    key = hashlib.sha256("\0".join([source, _identity(cuda_major), *options]).encode())
    target = cache_dir("nvrtc") / f"{key.hexdigest()[:24]}.cubin"
    if target.exists():
        return target

    def check(status: int, what: str) -> None:
        if status:
            raise EngineError(f"NVRTC {version(cuda_major)}: {what} failed on {name} for "
                              f"{arch} (status {status})")
    prog = ctypes.c_void_p()
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                                 None), "nvrtcCreateProgram")
    try:
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise EngineError(f"NVRTC {version(cuda_major)} failed on {name} for {arch} "
                              f"(status {status}):\n{log.value.decode(errors='replace')[-4000:]}")
        size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        if size.value == 0:
            raise EngineError(f"NVRTC made no cubin of {name} for {arch} (a virtual "
                              "architecture gives PTX only: name a real one, e.g. sm_90a)")
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(cubin.raw)
    os.replace(partial, target)
    return target
