"""The patch-queue workflow: a developer tree with one commit per patch, and export back to engine/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ostinato.engine.gitutil import git
from ostinato.engine.patches import STAGES, apply_stage, src_files
from ostinato.engine.pin import load_pin
from ostinato.engine.source import UPSTREAM_TAG, fetch_sdist, has_tree, unpack_tree


def _base_tag(stage: str) -> str:
    i = STAGES.index(stage)
    return UPSTREAM_TAG if i <= 1 else f"stage/{STAGES[i - 1]}"


def make_tree(repo: Path, dest: Path, stage: str, cache: Path, sdist: Path | None = None,
              base_tree: Path | None = None) -> Path:
    """Make a tree at dest with every stage up to `stage` applied, one commit per patch.

    The pinned tree comes from a clone of `base_tree` (an engine build's tree, whose first commit is
    tagged `upstream`) when given, else from the sdist. Earlier stages are tagged `stage/<name>`;
    HEAD is the branch `work` at the requested stage.
    """
    if stage == "upstream" or stage not in STAGES:
        raise ValueError(f"--stage must be one of {', '.join(STAGES[1:])}, got {stage!r}")
    engine = repo / "engine"
    pin = load_pin(engine / "pin.json")
    if dest.exists():
        raise FileExistsError(f"{dest} exists; remove it or choose another --dir")
    if base_tree is not None and has_tree(base_tree):
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(base_tree), str(dest)], check=True)
        git(dest, "checkout", "-q", "-b", "work", UPSTREAM_TAG)
    else:
        unpack_tree(fetch_sdist(pin, cache, sdist), pin, dest)
        git(dest, "checkout", "-q", "-b", "work")
    for s in STAGES[1 : STAGES.index(stage) + 1]:
        apply_stage(dest, engine, s)
        git(dest, "tag", "-f", f"stage/{s}")
    return dest


def export_tree(repo: Path, tree: Path, stage: str) -> list[Path]:
    """Write the commits of `stage` in tree as engine/patches/<stage>/*.patch and copy engine/src back.

    Files that live in engine/src are copied back from the tree and left out of the patches.
    """
    if stage == "upstream" or stage not in STAGES:
        raise ValueError(f"--stage must be one of {', '.join(STAGES[1:])}, got {stage!r}")
    engine = repo / "engine"
    if git(tree, "status", "--porcelain", "--untracked-files=no").strip():
        raise RuntimeError(f"{tree} has uncommitted changes: commit them first (git -C {tree} commit -a)")
    srcs = src_files(engine)
    for rel in srcs:
        if (tree / rel).exists():
            shutil.copyfile(tree / rel, engine / "src" / rel)
    out = engine / "patches" / stage
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    excludes = [f":(exclude){rel.as_posix()}" for rel in srcs]
    git(tree, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered",
        "-o", str(out), f"{_base_tag(stage)}..HEAD", "--", ".", *excludes)
    written = sorted(out.glob("*.patch"))
    # the commit that only adds engine/src becomes an empty patch: drop it
    for p in written:
        if "\ndiff --git " not in p.read_text(errors="replace"):
            p.unlink()
    return sorted(out.glob("*.patch"))
