"""Decode-step analysis of a residency set on a routing trace: mu, q, Eq. (1), the Prop 3.1 bound, U, Prop B.2."""

from __future__ import annotations

import numpy as np

from ostinato.costmodel.decode import (LayerCosts, capacity_increment, cold_routes, eq1_step_ms, mu_q,
                                       overlap_hideable_ms, prop31_bound_ms, residency_part_ms, step_ms)
from ostinato.costmodel.params import ModelCosts


def layer_costs_for(m: ModelCosts, expert_bytes: np.ndarray) -> LayerCosts:
    """Costs of the given MoE layers, matched to a size class by expert bytes (one class: all layers)."""
    if len(m.classes) == 1:
        return LayerCosts.uniform(len(expert_bytes), m.classes[0].costs)
    by_size = {c.expert_bytes: c.costs for c in m.classes}
    try:
        return LayerCosts.from_branches([by_size[int(b)] for b in expert_bytes])
    except KeyError as exc:
        raise ValueError(f"no size class of {m.name} has experts of {exc.args[0]} bytes") from None


def decode_analysis(ids: np.ndarray, hot: np.ndarray, c: LayerCosts, chunk: int = 65536) -> dict:
    """Per-step statistics of decode positions ids [n_step, n_layer, k] (MoE layers only) under mask hot."""
    r = np.concatenate([cold_routes(np.asarray(ids[a:a + chunk]), hot) for a in range(0, len(ids), chunk)]) \
        if len(ids) else np.zeros((0, hot.shape[0]), dtype=int)
    mu, q = mu_q(r)
    return {
        "n_step": int(r.shape[0]),
        "mu_sum": float(mu.sum()), "q_mean": float(q.mean()),
        "eq1_step_ms": eq1_step_ms(mu, q, c),
        "direct_overlap_step_ms": float(step_ms(r, c, True).mean()),
        "direct_sequential_step_ms": float(step_ms(r, c, False).mean()),
        "F_ms": residency_part_ms(mu, q, c),
        "prop31_bound_ms": prop31_bound_ms(q, c),
        "prop31_bound_loose_ms": float(np.max(c.delta) * q.sum()),
        "sum_delta_ms": float(c.delta.sum()),
        "U_ms": overlap_hideable_ms(r, c),
        "_mu": mu, "_q": q,
    }


def increment_analysis(ids: np.ndarray, hot_small: np.ndarray, hot_large: np.ndarray, c: LayerCosts,
                       delta_max: float | None = None) -> dict:
    """Prop B.2 between two nested residency sets on the same decode steps."""
    if np.any(hot_small & ~hot_large):
        raise ValueError("Prop B.2 needs nested sets: the small set has experts the large one lacks")
    a = decode_analysis(ids, hot_small, c)
    b = decode_analysis(ids, hot_large, c)
    inc = capacity_increment(a["_mu"], a["_q"], b["_mu"], b["_q"], c, delta_max)
    return {"d_mu": inc.d_mu, "d_f0_ms": inc.d_f0_ms, "d_f_ms": inc.d_f_ms, "upper_ms": inc.upper_ms,
            "within": inc.within, "n_small": int(hot_small.sum()), "n_large": int(hot_large.sum())}
