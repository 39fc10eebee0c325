"""Get the pinned sdist with pip, verify its sha256, and unpack its llama.cpp tree as a git repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ostinato.atomic import sha256_file
from ostinato.engine.gitutil import git
from ostinato.engine.pin import EnginePin

UPSTREAM_TAG = "upstream"


def verify_sdist(path: Path, pin: EnginePin) -> None:
    """Raise if the sdist's sha256 is not the pinned one."""
    actual = sha256_file(path)
    if actual != pin.sha256:
        raise ValueError(f"{path}: sha256 {actual} does not match the pinned {pin.sha256} (engine/pin.json)")


def fetch_sdist(pin: EnginePin, cache_dir: Path, local: Path | None = None) -> Path:
    """Return the verified sdist in cache_dir, downloading it with pip (or copying `local`) if absent."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / pin.sdist
    if target.exists():
        verify_sdist(target, pin)
        return target
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        if local is not None:
            if not Path(local).is_file():
                raise FileNotFoundError(f"engine sdist {local} (config engine.sdist) does not exist")
            shutil.copyfile(local, Path(tmp) / pin.sdist)
        else:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--dest", tmp, f"{pin.package}=={pin.version}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pip could not download {pin.package}=={pin.version}:\n{proc.stderr[-2000:]}")
        got = Path(tmp) / pin.sdist
        if not got.exists():
            raise RuntimeError(f"pip did not produce {pin.sdist} in {tmp}")
        verify_sdist(got, pin)
        got.replace(target)
    return target


def _members(tar: tarfile.TarFile, prefix: str, strip: tuple[str, ...]):
    for m in tar.getmembers():
        if not m.name.startswith(prefix):
            continue
        rel = m.name[len(prefix):]
        top = rel.split("/", 1)[0]
        if not rel or top in strip or rel == ".git":
            continue
        m.name = rel
        yield m


def has_tree(dest: Path) -> bool:
    """The tree at dest was unpacked completely (its first commit is tagged `upstream`)."""
    return (dest / ".git").exists() and git(dest, "tag", "-l", UPSTREAM_TAG).strip() == UPSTREAM_TAG


def _commit_upstream(tmp: Path, pin: EnginePin) -> None:
    git(tmp, "init", "-q")
    git(tmp, "add", "-A")
    git(tmp, "commit", "-q", "--no-verify", "-m",
        f"llama.cpp b{pin.build_number} ({pin.short_commit}) from {pin.package} {pin.version}")
    git(tmp, "tag", UPSTREAM_TAG)


def pack_tree(tree: Path, out: Path) -> Path:
    """Write the upstream commit of an unpacked tree as a tar.gz (small enough to carry to a GPU machine)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    git(tree, "archive", "--format=tar.gz", "-o", str(tmp), UPSTREAM_TAG)
    tmp.replace(out)
    return out


def unpack_tarball(tarball: Path, pin: EnginePin, dest: Path) -> Path:
    """Unpack a tree written by pack_tree into dest as a git repo tagged `upstream` (no sdist needed)."""
    if has_tree(dest):
        return dest
    if not Path(tarball).is_file():
        raise FileNotFoundError(f"engine source tarball {tarball} does not exist (make it with `ostinato engine pack-source`)")
    tmp = dest.with_name(dest.name + ".tmp")
    for d in (dest, tmp):
        if d.exists():
            shutil.rmtree(d)
    tmp.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="tar")
    _commit_upstream(tmp, pin)
    tmp.rename(dest)
    return dest


def unpack_tree(sdist: Path, pin: EnginePin, dest: Path) -> Path:
    """Unpack the sdist's llama.cpp tree into dest as a git repo whose first commit is tagged `upstream`."""
    if has_tree(dest):
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, members=_members(tar, f"{top}/{pin.subdir}/", pin.strip), filter="tar")
    _commit_upstream(tmp, pin)
    tmp.rename(dest)
    return dest
