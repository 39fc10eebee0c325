"""Where each request of a session sits in the conversation's token positions (prefill vs generated)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np

from ostinato.errors import InputError
from ostinato.inputs import load_json


@dataclass(frozen=True)
class RequestSpan:
    """One request: its new prompt tokens start at `start`, its generated tokens follow them."""

    turn: int
    kind: str
    start: int
    n_new: int
    n_output: int

    @property
    def decode_start(self) -> int:
        return self.start + self.n_new

    @property
    def end(self) -> int:
        return self.start + self.n_new + self.n_output


@dataclass(frozen=True)
class SessionLayout:
    """A session as consecutive requests; the routing trace covers positions [0, n_pos)."""

    session: str
    requests: tuple[RequestSpan, ...]

    @property
    def n_pos(self) -> int:
        return self.requests[-1].end if self.requests else 0

    def decode_mask(self) -> np.ndarray:
        """True at positions of generated tokens (decode steps), False at new prompt tokens (prefill)."""
        mask = np.zeros(self.n_pos, dtype=bool)
        for r in self.requests:
            mask[r.decode_start:r.end] = True
        return mask

    def to_json(self) -> dict:
        return {"session": self.session, "requests": [asdict(r) for r in self.requests]}


def layout_from_counts(session: str, counts: list[tuple[str, int, int]]) -> SessionLayout:
    """Build a layout from (kind, n_new, n_output) per request, in order."""
    spans, pos = [], 0
    for turn, (kind, n_new, n_output) in enumerate(counts):
        if n_new < 0 or n_output < 0:
            raise ValueError(f"session {session} request {turn}: negative token count")
        spans.append(RequestSpan(turn, kind, pos, int(n_new), int(n_output)))
        pos += int(n_new) + int(n_output)
    return SessionLayout(session, tuple(spans))


def layout_from_json(obj: dict) -> SessionLayout:
    """A layout from a manifest entry ({session, requests: [{kind, n_new, n_output, ...}]})."""
    reqs = obj.get("requests")
    if not isinstance(reqs, list) or not isinstance(obj.get("session"), str):
        raise ValueError("a session needs a string `session` and a `requests` list")
    counts = []
    for i, r in enumerate(reqs):
        n_new, n_out = (r.get(k) if isinstance(r, dict) else None for k in ("n_new", "n_output"))
        if type(n_new) is not int or type(n_out) is not int:
            raise ValueError(f"requests[{i}]: n_new and n_output must be integers")
        counts.append((str(r.get("kind", "tool")), n_new, n_out))
    return layout_from_counts(obj["session"], counts)


def read_layouts(path: str | os.PathLike, select: int = 0) -> list[SessionLayout]:
    """Read the sessions of a sessions JSONL file (first `select` if > 0), checked as every reader checks them."""
    from ostinato.sessions.model import iter_session_counts

    out: list[SessionLayout] = []
    for session, counts in iter_session_counts(path):
        out.append(layout_from_counts(session, counts))
        if select and len(out) >= select:
            break
    return out


def read_manifest_layouts(path: str | os.PathLike) -> tuple[list[SessionLayout], dict]:
    """The layouts of a trace directory's manifest.json (`ostinato routing generate`) and the manifest itself; each
    entry's `n_pos` must be its layout's, so a trace is held to the positions its manifest states."""
    man = load_json(path, "a routing manifest (`ostinato routing generate`)")
    entries = man.get("sessions") if isinstance(man, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: key 'sessions': expected a non-empty list of sessions")
    out = []
    for i, entry in enumerate(entries):
        try:
            lay = layout_from_json(entry if isinstance(entry, dict) else {})
        except ValueError as exc:
            raise InputError(f"{path}: key 'sessions[{i}]': {exc}") from None
        if entry.get("n_pos", lay.n_pos) != lay.n_pos:
            raise InputError(f"{path}: key 'sessions[{i}].n_pos': {entry['n_pos']}, its requests hold {lay.n_pos} "
                             f"positions (session {lay.session})")
        out.append(lay)
    return out, man


# Request-size distributions of the synthetic workloads (lognormal medians and spreads), shaped like
# Table 2 / Section 1: a SWE session sends 42-100 requests with a median of 249 new tokens each.
_WORKLOADS: dict[str, dict] = {
    "swe": {"first": (4000, 0.25), "n_req": (42, 100), "new": (249, 1.0), "out": (250, 0.8), "kinds": ("tool",)},
    "tau2": {"first": (2600, 0.2), "n_req": (10, 30), "new": (120, 0.9), "out": (70, 0.7), "kinds": ("tool", "user")},
}


def synthetic_layouts(workload: str, n_sessions: int, seed: int = 0) -> list[SessionLayout]:
    """Sessions with SWE- or tau2-like request sizes, for calibration and tests when no traces are at hand."""
    if workload not in _WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(_WORKLOADS)}")
    w = _WORKLOADS[workload]
    rng = np.random.default_rng([seed, sum(map(ord, workload))])
    out = []
    for i in range(n_sessions):
        n = int(rng.integers(w["n_req"][0], w["n_req"][1] + 1))
        first = int(w["first"][0] * np.exp(w["first"][1] * rng.standard_normal()))
        new = np.clip(w["new"][0] * np.exp(w["new"][1] * rng.standard_normal(n)), 8, 12000).astype(int)
        outs = np.clip(w["out"][0] * np.exp(w["out"][1] * rng.standard_normal(n)), 4, 4000).astype(int)
        new[0] = first
        kinds = ["first"] + [w["kinds"][int(j)] for j in rng.integers(0, len(w["kinds"]), n - 1)]
        counts = list(zip(kinds, new.tolist(), outs.tolist()))
        out.append(layout_from_counts(f"synthetic-{workload}/{seed}-{i}", counts))
    return out
