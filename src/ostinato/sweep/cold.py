"""Cold routes per token and MoE layer: the routes a placement leaves to host memory (the paper's Figure 7c)."""

from __future__ import annotations

import numpy as np

from ostinato.routing.trace import RoutingTrace


def cold_per_token_layer(trace: RoutingTrace, hot: np.ndarray, lo: int, hi: int) -> float:
    """Mean number of routes per (token, MoE layer) whose expert is not resident, over positions [lo, hi)."""
    ids = trace.ids[lo:hi]
    layers = trace.moe_layers()
    if ids.shape[0] == 0 or not layers:
        raise ValueError(f"no positions in [{lo}, {hi}) or no MoE layer in the trace")
    cold = 0
    for il in layers:
        cold += int((~hot[il][ids[:, il, :].astype(np.int64)]).sum())
    return cold / (ids.shape[0] * len(layers))


def whole_layer_hot(n_layer: int, n_expert: int, gpu_layers: list[int]) -> np.ndarray:
    """Resident mask of whole-layer placement: every expert of the listed layers, none elsewhere."""
    hot = np.zeros((n_layer, n_expert), dtype=bool)
    hot[gpu_layers] = True
    return hot
