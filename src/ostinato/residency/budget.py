"""GPU memory for routed experts: one budget for every compared engine, and the residency plan that fills it.

Every engine of a comparison gets the same bytes for routed experts. The budget is given in GiB, as a share of
all routed-expert bytes (`resident_share`), or as the pool a capacity test found room for; the presets turn it
into their placement flags (`ostinato.presets`), and `plan_for_budget` into the Ostinato pool's plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ostinato.inputs import read_text
from ostinato.models.gguf_shape import MoeShape, moe_shape_from_gguf
from ostinato.residency.capacity import Capacity
from ostinato.residency.planfile import PlanFile
from ostinato.residency.planner import PLAN_RULES, Plan
from ostinato.residency.profile import RouteCounts


@dataclass(frozen=True)
class ExpertBudget:
    """GPU memory for routed experts and the model's MoE layers: how many whole layers fit."""

    layer_bytes: tuple[int, ...]     # routed-expert bytes of each MoE layer, in layer order
    budget_bytes: int | None = None  # None: no limit

    @property
    def n_moe_layers(self) -> int:
        return len(self.layer_bytes)

    def layers_on_gpu(self) -> int:
        """Whole MoE layers that fit the budget, filled from the last layer down (as --n-cpu-moe keeps the first N on the CPU)."""
        if self.budget_bytes is None:
            return self.n_moe_layers
        used, n = 0, 0
        for b in reversed(self.layer_bytes):
            if used + b > self.budget_bytes:
                break
            used, n = used + b, n + 1
        return n


def expert_budget_from_shape(shape: MoeShape, budget_bytes: int | None) -> ExpertBudget:
    """The budget of a model whose shape is already read."""
    return ExpertBudget(tuple(b * shape.n_expert for b in shape.expert_bytes if b > 0), budget_bytes)


def expert_budget_from_gguf(model: str | Path, tree: str | Path, budget_bytes: int | None) -> ExpertBudget:
    """Read each MoE layer's routed-expert bytes from a GGUF (with the pinned tree's gguf-py)."""
    return expert_budget_from_shape(moe_shape_from_gguf(model, tree), budget_bytes)


def check_share(share: float, flag: str = "--resident-share") -> float:
    """A share of routed experts (or of their bytes) in [0, 1]."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{flag} {share}: expected a share in [0, 1]")
    return share


def share_budget(full: ExpertBudget, resident_share: float) -> ExpertBudget:
    """`resident_share` of all routed-expert bytes of a model (`full`: its budget without limit)."""
    return ExpertBudget(full.layer_bytes, int(check_share(resident_share) * sum(full.layer_bytes)))


def resolve_budget(model: str | Path, tree: str | Path, budget_gib: float | None = None,
                   resident_share: float | None = None, capacity: str | Path | None = None) -> ExpertBudget:
    """The budget of one comparison from at most one of: GiB, a share of all routed-expert bytes, a capacity test's
    pools (summed over its GPUs). None of them: no limit."""
    given = [f for f, v in (("--expert-budget-gib", budget_gib), ("--resident-share", resident_share),
                            ("--expert-capacity", capacity)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{', '.join(given)}: each sets the budget; give one")
    full = expert_budget_from_gguf(model, tree, None)
    if capacity is not None:
        if not Path(capacity).is_file():
            raise FileNotFoundError(f"--expert-capacity {capacity}: not found (`ostinato residency capacity --out`)")
        pool = Capacity.from_json(read_text(capacity, "a capacity test's JSON"), str(capacity)).pool_bytes
        return ExpertBudget(full.layer_bytes, int(sum(pool)))
    if resident_share is not None:
        return share_budget(full, resident_share)
    if budget_gib is not None:
        return ExpertBudget(full.layer_bytes, int(budget_gib * (1 << 30)))
    return full


def plan_from_profile(dev: RouteCounts, layer_gpu: np.ndarray, expert_bytes: np.ndarray, pool_bytes: list[int],
                      model_name: str, rule: str = "frequency") -> tuple[PlanFile, Plan]:
    """A plan rule on a development profile (frequency: Prop 3.1; uniform: the same count per layer): the plan file
    the engine loads, and the planner's result."""
    if rule not in PLAN_RULES:
        raise ValueError(f"plan rule {rule!r}: expected one of {', '.join(PLAN_RULES)}")
    n_layer = dev.shape.n_layer
    layer_gpu = np.asarray(layer_gpu)[:n_layer]
    plan = PLAN_RULES[rule](dev.counts, layer_gpu, expert_bytes, pool_bytes)
    pf = PlanFile(model_name, n_layer, dev.shape.n_expert, dev.shape.n_expert_used, [int(x) for x in expert_bytes],
                  [[int(l) for l in np.flatnonzero(layer_gpu == j)] for j in range(len(pool_bytes))],
                  [int(x) for x in pool_bytes], plan.gpu_slots, dev.sha256())
    return pf, plan


def plan_for_budget(dev: RouteCounts, shape: MoeShape, budget_bytes: int,
                    rule: str = "frequency") -> tuple[PlanFile, Plan]:
    """One GPU holding every layer, its pool `budget_bytes`: the profile's experts that fit, by `rule`."""
    check_shape(dev, shape)
    return plan_from_profile(dev, np.zeros(shape.n_layer, dtype=int), np.asarray(shape.expert_bytes, dtype=np.int64),
                             [int(budget_bytes)], shape.name, rule)


def slots_for_share(dev: RouteCounts, shape: MoeShape, resident_share: float) -> int:
    """Resident experts of one pool holding `resident_share` of the MoE layers' routed experts."""
    return int(round(check_share(resident_share) * len(shape.moe_layers()) * dev.shape.n_expert))


def check_shape(dev: RouteCounts, shape: MoeShape) -> None:
    """The model and the profile agree on layers, experts and k (the engine checks the plan against the model)."""
    if (shape.n_layer, shape.n_expert, shape.n_expert_used) != (dev.shape.n_layer, dev.shape.n_expert,
                                                                dev.shape.n_expert_used):
        raise ValueError(f"model {shape.name}: {shape.n_layer} layers, {shape.n_expert} experts, "
                         f"k={shape.n_expert_used}; the profile has {dev.shape.n_layer}, {dev.shape.n_expert}, "
                         f"{dev.shape.n_expert_used}")


def single_gpu_plan(shape: MoeShape, resident: dict[int, list[int]] | np.ndarray) -> PlanFile:
    """A one-GPU plan holding the given experts: {layer: [experts]} or a bool [n_layer, n_expert] mask."""
    if isinstance(resident, np.ndarray):
        resident = {int(l): [int(e) for e in np.flatnonzero(resident[l])] for l in range(resident.shape[0])}
    slots = np.array([(l, e) for l in sorted(resident) for e in sorted(resident[l])], dtype=np.int64).reshape(-1, 2)
    pool = int(sum(shape.expert_bytes[int(l)] for l in slots[:, 0]))
    return PlanFile(shape.name, shape.n_layer, shape.n_expert, shape.n_expert_used, list(shape.expert_bytes),
                    [list(range(shape.n_layer))], [pool], [slots])
