"""The paper's result tables computed from any series (measured or simulated), with the paper's rows beside them.

Each function returns a long table with a `series` column (`paper`, `measured (<machine>)`,
`simulated (<profile>)`), so one notebook shows the three side by side and one test checks each computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ostinato.figures.runs import Runs
from ostinato.presets import display_name
from ostinato.figures.style import series_label
from ostinato.replay.load import FOREIGN, UNKNOWN
from ostinato.replay.metrics import CompareConfig, bootstrap_saved, saved_share

PAPER = series_label("paper")
KINDS = ("first", "tool", "user")
WORKLOADS = ("SWE", "tau2")

# the ablation step each engine or simulator policy stands for (the paper's Table 8b)
# (`ostinato-native-prefill` is step 3: its two branches run in turn, in the engine as llama.cpp's scheduler orders
# them and in the simulator's policy of the same name; the simulator's -overlap policy is step 4)
ABLATION_STEP = {"llama.cpp-layers": 1, "llama.cpp-expert-cache": 2, display_name("llama.cpp-expert-cache"): 2,
                 "ostinato-native-prefill": 3, "ostinato-native-prefill-overlap": 4, "ostinato": 5}
# the configuration with native prefill and the one that adds the size-dependent prefill paths (Table 8a, steps 3 → 4)
PREFILL_PATH_PAIRS = (("ostinato-native-prefill", "ostinato"), ("ostinato-native-prefill-overlap", "ostinato"))


@dataclass(frozen=True)
class CompareOptions:
    """The target engine and the bootstrap of the saved share (paired over sessions, seeded)."""

    target: str = "ostinato"
    n_resamples: int = 9999
    seed: int = 0
    confidence: float = 0.95


def complete(runs: Runs, series: str, workload: str) -> tuple[pd.DataFrame, list[str]]:
    """One series' sessions of one workload, and the session ids every one of its engines completed."""
    s = runs.sessions[(runs.sessions["series"] == series) & (runs.sessions["workload"] == workload)]
    engines = s["engine"].nunique()
    done = s[s["ok"].astype(bool)].groupby("session")["engine"].nunique()
    return s, sorted(done[done == engines].index)


def compare(runs: Runs, opts: CompareOptions = CompareOptions()) -> pd.DataFrame:
    """Table 3's columns per series, workload and engine: total, share the target saves [CI], sessions won,
    median TTFT per request kind, median TPOT, and the engine's own prefill and decode time.

    Only sessions that every engine of the series completed count; a series without the target has no saved share.
    """
    rows = []
    cfg = CompareConfig(target=opts.target, n_resamples=opts.n_resamples, seed=opts.seed, confidence=opts.confidence)
    for series in runs.series:
        for workload in [w for w in dict.fromkeys(runs.sessions["workload"])]:
            s, kept = complete(runs, series, workload)
            if s.empty:
                continue
            wide = s[s["session"].isin(kept)].set_index(["engine", "session"])
            engines = list(dict.fromkeys(s["engine"]))
            total = {e: wide.loc[e, "total_s"].reindex(kept).to_numpy(float) if kept else np.array([]) for e in engines}
            r = runs.requests[(runs.requests["series"] == series) & runs.requests["session"].isin(kept)]
            for e in engines:
                re_ = r[r["engine"] == e]
                row = {"series": series, "workload": workload, "engine": e, "sessions": len(kept),
                       "dropped": int(s["session"].nunique() - len(kept)), "total_s": float(total[e].sum()),
                       "prefill_s": float(wide.loc[e, "prefill_s"].reindex(kept).sum()) if kept else np.nan,
                       "decode_s": float(wide.loc[e, "decode_s"].reindex(kept).sum()) if kept else np.nan,
                       "tpot_ms": float(re_["tpot_ms"].median()) if re_["tpot_ms"].notna().any() else np.nan}
                for k in KINDS:
                    v = re_.loc[re_["kind"] == k, "ttft_s"].dropna()
                    row[f"ttft_{k}_s"], row[f"n_{k}"] = (float(v.median()) if len(v) else np.nan), len(v)
                row.update(load_counts(s[(s["engine"] == e) & s["session"].isin(kept)]))
                if e != opts.target and opts.target in total and kept:
                    low, high = bootstrap_saved(total[opts.target], total[e], cfg)
                    row.update(saved_pct=100 * saved_share(total[opts.target], total[e]), saved_ci_low_pct=100 * low,
                               saved_ci_high_pct=100 * high, won=int(np.sum(total[opts.target] < total[e])))
                rows.append(row)
    cols = ["series", "workload", "engine", "sessions", "dropped", "total_s", "saved_pct", "saved_ci_low_pct",
            "saved_ci_high_pct", "won", *(f"ttft_{k}_s" for k in KINDS), *(f"n_{k}" for k in KINDS), "tpot_ms",
            "prefill_s", "decode_s", "foreign_load_sessions", "load_unknown_sessions"]
    return pd.DataFrame(rows).reindex(columns=cols)


