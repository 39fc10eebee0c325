"""`ostinato limit`: the MIN-with-bypass bound on host expert reads (and decode time) for a cache size and traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.limit.belady import LimitResult, limit_for_trace
from ostinato.routing.trace import read_trace, trace_filename
from ostinato.sim.session import Request
from ostinato.sim.run import read_sessions


def decode_positions(requests: list[Request]) -> np.ndarray:
    """Positions a session's decode steps compute: per request, its outputs but the last (each step feeds one output
    and yields the next; the first output comes from the prefill). Positions run as in the trace: each request's new
    tokens, then its outputs."""
    out, start = [], 0
    for r in requests:
        first = start + r.n_new
        out.append(np.arange(first, first + max(r.n_output - 1, 0)))
        start = first + r.n_output
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _cmd_limit(args: argparse.Namespace) -> int:
    if args.decode_only and not args.sessions:
        raise ValueError("--decode-only needs --sessions (which positions are outputs)")
    sessions = dict(read_sessions(args.sessions)) if args.sessions else {}
    by_file = {trace_filename(sid): sid for sid in sessions}
    init = None
    if args.initial_plan:
        from ostinato.residency.planfile import read_plan
        plan = read_plan(args.initial_plan)
        init = plan.hot_mask()
        if not args.expert_bytes:
            args.expert_bytes = float(max(plan.expert_bytes))
    if args.other_ms_from:
        doc = json.loads(Path(args.other_ms_from).read_text(encoding="utf-8"))
        try:
            args.other_ms = float(doc["sim_params"]["decode_other_ms"])
        except KeyError:
            raise ValueError(f"--other-ms-from {args.other_ms_from}: expected sim_params.decode_other_ms "
                             "(the file `ostinato sim run --params-out` writes)") from None
    rows = []
    tot = np.zeros(6, dtype=np.int64)
    for path in args.trace:
        t = read_trace(path)
        ids = np.asarray(t.ids)
        sid = by_file.get(Path(path).name)
        if args.decode_only:
            if sid is None:
                raise ValueError(f"--trace {path}: no session of {args.sessions} has this trace file name")
            pos = decode_positions(sessions[sid])
            if pos.size and pos[-1] >= ids.shape[0]:
                raise ValueError(f"--trace {path}: {ids.shape[0]} positions, session {sid} decodes up to {pos[-1]}")
            ids = ids[pos]
        r = limit_for_trace(ids, t.shape.n_expert, args.slots, args.per_layer, t.shape.none_id, init)
        tot += [r.n_positions, r.requests, r.hits, r.misses, r.admissions, r.bypasses]
        row = {"trace": str(path), "session": sid, "positions": r.n_positions, "requests": r.requests,
               "reads_once": r.reads_once, "reads_twice": r.reads_twice}
        if args.expert_bytes and args.read_gbps:
            rate = float(args.read_gbps) * 1e9 / 1e3
            row["limit_ms_per_token"] = r.decode_ms_per_token(float(args.expert_bytes), rate, False, args.other_ms)
            row["min_read_twice_ms_per_token"] = r.decode_ms_per_token(float(args.expert_bytes), rate, True,
                                                                        args.other_ms)
        rows.append(row)
    total = LimitResult(*map(int, tot))
    out = {"slots": args.slots, "read_gbps": args.read_gbps, "expert_bytes": args.expert_bytes,
           "other_ms": args.other_ms, "decode_only": args.decode_only, "per_layer": args.per_layer, "positions": total.n_positions,
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
    p.add_argument("--trace", nargs="+", required=True,
                   help="routing traces (each a separate run): decode positions, or whole sessions with --decode-only")
    p.add_argument("--sessions", help="sessions JSONL or trace manifest naming each trace's session and requests")
    p.add_argument("--decode-only", action="store_true",
                   help="keep only the positions decode steps compute (each request's outputs but the last)")
    p.add_argument("--slots", type=int, required=True, help="cache slots (shared by all layers, or per layer)")
    p.add_argument("--per-layer", action="store_true", help="slots per layer instead of one shared cache")
    p.add_argument("--initial-plan", help="plan file whose experts start in the cache")
    p.add_argument("--expert-bytes", type=float, help="bytes of one expert (default with --initial-plan: its largest)")
    p.add_argument("--read-gbps", type=float, help="probed host read rate, GB/s")
    p.add_argument("--other-ms", type=float, default=0.0, help="non-expert time per token added to the bound")
    p.add_argument("--other-ms-from", help="take --other-ms from a simulator params.json (sim_params.decode_other_ms)")
    p.add_argument("--out")
    p.set_defaults(func=_cmd_limit)
