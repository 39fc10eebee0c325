"""Borrowed memory over a sweep's passes, in plain Python: the engine's rules (`ostinato.residency.borrow`) run over
the passes `ostinato sweep` sends (`run_engine`'s order) with its forced routing, so that the borrow counters of its
decode requests can be predicted for other parameters, and checked against a GPU's measured ones. Simulated, never a
measurement."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ostinato.residency.borrow import BorrowedSlots, BorrowParams, run_pass
from ostinato.sweep.prefill import BenchPlan

COUNTERS = ("steps", "steps_hit", "hits", "admissions", "evictions", "cpu_routes")


@dataclass(frozen=True)
class DecodeCounts:
    """The borrow counters over one decode request of the sweep (its `GET /residency` deltas; `cpu_routes`: the cold
    routes its decode steps left to the CPU)."""

    prefix: int
    rep: int
    steps: int
    steps_hit: int
    hits: int
    admissions: int
    evictions: int
    cpu_routes: int


def sweep_borrow_counts(plan: BenchPlan, ids: np.ndarray, hot: np.ndarray, moe: list[int], params: BorrowParams,
                        upload_min: int, ubatch: int = 512, decode_prompt_n: int = 1) -> list[DecodeCounts]:
    """Each decode request's counters, with the sweep's passes in order on one server: per prefix the prefix beyond
    what is cached, then per round every size's new tokens after it (one output token: no decode step) and the decode
    request, whose prompt is cached but for its last `decode_prompt_n` tokens (the server computes them again: the
    decode rows' `prompt_n`, 4 for a `deepseek4` model, whose compressed caches go back to a multiple of their
    ratio) and which then decodes n_decode - 1 steps. `ids[pos, layer]`: the forced routes; `hot[layer, expert]`:
    the plan's resident experts (one pool: one GPU, holding the MoE layers `moe`)."""
    slots = BorrowedSlots(hot, [0 if l in moe else -1 for l in range(hot.shape[0])], params)

    def passes(a: int, b: int) -> None:  # positions a..b-1 in passes of at most ubatch
        while a < b:
            n = min(ubatch, b - a)
            run_pass(slots, ids, a, n, moe, upload_min)
            a += n

    out, cached = [], 0
    top = max(plan.sizes)
    for p in plan.prefixes:
        passes(cached, p)
        cached, last = p, None  # `last`: the size whose prompt (the prefix and its new tokens) the server holds
        for rep in range(plan.reps):
            for n in plan.sizes:
                # a prompt the server holds whole is computed again from its last decode_prompt_n tokens only (one
                # size sent twice in a row: a sweep of one size, from its second round on)
                passes(p + n - decode_prompt_n if last == n else p, p + n)
                last = n
            if plan.n_decode <= 1:
                continue
            before = {k: getattr(slots.counts, k) for k in COUNTERS}
            passes(p + top - decode_prompt_n if last == top else p, p + top)
            last = top
            if decode_prompt_n > 1:
                before["cpu_routes"] = slots.counts.cpu_routes  # the decode steps' cold routes only, as the worker's
            for i in range(plan.n_decode - 1):
                run_pass(slots, ids, p + top + i, 1, moe, upload_min)
            out.append(DecodeCounts(p, rep, **{k: getattr(slots.counts, k) - before[k] for k in COUNTERS}))
    return out


def per_step(counts: list[DecodeCounts], prefix: int) -> dict[str, float]:
    """The counters of one prefix's decode requests per decode step, as the sweep's summary gives the engine's
    (`borrow_hits_per_step`, `borrow_admissions_per_step`, `borrow_steps_hit_share`; and the routes left to the CPU)."""
    rows = [c for c in counts if c.prefix == prefix]
    steps = sum(c.steps for c in rows)
    return {"borrow_hits_per_step": sum(c.hits for c in rows) / steps,
            "borrow_admissions_per_step": sum(c.admissions for c in rows) / steps,
            "borrow_steps_hit_share": sum(c.steps_hit for c in rows) / steps,
            "cpu_routes_per_step": sum(c.cpu_routes for c in rows) / steps}


