"""The set-up every result notebook shares: its parameters with their defaults, its series, where it writes.

A result notebook's parameter cell holds `output_stem` and `params` (a mapping of `ResultParams` fields); papermill
fills them from `results/figures/<stem>.params.yaml` (`ostinato figures params --nest params`), and with no file the
defaults below are the default config's outputs, so a notebook also runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ostinato.figures.results import CompareOptions
from ostinato.figures.runs import Runs, empty_runs, load_series, split_correctness
from ostinato.figures.style import apply_style, save_figure
from ostinato.replay.load import FOREIGN, UNKNOWN
from ostinato.tables import save_table

# The shipped repeated runs of the H200 machine each result shows by default (config key figures.reference_runs,
# reference_ablation_runs for Table 8, reference_qwen_runs for Table 4).
_H200 = "data/reference/h200"
# The same lists as config/config.yaml's (a test keeps them equal), so that a notebook run alone shows what the
# pipeline's default run shows.
DEFAULT_REFERENCE_RUNS = {"table8": [f"{_H200}/ablation/run{i}" for i in (1, 2, 3)] + [f"{_H200}/baselines/run1"],
                          "table4": [f"{_H200}/qwen/run{i}" for i in (1, 2, 3)]}
_COMPARE = [f"{_H200}/compare/run{i}" for i in (1, 2, 3)] + [f"{_H200}/baselines/run1"]
# whole held-out sessions on the calibrated-router model (config key figures.reference_heldout_runs)
_HELDOUT = [f"{_H200}/heldout/run1", f"{_H200}/heldout/run1-repeat", f"{_H200}/heldout/run1-buun",
            f"{_H200}/heldout/run1-borrow", "data/reference/h100/heldout/run1",
            "data/reference/h100/heldout/run1/swe-heldout", "data/reference/h100/heldout/run2",
            "data/reference/h100/heldout/run2/swe-heldout"]
# Table 4 is about a Qwen3-MoE model: by default neither the default config's replay nor its simulator run counts.
_QWEN_ONLY = {"table4"}


@dataclass(frozen=True)
class ResultParams:
    """The inputs and options of one result notebook."""

    measured_sessions: list[str] = field(default_factory=lambda: ["results/replay/sessions.csv"])
    measured_requests: list[str] = field(default_factory=lambda: ["results/replay/requests.csv"])
    machine: str = ""                    # label of the measured series; "" = the CSVs' `machine` column
    sim_sessions: list[str] = field(default_factory=lambda: ["results/sim/synthetic-swe-heldout/sessions.csv"])
    sim_requests: list[str] = field(default_factory=lambda: ["results/sim/synthetic-swe-heldout/requests.csv"])
    profile: str = "paper-4x4090d"       # machine profile of the simulated series
    reference_runs: list[str] = field(default_factory=lambda: list(_COMPARE))  # shipped runs of another machine
    reference_machine: str = "h200"
    heldout_runs: list[str] = field(default_factory=lambda: list(_HELDOUT))  # shipped whole held-out sessions
    paper_dir: str = "data/paper"
    target: str = "ostinato"             # the engine whose savings are reported
    n_resamples: int = 9999              # bootstrap resamples of the saved share's 95% CI
    ci_seed: int = 0
    workload: str = "tau2"               # Table 4: the paper's workload shown ("tau2", Table 4's, or "SWE")
    # Table 8c: sweeps (`ostinato sweep` summary.json) whose decode TPOT measures the decode steps, as
    # {series label: path}; a CPU-only machine's sweep is no speed measurement and is not listed by default
    decode_sweeps: dict[str, str] = field(default_factory=lambda: {
        "measured (h200, reference)": "data/reference/h200/branches/sweep/summary.json",
        "measured (h200, reference, borrowed memory)": "data/reference/h200/borrow/thread/sweep/summary.json",
        "measured (h200, reference, one graph per step)": "data/reference/h200/graph/sweep3/plain/summary.json",
        "measured (h100, reference, borrowed experts in the pool's computation)":
            "data/reference/h100/graph/sweep5/plain/summary.json"})
    figures_dir: str = "figures"
    tables_dir: str = "tables"

    @classmethod
    def for_result(cls, output_stem: str, overrides: dict | None = None) -> ResultParams:
        """The defaults of this result, with `overrides` (unknown keys are an error naming them)."""
        overrides = dict(overrides or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"result notebook {output_stem}: unknown parameters {unknown}; expected some of "
                             f"{sorted(names)}")
        defaults: dict = {}
        if output_stem in DEFAULT_REFERENCE_RUNS:
            defaults["reference_runs"] = list(DEFAULT_REFERENCE_RUNS[output_stem])
        if output_stem in _QWEN_ONLY:
            defaults.update(measured_sessions=[], measured_requests=[], sim_sessions=[], sim_requests=[],
                            heldout_runs=[])
        return cls(**{**defaults, **overrides})


@dataclass
class ResultNotebook:
    """A result notebook after set-up: its parameters, its speed series (`runs`: GPU replays, the shipped reference
    runs, the simulator), the correctness runs set apart from them (`correctness`: replays that ran CPU-only, whose
    times are no speed measurement) and the paper's data folder."""

    output_stem: str
    params: ResultParams
    runs: Runs
    correctness: Runs = field(default_factory=empty_runs)

    @property
    def paper(self) -> Path:
        return Path(self.params.paper_dir)

    @property
    def compare_options(self) -> CompareOptions:
        p = self.params
        return CompareOptions(target=p.target, n_resamples=p.n_resamples, seed=p.ci_seed)

    def save_table(self, table: pd.DataFrame, suffix: str = "", floatfmt: str = ".3g") -> list[Path]:
        """Write `<tables_dir>/<stem><suffix>.{csv,md}` and print the paths."""
        paths = save_table(table, Path(self.params.tables_dir) / f"{self.output_stem}{suffix}", floatfmt)
        print("wrote", *paths)
        return paths

    def load_note(self) -> str:
        """What the figure's measured series say about foreign load, one line per series: sessions under foreign load
        (the replay's `load_flag`), sessions without load samples (the shipped runs predate them), and the correctness
        runs left out of the speed series."""
        lines = []
        for series in self.runs.series:
            flags = self.runs.sessions.loc[self.runs.sessions["series"] == series, "load_flag"]
            if flags.isna().all():  # simulated: no machine was loaded
                continue
            n, flagged, unknown = len(flags), int((flags == FOREIGN).sum()), int((flags == UNKNOWN).sum())
            what = [f"{flagged} of {n} sessions under foreign load"] if flagged or unknown < n else []
            what += [f"{'all' if unknown == n else unknown} {'of ' + str(n) + ' ' if unknown < n else ''}sessions "
                     "without load samples (foreign load unknown)"] if unknown else []
            lines.append(f"{series}: {', '.join(what)}")
        for series in self.correctness.series:
            lines.append(f"{series}: CPU-only replay, a correctness run: not among the speed series (Table 3 shows it in a panel of its own)")
        return "\n".join(lines)

    def save_figure(self, fig: plt.Figure) -> list[Path]:
        """Write `<figures_dir>/<stem>.{pdf,png}` with the load note under the axes, and print the paths."""
        note = self.load_note()
        if note:
            fig.text(0.0, 0.0, note, ha="left", va="top", fontsize=6.5, color="0.3")
        paths = save_figure(fig, Path(self.params.figures_dir) / self.output_stem)
        print("wrote", *paths)
        return paths


def setup_result(output_stem: str, params: dict | None = None) -> ResultNotebook:
    """Apply the plotting style and load the notebook's series: this run's replays, the shipped reference runs and
    the simulator's runs (each where configured). A measured series that ran CPU-only (as its summary records:
    `ostinato.figures.runs.split_correctness`) is set apart as a correctness run, out of the speed series."""
    p = ResultParams.for_result(output_stem, params)
    apply_style()
    runs = load_series(p.measured_sessions, p.measured_requests, p.machine, p.sim_sessions, p.sim_requests, p.profile,
                       p.reference_runs, p.reference_machine, p.heldout_runs)
    speed, checks = split_correctness(runs)
    print("series:", *speed.series, sep="\n  ")
    if checks.series:
        print("correctness runs (CPU-only: forced tokens, completed sessions and foreign load, no speed):",
              *checks.series, sep="\n  ")
    return ResultNotebook(output_stem, p, speed, checks)
