"""Run git in the engine tree with a fixed identity, so commits need no user configuration."""

from __future__ import annotations

import subprocess
from pathlib import Path

_IDENTITY = ["-c", "user.name=ostinato-build", "-c", "user.email=build@ostinato.invalid",
             "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"]


def git(tree: Path, *args: str, check: bool = True) -> str:
    """Run `git args` in tree and return stdout; a failure raises with git's stderr."""
    proc = subprocess.run(["git", *_IDENTITY, *args], cwd=tree, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {tree}:\n{proc.stderr.strip()}")
    return proc.stdout