def ran_params(meta: dict) -> tuple[float, float, int] | None:
    """(decay, margin, admit) that a sweep's presets with borrowed memory ran: the tuned ones of its meta's
    `borrow_params`, else the engine's defaults (BorrowParams' own), either overridden by the flags of its meta's
    `server_args` (the last one wins, as in the engine). None for a summary from before the meta recorded its server
    arguments: its flags are unknown."""
    if "server_args" not in meta:
        return None
    ran = meta.get("borrow_params")
    d = BorrowParams(1)
    key = ([d.decay, d.margin, d.admit] if ran is None else
           [float(ran["decay"]), float(ran["margin"]), int(ran["admit"])])
    args = list(meta.get("server_args") or [])
    for i, a in enumerate(args[:-1]):
        for j, (flag, conv) in enumerate((("--residency-borrow-decay", float), ("--residency-borrow-margin", float),
                                          ("--residency-borrow-admit", int))):
            if a == flag:
                key[j] = conv(args[i + 1])
    return key[0], key[1], key[2]


def _measured(summary: dict, prefix: int, params: BorrowParams, ran: tuple[float, float, int] | None) -> dict:
    """The summary's decode rows with borrow counters at `prefix`, if the sweep ran `params` (`ran`, else what its
    meta says): engine -> its row."""
    ran = ran or ran_params(summary["meta"])
    if ran is None or tuple(ran) != (params.decay, params.margin, params.admit):
        return {}
    return {r["engine"]: r for r in summary["rows"]
            if r["kind"] == "decode" and r["prefix"] == prefix and "borrow_hits_per_step" in r}


def borrow_sweep_table(summary: dict, shape, work_dir, decays: list[float], margins: list[float], admits: list[int],
                       slots: int | None = None, ran: tuple[float, float, int] | None = None,
                       decode_prompt_n: int = 1) -> list[dict]:
    """The model's decode counters per step for every (decay, margin, admit) and prefix, over the sweep's routing made
    again from its summary (`meta`: sizes, prefixes, rounds, upload_min, resident share, routing; the seed, workload and
    development sessions of `ostinato sweep`'s defaults where an older summary lacks them), beside the counters the
    summary measured for the engines that ran those parameters (`ran`: the decay, margin and copies per step they ran,
    for a summary that does not record them)."""
    from pathlib import Path

    from ostinato.routing.trace import read_trace
    from ostinato.sweep.routing import SweepSetup, make_sweep_routing

    meta = summary["meta"]
    d = SweepSetup()
    setup = SweepSetup(meta.get("routing_profile", d.routing_profile), meta.get("workload", d.workload),
                       int(meta.get("seed", d.seed)), int(meta.get("dev_sessions", d.dev_sessions)),
                       int(meta.get("dev_tokens", d.dev_tokens)), float(meta["resident_share"]))
    plan = BenchPlan(tuple(meta["prefixes"]), tuple(meta["sizes"]), int(meta["n_decode"]), int(meta["reps"]),
                     seed=setup.seed)
    routing = make_sweep_routing(Path(work_dir), shape, plan, setup)
    if routing.budget.budget_bytes != meta["budget_bytes"]:
        raise ValueError(f"the model's shape gives {routing.budget.budget_bytes} bytes for experts at resident share "
                         f"{setup.resident_share}, the sweep had {meta['budget_bytes']}: not the sweep's model")
    ids = np.asarray(read_trace(routing.bench_trace).ids, dtype=np.int64)
    hot = np.asarray(routing.plans["frequency"][1], dtype=bool)
    moe = shape.moe_layers()
    out = []
    for dc in decays:
        for m in margins:
            for a in admits:
                params = BorrowParams(shape.n_expert if slots is None else slots, dc, m, a)
                counts = sweep_borrow_counts(plan, ids, hot, moe, params, int(meta["upload_min"]),
                                             decode_prompt_n=decode_prompt_n)
                for p in plan.prefixes:
                    row = {"decay": dc, "margin": m, "admit": a, "slots": params.slots, "prefix": p,
                           "series": "simulated", "engine": "", **per_step(counts, p)}
                    out.append(row)
                    for eng, r in _measured(summary, p, params, ran).items():
                        out.append({**row, "series": "measured", "engine": eng,
                                    "borrow_hits_per_step": r["borrow_hits_per_step"],
                                    "borrow_admissions_per_step": r.get("borrow_admissions_per_step", float("nan")),
                                    "borrow_steps_hit_share": r["borrow_steps_hit_share"],
                                    "cpu_routes_per_step": r.get("worker_routes_per_step", float("nan"))})
    return out
