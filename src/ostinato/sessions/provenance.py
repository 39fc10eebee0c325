"""Provenance of the committed per-turn tables: upstream source, commit, paths, command, tokenizer versions."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from ostinato.atomic import atomic_open
from ostinato.sessions.sources import source_info
from ostinato.atomic import sha256_file


def _package_version(name: str) -> str:
    """Installed version of a distribution ('' if absent)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def _tokenizer_versions(name: str) -> dict[str, str]:
    """Versions behind a tokenizer's counts: its vocabulary package and, for deepseek and qwen, HF `tokenizers`."""
    entry = {"package": f"{name}-tokenizer", "version": _package_version(f"{name}-tokenizer")}
    if name in ("deepseek", "qwen"):
        entry["tokenizers"] = _package_version("tokenizers")
    return entry


def _git_commit() -> str:
    """Commit of the working tree the command ran in ('' outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def table_entry(source: str, table: Path, mirror: Path, n_files: int, n_sessions: int, n_rows: int,
                tokenizers: list[str], argv: list[str] | None = None) -> dict:
    """The provenance record of one table (no trace text: names, counts, checksums, the command)."""
    info = source_info(source)
    return {
        "table": Path(table).name,
        "sha256": sha256_file(table),
        "source": {"name": source, "canonical_url": info.url, "repository": info.repository, "commit": info.commit,
                   "paths": info.paths, "license": info.license},
        "mirror": str(mirror),
        "files": n_files,
        "sessions": n_sessions,
        "rows": n_rows,
        "tokenizers": {t: _tokenizer_versions(t) for t in tokenizers},
        "command": "ostinato " + " ".join(sys.argv[1:] if argv is None else argv),
        "ostinato_commit": _git_commit(),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def update_provenance(path: Path, key: str, entry: dict) -> None:
    """Set one entry of a provenance JSON file (created if missing), keeping the others."""
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data.setdefault("note", "numbers derived from public traces by `ostinato sessions tables`; no text, no token ids")
    data.setdefault("tables", {})[key] = entry
    with atomic_open(path) as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
