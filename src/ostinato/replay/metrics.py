"""Each replayed engine against a target engine, as the paper's Table 3 and Appendix C compare them."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats

from ostinato.atomic import atomic_open
from ostinato.replay.load import FOREIGN, UNKNOWN
from ostinato.series import series_label
from ostinato.tables import to_markdown
from ostinato.sessions.model import KINDS

CiMethod = Literal["BCa", "percentile", "basic"]

# Columns of the comparison table (one row per workload and engine, the target's own rows included), in order.
COMPARE_COLUMNS = [
    "workload", "engine", "target", "series", "sessions", "dropped", "total_s", "saved_pct", "saved_ci_low_pct",
    "saved_ci_high_pct", "won", *(f"ttft_{k}_s" for k in KINDS), *(f"n_{k}" for k in KINDS), "tpot_ms",
    "server_total_s", "client_server_ratio", "server_saved_pct", "saved_gap_pp", "foreign_load_sessions",
    "load_unknown_sessions", "load_threshold", "medians_over", "ci_method",
    "confidence", "n_resamples", "seed",
]
SESSION_COLUMNS = {"engine", "session", "total_request_s"}
ALL = "all"  # the workload name of all sessions together (and of session ids without a source prefix)


@dataclass(frozen=True)
class CompareConfig:
    """What to compare and how the bootstrap CI is drawn (paired over sessions, seeded)."""

    target: str = "ostinato"
    engines: tuple[str, ...] = ()  # engines compared with the target; empty: all others in the CSV
    confidence: float = 0.95
    n_resamples: int = 9999
    method: CiMethod = "BCa"
    seed: int = 0
    machine: str = ""  # label for the `series` column; empty: from the CSV's `machine` column
    clean_only: bool = False  # leave out a session that any compared engine replayed under foreign load


@dataclass(frozen=True)
class Comparison:
    """The comparison table, the sessions kept (completed by every engine) and those dropped."""

    table: pd.DataFrame
    kept: list[str]
    dropped: list[str] = field(default_factory=list)
    clean_only: bool = False  # whether sessions under foreign load were dropped too
    machine: str = ""


def saved_share(target_s: np.ndarray, engine_s: np.ndarray) -> float:
    """Share of the engine's total time the target saves: 1 − Σtarget / Σengine (paper's "Saved")."""
    return float(1.0 - np.sum(target_s) / np.sum(engine_s))


def _saved_stat(target_s: np.ndarray, engine_s: np.ndarray, axis: int = -1) -> np.ndarray:
    """Vectorized statistic for scipy.stats.bootstrap (resamples along `axis`)."""
    return 1.0 - np.sum(target_s, axis=axis) / np.sum(engine_s, axis=axis)


def bootstrap_saved(target_s: np.ndarray, engine_s: np.ndarray, cfg: CompareConfig) -> tuple[float, float]:
    """CI of the saved share, resampling sessions in pairs; NaN with fewer than 2 sessions."""
    t, e = np.asarray(target_s, float), np.asarray(engine_s, float)
    if len(t) < 2:
        return float("nan"), float("nan")
    point = saved_share(t, e)
    if np.allclose(t / e, t[0] / e[0], rtol=0, atol=1e-12):  # every resample gives the same share
        return point, point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((t, e), _saved_stat, paired=True, vectorized=True, n_resamples=cfg.n_resamples,
                              confidence_level=cfg.confidence, method=cfg.method, rng=np.random.default_rng(cfg.seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if np.isnan(low) or np.isnan(high):  # BCa undefined (e.g. 2 sessions): fall back to percentile
        low, high = np.percentile(res.bootstrap_distribution, [50 * (1 - cfg.confidence), 50 * (1 + cfg.confidence)])
    return float(low), float(high)


def workload_of(session: str) -> str:
    """The source prefix of a session id (`tau2/airline/3` → `tau2`), empty when it has none."""
    return session.split("/", 1)[0] if "/" in session else ""


def as_bool(s: pd.Series) -> pd.Series:
    """Booleans from a CSV column that may hold True/False, 'True'/'False' or 1/0."""
    return s.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))


def complete_sessions(sessions: pd.DataFrame, engines: list[str],
                      clean_only: bool = False) -> tuple[list[str], list[str]]:
    """Split session ids into those every engine completed (a row, session_ok, a total; with `clean_only` also not
    flagged `foreign load`) and the rest."""
    df = sessions[sessions["engine"].isin(engines)]
    ok = pd.to_numeric(df["total_request_s"], errors="coerce").notna()
    if "session_ok" in df:
        ok &= as_bool(df["session_ok"])
    if clean_only and "load_flag" in df:
        ok &= df["load_flag"].astype(str) != FOREIGN
    done = df[ok].groupby("session")["engine"].nunique()
    every = set(done[done == len(engines)].index)
    all_ids = sorted(set(sessions["session"].astype(str)))
    return [s for s in all_ids if s in every], [s for s in all_ids if s not in every]


def _medians(sessions: pd.DataFrame, requests: pd.DataFrame | None, engine: str, kept: list[str]) -> dict:
    """Median TTFT per kind and TPOT of one engine over its requests (or per-session medians without them)."""
    out: dict[str, object] = {}
    if requests is not None:
        r = requests[(requests["engine"] == engine) & requests["session"].isin(kept) & as_bool(requests["ok"])]
        for k in KINDS:
            v = pd.to_numeric(r.loc[r["kind"] == k, "ttft_s"], errors="coerce").dropna()
            out[f"ttft_{k}_s"], out[f"n_{k}"] = (float(v.median()) if len(v) else float("nan")), len(v)
        tpot = pd.to_numeric(r["tpot_s"], errors="coerce").dropna()
        out["tpot_ms"] = float(tpot.median()) * 1e3 if len(tpot) else float("nan")
        out["medians_over"] = "requests"
        return out
    s = sessions[(sessions["engine"] == engine) & sessions["session"].isin(kept)]
    for k in KINDS:
        col = f"ttft_median_{k}_s"
        v = pd.to_numeric(s[col], errors="coerce").dropna() if col in s else pd.Series(dtype=float)
        out[f"ttft_{k}_s"], out[f"n_{k}"] = (float(v.median()) if len(v) else float("nan")), len(v)
    tpot = pd.to_numeric(s["tpot_median_s"], errors="coerce").dropna() if "tpot_median_s" in s else pd.Series(dtype=float)
    out["tpot_ms"] = float(tpot.median()) * 1e3 if len(tpot) else float("nan")
    out["medians_over"] = "session medians"
    return out


def load_counts(sessions: pd.DataFrame, engine: str, kept: list[str]) -> dict:
    """How many of an engine's kept sessions were measured under foreign load, and of how many it is unknown (a
    summary without the `load_flag` column: made before the replay sampled the load); the threshold they used."""
    s = sessions[(sessions["engine"] == engine) & sessions["session"].isin(kept)]
    flags = s["load_flag"].fillna(UNKNOWN).astype(str) if "load_flag" in s else pd.Series(UNKNOWN, index=s.index)
    thresholds = pd.to_numeric(s["load_threshold"], errors="coerce").dropna() if "load_threshold" in s else []
    return {"foreign_load_sessions": int((flags == FOREIGN).sum()), "load_unknown_sessions": int((flags == UNKNOWN).sum()),
            "load_threshold": float(thresholds.max()) if len(thresholds) else float("nan")}


def _machine_label(sessions: pd.DataFrame, cfg: CompareConfig) -> str:
    """The machine label: the config's, else the CSV's distinct labels joined, else `this machine`."""
    if cfg.machine:
        return cfg.machine
    labels = sorted(sessions["machine"].dropna().astype(str).unique()) if "machine" in sessions else []
    return ", ".join(labels) or "this machine"


def compare_engines(sessions: pd.DataFrame, requests: pd.DataFrame | None = None,
                    cfg: CompareConfig = CompareConfig()) -> Comparison:
    """Compare engines with the target on sessions all completed, per workload (id prefix) and over `all`."""
    missing = SESSION_COLUMNS - set(sessions.columns)
    if missing:
        raise ValueError(f"per-session CSV lacks columns {sorted(missing)} (expected `ostinato replay summarize` output)")
    sessions = sessions.assign(engine=sessions["engine"].astype(str), session=sessions["session"].astype(str))
    dup = sessions[sessions.duplicated(["engine", "session"], keep=False)]
    if len(dup):
        raise ValueError(f"{len(dup)} rows repeat an (engine, session) pair, e.g. {tuple(dup.iloc[0][['engine', 'session']])}")
    present = sorted(set(sessions["engine"]))
    if cfg.target not in present:
        raise ValueError(f"target engine {cfg.target!r} not in the CSV (engines: {present})")
    others = list(cfg.engines) or [e for e in present if e != cfg.target]
    absent = [e for e in others if e not in present]
    if absent:
        raise ValueError(f"engines {absent} not in the CSV (engines: {present})")
    if not others:
        raise ValueError(f"nothing to compare: the CSV holds only the target engine {cfg.target!r}")
    if requests is not None:
        requests = requests.assign(engine=requests["engine"].astype(str), session=requests["session"].astype(str))
    engines = [cfg.target, *others]
    kept, dropped = complete_sessions(sessions, engines, cfg.clean_only)
    if not kept:
        raise ValueError(f"no session was completed by every engine of {engines}"
                         + (" without foreign load" if cfg.clean_only else ""))
    machine = _machine_label(sessions, cfg)
    groups = sorted({workload_of(s) for s in sessions["session"]})
    names = groups + [ALL] if len(groups) > 1 else [groups[0] or ALL]
    rows = []
    for name in names:
        ids = set(sessions["session"]) if name == ALL else {s for s in sessions["session"] if workload_of(s) == name}
        group_kept = [s for s in kept if s in ids]
        n_dropped = sum(1 for s in dropped if s in ids)
        rows += _group_rows(sessions, requests, cfg, engines, group_kept, n_dropped, name, machine)
    table = pd.DataFrame(rows).reindex(columns=COMPARE_COLUMNS)
    table["won"] = table["won"].astype("Int64")
    return Comparison(table=table, kept=kept, dropped=dropped, machine=machine, clean_only=cfg.clean_only)


def _group_rows(sessions: pd.DataFrame, requests: pd.DataFrame | None, cfg: CompareConfig, engines: list[str],
                kept: list[str], n_dropped: int, workload: str, machine: str) -> list[dict[str, object]]:
    """One row per engine for one workload's kept sessions (NaN measures when none was kept)."""
    wide = sessions[sessions["session"].isin(kept)].set_index(["engine", "session"])
    num = lambda col, e: (pd.to_numeric(wide.loc[e, col].reindex(kept), errors="coerce").to_numpy(float)  # noqa: E731
                          if kept and col in wide else np.full(len(kept), np.nan))
    server = {e: num("server_prefill_s", e) + num("server_decode_s", e) for e in engines}
    t_total, t_server = num("total_request_s", cfg.target), server[cfg.target]
    rows = []
    for e in engines:
        total = num("total_request_s", e)
        row: dict[str, object] = {
            "workload": workload, "engine": e, "target": cfg.target, "series": series_label("measured", machine),
            "sessions": len(kept), "dropped": n_dropped, "total_s": float(total.sum()) if kept else float("nan"),
            "server_total_s": float(np.sum(server[e])) if kept else float("nan"),
            "client_server_ratio": float(total.sum() / np.sum(server[e])) if np.sum(server[e]) > 0 else float("nan"),
            "ci_method": cfg.method, "confidence": cfg.confidence, "n_resamples": cfg.n_resamples, "seed": cfg.seed,
            **load_counts(sessions, e, kept),
        }
        if e != cfg.target and kept:
            low, high = bootstrap_saved(t_total, total, cfg)
            saved, server_saved = saved_share(t_total, total), saved_share(t_server, server[e])
            row.update(saved_pct=100 * saved, saved_ci_low_pct=100 * low, saved_ci_high_pct=100 * high,
                       won=int(np.sum(t_total < total)), server_saved_pct=100 * server_saved,
                       saved_gap_pp=100 * (saved - server_saved))
        row.update(_medians(sessions, requests, e, kept))
        rows.append(row)
    return rows


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3's layout for people, one row per workload and engine: `saved [CI]` as `58.0% [57.6–58.4]`, `won` as `13/13`."""
    def saved(r: pd.Series) -> str:
        if pd.isna(r["saved_pct"]):
            return "–"
        ci = "" if pd.isna(r["saved_ci_low_pct"]) else f" [{r['saved_ci_low_pct']:.1f}–{r['saved_ci_high_pct']:.1f}]"
        return f"{r['saved_pct']:.1f}%{ci}"

    out = pd.DataFrame({
        "workload": table["workload"], "engine": table["engine"], "series": table["series"], "total (s)": table["total_s"].round(3),
        f"saved by {table['target'].iloc[0]} [{100 * table['confidence'].iloc[0]:.0f}% CI]": table.apply(saved, axis=1),
        "won": [("–" if pd.isna(w) else f"{int(w)}/{n}") for w, n in zip(table["won"], table["sessions"])],
        **{f"TTFT {k} (s)": table[f"ttft_{k}_s"].round(3) for k in KINDS},
        "TPOT (ms)": table["tpot_ms"].round(2), "client/server": table["client_server_ratio"].round(4),
        "server saved gap (pp)": table["saved_gap_pp"].round(2),
        "foreign load": [foreign_load_cell(f, u, n) for f, u, n in
                         zip(table["foreign_load_sessions"], table["load_unknown_sessions"], table["sessions"])],
    })
    return out


