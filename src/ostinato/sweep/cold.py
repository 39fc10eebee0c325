"""Cold routes per token and MoE layer: the routes a placement leaves to host memory (the paper's Figure 7c)."""

from __future__ import annotations

import numpy as np

from ostinato.models.gguf_shape import MoeShape
from ostinato.presets import CACHE_MAX_PASS, FLOOR_PRESET, PLAN_RULES
from ostinato.residency.caches import DecayCache, LruCache
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


def _cache_decode_misses(name: str, trace: RoutingTrace, hot: np.ndarray, lo: int, hi: int) -> float:
    """Mean misses per (decode step, MoE layer) of a cache warmed with `hot`, one step per position in [lo, hi)."""
    layers = trace.moe_layers()
    ids = np.asarray(trace.ids[lo:hi]).astype(np.int64)
    misses = 0
    if name == "llama.cpp-expert-cache":
        warm = [(int(l), int(e)) for l, e in np.argwhere(hot)]
        c = LruCache(len(warm), warm)
        for row in ids:
            misses += sum(c.serve(il, list(dict.fromkeys(row[il].tolist()))).misses for il in layers)
    else:
        d = DecayCache(hot)
        for row in ids:
            misses += sum(x.misses for x in d.step({il: list(dict.fromkeys(row[il].tolist())) for il in layers}).values())
    return misses / (ids.shape[0] * len(layers))


def cold_routes_of(name: str, trace: RoutingTrace, shape: MoeShape, n_gpu_layers: int,
                   plans: dict[str, tuple[object, np.ndarray]], prefill: tuple[int, int],
                   decode: tuple[int, int]) -> dict:
    """Cold routes per token and layer of one engine preset in the sweep's prefills and decode steps, with the
    experts it keeps on the GPU. Prefills of more than CACHE_MAX_PASS tokens compute every route of the caches and of
    native prefill on the CPU; the caches' decode counts their misses (llama.cpp-expert-cache uploads them)."""
    moe = shape.moe_layers()
    none = whole_layer_hot(shape.n_layer, shape.n_expert, [])
    if name == "llama.cpp-layers":
        hot = whole_layer_hot(shape.n_layer, shape.n_expert, moe[len(moe) - n_gpu_layers:])
    elif name == FLOOR_PRESET:
        hot = whole_layer_hot(shape.n_layer, shape.n_expert, moe)
    elif name in PLAN_RULES:
        hot = plans[PLAN_RULES[name]][1]
    else:
        hot = none
    native = name in ("llama.cpp-expert-cache", "buun", "ostinato-native-prefill", "ostinato-native-prefill-overlap")
    out = {"prefill": cold_per_token_layer(trace, none if native else hot, *prefill),
           "decode": cold_per_token_layer(trace, hot, *decode), "resident_experts": int(hot.sum())}
    if name in ("llama.cpp-expert-cache", "buun"):
        out["decode"] = _cache_decode_misses(name, trace, hot, *decode)
        out["decode_misses_to"] = "gpu (uploaded)" if name == "llama.cpp-expert-cache" else "cpu"
        out["prefill_served_up_to"] = CACHE_MAX_PASS if name == "llama.cpp-expert-cache" else 1
    if name in ("ostinato-borrow", "ostinato-graph-borrow"):
        # decode steps compute some of the plan's cold routes on borrowed slots: the engine counts them (GET /residency)
        out["decode_counts"] = "the plan's cold routes, borrowed slots not subtracted"
    return out
