"""Result files of a replay: one JSONL per (engine, session), written atomically; resume by presence.

A result file that cannot be read (a truncated last line: copied while written, a disk that filled) counts as
missing, so its session is replayed again; a write that fails (the disk full) stops the run with an error naming
the file and keeps nothing of that session, so the next run replays it: no request is lost or recorded twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import open_regular, parse_json
from ostinato.sessions.readers import safe_name

SESSIONS_DIR = "sessions"


class ResultWriteError(RuntimeError):
    """A result file could not be written (e.g. no space left on the device); nothing of it was kept."""


def write_json_atomic(path: Path, obj: object) -> None:
    """Write a JSON file atomically (temp file in the same directory, fsync, rename); a failure names the file."""
    try:
        with atomic_open(path) as fh:
            json.dump(obj, fh, indent=1, sort_keys=True)
            fh.write("\n")
    except OSError as exc:
        raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class ResultStore:
    """The result directory of one engine: `<out>/<engine>/sessions/<session>.jsonl`, plus run files."""

    root: Path  # <out>/<engine>

    @classmethod
    def for_engine(cls, out_dir: Path, engine: str) -> "ResultStore":
        """Return the store of `engine` under `out_dir`, creating its directories."""
        if not engine or safe_name(engine) != engine:
            raise ValueError(f"--engine-name {engine!r}: expected letters, digits, '.', '_' or '-'")
        store = cls(Path(out_dir) / engine)
        (store.root / SESSIONS_DIR).mkdir(parents=True, exist_ok=True)
        return store

    def path_for(self, session_id: str) -> Path:
        """Return the result file of a session."""
        return self.root / SESSIONS_DIR / f"{safe_name(session_id)}.jsonl"

    def read_status(self, session_id: str) -> tuple[str, str]:
        """('missing' | 'unreadable' | 'ok' | 'failed', why when unreadable) of a session's result file."""
        path = self.path_for(session_id)
        if not path.is_file():
            return "missing", ""
        try:
            records = read_records(path)
        except InputError as exc:
            return "unreadable", str(exc)
        return ("ok" if records and all(r.get("ok") for r in records) else "failed"), ""

    def status(self, session_id: str) -> str:
        """Return 'missing', 'unreadable', 'ok' or 'failed' for a session's result file."""
        return self.read_status(session_id)[0]

    def remove_partial(self) -> int:
        """Delete temp files left by an interrupted run; return how many."""
        n = 0
        for tmp in (self.root / SESSIONS_DIR).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
            n += 1
        return n

    def write_session(self, session_id: str, records: list[dict]) -> Path:
        """Write a session's request records atomically: temp file, fsync, rename into place (a failure keeps
        nothing and raises ResultWriteError naming the file)."""
        path = self.path_for(session_id)
        try:
            with atomic_open(path) as fh:
                for rec in records:
                    fh.write(json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n")
        except OSError as exc:
            raise ResultWriteError(f"cannot write {path}: {exc.strerror or exc}; nothing of session {session_id} "
                                   f"was kept (a rerun replays it)") from exc
        return path

    def iter_records(self) -> Iterator[dict]:
        """Yield every request record of this engine, session files in name order."""
        for f in sorted((self.root / SESSIONS_DIR).glob("*.jsonl")):
            yield from read_records(f)


def read_records(path: str | os.PathLike) -> list[dict]:
    """Return the request records of one session result file; a line that is not a JSON object (a truncated last
    line) is an InputError naming the file and the line."""
    out = []
    with open_regular(path, "replay results (one JSON object per request)") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{where}: not UTF-8 text (a truncated or damaged result file)") from None
            if not text.strip():
                continue
            rec = parse_json(text, where, "one JSON object per request (a truncated or damaged result file?)")
            if not isinstance(rec, dict):
                raise InputError(f"{where}: not a JSON object (expected one request record per line)")
            out.append(rec)
    return out
