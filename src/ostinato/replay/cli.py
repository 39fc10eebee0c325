"""`ostinato replay run|summarize|compare|bitwise|same-engine`: replay sessions against llama-server, summarize and
compare the results, check two engines' replays for bitwise equal outputs and a replay's engine build."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import pandas as pd

from ostinato.errors import InputError
from ostinato.presets import PRESETS, UPLOAD_MIN, EngineConfig, preset
from ostinato.machine import describe_machine
from ostinato.replay.deadline import rates_under
from ostinato.replay.load import FOREIGN_LOAD_THRESHOLD
from ostinato.replay.provenance import (engine_build, parse_legacy_sources, parse_presets, same_engine, same_gpus,
                                        same_preset, same_sessions)
from ostinato.replay.results import load_runs, summarize_sessions
from ostinato.replay.runner import ReplayConfig, run_replay, sessions_digest
from ostinato.server.client import APIS
from ostinato.server.launcher import ExternalServer, LlamaServer, ServerConfig
from ostinato.replay.store import ResultStore, write_json_atomic
from ostinato.residency.budget import resolve_budget
from ostinato.sessions.model import read_sessions_jsonl


def _env_pair(value: str) -> tuple[str, str]:
    """argparse type: KEY=VALUE."""
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, val


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `replay` group with `run`, `summarize`, `compare`, `bitwise` and `same-engine`."""
    group = subparsers.add_parser("replay", help="replay sessions against llama-server and summarize")
    sub = group.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="replay sessions one at a time (resumes at the first missing session)")
    r.add_argument("--engine-name", required=True, help="name of the engine configuration (result subdirectory)")
    r.add_argument("--server-bin", type=Path, help="path to the llama-server binary (the replay starts and stops it)")
    r.add_argument("--model", type=Path, help="GGUF model file (with --server-bin)")
    r.add_argument("--server-url", default=None,
                   help="an engine already running elsewhere, e.g. http://host:8000 (instead of --server-bin/--model)")
    r.add_argument("--api", choices=APIS, default="llama",
                   help="llama: llama-server's /completion with forced outputs (default); llama-generate: the same "
                        "endpoint without forced outputs or routing, for llama.cpp forks such as ik_llama.cpp (start it "
                        "with --slot-save-path; the engine generates outputs of the recorded length; --server-url only); "
                        "openai: an OpenAI-compatible /v1/completions (generated outputs of the recorded length; "
                        "--server-url only)")
    r.add_argument("--model-name", default="", help="with --api openai: the model field of the requests")
    r.add_argument("--health-path", default=None,
                   help="with --server-url: path answering 200 when the engine is up (default /health, or /v1/models "
                        "with --api openai)")
    r.add_argument("--sessions", required=True, type=Path, help="sessions JSONL from `ostinato sessions build`")
    r.add_argument("--out", required=True, type=Path, help="output directory (results go to OUT/ENGINE/)")
    r.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one extra server argument, repeatable; write --server-arg=-c --server-arg=4096")
    r.add_argument("--server-args", default="", metavar="'ARGS'", help="extra server arguments as one shell-quoted string")
    r.add_argument("--env", action="append", default=[], type=_env_pair, metavar="KEY=VALUE", help="server environment")
    r.add_argument("--routing-force-dir", type=Path, default=None,
                   help="teacher-forced routing: the engine follows DIR/<session>.route (ostinato routing generate)")
    r.add_argument("--routing-record-dir", type=Path, default=None,
                   help="record the engine's routing of each session to DIR/<session>.route")
    r.add_argument("--routing-root", type=Path, default=None,
                   help="the directory requests name routing traces relative to: a started server gets it as "
                        "--routing-dir (default: the common directory of --routing-force-dir and --routing-record-dir); "
                        "with --server-url, the --routing-dir that engine was started with")
    r.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="named engine configuration: its placement flags and environment come first (ostinato.presets)")
    r.add_argument("--expert-budget-gib", type=float, default=None,
                   help="with --preset: GPU memory for routed experts, the same for every compared engine (default: no limit)")
    r.add_argument("--resident-share", type=float, default=None,
                   help="with --preset, instead of --expert-budget-gib: GPU memory for routed experts as a share of all "
                        "their bytes (e.g. the share the ostinato engine's pool holds)")
    r.add_argument("--expert-capacity", type=Path, default=None,
                   help="with --preset, instead of --expert-budget-gib: the pool bytes of a capacity test's JSON "
                        "(`ostinato residency capacity`), summed over its GPUs")
    r.add_argument("--llama-tree", type=Path, default=None,
                   help="with --preset: the pinned llama.cpp tree, whose gguf-py reads the model's expert sizes")
    r.add_argument("--plan", default=None, help="with a preset of PLAN_PRESETS (ostinato, ostinato-native-prefill): "
                   "the residency plan file (--residency-plan of the engine)")
    r.add_argument("--borrow-params", default=None,
                   help="with --preset ostinato-borrow: the JSON of `ostinato residency borrow-tune`, whose chosen "
                        "slots, decay, margin and admissions the engine runs with")
    r.add_argument("--upload-min", type=int, default=UPLOAD_MIN,
                   help=f"with --preset ostinato: Np, the smallest pass that takes the upload path "
                        f"(--residency-upload-min of the engine; default {UPLOAD_MIN})")
    r.add_argument("--machine-label", default=None, help="short machine name for plots (default from the hardware)")
    r.add_argument("--select", type=int, default=0, help="replay only the first N sessions of the file (0 = all)")
    r.add_argument("--retry-failed", action="store_true", help="replay sessions recorded as failed again")
    r.add_argument("--on-setup-change", choices=("refuse", "restart"), default="refuse",
                   help="when the sessions file, model or server command changed since the results in --out were "
                        "made: refuse (default) or restart (move them aside to <engine>.superseded-<time>)")
    r.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    r.add_argument("--max-retries", type=int, default=2,
                   help="a session whose server crashed or stopped answering is replayed again from its first request "
                        "on the restarted server up to this many times before it is recorded failed (default 2)")
    r.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for the server to be healthy")
    r.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    r.add_argument("--strict", action="store_true", help="exit 1 when a session failed (default: 0, failures recorded)")
    r.add_argument("--deadline", type=float, default=None,
                   help="Unix time by which the run must end (default: $OSTINATO_REPLAY_DEADLINE, else none): a "
                        "session starts only if the engine's recorded requests say it ends before then; the run then "
                        "exits 3, the sessions left for a later run")
    r.add_argument("--deadline-rates-from", nargs="+", type=Path, default=[], metavar="DIR",
                   help="with a deadline: other engines' replays of these sessions (OUT or OUT/<engine> directories; "
                        "one not made yet counts for nothing) estimate a session while this engine has recorded none "
                        "(the longest estimate counts)")
    r.add_argument("--deadline-rates-elsewhere", nargs="+", type=Path, default=[], metavar="DIR",
                   help="with a deadline: replays of other session sets (OUT or OUT/<engine> directories, any engine; "
                        "one not made yet counts for nothing) estimate a session that neither this engine nor "
                        "--deadline-rates-from can (the longest estimate counts)")
    r.add_argument("--record-probs", type=int, default=0, metavar="N",
                   help="ask every request for its top N tokens' log-probabilities (n_probs) and keep them in the "
                        "records, for `replay bitwise` (a check, not a timed replay: the server then computes them)")
    r.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run_cmd)

    s = sub.add_parser("summarize", help="per-session totals of one or more replay output directories")
    s.add_argument("--in", dest="inputs", nargs="+", required=True, type=Path, help="replay --out (or OUT/ENGINE) dirs")
    s.add_argument("--out", required=True, type=Path, help="per-session CSV")
    s.add_argument("--requests-out", type=Path, default=None, help="also write the per-request CSV here")
    s.add_argument("--runs", type=int, default=1,
                   help="the --in directories are this many repeated runs, given run by run in equal numbers: "
                        "run i's session ids get the suffix #run<i> (default 1: no suffix)")
    s.add_argument("--foreign-load-threshold", type=float, default=FOREIGN_LOAD_THRESHOLD,
                   help="flag a session `foreign load` when other processes used more than this share of the "
                        "machine's CPU time (wall time × logical CPUs) while it was replayed (default "
                        f"{FOREIGN_LOAD_THRESHOLD}); results without load samples are `unknown`")
    s.set_defaults(func=summarize_cmd)

    c = sub.add_parser("compare", help="each engine against a target: total time, share saved [bootstrap CI], "
                                       "sessions won, median TTFT by kind, TPOT, client/server agreement")
    c.add_argument("--sessions", required=True, type=Path, help="per-session CSV of `replay summarize --out`")
    c.add_argument("--requests", type=Path, default=None,
                   help="per-request CSV of `replay summarize --requests-out` (medians over requests; "
                        "without it, medians of the per-session medians)")
    c.add_argument("--target", default="ostinato", help="engine whose savings are reported (default ostinato)")
    c.add_argument("--engines", nargs="+", default=[], help="engines compared with the target (default: all others)")
    c.add_argument("--confidence", type=float, default=0.95, help="confidence level of the CI (default 0.95)")
    c.add_argument("--n-resamples", type=int, default=9999, help="bootstrap resamples (default 9999)")
    c.add_argument("--ci-method", choices=("BCa", "percentile", "basic"), default="BCa",
                   help="scipy.stats.bootstrap method (default BCa)")
    c.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    c.add_argument("--machine", default="", help="machine label of the `measured (<machine>)` series (default from the CSV)")
    c.add_argument("--clean-only", action="store_true",
                   help="leave out the sessions any compared engine replayed under foreign load (their `load_flag`)")
    c.add_argument("--out", required=True, type=Path, help="output stem: writes STEM.csv and STEM.md")
    c.add_argument("--by-new-tokens", type=Path, default=None, metavar="STEM",
                   help="also write STEM.csv and STEM.md: median TTFT after tool outputs by new tokens (Figure 7a's "
                        "bins) on the compared sessions, the target's change against each engine (needs --requests)")
    c.set_defaults(func=compare_cmd)

    b = sub.add_parser("bitwise", help="two engines' replays of the same sessions (replay run --record-probs): the "
                                       "same tokens and bitwise the same top log-probabilities in every request")
    b.add_argument("--in", dest="inputs", nargs=2, required=True, type=Path, metavar=("A", "B"),
                   help="the two replays' OUT/<engine> directories")
    b.add_argument("--out", required=True, type=Path, help="report JSON (counts and every difference)")
    b.set_defaults(func=bitwise_cmd)

    e = sub.add_parser("same-engine", help="whether finished replays ran the engine build their server binary is now, "
                                           "on the session file there now and GPUs of this machine's kind (before "
                                           "they are kept on another machine)")
    e.add_argument("replays", nargs="+", type=Path, metavar="DIR", help="replay OUT/<engine> directories")
    e.add_argument("--legacy-sources", nargs="+", default=[], metavar="VARIANT=SHA256",
                   help="for replays from before the build was recorded: the sources fingerprint of the engine code "
                        "each variant ran (the manifest's `sources`)")
    e.add_argument("--presets", nargs="+", default=[], metavar="ENGINE=PRESET",
                   help="each engine's preset now (the config's replay.engines): a replay that ran another preset "
                        "under the same engine name differs")
    e.set_defaults(func=same_engine_cmd)


