"""Synthetic routing calibrated to the paper's routing facts, written as traces the engine can be forced to follow.

Model (per MoE layer ℓ, expert e): a base logit from the layer's ranking (normal scores scaled by a
per-layer skew), plus a workload drift, a session drift and the logit of the current *topic* (a few
per model; a session switches topic at random, every `segment_len` tokens on average, which gives
neighbouring tokens shared experts). Prefill and decode tokens use the same logits at different
temperatures (decode is more concentrated). A token's k experts are drawn without replacement in
proportion to exp(logit) (sequential draws, i.e. Plackett-Luce), vectorized by inverse-CDF lookups.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np

from ostinato.routing.layout import SessionLayout
from ostinato.routing.shapes import ModelShape
from ostinato.routing.trace import RoutingTrace, open_trace_stream

CHUNK = 4096  # positions per vectorized step; fixed so output does not depend on memory settings


@dataclass(frozen=True)
class RoutingProfile:
    """Parameters of the synthetic router; `calibrated` is tuned to REFERENCE.md's routing facts."""

    name: str = "calibrated"
    skew: float = 1.4            # spread of the per-layer base logits above the knee (higher: more skewed)
    knee: float = 0.3            # normal score of the rank where the flatter tail starts
    tail_skew: float = 0.3       # spread below the knee (lower: flatter cold tail)
    layer_skew_sigma: float = 0.15  # per-layer variation of the skew (lognormal): layers differ
    rare_frac: float = 0.12      # fraction of each layer's lowest-ranked experts that are rarely routed
    rare_drop: float = 4.0       # logit penalty of those rare experts
    prefill_temp: float = 0.88   # logit scale for prompt tokens (flatter)
    decode_temp: float = 1.17    # logit scale for generated tokens (more concentrated)
    decode_sigma: float = 0.0    # spread of decode-only logit offsets (generated text prefers other experts)
    n_topics: int = 16           # topic logit vectors of the model (shared by workloads)
    topic_sigma: float = 1.0     # spread of a topic's logits
    segment_len: float = 256.0   # mean tokens between topic switches (locality of neighbouring tokens)
    session_sigma: float = 0.15  # per-session drift of the logits (rankings stable across sessions)
    workload_sigma: float = 0.2  # per-workload drift (some drift between workloads)

    def to_json(self) -> dict:
        return asdict(self)


PROFILES: dict[str, RoutingProfile] = {"calibrated": RoutingProfile()}


def _stable(text: str) -> int:
    """A process-independent 32-bit key for a name (Python's hash() is salted)."""
    return zlib.crc32(text.encode("utf-8"))


def layer_rankings(shape: ModelShape, seed: int) -> np.ndarray:
    """Per MoE layer, the experts from most to least routed: seed lists first, the rest in seeded random order."""
    rng = np.random.default_rng([seed, 0, _stable(shape.name)])
    hot: tuple[tuple[int, ...], ...] = ()
    if shape.ranking_seed == "moe-l2-v4flash":
        from ostinato.routing.hot_v4flash import V4FLASH_HOT
        hot = V4FLASH_HOT
    ranks = np.empty((len(shape.moe_layers), shape.n_expert), dtype=np.int64)
    for i in range(len(shape.moe_layers)):
        head = [e for e in (hot[i] if i < len(hot) else ()) if e < shape.n_expert]
        rest = np.setdiff1d(np.arange(shape.n_expert), head)
        ranks[i] = np.concatenate([np.asarray(head, dtype=np.int64), rng.permutation(rest)])
    return ranks


def base_logits(shape: ModelShape, profile: RoutingProfile, seed: int) -> np.ndarray:
    """[n_moe, n_expert] logits: normal scores by rank, scaled by a per-layer skew."""
    rng = np.random.default_rng([seed, 1, _stable(shape.name)])
    n = shape.n_expert
    z = np.array([NormalDist().inv_cdf(1.0 - (r + 0.5) / n) for r in range(n)])
    skews = profile.skew * np.exp(profile.layer_skew_sigma * rng.standard_normal(len(shape.moe_layers)))
    ranks = layer_rankings(shape, seed)
    rare = np.arange(n) >= n - int(round(profile.rare_frac * n))
    out = np.empty((len(shape.moe_layers), n))
    for i in range(len(shape.moe_layers)):
        kz = profile.knee
        shaped = np.where(z > kz, profile.skew * z, profile.skew * kz + profile.tail_skew * (z - kz))
        shaped = shaped * (skews[i] / profile.skew)
        out[i, ranks[i]] = shaped - profile.rare_drop * rare
    return out


