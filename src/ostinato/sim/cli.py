"""`ostinato sim run`: replay sessions with their routing through the cost model of each engine policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.costmodel.analysis import layer_costs_for
from ostinato.costmodel.params import load_profile
from ostinato.residency.borrow import BorrowParams, read_borrow_params
from ostinato.residency.planfile import read_plan
from ostinato.residency.planner import plan_per_layer
from ostinato.routing.trace import read_trace
from ostinato.sim import policies as pol
from ostinato.sim.params import paper_illustrative
from ostinato.sim.run import load_sim_params, read_sessions, routing_file, sim_params_dict, simulate

# the engine presets' names (ostinato.presets); ostinato-native-prefill runs its branches in turn, as the engine's
# preset does (the paper's ablation step 3), -overlap overlaps them (step 4)
POLICIES = ("ostinato", "ostinato-native-prefill-overlap", "ostinato-native-prefill", "ktransformers-placement",
            "llama.cpp-layers", "llama.cpp-expert-cache", "buun")
# named only with --borrow-params: the engine's borrowed memory with parameters chosen on development sessions
BORROW_POLICY = "ostinato-borrow"


def _policies(names: list[str], hot: np.ndarray, per_layer: int, gpu_layers: int, cache_slots: int | None,
              layer_device: np.ndarray, borrowed: int = 0, decode_delta: float = 0.0,
              borrow: BorrowParams | None = None) -> list:
    out = []
    n_layer = hot.shape[0]
    for n in names:
        if n == "ostinato":
            out.append(pol.ostinato(hot, borrowed, decode_delta))
        elif n == BORROW_POLICY:
            if borrow is None:
                raise ValueError(f"policy {BORROW_POLICY} needs --borrow-params (`ostinato residency borrow-tune`'s "
                                 "output)")
            out.append(pol.ostinato_borrow(hot, borrow, layer_device, decode_delta))
        elif n == "ostinato-native-prefill-overlap":
            out.append(pol.resident_native(hot, True))
        elif n == "ostinato-native-prefill":
            out.append(pol.resident_native(hot, False))
        elif n == "ktransformers-placement":
            out.append(pol.static_per_layer(_uniform(hot, per_layer)))
        elif n == "llama.cpp-layers":
            g = np.zeros(n_layer, dtype=bool)
            if gpu_layers:
                g[-gpu_layers:] = True       # --n-cpu-moe style: the first layers' experts stay on the CPU
            out.append(pol.llama_layers(g))
        elif n == "llama.cpp-expert-cache":
            out.append(pol.llama_expert_cache(hot, layer_device, cache_slots))
        elif n == "buun":
            out.append(pol.buun(hot))
        else:
            raise ValueError(f"unknown policy {n!r} (known: {', '.join((*POLICIES, BORROW_POLICY))})")
    return out


def _uniform(hot: np.ndarray, per_layer: int) -> np.ndarray:
    """per_layer experts of each layer by id (KTransformers' default placement does not rank; see --uniform-from-profile)."""
    u = np.zeros_like(hot)
    u[:, :per_layer] = True
    return u


def _cmd_run(args: argparse.Namespace) -> int:
    plan = read_plan(args.plan)
    eb = np.asarray(plan.expert_bytes)
    layers = np.flatnonzero(eb > 0)
    m = load_profile(args.profile).model(args.model)
    c = layer_costs_for(m, eb[layers])
    p = load_sim_params(args.sim_params) if args.sim_params else paper_illustrative(m)
    hot = plan.hot_mask()[layers]
    if args.uniform_from_profile:
        from ostinato.residency.profile import read_profile
        uni = plan_per_layer(read_profile(args.uniform_from_profile).counts[layers], args.per_layer)
    else:
        uni = None
    names = args.policies.split(",")
    layer_device = np.full(plan.n_layer, -1)
    for j, ls in enumerate(plan.gpu_layers):
        layer_device[ls] = j
    layer_device = layer_device[layers]
    slots = args.cache_slots
    gpu_layers = args.gpu_layers if args.gpu_layers is not None else int(hot.sum()) // plan.n_expert
    borrow = read_borrow_params(args.borrow_params, hot.shape[1]) if args.borrow_params else None
    pols = _policies(names, hot, args.per_layer, gpu_layers, slots, layer_device, args.borrowed_slots,
                     args.ostinato_decode_delta_ms, borrow)
    if uni is not None:
        pols = [pol.static_per_layer(uni) if x.name == "ktransformers-placement" else x for x in pols]
    sessions = read_sessions(args.sessions or Path(args.routing_dir) / "manifest.json")
    if args.select:
        sessions = sessions[: args.select]
    routing = {}
    for sid, _ in sessions:
        t = read_trace(routing_file(args.routing_dir, sid))
        routing[sid] = np.asarray(t.ids[:, layers, :]).astype(np.int64)
    req, ses = simulate(sessions, routing, plan.n_expert, pols, c, p, progress=not args.no_progress)
    for path, df in ((args.out_requests, req), (args.out_sessions, ses)):
        with atomic_open(Path(path), "w") as f:
            df.to_csv(f, index=False)
    if args.params_out:
        with atomic_open(Path(args.params_out), "w") as f:
            f.write(json.dumps({"sim_params": sim_params_dict(p), "profile": args.profile, "model": args.model,
                                "plan": args.plan, "policies": names}, indent=2) + "\n")
    print(ses.groupby("engine", sort=False)[["total_s", "prefill_s", "decode_s"]].sum().to_string())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `sim` group."""
    p = sub.add_parser("sim", help="trace-driven simulator of the engine policies")
    g = p.add_subparsers(dest="sim_cmd", required=True)
    r = g.add_parser("run", help="simulate sessions under several policies")
    r.add_argument("--sessions", help="sessions JSONL or trace manifest (kind, n_new, n_output per request); "
                   "default: the routing directory's manifest.json")
    r.add_argument("--routing-dir", required=True, help="one trace per session: <session, / -> __>.route")
    r.add_argument("--plan", required=True, help="residency plan (Ostinato's set; buun's warm start)")
    r.add_argument("--profile", default="paper-4x4090d")
    r.add_argument("--model", default="deepseek-v4-flash")
    r.add_argument("--sim-params", help="YAML of SimParams fields (default: the illustrative paper constants)")
    r.add_argument("--policies", default=",".join(POLICIES))
    r.add_argument("--per-layer", type=int, default=58, help="experts per layer of ktransformers-placement")
    r.add_argument("--uniform-from-profile", help="routing profile ranking ktransformers-placement's experts")
    r.add_argument("--gpu-layers", type=int, help="whole MoE layers on the GPU for llama.cpp-layers")
    r.add_argument("--cache-slots", type=int, help="slots of each GPU's LRU cache (llama.cpp-expert-cache; default: "
                   "the plan's experts on that GPU, which also fill it first)")
    r.add_argument("--borrowed-slots", type=int, default=0, help="Ostinato's borrowed decode slots as the paper "
                   "describes them (one pool, emptied before each prefill)")
    r.add_argument("--borrow-params", help=f"policy {BORROW_POLICY}: the engine's borrowed memory with these "
                   "parameters (`ostinato residency borrow-tune`'s JSON, its \"chosen\")")
    r.add_argument("--ostinato-decode-delta-ms", type=float, default=0.0,
                   help="per-step offset of Ostinato's decode (e.g. the decode graph's saving)")
    r.add_argument("--select", type=int, default=0)
    r.add_argument("--out-requests", required=True)
    r.add_argument("--out-sessions", required=True)
    r.add_argument("--params-out")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_run)