def load_counts(sessions: pd.DataFrame) -> dict:
    """Sessions measured under foreign load and sessions without load samples among these rows (NaN for a series that
    has no load flag at all: a simulated one)."""
    flags = sessions["load_flag"] if "load_flag" in sessions else pd.Series(dtype=object)
    if flags.isna().all():
        return {"foreign_load_sessions": np.nan, "load_unknown_sessions": np.nan}
    flags = flags.fillna(UNKNOWN)
    return {"foreign_load_sessions": int((flags == FOREIGN).sum()), "load_unknown_sessions": int((flags == UNKNOWN).sum())}


CORRECTNESS_COLUMNS = ["series", "workload", "engine", "sessions", "completed", "requests", "requests_ok",
                       "forced_checked", "forced_match", "forced_match_pct", "foreign_load_sessions",
                       "load_unknown_sessions"]


def correctness(runs: Runs) -> pd.DataFrame:
    """A correctness run's table (a CPU-only machine's replays, `runs.split_correctness`) per series, workload and
    engine: sessions replayed and completed, requests and those that succeeded, requests whose forced tokens were
    checked and those that returned exactly their recorded tokens, and the sessions measured under foreign load or
    without load samples. No times: they measure no engine's speed."""
    rows = []
    for (series, workload, engine), g in runs.sessions.groupby(["series", "workload", "engine"], sort=False):
        num = lambda c: pd.to_numeric(g[c], errors="coerce").sum(min_count=1)  # noqa: E731
        checked, matched = num("n_forced_checked"), num("n_forced_match")
        rows.append({"series": series, "workload": workload, "engine": engine, "sessions": len(g),
                     "completed": int(g["ok"].astype(bool).sum()), "requests": num("n_requests"),
                     "requests_ok": num("n_ok"), "forced_checked": checked, "forced_match": matched,
                     "forced_match_pct": 100 * matched / checked if checked and pd.notna(checked) else np.nan,
                     **load_counts(g)})
    return pd.DataFrame(rows, columns=CORRECTNESS_COLUMNS)


def paper_table3(table3_csv: str | Path, table7_csv: str | Path, gpus: int = 4) -> pd.DataFrame:
    """The paper's Table 3 (and Table 7's TTFT by kind) in `compare`'s columns."""
    t3 = pd.read_csv(table3_csv)
    t3 = t3[t3["gpus"] == gpus]
    t7 = pd.read_csv(table7_csv).pivot_table(index=["workload", "engine"], columns="kind", values="ttft_median_s")
    out = pd.DataFrame({"series": PAPER, "workload": t3["workload"], "engine": t3["engine"],
                        "sessions": t3["sessions"], "dropped": 0, "total_s": t3["total_s"],
                        "saved_pct": t3["saved_pct"], "saved_ci_low_pct": t3["saved_ci_low_pct"],
                        "saved_ci_high_pct": t3["saved_ci_high_pct"], "won": t3["won"],
                        "ttft_tool_s": t3["ttft_tool_s"], "tpot_ms": t3["tpot_ms"]})
    for k in ("first", "user"):
        out[f"ttft_{k}_s"] = [t7[k].get((w, e), np.nan) if k in t7 else np.nan
                              for w, e in zip(out["workload"], out["engine"])]
    return out.reset_index(drop=True)


