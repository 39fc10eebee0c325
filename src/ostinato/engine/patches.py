"""The patch queue: engine/patches/<stage>/*.patch (git format-patch files) and engine/src/ (new files)."""

from __future__ import annotations

import filecmp
import hashlib
import shutil
from pathlib import Path

from ostinato.engine.gitutil import git

# Build stages in order; each variant is the tree after its stage. `upstream` is the pinned tree.
STAGES = ("upstream", "stock", "ostinato")


def stage_patches(engine_dir: Path, stage: str) -> list[Path]:
    """The patches that one stage adds (not those of earlier stages), in series order."""
    if stage not in STAGES:
        raise ValueError(f"unknown engine variant {stage!r}; expected one of {', '.join(STAGES)}")
    if stage == "upstream":
        return []
    return sorted((engine_dir / "patches" / stage).glob("*.patch"))


def src_files(engine_dir: Path) -> list[Path]:
    """Our new files under engine/src, relative to it (laid out as in the llama.cpp tree)."""
    root = engine_dir / "src"
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def stage_inputs(engine_dir: Path, stage: str) -> list[Path]:
    """Every file whose content defines the tree of a stage (its patches, those of earlier stages, engine/src)."""
    files = [engine_dir / "pin.json"]
    for s in STAGES[1 : STAGES.index(stage) + 1]:
        files += stage_patches(engine_dir, s)
    if stage != "upstream":
        files += [engine_dir / "src" / p for p in src_files(engine_dir)]
    return files


def fingerprint(paths: list[Path], extra: str = "") -> str:
    """A sha256 over names and contents of the given files and an extra string (build options)."""
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(str(p.name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def apply_stage(tree: Path, engine_dir: Path, stage: str) -> None:
    """Apply a stage's patches with `git am` on the current HEAD, then add engine/src as one commit (stock)."""
    for patch in stage_patches(engine_dir, stage):
        proc_ok = True
        try:
            git(tree, "am", "-q", "--keep-cr", "--whitespace=nowarn", str(patch.resolve()))
        except RuntimeError as exc:
            proc_ok = False
            git(tree, "am", "--abort", check=False)
            raise RuntimeError(f"{patch} does not apply on the {stage} stage:\n{exc}") from None
        assert proc_ok
    if stage == "stock":
        copy_src(tree, engine_dir)
        git(tree, "add", "-A")
        if git(tree, "status", "--porcelain").strip():
            git(tree, "commit", "-q", "--no-verify", "-m", "ostinato: add engine/src (new files)")


def copy_src(tree: Path, engine_dir: Path) -> None:
    """Copy engine/src into the tree, leaving files whose content is unchanged (and their mtimes) alone."""
    for rel in src_files(engine_dir):
        src, dst = engine_dir / "src" / rel, tree / rel
        if dst.exists() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
