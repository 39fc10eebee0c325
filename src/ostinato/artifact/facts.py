"""Numbers the documents quote that take more than a template expression: comparisons over repeated runs, sweep
rows, build times, test counts, the machine. Each reads the shipped files through the template's `Loader`."""

from __future__ import annotations

import re

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

    def predict(self, fit_json: str, summary_json: str, cold_json: str) -> pd.DataFrame:
        """The calibrated cost model's prediction of a sweep on the same machine (`predict_sweep`)."""
        from ostinato.figures import results as R

        return R.predict_sweep(self.ld.json(fit_json), self.ld.json(summary_json), self.ld.json(cold_json))

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

    def figures_compare(self, run_dirs: list[str]) -> pd.DataFrame:
        """The result notebooks' comparison of shipped repeated runs (`figures.results.compare` over the runs as the
        series `measured (h200, reference)`, each run's sessions counted separately): per paper workload (`SWE`,
        `tau2`) and engine the total, saved share [CI], won, median TTFT per kind, median TPOT, and the server's
        prefill and decode time."""
        def make() -> pd.DataFrame:
            from ostinato.figures import results
            from ostinato.figures.runs import load_measured

            runs = load_measured([self.ld.path(f"{d}/sessions.csv") for d in run_dirs],
                                 [self.ld.path(f"{d}/requests.csv") for d in run_dirs], "h200, reference",
                                 repeated_runs=True)
            return results.compare(runs)
        return self._cached(("figures_compare", tuple(run_dirs)), make)

    def phase_changes(self, run_dirs: list[str]) -> pd.DataFrame:
        """Ostinato's prefill, decode and total time against each other engine, per workload (percent, negative =
        shorter), over the runs as `figures_compare` pools them (Figure 6a/b's computation)."""
        from ostinato.figures import results

        return results.phase_changes(self.figures_compare(run_dirs))

    def prefill_paths(self, run_dirs: list[str], table8_csv: str = "/data/paper/table8_ablation.csv") -> pd.DataFrame:
        """Table 8a's comparison, the size-dependent prefill paths against native prefill with the same resident
        experts: the paper's screening rows (steps 3 -> 4) and the runs' per workload (changes in percent, the
        saved share [CI] of the configuration with the paths)."""
        from ostinato.figures import results

        return results.prefill_paths(self.figures_compare(run_dirs), self.ld.path(table8_csv))

    def last_streamed(self, run_dirs: list[str]) -> pd.DataFrame:
        """The per-request rows of the runs (`requests`) with the last token id the server streamed in each
        (`last_streamed`, from the request records in each run's replay.tar.gz; None where it streamed none), and
        `forced_match` as a boolean: what a request that stopped short of its forced tokens ended on."""
        import json
        import tarfile

        from ostinato.replay.metrics import as_bool

        last: dict[tuple, int | None] = {}
        for i, d in enumerate(run_dirs):
            with tarfile.open(self.ld.path(f"{d}/replay.tar.gz")) as tar:
                for m in tar.getmembers():
                    if not (m.isfile() and "/sessions/" in m.name and m.name.endswith(".jsonl")):
                        continue
                    for line in tar.extractfile(m).read().decode("utf-8").splitlines():
                        rec = json.loads(line)
                        ids = rec.get("streamed_token_ids") or []
                        last[(i + 1, rec["engine"], rec["session"], int(rec["turn"]))] = ids[-1] if ids else None
        req = self.requests(run_dirs)
        req = req.assign(forced_match=as_bool(req["forced_match"]))
        missing = [k for k in zip(req["run"], req["engine"], req["session"], req["turn"].astype(int)) if k not in last]
        if missing:
            raise ValueError(f"{len(missing)} requests have no record in replay.tar.gz, e.g. {missing[0]}")
        return req.assign(last_streamed=[last[k] for k in zip(req["run"], req["engine"], req["session"],
                                                                 req["turn"].astype(int))])

    @staticmethod
    def qwen_special(token_id: int) -> str:
        """The name of one of the Qwen3 vocabulary's added tokens (`<|im_end|>` for 151645)."""
        from ostinato.models.vocab import QWEN3_SPECIAL_START, QWEN3_SPECIALS

        i = int(token_id) - QWEN3_SPECIAL_START
        if not 0 <= i < len(QWEN3_SPECIALS):
            raise ValueError(f"{token_id} is not an added token of the Qwen3 vocabulary")
        return QWEN3_SPECIALS[i][0]

    @staticmethod
    def paper_constant(name: str) -> float:
        """A number of the paper that the code holds rather than `data/paper/` (`costmodel.checks.PAPER`: e.g.
        `hot_share`, `pool_small`)."""
        from ostinato.costmodel.checks import PAPER

        return PAPER[name]

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

    def sweep_vs(self, rows_csv: str, baseline: str) -> pd.DataFrame:
        """An `ostinato sweep` run's rows summarized against another engine than its own first one (a run in reversed
        engine order, compared with the same baseline as the first run), as `summarize` does."""
        from ostinato.sweep.prefill import read_rows, summarize

        return self._cached(("sweep_vs", rows_csv, baseline), lambda: pd.DataFrame(
            summarize(read_rows(self.ld.path(rows_csv)), baseline)))

    def decode_floor(self, rows_csv: str, engine: str, prefix: int, baseline: str = "llama.cpp-layers",
                     floor: str = "llama.cpp-gpu-experts") -> dict[str, float]:
        """One engine's decode step against the floor its sweep ran (every expert on the GPU) and half the baseline's
        step, in ms per step: `rest_over_floor` (the engine's step outside its branches over the floor's whole step),
        `room_ms` (half the baseline's step less the floor's: what the worker may take for half) and `short_ms` (how
        far the engine's step is above half the baseline's)."""
        t = self.sweep_vs(rows_csv, baseline)
        half = self.row(t, engine=baseline, kind="decode", prefix=prefix).median_s * 500
        f = self.row(t, engine=floor, kind="decode", prefix=prefix).median_s * 1000
        x = self.row(t, engine=engine, kind="decode", prefix=prefix)
        return {"rest_over_floor": x.worker_rest_ms_per_step / f, "room_ms": half - f,
                "short_ms": x.median_s * 1000 - half}

    def server_decodes(self, log: str) -> pd.DataFrame:
        """The decode requests a llama-server log reports, in order (`eval time = X ms / N tokens (Y ms per token`
        with N > 1): tokens and the server's own ms per token (a sweep's decode requests after each prefix, rep by
        rep)."""
        rows = [(int(n), float(per)) for n, per in
                re.findall(r"\|\s+eval time =\s+[\d.]+ ms /\s+(\d+) tokens \(\s*([\d.]+) ms per token",
                           self.ld.text(log)) if int(n) > 1]
        if not rows:
            raise ValueError(f"{log}: no decode request (`eval time = ... / N tokens`, N > 1)")
        return pd.DataFrame(rows, columns=["tokens", "ms_per_token"])

    def decode_bound(self, fit_json: str, summary_json: str, cold_json: str, prefix: int,
                     engine: str = "ostinato") -> dict:
        """Issue 14's per-step bound of overlapped branches: the in-turn engine's measured decode step less what
        overlapping can hide, L·min(G, C) with the engine timers' G and C = α + β·µ (µ the sweep's cold routes per
        token and layer in decode after `prefix`)."""
        fit, summ, cold = self.ld.json(fit_json), self.ld.json(summary_json), self.ld.json(cold_json)
        step = next(1e3 * r["median_s"] for r in summ["rows"]
                    if r["engine"] == engine and r["kind"] == "decode" and r.get("prefix") == prefix)
        mu = float(cold["by_prefix"][str(prefix)][engine]["decode"])
        g = float(fit["engine_gpu_branch_ms"])
        c = float(fit["engine_alpha_ms"]) + float(fit["engine_beta_ms"]) * mu
        n_layer = int(fit["n_moe_layer"])
        hide = n_layer * min(g, c)
        return {"inturn_ms": step, "mu": mu, "g_ms": g, "c_ms": c, "cpu_ms": n_layer * c, "hidden_ms": hide,
                "bound_ms": step - hide}

    def upload_passes(self, log_txt: str) -> pd.DataFrame:
        """The engine's `upload pass` log lines in a text file: routes, experts, bytes, ms and GB/s of each."""
        from ostinato.calibrate.run import upload_passes

        ups = upload_passes(self.ld.text(log_txt))
        if ups.empty:
            raise ValueError(f"{log_txt}: no `upload pass` lines")
        return ups.assign(gbps=ups["bytes"] / ups["ms"] / 1e6)

    # --- op tests -------------------------------------------------------------------------------------------------
    @staticmethod
    def _params(text: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)

    def backend_ops(self, log_txt: str) -> pd.DataFrame:
        """The cases of a `test-backend-ops test` log: op, status (`OK`, `FAIL`, `not supported`) and the case's
        parameters as columns (`type_a`, `n`, `cold_share`, ...; strings as the log writes them)."""
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.ld.text(log_txt))  # colour codes around OK / FAIL
        rows = [{"op": op, "status": status.strip(), **self._params(params)}
                for op, params, status in re.findall(r"^\s+(\w+)\((.*?)\): (OK|FAIL|not supported)", text, re.M)]
        if not rows:
            raise ValueError(f"{log_txt}: no test-backend-ops cases")
        return pd.DataFrame(rows)

    def residency_ops(self, log_txt: str) -> pd.DataFrame:
        """The cases of a `test-residency-ops -v` log: `kind` (`cpu`: marked against unmarked nodes, with `threads`;
        `sched`: a scheduler with `backend`; `branch`: GGML_OP_HOST_BRANCH on `backend`, its `case` answered or
        unanswered; `pool`: a layer's CPU branch on a thread pool of its own threads, with `threads`), op, status and the
        case's parameters as columns. Lines that CUDA's
        warm-up messages split are joined first."""
        text = re.sub(r"ggml_backend_cuda_graph_compute: CUDA graph warmup (?:complete|reset)\n", "",
                      self.ld.text(log_txt))
        rows = [{"kind": kind, "op": op, "status": status, "threads": threads or None, "backend": backend or None,
                 "case": params if "=" not in params else None, **self._params(params)}
                for kind, op, params, threads, backend, status in re.findall(
                    r"^\s*(cpu|sched|branch|pool)\s+(\w+)\((.*?)\)(?:,threads=(\d+)|,(\w+)): (OK|FAIL)", text, re.M)]
        if not rows:
            raise ValueError(f"{log_txt}: no test-residency-ops cases")
        return pd.DataFrame(rows)

    # --- provenance ----------------------------------------------------------------------------------------------
    def build_seconds(self, build_txt: str) -> dict[str, int]:
        """Seconds per engine variant and in total from a build.txt (`[engine] <variant>: done in N s`)."""
        text = self.ld.text(build_txt)
        out = {v: int(s) for v, s in re.findall(r"\[engine\] (\w+): done in (\d+) s", text)}
        m = re.search(r"build_seconds_total (\d+)", text)
        if m:
            out["total"] = int(m.group(1))
        return out

    def sched_splits(self, log: str) -> dict[str, int]:
        """The splits of the last graph a server log lists (`GGML_SCHED_DEBUG=2`, `-lv 5`): how many in all and how
        many on the CPU, and the layers with a node `ffn_moe_host_send-*` (one graph per decode step) or `ffn_moe_cold_in-*`
        (per-segment graphs) in it."""
        text = self.ld.text(log)
        if "## SPLIT #0" not in text:
            raise ValueError(f"{log}: no scheduler listing (GGML_SCHED_DEBUG=2)")
        graph = text.split("## SPLIT #0")[-1]
        backends = ["CPU" if b == "CPU" else b for b in
                    [re.match(r":\s*(\S+)", graph).group(1)] + re.findall(r"## SPLIT #\d+: (\S+)", graph)]
        return {"splits": len(backends), "cpu_splits": sum(b == "CPU" for b in backends),
                "host_send": len(set(re.findall(r"ffn_moe_host_send-\d+", graph))),
                "cold_in": len(set(re.findall(r"ffn_moe_cold_in-\d+\b", graph)))}

    def pytest_summary(self, tests_txt: str) -> dict[str, int]:
        """The counts of pytest's last summary line in a log (`N passed, M failed, ...`)."""
        lines = [ln for ln in self.ld.text(tests_txt).splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        if not lines:
            raise ValueError(f"{tests_txt}: no pytest summary line")
        return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", lines[-1])}

    def allclose_failure(self, log_txt: str) -> dict[str, float]:
        """The first `np.testing.assert_allclose` failure in a pytest log: its tolerances, the mismatched and compared
        elements, the largest absolute and relative differences among them, and the columns of the compared array
        (so `elements / columns` rows, e.g. generated tokens of top-k log-probabilities)."""
        text = self.ld.text(log_txt)
        pats = {"rtol": r"Not equal to tolerance rtol=([\d.e-]+)", "atol": r"tolerance rtol=\S+ atol=([\d.e-]+)",
                "mismatched": r"Mismatched elements: (\d+) /", "elements": r"Mismatched elements: \d+ / (\d+)",
                "max_abs": r"Max absolute difference among violations: ([\d.e-]+)",
                "max_rel": r"Max relative difference among violations: ([\d.e-]+)"}
        out: dict[str, float] = {}
        for k, p in pats.items():
            m = re.search(p, text)
            if not m:
                raise ValueError(f"{log_txt}: no assert_allclose failure ({k}: no match for {p!r})")
            out[k] = float(m.group(1))
        first_row = re.search(r"ACTUAL: array\(\[\[([^\]]*)\]", text)
        if not first_row:
            raise ValueError(f"{log_txt}: no ACTUAL array")
        out["columns"] = len(first_row.group(1).split(","))
        out["rows"] = out["elements"] / out["columns"]
        return out

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