def speedups(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Figure 1: each engine's speedup over the slowest engine of its series and workload (`metric` a column of
    `compare`, e.g. `ttft_tool_s` or `total_s`)."""
    rows = []
    for (series, workload), g in table.groupby(["series", "workload"], sort=False):
        g = g[g[metric].notna() & (g[metric] > 0)]
        if g.empty:
            continue
        slow = g.loc[g[metric].idxmax()]
        for _, r in g.iterrows():
            rows.append({"series": series, "workload": workload, "engine": r["engine"], "metric": metric,
                         "reference_engine": slow["engine"], "speedup": float(slow[metric] / r[metric])})
    return pd.DataFrame(rows, columns=["series", "workload", "engine", "metric", "reference_engine", "speedup"])


def paper_figure1(figure1_csv: str | Path, gpus: int = 4) -> pd.DataFrame:
    """The paper's Figure 1 speedups in `speedups`' columns (`ttft_tool_s` for panel a, `total_s` for b)."""
    f1 = pd.read_csv(figure1_csv)
    f1 = f1[f1["gpus"] == gpus]
    metric = f1["panel"].map({"a": "ttft_tool_s", "b": "total_s"})
    return pd.DataFrame({"series": PAPER, "workload": f1["workload"], "engine": f1["engine"], "metric": metric,
                         "reference_engine": f1["reference_engine"], "speedup": f1["speedup"]}).reset_index(drop=True)


def session_savings(runs: Runs, target: str = "ostinato") -> pd.DataFrame:
    """Figure 4: per series, workload, baseline and session, the share of the baseline's request time the target
    saves (sessions every engine of the series completed)."""
    rows = []
    for series in runs.series:
        for workload in dict.fromkeys(runs.sessions["workload"]):
            s, kept = complete(runs, series, workload)
            if s.empty or target not in set(s["engine"]):
                continue
            t = s[s["engine"] == target].set_index("session")["total_s"]
            for e in dict.fromkeys(s["engine"]):
                if e == target:
                    continue
                b = s[s["engine"] == e].set_index("session")["total_s"]
                for sid in kept:
                    rows.append({"series": series, "workload": workload, "engine": e, "session": sid,
                                 "saved_pct": 100 * (1 - t[sid] / b[sid])})
    return pd.DataFrame(rows, columns=["series", "workload", "engine", "session", "saved_pct"])


def savings_summary(savings: pd.DataFrame) -> pd.DataFrame:
    """Figure 4's numbers per series, workload and baseline: sessions, smallest, median and largest saving."""
    g = savings.groupby(["series", "workload", "engine"], sort=False)["saved_pct"]
    return pd.DataFrame({"sessions": g.size(), "min_saved_pct": g.min(), "median_saved_pct": g.median(),
                         "max_saved_pct": g.max()}).reset_index()


def ttft_quantiles(runs: Runs, kind: str = "tool", qs: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9, 0.99)) -> pd.DataFrame:
    """Figure 5's distribution in numbers: quantiles of TTFT of one request kind per series, workload and engine."""
    r = runs.requests[(runs.requests["kind"] == kind) & runs.requests["ttft_s"].notna()]
    rows = []
    for (series, workload, engine), g in r.groupby(["series", "workload", "engine"], sort=False):
        row = {"series": series, "workload": workload, "engine": engine, "kind": kind, "turns": len(g)}
        row.update({f"p{round(100 * q)}_s": float(g["ttft_s"].quantile(q)) for q in qs})
        rows.append(row)
    return pd.DataFrame(rows)


def phase_changes(table: pd.DataFrame, target: str = "ostinato") -> pd.DataFrame:
    """Figure 6a/b: the target's prefill and decode time relative to each other engine of its series (negative =
    shorter), from `compare`'s per-engine totals."""
    rows = []
    for (series, workload), g in table.groupby(["series", "workload"], sort=False):
        g = g.set_index("engine")
        if target not in g.index:
            continue
        for ref in g.index:
            if ref == target:
                continue
            row = {"series": series, "workload": workload, "engine": target, "reference_engine": ref}
            for phase in ("prefill", "decode", "total"):
                a, b = g.loc[target, f"{phase}_s"], g.loc[ref, f"{phase}_s"]
                row[f"{phase}_change_pct"] = 100 * (a / b - 1) if b and pd.notna(a) and pd.notna(b) else np.nan
            rows.append(row)
    return pd.DataFrame(rows, columns=["series", "workload", "engine", "reference_engine", "prefill_change_pct",
                                       "decode_change_pct", "total_change_pct"])


