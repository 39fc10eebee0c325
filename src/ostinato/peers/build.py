"""Build a source peer's server from its pinned commit: check the source, export it to OUT/tree, configure and
build the server target with CMake in OUT/cmake, install OUT/bin/<target> and write OUT/manifest.json."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ostinato.atomic import atomic_open, sha256_file
from ostinato.engine.backend import Backend
from ostinato.peers.pin import PEERS_FILE, SourcePin
from ostinato.peers.source import (Entry, compare_listings, dir_listing, export_commit, git_head, git_listing,
                                   git_tree_id, is_git_repo, listing_sha256, missing_blobs)


@dataclass
class PeerBuildRequest:
    """What to build: which pinned peer, from which source, into which directory, for which backend."""

    pin: SourcePin
    src: Path       # a git repository (bare or a work tree) holding the pinned commit, or a plain copy of its files
    out: Path       # e.g. build/peers/ik_llama.cpp/cpu
    backend: Backend
    jobs: int = 2


@dataclass
class PeerManifest:
    """What a peer's binaries were built from; OUT/manifest.json."""

    peer: str
    repository: str
    commit: str
    tree: str
    listing_sha256: str
    source: str
    source_kind: str                      # "git" or "dir"
    absent: list[str]                     # pinned files the source lacked (allowed by the pin's absent_ok)
    backend: str
    backend_reason: str
    cmake_args: list[str]
    targets: list[str]
    binaries: dict[str, str] = field(default_factory=dict)  # installed file -> sha256
    version_output: str = ""              # `<target> --version` of the installed server
    build_seconds: float = 0.0
    built_at: str = ""


@dataclass(frozen=True)
class CheckedSource:
    """A source that matches its pin: its kind, its files and the pinned files it lacks."""

    kind: str
    entries: list[Entry]
    absent: list[str]


def _pinned_sha(pin: SourcePin, found: list[Entry]) -> str:
    """The listing sha256 of a directory's files, with the pin's allowed-absent files counted where missing."""
    have = {e.path for e in found}
    return listing_sha256(found + [e for e in pin.absent_entries() if e.path not in have])


def check_source(pin: SourcePin, src: Path) -> CheckedSource:
    """Check that `src` is the pinned commit (a git repository at it) or a plain copy of its files; raise naming
    the flag, the path and the pin otherwise."""
    where = f"{PEERS_FILE} engines.{pin.name}"
    if not src.is_dir():
        raise FileNotFoundError(f"--src {src}: not a directory (expected a clone of {pin.repository} at {pin.commit})")
    if is_git_repo(src):
        head = git_head(src)
        if head != pin.commit:
            raise ValueError(f"--src {src} is at commit {head}, but {where} pins commit {pin.commit}; "
                             f"check that commit out first")
        if git_tree_id(src, head) != pin.tree:
            raise ValueError(f"--src {src}: commit {head} has tree {git_tree_id(src, head)}, {where} pins {pin.tree}")
        entries = git_listing(src, head)
        if listing_sha256(entries) != pin.listing_sha256:
            raise ValueError(f"--src {src}: the listing of {head} does not hash to {where}.listing_sha256")
        absent = missing_blobs(src, entries)
        unexpected = sorted(set(absent) - set(pin.absent_ok))
        if unexpected:
            raise RuntimeError(f"--src {src}: the repository lacks the contents of {len(unexpected)} file(s) that "
                               f"{where}.absent_ok does not allow, e.g. {unexpected[0]}; fetch the repository again")
        return CheckedSource("git", entries, absent)
    found = dir_listing(src, set(pin.generated))
    if _pinned_sha(pin, found) != pin.listing_sha256:
        n = len(found)
        raise ValueError(f"--src {src}: its {n} files do not match the {pin.n_files} files of {pin.commit} "
                         f"({where}.listing_sha256); give a git repository at that commit or an unmodified copy")
    have = {e.path for e in found}
    return CheckedSource("dir", found, sorted(p for p in pin.absent_ok if p not in have))


def tree_matches(pin: SourcePin, tree: Path) -> bool:
    """True if an exported tree still holds exactly the pinned files (build-generated files aside)."""
    return tree.is_dir() and _pinned_sha(pin, dir_listing(tree, set(pin.generated))) == pin.listing_sha256


