"""Prefill and decode benchmark of engine configurations on one machine, in one run (issue 6's H200 measurement).

Per engine: start llama-server with routing forced from one trace; for each prefix length, prefill the prefix once,
then for each size n send the prefix plus n new tokens (the server reuses the cached prefix and prefills only the
n new ones) and generate one forced token; TTFT is the client's time to the first streamed token, beside the
server's `prompt_ms`. Decode: after the prefix and the largest size, generate forced tokens; TPOT per request.
The prefixes are the first tokens of one drawn sequence, so a longer prefix extends a shorter one. Every engine
sees the same prompt tokens and the same routing rows, so their times compare.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ostinato.atomic import atomic_open
from ostinato.presets import EngineConfig
from ostinato.server.client import (RequestInput, RequestOutput, decode_step_timings, erase_slot, residency_timings,
                                    send_completion)
from ostinato.replay.runner import borrow_counters, residency_counters
from ostinato.server.launcher import LlamaServer, ServerConfig


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark run sends; the same for every engine."""

    prefixes: tuple[int, ...]
    sizes: tuple[int, ...]
    n_decode: int
    reps: int
    vocab_lo: int = 100
    vocab_hi: int = 20000
    seed: int = 0

    def tokens(self) -> tuple[list[int], dict[int, list[int]], list[int]]:
        """The longest prefix (each prefix length takes its first tokens), new tokens per size and forced output
        tokens.

        Each size's new tokens start with a token no other size starts with, so a request shares only the
        prefix with the request before it and the server prefills exactly its n new tokens.
        """
        rng = np.random.default_rng(self.seed)
        draw = lambda n: [int(t) for t in rng.integers(self.vocab_lo + len(self.sizes), self.vocab_hi, size=n)]  # noqa: E731
        prefix = draw(max(self.prefixes))
        new = {n: [self.vocab_lo + i] + draw(n - 1) for i, n in enumerate(self.sizes)}
        return prefix, new, draw(max(self.n_decode, 1))

    @property
    def n_pos(self) -> int:
        """Positions a forced routing trace must cover."""
        return max(self.prefixes) + max(self.sizes) + self.n_decode + 1


@dataclass
class BenchRow:
    """One measured request."""

    engine: str
    rep: int
    kind: str            # prefix | prefill | decode
    prefix: int          # prefix tokens before the request's new ones
    n_new: int           # new prompt tokens of the request
    n_output: int
    ttft_s: float | None
    latency_s: float | None
    tpot_s: float | None
    prompt_n: int | None          # server: prompt tokens it processed
    prompt_ms: float | None       # server: prompt processing time
    predicted_per_token_ms: float | None
    error: str = ""
    # borrowed memory (engines started with --residency-borrow; decode rows): the server's GET /residency counters over
    # the request: decode steps, steps that computed a borrowed expert, and routes computed on borrowed experts
    borrow_steps: int | None = None
    borrow_steps_hit: int | None = None
    borrow_hits: int | None = None
    # and where a step's time goes with borrowing: copies queued, borrowed experts evicted, the copy thread's time and
    # the token boundaries' waits for copies not yet done (ms)
    borrow_admissions: int | None = None
    borrow_evictions: int | None = None
    borrow_copy_ms: float | None = None
    borrow_wait_ms: float | None = None
    # the engine's timers (engines started with --residency-timers; decode rows): per decode step (a pass of one token
    # in every layer), summed over the layers and averaged over the request's steps: the GPU branch, the CPU branch,
    # the larger of the two per layer (what overlapped branches would take at best), and the cold routes
    timer_steps: int | None = None
    gpu_ms_step: float | None = None
    cpu_ms_step: float | None = None
    branch_bound_ms_step: float | None = None
    cold_routes_step: float | None = None
    # one graph per decode step (engines started with --residency-graph step; decode rows): the GET /residency `graph`
    # counters over the request: layers the CPU worker answered, of which all routes were resident, its time, the
    # device's waits for its answers and the device's own work between each hand-over and its receive (the GPU branch)
    # (ms, the device's clock)
    worker_branches: int | None = None
    worker_skipped: int | None = None
    worker_ms: float | None = None
    worker_wait_ms: float | None = None
    worker_gpu_ms: float | None = None
    # and the cold routes it computed, its time computing them (of worker_ms), and per number r of a layer's cold
    # routes the layers answered and their compute time, as JSON [[r, layers, ms], ...] (the worker's own C(r))
    worker_routes: int | None = None
    worker_compute_ms: float | None = None
    worker_by_routes: str = ""