def tpot_by_context(runs: Runs, n_bins: int = 4) -> pd.DataFrame:
    """Figure 6d: median TPOT per context-length quartile (quartiles over each series and workload's decoding
    requests of all engines, so the engines share bin edges)."""
    r = runs.requests[runs.requests["tpot_ms"].notna() & runs.requests["context"].notna()]
    rows = []
    for (series, workload), g in r.groupby(["series", "workload"], sort=False):
        edges = np.unique(np.quantile(g["context"], np.linspace(0, 1, n_bins + 1)))
        if len(edges) < 2:
            continue
        q = pd.cut(g["context"], edges, include_lowest=True, labels=False)
        for (engine, b), h in g.groupby([g["engine"], q], sort=False):
            rows.append({"series": series, "workload": workload, "engine": engine, "quartile": int(b) + 1,
                         "context_low": float(edges[int(b)]), "context_high": float(edges[int(b) + 1]),
                         "requests": len(h), "tpot_median_ms": float(h["tpot_ms"].median())})
    out = pd.DataFrame(rows, columns=["series", "workload", "engine", "quartile", "context_low", "context_high",
                                      "requests", "tpot_median_ms"])
    return out.sort_values(["series", "workload", "engine", "quartile"]).reset_index(drop=True)


def ttft_by_kind(table: pd.DataFrame) -> pd.DataFrame:
    """Table 7 in long form: median TTFT and request count per series, workload, engine and kind."""
    rows = []
    for _, r in table.iterrows():
        for k in KINDS:
            v, n = r.get(f"ttft_{k}_s"), r.get(f"n_{k}")
            if pd.notna(v):
                rows.append({"series": r["series"], "workload": r["workload"], "engine": r["engine"], "kind": k,
                             "turns": n, "ttft_median_s": float(v)})
    return pd.DataFrame(rows, columns=["series", "workload", "engine", "kind", "turns", "ttft_median_s"])


def paper_table7(table7_csv: str | Path) -> pd.DataFrame:
    """The paper's Table 7 in `ttft_by_kind`'s columns."""
    t7 = pd.read_csv(table7_csv)
    return pd.DataFrame({"series": PAPER, "workload": t7["workload"], "engine": t7["engine"], "kind": t7["kind"],
                         "turns": t7["turns"], "ttft_median_s": t7["ttft_median_s"]})


def ablation(table: pd.DataFrame, steps: dict[str, int] | None = None) -> pd.DataFrame:
    """Table 8b: each engine that stands for an ablation step, its total, prefill and decode time, and each
    relative to step 1 (layer placement) of the same series and workload."""
    steps = steps or ABLATION_STEP
    t = table[table["engine"].isin(steps)].copy()
    t["step"] = t["engine"].map(steps).astype(int)
    rows = []
    for (series, workload), g in t.groupby(["series", "workload"], sort=False):
        g = g.sort_values("step")
        base = g[g["step"] == 1]
        for _, r in g.iterrows():
            row = {"series": series, "workload": workload, "step": int(r["step"]), "engine": r["engine"],
                   "sessions": r["sessions"], "total_s": r["total_s"], "prefill_s": r["prefill_s"],
                   "decode_s": r["decode_s"]}
            for c in ("total", "prefill", "decode"):
                row[f"{c}_rel_step1"] = float(r[f"{c}_s"] / base[f"{c}_s"].iloc[0]) if len(base) else np.nan
            rows.append(row)
    return pd.DataFrame(rows, columns=["series", "workload", "step", "engine", "sessions", "total_s", "prefill_s",
                                       "decode_s", "total_rel_step1", "prefill_rel_step1", "decode_rel_step1"])


# the engine presets that stand for Figure 8c's decode steps in a sweep, with the paper's configuration they match
# (the paper's step 1 overlaps its two branches through per-segment graphs; this engine's in-turn order is a step
# before it; its one graph per GPU comes with the CPU worker's threads set up once, steps 2 and 3 together, and its
# borrowed memory stands on either kind of graph)
DECODE_STEP = {"llama.cpp-layers": (0, "layer placement"),
               "ostinato": (0, "two branches in turn, per-segment graphs"),
               "ostinato-overlap": (1, "two branches with per-segment graphs"),
               "ostinato-graph": (3, "one graph per GPU, CPU pool set up once"),
               "ostinato-borrow": (4, "borrowed memory, on per-segment graphs"),
               "ostinato-graph-borrow": (4, "borrowed memory, on one graph per GPU")}


