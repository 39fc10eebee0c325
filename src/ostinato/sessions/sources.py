"""Where each trace source comes from: canonical URL, a local mirror, or the committed per-turn table.

`resolve_source` decides once (rule `get_traces`) and writes a small JSON manifest that
`ostinato sessions build --traces` reads: mode `mirror` (text at hand: tokenized ids) or `tables`
(numbers only: ids synthesized from counts). No reachable source and no table is an error naming
the source and saying how to set the mirror.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ostinato.atomic import atomic_open


@dataclass(frozen=True)
class SourceInfo:
    """A public trace source: canonical URL, upstream repository/commit/paths, license, committed table name."""

    name: str
    url: str
    repository: str
    commit: str
    paths: str
    license: str
    table: str  # file name under data/sessions


SOURCE_INFO: dict[str, SourceInfo] = {
    "swe-mini": SourceInfo(
        "swe-mini", "https://github.com/gruckion/mini-swe-agent", "github.com/gruckion/mini-swe-agent",
        "d12a71affd95403b036b2bdbd827349b77bfffb9",
        "swebench_results/20251118_gemini-3-pro-74pct/trajs/*/*.traj.json", "MIT", "swe-mini.turns.csv"),
    "tau2": SourceInfo(
        "tau2", "https://github.com/sierra-research/tau2-bench", "github.com/sierra-research/tau2-bench",
        "a2c024725189473d2d7cea3a5cfdbcc67478e41f",
        "web/leaderboard/public/submissions/*/trajectories/*.json, data/simulations/… (recovered from history)",
        "MIT", "tau2.turns.csv"),
    "swe-rebench": SourceInfo(
        "swe-rebench", "https://huggingface.co/datasets/nebius/SWE-rebench-openhands-trajectories",
        "huggingface.co/datasets/nebius/SWE-rebench-openhands-trajectories", "", "rows (trajectory)",
        "CC BY 4.0", "swe-rebench.turns.csv"),
}


def source_info(name: str) -> SourceInfo:
    """The registry entry of a source; ValueError lists the known ones."""
    if name not in SOURCE_INFO:
        raise ValueError(f"source {name!r} is not one of {sorted(SOURCE_INFO)}")
    return SOURCE_INFO[name]


def mirror_dir(mirror: Path | None, source: str) -> Path | None:
    """The source's folder in a mirror root (or the mirror itself if it is that folder), when it has files."""
    if mirror is None or not str(mirror):
        return None
    mirror = Path(mirror)
    cand = mirror / source if (mirror / source).is_dir() else mirror
    if cand.is_dir() and (cand.name == source or cand == mirror / source) and any(cand.iterdir()):
        return cand
    return None


def probe_url(url: str, timeout_s: float = 5.0) -> str | None:
    """Return None if the URL answers, else a one-line reason (no network here is the usual reason)."""
    try:
        import httpx

        r = httpx.head(url, timeout=timeout_s, follow_redirects=True)
        return None if r.status_code < 400 else f"HTTP {r.status_code}"
    except Exception as exc:  # noqa: BLE001 - any failure is "unreachable", reported as text
        return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Resolved:
    """What `build_sessions` reads for one source: a mirror folder or a committed per-turn table."""

    source: str
    mode: str  # "mirror" | "tables"
    path: str
    url: str
    note: str


def resolve_source(source: str, mirror: Path | None, url: str | None, table: Path | None,
                   probe: bool = True) -> Resolved:
    """Mirror if present; else the canonical URL (not downloaded here: a reachable URL is reported with how to
    mirror it); else the committed table; else an error naming the source and the mirror setting."""
    info = source_info(source)
    url = url or info.url
    found = mirror_dir(mirror, source)
    if found is not None:
        return Resolved(source, "mirror", str(found), url, "traces read from the local mirror")
    reason = probe_url(url) if probe else "not probed"
    if table is not None and Path(table).is_file():
        note = f"mirror {mirror}/{source} missing; {url}: {reason or 'reachable but not mirrored'}; using the committed per-turn table"
        return Resolved(source, "tables", str(table), url, note)
    how = (f"set `sessions.mirror` in the config (or `--mirror`) to a directory holding {source}/ "
           f"(a copy of {info.repository}{'@' + info.commit if info.commit else ''}: {info.paths})")
    if reason is None:
        raise FileNotFoundError(f"source {source}: {url} is reachable but this artifact does not download it; {how}")
    raise FileNotFoundError(f"source {source}: no local mirror at {mirror}/{source} and {url} is unreachable "
                            f"({reason}); no per-turn table {table} either; {how}")


def write_manifest(resolved: Resolved, path: Path) -> None:
    """Write the manifest of one resolved source (JSON) atomically."""
    with atomic_open(path) as fh:
        json.dump(asdict(resolved), fh, indent=1)
        fh.write("\n")


def read_manifest(path: Path) -> Resolved:
    """Read a manifest written by `write_manifest`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("mode") not in ("mirror", "tables"):
        raise ValueError(f"{path}: not a traces manifest (mode {data.get('mode')!r})")
    return Resolved(**data)