DEADLINE_ENV = "OSTINATO_REPLAY_DEADLINE"
EXIT_DEFERRED = 3  # `replay run`: sessions left for a later run (--deadline)


def _env_deadline() -> float | None:
    """`--deadline`'s default: $OSTINATO_REPLAY_DEADLINE (data/reference/h200/heldout/run.sh sets it to its call's
    end for the pipeline's replays)."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise InputError(f"${DEADLINE_ENV}: expected a Unix time in seconds, got {raw!r}") from None


def _engine_preset(args: argparse.Namespace) -> EngineConfig:
    """The named configuration of --preset for this model and budget (no flags without --preset)."""
    given = [f for f, v in (("--expert-budget-gib", args.expert_budget_gib), ("--resident-share", args.resident_share),
                            ("--expert-capacity", args.expert_capacity)) if v is not None]
    if args.preset is None:
        if given:
            raise ValueError(f"{given[0]} needs --preset")
        return EngineConfig(args.engine_name, "")
    if args.llama_tree is None:
        raise ValueError("--preset needs --llama-tree (the pinned llama.cpp tree whose gguf-py reads the model)")
    budget = resolve_budget(args.model, args.llama_tree, args.expert_budget_gib, args.resident_share,
                            args.expert_capacity)
    borrow = None
    if args.borrow_params:
        from ostinato.residency.borrow import read_tuned

        borrow = read_tuned(args.borrow_params)
    return preset(args.preset, budget, plan=args.plan, upload_min=args.upload_min, borrow=borrow)


def _check_server_args(args: argparse.Namespace) -> None:
    """Exactly one way to reach the engine: a binary and model the replay starts, or the URL of a running one."""
    if args.server_url is None:
        if args.server_bin is None or args.model is None:
            raise ValueError("replay run needs --server-bin and --model (or --server-url of a running engine)")
        if args.api != "llama":
            raise ValueError(f"--api {args.api} needs --server-url: a started llama-server is driven through "
                             "/completion with forced outputs")
        return
    started = [f for f, v in (("--server-bin", args.server_bin), ("--preset", args.preset),
                              ("--server-arg", args.server_arg), ("--server-args", args.server_args),
                              ("--env", args.env), ("--port", args.port)) if v]
    if started:
        raise ValueError(f"--server-url: the engine runs elsewhere; {', '.join(started)} would not reach it")
    if args.api != "llama" and (args.routing_force_dir or args.routing_record_dir):
        raise ValueError(f"--api {args.api}: routing traces are a llama-server (stock/ostinato) feature")


def run_cmd(args: argparse.Namespace) -> int:
    """Handler of `replay run`; failed sessions are recorded, and make it return 1 only with --strict."""
    _check_server_args(args)
    if args.select < 0:
        raise ValueError(f"--select must be >= 0, got {args.select}")
    if args.max_retries < 0:
        raise ValueError(f"--max-retries must be >= 0, got {args.max_retries}")
    if args.record_probs < 0:
        raise ValueError(f"--record-probs must be >= 0, got {args.record_probs}")
    if args.record_probs and args.api == "openai":
        raise ValueError("--record-probs asks llama-server's /completion for n_probs; --api openai has no such field")
    bad: list[InputError] = []

    def skip(exc: InputError) -> None:
        bad.append(exc)
        print(f"[{args.engine_name}] skipped: {exc}", file=sys.stderr)

    sessions = read_sessions_jsonl(args.sessions, on_bad=skip)
    if args.select:
        sessions = sessions[: args.select]
    if not sessions:
        raise InputError(f"--sessions {args.sessions} holds no valid session"
                         + (f" ({len(bad)} bad lines, the first: {bad[0]})" if bad else ""))
    engine = _engine_preset(args)
    deadline = args.deadline if args.deadline is not None else _env_deadline()
    machine = describe_machine(args.machine_label)
    store = ResultStore.for_engine(args.out, args.engine_name)
    write_json_atomic(store.root / "machine.json", machine.to_json())
    cfg = ReplayConfig(
        engine=args.engine_name, out_dir=args.out, machine=machine.label, retry_failed=args.retry_failed,
        on_setup_change=args.on_setup_change,
        routing_force_dir=args.routing_force_dir, routing_record_dir=args.routing_record_dir,
        request_timeout_s=args.request_timeout, max_retries=args.max_retries, warmup=not args.no_warmup,
        progress=not args.no_progress, deadline=deadline,
        deadline_siblings=rates_under(args.deadline_rates_from) if deadline is not None else [],
        deadline_elsewhere=rates_under(args.deadline_rates_elsewhere, "--deadline-rates-elsewhere") if deadline is not None else [],
        api=args.api, model_name=args.model_name, routing_root=args.routing_root, record_probs=args.record_probs,
        borrow_counters=args.api == "llama" and "--residency-borrow" in (
            *engine.server_args, *args.server_arg, *shlex.split(args.server_args)),
    )
    build = engine_build(args.server_bin)
    run_info = {
        **sessions_digest(args.sessions),
        "engine_preset": {"name": engine.name, "description": engine.description} if args.preset else None,
        "routing_force_dir": str(args.routing_force_dir) if args.routing_force_dir else None,
        "machine_info": machine.to_json(),
        "engine_backend": (build or {}).get("backend") or None,
        "engine_build": build,  # a resumed replay must run the same build (SETUP_KEYS)
        "record_probs": args.record_probs or None,  # absent from replays without it, so they resume as before
    }
    if args.server_url is None:
        config = ServerConfig(
            binary=args.server_bin,
            model=args.model,
            args=list(engine.server_args) + list(args.server_arg) + shlex.split(args.server_args),
            env={**engine.env, **dict(args.env)},
            port=args.port,
            log_path=store.root / "server.log",
            startup_timeout_s=args.startup_timeout,
            routing_dir=cfg.routing_dir(),
        )
        run_info.update({"server_command": config.command(0, Path("<slot-save-path>")), "model": str(args.model)})
        server = LlamaServer(config)
    else:
        run_info.update({"server_command": [args.server_url, args.api], "model": args.model_name or args.server_url})
        server = ExternalServer(args.server_url, args.api, args.model_name, args.health_path, args.startup_timeout)
    try:
        summary = run_replay(sessions, server, cfg, run_info)
    finally:
        server.close()
    print(
        f"[{args.engine_name}] replayed {len(summary.done)} ok, {len(summary.failed)} failed, "
        f"{len(summary.skipped)} already present, {summary.restarts} server restarts "
        f"({len(summary.retried)} sessions replayed again)"
        + (f", {len(summary.deferred)} left for a later run (--deadline)" if summary.deferred else "")
        + f" → {store.root}",
        file=sys.stderr,
    )
    if bad:
        raise InputError(f"--sessions {args.sessions}: {len(bad)} bad session line(s) skipped, the others replayed; "
                         f"the first: {bad[0]}")
    if summary.failed and args.strict:
        return 1
    return EXIT_DEFERRED if summary.deferred else 0


def summarize_cmd(args: argparse.Namespace) -> int:
    """Handler of `replay summarize`; writes the per-session (and optional per-request) CSV."""
    requests = load_runs(args.inputs, args.runs)
    sessions = summarize_sessions(requests, args.foreign_load_threshold)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sessions.to_csv(args.out, index=False)
    if args.requests_out is not None:
        args.requests_out.parent.mkdir(parents=True, exist_ok=True)
        requests.to_csv(args.requests_out, index=False)
    print(f"wrote {len(sessions)} sessions to {args.out}", file=sys.stderr)
    return 0


def compare_cmd(args: argparse.Namespace) -> int:
    """Handler of `replay compare`; writes STEM.csv and STEM.md and reports dropped sessions."""
    from ostinato.replay.metrics import CompareConfig, compare_engines, save_comparison  # scipy, seaborn: load on use

    for p in (args.sessions, args.requests):
        if p is not None and not p.is_file():
            raise FileNotFoundError(f"{p} not found (expected a `replay summarize` CSV)")
    cfg = CompareConfig(target=args.target, engines=tuple(args.engines), confidence=args.confidence,
                        n_resamples=args.n_resamples, method=args.ci_method, seed=args.seed, machine=args.machine,
                        clean_only=args.clean_only)
    try:
        requests = pd.read_csv(args.requests) if args.requests is not None else None
        sessions = pd.read_csv(args.sessions)
    except pd.errors.EmptyDataError as exc:
        raise ValueError(f"an input CSV of `replay compare` is empty ({exc}); did `replay summarize` find results?") from None
    if args.by_new_tokens is not None and requests is None:
        raise ValueError("--by-new-tokens needs --requests (the per-request CSV of `replay summarize --requests-out`)")
    comp = compare_engines(sessions, requests, cfg)
    paths = save_comparison(comp, args.out)
    if args.by_new_tokens is not None:
        from ostinato.replay.sizes import save_by_new_tokens, ttft_by_new_tokens

        engines = list(dict.fromkeys(comp.table["engine"]))
        paths += save_by_new_tokens(ttft_by_new_tokens(requests, comp.kept, args.target, engines), args.by_new_tokens)
    print(f"compared {comp.table['engine'].nunique() - 1} engine(s) with {args.target} on {len(comp.kept)} sessions "
          f"({len(comp.dropped)} dropped{': ' + ', '.join(comp.dropped) if comp.dropped else ''}) → "
          f"{', '.join(map(str, paths))}", file=sys.stderr)
    return 0


def bitwise_cmd(args: argparse.Namespace) -> int:
    """Handler of `replay bitwise`; writes the report and returns 1 when the replays differ (or compared nothing)."""
    from ostinato.replay.bitwise import compare, save

    report = compare(*args.inputs)
    save(report, args.out)
    first = report.differences[0] if report.differences else None
    history = sum(d.what == "history" for d in report.differences)
    print(f"{'bitwise equal' if report.equal else 'NOT bitwise equal'}: {report.sessions} sessions, {report.requests} "
          f"requests, {report.tokens} generated tokens compared, {len(report.differences)} differences"
          + (f" ({history} of them sessions not compared: their servers had served other sessions before them)"
             if history else "")
          + (f" (first: {first.session} turn {first.turn}, {first.what}: {first.detail})" if first else "")
          + f" → {args.out}", file=sys.stderr)
    for side, b in (("a", report.borrow_a), ("b", report.borrow_b)):
        if b is not None:
            print(f"borrowed memory ({side}): {b.get('steps_hit', 0)} of {b.get('steps', 0)} decode steps computed a "
                  f"borrowed expert ({b.get('hits', 0)} routes)", file=sys.stderr)
    return 0 if report.equal else 1


def same_engine_cmd(args: argparse.Namespace) -> int:
    """Handler of `replay same-engine`: one line per replay (the first that differs of its sessions, its GPUs, its
    preset, else its engine's); returns 1 unless every one ran its binary's build with its engine's preset now on the
    session file there now and on this machine's GPU models."""
    legacy = parse_legacy_sources(args.legacy_sources)
    presets = parse_presets(args.presets)
    gpus = [g.name for g in describe_machine().gpus]
    matches = []
    for d in args.replays:
        m = same_sessions(d)
        for check in (lambda: same_gpus(d, gpus), lambda: same_preset(d, presets), lambda: same_engine(d, legacy)):
            if not m.same:
                break
            m = check()
        matches.append(m)
    for m in matches:
        print(f"{'same' if m.same else 'DIFFERENT'}: {m.why}")
    return 0 if all(m.same for m in matches) else 1