def decode_steps(sweeps: dict[str, dict], table8_csv: str | Path) -> pd.DataFrame:
    """Figure 8c's decode step times: the paper's panel c (relative to its buun baseline) and, for each labelled
    sweep summary (`ostinato sweep`'s summary.json), the decode TPOT of the presets that stand for a step, per
    prefix, relative to the sweep's baseline (whole-layer placement) with its 95% interval, and the routes computed
    on borrowed experts per step (`ostinato-borrow`, `ostinato-graph-borrow`)."""
    t8 = pd.read_csv(table8_csv)
    c = t8[t8["panel"] == "c"]
    rows = []
    for wl, g in c.groupby("workload", sort=False):
        base = float(g.loc[g["config"] == "buun", "decode_step_ms"].iloc[0])
        for _, r in g.iterrows():
            rows.append({"series": PAPER, "workload": wl, "prefix": np.nan, "step": int(r["step"]), "engine": r["config"],
                         "decode_step_ms": float(r["decode_step_ms"]), "ratio_to": "buun",
                         "ratio": float(r["decode_step_ms"]) / base, "ratio_ci_low": np.nan, "ratio_ci_high": np.nan,
                         "borrow_hits_per_step": np.nan})
    for label, doc in sweeps.items():
        meta = doc.get("meta", {})
        for r in doc["rows"]:
            if r["kind"] != "decode" or r["engine"] not in DECODE_STEP:
                continue
            step, what = DECODE_STEP[r["engine"]]
            rows.append({"series": label, "workload": "forced routing (sweep)",
                         "prefix": r.get("prefix", meta.get("prefix")), "step": step,
                         "engine": f"{r['engine']}: {what}", "decode_step_ms": 1e3 * float(r["median_s"]),
                         "ratio_to": r.get("ratio_to"), "ratio": r.get("ratio", np.nan),
                         "ratio_ci_low": r.get("ratio_ci_low", np.nan), "ratio_ci_high": r.get("ratio_ci_high", np.nan),
                         "borrow_hits_per_step": r.get("borrow_hits_per_step", np.nan)})
    return pd.DataFrame(rows, columns=["series", "workload", "prefix", "step", "engine", "decode_step_ms", "ratio_to",
                                       "ratio", "ratio_ci_low", "ratio_ci_high", "borrow_hits_per_step"])


def paper_ablation(table8_csv: str | Path, panel: str = "b") -> pd.DataFrame:
    """The paper's Table 8 panel a or b in `ablation`'s columns (the step's configuration as `engine`)."""
    t8 = pd.read_csv(table8_csv)
    p = t8[t8["panel"] == panel].copy()
    p["step"] = p["step"].astype(int)
    base = p[p["step"] == 1].iloc[0]
    out = pd.DataFrame({"series": PAPER, "workload": p["workload"].str.split().str[0], "step": p["step"],
                        "engine": p["config"],
                        "sessions": np.nan, "total_s": p["total_s"], "prefill_s": p["prefill_s"],
                        "decode_s": p["decode_s"]})
    for c in ("total", "prefill", "decode"):
        out[f"{c}_rel_step1"] = p[f"{c}_s"] / base[f"{c}_s"]
    return out.reset_index(drop=True)


def prefill_paths(compared: pd.DataFrame, table8_csv: str | Path) -> pd.DataFrame:
    """What the size-dependent prefill paths change (Table 8a, steps 3 → 4): prefill, decode and total time of the
    configuration with them over the one with llama.cpp's native prefill and the same resident experts, per series
    and workload (`compare`'s rows; its saved share [CI] when the target is the engine with the paths)."""
    a = paper_ablation(table8_csv, "a").set_index("step")
    rows = [{"series": PAPER, "workload": a.loc[3, "workload"], "native": a.loc[3, "engine"],
             "paths": a.loc[4, "engine"], "sessions": np.nan,
             **{f"{w}_{c}_s": a.loc[step, f"{c}_s"] for w, step in (("native", 3), ("paths", 4))
                for c in ("prefill", "decode", "total")}}]
    for (series, workload), g in compared.groupby(["series", "workload"], sort=False):
        g = g.set_index("engine")
        for native, paths in PREFILL_PATH_PAIRS:
            if native not in g.index or paths not in g.index:
                continue
            n, p = g.loc[native], g.loc[paths]
            rows.append({"series": series, "workload": workload, "native": native, "paths": paths,
                         "sessions": n["sessions"], "saved_pct": n.get("saved_pct", np.nan),
                         "saved_ci_low_pct": n.get("saved_ci_low_pct", np.nan),
                         "saved_ci_high_pct": n.get("saved_ci_high_pct", np.nan),
                         **{f"{w}_{c}_s": float(r[f"{c}_s"]) for w, r in (("native", n), ("paths", p))
                            for c in ("prefill", "decode", "total")}})
    out = pd.DataFrame(rows)
    for c in ("prefill", "decode", "total"):
        out[f"{c}_change_pct"] = 100 * (out[f"paths_{c}_s"] / out[f"native_{c}_s"] - 1)
    return out.reindex(columns=["series", "workload", "native", "paths", "sessions", "native_prefill_s",
                                "paths_prefill_s", "prefill_change_pct", "native_decode_s", "paths_decode_s",
                                "decode_change_pct", "native_total_s", "paths_total_s", "total_change_pct",
                                "saved_pct", "saved_ci_low_pct", "saved_ci_high_pct"])


