"""Frequency-ranked residency (Prop 3.1): one pool per GPU shared by its layers, filled with its most-routed experts.

Experts of different sizes form size classes; for each feasible split of a GPU's pool bytes between the
classes, each class keeps its most-routed experts, and the split that covers the most routes wins (Appendix B).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Plan:
    """A residency set: hot mask, per-GPU slots in slot order (layer, expert), and how each pool was split."""

    hot: np.ndarray                      # bool [n_layer, n_expert]
    gpu_slots: list[np.ndarray]          # per GPU: int [n_slots, 2] of (layer, expert), sorted by layer then expert
    class_split: list[dict[int, int]]    # per GPU: expert bytes -> experts kept
    covered_routes: list[int]            # per GPU: profile routes on its hot experts

    @property
    def n_resident(self) -> int:
        return int(self.hot.sum())

    def experts_per_layer(self) -> np.ndarray:
        """Hot experts of each layer."""
        return self.hot.sum(axis=1)


def _ranked(counts: np.ndarray, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layer, expert, count) of the given layers' experts, most routed first; ties by layer, then expert."""
    lay = np.repeat(layers, counts.shape[1])
    exp = np.tile(np.arange(counts.shape[1]), layers.size)
    c = counts[layers].reshape(-1)
    order = np.lexsort((exp, lay, -c))
    return lay[order], exp[order], c[order]