def _cdf_tables(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax CDFs over the last axis, the last entry exactly 1."""
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    c = np.cumsum(p, axis=-1)
    c /= c[..., -1:]
    c[..., -1] = 1.0
    return c


@dataclass
class SessionRouter:
    """The routing tables of one session: CDFs [kind (0 prefill, 1 decode), topic, layer, expert]."""

    shape: ModelShape
    cdf: np.ndarray
    rng: np.random.Generator
    segment_len: float
    _guide: tuple | None = field(default=None, repr=False)

    @classmethod
    def build(cls, shape: ModelShape, profile: RoutingProfile, workload: str, session: str,
              seed: int) -> SessionRouter:
        """Combine base, workload, session and topic logits for one session (deterministic in its names)."""
        L, E = len(shape.moe_layers), shape.n_expert
        base = base_logits(shape, profile, seed)
        rw = np.random.default_rng([seed, 2, _stable(shape.name), _stable(workload)])
        drift_w = profile.workload_sigma * rw.standard_normal((L, E))
        rt = np.random.default_rng([seed, 5, _stable(shape.name)])  # topics belong to the model, shared by workloads
        topics = profile.topic_sigma * rt.standard_normal((profile.n_topics, L, E))
        rs = np.random.default_rng([seed, 3, _stable(shape.name), _stable(workload), _stable(session)])
        drift_s = profile.session_sigma * rs.standard_normal((L, E))
        rk = np.random.default_rng([seed, 4, _stable(shape.name)])
        kind = np.stack([np.zeros((L, E)), profile.decode_sigma * rk.standard_normal((L, E))])  # [2, L, E]
        logits = (base + drift_w + drift_s)[None, None] + topics[None] + kind[:, None]  # [2, T, L, E]
        temps = np.array([profile.prefill_temp, profile.decode_temp])[:, None, None, None]
        return cls(shape, _cdf_tables(temps * logits), rs, profile.segment_len)

    def topics(self, n_pos: int) -> np.ndarray:
        """The topic of each position: a new random topic starts with probability 1/segment_len."""
        n_topics = self.cdf.shape[1]
        starts = self.rng.random(n_pos) < 1.0 / max(self.segment_len, 1.0)
        if n_pos:
            starts[0] = True
        seg = np.cumsum(starts) - 1
        return self.rng.integers(0, n_topics, int(seg[-1]) + 1 if n_pos else 0)[seg]

    def draw(self, kinds: np.ndarray, topics: np.ndarray) -> np.ndarray:
        """k distinct experts per (position, MoE layer): [n, n_moe, k] expert ids."""
        K, T, L, E = self.cdf.shape
        k = self.shape.n_expert_used
        table = ((kinds.astype(np.int64)[:, None] * T + topics[:, None]) * L + np.arange(L)[None]).ravel()
        out = np.empty((table.size, k), dtype=np.int64)
        todo = np.arange(table.size)
        n_cand = k + 3
        while todo.size:
            t = np.repeat(table[todo], n_cand)
            cand = self._inverse_cdf(t, self.rng.random(t.size)).reshape(todo.size, n_cand)
            dup = np.zeros(cand.shape, dtype=bool)
            for j in range(1, n_cand):
                dup[:, j] = (cand[:, :j] == cand[:, j:j + 1]).any(axis=1)
            fresh = ~dup
            ok = fresh.sum(axis=1) >= k
            take = fresh[ok] & (np.cumsum(fresh[ok], axis=1) <= k)
            out[todo[ok]] = cand[ok][take].reshape(-1, k)
            todo = todo[~ok]
            n_cand *= 2
        return out.reshape(kinds.size, L, k)

    def _inverse_cdf(self, table: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Expert index with cdf[i-1] <= u < cdf[i] in each row's table, via a guide table then short scans."""
        flat, guide, E, G = self._flat_cdf()
        base = table * E
        idx = guide[table, (u * G).astype(np.int64)]
        rows = np.flatnonzero(flat[base + idx] <= u)
        while rows.size:
            idx[rows] += 1
            rows = rows[flat[base[rows] + idx[rows]] <= u[rows]]
        return idx

    def _flat_cdf(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The CDFs as one row per table and, per table, the first index whose cdf exceeds each g/G."""
        if self._guide is None:
            E = self.cdf.shape[-1]
            G = 4 * E
            flat = self.cdf.reshape(-1, E)
            grid = np.arange(G) / G
            guide = np.stack([np.searchsorted(row, grid, side="right") for row in flat])
            self._guide = (flat.ravel(), np.minimum(guide, E - 1), E, G)
        return self._guide


def iter_session_ids(shape: ModelShape, layout: SessionLayout, profile: RoutingProfile, workload: str,
                     seed: int) -> Iterator[np.ndarray]:
    """Yield the session's trace rows [n, n_layer, k] chunk by chunk (every MoE layer of every position filled)."""
    router = SessionRouter.build(shape, profile, workload, layout.session, seed)
    ts = shape.trace_shape
    decode = layout.decode_mask()
    topics = router.topics(layout.n_pos)
    layers = np.asarray(shape.moe_layers)
    for lo in range(0, layout.n_pos, CHUNK):
        hi = min(lo + CHUNK, layout.n_pos)
        ids = np.full((hi - lo, ts.n_layer, ts.n_expert_used), ts.none_id, dtype=ts.id_dtype)
        ids[:, layers, :] = router.draw(decode[lo:hi], topics[lo:hi])
        yield ids


def session_trace(shape: ModelShape, layout: SessionLayout, profile: RoutingProfile = PROFILES["calibrated"],
                  workload: str = "swe", seed: int = 0) -> RoutingTrace:
    """The whole session's synthetic trace in memory (small sessions, tests, notebooks)."""
    ts = shape.trace_shape
    chunks = list(iter_session_ids(shape, layout, profile, workload, seed))
    ids = np.concatenate(chunks) if chunks else np.zeros((0, ts.n_layer, ts.n_expert_used), ts.id_dtype)
    return RoutingTrace(ts, ids, synthetic=True)


def write_session_trace(path: str | Path, shape: ModelShape, layout: SessionLayout,
                        profile: RoutingProfile = PROFILES["calibrated"], workload: str = "swe", seed: int = 0,
                        progress=None) -> None:
    """Stream the session's synthetic trace to `path` (atomic; flagged synthetic); `progress` gets positions done."""
    with open_trace_stream(path, shape.trace_shape, layout.n_pos, synthetic=True) as out:
        for ids in iter_session_ids(shape, layout, profile, workload, seed):
            out.write(ids)
            if progress is not None:
                progress(ids.shape[0])
