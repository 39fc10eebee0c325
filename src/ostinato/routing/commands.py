"""`ostinato routing generate` and `ostinato routing stats`: synthetic traces for sessions, and their routing facts."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from ostinato.atomic import atomic_open
from ostinato.routing.generator import PROFILES, write_session_trace
from ostinato.routing.trace import trace_filename
from ostinato.errors import InputError
from ostinato.routing.layout import SessionLayout, read_layouts, read_manifest_layouts, synthetic_layouts
from ostinato.routing.shapes import SHAPES, ModelShape, custom_shape, get_shape
from ostinato.routing.stats import PAPER_PAIRS, open_trace_dir, routing_facts

MANIFEST = "manifest.json"


def add_generate_args(p: argparse.ArgumentParser) -> None:
    """Options of `routing generate`."""
    p.add_argument("--model", default="deepseek-v4-flash",
                   help=f"named shape ({', '.join(SHAPES)}) or 'custom' with --n-layer/--n-expert/--n-expert-used")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-expert", type=int)
    p.add_argument("--n-expert-used", type=int)
    p.add_argument("--moe-layers", help="custom shape: comma list of MoE layers (default: all)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--sessions", help="sessions JSONL (`ostinato sessions build`): n_new/n_output per request")
    src.add_argument("--synthetic-sessions", type=int, metavar="N",
                     help="instead, N sessions with request sizes like --workload's")
    p.add_argument("--select", type=int, default=0, help="first N sessions of --sessions (0 = all)")
    p.add_argument("--workload", default="swe", help="workload name: routing drifts by workload (swe, tau2, ...)")
    p.add_argument("--profile", default="calibrated", choices=sorted(PROFILES))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a profile parameter, e.g. --set decode_temp=1.2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--session-seed", type=int, default=0, help="seed of --synthetic-sessions' request sizes")
    p.add_argument("--out", required=True, help="directory: <session>.route per session and manifest.json")
    p.add_argument("--no-progress", action="store_true")


def _shape(args: argparse.Namespace) -> ModelShape:
    if args.model != "custom":
        return get_shape(args.model)
    if None in (args.n_layer, args.n_expert, args.n_expert_used):
        raise ValueError("--model custom needs --n-layer, --n-expert and --n-expert-used")
    layers = [int(x) for x in args.moe_layers.split(",")] if args.moe_layers else None
    return custom_shape(args.n_layer, args.n_expert, args.n_expert_used, layers)


def _profile(args: argparse.Namespace):
    prof = PROFILES[args.profile]
    fields = asdict(prof)
    over = {}
    for kv in args.set:
        key, _, val = kv.partition("=")
        if key not in fields or key == "name":
            known = ", ".join(k for k in fields if k != "name")
            raise ValueError(f"--set {kv}: unknown profile parameter; known: {known}")
        over[key] = type(fields[key])(val)
    return replace(prof, **over, name=f"{prof.name}+" + ",".join(args.set)) if over else prof


def cmd_generate(args: argparse.Namespace) -> int:
    """Write one synthetic trace per session plus a manifest (shape, profile, seed, request layout)."""
    shape = _shape(args)
    profile = _profile(args)
    if args.sessions:
        layouts = read_layouts(args.sessions, select=args.select)
    else:
        layouts = synthetic_layouts(args.workload, args.synthetic_sessions, seed=args.session_seed)
    if not layouts:
        raise InputError(f"no sessions to generate routing for ({args.sessions or '--synthetic-sessions 0'})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = sum(lay.n_pos for lay in layouts)
    entries = []
    with tqdm(total=total, unit="pos", disable=args.no_progress, file=sys.stderr) as bar:
        for lay in layouts:
            name = trace_filename(lay.session)
            write_session_trace(out / name, shape, lay, profile, args.workload, args.seed, progress=bar.update)
            entries.append(dict(lay.to_json(), file=name, n_pos=lay.n_pos))
    manifest = {"synthetic": True, "generator": "ostinato.routing.generator", "model": asdict(shape),
                "profile": profile.to_json(), "workload": args.workload, "seed": args.seed,
                "source": args.sessions or f"synthetic-sessions:{args.workload}:{args.session_seed}",
                "sessions": entries}
    with atomic_open(out / MANIFEST) as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(layouts)} traces, {total} positions, to {out}", file=sys.stderr)
    return 0


def add_stats_args(p: argparse.ArgumentParser) -> None:
    """Options of `routing stats`."""
    p.add_argument("--dev", nargs="+", required=True, help="trace directories of the development sessions")
    p.add_argument("--heldout", nargs="+", required=True, help="trace directories of the held-out sessions")
    p.add_argument("--dev-sessions", nargs="+", help="sessions JSONL of --dev: one for every directory, or one per "
                   "directory in --dev's order (default: each directory's manifest.json)")
    p.add_argument("--heldout-sessions", nargs="+", help="sessions JSONL of --heldout, as --dev-sessions "
                   "(default: manifest.json)")
    p.add_argument("--n-resident-decode", type=int, default=4864, help="resident experts for coverage, 2,048-token "
                   "passes and decode (44%% of 43x256)")
    p.add_argument("--n-resident-prefill", type=int, default=5702, help="resident experts for short prefills")
    p.add_argument("--paper-shares", action="store_true",
                   help="take --n-resident-decode/--n-resident-prefill as counts out of the paper's 43 x 256 = 11,008 "
                        "experts and keep the same shares of the traces' own experts (a model of fewer layers)")
    p.add_argument("--label", help="series label (default: simulated (<profile>) or measured (<machine>))")
    p.add_argument("--machine", default="", help="machine label of recorded (non-synthetic) traces")
    p.add_argument("--out", required=True, help="JSON: facts, per-target paper value, range and result")


def _dir_layouts(directory: str, sessions: str | None) -> tuple[list[SessionLayout], dict]:
    """The layouts of a trace directory: from a sessions JSONL, else from the directory's manifest (which also
    states each trace's positions: `exact`)."""
    if sessions:
        return read_layouts(sessions), {}
    mpath = Path(directory) / MANIFEST
    if not mpath.exists():
        raise FileNotFoundError(f"{mpath}: no manifest; pass the sessions JSONL of {directory}")
    return read_manifest_layouts(mpath)


