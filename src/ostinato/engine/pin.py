"""The pinned llama.cpp source (engine/pin.json): which sdist, its checksum, build number and commit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnginePin:
    """Where the pinned llama.cpp tree comes from and how it identifies itself."""

    package: str
    version: str
    sdist: str
    sha256: str
    subdir: str
    build_number: int
    commit: str
    git_url: str
    strip: tuple[str, ...]

    @property
    def short_commit(self) -> str:
        return self.commit[:7]


def load_pin(path: Path) -> EnginePin:
    """Read engine/pin.json; a missing key is an error naming the file and the key."""
    data = json.loads(Path(path).read_text())
    try:
        return EnginePin(
            package=data["package"],
            version=data["version"],
            sdist=data["sdist"],
            sha256=data["sha256"].lower(),
            subdir=data["subdir"],
            build_number=int(data["build_number"]),
            commit=data["commit"],
            git_url=data["git_url"],
            strip=tuple(data.get("strip", ())),
        )
    except KeyError as exc:
        raise ValueError(f"{path}: missing key {exc.args[0]!r}") from None
