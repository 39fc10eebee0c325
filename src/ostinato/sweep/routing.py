"""The sweep's forced routing and plans: synthetic development sessions plan the pools, one benchmark session gives
every position's routes. Deterministic from the model's shape and the sweep's parameters, so a sweep's routing can be
made again from its summary (`ostinato sweep borrow-model`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ostinato.models.gguf_shape import MoeShape
from ostinato.presets import PLAN_RULES
from ostinato.residency.budget import ExpertBudget, expert_budget_from_shape, plan_for_budget, share_budget
from ostinato.residency.planfile import write_plan
from ostinato.residency.profile import profile_from_traces
from ostinato.routing.generator import PROFILES, write_session_trace
from ostinato.routing.layout import RequestSpan, SessionLayout
from ostinato.routing.shapes import custom_shape
from ostinato.sweep.prefill import BenchPlan


@dataclass(frozen=True)
class SweepSetup:
    """How the sweep's routing is made (its CLI's options; a summary's `meta` records them)."""

    routing_profile: str = "calibrated"
    workload: str = "swe"
    seed: int = 0
    dev_sessions: int = 4
    dev_tokens: int = 8192
    resident_share: float = 0.5


@dataclass
class SweepRouting:
    """The benchmark session's trace, each plan rule's plan file and resident experts, and the expert budget."""

    bench_trace: Path
    plans: dict[str, tuple[Path, np.ndarray]]
    budget: ExpertBudget


def make_sweep_routing(out: Path, shape: MoeShape, plan: BenchPlan, setup: SweepSetup) -> SweepRouting:
    """Write (or reuse) the development and benchmark traces under out/traces/ and the plans under out/ (plan.json for
    the frequency rule, plan-<rule>.json for the others), at `setup.resident_share` of all routed-expert bytes."""
    rshape = custom_shape(shape.n_layer, shape.n_expert, shape.n_expert_used, shape.moe_layers())
    profile = PROFILES[setup.routing_profile]
    dev_paths = []
    for i in range(setup.dev_sessions):
        p = out / "traces" / f"dev-{i}.route"
        if not p.exists():
            lay = SessionLayout(f"dev-{i}", (RequestSpan(0, "first", 0, setup.dev_tokens, 0),))
            write_session_trace(p, rshape, lay, profile, setup.workload, seed=setup.seed)
        dev_paths.append(p)
    bench_trace = out / "traces" / "bench.route"
    if not bench_trace.exists():
        lay = SessionLayout("bench", (RequestSpan(0, "first", 0, plan.n_pos - plan.n_decode - 1, plan.n_decode + 1),))
        write_session_trace(bench_trace, rshape, lay, profile, setup.workload, seed=setup.seed)
    # equal GPU memory for experts: a share of all routed-expert bytes, filled by the development profile's experts
    # (by frequency for ostinato and the caches, the same count per layer for ktransformers-placement)
    budget = share_budget(expert_budget_from_shape(shape, None), setup.resident_share)
    dev = profile_from_traces(dev_paths)
    plans = {}
    for rule in sorted(set(PLAN_RULES.values())):
        path = out / ("plan.json" if rule == "frequency" else f"plan-{rule}.json")
        pf, pl = plan_for_budget(dev, shape, budget.budget_bytes, rule)
        write_plan(path, pf)
        plans[rule] = (path, pl.hot)
    return SweepRouting(bench_trace, plans, budget)
