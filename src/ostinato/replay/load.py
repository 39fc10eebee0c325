"""What else loaded the machine while a replay ran: foreign CPU time and load average, and the foreign-load flag.

A sample reads the CPU time the whole machine spent busy since boot (user, nice, system, irq, softirq and steal time
of all CPUs, `psutil.cpu_times`), the CPU time of the replay's own processes (the client, its children, among them
a llama-server it started, and, for an engine reached by a local URL, the process listening on that port and its
children), and the 1-minute load average. Between two samples the *foreign* CPU time is the machine's busy time less
the replay's own: other processes, the kernel's interrupt work and, on a virtual machine, time the hypervisor gave to
other guests (steal). A session's foreign CPU share is its foreign CPU time over its wall time × the machine's
logical CPUs; above a threshold (`FOREIGN_LOAD_THRESHOLD`, `replay summarize --foreign-load-threshold`,
config `replay.foreign_load_threshold`) the session is flagged `foreign load`. Results without samples (made before
the replay recorded them) are `unknown`, never `clean`.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

import psutil

# A session whose other processes used more than this share of the machine's CPU time is flagged `foreign load`.
FOREIGN_LOAD_THRESHOLD = 0.10
CLEAN, FOREIGN, UNKNOWN = "clean", "foreign load", "unknown"
LOAD_FLAGS = (CLEAN, FOREIGN, UNKNOWN)


@dataclass(frozen=True)
class LoadSample:
    """One reading: monotonic time, the machine's busy CPU seconds, the replay's own CPU seconds (both since an
    arbitrary origin, only differences count) and the 1-minute load average."""

    t: float
    busy_cpu_s: float
    own_cpu_s: float
    loadavg_1m: float


def usage_between(start: LoadSample, end: LoadSample, cores: int) -> dict:
    """The load between two samples as a request record's `load` field: wall time, foreign and own CPU seconds, the
    machine's logical CPUs, and the larger of the two 1-minute load averages.

    Foreign CPU time = the machine's busy time less the replay's own, never below zero (CPU time is counted in
    clock ticks, so on a short interval the own time can exceed the busy time by a tick or two).
    """
    own = max(0.0, end.own_cpu_s - start.own_cpu_s)
    busy = max(0.0, end.busy_cpu_s - start.busy_cpu_s)
    return {"wall_s": max(0.0, end.t - start.t), "foreign_cpu_s": max(0.0, busy - own), "own_cpu_s": own,
            "cores": int(cores), "loadavg_1m": max(start.loadavg_1m, end.loadavg_1m)}


def foreign_share(foreign_cpu_s: float, wall_s: float, cores: float) -> float:
    """Other processes' CPU time as a share of the machine's CPU time over the interval (wall × cores); NaN when
    any input is missing or the interval is empty."""
    vals = [foreign_cpu_s, wall_s, cores]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vals) or wall_s <= 0 or cores <= 0:
        return float("nan")
    return float(foreign_cpu_s) / (float(wall_s) * float(cores))


def load_flag(share: float, threshold: float = FOREIGN_LOAD_THRESHOLD) -> str:
    """`foreign load` above the threshold, `clean` at or below it, `unknown` without a measured share."""
    if not 0 <= threshold <= 1:
        raise ValueError(f"the foreign-load threshold is a share of the machine's CPU time in [0, 1], got {threshold}")
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return UNKNOWN
    return FOREIGN if share > threshold else CLEAN


def _busy_cpu_s() -> float:
    """Seconds all CPUs spent busy since boot (guest time is already inside user time on Linux)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _tree_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process, its reaped children and its living descendants (vanished ones count 0)."""
    total = 0.0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            c = p.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system + c.children_user + c.children_system
    return total


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


def listening_pids(base_url: str) -> list[int]:
    """Processes of this machine listening on the port of a local URL (an engine reached by --server-url); none for
    another host or when the system does not say."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    if host not in _LOCAL_HOSTS | {socket.gethostname().lower()}:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return []
    return sorted({c.pid for c in conns if c.pid and c.status == psutil.CONN_LISTEN and c.laddr
                   and c.laddr.port == port and c.pid != os.getpid()})


class LoadProbe:
    """Samples this machine's load for a replay; `engine_pids` names engine processes that are not the client's
    children (an engine reached by a local URL)."""

    def __init__(self, engine_pids: Callable[[], list[int]] = list):
        self._me = psutil.Process()
        self._engine_pids = engine_pids
        self.cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1

    def own_cpu_s(self) -> float:
        """CPU seconds of the client's process tree and of the engine's processes outside it."""
        total = _tree_cpu_s(self._me)
        mine = {self._me.pid}
        try:
            mine |= {p.pid for p in self._me.children(recursive=True)}
        except psutil.Error:
            pass
        for pid in self._engine_pids():
            if pid in mine:
                continue
            try:
                total += _tree_cpu_s(psutil.Process(pid))
            except psutil.Error:
                continue
        return total

    def sample(self) -> LoadSample:
        """One reading now."""
        return LoadSample(t=time.monotonic(), busy_cpu_s=_busy_cpu_s(), own_cpu_s=self.own_cpu_s(),
                          loadavg_1m=os.getloadavg()[0])


def probe_for(server: object) -> LoadProbe:
    """The probe of a replay against `server`: a llama-server the replay started is the client's child; an engine
    reached by a local URL is found, at each sample, by the port it listens on (so a restarted engine is found too)."""
    if hasattr(server, "proc"):
        return LoadProbe()
    url = str(getattr(server, "base_url", ""))
    return LoadProbe(lambda: listening_pids(url) if url else [])
