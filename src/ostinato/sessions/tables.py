"""Per-turn token tables: numbers derived from traces (never text, never token ids), committed under data/sessions.

One CSV row per agent request: `session, turn, kind, domain, task, new_<tok>, output_<tok>` for each tokenizer
(tokens of the rendered new input and of the rendered reply, in that tokenizer's chat template) and
`output_recorded` (the trace's own completion-token count, empty where the file has none). These tables
let the pipeline build replayable sessions (synthesized ids) and Table 2 without any trace at hand.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ostinato.atomic import atomic_open
from ostinato.sessions.chat import DEFAULT_TEMPLATE, get_template
from ostinato.sessions.model import KINDS, Session
from ostinato.sessions.tokenize import Tokenizer, tokenize_session

TABLE_TOKENIZERS: tuple[str, ...] = ("deepseek", "qwen")
BASE_COLUMNS: tuple[str, ...] = ("session", "turn", "kind", "domain", "task")


@dataclass(frozen=True)
class TurnRow:
    """One request of one session as numbers: kind, per-tokenizer new/output tokens, recorded completion tokens."""

    session: str
    turn: int
    kind: str
    domain: str
    task: str  # hash of the task id (tasks recur across agents); empty when the trace names none
    new: dict[str, int]
    output: dict[str, int]
    output_recorded: int | None

    def n_output(self, tokenizer: str, prefer_recorded: bool = True) -> int:
        """Output tokens of this request: the recorded count where present (if preferred), else the tokenized one."""
        if prefer_recorded and self.output_recorded is not None and self.output_recorded > 0:
            return self.output_recorded
        return self.output[tokenizer]


def columns(tokenizers: Iterable[str]) -> list[str]:
    """CSV header of a table with the given tokenizers."""
    toks = list(tokenizers)
    return [*BASE_COLUMNS, *(f"new_{t}" for t in toks), *(f"output_{t}" for t in toks), "output_recorded"]


def task_hash(domain: str, task_id: str) -> str:
    """A short hash naming a task without its text (12 hex digits; empty when there is no task id)."""
    if not task_id:
        return ""
    return hashlib.sha256(f"{domain}/{task_id}".encode("utf-8")).hexdigest()[:12]


def session_rows(session: Session, tokenizers: dict[str, Tokenizer]) -> list[TurnRow]:
    """Tokenize one session with each tokenizer (its default chat template) and return its rows."""
    counts = {}
    for name, tok in tokenizers.items():
        t = tokenize_session(session, tok, get_template(DEFAULT_TEMPLATE.get(name, "chatml")), tokenizer_name=name)
        counts[name] = t.requests
    rows = []
    for turn, req in enumerate(session.requests):
        rows.append(TurnRow(
            session=session.session_id, turn=turn, kind=req.kind, domain=str(session.meta.get("domain", "")),
            task=task_hash(str(session.meta.get("domain", "")), str(session.meta.get("task_id", ""))),
            new={n: counts[n][turn].n_new for n in tokenizers},
            output={n: counts[n][turn].n_output for n in tokenizers},
            output_recorded=req.recorded_output_tokens,
        ))
    return rows


def write_table(rows: Iterable[TurnRow], path: Path, tokenizers: Iterable[str]) -> int:
    """Write rows as CSV atomically; return the number of rows."""
    toks = list(tokenizers)
    n = 0
    with atomic_open(path) as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns(toks))
        for r in rows:
            w.writerow([r.session, r.turn, r.kind, r.domain, r.task, *(r.new[t] for t in toks), *(r.output[t] for t in toks),
                        "" if r.output_recorded is None else r.output_recorded])
            n += 1
    return n


def table_tokenizers(header: list[str]) -> list[str]:
    """The tokenizers a table header carries (`new_<tok>` columns)."""
    return [c.removeprefix("new_") for c in header if c.startswith("new_")]


def iter_table(path: Path) -> Iterator[TurnRow]:
    """Yield the rows of a per-turn table; a malformed row is an error naming the file, line and session."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"per-turn table {path} does not exist (made by `ostinato sessions tables`)")
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or tuple(header[: len(BASE_COLUMNS)]) != BASE_COLUMNS or header[-1] != "output_recorded":
            raise ValueError(f"{path}: not a per-turn table (header {header})")
        toks = table_tokenizers(header)
        for lineno, rec in enumerate(reader, 2):
            row = dict(zip(header, rec))
            try:
                if len(rec) != len(header) or row["kind"] not in KINDS:
                    raise ValueError(f"expected {len(header)} fields and a kind in {KINDS}")
                rec_out = row["output_recorded"]
                yield TurnRow(
                    session=row["session"], turn=int(row["turn"]), kind=row["kind"], domain=row["domain"], task=row["task"],
                    new={t: int(row[f"new_{t}"]) for t in toks}, output={t: int(row[f"output_{t}"]) for t in toks},
                    output_recorded=int(rec_out) if rec_out else None,
                )
            except (KeyError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: session {row.get('session', '?')}: bad row ({exc})") from exc


def read_table(path: Path) -> dict[str, list[TurnRow]]:
    """Return a table grouped by session (file order kept); turns must run 0, 1, … within a session."""
    out: dict[str, list[TurnRow]] = {}
    for r in iter_table(path):
        rows = out.setdefault(r.session, [])
        if r.turn != len(rows):
            raise ValueError(f"{path}: session {r.session}: turn {r.turn} out of order (expected {len(rows)})")
        rows.append(r)
    return out
