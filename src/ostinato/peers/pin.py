"""The pinned peers (engine/peers.json): a source engine's commit, tree listing and build options, and the
wheels of the Python peers with their checksums."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ostinato.peers.source import Entry

PEERS_FILE = Path("engine") / "peers.json"


@dataclass(frozen=True)
class SourcePin:
    """A peer built from source: the commit, the sha256 of its listing, and how to build its server."""

    name: str
    repository: str
    snapshot: str
    commit: str
    tree: str
    n_files: int
    listing_sha256: str
    # files of the commit that a repository snapshot may lack (path -> "mode blob"); the build needs none of them
    absent_ok: dict[str, str] = field(default_factory=dict)
    generated: tuple[str, ...] = ()  # files the build writes into the tree (left out of the listing check)
    cmake_args: tuple[str, ...] = ()
    targets: tuple[str, ...] = ("llama-server",)

    def absent_entries(self) -> list[Entry]:
        """The allowed-absent files as listing entries."""
        entries = []
        for path, value in self.absent_ok.items():
            mode, blob = value.split()
            entries.append(Entry(mode, blob, path))
        return entries


@dataclass(frozen=True)
class WheelPin:
    """A downloaded wheel of a Python peer or of one of its requirements."""

    name: str
    version: str
    file: str
    sha256: str
    size: int
    role: str = ""  # why it is there: the peer itself, or which of its Requires-Dist it fills
    carry: bool = True  # small enough to carry to the GPU machine (64 MiB a call with the working tree)


@dataclass(frozen=True)
class PeersPin:
    """Everything engine/peers.json pins."""

    engines: dict[str, SourcePin]
    wheels: dict[str, list[WheelPin]]

    def engine(self, name: str) -> SourcePin:
        """The source pin of `name`; an unknown name is an error listing the known ones."""
        if name not in self.engines:
            raise ValueError(f"no pinned peer {name!r} in {PEERS_FILE}; known: {', '.join(sorted(self.engines))}")
        return self.engines[name]


def load_peers(path: Path) -> PeersPin:
    """Read engine/peers.json; a missing key is an error naming the file, the peer and the key."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != "ostinato-peers" or data.get("version") != 1:
        raise ValueError(f"{path}: expected format ostinato-peers version 1")
    engines = {}
    for name, e in data.get("engines", {}).items():
        try:
            engines[name] = SourcePin(
                name=name, repository=e["repository"], snapshot=e["snapshot"], commit=e["commit"], tree=e["tree"],
                n_files=int(e["n_files"]), listing_sha256=e["listing_sha256"],
                absent_ok=dict(e.get("absent_ok", {})), generated=tuple(e.get("generated", ())),
                cmake_args=tuple(e.get("cmake_args", ())), targets=tuple(e.get("targets", ("llama-server",))))
        except KeyError as exc:
            raise ValueError(f"{path}: engines.{name} has no key {exc.args[0]!r}") from None
    wheels = {}
    for peer, rows in data.get("wheels", {}).items():
        try:
            wheels[peer] = [WheelPin(name=w["name"], version=w["version"], file=w["file"], sha256=w["sha256"],
                                     size=int(w["size"]), role=w.get("role", ""), carry=bool(w.get("carry", True)))
                            for w in rows]
        except KeyError as exc:
            raise ValueError(f"{path}: wheels.{peer} has a row without {exc.args[0]!r}") from None
    return PeersPin(engines, wheels)
