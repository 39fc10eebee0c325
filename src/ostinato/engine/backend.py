"""Choose and configure the engine's backend: CUDA when a GPU and a CUDA toolkit are present, CPU otherwise."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

BACKENDS = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    """A resolved backend and the CMake options it needs."""

    name: str  # "cpu" or "cuda"
    cmake_args: tuple[str, ...] = ()
    reason: str = ""
    env: dict[str, str] = field(default_factory=dict)


def gpu_compute_caps() -> list[str]:
    """Compute capabilities of the visible NVIDIA GPUs ("90" for an H200), empty without a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip().replace(".", "") for line in out.stdout.splitlines() if line.strip()]


def cuda_toolkit() -> Path | None:
    """The CUDA toolkit root holding nvcc, or None."""
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    for cand in ([Path(nvcc)] if nvcc else []) + [Path("/usr/local/cuda/bin/nvcc")]:
        if cand.exists():
            return cand.resolve().parent.parent
    return None


def cublas_from_wheel() -> Path | None:
    """libcublas from the `nvidia-cublas` wheel, for toolkits that ship without it."""
    for mod in ("nvidia.cublas", "nvidia.cu13", "nvidia"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ModuleNotFoundError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in spec.submodule_search_locations:
            hits = sorted(Path(root).rglob("libcublas.so*"))
            if hits:
                return hits[0]
    return None


def resolve_backend(requested: str, cuda_arch: str | None = None) -> Backend:
    """Turn the config's backend (auto|cpu|cuda) into a Backend; `cuda` without a toolkit is an error."""
    if requested not in BACKENDS:
        raise ValueError(f"engine.backend is {requested!r}; expected one of {', '.join(BACKENDS)}")
    caps = gpu_compute_caps()
    toolkit = cuda_toolkit()
    if requested == "cpu" or (requested == "auto" and not (caps and toolkit)):
        why = "forced by engine.backend" if requested == "cpu" else (
            "no NVIDIA GPU visible" if not caps else "no CUDA toolkit (nvcc) found")
        return Backend("cpu", ("-DGGML_CUDA=OFF",), why)
    if toolkit is None:
        raise RuntimeError("engine.backend is cuda but no CUDA toolkit was found (nvcc on PATH or CUDACXX)")
    arch = cuda_arch or (";".join(sorted(set(caps))) if caps else "native")
    args = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
            f"-DCMAKE_CUDA_COMPILER={toolkit / 'bin' / 'nvcc'}"]
    if not any((toolkit / d).glob("libcublas.so*") for d in ("lib64", "lib", "targets/x86_64-linux/lib")):
        lib = cublas_from_wheel()
        if lib is None:
            raise RuntimeError(f"the CUDA toolkit at {toolkit} has no cuBLAS: install the wheel into this environment "
                               f"(`python -m pip install nvidia-cublas`) and build again")
        args += [f"-DCUDA_cublas_LIBRARY={lib}", "-DGGML_CUDA_NO_VMM=ON"]
    return Backend("cuda", tuple(args), f"GPU compute capability {arch}, toolkit {toolkit}")
