"""Model shapes the routing tools know by name (MoE layers, experts, top-k) and their ranking seeds."""

from __future__ import annotations

from dataclasses import dataclass

from ostinato.routing.trace import TraceShape


@dataclass(frozen=True)
class ModelShape:
    """A model's routing shape: all layers, which of them are MoE, experts per layer, experts per token."""

    name: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    moe_layers: tuple[int, ...]
    ranking_seed: str = "random"  # "moe-l2-v4flash": per-layer hot lists of ostinato.routing.hot_v4flash

    @property
    def trace_shape(self) -> TraceShape:
        return TraceShape(self.n_layer, self.n_expert, self.n_expert_used)

    @property
    def n_pairs(self) -> int:
        """(layer, expert) pairs that residency chooses from."""
        return len(self.moe_layers) * self.n_expert


SHAPES: dict[str, ModelShape] = {
    "deepseek-v4-flash": ModelShape("deepseek-v4-flash", 43, 256, 6, tuple(range(43)), "moe-l2-v4flash"),
    "qwen3-235b-a22b": ModelShape("qwen3-235b-a22b", 94, 128, 8, tuple(range(94))),
}


def get_shape(name: str) -> ModelShape:
    """Look up a named shape, with a message listing the known ones."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(sorted(SHAPES))}") from None


def custom_shape(n_layer: int, n_expert: int, n_expert_used: int, moe_layers: list[int] | None = None) -> ModelShape:
    """A shape given by numbers (all layers MoE unless listed), with random per-layer rankings."""
    layers = tuple(moe_layers) if moe_layers is not None else tuple(range(n_layer))
    if not layers or not all(0 <= il < n_layer for il in layers):
        raise ValueError(f"MoE layers {layers} must be a non-empty subset of [0, {n_layer})")
    if not 1 <= n_expert_used <= n_expert:
        raise ValueError(f"k = {n_expert_used} must lie in [1, {n_expert}]")
    return ModelShape(f"custom-{n_layer}x{n_expert}k{n_expert_used}", n_layer, n_expert, n_expert_used, layers)
