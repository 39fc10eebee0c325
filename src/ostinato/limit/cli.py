"""`ostinato limit`: the MIN-with-bypass bound on host expert reads (and decode time) for a cache size and traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.limit.belady import LimitResult, limit_for_trace
from ostinato.routing.trace import read_trace


def _cmd_limit(args: argparse.Namespace) -> int:
    init = None
    if args.initial_plan:
        from ostinato.residency.planfile import read_plan
        init = read_plan(args.initial_plan).hot_mask()
    rows = []
    tot = np.zeros(6, dtype=np.int64)
    for path in args.trace:
        t = read_trace(path)
        r = limit_for_trace(np.asarray(t.ids), t.shape.n_expert, args.slots, args.per_layer, t.shape.none_id, init)
        tot += [r.n_positions, r.requests, r.hits, r.misses, r.admissions, r.bypasses]
        rows.append({"trace": path, "requests": r.requests, "reads_once": r.reads_once, "reads_twice": r.reads_twice})
    total = LimitResult(*map(int, tot))
    out = {"slots": args.slots, "per_layer": args.per_layer, "positions": total.n_positions,
           "requests": total.requests, "hits": total.hits, "reads_once": total.reads_once,
           "reads_twice": total.reads_twice, "admissions": total.admissions, "bypasses": total.bypasses,
           "reads_once_per_token": total.reads_once / max(total.n_positions, 1), "traces": rows}
    if args.expert_bytes and args.read_gbps:
        rate = float(args.read_gbps) * 1e9 / 1e3   # bytes per ms
        eb = float(args.expert_bytes)
        out["limit_ms_per_token"] = total.decode_ms_per_token(eb, rate, False, args.other_ms)
        out["min_read_twice_ms_per_token"] = total.decode_ms_per_token(eb, rate, True, args.other_ms)
    print(json.dumps({k: v for k, v in out.items() if k != "traces"}, indent=2))
    if args.out:
        with atomic_open(Path(args.out), "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `limit` command."""
    p = sub.add_parser("limit", help="Belady MIN-with-bypass bound on host expert reads for a GPU expert cache")
    p.add_argument("--trace", nargs="+", required=True, help="routing traces of decode positions (each a separate run)")
    p.add_argument("--slots", type=int, required=True, help="cache slots (shared by all layers, or per layer)")
    p.add_argument("--per-layer", action="store_true", help="slots per layer instead of one shared cache")
    p.add_argument("--initial-plan", help="plan file whose experts start in the cache")
    p.add_argument("--expert-bytes", type=float)
    p.add_argument("--read-gbps", type=float, help="probed host read rate, GB/s")
    p.add_argument("--other-ms", type=float, default=0.0, help="non-expert time per token added to the bound")
    p.add_argument("--out")
    p.set_defaults(func=_cmd_limit)
