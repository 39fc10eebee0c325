"""Table 2 statistics of a session set: sessions, turns, output tokens, median new tokens, per-turn values."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from ostinato.sessions.splits import SplitSet
from ostinato.sessions.tables import TurnRow


@dataclass(frozen=True)
class SetStats:
    """One Table 2 row: counts over the set's turns (new and output tokens in one tokenizer)."""

    name: str
    sessions: int
    turns: int
    output_tokens: int
    median_new: float


def set_turns(table: dict[str, list[TurnRow]], split_set: SplitSet, tokenizer: str,
              prefer_recorded: bool = True) -> pd.DataFrame:
    """Per-turn frame of one set: session, turn, kind, new, output (capped at the set's max_requests)."""
    records = []
    for sid in split_set.sessions:
        if sid not in table:
            raise ValueError(f"split session {sid} is not in the per-turn table")
        rows = table[sid][: split_set.max_requests or None]
        records += [{"session": sid, "turn": r.turn, "kind": r.kind, "new": r.new[tokenizer],
                     "output": r.n_output(tokenizer, prefer_recorded)} for r in rows]
    return pd.DataFrame.from_records(records, columns=["session", "turn", "kind", "new", "output"])


def set_stats(name: str, turns: pd.DataFrame) -> SetStats:
    """The Table 2 row of a set's per-turn frame."""
    return SetStats(name=name, sessions=int(turns["session"].nunique()), turns=len(turns),
                    output_tokens=int(turns["output"].sum()),
                    median_new=float(statistics.median(turns["new"])) if len(turns) else float("nan"))