def foreign_load_cell(flagged: float, unknown: float, sessions: float) -> str:
    """`2/5` sessions measured under foreign load, `unknown` when none was sampled, `1/5 (2 unknown)` in between."""
    if pd.isna(flagged) or pd.isna(sessions):
        return "–"
    flagged, unknown, sessions = int(flagged), int(unknown or 0), int(sessions)
    if sessions and unknown == sessions:
        return "unknown"
    return f"{flagged}/{sessions}" + (f" ({unknown} unknown)" if unknown else "")


def load_note(table: pd.DataFrame) -> str:
    """The comparison's foreign-load sentence: how many engine sessions were flagged or unknown, at which threshold."""
    threshold = table["load_threshold"].dropna()
    rule = (f"other processes above {100 * threshold.max():g}% of the machine's CPU time" if len(threshold)
            else "no load samples")
    every = table[table["workload"] == table["workload"].iloc[-1]]  # the last workload holds all sessions
    n_flag, n_unknown = int(every["foreign_load_sessions"].sum()), int(every["load_unknown_sessions"].sum())
    n = int(every["sessions"].sum())
    note = f"Foreign load ({rule}): {n_flag} of {n} engine sessions flagged"
    if n_unknown:
        note += f", {n_unknown} unknown (no load samples: results made before the replay recorded them)"
    if n_flag:
        note += "; a flagged session's times include waiting for the other work, not only the engine's"
    return note + ".\n"


def save_comparison(comp: Comparison, stem: str | Path) -> list[Path]:
    """Write `<stem>.csv` (all columns) and `<stem>.md` (display layout plus a note) atomically."""
    stem = Path(stem)
    if stem.suffix in (".csv", ".md"):
        stem = stem.with_suffix("")
    csv, md = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".md")
    with atomic_open(csv) as f:
        comp.table.to_csv(f, index=False)
    t = comp.table.iloc[0]
    why = "completed by every engine" + (" and under no foreign load in any" if comp.clean_only else "")
    note = (f"\n{len(comp.kept)} sessions {why} ({len(comp.dropped)} dropped); saved = 1 − Σ{t['target']}"
            f"/Σengine over sessions; {100 * t['confidence']:.0f}% CI: {t['ci_method']} bootstrap over sessions (paired, "
            f"{t['n_resamples']} resamples, seed {t['seed']}); medians over {t['medians_over']}.\n"
            + load_note(comp.table))
    with atomic_open(md) as f:
        f.write(to_markdown(display_table(comp.table), floatfmt=".4g") + note)
    return [csv, md]
