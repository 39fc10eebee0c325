"""Measured replays and simulated runs in one shape, so a notebook puts them beside the paper's numbers.

`Runs.sessions` has one row per series, engine and session (`series`, `engine`, `workload`, `session`, `ok`,
`total_s`, `prefill_s`, `decode_s`; for replays also `load_flag` (`clean`, `foreign load`, `unknown`), `cpu_only`
(the replay ran on a machine without a GPU or on a `cpu` engine build, as recorded) and the request and forced-token
counts `n_requests`, `n_ok`, `n_forced_checked`, `n_forced_match`); `Runs.requests` one row per successful request (`series`, `engine`,
`workload`, `session`, `turn`, `kind`, `n_new`, `n_output`, `context`, `ttft_s`, `tpot_ms`). Workloads are the
paper's (`SWE`, `tau2`), engines the paper's slugs where a simulator policy stands for one of its engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from ostinato.figures.style import series_label
from ostinato.replay.load import UNKNOWN
from ostinato.replay.metrics import as_bool, workload_of
from ostinato.presets import display_name
from ostinato.replay.results import tag_run

SESSION_COLUMNS = ["series", "engine", "workload", "session", "ok", "total_s", "prefill_s", "decode_s", "load_flag",
                   "cpu_only", "n_requests", "n_ok", "n_forced_checked", "n_forced_match"]
REQUEST_COLUMNS = ["series", "engine", "workload", "session", "turn", "kind", "n_new", "n_output", "context",
                   "ttft_s", "tpot_ms"]

# a session id's source prefix -> the paper's workload
WORKLOAD_OF_SOURCE = {"swe-mini": "SWE", "swe-rebench": "SWE", "synthetic-swe": "SWE", "tau2": "tau2",
                      "synthetic-tau2": "tau2"}

# simulator policy -> the paper's engine it stands for (ostinato.sim.policies); others keep the policy's name
SIM_ENGINE = {"ostinato": "ostinato", "llama.cpp-layers": "llama.cpp-layers",
              "llama.cpp-expert-cache": "llama.cpp-expert-cache", "buun": "buun", "ktransformers-placement": "ktransformers"}


@dataclass(frozen=True)
class Runs:
    """Per-session and per-request rows of one or more series (measured or simulated)."""

    sessions: pd.DataFrame
    requests: pd.DataFrame

    @property
    def series(self) -> list[str]:
        """The series labels, in the order they were loaded."""
        return list(dict.fromkeys(self.sessions["series"]))

    def of(self, series: str) -> "Runs":
        """Only one series' rows."""
        return Runs(self.sessions[self.sessions["series"] == series], self.requests[self.requests["series"] == series])

    def only(self, series: list[str]) -> "Runs":
        """Only these series' rows."""
        return Runs(self.sessions[self.sessions["series"].isin(series)],
                    self.requests[self.requests["series"].isin(series)])


def cpu_only_rows(ses: pd.DataFrame) -> pd.Series:
    """Which replayed sessions ran CPU-only, as their summary records it: the engine build's backend is `cpu`, or,
    where the backend is not recorded (an engine reached by URL), the machine had no GPU. Rows that record neither
    (summaries made before they were recorded, such as the shipped reference runs) are not CPU-only."""
    backend = ses["engine_backend"].astype("string").str.strip().str.lower() if "engine_backend" in ses \
        else pd.Series(pd.NA, index=ses.index, dtype="string")
    gpus = pd.to_numeric(ses["machine_gpus"], errors="coerce") if "machine_gpus" in ses \
        else pd.Series(np.nan, index=ses.index)
    known = backend.notna() & (backend != "")
    return ((known & (backend == "cpu")) | (~known & (gpus == 0))).fillna(False).astype(bool)


