"""The routing facts of Section 2.3, computed from any routing traces (synthetic or recorded by the engine).

Residency is frequency-ranked as in Prop 3.1: the globally top-N (layer, expert) pairs by development
route counts, one pool shared by the layers. A cold route names a non-resident expert. Rows holding
the none id (a layer the engine did not compute at that position, e.g. the last layer during a
prefill, or positions served from the prompt cache) are left out of every count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ostinato.routing.layout import SessionLayout
from ostinato.errors import InputError
from ostinato.routing.trace import ROWS_PER_STEP, RoutingTrace, read_trace


@dataclass
class SessionTrace:
    """A trace with the session layout that says which positions are prefill and which are decode."""

    path: str
    trace: RoutingTrace
    layout: SessionLayout


def open_session_trace(path: str | os.PathLike, layout: SessionLayout, exact: bool = False) -> SessionTrace:
    """Open a trace for a session (checked as every reader checks it) with its layout; errors name the file.

    With `exact` (a generated trace, whose manifest states its positions) the trace holds exactly the session's
    positions. Without it (recorded by the engine) it may end early: the last generated token is never computed, and
    a request the server stopped at an end-of-sequence token leaves its later positions out; those count as not
    computed, like none rows. A trace with no position, or no row with experts, has no routing to count."""
    t = read_trace(path)
    if t.n_pos > layout.n_pos or (exact and t.n_pos != layout.n_pos):
        raise InputError(f"{path}: {t.n_pos} positions, the {layout.n_pos} of session {layout.session} expected"
                         + ("" if exact else " at most"))
    if t.n_pos == 0 or not (np.asarray(t.ids[:, :, 0]) != t.shape.none_id).any():
        raise InputError(f'{path}: no routing to count: {t.n_pos} positions, every row "no expert"')
    return SessionTrace(str(path), t, layout)


def _rows(trace: RoutingTrace, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids [n, L, k] as int64 and the mask [n, L] of filled rows."""
    ids = np.asarray(trace.ids[lo:hi]).astype(np.int64)
    valid = ids[:, :, 0] != trace.shape.none_id
    return ids, valid


def expert_counts(traces: Iterable[RoutingTrace]) -> np.ndarray:
    """Routes per (layer, expert) summed over traces, all filled rows: [n_layer, n_expert] int64."""
    counts: np.ndarray | None = None
    for t in traces:
        s = t.shape
        if counts is None:
            counts = np.zeros((s.n_layer, s.n_expert), dtype=np.int64)
        elif counts.shape != (s.n_layer, s.n_expert):
            raise ValueError(f"traces of different shapes: {counts.shape} vs {(s.n_layer, s.n_expert)}")
        for lo in range(0, t.n_pos, ROWS_PER_STEP):
            ids, valid = _rows(t, lo, lo + ROWS_PER_STEP)
            layer = np.broadcast_to(np.arange(s.n_layer)[None, :, None], ids.shape)
            m = np.broadcast_to(valid[:, :, None], ids.shape)
            counts += np.bincount((layer[m] * s.n_expert + ids[m]), minlength=s.n_layer * s.n_expert
                                  ).reshape(s.n_layer, s.n_expert)
    if counts is None:
        raise ValueError("no traces to count")
    return counts


def resident_mask(counts: np.ndarray, n_resident: int) -> np.ndarray:
    """The globally top-N (layer, expert) pairs by count among layers with routing (ties: lower layer, expert)."""
    moe = counts.sum(axis=1) > 0
    flat = np.where(moe[:, None], counts, -1).ravel()
    order = np.argsort(-flat, kind="stable")
    n = min(n_resident, int(moe.sum()) * counts.shape[1])
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[:n]] = True
    return mask.reshape(counts.shape)


def _cold(ids: np.ndarray, valid: np.ndarray, resident: np.ndarray) -> np.ndarray:
    """Cold routes [n, L, k] (False on unfilled rows)."""
    safe = np.where(valid[:, :, None], ids, 0)
    hot = resident[np.arange(resident.shape[0])[None, :, None], safe]
    return ~hot & valid[:, :, None]


