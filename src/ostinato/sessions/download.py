"""Download a trace source into a local cache folder that `sessions build` reads like a mirror.

A GitHub source is fetched as the repository archive at its pinned commit (`.tar.gz`, top folder
`<repo>-<commit>/`) and only the trace paths (globs per source) are extracted; a rows source (SWE-rebench)
is one JSONL/JSON file stored as is. Atomic: the download goes to a temp file, the extraction to a temp
folder renamed into place, and a marker `<cache>/<source>.download.json` written last says the folder is
complete, so a rerun reuses it and an interrupted one leaves nothing that looks complete.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from ostinato.atomic import atomic_open, fsync_dir

CHUNK = 1 << 20
ROWS_SUFFIXES = (".jsonl", ".json")


class DownloadError(RuntimeError):
    """A download or extraction failed; the message names the URL and why."""


class ChecksumError(DownloadError):
    """The download's sha256 is not the configured one (the file was deleted)."""


@dataclass(frozen=True)
class Fetched:
    """A complete cache folder of one source: where, from which URL, the archive's sha256 and file count."""

    source: str
    url: str
    sha256: str
    path: str
    files: int
    reused: bool = False


def marker_path(cache: Path, source: str) -> Path:
    """The completion marker of a source's cache folder (beside it, so readers' globs never see it)."""
    return Path(cache) / f"{source}.download.json"


def cached(cache: Path, source: str, url: str | None = None, sha256: str | None = None) -> Fetched | None:
    """The complete cache of a source (its marker and folder exist; same URL and sha256 when given), else None."""
    marker, folder = marker_path(cache, source), Path(cache) / source
    if not (marker.is_file() and folder.is_dir()):
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (url and data.get("url") != url) or (sha256 and data.get("sha256") != sha256.lower()):
        return None
    return Fetched(source, data["url"], data["sha256"], str(folder), int(data.get("files", 0)), reused=True)


def github_archive_url(repository: str, commit: str) -> str:
    """codeload URL of a GitHub repository's `.tar.gz` at a commit (`github.com/<owner>/<repo>`)."""
    owner, repo = repository.removeprefix("https://").removeprefix("github.com/").strip("/").split("/")[:2]
    return f"https://codeload.github.com/{owner}/{repo}/tar.gz/{commit}"