def _best_split(prefix: list[np.ndarray], sizes: list[int], budget: int) -> tuple[list[int], int]:
    """Enumerate expert counts per class within budget bytes; return the counts covering most routes (then most experts)."""
    if len(sizes) == 1:
        n = min(prefix[0].size - 1, budget // sizes[0])
        return [n], int(prefix[0][n])
    # vectorise over the first class, recurse over the rest
    best: tuple[int, int, list[int]] | None = None
    for n0 in range(min(prefix[0].size - 1, budget // sizes[0]) + 1):
        rest, cov = _best_split(prefix[1:], sizes[1:], budget - n0 * sizes[0])
        key = (int(prefix[0][n0]) + cov, n0 + sum(rest))
        if best is None or key > best[:2]:
            best = (key[0], key[1], [n0] + rest)
    assert best is not None
    return best[2], best[0]


def _best_split_two(prefix: list[np.ndarray], sizes: list[int], budget: int) -> tuple[list[int], int]:
    """Two classes, vectorised: n1 all feasible values, n2 the most that still fits."""
    n1 = np.arange(min(prefix[0].size - 1, budget // sizes[0]) + 1)
    n2 = np.minimum(prefix[1].size - 1, (budget - n1 * sizes[0]) // sizes[1])
    cov = prefix[0][n1] + prefix[1][n2]
    i = int(np.lexsort((-(n1 + n2), -cov))[0])
    return [int(n1[i]), int(n2[i])], int(cov[i])


def _plan_arrays(counts, layer_gpu, expert_bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The planners' inputs as arrays (layer_gpu cut to the counted layers) and an empty residency mask."""
    counts = np.asarray(counts)
    layer_gpu = np.asarray(layer_gpu)[:counts.shape[0]]
    return counts, layer_gpu, np.asarray(expert_bytes, dtype=np.int64), np.zeros(counts.shape, dtype=bool)


def plan_frequency(counts: np.ndarray, layer_gpu: np.ndarray, expert_bytes: np.ndarray,
                   pool_bytes: list[int]) -> Plan:
    """Prop 3.1 with size classes: per GPU, the most-routed experts of its layers that fit in pool_bytes.

    counts [n_layer, n_expert] route counts; layer_gpu [n_layer] device of each layer (-1: CPU, no pool);
    expert_bytes [n_layer] one expert's bytes (0: layer without routed experts).
    """
    counts, layer_gpu, eb, hot = _plan_arrays(counts, layer_gpu, expert_bytes)
    slots, splits, covered = [], [], []
    for j, budget in enumerate(pool_bytes):
        layers = np.flatnonzero((layer_gpu == j) & (eb > 0))
        sizes = sorted({int(x) for x in eb[layers]})
        ranked = [_ranked(counts, layers[eb[layers] == s]) for s in sizes]
        prefix = [np.r_[0, np.cumsum(r[2], dtype=np.int64)] for r in ranked]
        if not sizes:
            n_keep, cov = [], 0
        elif len(sizes) == 2:
            n_keep, cov = _best_split_two(prefix, sizes, int(budget))
        else:
            n_keep, cov = _best_split(prefix, sizes, int(budget))
        for (lay, exp, _), n in zip(ranked, n_keep):
            hot[lay[:n], exp[:n]] = True
        on = np.argwhere(hot & (layer_gpu == j)[:, None])
        slots.append(on)                  # argwhere is row-major: sorted by layer, then expert
        splits.append({s: n for s, n in zip(sizes, n_keep)})
        covered.append(int(cov))
    return Plan(hot, slots, splits, covered)


def plan_uniform(counts: np.ndarray, layer_gpu: np.ndarray, expert_bytes: np.ndarray, pool_bytes: list[int]) -> Plan:
    """KTransformers' default placement at the same pool bytes: per GPU, the same number of experts in each of its
    MoE layers (the most that fits), each layer's most-routed ones."""
    counts, layer_gpu, eb, hot = _plan_arrays(counts, layer_gpu, expert_bytes)
    n_expert = counts.shape[1]
    slots, splits, covered = [], [], []
    for j, budget in enumerate(pool_bytes):
        layers = np.flatnonzero((layer_gpu == j) & (eb > 0))
        per_expert = int(eb[layers].sum())
        n = min(n_expert, int(budget) // per_expert) if per_expert else 0
        hot[layers] = plan_per_layer(counts, n, layers)[layers]
        slots.append(np.argwhere(hot & (layer_gpu == j)[:, None]))
        sizes = sorted({int(x) for x in eb[layers]})
        splits.append({s_: n * int((eb[layers] == s_).sum()) for s_ in sizes})
        covered.append(int(counts[layers][hot[layers]].sum()))
    return Plan(hot, slots, splits, covered)


# the rules of `ostinato residency plan --rule` (and of the presets' plans, ostinato.presets.PLAN_RULES)
PLAN_RULES = {"frequency": plan_frequency, "uniform": plan_uniform}


def plan_per_layer(counts: np.ndarray, per_layer: int, moe_layers: np.ndarray | None = None) -> np.ndarray:
    """A static uniform split (KTransformers' default placement): the per_layer most-routed experts of each layer."""
    counts = np.asarray(counts)
    layers = np.flatnonzero(counts.sum(axis=1) > 0) if moe_layers is None else np.asarray(moe_layers)
    hot = np.zeros(counts.shape, dtype=bool)
    for il in layers:
        order = np.lexsort((np.arange(counts.shape[1]), -counts[il]))
        hot[il, order[:per_layer]] = True
    return hot


def brute_force_best(counts: np.ndarray, layer_gpu: np.ndarray, expert_bytes: np.ndarray,
                     pool_bytes: list[int]) -> int:
    """Most coverable routes by exhaustive search over all subsets per GPU (tests only: tiny shapes)."""
    from itertools import product
    counts = np.asarray(counts)
    total = 0
    for j, budget in enumerate(pool_bytes):
        cells = [(il, e) for il in np.flatnonzero((np.asarray(layer_gpu)[:counts.shape[0]] == j)
                                                  & (np.asarray(expert_bytes) > 0))
                 for e in range(counts.shape[1])]
        best = 0
        for pick in product((0, 1), repeat=len(cells)):
            used = sum(int(expert_bytes[il]) for (il, _), p in zip(cells, pick) if p)
            if used <= budget:
                best = max(best, sum(int(counts[il, e]) for (il, e), p in zip(cells, pick) if p))
        total += best
    return total
