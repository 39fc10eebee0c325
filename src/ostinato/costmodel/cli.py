"""`ostinato costmodel ...`: paper checks, calibration fits and decode analyses of residency plans on traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ostinato.atomic import atomic_open
from ostinato.costmodel.analysis import decode_analysis, increment_analysis, layer_costs_for
from ostinato.costmodel.checks import needs_traces, paper_checks
from ostinato.costmodel.fit import fit_table
from ostinato.costmodel.params import load_profile
from ostinato.residency.planfile import read_plan
from ostinato.routing.trace import read_trace


def _cmd_check(args: argparse.Namespace) -> int:
    m = load_profile(args.profile).model(args.model)
    rows = [{"check": c.name, "formula": c.formula, "paper": c.paper, "computed": round(c.computed, 6),
             "ok": c.ok} for c in paper_checks(m)]
    doc = {"profile": args.profile, "model": args.model, "checks": rows, "needs_traces": needs_traces()}
    if args.out:
        with atomic_open(Path(args.out), "w") as f:
            f.write(json.dumps(doc, indent=2) + "\n")
    for r in rows:
        print(f"{'ok ' if r['ok'] else 'BAD'} {r['check']:52s} paper {r['paper']:<10g} computed {r['computed']:<10g}")
    return 0 if all(r["ok"] for r in rows) else 1


def _cmd_fit(args: argparse.Namespace) -> int:
    fit = fit_table(pd.read_csv(args.table), args.r_max)
    doc = {"classes": {k: {"gamma0_ms": b.gamma0_ms, "alpha_ms": b.alpha_ms, "beta_ms": b.beta_ms,
                           "gpu_branch_ms": b.gpu_branch_ms,
                           "per_r_mean_ms": dict(zip(map(int, fit.cpu[k].r), map(float, fit.cpu[k].mean_ms))),
                           "per_r_increment_ms": dict(zip(map(int, fit.cpu[k].r), map(float, fit.cpu[k].increment_ms))),
                           "per_r_residual_ms": dict(zip(map(int, fit.cpu[k].r), map(float, fit.cpu[k].residual_ms)))}
                       for k, b in fit.branches.items()},
           "gpu_branch_ms_per_layer": fit.gpu_per_layer,
           "upload": {k: {"latency_ms": u.latency_ms, "bytes_per_ms": u.bytes_per_ms} for k, u in fit.upload.items()}}
    if args.expert_bytes:
        eb = float(args.expert_bytes)
        for k, u in fit.upload.items():
            doc["upload"][k]["expert_ms"] = u.expert_ms(eb)
    with atomic_open(Path(args.out), "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    print(json.dumps({k: {"gamma0": v["gamma0_ms"], "alpha": v["alpha_ms"], "beta": v["beta_ms"]}
                      for k, v in doc["classes"].items()}))
    return 0


def _moe_ids(trace_path: str, plan_layers: np.ndarray) -> np.ndarray:
    t = read_trace(trace_path)
    return np.asarray(t.ids[:, plan_layers, :]).astype(np.int64)


def _cmd_decode(args: argparse.Namespace) -> int:
    p = read_plan(args.plan)
    m = load_profile(args.profile).model(args.model)
    eb = np.asarray(p.expert_bytes)
    layers = np.flatnonzero(eb > 0)
    c = layer_costs_for(m, eb[layers])
    ids = np.concatenate([_moe_ids(t, layers) for t in args.trace])
    hot = p.hot_mask()[layers]
    if args.plan_large:
        big = read_plan(args.plan_large).hot_mask()[layers]
        out = increment_analysis(ids, hot, big, c, m.delta_max_ms())
    else:
        out = {k: v for k, v in decode_analysis(ids, hot, c).items() if not k.startswith("_")}
    print(json.dumps(out, indent=2))
    if args.out:
        with atomic_open(Path(args.out), "w") as f:
            f.write(json.dumps(out, indent=2) + "\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `costmodel` group."""
    p = sub.add_parser("costmodel", help="cost model: paper checks, calibration fits, decode analyses")
    g = p.add_subparsers(dest="costmodel_cmd", required=True)
    c = g.add_parser("check", help="recompute the paper's derived numbers from a profile's constants")
    c.add_argument("--profile", default="paper-4x4090d", help="profile name or YAML path")
    c.add_argument("--model", default="deepseek-v4-flash")
    c.add_argument("--out")
    c.set_defaults(func=_cmd_check)
    f = g.add_parser("fit", help="fit gamma0, alpha, beta, G and upload time from a calibration table (CSV)")
    f.add_argument("--table", required=True, help="CSV: what (cpu|gpu|upload), layer, r, bytes, ms[, size_class, load]")
    f.add_argument("--r-max", type=int, help="fit the line over 1 <= r <= r_max only")
    f.add_argument("--expert-bytes", help="also report the upload time of one expert of this size")
    f.add_argument("--out", required=True)
    f.set_defaults(func=_cmd_fit)
    d = g.add_parser("decode", help="Eq. (1), Prop 3.1 bound and U of a plan on decode traces (or Prop B.2 with --plan-large)")
    d.add_argument("--plan", required=True)
    d.add_argument("--plan-large", help="a larger nested plan: report Prop B.2's increments")
    d.add_argument("--trace", nargs="+", required=True, help="routing traces of decode positions")
    d.add_argument("--profile", default="paper-4x4090d")
    d.add_argument("--model", default="deepseek-v4-flash")
    d.add_argument("--out")
    d.set_defaults(func=_cmd_decode)