def split_correctness(runs: Runs) -> tuple[Runs, Runs]:
    """(speed series, correctness series): a measured series every session of which ran CPU-only (`cpu_only`) is a
    correctness run (the replay works, forced tokens match), not a speed measurement to set beside GPU results."""
    s = runs.sessions
    if s.empty or "cpu_only" not in s:
        return runs, empty_runs()
    cpu = s["cpu_only"].astype("boolean").fillna(False).astype(bool).groupby(s["series"], sort=False).all()
    checks = [x for x in runs.series if cpu.get(x, False)]
    return runs.only([x for x in runs.series if x not in checks]), runs.only(checks)


def paper_workload(session: str) -> str:
    """The paper's workload of a session id (`tau2/airline/3` -> `tau2`, `swe-mini/django-1` -> `SWE`)."""
    prefix = workload_of(session)
    return WORKLOAD_OF_SOURCE.get(prefix, prefix or "all")


def _as_list(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    if isinstance(paths, (str, Path)):
        return [Path(paths)] if str(paths) else []
    return [Path(p) for p in paths]


def _read(paths: list[Path], what: str, required: set[str]) -> pd.DataFrame:
    """Concatenate CSVs; a missing file or column is an error that names it."""
    frames = []
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"{what}: {p} not found")
        df = pd.read_csv(p)
        missing = required - set(df.columns)
        if missing:
            raise ValueError(f"{what}: {p} lacks columns {sorted(missing)}")
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=sorted(required))


def _context(req: pd.DataFrame) -> pd.Series:
    """Tokens in the context at each request: earlier requests' new and output tokens plus this one's new."""
    req = req.sort_values(["engine", "session", "turn"])
    grown = (req["n_new"] + req["n_output"]).groupby([req["engine"], req["session"]]).cumsum()
    return grown - req["n_output"]


def empty_runs() -> Runs:
    return Runs(pd.DataFrame(columns=SESSION_COLUMNS), pd.DataFrame(columns=REQUEST_COLUMNS))


def _tag_runs(paths: list[Path], what: str, required: set[str]) -> pd.DataFrame:
    """Concatenate repeated runs, each run's session ids suffixed `#run<i>`: a file's run is one more than the number
    of earlier files that share a session with it, so that another session set of the same run (a run folder's
    `swe-heldout/` beside its τ² set) keeps its run's number."""
    frames, seen = [], []
    for p in paths:
        f = _read([p], what, required)
        ids = set(f["session"].astype(str))
        frames.append(tag_run(f, 1 + sum(1 for s in seen if s & ids)))
        seen.append(ids)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=sorted(required))


def load_measured(sessions_csv: str | Path | Iterable[str | Path], requests_csv: str | Path | Iterable[str | Path],
                  machine: str = "", repeated_runs: bool = False) -> Runs:
    """Replays (`ostinato replay summarize` CSVs) as the series `measured (<machine>)`.

    A baseline's policy implemented on the engine's pools is named `<preset> (policy, implemented here)`.
    Totals are the client's request times; prefill and decode the server's own timings, as the paper's Figure 6
    reports each engine's. `machine` defaults to the CSVs' `machine` column. With `repeated_runs`, the files are
    runs of the same sessions, or another set of sessions of an earlier file's run (in the same order in both lists),
    and each run's sessions count separately.
    """
    s_req, r_req = {"engine", "session", "total_request_s"}, {"engine", "session", "turn", "kind", "ttft_s"}
    read = _tag_runs if repeated_runs else _read
    ses = read(_as_list(sessions_csv), "measured sessions", s_req)
    req = read(_as_list(requests_csv), "measured requests", r_req)
    if ses.empty:
        return empty_runs()
    if not machine:
        labels = sorted(ses["machine"].dropna().astype(str).unique()) if "machine" in ses else []
        machine = ", ".join(labels) or "this machine"
    label = series_label("measured", machine)
    num = lambda df, c: pd.to_numeric(df[c], errors="coerce") if c in df else np.nan  # noqa: E731
    ok = as_bool(ses["session_ok"]) if "session_ok" in ses else pd.Series(True, index=ses.index)
    sessions = pd.DataFrame({
        "series": label, "engine": ses["engine"].astype(str).map(display_name),
        "workload": ses["session"].astype(str).map(paper_workload), "session": ses["session"].astype(str), "ok": ok & num(ses, "total_request_s").notna(),
        "total_s": num(ses, "total_request_s"), "prefill_s": num(ses, "server_prefill_s"),
        "decode_s": num(ses, "server_decode_s"),
        # no load samples (summaries made before the replay took them): unknown, never clean
        "load_flag": ses["load_flag"].fillna(UNKNOWN).astype(str) if "load_flag" in ses else UNKNOWN,
        "cpu_only": cpu_only_rows(ses), "n_requests": num(ses, "n_requests"), "n_ok": num(ses, "n_ok"),
        "n_forced_checked": num(ses, "n_forced_checked"), "n_forced_match": num(ses, "n_forced_match")})
    if "ok" in req:
        req = req[as_bool(req["ok"])]
    requests = pd.DataFrame({
        "series": label, "engine": req["engine"].astype(str).map(display_name),
        "workload": req["session"].astype(str).map(paper_workload), "session": req["session"].astype(str), "turn": req["turn"].astype(int), "kind": req["kind"].astype(str),
        "n_new": num(req, "n_new"), "n_output": num(req, "n_output"), "context": num(req, "n_prompt"),
        "ttft_s": num(req, "ttft_s"), "tpot_ms": num(req, "tpot_s") * 1e3})
    return Runs(sessions.reset_index(drop=True), requests.reset_index(drop=True))


