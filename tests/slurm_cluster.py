"""A single-node SLURM for tests/test_slurm.py: the cluster that already answers `sinfo`, or munged, slurmctld and
slurmd started as root for this host with their state, logs and config in a temporary directory.

The started cluster is configless (slurmd fetches slurm.conf from slurmctld and links it at /run/slurm/conf, where
client commands look for it) because the executor's job step drops the `SLURM_*` variables, `SLURM_CONF` among
them, before its `srun`, so a config in the temporary directory named by `SLURM_CONF` would not reach it. Configless slurmd authenticates before it has
a config, so munged listens on libmunge's default socket. Whatever it creates under /run is removed on stop.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # the daemons live in sbin
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("munge", "unmunge", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")  # libmunge's default
CONF_LINK = Path("/run/slurm/conf")  # configless slurmd's link to its config cache; client commands read it
PARTITION = "ostinato"
START_TIMEOUT_S = 60


class ClusterUnavailable(Exception):
    """No cluster answers and none can be started here (the reason says why)."""


@dataclass
class Cluster:
    """How to reach the cluster and, for a started one, where SLURM records what ran."""

    env: dict[str, str]  # environment of client commands and snakemake
    version: str  # `sinfo -V`
    started: bool  # started here (False: a cluster that already answered)
    partition: str | None = None  # the started cluster's partition; None: the cluster's default
    node: str | None = None  # the started cluster's one node
    jobcomp: Path | None = None  # slurmctld's job completion log (jobcomp/filetxt) of a started cluster


def missing_tools() -> list[str]:
    """The SLURM and munge programs not installed here."""
    return [t for t in DAEMONS + CLIENTS if shutil.which(t, path=SEARCH_PATH) is None]


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 20,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run a client command with a bounded time; a hung command counts as failed (rc 124)."""
    try:
        return subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")


def answers(env: dict[str, str]) -> bool:
    """Whether a slurmctld answers `sinfo` with this environment."""
    return _run(["sinfo", "-h"], env, timeout=10).returncode == 0


def munge_works() -> bool:
    """Whether a munged answers on the default socket (a credential encodes and decodes)."""
    cred = _run(["munge", "-n"], timeout=10)
    return cred.returncode == 0 and _run(["unmunge"], timeout=10, stdin=cred.stdout).returncode == 0


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line() -> str:
    """This host's node definition as slurmd detects it (`slurmd -C`: name, CPUs, sockets, cores, memory)."""
    out = _run([shutil.which("slurmd", path=SEARCH_PATH) or "slurmd", "-C"])
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("NodeName=")), "")
    if out.returncode != 0 or not line:
        raise RuntimeError(f"`slurmd -C` did not describe this node: {out.stdout}{out.stderr}")
    return line


def node_name(line: str) -> str:
    """The node's name in its definition (`NodeName=<name> ...`)."""
    return line.split()[0].removeprefix("NodeName=")


def slurm_conf(root: Path, node: str, ctld_port: int, slurmd_port: int) -> str:
    """slurm.conf of a one-node cluster run by root, everything under `root`; completed jobs go to jobcomp.txt."""
    return "\n".join([
        "ClusterName=ostinato-test",
        f"SlurmctldHost={node_name(node)}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmctldParameters=enable_configless",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.log",
        "MailProg=/bin/true",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root}/jobcomp.txt",
        "MinJobAge=600",  # finished jobs stay visible to squeue, the executor's status command here
        "ReturnToService=2",
        "KillWait=5",
        f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=60 State=UP",
        "",
    ])


