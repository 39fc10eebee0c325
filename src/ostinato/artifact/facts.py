"""Numbers the documents quote that take more than a template expression: comparisons over repeated runs, sweep
rows, build times, test counts, the machine. Each reads the shipped files through the template's `Loader`."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path

import pandas as pd


class Facts:
    """The computations a template calls as `facts.<name>(...)`; paths as in the template (`Loader`)."""

    def __init__(self, loader):
        self.ld = loader
        self._memo: dict = {}

    def _cached(self, key, make):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # --- replays -------------------------------------------------------------------------------------------------
    def compare(self, run_dirs: list[str], target: str = "ostinato", n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
        """`ostinato replay compare` over the sessions of one or more run directories (each with sessions.csv and
        requests.csv); several runs count their sessions separately (`#run<i>`), as the notebooks do."""
        return self._cached(("compare", tuple(run_dirs), target, n_resamples, seed),
                            lambda: self._compare(list(run_dirs), target, n_resamples, seed))

    def _compare(self, run_dirs: list[str], target: str, n_resamples: int, seed: int) -> pd.DataFrame:
        from ostinato.replay.metrics import CompareConfig, compare_engines
        from ostinato.replay.results import tag_run

        ses, req = [], []
        for i, d in enumerate(run_dirs):
            s = pd.read_csv(self.ld.path(f"{d}/sessions.csv"))
            r = pd.read_csv(self.ld.path(f"{d}/requests.csv"))
            if len(run_dirs) > 1:
                s, r = tag_run(s, i + 1), tag_run(r, i + 1)
            ses.append(s)
            req.append(r)
        cfg = CompareConfig(target=target, n_resamples=n_resamples, seed=seed)
        return compare_engines(pd.concat(ses, ignore_index=True), pd.concat(req, ignore_index=True), cfg).table

    def results(self, run_dirs: list[str], target: str = "ostinato") -> pd.DataFrame:
        """The result notebooks' comparison (`ostinato.figures.results.compare`: the paper's workloads SWE and tau2,
        each engine's prefill and decode totals, TTFT by kind) of repeated runs, each run's sessions apart."""
        def make() -> pd.DataFrame:
            from ostinato.figures import results as R
            from ostinato.figures.runs import load_measured

            dirs = [self.ld.path(f"{d}/sessions.csv").parent for d in run_dirs]
            runs = load_measured([d / "sessions.csv" for d in dirs], [d / "requests.csv" for d in dirs], "reference",
                                 repeated_runs=True)
            return R.compare(runs, R.CompareOptions(target=target))
        return self._cached(("results", tuple(run_dirs), target), make)

    def phase_changes(self, run_dirs: list[str], target: str = "ostinato") -> pd.DataFrame:
        """Figure 6a/b over repeated runs: the target's prefill, decode and total change against each engine (%)."""
        from ostinato.figures import results as R

        return R.phase_changes(self.results(run_dirs, target), target)

    def predict(self, fit_json: str, summary_json: str, cold_json: str) -> pd.DataFrame:
        """The calibrated cost model's prediction of a sweep on the same machine (`predict_sweep`)."""
        from ostinato.figures import results as R

        return R.predict_sweep(self.ld.json(fit_json), self.ld.json(summary_json), self.ld.json(cold_json))

    def prefill_paths(self, run_dirs: list[str]) -> pd.DataFrame:
        """Table 8a steps 3 -> 4 over repeated runs: `ostinato` against `ostinato-native-prefill` per workload (the
        measured rows of `ostinato.figures.results.prefill_paths`, with the paths' saved share [CI] and wins)."""
        from ostinato.figures import results as R

        table = self.results(run_dirs, target="ostinato")
        pp = R.prefill_paths(table, self.ld.path("/data/paper/table8_ablation.csv"))
        pp = pp[pp["series"] != R.PAPER].copy()
        won = table[table["engine"] == "ostinato-native-prefill"].set_index("workload")["won"]
        pp["won"] = [int(won.get(w, 0)) for w in pp["workload"]]
        return pp.reset_index(drop=True)

    def paper_prefill_paths(self, table8_csv: str) -> float:
        """The paper's prefill change (%) of Table 8a's steps 3 -> 4."""
        a = self.ld.csv(table8_csv).where(panel="a").df.set_index("step")
        return float(100 * (a.loc[4, "prefill_s"] / a.loc[3, "prefill_s"] - 1))

    def figure1b_error(self, table3_csv: str, figure1_csv: str) -> float:
        """The largest difference between Figure 1b's speedups and those Table 3's totals give (the paper's own
        rounding)."""
        t3 = self.ld.csv(table3_csv).df.set_index(["workload", "gpus", "engine"]).sort_index()
        f1 = self.ld.csv(figure1_csv).df
        f1 = f1[f1["panel"] == "b"]
        err = [abs(t3.loc[(r.workload, r.gpus)]["total_s"].max() / t3.loc[(r.workload, r.gpus, r.engine), "total_s"]
                   - r.speedup) for r in f1.itertuples()]
        return float(max(err))

    @staticmethod
    def max_abs_diff(a: list, b: list) -> float:
        """The largest |a_i - b_i|."""
        return float(max(abs(float(x) - float(y)) for x, y in zip(a, b, strict=True)))

    @staticmethod
    def duration(seconds: float) -> str:
        """A step's time as the getting-started table gives it: seconds below two minutes, else minutes."""
        return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    @staticmethod
    def size(nbytes: float) -> str:
        """Disk use as the getting-started table gives it."""
        if nbytes < 1e6:
            return "< 1 MB"
        return f"{nbytes / 1e6:.0f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:.1f} GB"

    def requests(self, run_dirs: list[str]) -> pd.DataFrame:
        """The per-request rows of the run directories (one frame, a `run` column)."""
        return pd.concat([pd.read_csv(self.ld.path(f"{d}/requests.csv")).assign(run=i + 1)
                          for i, d in enumerate(run_dirs)], ignore_index=True)

    def sessions(self, run_dirs: list[str]) -> pd.DataFrame:
        """The per-session rows of the run directories (one frame, a `run` column)."""
        return pd.concat([pd.read_csv(self.ld.path(f"{d}/sessions.csv")).assign(run=i + 1)
                          for i, d in enumerate(run_dirs)], ignore_index=True)

    @staticmethod
    def row(table: pd.DataFrame, **eq) -> pd.Series:
        """The one row of a frame matching column values."""
        sub = table
        for k, v in eq.items():
            sub = sub[_matches(sub[k], v)]
        if len(sub) != 1:
            raise ValueError(f"{len(sub)} rows match {eq}, expected one")
        return sub.iloc[0]

    @staticmethod
    def rows_by(table: pd.DataFrame, key: str, **eq):
        """A function of one key value returning the one row with that value and `eq` (for templates that look up
        the same rows by several keys)."""
        return lambda v: Facts.row(table, **{key: v, **eq})

    # --- benchmarks ----------------------------------------------------------------------------------------------
    def sweep(self, summary: str) -> pd.DataFrame:
        """The rows of an `ostinato sweep` summary.json (one per engine, kind and size)."""
        return pd.DataFrame(self.ld.json(summary)["rows"])

    def upload_passes(self, log_txt: str) -> pd.DataFrame:
        """The engine's `upload pass` log lines in a text file: routes, experts, bytes, ms and GB/s of each."""
        from ostinato.calibrate.run import upload_passes

        ups = upload_passes(self.ld.text(log_txt))
        if ups.empty:
            raise ValueError(f"{log_txt}: no `upload pass` lines")
        return ups.assign(gbps=ups["bytes"] / ups["ms"] / 1e6)

    # --- provenance ----------------------------------------------------------------------------------------------
    def build_seconds(self, build_txt: str) -> dict[str, int]:
        """Seconds per engine variant and in total from a build.txt (`[engine] <variant>: done in N s`)."""
        text = self.ld.text(build_txt)
        out = {v: int(s) for v, s in re.findall(r"\[engine\] (\w+): done in (\d+) s", text)}
        m = re.search(r"build_seconds_total (\d+)", text)
        if m:
            out["total"] = int(m.group(1))
        return out

    def pytest_summary(self, tests_txt: str) -> dict[str, int]:
        """The counts of pytest's last summary line in a log (`N passed, M failed, ...`)."""
        lines = [ln for ln in self.ld.text(tests_txt).splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        if not lines:
            raise ValueError(f"{tests_txt}: no pytest summary line")
        return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1])}

    def gpu_memory_mib(self, machine_txt: str) -> int:
        """The GPU's memory in MiB from nvidia-smi's table in a machine.txt."""
        return int(self.ld.grep(machine_txt, r"/\s*(\d+)MiB"))

    def driver(self, machine_txt: str) -> str:
        return self.ld.grep(machine_txt, r"Driver Version:\s*([\d.]+)")

    def cuda(self, machine_txt: str) -> str:
        return self.ld.grep(machine_txt, r"CUDA Version:\s*([\d.]+)")


def _matches(col: pd.Series, v) -> pd.Series:
    """Rows of `col` equal to `v`: numerically when both are numbers (128 matches 128.0), else as text."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and pd.api.types.is_numeric_dtype(col):
        return col == v
    return col.astype(str) == str(v)