def load_simulated(sessions_csv: str | Path | Iterable[str | Path], requests_csv: str | Path | Iterable[str | Path],
                   profile: str, paper_engines: bool = True) -> Runs:
    """Simulator outputs (`ostinato sim run`) as the series `simulated (<profile>)`.

    With `paper_engines`, a policy that stands for one of the paper's engines takes its slug (`SIM_ENGINE`).
    """
    ses = _read(_as_list(sessions_csv), "simulated sessions", {"engine", "session", "total_s", "prefill_s", "decode_s"})
    req = _read(_as_list(requests_csv), "simulated requests",
                {"engine", "session", "turn", "kind", "n_new", "n_output", "ttft_ms", "tpot_ms"})
    if ses.empty:
        return empty_runs()
    label = series_label("simulated", profile)
    name = (lambda e: SIM_ENGINE.get(e, e)) if paper_engines else (lambda e: e)  # noqa: E731
    sessions = pd.DataFrame({
        "series": label, "engine": ses["engine"].astype(str).map(name),
        "workload": ses["session"].astype(str).map(paper_workload), "session": ses["session"].astype(str), "ok": True,
        "total_s": ses["total_s"].astype(float), "prefill_s": ses["prefill_s"].astype(float),
        "decode_s": ses["decode_s"].astype(float), "load_flag": np.nan, "cpu_only": False,
        "n_requests": pd.to_numeric(ses["n_requests"], errors="coerce") if "n_requests" in ses else np.nan,
        "n_ok": np.nan, "n_forced_checked": np.nan, "n_forced_match": np.nan})
    req = req.assign(engine=req["engine"].astype(str).map(name), session=req["session"].astype(str))
    requests = pd.DataFrame({
        "series": label, "engine": req["engine"], "workload": req["session"].map(paper_workload),
        "session": req["session"], "turn": req["turn"].astype(int), "kind": req["kind"].astype(str),
        "n_new": req["n_new"].astype(float), "n_output": req["n_output"].astype(float),
        "context": _context(req).reindex(req.index).astype(float), "ttft_s": req["ttft_ms"].astype(float) / 1e3,
        "tpot_ms": req["tpot_ms"].astype(float).where(req["n_output"] > 1)})
    return Runs(sessions.reset_index(drop=True), requests.reset_index(drop=True))


def combine(*runs: Runs) -> Runs:
    """Several series in one `Runs` (the first's order first)."""
    parts = [r for r in runs if not r.sessions.empty]
    if not parts:
        return empty_runs()
    return Runs(pd.concat([r.sessions for r in parts], ignore_index=True),
                pd.concat([r.requests for r in parts], ignore_index=True))


