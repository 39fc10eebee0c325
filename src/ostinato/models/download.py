"""Download model weights (http, https, file URLs), streamed, checked against a sha256, moved into place atomically."""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ostinato.atomic import sha256_file

CHUNK_BYTES = 8 << 20
_SCHEMES = ("http", "https", "file")


@dataclass(frozen=True)
class DownloadResult:
    """Where the verified file is, its size, and whether it was already there."""

    path: Path
    size: int
    reused: bool


def check_sha256(value: str) -> str:
    """Return `value` lower-cased if it is 64 hex digits, else raise ValueError naming --sha256."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value or ""):
        raise ValueError(f"--sha256 {value!r}: expected 64 hexadecimal digits")
    return value.lower()


def check_url(url: str) -> str:
    """Return `url` if its scheme is http, https or file, else raise ValueError naming --url."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in _SCHEMES:
        raise ValueError(f"--url {url!r}: expected an http://, https:// or file:// URL")
    return url


def _bar(total: int | None, enabled: bool, desc: str) -> Any:
    """A tqdm byte counter, or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)


def _open(url: str, timeout: float) -> Any:
    """Open `url` for reading; a missing file:// path raises FileNotFoundError naming --url."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        if not path.is_file():
            raise FileNotFoundError(f"--url {url!r}: no such file {path}")
    request = urllib.request.Request(url, headers={"User-Agent": "ostinato-models"})
    return urllib.request.urlopen(request, timeout=timeout)


def download(
    url: str, sha256: str, out: str | Path, *, progress: bool = True, timeout: float = 60.0
) -> DownloadResult:
    """Fetch `url` to `out` if `out` is not already a file with this sha256; the final path only ever holds verified data."""
    url, expected, out = check_url(url), check_sha256(sha256), Path(out)
    if out.is_file() and sha256_file(out) == expected:
        return DownloadResult(out, out.stat().st_size, reused=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    size = 0
    try:
        with _open(url, timeout) as response, open(tmp, "wb") as fh:
            length = response.headers.get("Content-Length")
            bar = _bar(int(length) if length and length.isdigit() else None, progress, out.name)
            try:
                while block := response.read(CHUNK_BYTES):
                    fh.write(block)
                    digest.update(block)
                    size += len(block)
                    if bar is not None:
                        bar.update(len(block))
            finally:
                if bar is not None:
                    bar.close()
            fh.flush()
            os.fsync(fh.fileno())
        actual = digest.hexdigest()
        if actual != expected:
            raise ValueError(
                f"{out}: sha256 mismatch for {url}: expected {expected}, got {actual}; the download was discarded"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return DownloadResult(out, size, reused=False)
