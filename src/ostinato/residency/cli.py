"""`ostinato residency ...`: routing profiles, the capacity test and residency plans (Prop 3.1)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.inputs import read_text
from ostinato.residency.capacity import (Capacity, capacity_test, load_memory_model, longest_request_tokens,
                                         split_layers)
from ostinato.models.gguf_shape import moe_shape_from_gguf
from ostinato.residency.planner import PLAN_RULES
from ostinato.residency.budget import check_shape, plan_from_profile, slots_for_share
from ostinato.residency.planfile import write_plan
from ostinato.residency.profile import profile_from_traces, read_profile, write_profile
from ostinato.residency.summary import plan_summary


def _write_json(path: str, doc: dict) -> None:
    with atomic_open(Path(path), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")


def _cmd_profile(args: argparse.Namespace) -> int:
    prof = profile_from_traces(args.trace)
    write_profile(args.out, prof)
    print(json.dumps({"out": args.out, "n_pos": prof.n_pos, "routes": prof.total_routes(),
                      "moe_layers": len(prof.moe_layers())}))
    return 0


def _cmd_capacity(args: argparse.Namespace) -> int:
    m = load_memory_model(args.memory)
    if args.kv_tokens_from:
        from dataclasses import replace
        m = replace(m, kv_tokens=longest_request_tokens(args.kv_tokens_from))
    cap = capacity_test(m)
    with atomic_open(Path(args.out), "w") as f:
        f.write(cap.to_json() + "\n")
    print(json.dumps({"slots": cap.slots, "pool_bytes": cap.pool_bytes, "kv_tokens": m.kv_tokens,
                      "notes": cap.notes}))
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    dev = read_profile(args.profile)
    n_layer = dev.shape.n_layer
    shape = None
    if args.gguf:  # read once: it gives the slots of --resident-share and each layer's expert bytes
        if not args.llama_tree:
            raise ValueError("--gguf needs --llama-tree (the pinned tree whose gguf-py reads the model)")
        shape = moe_shape_from_gguf(args.gguf, args.llama_tree)
    if args.capacity:
        cap = Capacity.from_json(read_text(args.capacity, "a capacity test's JSON"), args.capacity)
        layer_gpu, pool, eb = np.asarray(cap.layer_gpu[:n_layer]), cap.pool_bytes, np.asarray(cap.expert_bytes)
        if eb.size != n_layer:
            raise ValueError(f"capacity has {eb.size} layers, the profile {n_layer}")
    else:
        if args.resident_share is not None:
            if not args.gguf or args.slots:
                raise ValueError("--resident-share needs --gguf and replaces --slots")
            args.slots = str(slots_for_share(dev, shape, args.resident_share))
        if not args.slots or not (args.expert_bytes or args.gguf):
            raise ValueError("give --capacity, or --slots with --expert-bytes or --gguf")
        slots = [int(x) for x in args.slots.split(",")]
        layer_gpu = split_layers(n_layer, [1] * len(slots))[:n_layer]
        one = int(float(args.expert_bytes)) if args.expert_bytes else 0
        eb = np.where(dev.counts.sum(axis=1) > 0, one, 0)
        pool = [s * one for s in slots]
    if args.gguf:
        # the engine checks every layer's expert bytes against the model: take them from the model itself
        check_shape(dev, shape)
        eb = np.asarray(shape.expert_bytes, dtype=np.int64)
        if not args.capacity:
            pool = [s * int(eb.max()) for s in slots]
    pf, plan = plan_from_profile(dev, layer_gpu, eb, pool, args.model_name, args.rule)
    cs = write_plan(args.out, pf)
    held = read_profile(args.heldout) if args.heldout else None
    summ = plan_summary(plan.hot, layer_gpu, dev, held)
    summ.update({"checksum": cs, "class_split": [{str(k): v for k, v in d.items()} for d in plan.class_split]})
    if args.summary:
        _write_json(args.summary, summ)
    print(json.dumps({k: summ[k] for k in ("n_resident", "dev_coverage", "checksum")}
                     | ({"heldout_coverage": summ["heldout_coverage"]} if held else {})))
    return 0


def _ints(text: str, flag: str, n: int | None = None) -> tuple[int, ...]:
    try:
        v = tuple(int(float(x)) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a comma list of integers") from None
    if n is not None and len(v) != n:
        raise ValueError(f"{flag} {text!r}: expected {n} values, got {len(v)}")
    return v


def _cmd_memory(args: argparse.Namespace) -> int:
    import yaml

    from ostinato.residency.memory_check import check_memory

    ctx = _ints(args.ctx_sizes, "--ctx-sizes", 3)
    if not ctx[0] < ctx[1] < ctx[2]:
        raise ValueError(f"--ctx-sizes {args.ctx_sizes!r}: expected three increasing sizes")
    chk = check_memory(Path(args.server_bin), Path(args.model), Path(args.llama_tree), Path(args.log_dir), ctx,
                       args.ubatch, args.device, tuple(args.server_arg))
    mm = chk.memory_model(list(_ints(args.gpu_total_bytes, "--gpu-total-bytes")), args.margin_bytes,
                          args.reserved_bytes)
    with atomic_open(Path(args.out), "w") as f:
        f.write("# memory model of " + Path(args.model).name + ": weights from the GGUF, context and compute buffers "
                "fitted on what llama-server reported (ostinato residency memory)\n")
        yaml.safe_dump(mm, f, sort_keys=False)
    rep = chk.to_dict()
    with atomic_open(Path(args.report), "w") as f:
        f.write(json.dumps(rep, indent=2) + "\n")
    for k in ("weights", "context", "compute"):
        r = rep[k]
        pred = r.get("gguf_total_bytes", r.get("predicted_bytes"))
        flag = ("ok " if r["ok"] else "BAD") if "ok" in r else "   "
        print(f"{flag} {k:8s} model {pred / 2**20:10.3f} MiB  engine {r['reported_bytes'] / 2**20:10.3f} MiB"
              f"  (tolerance {r['tolerance_bytes'] / 2**20:.3f} MiB)"
              + ("" if "ok" in r else "  line through the smaller contexts; the model uses the engine's number"))
    return 0 if chk.ok else 1


def _floats(flag: str, text: str, lo: float, hi: float | None) -> list[float]:
    """A comma list of numbers in [lo, hi] (hi None: unbounded), or an error naming the flag."""
    from ostinato.errors import InputError

    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(not (lo <= v and (hi is None or v <= hi)) for v in vals):
        raise InputError(f"{flag}: expected a comma list of numbers in [{lo}, {hi if hi is not None else 'inf'}], "
                         f"got {text!r}")
    return vals


def _borrow_grid(args: argparse.Namespace) -> tuple[list[float], list[float], list[int]]:
    """The borrowed-memory grid of `borrow-tune` and `borrow-sweep` (--decay, --margin, --admit; --slots checked),
    or an error naming the flag."""
    from ostinato.errors import InputError

    if args.slots != "all" and not (args.slots.isdigit() and int(args.slots) > 0):
        raise InputError(f"--slots: expected 'all' or a number of slots per pool > 0, got {args.slots!r}")
    admits = _floats("--admit", args.admit, 1.0, None)
    if any(a != int(a) for a in admits):
        raise InputError(f"--admit: expected whole numbers of copies >= 1, got {args.admit!r}")
    decays, margins = _floats("--decay", args.decay, 1e-9, 1.0), _floats("--margin", args.margin, 0.0, None)
    return decays, margins, [int(a) for a in admits]


def _cmd_borrow_sweep(args: argparse.Namespace) -> int:
    import tempfile

    import pandas as pd

    from ostinato.errors import InputError
    from ostinato.inputs import load_json
    from ostinato.models.gguf_shape import moe_shape_from_spec
    from ostinato.sweep.borrow_model import borrow_sweep_table

    summary = load_json(args.summary, "the summary.json of `ostinato sweep`")
    if not isinstance(summary, dict) or not isinstance(summary.get("meta"), dict) or not isinstance(
            summary.get("rows"), list) or any(k not in summary["meta"] for k in (
            "prefixes", "sizes", "n_decode", "reps", "upload_min", "resident_share", "budget_bytes")):
        raise InputError(f"{args.summary}: expected the summary.json of `ostinato sweep` (meta with prefixes, sizes, "
                         f"n_decode, reps, upload_min, resident_share and budget_bytes; rows)")
    if (args.model is None) == (args.spec is None):
        raise InputError("give the sweep's model either as --model GGUF (with --llama-tree) or as --spec NAME "
                         "(with --expert-type)")
    if args.model is not None:
        if args.llama_tree is None:
            raise InputError("--model needs --llama-tree (the pinned llama.cpp tree whose gguf-py reads the model)")
        shape = moe_shape_from_gguf(args.model, args.llama_tree)
    else:
        try:
            shape = moe_shape_from_spec(args.spec, args.expert_type)
        except ValueError as e:
            raise InputError(f"--spec {args.spec} --expert-type {args.expert_type}: {e}") from e
    decays, margins, admits = _borrow_grid(args)
    ran = None
    if args.ran is not None:
        parts = args.ran.split(",")
        try:
            ran = (float(parts[0]), float(parts[1]), int(parts[2]))
        except (IndexError, ValueError):
            raise InputError(f"--ran: expected DECAY,MARGIN,ADMIT (e.g. 0.95,0.25,4), got {args.ran!r}") from None
        if len(parts) != 3:
            raise InputError(f"--ran: expected DECAY,MARGIN,ADMIT (e.g. 0.95,0.25,4), got {args.ran!r}")
    prompt_n = args.decode_prompt_n
    if prompt_n is None:
        # what the server computed again of each decode request's cached prompt: the sweep's rows beside its summary
        rows_csv = Path(args.summary).with_name("rows.csv")
        if not rows_csv.is_file():
            raise InputError(f"--decode-prompt-n: not given and no {rows_csv} beside {args.summary} to read it from")
        dec = pd.read_csv(rows_csv)
        dec = dec[(dec["kind"] == "decode") & dec["error"].isna()]["prompt_n"]
        if dec.empty or dec.nunique() != 1:
            raise InputError(f"{rows_csv}: expected decode rows that all computed the same number of prompt tokens "
                             f"again (prompt_n), got {sorted(dec.unique().tolist())}; give --decode-prompt-n")
        prompt_n = int(dec.iloc[0])
    if prompt_n < 1:
        raise InputError(f"--decode-prompt-n: expected at least 1, got {prompt_n}")
    with tempfile.TemporaryDirectory(prefix="ostinato-borrow-sweep-") as tmp:
        rows = borrow_sweep_table(summary, shape, args.work_dir or tmp, decays, margins, admits,
                                  None if args.slots == "all" else int(args.slots), ran, prompt_n)
    with atomic_open(Path(args.out), "w") as f:
        pd.DataFrame(rows).to_csv(f, index=False, float_format="%.4f")
    for r in rows:
        print(json.dumps(r))
    return 0


def _cmd_borrow_tune(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ostinato.errors import InputError
    from ostinato.residency.borrow import choose, net_share, plan_pools, tune
    from ostinato.residency.planfile import read_plan
    from ostinato.routing.trace import read_trace
    from ostinato.sim.run import read_sessions, routing_file

    plan = read_plan(args.plan)
    decays, margins, admits = _borrow_grid(args)
    if not args.admission_cost >= 0.0:
        raise InputError(f"--admission-cost: expected a number of cold routes >= 0, got {args.admission_cost}")
    if args.jobs < 1:
        raise InputError(f"--jobs: expected a number of processes >= 1, got {args.jobs}")
    sessions = read_sessions(args.sessions)
    routing = {}
    for sid, reqs in sessions:
        t = read_trace(routing_file(args.routing, sid))
        if t.ids.shape[1:] != (plan.n_layer, plan.n_expert_used):
            raise InputError(f"{routing_file(args.routing, sid)}: {t.ids.shape[1]} layers and {t.ids.shape[2]} routes "
                             f"per token, the plan {args.plan} has {plan.n_layer} and {plan.n_expert_used}")
        need = sum(r.n_new + r.n_output for r in reqs) - 1  # (the last output token is never computed)
        if t.ids.shape[0] < need:
            raise InputError(f"{routing_file(args.routing, sid)}: {t.ids.shape[0]} positions, session {sid} of "
                             f"{args.sessions} needs {need}")
        routing[sid] = np.asarray(t.ids, dtype=np.int64)
    slots = plan.n_expert if args.slots == "all" else int(args.slots)
    bar = tqdm(total=len(decays) * len(margins) * len(admits) * len(sessions), desc="borrow-tune",
               disable=args.no_progress)
    grid = tune(sessions, routing, plan.hot_mask(), plan_pools(plan.gpu_layers, plan.expert_bytes), slots, decays,
                margins, admits, args.upload_min, args.ubatch, progress=bar.update, jobs=args.jobs)
    bar.close()
    for r in grid:
        r["net_share"] = net_share(r, args.admission_cost)
    doc = {"chosen": choose(grid, args.admission_cost), "grid": grid, "plan": args.plan, "sessions": args.sessions,
           "n_sessions": len(sessions), "upload_min": args.upload_min, "ubatch": args.ubatch,
           "admission_cost": args.admission_cost,
           "metric": "net_share: the share of decode steps' plan-cold routes computed on borrowed experts, less "
                     "admission_cost routes per copy (the engine's rules: ostinato.residency.borrow)"}
    _write_json(args.out, doc)
    print(json.dumps({"out": args.out, **doc["chosen"]}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `residency` group."""
    p = sub.add_parser("residency", help="routing profiles, capacity test and residency plans")
    g = p.add_subparsers(dest="residency_cmd", required=True)
    s = g.add_parser("profile", help="count routes per (layer, expert) from routing traces")
    s.add_argument("--trace", nargs="+", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=_cmd_profile)
    c = g.add_parser("capacity", help="expert slots per GPU from a memory model (YAML)")
    c.add_argument("--memory", required=True)
    c.add_argument("--kv-tokens-from", help="sessions JSONL: use its longest request as kv_tokens")
    c.add_argument("--out", required=True)
    c.set_defaults(func=_cmd_capacity)
    m = g.add_parser("memory", help="the memory model's terms from a GGUF and the engine's reports, checked against them")
    m.add_argument("--model", required=True, help="GGUF model")
    m.add_argument("--llama-tree", required=True, help="the pinned llama.cpp tree (its gguf-py reads the model)")
    m.add_argument("--server-bin", required=True, help="llama-server of the engine whose buffers are measured")
    m.add_argument("--ctx-sizes", default="4096,8192,16384",
                   help="three increasing context sizes: fit on the first two, check the third (the largest sizes the "
                        "compute buffers of the model)")
    m.add_argument("--ubatch", type=int, default=512, help="the run's largest forward pass (llama-server -ub)")
    m.add_argument("--device", default="CPU", help="buffers of this device prefix (CPU, CUDA0, ...)")
    m.add_argument("--gpu-total-bytes", required=True, help="comma list: memory of each GPU the capacity test divides")
    m.add_argument("--margin-bytes", type=int, default=0)
    m.add_argument("--reserved-bytes", type=int, default=0)
    m.add_argument("--server-arg", action="append", default=[], help="extra llama-server argument (repeat)")
    m.add_argument("--log-dir", required=True, help="where the server logs go")
    m.add_argument("--out", required=True, help="memory-model YAML")
    m.add_argument("--report", required=True, help="JSON: every term, the engine's numbers, the checks")
    m.set_defaults(func=_cmd_memory)
    q = g.add_parser("plan", help="residency plan file and summary (frequency-ranked, or uniform per layer)")
    q.add_argument("--profile", required=True, help="development routing profile (JSON)")
    q.add_argument("--capacity", help="capacity JSON from `residency capacity`")
    q.add_argument("--slots", help="comma list of slots per GPU (instead of --capacity; equal layer split)")
    q.add_argument("--expert-bytes", help="bytes of one expert (with --slots)")
    q.add_argument("--gguf", help="the model: take each layer's expert bytes from it (as the engine checks them)")
    q.add_argument("--llama-tree", help="with --gguf: the pinned llama.cpp tree (its gguf-py reads the model)")
    q.add_argument("--resident-share", type=float, help="with --gguf, one GPU: this share of the profile's MoE "
                   "layers' experts is resident (instead of --slots)")
    q.add_argument("--rule", choices=sorted(PLAN_RULES), default="frequency",
                   help="frequency (default): each pool's most-routed experts of all its layers (Prop 3.1); uniform: "
                        "the same number of experts in every layer of a pool, each layer's most-routed "
                        "(KTransformers' default placement)")
    q.add_argument("--model-name", default="")
    q.add_argument("--heldout", help="held-out routing profile, for the summary's coverage")
    q.add_argument("--out", required=True)
    q.add_argument("--summary")
    q.set_defaults(func=_cmd_plan)
    b = g.add_parser("borrow-tune", help="borrowed memory's decay, margin and copies per step chosen on development "
                     "sessions: the engine's rules (ostinato.residency.borrow) over their recorded routing, for each "
                     "combination of a grid")
    b.add_argument("--plan", required=True, help="the residency plan the engine loads")
    b.add_argument("--sessions", required=True, help="development sessions (JSONL, or a routing manifest.json)")
    b.add_argument("--routing", required=True, help="their routing traces: <dir>/<session, / -> __>.route")
    b.add_argument("--slots", default="all", help="borrowed slots per pool, or 'all' (default: all, the engine's "
                   "--residency-borrow all)")
    b.add_argument("--decay", default="0.8,0.9,0.95,0.98,0.99", help="comma list of decays to try")
    b.add_argument("--margin", default="0,0.1,0.25,0.5,1,2", help="comma list of margins to try")
    b.add_argument("--admit", default="1,2,4", help="comma list of copies per pool and token boundary to try "
                   "(default 1,2,4)")
    b.add_argument("--admission-cost", type=float, default=1.0,
                   help="what one copy costs, in cold routes computed on the CPU: the grid's choice maximizes the "
                        "borrowed routes less this per copy (default 1: on the H200 an expert's copy took about a "
                        "cold route's time; 0: the largest share of borrowed routes)")
    b.add_argument("--upload-min", type=int, default=512, help="Np: passes of this many tokens take back the slots")
    b.add_argument("--ubatch", type=int, default=512, help="the largest forward pass (llama-server -ub)")
    b.add_argument("--jobs", type=int, default=1,
                   help="processes the grid points run in (the rows are the same for every count; default: 1)")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--out", required=True, help="JSON: the chosen parameters and the whole grid")
    b.set_defaults(func=_cmd_borrow_tune)
    w = g.add_parser("borrow-sweep", help="borrowed memory over an `ostinato sweep`'s passes, simulated: the engine's "
                     "rules over the sweep's routing made again from its summary, per decode step, beside the "
                     "counters the sweep measured for the engines that ran the same parameters")
    w.add_argument("--summary", required=True, help="the sweep's summary.json")
    w.add_argument("--model", help="the sweep's GGUF model (its shape), with --llama-tree")
    w.add_argument("--llama-tree", help="the pinned llama.cpp tree (its gguf-py reads the model)")
    w.add_argument("--spec", help="instead of --model: the spec the model was synthesized from "
                   "(`ostinato models synth --spec`), with --expert-type")
    w.add_argument("--expert-type", default="mxfp4", help="the synthesized model's expert type (default mxfp4)")
    w.add_argument("--slots", default="all", help="borrowed slots per pool, or 'all' (default: all)")
    w.add_argument("--decay", default="0.95", help="comma list of decays (default 0.95, the engine's)")
    w.add_argument("--margin", default="0.25", help="comma list of margins (default 0.25, the engine's)")
    w.add_argument("--admit", default="4", help="comma list of copies per pool and step (default 4, the engine's)")
    w.add_argument("--ran", help="DECAY,MARGIN,ADMIT: what the sweep's presets with borrowed memory ran, for a summary "
                   "that does not record it (before its meta had `server_args`); its measured rows go beside those "
                   "parameters' simulated ones")
    w.add_argument("--decode-prompt-n", type=int, help="the cached prompt's tokens each decode request computed again "
                   "(default: the decode rows' prompt_n of the rows.csv beside the summary)")
    w.add_argument("--work-dir", help="where the routing traces and plans go (default: a temporary folder)")
    w.add_argument("--out", required=True, help="CSV: one row per parameters, prefix and series (simulated, or "
                   "measured with the engine's name)")
    w.set_defaults(func=_cmd_borrow_sweep)
