"""Bitwise equality of two engines' replays of the same sessions (`ostinato replay bitwise`).

The paper's Appendix A check, over whole sessions: two configurations that must compute the same thing (e.g. the
split path's branches in turn and overlapped, `ostinato` and `ostinato-overlap`) replay the same sessions with
`replay run --record-probs N`, and every request must return the same tokens and bitwise the same top-N token ids
and log-probabilities. Log-probabilities travel as JSON numbers, which llama-server writes with enough digits to
read back the float it computed, so equal numbers here are equal bits there.

A server keeps state from one session to the next (borrowed memory's scores and slots), so a session is comparable
only where both servers had served the same sessions before it (the records' `server_prior`, `replay run`): one whose
history differs, e.g. because one replay was interrupted and resumed on a new server start, is reported as a
`history` difference and its requests are not compared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from ostinato.replay.results import find_engine_dirs
from ostinato.replay.store import SESSIONS_DIR, read_records, write_json_atomic


@dataclass(frozen=True)
class Difference:
    """The first difference of one request (or a request or session that only one side holds)."""

    session: str
    turn: int | None
    what: str             # tokens | top_ids | top_logprobs | failed | missing | no_probs | history
    position: int | None  # the generated token where it differs
    detail: str


@dataclass
class BitwiseReport:
    """What `compare` found: counts of what both sides hold and checked, and every difference."""

    a: str
    b: str
    sessions: int = 0
    requests: int = 0
    tokens: int = 0                  # generated tokens whose top ids and log-probabilities were compared
    differences: list[Difference] = field(default_factory=list)
    # a side whose engine borrows memory: its records' borrow counters summed over the compared requests (decode
    # steps, steps that computed a borrowed expert, routes computed on one, ...); None for a side without them
    borrow_a: dict | None = None
    borrow_b: dict | None = None

    @property
    def equal(self) -> bool:
        """Bitwise equal: something was compared and nothing differs."""
        return self.tokens > 0 and not self.differences

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "equal": self.equal, "sessions": self.sessions, "requests": self.requests,
                "tokens": self.tokens, "borrow_a": self.borrow_a, "borrow_b": self.borrow_b,
                "differences": [asdict(d) for d in self.differences]}


def _add_borrow(total: dict | None, rec: dict) -> dict | None:
    b = rec.get("borrow")
    if b is None:
        return total
    total = dict(total or {})
    for k, v in b.items():
        total[k] = total.get(k, 0) + v
    return total


def _engine_dir(path: Path) -> Path:
    dirs = find_engine_dirs([path])
    if len(dirs) != 1:
        raise ValueError(f"--in {path}: {len(dirs)} engine result directories under it, expected one "
                         f"(give OUT/<engine>)")
    return dirs[0]


def _sessions(engine_dir: Path) -> dict[str, dict[int, dict]]:
    """session id -> turn -> its record (the last attempt's, when a crash replayed the session again)."""
    out: dict[str, dict[int, dict]] = {}
    for f in sorted((engine_dir / SESSIONS_DIR).glob("*.jsonl")):
        for rec in read_records(f):
            turns = out.setdefault(str(rec.get("session", f.stem)), {})
            t = int(rec["turn"])
            if t not in turns or rec.get("attempt", 1) >= turns[t].get("attempt", 1):
                turns[t] = rec
    return out


def _first_difference(x: list, y: list) -> int:
    return next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))


def _compare_request(session: str, turn: int, ra: dict, rb: dict) -> tuple[Difference | None, int]:
    """The first difference of one request on both sides, and the tokens compared."""
    for side, r in (("a", ra), ("b", rb)):
        if not r.get("ok"):
            return Difference(session, turn, "failed", None, f"{side}: {r.get('error') or 'failed'}"), 0
        if "top_logprobs" not in r:
            return Difference(session, turn, "no_probs", None,
                              f"{side}: no probabilities recorded (replay run --record-probs)"), 0
    for key in ("streamed_token_ids", "top_ids", "top_logprobs"):
        xa, xb = ra.get(key) or [], rb.get(key) or []
        if xa != xb:
            i = _first_difference(xa, xb)
            show = lambda x: x[i] if i < len(x) else "(none)"  # noqa: E731
            what = "tokens" if key == "streamed_token_ids" else key
            return Difference(session, turn, what, i, f"{len(xa)} against {len(xb)} entries; at {i}: "
                                                      f"{show(xa)} against {show(xb)}"), 0
    return None, len(ra["top_logprobs"])


def _prior(turns: dict[int, dict]) -> dict | None:
    """What the session's server had served before it (`server_prior` of its first record), None in results made
    before it was recorded."""
    return turns[min(turns)].get("server_prior") if turns else None


def _history_difference(session: str, pa: dict, pb: dict) -> Difference:
    return Difference(session, None, "history", None,
                      f"a's server had served {pa.get('sessions')} session(s) before it, b's {pb.get('sessions')}"
                      + (" (other ones)" if pa.get("sessions") == pb.get("sessions") else "")
                      + ": a server keeps state from one session to the next (borrowed memory), so the session is "
                        "compared only after the same sessions; replay both whole, each on one server start")


def compare(a: Path, b: Path) -> BitwiseReport:
    """Compare two engines' replays (`replay run --out OUT` directories, or OUT/<engine>) request by request."""
    da, db = _engine_dir(Path(a)), _engine_dir(Path(b))
    sa, sb = _sessions(da), _sessions(db)
    report = BitwiseReport(str(da), str(db))
    for sid in sorted(set(sa) | set(sb)):
        if sid not in sa or sid not in sb:
            report.differences.append(Difference(sid, None, "missing", None,
                                                 f"only in {'a' if sid in sa else 'b'}"))
            continue
        pa, pb = _prior(sa[sid]), _prior(sb[sid])
        if pa is not None and pb is not None and pa != pb:
            report.differences.append(_history_difference(sid, pa, pb))
            continue
        report.sessions += 1
        for turn in sorted(set(sa[sid]) | set(sb[sid])):
            if turn not in sa[sid] or turn not in sb[sid]:
                report.differences.append(Difference(sid, turn, "missing", None,
                                                     f"only in {'a' if turn in sa[sid] else 'b'}"))
                continue
            report.requests += 1
            report.borrow_a = _add_borrow(report.borrow_a, sa[sid][turn])
            report.borrow_b = _add_borrow(report.borrow_b, sb[sid][turn])
            diff, n = _compare_request(sid, turn, sa[sid][turn], sb[sid][turn])
            report.tokens += n
            if diff is not None:
                report.differences.append(diff)
    return report


def save(report: BitwiseReport, path: Path) -> None:
    """Write the report as JSON (atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, report.to_json())
