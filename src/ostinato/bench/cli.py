"""`ostinato bench prefill` (TTFT by prefill size and decode TPOT of engine configurations) and `ostinato bench calibrate`
(the cost model's constants on this machine), both with forced routing."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import pandas as pd
import yaml

from ostinato.atomic import atomic_open
from ostinato.bench.calibrate import (CalibrationPlan, CalibrationRow, cold_route_trace, fit_calibration, profile_doc,
                                      run_calibration, sim_params_doc, upload_passes)
from ostinato.costmodel.params import load_profile
from ostinato.bench.cold import cold_per_token_layer, whole_layer_hot
from ostinato.bench.prefill import BenchPlan, EngineRun, run_engine, summarize, write_rows, write_summary
from ostinato.engines import expert_budget_from_shape, preset
from ostinato.residency.gguf_shape import moe_shape_from_gguf, single_gpu_plan
from ostinato.residency.planfile import PlanFile, write_plan
from ostinato.residency.planner import plan_frequency
from ostinato.residency.profile import profile_from_traces
from ostinato.routing.generator import PROFILES, write_session_trace
from ostinato.routing.layout import RequestSpan, SessionLayout
from ostinato.routing.shapes import custom_shape
from ostinato.routing.trace import read_trace, write_trace


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--sizes {text!r}: expected a comma list of token counts") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes {text!r}: every size must be at least 1")
    return sizes


def _cmd_prefill(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model)
    shape = moe_shape_from_gguf(model, args.llama_tree)
    rshape = custom_shape(shape.n_layer, shape.n_expert, shape.n_expert_used, shape.moe_layers())
    if shape.n_vocab < 300:
        raise ValueError(f"--model {model}: vocabulary of {shape.n_vocab} tokens; the benchmark draws prompt "
                         f"tokens from ids 100..min(n_vocab, 20000)")
    plan = BenchPlan(args.prefix, _sizes(args.sizes), args.decode, args.reps, vocab_hi=min(shape.n_vocab, 20000),
                     seed=args.seed)
    profile = PROFILES[args.routing_profile]

    # routing: development sessions (for the plan) and the benchmark's own session, same generator and workload
    dev_paths = []
    for i in range(args.dev_sessions):
        p = out / "traces" / f"dev-{i}.route"
        if not p.exists():
            lay = SessionLayout(f"dev-{i}", (RequestSpan(0, "first", 0, args.dev_tokens, 0),))
            write_session_trace(p, rshape, lay, profile, args.workload, seed=args.seed)
        dev_paths.append(p)
    bench_trace = out / "traces" / "bench.route"
    if not bench_trace.exists():
        lay = SessionLayout("bench", (RequestSpan(0, "first", 0, plan.prefix + max(plan.sizes), plan.n_decode + 1),))
        write_session_trace(bench_trace, rshape, lay, profile, args.workload, seed=args.seed)
    trace = read_trace(bench_trace)

    # equal GPU memory for experts: a share of all routed-expert bytes
    eb = np.array(shape.expert_bytes, dtype=np.int64)
    total = int(eb.sum()) * shape.n_expert
    budget_bytes = int(args.expert_fraction * total)
    budget = expert_budget_from_shape(shape, budget_bytes)
    prof = profile_from_traces(dev_paths)
    layer_gpu = np.zeros(shape.n_layer, dtype=int)
    pl = plan_frequency(prof.counts, layer_gpu, eb, [budget_bytes])
    plan_path = out / "plan.json"
    write_plan(plan_path, PlanFile(shape.name, shape.n_layer, shape.n_expert, shape.n_expert_used,
                                   [int(x) for x in eb], [list(range(shape.n_layer))], [budget_bytes],
                                   pl.gpu_slots, prof.sha256()))

    # cold routes per token and layer under each placement, on the benchmark's prefill and decode positions
    moe = shape.moe_layers()
    n_gpu_layers = budget.layers_on_gpu()
    placements = {"ostinato": pl.hot, "llama.cpp-layers": whole_layer_hot(shape.n_layer, shape.n_expert, moe[len(moe) - n_gpu_layers:]),
                  "llama.cpp-cpu-experts": whole_layer_hot(shape.n_layer, shape.n_expert, [])}
    lo_p, hi_p = plan.prefix, plan.prefix + max(plan.sizes)
    cold = {name: {"prefill": cold_per_token_layer(trace, hot, lo_p, hi_p),
                   "decode": cold_per_token_layer(trace, hot, hi_p, hi_p + plan.n_decode),
                   "resident_experts": int(hot.sum())}
            for name, hot in placements.items()}
    with atomic_open(out / "cold.json", "w") as f:
        f.write(json.dumps({"k": shape.n_expert_used, "budget_bytes": budget_bytes, "placements": cold}, indent=2) + "\n")

    bins = Path(args.variants_dir)
    common = ["-c", str(args.ctx), "-t", str(args.threads), "-fa", "on", "--routing-force", str(bench_trace),
              "-fit", "off", "-lv", "4", *args.server_arg]
    rows = []
    for name in args.engines.split(","):
        if name == "ostinato":
            cfg = preset("ostinato", budget, plan=str(plan_path), upload_min=args.np_min)
        else:
            cfg = preset(name, budget)
        run = EngineRun(cfg, bins / cfg.variant / "bin" / "llama-server", tuple(common))

        def progress(engine, rep, n, o):
            what = f"prefill {n}" if n >= 0 else "decode"
            print(f"[bench] {engine} rep {rep} {what}: ttft {o.ttft} tpot {o.tpot} ok={o.success}",
                  file=sys.stderr, flush=True)

        print(f"[bench] {cfg.name}: {' '.join(cfg.server_args)} {cfg.env}", file=sys.stderr, flush=True)
        rows += run_engine(run, model, plan, out, progress=None if args.no_progress else progress)
        write_rows(out / "rows.csv", rows)

    summ = summarize(rows, args.baseline)
    write_summary(out / "summary.json", summ, {"model": str(model), "prefix": plan.prefix, "sizes": list(plan.sizes),
                                               "n_decode": plan.n_decode, "reps": plan.reps, "np_min": args.np_min,
                                               "expert_fraction": args.expert_fraction, "budget_bytes": budget_bytes,
                                               "engines": args.engines, "routing_profile": args.routing_profile,
                                               "cold": cold})
    for r in summ:
        print(json.dumps(r))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model)
    shape = moe_shape_from_gguf(model, args.llama_tree)
    k, e = shape.n_expert_used, shape.n_expert
    n_hot = int(round(args.expert_fraction * e))
    if not (k <= n_hot <= e - k):
        raise ValueError(f"--expert-fraction {args.expert_fraction}: {n_hot} of {e} experts resident per layer; "
                         f"the calibration needs at least k = {k} hot and k cold experts")
    plan = CalibrationPlan(args.decode_prompt, args.decode, _sizes(args.split_sizes), args.upload_size, args.reps,
                           args.seed, vocab_hi=min(shape.n_vocab, 20000))
    if max(plan.split_sizes) >= args.np_min or plan.upload_size < args.np_min:
        raise ValueError(f"--split-sizes must stay below --np-min {args.np_min} and --upload-size reach it")
    base = load_profile(args.base_profile).model(args.base_model)

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
    cfg = preset("ostinato", budget, plan=str(plan_path), upload_min=args.np_min)
    common = ("-c", str(args.ctx), "-t", str(args.threads), "-fa", "on", "-fit", "off", "-lv", "4", *args.server_arg)
    log_path = out / "server.log"

    def progress(row: CalibrationRow) -> None:
        print(f"[calibrate] {row.what} r={row.r} n={row.n_new} rep={row.rep}: prompt {row.prompt_ms} ms, "
              f"{row.predicted_per_token_ms} ms/token {row.error}", file=sys.stderr, flush=True)

    rows = run_calibration(cfg, Path(args.variants_dir) / cfg.variant / "bin" / "llama-server", model, plan, traces,
                           log_path, common, progress=None if args.no_progress else progress)
    df = pd.DataFrame([r.__dict__ for r in rows])
    with atomic_open(out / "rows.csv", "w") as f:
        df.to_csv(f, index=False)
    failed = df[df["error"].fillna("") != ""]
    if len(failed):
        raise RuntimeError(f"{len(failed)} calibration requests failed, first: {failed['error'].iloc[0]} "
                           f"(server log {log_path})")
    ups = upload_passes(log_path.read_text(encoding="utf-8", errors="replace"))
    with atomic_open(out / "uploads.csv", "w") as f:
        ups.to_csv(f, index=False)
    fit = fit_calibration(df, ups, len(shape.moe_layers()), k, float(max(shape.expert_bytes)))
    machine = {"name": args.machine, "threads": args.threads, "model_file": model.name,
               "engine": cfg.variant, "server_args": list(cfg.server_args) + list(common)}
    name = args.profile_name or args.machine
    with atomic_open(out / "profile.yaml", "w") as f:
        yaml.safe_dump(profile_doc(fit, base, args.base_profile, shape, args.model_name or shape.name, machine, name,
                                   args.np_min), f, sort_keys=False)
    with atomic_open(out / "sim-params.yaml", "w") as f:
        yaml.safe_dump(sim_params_doc(fit, base, args.np_min, args.ubatch), f, sort_keys=False)
    with atomic_open(out / "fit.json", "w") as f:
        f.write(json.dumps(fit.to_dict(), indent=2) + "\n")
    load_profile(out / "profile.yaml")  # the written profile loads
    print(json.dumps(fit.to_dict()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `bench` group."""
    p = sub.add_parser("bench", help="benchmarks of engine configurations on this machine")
    g = p.add_subparsers(dest="bench_cmd", required=True)
    q = g.add_parser("prefill", help="TTFT by number of new tokens after a prefix, and decode TPOT, per engine")
    q.add_argument("--model", required=True, help="GGUF model")
    q.add_argument("--llama-tree", required=True, help="the pinned llama.cpp tree (its gguf-py reads the model)")
    q.add_argument("--variants-dir", required=True, help="build/engine/<backend>: <variant>/bin/llama-server")
    q.add_argument("--engines", default="llama.cpp-layers,llama.cpp-cpu-experts,ostinato",
                   help="comma list of engine presets (ostinato: resident pools from the plan made here)")
    q.add_argument("--baseline", default="llama.cpp-layers", help="engine the ratios refer to")
    q.add_argument("--expert-fraction", type=float, default=0.5,
                   help="GPU memory for routed experts, as a share of all their bytes (same for every engine)")
    q.add_argument("--np-min", type=int, default=512, help="Np of the ostinato engine")
    q.add_argument("--prefix", type=int, default=4096)
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
    q.add_argument("--out", required=True, help="directory: rows.csv, summary.json, plan.json, cold.json, logs")
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=_cmd_prefill)

    c = g.add_parser("calibrate", help="the cost model's constants on this machine (ostinato engine, forced routing)")
    c.add_argument("--model", required=True, help="GGUF model")
    c.add_argument("--llama-tree", required=True, help="the pinned llama.cpp tree (its gguf-py reads the model)")
    c.add_argument("--variants-dir", required=True, help="build/engine/<backend>: ostinato/bin/llama-server")
    c.add_argument("--machine", required=True, help="label of this machine (profile name unless --profile-name)")
    c.add_argument("--profile-name", help="name written into profile.yaml")
    c.add_argument("--model-name", help="model key in profile.yaml (default: the GGUF's name)")
    c.add_argument("--base-profile", default="paper-4x4090d", help="profile that gamma0 and G are taken from")
    c.add_argument("--base-model", default="deepseek-v4-flash", help="model of the base profile")
    c.add_argument("--expert-fraction", type=float, default=0.5, help="share of each layer's experts resident")
    c.add_argument("--np-min", type=int, default=512, help="Np of the engine")
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
                   help="directory: rows.csv, uploads.csv, fit.json, profile.yaml, sim-params.yaml, plan.json, server.log")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=_cmd_calibrate)
