"""Loading replay results into tables and summarizing them per session (and per request kind)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ostinato.inputs import load_json
from ostinato.replay.load import FOREIGN_LOAD_THRESHOLD, foreign_share, load_flag
from ostinato.replay.store import SESSIONS_DIR, read_records
from ostinato.sessions.model import KINDS

# Columns of the per-request table, in order (server timings flattened as server_<name>).
REQUEST_COLUMNS = [
    "engine", "machine", "session", "turn", "kind", "ok", "error", "n_new", "n_prompt", "n_forced",
    "n_output", "n_streamed", "n_chunks", "forced_match", "wall_send", "ttft_s", "latency_s", "tpot_s",
    "server_cache_n", "server_prompt_n", "server_prompt_ms", "server_predicted_n", "server_predicted_ms",
    "final_stop_type", "server_start",
    # what else loaded the machine during the request (ostinato.replay.load; empty in results made before it was
    # recorded): wall time, foreign and own CPU seconds, logical CPUs, the larger 1-minute load average
    "load_wall_s", "load_foreign_cpu_s", "load_own_cpu_s", "load_cores", "load_loadavg_1m",
    # what the engine ran on, from the engine directory's machine.json and runs.json: the machine's GPUs and the
    # backend of the engine build (`cpu`, `cuda`; empty for an engine reached by URL or older results)
    "machine_gpus", "engine_backend",
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


def engine_setup(engine_dir: Path) -> dict:
    """What an engine directory says the replay ran on: `machine_gpus` (GPUs of machine.json) and `engine_backend`
    (the last run's, runs.json); None where a file or field is absent."""
    out: dict = {"machine_gpus": None, "engine_backend": None}
    machine = Path(engine_dir) / "machine.json"
    if machine.is_file():
        info = load_json(machine, "the replay's machine description")
        if isinstance(info, dict) and isinstance(info.get("gpus"), list):
            out["machine_gpus"] = len(info["gpus"])
    runs = Path(engine_dir) / "runs.json"
    if runs.is_file():
        history = load_json(runs, "the replay's run history (a JSON list)")
        backends = [r.get("engine_backend") for r in history if isinstance(r, dict)] if isinstance(history, list) else []
        out["engine_backend"] = next((b for b in reversed(backends) if b), None)
    return out


def load_requests(paths: list[Path]) -> pd.DataFrame:
    """Return one row per request from replay output directories (columns REQUEST_COLUMNS)."""
    rows = []
    for d in find_engine_dirs(paths):
        setup = engine_setup(d)
        for f in sorted((d / SESSIONS_DIR).glob("*.jsonl")):
            for rec in read_records(f):
                row = {k: v for k, v in rec.items() if k not in ("server", "itl_s", "streamed_token_ids", "load",
                                                                  "top_ids", "top_logprobs", "server_prior")}
                for k, v in (rec.get("server") or {}).items():
                    row[f"server_{k}"] = v
                if isinstance(rec.get("server_prior"), dict):  # how many sessions its server start served before
                    row["server_prior_sessions"] = rec["server_prior"].get("sessions")
                for k, v in (rec.get("load") or {}).items():
                    row[f"load_{k}"] = v
                rows.append({**setup, **row})
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


def _forced(ok: pd.DataFrame) -> dict:
    """Forced-token checks of a session's successful requests: how many were checked and how many returned exactly
    their recorded tokens (0 and 0 for an engine that generates its own outputs)."""
    checked = ok["forced_match"].dropna() if "forced_match" in ok else pd.Series(dtype=object)
    matched = checked.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))
    return {"n_forced_checked": int(len(checked)), "n_forced_match": int(matched.sum())}


def _median(s: pd.Series) -> float:
    """Median of the non-missing values (NaN when none)."""
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else float("nan")


def session_load(g: pd.DataFrame, threshold: float = FOREIGN_LOAD_THRESHOLD) -> dict:
    """The load columns of one session's requests: foreign CPU seconds and wall seconds summed over its sent
    requests, the foreign CPU share (foreign / (wall × cores)), the largest 1-minute load average, and the flag
    (`foreign load` above `threshold`, `clean` at or below, `unknown` when a sent request has no sample)."""
    sent = g[pd.to_numeric(g["wall_send"], errors="coerce").notna()] if "wall_send" in g else g.iloc[:0]
    wall = pd.to_numeric(sent["load_wall_s"], errors="coerce")
    measured = len(sent) > 0 and wall.notna().all()
    foreign = pd.to_numeric(sent["load_foreign_cpu_s"], errors="coerce").sum() if measured else float("nan")
    wall_s = float(wall.sum()) if measured else float("nan")
    cores = pd.to_numeric(sent["load_cores"], errors="coerce").max() if measured else float("nan")
    share = foreign_share(float(foreign), wall_s, float(cores)) if measured else float("nan")
    loadavg = pd.to_numeric(sent["load_loadavg_1m"], errors="coerce")
    return {"load_wall_s": wall_s, "foreign_cpu_s": float(foreign), "foreign_cpu_share": share,
            "loadavg_1m_max": float(loadavg.max()) if measured and loadavg.notna().any() else float("nan"),
            "load_flag": load_flag(share, threshold), "load_threshold": threshold}


def _first(g: pd.DataFrame, col: str) -> object:
    """The first non-missing value of a column (None when it has none)."""
    v = g[col].dropna() if col in g else pd.Series(dtype=object)
    return v.iloc[0] if len(v) else None


def summarize_sessions(requests: pd.DataFrame, threshold: float = FOREIGN_LOAD_THRESHOLD) -> pd.DataFrame:
    """Return per-(engine, session) totals: request time, TTFT by kind, TPOT, server prefill/decode, forced-token
    matches, what the engine ran on and the foreign load (`session_load`, flagged above `threshold`).

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
            **_forced(ok),
            "machine_gpus": _first(g, "machine_gpus"),
            "engine_backend": _first(g, "engine_backend"),
            **session_load(g, threshold),
        }
        rows.append(row)
    return pd.DataFrame(rows)
