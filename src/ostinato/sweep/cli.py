"""`ostinato sweep`: the input-length sweep of Figure 7b (TTFT by prefill size and decode TPOT of engine presets at
equal GPU memory for experts, routing forced from synthetic traces)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ostinato.args import int_list
from ostinato.atomic import atomic_open
from ostinato.models.gguf_shape import moe_shape_from_gguf
from ostinato.presets import BORROW_PRESETS, FLOOR_PRESET, PLAN_RULES, RESIDENT_SHARE, UPLOAD_MIN, preset
from ostinato.residency.budget import ExpertBudget
from ostinato.residency.borrow import read_tuned
from ostinato.routing.generator import PROFILES
from ostinato.routing.trace import read_trace
from ostinato.sweep.cold import cold_routes_of
from ostinato.sweep.prefill import BenchPlan, EngineRun, run_engine, summarize, write_rows, write_summary
from ostinato.sweep.routing import SweepSetup, make_sweep_routing


def _cmd_sweep(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model)
    shape = moe_shape_from_gguf(model, args.llama_tree)
    if shape.n_vocab < 256:
        raise ValueError(f"--model {model}: vocabulary of {shape.n_vocab} tokens; the benchmark draws prompt "
                         f"tokens from ids 100..min(n_vocab, 20000) (a byte vocabulary: 100..127)")
    # a byte vocabulary (tests) has 256 byte tokens and then its special ones: draw ASCII bytes (a byte of 128 or
    # more alone is incomplete UTF-8, which the server holds back from its stream)
    vocab_hi = min(shape.n_vocab, 20000) if shape.n_vocab >= 300 else 128
    prefixes = int_list(args.prefix, "--prefix", minimum=1)
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"--prefix {args.prefix!r}: each prefix length once")
    plan = BenchPlan(prefixes, int_list(args.sizes, "--sizes", minimum=1), args.decode, args.reps,
                     vocab_hi=vocab_hi, seed=args.seed)
    setup = SweepSetup(args.routing_profile, args.workload, args.seed, args.dev_sessions, args.dev_tokens,
                       args.resident_share)
    # routing: development sessions (for the plans) and the benchmark's own session, same generator and workload
    routing = make_sweep_routing(out, shape, plan, setup)
    bench_trace, plans, budget = routing.bench_trace, routing.plans, routing.budget
    trace = read_trace(bench_trace)

    # cold routes per token and layer (Figure 7c) in the benchmark's prefills and decode steps after each prefix: the
    # routes each engine computes on the CPU (for llama.cpp-expert-cache in decode: the misses it uploads)
    names = args.engines.split(",")
    by_prefix = {}
    for p in plan.prefixes:
        hi_p = p + max(plan.sizes)
        by_prefix[str(p)] = {name: cold_routes_of(name, trace, shape, budget.layers_on_gpu(), plans, (p, hi_p),
                                                  (hi_p, hi_p + plan.n_decode)) for name in dict.fromkeys(
                             ["ostinato", "llama.cpp-layers", "llama.cpp-cpu-experts", *names])}
    cold = by_prefix[str(plan.prefixes[0])]
    with atomic_open(out / "cold.json", "w") as f:
        f.write(json.dumps({"k": shape.n_expert_used, "budget_bytes": budget.budget_bytes, "prefix": plan.prefixes[0],
                            "placements": cold, "by_prefix": by_prefix}, indent=2) + "\n")

    # the borrowed memory's parameters chosen on development sessions (`ostinato residency borrow-tune`), for the
    # presets with borrowed memory; without them those presets run the engine's defaults
    borrow = read_tuned(args.borrow_params) if args.borrow_params else None
    bins = Path(args.variants_dir)
    common = ["-c", str(args.ctx), "-t", str(args.threads), "-fa", "on", "--routing-force", str(bench_trace),
              "-fit", "off", "-lv", "4", *args.server_arg]
    rows = []
    for name in names:
        if name in PLAN_RULES:
            cfg = preset(name, budget, plan=str(plans[PLAN_RULES[name]][0]), upload_min=args.upload_min,
                         borrow=borrow if name in BORROW_PRESETS else None)
        elif name == FLOOR_PRESET:  # the floor: every expert on the GPU, beyond the sweep's budget (meta says so)
            cfg = preset(name, ExpertBudget(budget.layer_bytes, None))
        else:
            cfg = preset(name, budget)
        run = EngineRun(cfg, bins / cfg.variant / "bin" / "llama-server", tuple(common))

        def progress(engine, rep, p, n, o):
            what = f"prefill {n} after {p}" if n >= 0 else f"decode after {p}"
            print(f"[bench] {engine} rep {rep} {what}: ttft {o.ttft} tpot {o.tpot} ok={o.success}",
                  file=sys.stderr, flush=True)

        print(f"[bench] {cfg.name}: {' '.join(cfg.server_args)} {cfg.env}", file=sys.stderr, flush=True)
        rows += run_engine(run, model, plan, out, progress=None if args.no_progress else progress)
        write_rows(out / "rows.csv", rows)

    summ = summarize(rows, args.baseline)
    write_summary(out / "summary.json", summ, {"model": str(model), "prefix": plan.prefixes[0],
                                               "prefixes": list(plan.prefixes), "sizes": list(plan.sizes),
                                               "n_decode": plan.n_decode, "reps": plan.reps, "upload_min": args.upload_min,
                                               "resident_share": args.resident_share, "budget_bytes": budget.budget_bytes,
                                               "engines": args.engines, "routing_profile": args.routing_profile,
                                               "workload": args.workload, "seed": args.seed,
                                               "dev_sessions": args.dev_sessions, "dev_tokens": args.dev_tokens,
                                               "server_args": list(args.server_arg), "borrow_params": borrow,
                                               "beyond_budget": [n for n in names if n == FLOOR_PRESET],
                                               "cold": cold})
    for r in summ:
        print(json.dumps(r))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `sweep` command."""
    q = sub.add_parser("sweep", help="Figure 7b: TTFT by number of new tokens after a prefix, and decode TPOT, per "
                                     "engine preset at equal GPU memory for experts (forced routing)")
    q.add_argument("--model", required=True, help="GGUF model")
    q.add_argument("--llama-tree", required=True, help="the pinned llama.cpp tree (its gguf-py reads the model)")
    q.add_argument("--variants-dir", required=True, help="build/engine/<backend>: <variant>/bin/llama-server")
    q.add_argument("--engines", default="llama.cpp-layers,llama.cpp-cpu-experts,ostinato",
                   help="comma list of engine presets (ostinato: resident pools from the plan made here; "
                        f"{FLOOR_PRESET}: every expert on the GPU, beyond the budget, the floor of a step)")
    q.add_argument("--baseline", default="llama.cpp-layers", help="engine the ratios refer to")
    q.add_argument("--resident-share", type=float, default=RESIDENT_SHARE,
                   help="GPU memory for routed experts, as a share of all their bytes (same for every engine but "
                        f"{FLOOR_PRESET}; default {RESIDENT_SHARE})")
    q.add_argument("--upload-min", type=int, default=UPLOAD_MIN,
                   help=f"Np of the ostinato engine (--residency-upload-min; default {UPLOAD_MIN})")
    q.add_argument("--prefix", default="4096",
                   help="prefix length(s), comma list: each is prefilled once, then the sizes after it (default 4096)")
    q.add_argument("--sizes", default="128,256,511,512,1024,2048")
    q.add_argument("--decode", type=int, default=128, help="forced tokens of the decode request")
    q.add_argument("--reps", type=int, default=3)
    q.add_argument("--threads", type=int, default=16)
    q.add_argument("--ctx", type=int, default=16384)
    q.add_argument("--dev-sessions", type=int, default=4, help="synthetic development sessions for the plan")
    q.add_argument("--dev-tokens", type=int, default=8192, help="positions of each development session")
    q.add_argument("--workload", default="swe")
    q.add_argument("--routing-profile", default="calibrated", choices=sorted(PROFILES))
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument (repeat)")
    q.add_argument("--borrow-params", default=None,
                   help="the JSON of `ostinato residency borrow-tune`: the presets with borrowed memory "
                        "(ostinato-borrow, ostinato-graph-borrow) run its chosen slots, decay, margin and admissions "
                        "(default: the engine's own)")
    q.add_argument("--out", required=True, help="directory: rows.csv, summary.json, plan.json, cold.json, logs")
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=_cmd_sweep)
