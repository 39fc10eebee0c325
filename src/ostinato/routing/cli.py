"""`ostinato routing ...`: inspect traces, write random or calibrated synthetic ones, compute routing facts."""

from __future__ import annotations

import argparse
import json

from ostinato.routing.commands import add_generate_args, add_stats_args, cmd_generate, cmd_stats
from ostinato.routing.trace import TraceShape, random_trace, read_trace, write_trace


def _cmd_show(args: argparse.Namespace) -> int:
    t = read_trace(args.trace)
    layers = t.moe_layers()
    filled = int((t.ids != t.shape.none_id).all(axis=2).sum())
    print(json.dumps({"file": args.trace, "n_layer": t.shape.n_layer, "n_expert": t.shape.n_expert,
                      "n_expert_used": t.shape.n_expert_used, "n_pos": t.n_pos, "moe_layers": layers,
                      "rows_with_experts": filled, "weights": t.weights is not None,
                      "synthetic": t.synthetic}, indent=2))
    return 0


def _cmd_random(args: argparse.Namespace) -> int:
    shape = TraceShape(args.n_layer, args.n_expert, args.n_expert_used)
    layers = [int(x) for x in args.moe_layers.split(",")] if args.moe_layers else list(range(args.n_layer))
    write_trace(args.out, random_trace(shape, args.n_pos, layers, seed=args.seed))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `routing` group."""
    p = sub.add_parser("routing", help="routing traces (the engine's record/force format)")
    g = p.add_subparsers(dest="routing_cmd", required=True)
    s = g.add_parser("show", help="print a trace's header and coverage")
    s.add_argument("trace")
    s.set_defaults(func=_cmd_show)
    r = g.add_parser("random", help="write uniformly random routing for a model shape")
    r.add_argument("--n-layer", type=int, required=True)
    r.add_argument("--n-expert", type=int, required=True)
    r.add_argument("--n-expert-used", type=int, required=True)
    r.add_argument("--n-pos", type=int, required=True)
    r.add_argument("--moe-layers", help="comma list of MoE layers (default: all)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    r.set_defaults(func=_cmd_random)
    gen = g.add_parser("generate", help="write calibrated synthetic routing for sessions (flagged synthetic)")
    add_generate_args(gen)
    gen.set_defaults(func=cmd_generate)
    st = g.add_parser("stats", help="the Section 2.3 routing facts of development and held-out traces")
    add_stats_args(st)
    st.set_defaults(func=cmd_stats)
