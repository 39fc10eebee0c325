"""Machine description (CPU, cores, memory, GPUs, OS) kept with every measured result."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

_GPU_FIELDS = ("name", "driver_version", "memory.total", "pcie.link.gen.max", "pcie.link.width.max", "uuid")


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as nvidia-smi reports it."""

    name: str
    driver_version: str
    memory_total_mib: int | None
    pcie_gen: str
    pcie_width: str
    uuid: str = ""  # the physical card: two replays with the same uuid ran on the same GPU


@dataclass(frozen=True)
class Machine:
    """What a result was measured on; `label` is the short name used in plot series."""

    label: str
    hostname: str
    cpu_model: str
    logical_cores: int
    physical_cores: int | None
    memory_total_gib: float | None
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    os: str = ""
    kernel: str = ""
    python: str = ""
    boot_id: str = ""  # this boot of this machine: replays with the same boot_id ran on one machine, unrestarted

    def to_json(self) -> dict:
        """Return the description as a JSON-ready dict."""
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        return d


def _cpuinfo() -> tuple[str, int | None]:
    """Return the CPU model name and the physical core count from /proc/cpuinfo (Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), None
    models = re.findall(r"^model name\s*:\s*(.+)$", text, flags=re.M)
    cores = set()
    for block in text.split("\n\n"):
        fields = dict(re.findall(r"^(physical id|core id)\s*:\s*(\d+)", block, flags=re.M))
        if len(fields) == 2:
            cores.add((fields["physical id"], fields["core id"]))
    return (models[0].strip() if models else platform.machine()), (len(cores) or None)


def _memory_gib() -> float | None:
    """Return total memory in GiB from /proc/meminfo (Linux)."""
    try:
        m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), flags=re.M)
    except OSError:
        return None
    return round(int(m.group(1)) / 2**20, 1) if m else None


def _gpus() -> tuple[Gpu, ...]:
    """Return the GPUs that nvidia-smi lists (none when it is absent or fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(_GPU_FIELDS):
            continue
        mem = int(parts[2]) if parts[2].isdigit() else None
        gpus.append(Gpu(parts[0], parts[1], mem, parts[3], parts[4], parts[5]))
    return tuple(gpus)


def _boot_id() -> str:
    """Return this boot's random id (Linux; "" elsewhere): machines lent one after another may share a hostname and a
    kernel, not a boot id."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def default_label(cpu_model: str, cores: int, gpus: tuple[Gpu, ...]) -> str:
    """Return a short machine label such as `h200` or `cpu-2c` for plot series."""
    if gpus:
        name = re.sub(r"^NVIDIA\s+", "", gpus[0].name).split()[0].lower()
        return f"{len(gpus)}x{name}" if len(gpus) > 1 else name
    return f"cpu-{cores}c"


def describe_machine(label: str | None = None) -> Machine:
    """Probe this machine; `label` overrides the default short label."""
    cpu_model, physical = _cpuinfo()
    logical = os.cpu_count() or 1
    gpus = _gpus()
    return Machine(
        label=label or default_label(cpu_model, logical, gpus),
        hostname=socket.gethostname(),
        cpu_model=cpu_model,
        logical_cores=logical,
        physical_cores=physical,
        memory_total_gib=_memory_gib(),
        gpus=gpus,
        os=platform.platform(),
        kernel=platform.release(),
        python=platform.python_version(),
        boot_id=_boot_id(),
    )