@contextmanager
def _open_url(url: str, timeout_s: float) -> Iterator[tuple[Iterator[bytes], int | None]]:
    """Stream the bytes of an http(s) URL (httpx) or a file:// URL (urllib), with the size when known."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("http", "https"):
        import httpx

        with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as r:
            if r.status_code >= 400:
                raise DownloadError(f"{url}: HTTP {r.status_code}")
            size = r.headers.get("content-length")
            yield r.iter_bytes(CHUNK), int(size) if size and size.isdigit() else None
    elif scheme == "file":
        with urllib.request.urlopen(url, timeout=timeout_s) as fh:  # noqa: S310 - file:// only here
            size = fh.headers.get("content-length")
            yield iter(lambda: fh.read(CHUNK), b""), int(size) if size and size.isdigit() else None
    else:
        raise DownloadError(f"{url}: not an http(s):// or file:// URL")


def download(url: str, dest: IO[bytes], progress: bool = True, timeout_s: float = 60.0) -> str:
    """Stream a URL into an open binary file with a tqdm bar; return its sha256 (DownloadError if cut short)."""
    from tqdm import tqdm

    digest, n = hashlib.sha256(), 0
    try:
        with _open_url(url, timeout_s) as (chunks, size), tqdm(
                total=size, unit="B", unit_scale=True, desc=Path(urllib.parse.urlsplit(url).path).name or url,
                disable=not progress, file=sys.stderr) as bar:
            for chunk in chunks:
                dest.write(chunk)
                digest.update(chunk)
                n += len(chunk)
                bar.update(len(chunk))
    except DownloadError:
        raise
    except Exception as exc:  # noqa: BLE001 - network and file errors become one message naming the URL
        raise DownloadError(f"{url}: {type(exc).__name__}: {exc}") from exc
    if size is not None and n != size:
        raise DownloadError(f"{url}: got {n} of {size} bytes")
    return digest.hexdigest()


def glob_match(path: str, pattern: str) -> bool:
    """Whether a relative POSIX path matches a glob segment by segment (`*` stays in a segment, `**` spans any)."""
    return _match(PurePosixPath(path).parts, PurePosixPath(pattern).parts)


def _match(parts: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    """Segment-wise glob match of `glob_match`."""
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _match(parts[1:], pats[1:])


def flat_name(rel: str, pattern: str) -> str:
    """Cache file name: the parts a wildcard matched joined by `__` (the mirror's names); one such part or a
    `**` glob: the whole path so joined."""
    parts, pats = PurePosixPath(rel).parts, PurePosixPath(pattern).parts
    wild = [p for p, q in zip(parts, pats) if any(c in q for c in "*?[")]
    if "**" in pats or len(parts) != len(pats) or len(wild) < 2:
        return "__".join(parts)
    return "__".join(wild)


def extract_members(archive: Path, dest: Path, members: tuple[str, ...], basename: bool) -> int:
    """Extract the regular files of a GitHub-layout `.tar.gz` whose path below the top folder matches a glob."""
    names: dict[str, str] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                rel = "/".join(PurePosixPath(info.name).parts[1:])  # strip `<repo>-<commit>/`
                pattern = next((p for p in members if glob_match(rel, p)), None)
                if not info.isfile() or pattern is None:
                    continue
                name = PurePosixPath(rel).name if basename else flat_name(rel, pattern)
                if name in names:
                    raise DownloadError(f"{archive.name}: {rel} and {names[name]} both map to {name}")
                names[name] = rel
                src = tar.extractfile(info)
                assert src is not None
                with src, open(dest / name, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DownloadError(f"{archive.name}: not a readable .tar.gz ({type(exc).__name__}: {exc})") from exc
    if not names:
        raise DownloadError(f"{archive.name}: no file matches {', '.join(members)}")
    return len(names)


@dataclass(frozen=True)
class Request:
    """What to fetch for one source: URL, expected sha256 (optional), archive globs (empty: a rows file)."""

    source: str
    url: str
    sha256: str | None = None
    members: tuple[str, ...] = ()
    basename: bool = False


def fetch(req: Request, cache: Path, progress: bool = True, timeout_s: float = 60.0) -> Fetched:
    """Reuse the complete cache of `req`, else download, verify, extract to a temp folder and rename it into place."""
    cache = Path(cache)
    hit = cached(cache, req.source, req.url, req.sha256)
    if hit is not None:
        return hit
    cache.mkdir(parents=True, exist_ok=True)
    for stale in cache.glob(f".{req.source}.*.tmp"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{req.source}.", suffix=".tmp", dir=cache))
    try:
        part = work / "download.part"
        with open(part, "wb") as fh:
            sha = download(req.url, fh, progress, timeout_s)
        if req.sha256 and sha != req.sha256.lower():
            raise ChecksumError(f"{req.url}: sha256 {sha}, expected {req.sha256.lower()} (download deleted)")
        folder = work / req.source
        folder.mkdir()
        n = _unpack(req, part, folder)
        part.unlink(missing_ok=True)
        _install(folder, cache / req.source, marker_path(cache, req.source))
        done = Fetched(req.source, req.url, sha, str(cache / req.source), n)
        with atomic_open(marker_path(cache, req.source)) as out:
            json.dump({k: v for k, v in asdict(done).items() if k != "reused"}, out, indent=1)
            out.write("\n")
        return done
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _unpack(req: Request, part: Path, folder: Path) -> int:
    """Extract the archive's trace paths, or store a rows file under its URL's name; the number of files."""
    if req.members:
        return extract_members(part, folder, req.members, req.basename)
    name = Path(urllib.parse.urlsplit(req.url).path).name
    if not name.endswith(ROWS_SUFFIXES):
        name = "rows.jsonl"
    part.replace(folder / name)
    return 1


def _install(folder: Path, target: Path, marker: Path) -> None:
    """Replace `target` by `folder` (same file system): the old marker goes first, then the old folder."""
    marker.unlink(missing_ok=True)
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    folder.rename(target)
    fsync_dir(target.parent)
