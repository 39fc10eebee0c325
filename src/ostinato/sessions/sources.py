"""Where each trace source comes from: canonical URL, a local mirror, or the committed per-turn table.

`resolve_source` decides once (rule `get_traces`) and writes a small JSON manifest that
`ostinato sessions build --traces` reads: mode `mirror` (text at hand: tokenized ids), `download`
(the source fetched into a cache folder, read like a mirror) or `tables` (numbers only: ids synthesized
from counts). No reachable source and no table is an error naming the source and saying how to set the mirror.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.sessions.download import ChecksumError, DownloadError, Fetched, Request, cached, fetch, github_archive_url

DEFAULT_CACHE = Path("results/sessions/mirror")


@dataclass(frozen=True)
class SourceInfo:
    """A public trace source: canonical URL, upstream repository/commit/paths, license, committed table name,
    and what a download extracts (globs below the archive's top folder; empty: the URL is one rows file)."""

    name: str
    url: str
    repository: str
    commit: str
    paths: str
    license: str
    table: str  # file name under data/sessions
    members: tuple[str, ...] = ()
    basename: bool = False  # cache file name = the file's own name (else wildcard parts joined by `__`)

    def download_url(self) -> str | None:
        """Default download URL: the GitHub archive at the pinned commit (None for a source without one)."""
        return github_archive_url(self.repository, self.commit) if self.members and self.commit else None


SOURCE_INFO: dict[str, SourceInfo] = {
    "swe-mini": SourceInfo(
        "swe-mini", "https://github.com/gruckion/mini-swe-agent", "github.com/gruckion/mini-swe-agent",
        "d12a71affd95403b036b2bdbd827349b77bfffb9",
        "swebench_results/20251118_gemini-3-pro-74pct/trajs/*/*.traj.json", "MIT", "swe-mini.turns.csv",
        ("swebench_results/20251118_gemini-3-pro-74pct/trajs/*/*.traj.json",), basename=True),
    "tau2": SourceInfo(
        "tau2", "https://github.com/sierra-research/tau2-bench", "github.com/sierra-research/tau2-bench",
        "a2c024725189473d2d7cea3a5cfdbcc67478e41f",
        "web/leaderboard/public/submissions/*/trajectories/*.json, data/simulations/… (recovered from history)",
        "MIT", "tau2.turns.csv",
        ("web/leaderboard/public/submissions/*/trajectories/*.json", "data/simulations/*.json")),
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
    """What `build_sessions` reads for one source: a mirror or download cache folder, or a committed table."""

    source: str
    mode: str  # "mirror" | "download" | "tables"
    path: str
    url: str
    note: str
    sha256: str = ""  # of the downloaded file (mode download)


@dataclass(frozen=True)
class Download:
    """How `resolve_source` may download: allowed or not, cache root, URL override, sha256, globs, progress bar."""

    allowed: bool = False
    cache: Path = DEFAULT_CACHE
    url: str | None = None
    sha256: str | None = None
    members: tuple[str, ...] = ()
    progress: bool = True


def download_request(info: SourceInfo, dl: Download) -> Request | None:
    """The fetch request of a source (URL override, else the registry's archive URL); None without a URL."""
    url = dl.url or info.download_url()
    if not url:
        return None
    members = dl.members or (() if dl.url and not _is_archive(dl.url) else info.members)
    return Request(info.name, url, dl.sha256 or None, members, info.basename)


def _is_archive(url: str) -> bool:
    """Whether a URL names a `.tar.gz` (else, for an override URL, it is one rows file)."""
    path = url.split("?", 1)[0]
    return path.endswith((".tar.gz", ".tgz")) or "/tar.gz/" in path


def _from_fetch(got: Fetched) -> Resolved:
    """The manifest entry of a downloaded (or reused) cache folder."""
    verb = "reused the download cache of" if got.reused else "downloaded"
    files = f"{got.files} file{'' if got.files == 1 else 's'}"
    return Resolved(got.source, "download", got.path, got.url, f"{verb} {got.url} ({files})", got.sha256)


def _try_download(info: SourceInfo, url: str, dl: Download, probe: bool) -> Resolved | str:
    """Reuse a complete cache, else download when allowed; the Resolved, or why not (one line)."""
    req = download_request(info, dl)
    hit = cached(dl.cache, info.name, req.url if req else None, dl.sha256)
    if hit is not None:
        return _from_fetch(hit)
    if not probe:
        return "not probed"
    if not dl.allowed:
        reason = probe_url(url)
        return reason or "reachable but this artifact does not download it: downloads are off (`--no-download`, " \
                         "`sessions.download: false`)"
    if req is None:
        return (f"{probe_url(url) or 'reachable'}; no download URL for {info.name} (give `--download-url` or "
                f"`sessions.download_urls.{info.name}`: an http(s) or file:// URL of a JSONL export of its rows)")
    try:
        return _from_fetch(fetch(req, dl.cache, progress=dl.progress))
    except ChecksumError as exc:
        raise ChecksumError(f"source {info.name}: {exc}") from exc
    except DownloadError as exc:
        return f"download failed: {str(exc).removeprefix(req.url + ': ')}"


def resolve_source(source: str, mirror: Path | None, url: str | None, table: Path | None,
                   probe: bool = True, download: Download | None = None) -> Resolved:
    """Mirror if present; else a complete download cache; else the download (when allowed and probing); else the
    committed table; else an error naming the source, the URL's failure and the mirror setting."""
    info = source_info(source)
    url = url or info.url
    dl = download or Download()
    found = mirror_dir(mirror, source)
    if found is not None:
        return Resolved(source, "mirror", str(found), url, "traces read from the local mirror")
    got = _try_download(info, url, dl, probe)
    if isinstance(got, Resolved):
        return got
    failed = dl.url or info.download_url() or url if dl.allowed and probe else url
    if table is not None and Path(table).is_file():
        note = f"mirror {mirror}/{source} missing; {failed}: {got}; using the committed per-turn table"
        return Resolved(source, "tables", str(table), url, note)
    how = (f"set `sessions.mirror` in the config (or `--mirror`) to a directory holding {source}/ "
           f"(a copy of {info.repository}{'@' + info.commit if info.commit else ''}: {info.paths})")
    if got.startswith("reachable but"):
        raise FileNotFoundError(f"source {source}: {url} is {got}; {how}")
    raise FileNotFoundError(f"source {source}: no local mirror at {mirror}/{source} and {failed} is unreachable "
                            f"({got}); {f'no per-turn table {table}' if table else 'no per-turn table'} either; {how}")


def write_manifest(resolved: Resolved, path: Path) -> None:
    """Write the manifest of one resolved source (JSON) atomically."""
    with atomic_open(path) as fh:
        json.dump(asdict(resolved), fh, indent=1)
        fh.write("\n")


def read_manifest(path: Path) -> Resolved:
    """Read a manifest written by `write_manifest`; a download cache reads as the mirror it is (mode `mirror`)."""
    data = load_json(path, "a traces manifest (`ostinato sessions get`)")
    if not isinstance(data, dict) or data.get("mode") not in ("mirror", "download", "tables"):
        raise InputError(f"{path}: not a traces manifest (key 'mode': expected mirror, download or tables)")
    if data["mode"] == "download":
        data = {**data, "mode": "mirror", "note": f"download cache: {data.get('note', '')}"}
    keys = [f.name for f in fields(Resolved)]
    wrong = [k for k in ("source", "path", "url", "note") if not isinstance(data.get(k), str)]
    if wrong:
        raise InputError(f"{path}: not a traces manifest (key '{wrong[0]}': expected a string)")
    return Resolved(**{k: str(data[k]) for k in keys if k in data})