def prepare_tree(pin: SourcePin, src: Path, checked: CheckedSource, tree: Path) -> None:
    """Make `tree` a plain copy of the pinned files (kept when it already is one, so rebuilds stay incremental)."""
    if tree_matches(pin, tree):
        return
    if tree.exists():
        shutil.rmtree(tree)
    tmp = tree.with_name(tree.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if checked.kind == "git":
        export_commit(src, checked.entries, tmp, set(checked.absent))
    else:
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    diffs = compare_listings(checked.entries, dir_listing(tmp, set(pin.generated)), set(checked.absent))
    if diffs:
        raise RuntimeError(f"the exported tree {tmp} differs from the pin: {'; '.join(diffs[:5])}")
    tmp.rename(tree)


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:2])} failed with exit code {proc.returncode} (full log: {log}):\n{tail}")


def cmake_args(pin: SourcePin, backend: Backend) -> list[str]:
    """The pin's CMake options, then the backend's (GGML_CUDA and, for CUDA, the architectures and compiler)."""
    return list(pin.cmake_args) + list(backend.cmake_args)


def _version(binary: Path) -> str:
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(--version failed: {exc})"
    return (proc.stdout + proc.stderr).strip()[-500:]


def build_peer(req: PeerBuildRequest, progress=print) -> PeerManifest:
    """Check the source, export it, build the pin's targets and write the manifest (holding OUT/.lock)."""
    out = req.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(req, out, progress)


def _build_locked(req: PeerBuildRequest, out: Path, progress) -> PeerManifest:
    pin, t0 = req.pin, time.monotonic()
    checked = check_source(pin, req.src)
    progress(f"[peers] {pin.name}: --src {req.src} is {pin.commit[:12]} ({checked.kind}, {len(checked.entries)} files"
             f"{', ' + str(len(checked.absent)) + ' allowed absent' if checked.absent else ''})")
    tree, bdir, log = out / "tree", out / "cmake", out / "build.log"
    prepare_tree(pin, req.src, checked, tree)
    args = cmake_args(pin, req.backend)
    # the tree has no .git: keep the build-info step's git from finding an enclosing repository (this project's)
    env = {**os.environ, **req.backend.env, "GIT_CEILING_DIRECTORIES": str(out)}
    args_file = bdir / "ostinato-cmake-args.json"
    if not (bdir / "CMakeCache.txt").exists() or not args_file.exists() or json.loads(args_file.read_text()) != args:
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        progress(f"[peers] {pin.name}: configuring ({req.backend.name})")
        _run(["cmake", "-S", str(tree), "-B", str(bdir), *gen, *args], log, env)
        args_file.write_text(json.dumps(args))
    progress(f"[peers] {pin.name}: building {', '.join(pin.targets)} with {req.jobs} jobs (log: {log})")
    _run(["cmake", "--build", str(bdir), "-j", str(req.jobs), "--target", *pin.targets], log, env)
    bin_dir = out / "bin"
    bin_dir.mkdir(exist_ok=True)
    binaries = {}
    for target in pin.targets:
        built = bdir / "bin" / target
        if not built.is_file():
            raise RuntimeError(f"the build reported success but {built} is missing (full log: {log})")
        shutil.copy2(built, bin_dir / target)
        binaries[f"bin/{target}"] = sha256_file(bin_dir / target)
    manifest = PeerManifest(
        peer=pin.name, repository=pin.repository, commit=pin.commit, tree=pin.tree,
        listing_sha256=pin.listing_sha256, source=str(req.src), source_kind=checked.kind, absent=checked.absent,
        backend=req.backend.name, backend_reason=req.backend.reason, cmake_args=args, targets=list(pin.targets),
        binaries=binaries, version_output=_version(bin_dir / pin.targets[0]),
        build_seconds=round(time.monotonic() - t0, 1), built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    with atomic_open(out / "manifest.json") as fh:
        fh.write(json.dumps(asdict(manifest), indent=2) + "\n")
    progress(f"[peers] {pin.name}: {bin_dir} ({manifest.build_seconds:.0f} s)")
    return manifest