def predict_sweep(fit: dict, summary: dict, cold: dict, engine: str = "ostinato") -> pd.DataFrame:
    """Predicted against measured: the cost model with a machine's calibration (`ostinato calibrate`'s
    `fit.json`) predicts the Figure 7b sweep on that machine (`ostinato sweep`'s `summary.json` and
    `cold.json`, forced routing) for the target engine.

    Split path (passes below Np): base(n) + L·(c_layer + c_route·n·m), with base(n) the fitted r = 0 line, L the
    MoE layers and m the sweep's mean cold routes per token and layer in prefill. Decode: TPOT(0) +
    L·(β·µ + (α − γ0)·q) with µ the mean cold routes per token and layer; q (the probability of any cold route)
    is not recorded, so the prediction is the interval over µ/k ≤ q ≤ min(1, µ). Upload-path sizes have no
    prediction (the sweep does not record how many distinct experts each pass uploads).
    """
    meta = summary.get("meta", {})
    upload_min = int(meta["upload_min"])

    def cold_of(prefix: int | None) -> dict:
        """The engine's cold routes after this row's prefix (a sweep of one prefix records only `placements`)."""
        by = cold.get("by_prefix", {}).get(str(prefix)) or cold.get("placements", {})
        c = by.get(engine) or meta.get("cold", {}).get(engine)
        if c is None:
            raise ValueError(f"cold routes of engine {engine!r} not in cold.json (engines: {list(by)})")
        return c

    cold_of(None)
    n_layer, k = int(fit["n_moe_layer"]), int(fit["k"])
    rows = []
    for r in summary["rows"]:
        if r["engine"] != engine:
            continue
        c = cold_of(r.get("prefix"))
        prefix = r.get("prefix", meta.get("prefix"))
        if r["kind"] == "prefill":
            n = int(r["n_new"])
            row = {"kind": "prefill", "prefix": prefix, "n_new": n, "measured_ms": 1e3 * float(r["median_s"]),
                   "path": "split" if n < upload_min else "upload"}
            if n < upload_min:
                pred = (fit["prefill_pass_ms"] + fit["prefill_token_ms"] * n
                        + n_layer * (fit["cpu_layer_ms"] + fit["cpu_route_ms"] * n * float(c["prefill"])))
                row.update(predicted_ms=pred, predicted_low_ms=pred, predicted_high_ms=pred)
            rows.append(row)
        elif r["kind"] == "decode":
            mu = float(c["decode"])
            tp0 = float(fit["tpot_ms"].get("0", fit["tpot_ms"].get(0)))
            lo = tp0 + n_layer * (fit["beta_ms"] * mu + fit["alpha_minus_gamma0_ms"] * mu / k)
            hi = tp0 + n_layer * (fit["beta_ms"] * mu + fit["alpha_minus_gamma0_ms"] * min(1.0, mu))
            lo, hi = min(lo, hi), max(lo, hi)
            rows.append({"kind": "decode", "prefix": prefix, "n_new": np.nan, "path": "decode",
                         "measured_ms": 1e3 * float(r["median_s"]),
                         "predicted_ms": (lo + hi) / 2, "predicted_low_ms": lo, "predicted_high_ms": hi})
    out = pd.DataFrame(rows, columns=["kind", "prefix", "n_new", "path", "measured_ms", "predicted_ms", "predicted_low_ms",
                                      "predicted_high_ms"])
    out["error_pct"] = 100 * (out["predicted_ms"] / out["measured_ms"] - 1)
    inside = (out["measured_ms"] >= out["predicted_low_ms"]) & (out["measured_ms"] <= out["predicted_high_ms"])
    out["within_interval"] = inside.where(out["kind"] == "decode")  # only decode predicts an interval
    return out