def cmd_stats(args: argparse.Namespace) -> int:
    """Print and write the routing facts (target vs achieved) of development and held-out trace sets."""
    sets, manifests = {}, []
    for key, dirs, sess in (("dev", args.dev, args.dev_sessions), ("heldout", args.heldout, args.heldout_sessions)):
        if sess and len(sess) not in (1, len(dirs)):
            raise InputError(f"routing stats: --{key}-sessions names {len(sess)} files for the {len(dirs)} directories "
                             f"of --{key}: give one for all or one per directory")
        sts = []
        for i, d in enumerate(dirs):
            lays, man = _dir_layouts(d, sess[i if len(sess) > 1 else 0] if sess else None)
            manifests.append(man)
            sts += open_trace_dir(d, lays, exact=bool(man))
        sets[key] = sts
    facts = routing_facts(sets["dev"], sets["heldout"], args.n_resident_decode, args.n_resident_prefill,
                          scale_from=PAPER_PAIRS if args.paper_shares else None)
    missing = [t.name for t in facts.targets() if math.isnan(t.value)]
    if missing:
        raise InputError(f"routing stats: no data for {', '.join(missing)}: the held-out traces "
                         f"({', '.join(args.heldout)}) hold no request or pass the fact is measured on")
    synthetic = all(st.trace.synthetic for st in sets["dev"] + sets["heldout"])
    if args.label:
        label = args.label
    elif synthetic:
        profs = sorted({m.get("profile", {}).get("name", "?") for m in manifests if m} or {"?"})
        label = f"simulated ({'generator/' + ','.join(profs)})"
    else:
        label = f"measured ({args.machine or 'unknown machine'})"
    result = dict(facts.to_json(), label=label, synthetic=synthetic,
                  dev=[st.path for st in sets["dev"]], heldout=[st.path for st in sets["heldout"]])
    with atomic_open(args.out) as f:
        json.dump(result, f, indent=1)
    for t in facts.targets():
        print(f"{t.name:26s} paper {t.paper:8.3f}  range [{t.lo:.3f}, {t.hi:.3f}]  {label}: {t.value:8.3f}  "
              f"{'ok' if t.ok else 'OUTSIDE'}")
    return 0