def _row(engine: str, rep: int, kind: str, prefix: int, n_new: int, out: RequestOutput) -> BenchRow:
    t = out.timings or {}
    return BenchRow(engine, rep, kind, prefix, n_new, out.n_output, out.ttft, out.latency, out.tpot,
                    t.get("prompt_n"), t.get("prompt_ms"), t.get("predicted_per_token_ms"),
                    "" if out.success else out.error)


def _with_borrow(row: BenchRow, before: dict | None, after: dict | None) -> BenchRow:
    if before is not None and after is not None:
        row.borrow_steps = after["steps"] - before["steps"]
        row.borrow_steps_hit = after["steps_hit"] - before["steps_hit"]
        row.borrow_hits = after["hits"] - before["hits"]
        row.borrow_admissions = after["admissions"] - before["admissions"]
        row.borrow_evictions = after["evictions"] - before["evictions"]
        row.borrow_copy_ms = after["ms"] - before["ms"]
        row.borrow_wait_ms = after["wait_ms"] - before["wait_ms"]
    return row


def _with_worker(row: BenchRow, before: dict | None, after: dict | None) -> BenchRow:
    if before is not None and after is not None:
        row.worker_branches = after["branches"] - before["branches"]
        row.worker_skipped = after["skipped"] - before["skipped"]
        row.worker_ms = after["cpu_ms"] - before["cpu_ms"]
        row.worker_wait_ms = after["wait_ms"] - before["wait_ms"]
        if "gpu_ms" in after and "gpu_ms" in before:
            row.worker_gpu_ms = after["gpu_ms"] - before["gpu_ms"]
        if "routes" in after and "routes" in before:
            row.worker_routes = after["routes"] - before["routes"]
            row.worker_compute_ms = after["compute_ms"] - before["compute_ms"]
            row.worker_by_routes = json.dumps(by_routes_delta(before.get("by_routes", []), after.get("by_routes", [])))
    return row


def by_routes_delta(before: list, after: list) -> list[list]:
    """GET /residency's `graph.by_routes` ([routes, layers, compute ms] per number of cold routes) over a request:
    `after` less `before`, rows with no layer left out."""
    b = {int(r): (int(n), float(ms)) for r, n, ms in before}
    out = []
    for r, n, ms in after:
        n0, ms0 = b.get(int(r), (0, 0.0))
        if int(n) > n0:
            out.append([int(r), int(n) - n0, float(ms) - ms0])
    return out


def fit_worker_cost(rows: list[list]) -> dict[str, float]:
    """The worker's compute time per answered layer as alpha + beta * r over the layers with r >= 1 cold routes
    (least squares, each layer one point), from `by_routes` rows [r, layers, ms] (an r may come in several rows); beta alone (alpha 0) where all
    layers had the same r. The counterpart of the engine timers' C(r) for one graph per decode step."""
    pts = [(int(r), int(n), float(ms)) for r, n, ms in rows if int(r) >= 1 and int(n) > 0]
    if not pts:
        return {}
    n = sum(p[1] for p in pts)
    mean_r = sum(r * k for r, k, _ in pts) / n
    mean_t = sum(ms for _, _, ms in pts) / n
    var_r = sum(k * (r - mean_r) ** 2 for r, k, _ in pts)
    if var_r == 0:
        return {"worker_alpha_ms": 0.0, "worker_beta_ms": mean_t / mean_r, "worker_fit_layers": n}
    # sum over layers of (r - mean_r) * t = sum over r of (r - mean_r) * (sum of t over its layers)
    beta = sum((r - mean_r) * ms for r, _, ms in pts) / var_r
    return {"worker_alpha_ms": mean_t - beta * mean_r, "worker_beta_ms": beta, "worker_fit_layers": n}