@dataclass
class _Started:
    """What this run started or created, so that stop() undoes exactly that."""

    root: Path
    env: dict[str, str]
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)  # directories under /run made here (removed if empty)

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        """Start a daemon in the foreground, its output in <root>/<name>.out."""
        with open(self.root / f"{name}.out", "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def logs(self) -> str:
        """The tail of every daemon's log, for failure messages."""
        parts = []
        for f in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel the cluster's jobs, shut the daemons down (kill what does not stop) and remove the /run entries."""
        if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            jobs = _run(["squeue", "-h", "-o", "%i"], self.env).stdout.split()
            if jobs:
                _run(["scancel", *jobs], self.env)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and _run(["squeue", "-h", "-o", "%i"], self.env).stdout.strip():
                    time.sleep(1)
            _run(["scontrol", "shutdown"], self.env)  # stops slurmctld and slurmd
        for name, proc in reversed(self.procs):  # slurmd, slurmctld, then munged
            _halt(proc, grace_s=0 if name == "munged" else 30)
        if CONF_LINK.is_symlink() and os.readlink(CONF_LINK).startswith(str(self.root)):
            CONF_LINK.unlink()
        for d in reversed(self.created):
            if d == MUNGE_SOCKET.parent:  # munged removes its socket on exit; a killed one may not
                for leftover in (MUNGE_SOCKET, MUNGE_SOCKET.with_name(f"{MUNGE_SOCKET.name}.lock")):
                    leftover.unlink(missing_ok=True)
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()


def _halt(proc: subprocess.Popen, grace_s: float) -> None:
    """Wait for a daemon to exit, then SIGTERM it, then SIGKILL its process group (it leads its own session)."""
    try:
        proc.wait(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        proc.wait(timeout=15)
        return
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=15)


def _wait_until(check, what: str, started: _Started) -> None:
    """Poll `check` until it holds or START_TIMEOUT_S pass (then fail with the daemons' logs)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        dead = [f"{n} exited with {p.returncode}" for n, p in started.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} while waiting for {what}\n{started.logs()}")
        time.sleep(0.5)
    raise RuntimeError(f"no {what} after {START_TIMEOUT_S} s\n{started.logs()}")


def _node_idle(env: dict[str, str]) -> bool:
    out = _run(["sinfo", "-h", "-N", "-o", "%T"], env, timeout=10)
    return out.returncode == 0 and out.stdout.split() == ["idle"]


def _make_dir(path: Path, started: _Started) -> None:
    """Create a directory under /run (mode 0755) and remember to remove it."""
    if not path.exists():
        path.mkdir(mode=0o755, parents=True)
        started.created.append(path)


def _start(root: Path) -> tuple[Cluster, _Started]:
    """Start munged (unless one answers), slurmctld and a configless slurmd for this host."""
    if CONF_LINK.is_symlink() and not CONF_LINK.exists():
        CONF_LINK.unlink()  # left by a run that was killed before it could clean up: its directory is gone
    if CONF_LINK.exists():
        raise ClusterUnavailable(f"{CONF_LINK} exists but no slurmctld answers: a configless slurmd of another "
                                 f"cluster is configured here; not starting a second one")
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    node = node_line()
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started = _Started(root, env)
    try:
        if not munge_works():
            _make_dir(MUNGE_SOCKET.parent, started)
            key = root / "munge.key"
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
            started.spawn("munged", [shutil.which("munged", path=SEARCH_PATH), "--foreground", "--force",
                                     f"--socket={MUNGE_SOCKET}", f"--key-file={key}", f"--pid-file={root}/munged.pid",
                                     f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"], env)
            _wait_until(munge_works, "munge credential", started)
        ctld_port = free_port()
        conf.write_text(slurm_conf(root, node, ctld_port, free_port()))
        started.spawn("slurmctld", [shutil.which("slurmctld", path=SEARCH_PATH), "-D", "-f", str(conf)], env)
        _wait_until(lambda: answers(env), "answer from slurmctld", started)
        _make_dir(CONF_LINK.parent, started)
        slurmd_env = {k: v for k, v in env.items() if k != "SLURM_CONF"}
        started.spawn("slurmd", [shutil.which("slurmd", path=SEARCH_PATH), "-D", "--conf-server",
                                 f"127.0.0.1:{ctld_port}"], slurmd_env)
        _wait_until(lambda: _node_idle(env), "idle node", started)
    except BaseException:
        started.stop()
        raise
    version = _run(["sinfo", "-V"], env).stdout.strip()
    return Cluster(env, version, True, PARTITION, node_name(node), root / "jobcomp.txt"), started


@contextmanager
def single_node_cluster(root: Path) -> Iterator[Cluster]:
    """The cluster that answers `sinfo`, else one started under `root` for the duration (as root only)."""
    env = dict(os.environ)
    if answers(env):
        yield Cluster(env, _run(["sinfo", "-V"], env).stdout.strip(), False)
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable("no SLURM cluster answers `sinfo` and starting slurmd needs root")
    cluster, started = _start(root)
    try:
        yield cluster
    finally:
        started.stop()