def route_coverage(sts: Sequence[SessionTrace], resident: np.ndarray) -> float:
    """Fraction of all routes of the traces (every position) that go to resident experts."""
    hot = total = 0
    for st in sts:
        n = st.layout.n_pos
        for lo in range(0, n, ROWS_PER_STEP):
            ids, valid = _rows(st.trace, lo, min(lo + ROWS_PER_STEP, n))
            cold = _cold(ids, valid, resident)
            routes = int(valid.sum()) * ids.shape[2]
            total += routes
            hot += routes - int(cold.sum())
    return hot / total if total else math.nan


def prefill_cold_per_token(sts: Sequence[SessionTrace], resident: np.ndarray, lo_new: int = 128,
                           hi_new: int = 511) -> list[tuple[int, float]]:
    """Per request with lo_new..hi_new new tokens: (n_new, cold routes per token and filled layer)."""
    out = []
    for st in sts:
        for r in st.layout.requests:
            if lo_new <= r.n_new <= hi_new:
                ids, valid = _rows(st.trace, r.start, r.decode_start)
                if valid.any():
                    out.append((r.n_new, float(_cold(ids, valid, resident).sum() / valid.sum())))
    return out


def distinct_cold_per_pass(sts: Sequence[SessionTrace], resident: np.ndarray, n_pass: int = 2048
                           ) -> list[float]:
    """Per full n_pass-token prefill pass (a request's new tokens in n_pass chunks): distinct cold experts per layer."""
    out = []
    for st in sts:
        for r in st.layout.requests:
            for lo in range(r.start, r.decode_start - n_pass + 1, n_pass):
                ids, valid = _rows(st.trace, lo, lo + n_pass)
                cold = _cold(ids, valid, resident)
                L, E = resident.shape
                layer = np.broadcast_to(np.arange(L)[None, :, None], ids.shape)
                touched = np.zeros(L * E, dtype=bool)
                touched[(layer[cold] * E + ids[cold])] = True
                filled = valid.all(axis=0)  # layers computed at every position of the pass
                if filled.any():
                    out.append(float(touched.reshape(L, E).sum(axis=1)[filled].mean()))
    return out


def decode_any_cold(sts: Sequence[SessionTrace], resident: np.ndarray) -> np.ndarray:
    """Per layer, the probability that a decode step (generated position) has at least one cold route."""
    L = resident.shape[0]
    hit = np.zeros(L)
    n = np.zeros(L)
    for st in sts:
        for r in st.layout.requests:
            for lo in range(r.decode_start, r.end, ROWS_PER_STEP):
                ids, valid = _rows(st.trace, lo, min(lo + ROWS_PER_STEP, r.end))
                hit += (_cold(ids, valid, resident).any(axis=2) & valid).sum(axis=0)
                n += valid.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, hit / np.maximum(n, 1), np.nan)


@dataclass(frozen=True)
class Target:
    """One routing fact: the paper's value, the accepted range and what a trace set gives."""

    name: str
    description: str
    paper: float
    lo: float
    hi: float
    value: float

    @property
    def ok(self) -> bool:
        return self.lo <= self.value <= self.hi