def worker_bound(step_ms: float, gpu_ms: float, wait_ms: float, worker_ms: float) -> dict[str, float]:
    """One graph per decode step, per step: where its time goes and what it would take at best. The device's own work
    between the hand-overs and their receives (`gpu_ms`, the GPU branch) and its waits for the worker (`wait_ms`) leave
    the rest of the step (`worker_rest_ms_per_step`: the layers' other nodes, the copies); with the branches fully
    overlapped a step would take that rest and the larger of the two branches (`worker_bound_ms_per_step`, the issue's
    max(GPU branch, CPU branch) over a step, a lower bound: per layer the larger of the two can only add up to more).
    `worker_bound_ratio` is the step's time over that bound."""
    rest = step_ms - gpu_ms - wait_ms
    bound = rest + max(gpu_ms, worker_ms)
    return {"worker_gpu_ms_per_step": gpu_ms, "worker_rest_ms_per_step": rest, "worker_bound_ms_per_step": bound,
            "worker_bound_ratio": step_ms / bound if bound > 0 else float("nan")}


def _graph_step(args: list[str]) -> bool:
    """Whether server arguments ask for one graph per decode step (the last --residency-graph wins)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--residency-graph"]
    return bool(values) and values[-1] == "step"


def decode_step_breakdown(timings: list[dict]) -> dict | None:
    """The engine's timers over a request's decode steps (`GET /residency` timings): per step, the GPU and CPU
    branches summed over the layers, the sum over the layers of the larger branch, and the cold routes; the mean over
    the steps. None when no step was timed."""
    steps = decode_step_timings(timings)
    n = len({t["pass"] for t in steps})
    if not n:
        return None
    return {"timer_steps": n, "gpu_ms_step": sum(t["gpu_ms"] for t in steps) / n,
            "cpu_ms_step": sum(t["cpu_ms"] for t in steps) / n,
            "branch_bound_ms_step": sum(max(t["gpu_ms"], t["cpu_ms"]) for t in steps) / n,
            "cold_routes_step": sum(t["n_cold"] for t in steps) / n}


@dataclass
class EngineRun:
    """An engine configuration and where its binaries are."""

    config: EngineConfig
    server_bin: Path
    extra_args: tuple[str, ...] = ()
    rows: list[BenchRow] = field(default_factory=list)


def run_engine(run: EngineRun, model: Path, plan: BenchPlan, log_dir: Path, startup_timeout_s: float = 900,
               progress=None) -> list[BenchRow]:
    """Measure one engine: one server; per prefix length, the prefix once, then `reps` rounds over the sizes and a
    decode."""
    prefix, new, forced = plan.tokens()
    cfg = ServerConfig(binary=run.server_bin, model=model, args=[*run.config.server_args, *run.extra_args],
                       env=dict(run.config.env), log_path=log_dir / f"server-{run.config.name}.log",
                       startup_timeout_s=startup_timeout_s)
    rows: list[BenchRow] = []
    borrows = "--residency-borrow" in (*run.config.server_args, *run.extra_args)
    timed = "--residency-timers" in (*run.config.server_args, *run.extra_args)
    stepped = _graph_step([*run.config.server_args, *run.extra_args])

    def timings_since(after: int) -> tuple[list[dict], int]:
        # the timings of the passes after `after` (the engine keeps the last 262,144 layer passes), and the newest pass
        got = residency_timings(srv.client, srv.base_url, after)["timings"]
        return got, max((t["pass"] for t in got), default=after)

    with LlamaServer(cfg) as srv:
        erase_slot(srv.client, srv.base_url)
        seen = 0  # the newest timed pass read so far (each decode request first reads the passes before it)
        for p in plan.prefixes:
            head = prefix[:p]
            warm = send_completion(srv.client, srv.base_url, RequestInput(tuple(head), 1, (forced[0],)))
            rows.append(_row(run.config.name, -1, "prefix", p, p, warm))
            for rep in range(plan.reps):
                for n in plan.sizes:
                    out = send_completion(srv.client, srv.base_url,
                                          RequestInput(tuple(head + new[n]), 1, (forced[0],)))
                    rows.append(_row(run.config.name, rep, "prefill", p, n, out))
                    if progress:
                        progress(run.config.name, rep, p, n, out)
                if plan.n_decode > 1:
                    # after the largest size (cached when it was the last one sent): decode positions follow it
                    n = max(plan.sizes)
                    before = borrow_counters(srv) if borrows else None
                    w_before = residency_counters(srv, "graph") if stepped else None
                    seen = timings_since(seen)[1] if timed else seen
                    out = send_completion(srv.client, srv.base_url,
                                          RequestInput(tuple(head + new[n]), plan.n_decode, tuple(forced)))
                    after = borrow_counters(srv) if borrows else None
                    row = _with_borrow(_row(run.config.name, rep, "decode", p, n, out), before, after)
                    row = _with_worker(row, w_before, residency_counters(srv, "graph") if stepped else None)
                    if timed:
                        got, seen = timings_since(seen)
                        for k, v in (decode_step_breakdown(got) or {}).items():
                            setattr(row, k, v)
                    rows.append(row)
                    if progress:
                        progress(run.config.name, rep, p, -1, out)
    return rows


def write_rows(path: Path, rows: list[BenchRow]) -> None:
    """All rows as CSV (atomic)."""
    names = list(BenchRow.__dataclass_fields__)
    with atomic_open(path, "w") as f:
        w = csv.DictWriter(f, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def read_rows(path: Path) -> list[BenchRow]:
    """The rows `write_rows` wrote (empty cells are None, `error` stays a string)."""
    types = {f.name: f.type for f in fields(BenchRow)}
    conv = {"int": int, "float": float, "int | None": int, "float | None": float}
    out = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            out.append(BenchRow(**{k: (v if types[k] == "str" else None if v == "" else conv[types[k]](v))
                                   for k, v in rec.items()}))
    return out


def summarize(rows: list[BenchRow], baseline: str, n_resamples: int = 2000) -> list[dict]:
    """Median TTFT per (engine, prefix, size) and decode TPOT per (engine, prefix); ratio to `baseline` with a 95%
    bootstrap CI over reps; for an engine with borrowed memory, its decode rows' borrowed-expert hits per step."""
    from scipy.stats import bootstrap

    def series(engine: str, kind: str, p: int, n: int | None) -> np.ndarray:
        # a prefill the server found cached (prompt_n below its new tokens: with one size, every round after the
        # first sends the prompt the decode before it sent) measured no prefill and is left out
        vals = {r.rep: (r.ttft_s if kind == "prefill" else r.tpot_s) for r in rows
                if r.engine == engine and r.kind == kind and r.prefix == p and (n is None or r.n_new == n)
                and not r.error and not (kind == "prefill" and r.prompt_n is not None and r.prompt_n < r.n_new)}
        return np.array([vals[k] for k in sorted(vals) if vals[k] is not None], dtype=float)

    engines = list(dict.fromkeys(r.engine for r in rows))
    cases = []
    for p in sorted({r.prefix for r in rows if r.kind in ("prefill", "decode")}):
        cases += [("prefill", p, n) for n in sorted({r.n_new for r in rows if r.kind == "prefill" and r.prefix == p})]
        cases += [("decode", p, None)]
    out = []
    for kind, p, n in cases:
        base = series(baseline, kind, p, n)
        for e in engines:
            x = series(e, kind, p, n)
            if x.size == 0:
                continue
            rec = {"engine": e, "kind": kind, "prefix": p, "n_new": n if n is not None else "", "reps": int(x.size),
                   "median_s": float(np.median(x)), "min_s": float(x.min()), "max_s": float(x.max())}
            b = [r for r in rows if r.engine == e and r.kind == kind == "decode" and r.prefix == p and not r.error
                 and r.borrow_steps]
            if b:
                # borrowed memory over the decode requests: routes on borrowed experts per step, share of steps hit,
                # copies queued per step, the copy thread's and the boundaries' waiting time per step
                steps = sum(r.borrow_steps for r in b)
                rec.update({"borrow_hits_per_step": sum(r.borrow_hits for r in b) / steps,
                            "borrow_steps_hit_share": sum(r.borrow_steps_hit for r in b) / steps})
                if all(r.borrow_admissions is not None for r in b):
                    rec.update({"borrow_admissions_per_step": sum(r.borrow_admissions for r in b) / steps,
                                "borrow_copy_ms_per_step": sum(r.borrow_copy_ms for r in b) / steps,
                                "borrow_wait_ms_per_step": sum(r.borrow_wait_ms for r in b) / steps})
            t = [r for r in rows if r.engine == e and r.kind == kind == "decode" and r.prefix == p and not r.error
                 and r.timer_steps]
            if t:
                # the engine's timers over the decode steps (weighted by steps): the branches per step, the per-layer
                # bound of overlapped branches, and what else a step takes (the median step less both branches:
                # timed branches run one after the other)
                steps = sum(r.timer_steps for r in t)
                mean = lambda k: sum(getattr(r, k) * r.timer_steps for r in t) / steps  # noqa: E731
                rec.update({"timer_steps": steps, "gpu_ms_per_step": mean("gpu_ms_step"),
                            "cpu_ms_per_step": mean("cpu_ms_step"),
                            "branch_bound_ms_per_step": mean("branch_bound_ms_step"),
                            "cold_routes_per_step": mean("cold_routes_step")})
                rec["other_ms_per_step"] = rec["median_s"] * 1e3 - rec["gpu_ms_per_step"] - rec["cpu_ms_per_step"]
            w = [r for r in rows if r.engine == e and r.kind == kind == "decode" and r.prefix == p and not r.error
                 and r.worker_branches and r.n_output > 1]
            if w:
                # one graph per decode step: the CPU worker's time per decode step (each step computes one token; the
                # request's last token is not computed), the device's waits for it, and the share of its layers whose
                # routes were all resident
                steps = sum(r.n_output - 1 for r in w)
                rec.update({"worker_ms_per_step": sum(r.worker_ms for r in w) / steps,
                            "worker_skipped_share": sum(r.worker_skipped for r in w) / sum(r.worker_branches for r in w)})
                if all(r.worker_wait_ms is not None for r in w):
                    rec["worker_wait_ms_per_step"] = sum(r.worker_wait_ms for r in w) / steps
                if all(r.worker_wait_ms is not None and r.worker_gpu_ms is not None for r in w):
                    rec.update(worker_bound(rec["median_s"] * 1e3, sum(r.worker_gpu_ms for r in w) / steps,
                                            rec["worker_wait_ms_per_step"], rec["worker_ms_per_step"]))
                if all(r.worker_routes is not None for r in w):
                    rec.update({"worker_routes_per_step": sum(r.worker_routes for r in w) / steps,
                                "worker_compute_ms_per_step": sum(r.worker_compute_ms for r in w) / steps})
                    # the fit sums over layers, so the requests' rows go in as they are (an r may repeat)
                    rec.update(fit_worker_cost([x for r in w for x in json.loads(r.worker_by_routes or "[]")]))
            if base.size and e != baseline and x.size == base.size:
                ratio = float(np.mean(x) / np.mean(base))
                lo = hi = float("nan")
                if x.size >= 3:
                    ci = bootstrap((x, base), lambda a, b: np.mean(a) / np.mean(b), paired=True,
                                   vectorized=False, n_resamples=n_resamples, method="percentile",
                                   random_state=np.random.default_rng(0)).confidence_interval
                    lo, hi = float(ci.low), float(ci.high)
                rec.update({"ratio_to": baseline, "ratio": ratio, "ratio_ci_low": lo, "ratio_ci_high": hi})
            out.append(rec)
    return out


def write_summary(path: Path, summary: list[dict], meta: dict) -> None:
    with atomic_open(path, "w") as f:
        f.write(json.dumps({"meta": meta, "rows": summary}, indent=2) + "\n")

