"""Prefill paths (Prop 3.2, Lemma B.3): distinct cold experts u(n) from traces, and the single threshold Np.

The expected cost difference split - upload of an n-token pass is Phi(n) = phi0 + phi1 n - phi2 u(n), with
phi0 < 0 (setup), phi1 > 0 (CPU-minus-GPU cost of a token's cold routes), phi2 = w/B (upload time of one
expert). With u nondecreasing and concave, Phi is convex from Phi(0) < 0 and changes sign once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def _window_miss(ids_l: np.ndarray, cold: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """For one layer: sum over cold experts of the number of n-windows that miss the expert, per n in grid."""
    t = ids_l.shape[0]
    cold_ids = np.flatnonzero(cold)
    if t == 0 or cold_ids.size == 0:
        return np.zeros(grid.shape, dtype=float)
    pos = np.repeat(np.arange(t), ids_l.shape[1])
    e = ids_l.reshape(-1).astype(np.int64)
    keep = (e >= 0) & (e < cold.size)
    keep[keep] = cold[e[keep]]
    pos, e = pos[keep], e[keep]
    pairs = np.unique(e * t + pos)               # distinct (expert, position), sorted by expert then position
    e, pos = pairs // t, pairs % t
    first = np.r_[True, e[1:] != e[:-1]]
    last = np.r_[e[1:] != e[:-1], True]
    gaps = [pos[first],                          # before the first occurrence
            (t - 1 - pos[last]),                 # after the last
            (pos[1:] - pos[:-1] - 1)[~first[1:]]]  # between consecutive occurrences of one expert
    n_absent = cold_ids.size - int(first.sum())
    g = np.sort(np.concatenate(gaps + [np.full(n_absent, t)]).astype(np.int64))
    # sum over gaps of max(0, g - n + 1) = sum_{g >= n} g - (n - 1) * #{g >= n}
    csum = np.r_[np.cumsum(g[::-1])[::-1], 0]
    idx = np.searchsorted(g, grid, side="left")
    return csum[idx] - (grid - 1) * (g.size - idx)


def distinct_cold(segments: Sequence[np.ndarray], hot: np.ndarray, grid: Sequence[int]) -> np.ndarray:
    """u(n) per layer: expected distinct cold experts in n consecutive positions of a segment (all windows).

    segments: arrays ids [n_pos, n_layer, k] (e.g. one per request); hot: [n_layer, n_expert] residency mask.
    Returns [len(grid), n_layer]; exact average over every window that fits in a segment (Lemma B.3's u bar).
    """
    grid = np.asarray(grid, dtype=np.int64)
    if np.any(grid < 1):
        raise ValueError("window lengths must be >= 1")
    n_layer = hot.shape[0]
    n_cold = (~hot).sum(axis=1).astype(float)
    miss = np.zeros((grid.size, n_layer))
    windows = np.zeros(grid.size)
    for seg in segments:
        seg = np.asarray(seg)
        w = np.maximum(seg.shape[0] - grid + 1, 0).astype(float)
        ok = w > 0
        windows += w
        for il in range(n_layer):
            miss[ok, il] += _window_miss(seg[:, il, :], ~hot[il], grid)[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        u = n_cold[None, :] - miss / windows[:, None]
    return u  # NaN where no segment is as long as n


def is_concave(u: np.ndarray, tol: float = 1e-9) -> bool:
    """u on consecutive n = 0, 1, 2, ...: nondecreasing with nonincreasing increments."""
    d = np.diff(np.asarray(u, dtype=float))
    return bool(np.all(d >= -tol) and np.all(np.diff(d) <= tol))


@dataclass(frozen=True)
class Threshold:
    """The switch point: split path for n < n_star, upload for n >= n_star; sign changes of Phi on the grid."""

    n_star: int | None
    sign_changes: int


def threshold_from_phi(phi0: float, phi1: float, phi2: float, u: np.ndarray) -> Threshold:
    """Prop 3.2 on u(n) for n = 0..len(u)-1: n* = min{n: Phi(n) >= 0}, and how often Phi changes sign."""
    n = np.arange(len(u))
    return threshold_from_diff(n, phi0 + phi1 * n - phi2 * np.asarray(u, dtype=float))


def threshold_from_diff(n: np.ndarray, diff_ms: np.ndarray) -> Threshold:
    """First n where split - upload >= 0 (upload no slower), from sampled cost curves."""
    s = np.sign(np.asarray(diff_ms, dtype=float))
    s = s[s != 0] if np.any(s != 0) else s
    changes = int(np.sum(s[1:] != s[:-1])) if s.size > 1 else 0
    at = np.flatnonzero(np.asarray(diff_ms) >= 0)
    return Threshold(int(np.asarray(n)[at[0]]) if at.size else None, changes)


@dataclass(frozen=True)
class PrefillCosts:
    """Linear path costs of an n-token pass (ms), summed over layers.

    split(n)  = split_setup + cpu_route * r(n) + gpu_route * (routes(n) - r(n))
    upload(n) = upload_setup + upload_expert * u(n) + gpu_route * routes(n)
    with routes(n) = k n L, r(n) = cold_share k n L and u(n) the distinct cold experts over all layers.
    """

    split_setup_ms: float
    upload_setup_ms: float
    cpu_route_ms: float
    gpu_route_ms: float
    upload_expert_ms: float

    def phis(self, cold_routes_per_token: float) -> tuple[float, float, float]:
        """(phi0, phi1, phi2) of Prop 3.2 for a given number of cold routes per token (all layers)."""
        return (self.split_setup_ms - self.upload_setup_ms,
                (self.cpu_route_ms - self.gpu_route_ms) * cold_routes_per_token, self.upload_expert_ms)

    def split_ms(self, n: np.ndarray, cold_routes_per_token: float, routes_per_token: float) -> np.ndarray:
        """Split-path cost of n-token passes."""
        n = np.asarray(n, dtype=float)
        r = cold_routes_per_token * n
        return self.split_setup_ms + self.cpu_route_ms * r + self.gpu_route_ms * (routes_per_token * n - r)

    def upload_ms(self, n: np.ndarray, u_total: np.ndarray, routes_per_token: float) -> np.ndarray:
        """Upload-path cost of n-token passes with u_total distinct cold experts."""
        n = np.asarray(n, dtype=float)
        return self.upload_setup_ms + self.upload_expert_ms * np.asarray(u_total) + self.gpu_route_ms * routes_per_token * n


@dataclass(frozen=True)
class ThresholdEstimate:
    """Np from traces: the grid, u(n) summed over layers, both cost curves and the switch point."""

    n: np.ndarray
    u_total: np.ndarray
    split_ms: np.ndarray
    upload_ms: np.ndarray
    cold_routes_per_token: float
    threshold: Threshold


def threshold_from_traces(segments: Sequence[np.ndarray], hot: np.ndarray, costs: PrefillCosts,
                          grid: Sequence[int]) -> ThresholdEstimate:
    """Prop 3.2 on traces: u(n) and cold routes per token from the segments, the cost curves, and Np."""
    grid = np.asarray(grid, dtype=np.int64)
    u = distinct_cold(segments, hot, grid)
    u_total = np.nansum(u, axis=1)
    u_total[np.isnan(u).all(axis=1)] = np.nan
    from ostinato.costmodel.decode import cold_routes
    n_tok = sum(len(s) for s in segments)
    cold = sum(int(cold_routes(np.asarray(s), hot).sum()) for s in segments)
    k = int(np.asarray(segments[0]).shape[2]) if len(segments) else 0
    cpt = cold / max(n_tok, 1)
    rpt = k * hot.shape[0]
    split = costs.split_ms(grid, cpt, rpt)
    up = costs.upload_ms(grid, u_total, rpt)
    ok = ~np.isnan(u_total)
    return ThresholdEstimate(grid, u_total, split, up, cpt, threshold_from_diff(grid[ok], (split - up)[ok]))