@dataclass(frozen=True)
class RoutingFacts:
    """The Section 2.3 numbers for one set of development and held-out traces."""

    n_pairs: int
    coverage_top44: float       # held-out routes on the top 44% (N = n_resident_decode) by development frequency
    n_resident_decode: int
    n_resident_prefill: int
    prefill_cold: list[tuple[int, float]]  # (n_new, cold routes per token and layer), prefills 128-511
    cold_per_layer: float       # cold experts per layer with n_resident_decode resident
    pass_distinct_cold: list[float]         # distinct cold experts per layer, per 2048-token pass
    decode_q: list[float]       # per layer, P(any cold route) in a decode step, n_resident_decode resident

    def targets(self) -> list[Target]:
        """Paper value vs this trace set, with the tolerances the calibration is held to."""
        pc = [v for _, v in self.prefill_cold]
        touched = float(np.mean(self.pass_distinct_cold)) if self.pass_distinct_cold else math.nan
        q = float(np.nanmean(self.decode_q)) if len(self.decode_q) else math.nan
        return [
            Target("coverage_top44", f"held-out routes on the top {self.n_resident_decode} of {self.n_pairs} "
                   "experts by development frequency", 0.84, 0.82, 0.86, self.coverage_top44),
            Target("prefill_cold_per_token", f"cold routes per token and layer, prefills of 128-511 new tokens, "
                   f"{self.n_resident_prefill} resident (mean over requests)", 0.935, 0.92, 0.95,
                   float(np.mean(pc)) if pc else math.nan),
            Target("pass2048_distinct_cold", f"distinct cold experts per layer touched by a 2,048-token pass, "
                   f"{self.n_resident_decode} resident (of {self.cold_per_layer:.0f} cold per layer)",
                   117.0, 117.0 * 0.9, 117.0 * 1.1, touched),
            Target("cold_per_layer", f"cold experts per layer with {self.n_resident_decode} resident", 143.0,
                   142.0, 144.0, self.cold_per_layer),
            Target("decode_any_cold", f"mean over layers of P(a decode step has a cold route), "
                   f"{self.n_resident_decode} resident", 0.589, 0.54, 0.64, q),
        ]

    def to_json(self) -> dict:
        d = asdict(self)
        d["targets"] = [dict(asdict(t), ok=t.ok) for t in self.targets()]
        return d


# The paper's model: 43 MoE layers x 256 experts, of which 4,864 (44%) and 5,702 are resident.
PAPER_PAIRS = 43 * 256


def routing_facts(dev: Sequence[SessionTrace], heldout: Sequence[SessionTrace], n_resident_decode: int = 4864,
                  n_resident_prefill: int = 5702, n_pass: int = 2048, scale_from: int | None = None
                  ) -> RoutingFacts:
    """Rank experts on the development traces and measure the held-out traces against that residency.

    With `scale_from` (e.g. PAPER_PAIRS) the resident counts are shares of that many experts, applied to the
    traces' own (layer, expert) pairs: a model of 8 x 256 experts keeps 905 of 2,048 for the paper's 4,864."""
    counts = expert_counts(st.trace for st in dev)
    n_pairs = int((counts.sum(axis=1) > 0).sum()) * counts.shape[1]
    if scale_from:
        n_resident_decode = int(round(n_resident_decode * n_pairs / scale_from))
        n_resident_prefill = int(round(n_resident_prefill * n_pairs / scale_from))
    res_d = resident_mask(counts, n_resident_decode)
    res_p = resident_mask(counts, n_resident_prefill)
    moe = counts.sum(axis=1) > 0
    q = decode_any_cold(heldout, res_d)[moe]
    return RoutingFacts(
        n_pairs=n_pairs,
        coverage_top44=route_coverage(heldout, res_d),
        n_resident_decode=n_resident_decode,
        n_resident_prefill=n_resident_prefill,
        prefill_cold=prefill_cold_per_token(heldout, res_p),
        cold_per_layer=float((~res_d[moe]).sum(axis=1).mean()),
        pass_distinct_cold=distinct_cold_per_pass(heldout, res_d, n_pass),
        decode_q=[float(x) for x in q],
    )


def open_trace_dir(directory: str | os.PathLike, layouts: Sequence[SessionLayout],
                   exact: bool = False) -> list[SessionTrace]:
    """The traces of `layouts` in a directory (`<session, / → __>.route`), each checked; errors name the file.
    `exact`: the layouts come from the directory's manifest, which states each trace's positions."""
    from ostinato.routing.trace import trace_filename
    directory = Path(directory)
    out = []
    for lay in layouts:
        p = directory / trace_filename(lay.session)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no routing trace for session {lay.session}")
        out.append(open_session_trace(p, lay, exact))
    return out
