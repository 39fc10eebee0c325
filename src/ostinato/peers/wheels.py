"""The pinned wheels of a Python peer: download them with pip (no dependencies resolved) and check each file's
name, size and sha256 against engine/peers.json, for carrying to the GPU machine."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from ostinato.atomic import sha256_file
from ostinato.peers.pin import PEERS_FILE, WheelPin

# the GPU machine's Python and the manylinux tags its pip accepts (pip matches each tag exactly)
PYTHON_VERSION = "3.12"
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")


def download_cmd(spec: str, dest: str | Path) -> list[str]:
    """`pip download` of one distribution (`name==version`) as a wheel for the GPU machine's Python into `dest`, no
    dependencies resolved."""
    tags = [a for plat in PLATFORMS for a in ("--platform", plat)]
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", PYTHON_VERSION, "--implementation", "cp", *tags, "-d", str(dest), spec]


def check_wheel(path: Path, wheel: WheelPin) -> str:
    """Why `path` is not the pinned wheel, or "" when its size and sha256 match."""
    if not path.is_file():
        return f"{path} is missing"
    if path.stat().st_size != wheel.size:
        return f"{path} has {path.stat().st_size} bytes, {PEERS_FILE} pins {wheel.size}"
    digest = sha256_file(path)
    if digest != wheel.sha256:
        return f"{path} has sha256 {digest}, {PEERS_FILE} pins {wheel.sha256}"
    return ""


def fetch_wheels(wheels: list[WheelPin], dest: Path, progress=print) -> list[Path]:
    """Download each wheel not yet in `dest` as pinned (name==version, binary only, no dependencies) and check it;
    a wheel pip names differently or whose checksum differs is an error naming it."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for w in wheels:
        target = dest / w.file
        if check_wheel(target, w):
            with tempfile.TemporaryDirectory(prefix="ostinato-wheel-") as tmp:
                proc = subprocess.run(download_cmd(f"{w.name}=={w.version}", tmp), capture_output=True, text=True)
                got = sorted(Path(tmp).glob("*.whl"))
                if proc.returncode != 0 or not got:
                    raise RuntimeError(f"pip download {w.name}=={w.version} failed: {proc.stderr.strip()[-800:]}")
                if got[0].name != w.file:
                    raise RuntimeError(f"pip download {w.name}=={w.version} gave {got[0].name}, {PEERS_FILE} pins "
                                       f"{w.file}")
                got[0].replace(target)
            progress(f"[peers] downloaded {w.file}")
        problem = check_wheel(target, w)
        if problem:
            raise RuntimeError(problem)
        paths.append(target)
    return paths