def load_series(measured_sessions: list[str] | str, measured_requests: list[str] | str, machine: str,
                sim_sessions: list[str] | str, sim_requests: list[str] | str, profile: str,
                reference_runs: list[str] | str = (), reference_machine: str = "",
                heldout_runs: list[str] | str = ()) -> Runs:
    """A notebook's inputs: this run's replays, the simulator's runs and shipped reference replays (each if any).

    `reference_runs` are directories of repeated runs of one comparison (`sessions.csv`, `requests.csv` each, as
    under `data/reference/<machine>/compare/`); they form the series `measured (<reference_machine>, reference)`.
    `heldout_runs` are such runs of whole held-out sessions on the calibrated-router model
    (`data/reference/<machine>/heldout/`), another model and other sessions than the reference runs': they form a
    series of their own, `measured (<machine>, reference, whole sessions)`, where <machine> is the one their
    sessions.csv records (`reference_machine` where it records none), so that runs of two GPU models never pool
    and none is labelled with the other's. Runs of another set of engines
    (e.g. one that compares Ostinato with buun only) form one more series each, named by their directories
    (`..., whole sessions: <dir>`), since a series compares only the sessions that all its engines completed; runs
    whose directory names a series in `series.txt` (another engine build of the same engines) form one named by it.
    """
    measured = load_measured(measured_sessions, measured_requests, machine) if _as_list(measured_sessions) else empty_runs()
    simulated = load_simulated(sim_sessions, sim_requests, profile) if _as_list(sim_sessions) else empty_runs()
    label = f"{reference_machine or 'reference'}, reference"
    reference = _shipped_runs(reference_runs, label)
    heldout, firsts = [], set()
    for name, machine, dirs in _by_engine_set(_as_list(heldout_runs)):
        first = machine not in firsts  # a machine's first group of runs is its plain whole-sessions series
        firsts.add(machine)
        suffix = f": {name}" if name else "" if first else f": {', '.join(Path(d).name for d in dirs)}"
        heldout.append(_shipped_runs(dirs, f"{machine or reference_machine or 'reference'}, reference, whole sessions{suffix}"))
    return combine(measured, *heldout, reference, simulated)


# A shipped run directory's optional one-line series name: runs of the same engines with another engine build (e.g.
# Ostinato's decode steps as one graph per GPU) form a series of their own, named by it.
SERIES_FILE = "series.txt"


def _by_engine_set(dirs: list[Path]) -> list[tuple[str, str, list[Path]]]:
    """Shipped run directories grouped by the engines their sessions.csv lists, the machine it records ("" without a
    `machine` column) and their series name (`series.txt`, "" without), the first directory's group first:
    (series name, machine, directories) per group."""
    groups: dict[tuple[frozenset, str, str], list[Path]] = {}
    for d in dirs:
        ses = _read([d / "sessions.csv"], "measured sessions", {"engine"})
        machines = sorted(set(ses["machine"].dropna().astype(str))) if "machine" in ses else []
        if len(machines) > 1:
            raise ValueError(f"{d / 'sessions.csv'}: sessions of several machines ({', '.join(machines)}); a shipped "
                             "run directory holds one machine's replays")
        name = (d / SERIES_FILE).read_text().strip() if (d / SERIES_FILE).is_file() else ""
        machine = machines[0] if machines else ""
        groups.setdefault((frozenset(ses["engine"].astype(str)), machine, name), []).append(d)
    return [(name, machine, group) for (_, machine, name), group in groups.items()]


def _shipped_runs(runs: list[str] | str, machine: str) -> Runs:
    """Shipped repeated runs (directories with `sessions.csv`, `requests.csv`) as the series `measured (<machine>)`."""
    dirs = _as_list(runs)
    if not dirs:
        return empty_runs()
    return load_measured([d / "sessions.csv" for d in dirs], [d / "requests.csv" for d in dirs], machine,
                         repeated_runs=True)
