"""How long a session's replay will take, from what the same engine already replayed, so that a run with a deadline
(`replay run --deadline`) starts only sessions it can finish: a session is recorded whole or replayed again, so one
cut short by a time limit (a GPU machine's call, a batch job) is time spent on nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ostinato.errors import InputError
from ostinato.replay.results import find_engine_dirs
from ostinato.replay.store import SESSIONS_DIR, read_records
from ostinato.sessions.model import TokenizedSession

# an estimate is raised by this factor, and this many seconds are kept in hand, before it is held against the deadline
SAFETY_FACTOR = 1.15
SAFETY_S = 10.0


@dataclass
class ReplayRates:
    """Running sums over an engine's recorded requests: the server's prompt and generation time per token, and the
    client's time beyond the server's per request (streaming, slot erase)."""

    prompt_ms: float = 0.0
    prompt_n: int = 0
    predicted_ms: float = 0.0
    predicted_n: int = 0
    overhead_s: float = 0.0
    requests: int = 0

    def add(self, rec: dict) -> None:
        """Count one request record (a failed one, or one without server timings, is left out)."""
        srv = rec.get("server") or {}
        try:
            pm, pn = float(srv["prompt_ms"]), int(srv["prompt_n"])
            gm, gn = float(srv["predicted_ms"]), int(srv["predicted_n"])
            latency = float(rec["latency_s"])
        except (KeyError, TypeError, ValueError):
            return
        if not rec.get("ok"):
            return
        self.prompt_ms, self.prompt_n = self.prompt_ms + pm, self.prompt_n + pn
        self.predicted_ms, self.predicted_n = self.predicted_ms + gm, self.predicted_n + gn
        self.overhead_s += max(0.0, latency - (pm + gm) / 1000.0)
        self.requests += 1

    def session_s(self, session: TokenizedSession) -> float | None:
        """The expected seconds of a session's replay (its new tokens at the prompt rate, its outputs at the
        generation rate, the overhead per request); None before any request with both rates was counted."""
        if not self.requests or not self.prompt_n or not self.predicted_n:
            return None
        per_new, per_out = self.prompt_ms / self.prompt_n / 1000.0, self.predicted_ms / self.predicted_n / 1000.0
        overhead = self.overhead_s / self.requests
        return sum(r.n_new * per_new + r.n_output * per_out + overhead for r in session.requests)


def fits(estimate_s: float | None, left_s: float) -> bool:
    """Whether a session expected to take `estimate_s` can start with `left_s` seconds to the deadline (no estimate
    yet: it starts while any time is left)."""
    if left_s <= 0.0:
        return False
    return estimate_s is None or estimate_s * SAFETY_FACTOR + SAFETY_S <= left_s


def rates_of(engine_dir: Path) -> ReplayRates:
    """The rates of every request an engine directory holds (an unreadable session file counts for nothing)."""
    rates = ReplayRates()
    for f in sorted((Path(engine_dir) / SESSIONS_DIR).glob("*.jsonl")):
        try:
            for rec in read_records(f):
                rates.add(rec)
        except (InputError, OSError):
            continue
    return rates


def rates_under(paths: list[Path], flag: str = "--deadline-rates-from") -> list[ReplayRates]:
    """The rates of the engine directories at or directly under `paths` (other engines' replays of the same sessions:
    `replay run --deadline-rates-from`; of other session sets: `--deadline-rates-elsewhere`), for a session of an
    engine that has recorded nothing yet; a path given twice is read once, one not made yet counts for nothing, one
    that is not a directory is an error naming it and its `flag`."""
    out = []
    for p in dict.fromkeys(map(Path, paths)):
        if not p.exists():
            continue
        if not p.is_dir():
            raise InputError(f"{flag} {p}: not a directory (expected replay results)")
        try:
            dirs = find_engine_dirs([p])
        except FileNotFoundError:  # no engine has finished a session there yet
            continue
        out.extend(r for r in map(rates_of, dirs) if r.requests)
    return out


def estimate(session: TokenizedSession, own: ReplayRates, siblings: list[ReplayRates],
             elsewhere: list[ReplayRates] = ()) -> float | None:
    """The session's expected seconds from the engine's own rates, else the longest the siblings' rates give, else the
    longest the rates of replays of other session sets give (any engine's: the first set replayed on a machine gives
    rates to the next, whose first engine would otherwise start a session with no estimate at all)."""
    mine = own.session_s(session)
    if mine is not None:
        return mine
    for group in (siblings, elsewhere):
        theirs = [e for e in (r.session_s(session) for r in group) if e is not None]
        if theirs:
            return max(theirs)
    return None
