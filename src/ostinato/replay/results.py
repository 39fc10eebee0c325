"""Loading replay results into tables and summarizing them per session (and per request kind)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ostinato.replay.store import SESSIONS_DIR, read_records
from ostinato.sessions.model import KINDS

# Columns of the per-request table, in order (server timings flattened as server_<name>).
REQUEST_COLUMNS = [
    "engine", "machine", "session", "turn", "kind", "ok", "error", "n_new", "n_prompt", "n_forced",
    "n_output", "n_streamed", "n_chunks", "forced_match", "wall_send", "ttft_s", "latency_s", "tpot_s",
    "server_cache_n", "server_prompt_n", "server_prompt_ms", "server_predicted_n", "server_predicted_ms",
    "final_stop_type", "server_start",
]


def find_engine_dirs(paths: list[Path]) -> list[Path]:
    """Return engine result directories (those holding `sessions/`) under or at the given paths."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"--in {p} is not a directory (expected a replay --out directory)")
        if (p / SESSIONS_DIR).is_dir():
            found.append(p)
        else:
            found.extend(sorted(d.parent for d in p.glob(f"*/{SESSIONS_DIR}") if d.is_dir()))
    if not found:
        raise FileNotFoundError(f"no replay results (<engine>/{SESSIONS_DIR}/*.jsonl) under {', '.join(map(str, paths))}")
    return found


def load_requests(paths: list[Path]) -> pd.DataFrame:
    """Return one row per request from replay output directories (columns REQUEST_COLUMNS)."""
    rows = []
    for d in find_engine_dirs(paths):
        for f in sorted((d / SESSIONS_DIR).glob("*.jsonl")):
            for rec in read_records(f):
                row = {k: v for k, v in rec.items() if k not in ("server", "itl_s", "streamed_token_ids")}
                for k, v in (rec.get("server") or {}).items():
                    row[f"server_{k}"] = v
                rows.append(row)
    df = pd.DataFrame(rows)
    for col in REQUEST_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    extra = [c for c in df.columns if c not in REQUEST_COLUMNS]
    return df[REQUEST_COLUMNS + sorted(extra)]


def tag_run(frame: pd.DataFrame, run: int) -> pd.DataFrame:
    """One repeated run's rows with their session ids suffixed `#run<run>`, so each run's sessions count separately
    (`replay summarize --runs` and the figures' shipped reference runs share this convention)."""
    return frame.assign(session=frame["session"].astype(str) + f"#run{run}")


def load_runs(paths: list[Path], runs: int) -> pd.DataFrame:
    """Requests of `runs` repeated runs given run by run (equal numbers of directories each): run i's session ids
    are suffixed `#run<i>`, as the figures tag shipped repeated runs, so each run's sessions count separately."""
    if runs < 1:
        raise ValueError(f"--runs must be at least 1, got {runs}")
    if runs == 1:
        return load_requests(paths)
    if len(paths) % runs:
        raise ValueError(f"--runs {runs}: the {len(paths)} --in directories do not split into {runs} runs of "
                         "equal size (give each run's directories in turn, the same number per run)")
    n = len(paths) // runs
    return pd.concat([tag_run(load_requests(paths[i * n:(i + 1) * n]), i + 1) for i in range(runs)],
                     ignore_index=True)


def _median(s: pd.Series) -> float:
    """Median of the non-missing values (NaN when none)."""
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else float("nan")


def summarize_sessions(requests: pd.DataFrame) -> pd.DataFrame:
    """Return per-(engine, session) totals: request time, TTFT by kind, TPOT, server prefill/decode.

    `client_server_ratio` = total client latency / (server prefill + decode time); near 1 when the
    client and the server agree (HTTP and streaming overhead small).
    """
    rows = []
    for (engine, session), g in requests.groupby(["engine", "session"], sort=True):
        ok = g[g["ok"] == True]  # noqa: E712  (column may hold objects)
        prefill_s = pd.to_numeric(ok["server_prompt_ms"], errors="coerce").sum() / 1e3
        decode_s = pd.to_numeric(ok["server_predicted_ms"], errors="coerce").sum() / 1e3
        total_s = pd.to_numeric(ok["latency_s"], errors="coerce").sum()
        errors = [e for e in g["error"].fillna("") if e]
        row = {
            "engine": engine,
            "machine": g["machine"].dropna().iloc[0] if g["machine"].notna().any() else "",
            "session": session,
            "n_requests": len(g),
            "n_ok": len(ok),
            "session_ok": len(ok) == len(g),
            "error": errors[0] if errors else "",
            "n_new_total": int(pd.to_numeric(g["n_new"], errors="coerce").sum()),
            "n_output_total": int(pd.to_numeric(ok["n_output"], errors="coerce").sum()),
            "total_request_s": total_s,
            "ttft_median_s": _median(ok["ttft_s"]),
            **{f"ttft_median_{k}_s": _median(ok.loc[ok["kind"] == k, "ttft_s"]) for k in KINDS},
            "tpot_median_s": _median(ok["tpot_s"]),
            "server_prefill_s": prefill_s,
            "server_decode_s": decode_s,
            "server_prompt_n_total": int(pd.to_numeric(ok["server_prompt_n"], errors="coerce").fillna(0).sum()),
            "client_server_ratio": total_s / (prefill_s + decode_s) if prefill_s + decode_s > 0 else float("nan"),
        }
        rows.append(row)
    return pd.DataFrame(rows)
