"""Routing profile: per (layer, expert) route counts of development sessions, from routing trace files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.routing.trace import RoutingTrace, TraceShape, read_trace

PROFILE_FORMAT = "ostinato-routing-profile"
PROFILE_VERSION = 1


@dataclass
class RouteCounts:
    """Route counts [n_layer, n_expert] (int64) over n_pos positions; sources name the traces counted."""

    shape: TraceShape
    counts: np.ndarray
    n_pos: int = 0
    sources: list[str] = field(default_factory=list)

    def moe_layers(self) -> np.ndarray:
        """Layers with at least one route."""
        return np.flatnonzero(self.counts.sum(axis=1) > 0)

    def total_routes(self) -> int:
        """All counted routes."""
        return int(self.counts.sum())

    def coverage(self, hot: np.ndarray) -> float:
        """Share of the profile's routes that land on hot experts (hot: bool [n_layer, n_expert])."""
        t = self.counts.sum()
        return float(self.counts[hot].sum() / t) if t else float("nan")

    def sha256(self) -> str:
        """Digest of shape and counts, to tie a plan to the profile it came from."""
        h = hashlib.sha256()
        h.update(np.array([self.shape.n_layer, self.shape.n_expert, self.shape.n_expert_used], "<i8").tobytes())
        h.update(np.ascontiguousarray(self.counts, dtype="<i8").tobytes())
        return h.hexdigest()


def count_routes(trace: RoutingTrace, positions: slice | np.ndarray | None = None,
                 chunk: int = 65536) -> np.ndarray:
    """Route counts [n_layer, n_expert] of one trace (optionally some positions); "none" ids are ignored."""
    s = trace.shape
    ids = trace.ids if positions is None else trace.ids[positions]
    counts = np.zeros(s.n_layer * s.n_expert, dtype=np.int64)
    layer_off = (np.arange(s.n_layer, dtype=np.int64) * s.n_expert)[None, :, None]
    for a in range(0, ids.shape[0], chunk):  # ids checked by read_trace (ostinato.routing.trace.check_rows)
        block = np.asarray(ids[a:a + chunk]).astype(np.int64)
        valid = block != s.none_id
        counts += np.bincount((block + layer_off)[valid], minlength=counts.size)
    return counts.reshape(s.n_layer, s.n_expert)


def profile_from_traces(paths: Iterable[str | os.PathLike]) -> RouteCounts:
    """Sum the route counts of several trace files of one model shape."""
    prof: RouteCounts | None = None
    for p in paths:
        t = read_trace(p)
        if prof is None:
            prof = RouteCounts(t.shape, np.zeros((t.shape.n_layer, t.shape.n_expert), np.int64))
        elif t.shape != prof.shape:
            raise ValueError(f"{p}: shape {t.shape} differs from the first trace's {prof.shape}")
        prof.counts += count_routes(t)
        prof.n_pos += t.n_pos
        prof.sources.append(str(p))
    if prof is None:
        raise ValueError("no routing traces given")
    if prof.total_routes() == 0:
        raise InputError(f'{", ".join(prof.sources)}: no routing to count ({prof.n_pos} positions, every row "no expert")')
    return prof


def write_profile(path: str | os.PathLike, prof: RouteCounts) -> None:
    """Write a profile as JSON: format, version, shape, n_pos, sources, counts (list of rows), sha256."""
    doc = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION,
           "n_layer": prof.shape.n_layer, "n_expert": prof.shape.n_expert,
           "n_expert_used": prof.shape.n_expert_used, "n_pos": prof.n_pos, "sources": prof.sources,
           "sha256": prof.sha256(), "counts": prof.counts.tolist()}
    with atomic_open(Path(path), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def read_profile(path: str | os.PathLike) -> RouteCounts:
    """Read a profile written by write_profile, checking format, version, shape, counts and digest."""
    doc = load_json(path, f"a routing profile ({PROFILE_FORMAT} version {PROFILE_VERSION})")
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT or doc.get("version") != PROFILE_VERSION:
        raise InputError(f"{path}: not a {PROFILE_FORMAT} version {PROFILE_VERSION} file")
    dims = [doc.get(k) for k in ("n_layer", "n_expert", "n_expert_used", "n_pos")]
    if any(type(v) is not int or v < 0 for v in dims) or not 1 <= dims[2] <= dims[1] or dims[0] < 1:
        raise InputError(f"{path}: keys 'n_layer', 'n_expert', 'n_expert_used', 'n_pos': expected integers with "
                         f"n_layer >= 1 and 1 <= n_expert_used <= n_expert, got {dims}")
    shape = TraceShape(dims[0], dims[1], dims[2])
    rows = doc.get("counts")
    if (not isinstance(rows, list) or len(rows) != shape.n_layer
            or any(not isinstance(r, list) or len(r) != shape.n_expert for r in rows)
            or any(type(c) is not int or not 0 <= c < 2**63 for r in rows for c in r)):
        raise InputError(f"{path}: key 'counts': expected {shape.n_layer} rows of {shape.n_expert} counts >= 0")
    counts = np.asarray(rows, dtype=np.int64).reshape(shape.n_layer, shape.n_expert)
    prof = RouteCounts(shape, counts, dims[3], [str(x) for x in doc.get("sources") or []])
    if doc.get("sha256") and doc["sha256"] != prof.sha256():
        raise InputError(f"{path}: counts do not match the stored sha256")
    return prof
