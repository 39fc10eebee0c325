"""Result files of a replay: one JSONL per (engine, session), written atomically; resume by presence."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ostinato.atomic import atomic_open
from ostinato.sessions.readers import safe_name

SESSIONS_DIR = "sessions"


def write_json_atomic(path: Path, obj: object) -> None:
    """Write a JSON file atomically (temp file in the same directory, fsync, rename)."""
    with atomic_open(path) as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.write("\n")


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

    def status(self, session_id: str) -> str:
        """Return 'missing', 'ok' or 'failed' for a session's result file."""
        path = self.path_for(session_id)
        if not path.is_file():
            return "missing"
        records = read_records(path)
        return "ok" if records and all(r.get("ok") for r in records) else "failed"

    def remove_partial(self) -> int:
        """Delete temp files left by an interrupted run; return how many."""
        n = 0
        for tmp in (self.root / SESSIONS_DIR).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
            n += 1
        return n

    def write_session(self, session_id: str, records: list[dict]) -> Path:
        """Write a session's request records atomically: temp file, fsync, rename into place."""
        path = self.path_for(session_id)
        with atomic_open(path) as fh:
            for rec in records:
                fh.write(json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n")
        return path

    def iter_records(self) -> Iterator[dict]:
        """Yield every request record of this engine, session files in name order."""
        for f in sorted((self.root / SESSIONS_DIR).glob("*.jsonl")):
            yield from read_records(f)


def read_records(path: Path) -> list[dict]:
    """Return the request records of one session result file."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
