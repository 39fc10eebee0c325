"""`ostinato calibrate`: the cost model's constants on this machine, measured with the `ostinato` engine on a model
(a resident pool, routing forced to r = 0..k cold routes per token and MoE layer)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ostinato.args import int_list
from ostinato.atomic import atomic_open
from ostinato.calibrate.fit import fit_calibration, profile_doc, sim_params_doc
from ostinato.calibrate.run import (TIMER_COLUMNS, CalibrationPlan, CalibrationRow, cold_route_trace, failed,
                                    run_calibration, upload_passes)
from ostinato.costmodel.params import load_profile
from ostinato.models.gguf_shape import MoeShape, moe_shape_from_gguf
from ostinato.presets import RESIDENT_SHARE, UPLOAD_MIN, preset
from ostinato.residency.budget import check_share, expert_budget_from_shape, single_gpu_plan
from ostinato.residency.planfile import read_plan, write_plan
from ostinato.routing.trace import write_trace


def _measure(args: argparse.Namespace, out: Path) -> tuple[MoeShape, dict]:
    """Run the calibration requests; write rows.csv, timers.csv, uploads.csv, plan.json and server.log into `out`."""
    model = Path(args.model)
    shape = moe_shape_from_gguf(model, args.llama_tree)
    k, e = shape.n_expert_used, shape.n_expert
    n_hot = int(round(check_share(args.resident_share) * e))
    if not (k <= n_hot <= e - k):
        raise ValueError(f"--resident-share {args.resident_share}: {n_hot} of {e} experts resident per layer; "
                         f"the calibration needs at least k = {k} hot and k cold experts")
    plan = CalibrationPlan(args.decode_prompt, args.decode, int_list(args.split_sizes, "--split-sizes", minimum=1),
                           args.upload_size, args.reps, args.seed, vocab_hi=min(shape.n_vocab, 20000))
    if max(plan.split_sizes) >= args.upload_min or plan.upload_size < args.upload_min:
        raise ValueError(f"--split-sizes must stay below --upload-min {args.upload_min} and --upload-size reach it")

    # a plan holding experts [0, n_hot) of every MoE layer, and one forced trace per r cold routes
    hot = np.zeros((shape.n_layer, e), dtype=bool)
    hot[shape.moe_layers(), :n_hot] = True
    plan_path = out / "plan.json"
    write_plan(plan_path, single_gpu_plan(shape, hot))
    traces = {}
    for r in range(k + 1):
        traces[r] = out / "traces" / f"r{r}.route"
        if not traces[r].exists():
            write_trace(traces[r], cold_route_trace(shape, n_hot, r, plan.n_pos, args.seed))

    budget = expert_budget_from_shape(shape, int(hot.sum()) * int(max(shape.expert_bytes)))
    cfg = preset("ostinato", budget, plan=str(plan_path), upload_min=args.upload_min)
    # --residency-timers: the engine times its branches (GET /residency), which gives gamma0, alpha, beta and G
    common = ("-c", str(args.ctx), "-t", str(args.threads), "-fa", "on", "-fit", "off", "-lv", "4",
              "--residency-timers", *args.server_arg)
    log_path = out / "server.log"

    def progress(row: CalibrationRow) -> None:
        print(f"[calibrate] {row.what} r={row.r} n={row.n_new} rep={row.rep}: prompt {row.prompt_ms} ms, "
              f"{row.predicted_per_token_ms} ms/token {row.error}", file=sys.stderr, flush=True)

    timings: list[dict] = []
    rows = run_calibration(cfg, Path(args.variants_dir) / cfg.variant / "bin" / "llama-server", model, plan, traces,
                           log_path, common, progress=None if args.no_progress else progress, timings=timings)
    df = pd.DataFrame([r.__dict__ for r in rows])
    with atomic_open(out / "rows.csv", "w") as f:
        df.to_csv(f, index=False)
    with atomic_open(out / "timers.csv", "w") as f:
        pd.DataFrame(timings, columns=TIMER_COLUMNS).to_csv(f, index=False)
    bad = df[failed(df)]
    if len(bad):
        raise RuntimeError(f"{len(bad)} calibration requests failed, first: {bad['error'].iloc[0]} "
                           f"(server log {log_path})")
    ups = upload_passes(log_path.read_text(encoding="utf-8", errors="replace"))
    with atomic_open(out / "uploads.csv", "w") as f:
        ups.to_csv(f, index=False)
    machine = {"name": args.machine, "threads": args.threads, "model_file": model.name,
               "engine": cfg.variant, "server_args": list(cfg.server_args) + list(common)}
    return shape, machine


def _measured(out: Path) -> tuple[MoeShape, dict]:
    """For --refit: the model's shape from the run's plan.json and the machine block of its profile.yaml."""
    for name in ("rows.csv", "uploads.csv", "plan.json", "profile.yaml"):
        if not (out / name).is_file():
            raise FileNotFoundError(f"--refit: {out / name} missing (the outputs of an earlier `ostinato calibrate`)")
    pf = read_plan(out / "plan.json")
    shape = MoeShape(pf.model_name, pf.n_layer, pf.n_expert, pf.n_expert_used, tuple(pf.expert_bytes))
    prof = yaml.safe_load((out / "profile.yaml").read_text(encoding="utf-8"))
    return shape, prof.get("machine", {})


def _cmd_calibrate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.refit:
        shape, machine = _measured(out)
    else:
        if not (args.model and args.llama_tree and args.variants_dir and args.machine):
            raise ValueError("calibrate needs --model, --llama-tree, --variants-dir and --machine (or --refit)")
        shape, machine = _measure(args, out)
    timers = pd.read_csv(out / "timers.csv") if (out / "timers.csv").is_file() else None  # (runs before the timers)
    fit = fit_calibration(pd.read_csv(out / "rows.csv"), pd.read_csv(out / "uploads.csv"), len(shape.moe_layers()),
                          shape.n_expert_used, float(max(shape.expert_bytes)), timers)
    base = load_profile(args.base_profile).model(args.base_model)
    name = args.profile_name or machine.get("name") or args.machine
    with atomic_open(out / "profile.yaml", "w") as f:
        yaml.safe_dump(profile_doc(fit, base, args.base_profile, shape, args.model_name or shape.name, machine, name,
                                   args.upload_min), f, sort_keys=False)
    with atomic_open(out / "sim-params.yaml", "w") as f:
        yaml.safe_dump(sim_params_doc(fit, base, args.upload_min, args.ubatch), f, sort_keys=False)
    with atomic_open(out / "fit.json", "w") as f:
        f.write(json.dumps(fit.to_dict(), indent=2) + "\n")
    load_profile(out / "profile.yaml")  # the written profile loads
    print(json.dumps(fit.to_dict()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `calibrate` command."""
    c = sub.add_parser("calibrate", help="the cost model's constants on this machine (ostinato engine, forced routing)")
    c.add_argument("--model", help="GGUF model")
    c.add_argument("--llama-tree", help="the pinned llama.cpp tree (its gguf-py reads the model)")
    c.add_argument("--variants-dir", help="build/engine/<backend>: ostinato/bin/llama-server")
    c.add_argument("--machine", help="label of this machine (profile name unless --profile-name)")
    c.add_argument("--refit", action="store_true",
                   help="measure nothing: fit again the rows.csv and uploads.csv an earlier run wrote into --out "
                        "(its plan.json gives the model's shape, its profile.yaml the machine)")
    c.add_argument("--profile-name", help="name written into profile.yaml")
    c.add_argument("--model-name", help="model key in profile.yaml (default: the GGUF's name)")
    c.add_argument("--base-profile", default="paper-4x4090d", help="profile that gamma0 and G are taken from")
    c.add_argument("--base-model", default="deepseek-v4-flash", help="model of the base profile")
    c.add_argument("--resident-share", type=float, default=RESIDENT_SHARE,
                   help=f"share of each layer's experts resident (default {RESIDENT_SHARE})")
    c.add_argument("--upload-min", type=int, default=UPLOAD_MIN,
                   help=f"Np of the engine (--residency-upload-min; default {UPLOAD_MIN})")
    c.add_argument("--ubatch", type=int, default=512, help="largest forward pass (llama-server -ub), for sim-params")
    c.add_argument("--decode-prompt", type=int, default=32, help="prompt tokens before the decode measurement")
    c.add_argument("--decode", type=int, default=32, help="forced output tokens of a decode measurement")
    c.add_argument("--split-sizes", default="32,128", help="prompt sizes below Np (split path)")
    c.add_argument("--upload-size", type=int, default=1024, help="a prompt size at or above Np (upload path)")
    c.add_argument("--reps", type=int, default=3)
    c.add_argument("--threads", type=int, default=16)
    c.add_argument("--ctx", type=int, default=4096)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument (repeat)")
    c.add_argument("--out", required=True,
                   help="directory: rows.csv, timers.csv, uploads.csv, fit.json, profile.yaml, sim-params.yaml, plan.json, "
                        "server.log")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=_cmd_calibrate)
