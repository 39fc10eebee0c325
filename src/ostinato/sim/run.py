"""Simulate many sessions under many policies: per-request and per-session tables (pandas)."""

from __future__ import annotations

import os
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tqdm import tqdm

from ostinato.costmodel.decode import LayerCosts
from ostinato.errors import InputError
from ostinato.sim.session import Request, simulate_session
from ostinato.sim.params import SimParams
from ostinato.routing.trace import trace_filename
from ostinato.sim.policies import Policy


def read_sessions(path: str | os.PathLike) -> list[tuple[str, list[Request]]]:
    """(session id, requests) from a sessions JSONL file or a routing directory's manifest.json.

    Both list per session its requests with kind, n_new and n_output (a sessions JSONL one session per line,
    checked as every reader checks it; a trace manifest under its "sessions" key).
    """
    from ostinato.routing.layout import read_manifest_layouts
    from ostinato.sessions.model import iter_session_counts

    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"sessions: {path} not found (a sessions JSONL or a routing manifest.json)")
    if path.name == "manifest.json":
        layouts, _ = read_manifest_layouts(path)
        out = [(lay.session, [Request(r.kind, r.n_new, r.n_output) for r in lay.requests]) for lay in layouts]
    else:
        out = [(sid, [Request(*c) for c in counts]) for sid, counts in iter_session_counts(path)]
    if not out:
        raise InputError(f"{path}: no sessions")
    return out


def routing_file(routing_dir: str | os.PathLike, session: str) -> Path:
    """The routing trace of a session: <dir>/<session id, '/' -> '__'>.route."""
    return Path(routing_dir) / trace_filename(session)


def simulate(sessions: list[tuple[str, list[Request]]], routing: dict[str, np.ndarray], n_expert: int,
             policies: list[Policy], c: LayerCosts, p: SimParams,
             progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-request rows (engine, session, turn, ...) and per-session totals for every policy."""
    rows = []
    jobs = [(pol, sid, reqs) for pol in policies for sid, reqs in sessions]
    for pol, sid, reqs in tqdm(jobs, desc="simulate", unit="session", disable=not progress):
        for i, r in enumerate(simulate_session(reqs, routing[sid], n_expert, pol, c, p)):
            rows.append({"engine": pol.name, "session": sid, "turn": i, **r})
    req = pd.DataFrame(rows)
    if req.empty:
        return req, pd.DataFrame()
    g = req.groupby(["engine", "session"], sort=False)
    ses = g.agg(n_requests=("turn", "size"), total_s=("total_ms", "sum"), prefill_s=("prefill_ms", "sum"),
                decode_s=("decode_ms", "sum"), ttft_median_s=("ttft_ms", "median"),
                tpot_median_ms=("tpot_ms", "median")).reset_index()
    for col in ("total_s", "prefill_s", "decode_s", "ttft_median_s"):
        ses[col] = ses[col] / 1e3
    return req, ses


def load_sim_params(path: str | os.PathLike) -> SimParams:
    """SimParams from a YAML mapping of its field names."""
    with open(path, encoding="utf-8") as f:
        d = yaml.safe_load(f)
    names = {x.name for x in fields(SimParams)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{path}: unknown simulator parameters {sorted(unknown)}")
    return SimParams(**d)


def sim_params_dict(p: SimParams) -> dict:
    """SimParams as a plain mapping (for logs and YAML)."""
    return asdict(p)
