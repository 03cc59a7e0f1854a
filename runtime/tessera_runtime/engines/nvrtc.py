"""CUDA C++ to a cubin with NVRTC, for bundles built where nvcc was missing
(their kernels come as `kernels.cu` without `kernels.cubin`).

NVRTC is loaded with ctypes from the `nvidia-cuda-nvrtc` wheel (cu13:
`nvidia/cu13/lib`; cu12: `nvidia-cuda-nvrtc-cu12`, `nvidia/cuda_nvrtc/lib`),
CUDA_PATH or the system, so no Python binding is needed. It compiles for the
device's exact architecture, with the arch-specific features of sm_90a on
Hopper (wgmma, TMA), and needs no GPU: the tests compile the generated
kernels with it. Cubins are cached in TESSERA_CACHE_DIR by (source, arch,
NVRTC version, options).

NVRTC cannot device-link `libnvshmem_device`, so kernels calling NVSHMEM
need the bundle's nvcc-built cubin."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
from functools import lru_cache
from pathlib import Path

from . import EngineError, cache_dir

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
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(Path(os.environ[env]) / "lib64")
    dirs.append(Path("/usr/local/cuda/lib64"))
    return dirs


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """libnvrtc, or None where none is installed."""
    for d in _candidates():
        found = sorted(d.glob("libnvrtc.so.*")) if d.is_dir() else []
        found = [f for f in found if ".alt." not in f.name]
        if found:
            # libnvrtc opens its builtins library by name, which its own
            # directory may not be on the search path for: load it first.
            for builtins in sorted(d.glob("libnvrtc-builtins.so.*")):
                if ".alt." not in builtins.name:
                    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(str(found[-1]))
    name = ctypes.util.find_library("nvrtc")
    return ctypes.CDLL(name) if name else None


def version() -> str:
    lib = _require()
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


def _require() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise EngineError("this bundle has CUDA source but no cubin (it was built without "
                          "nvcc), and NVRTC is not installed to compile it: pip install "
                          "nvidia-cuda-nvrtc (cu13) or nvidia-cuda-nvrtc-cu12, or rebuild "
                          "the bundle where nvcc is installed")
    return lib


def compile_cubin(source: str, arch: str, name: str = "kernels.cu") -> Path:
    """`source` compiled by NVRTC for `arch` (e.g. "sm_90a"): the cached
    cubin's path. Raises EngineError with NVRTC's log when it fails."""
    if "#include <nvshmem.h>" in source:
        raise EngineError(f"{name} calls NVSHMEM, whose device library only nvcc links: "
                          "rebuild the bundle where nvcc is installed (it then carries "
                          "kernels.cubin)")
    lib = _require()
    options = (f"-arch={arch}", *OPTIONS)
    key = hashlib.sha256("\0".join([source, version(), *options]).encode()).hexdigest()[:24]
    target = cache_dir("nvrtc") / f"{key}.cubin"
    if target.exists():
        return target
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None):
        raise EngineError("NVRTC could not create a program")
    try:
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise EngineError(f"NVRTC {version()} failed on {name} for {arch} "
                              f"(status {status}):\n{log.value.decode(errors='replace')[-4000:]}")
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(cubin.raw)
    os.replace(partial, target)
    return target
