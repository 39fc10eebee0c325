"""Plan summary: experts per layer and GPU, and the share of development and held-out routes the plan covers."""

from __future__ import annotations

import numpy as np

from ostinato.residency.profile import RouteCounts


def plan_summary(hot: np.ndarray, layer_gpu: np.ndarray, dev: RouteCounts,
                 heldout: RouteCounts | None = None) -> dict:
    """A JSON-ready summary of a residency set against the development (and held-out) route counts."""
    layers = dev.moe_layers()
    n_moe_experts = int(layers.size * hot.shape[1])
    layer_gpu = np.asarray(layer_gpu)[: hot.shape[0]]
    per_gpu = {int(j): int(hot[layer_gpu == j].sum()) for j in np.unique(layer_gpu[layers]) if j >= 0}
    out = {
        "n_resident": int(hot.sum()),
        "resident_share_of_experts": float(hot.sum() / n_moe_experts) if n_moe_experts else float("nan"),
        "experts_per_gpu": per_gpu,
        "experts_per_layer": {int(il): int(hot[il].sum()) for il in layers},
        "experts_per_layer_mean": float(hot[layers].sum(axis=1).mean()) if layers.size else float("nan"),
        "dev_routes": dev.total_routes(),
        "dev_coverage": dev.coverage(hot),
        "dev_coverage_per_layer": {int(il): float(dev.counts[il, hot[il]].sum() / max(dev.counts[il].sum(), 1))
                                   for il in layers},
    }
    if heldout is not None:
        if heldout.counts.shape != hot.shape:
            raise ValueError("held-out profile shape differs from the plan's")
        out["heldout_routes"] = heldout.total_routes()
        out["heldout_coverage"] = heldout.coverage(hot)
    return out
