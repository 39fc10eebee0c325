"""Median TTFT of the turns after tool outputs by their new tokens, the paper's Figure 7a, from measured replays.

Figure 7a groups the held-out tool-output turns by new tokens and compares each engine's median TTFT with
Ostinato's: below 512 new tokens the split path computes cold routes on the CPU beside the resident ones, from 512
the upload path takes over. The same bins over a replay's requests say whether that holds on the machine measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ostinato.atomic import atomic_open
from ostinato.replay.metrics import as_bool
from ostinato.tables import to_markdown

# Figure 7a's bins of new tokens: (lowest, highest + 1, label)
NEW_TOKEN_BINS: list[tuple[int, int, str]] = [
    (0, 128, "<128"), (128, 256, "128-255"), (256, 512, "256-511"), (512, 1024, "512-1023"), (1024, 10**9, ">=1024")]
# the paper's one range for the three bins below 512 new tokens, reported beside them
BELOW_512 = (0, 512, "<512")
SIZE_COLUMNS = ["kind", "new_tokens", "new_low", "new_high", "engine", "target", "sessions", "turns", "ttft_median_s",
                "target_ttft_median_s", "change_pct"]


def ttft_by_new_tokens(requests: pd.DataFrame, sessions: list[str], target: str = "ostinato",
                       engines: list[str] | None = None, kind: str = "tool") -> pd.DataFrame:
    """One row per bin and engine: its median TTFT over the answered turns of `kind` in `sessions` (those every
    compared engine completed) and the target's change against it, (target / engine − 1) · 100 (negative: the
    target is faster). The target's own rows carry no change; a bin without turns has no median."""
    missing = {"engine", "session", "kind", "n_new", "ttft_s"} - set(requests.columns)
    if missing:
        raise ValueError(f"per-request CSV lacks columns {sorted(missing)} (expected `ostinato replay summarize "
                         "--requests-out` output)")
    present = sorted(set(requests["engine"].astype(str)))
    if target not in present:
        raise ValueError(f"target engine {target!r} not in the per-request CSV (engines: {present})")
    r = requests[requests["session"].astype(str).isin(sessions) & (requests["kind"] == kind)]
    if "ok" in r:
        r = r[as_bool(r["ok"])]
    r = r.assign(engine=r["engine"].astype(str), n_new=pd.to_numeric(r["n_new"], errors="coerce"),
                 ttft_s=pd.to_numeric(r["ttft_s"], errors="coerce")).dropna(subset=["n_new", "ttft_s"])
    order = [target, *[e for e in (engines or present) if e != target]]
    rows = []
    for lo, hi, label in [*NEW_TOKEN_BINS, BELOW_512]:
        b = r[(r["n_new"] >= lo) & (r["n_new"] < hi)]
        med = b.groupby("engine")["ttft_s"].median()
        count = b.groupby("engine").size()
        t = float(med.get(target, np.nan))
        for e in order:
            m = float(med.get(e, np.nan))
            rows.append({"kind": kind, "new_tokens": label, "new_low": lo, "new_high": hi - 1 if hi < 10**9 else np.nan,
                         "engine": e, "target": target, "sessions": len(sessions), "turns": int(count.get(e, 0)),
                         "ttft_median_s": m, "target_ttft_median_s": t,
                         "change_pct": np.nan if e == target or not m > 0 else 100 * (t / m - 1)})
    return pd.DataFrame(rows, columns=SIZE_COLUMNS)


def save_by_new_tokens(table: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Write `<stem>.csv` (all columns) and `<stem>.md` (median TTFT per bin, one column per engine, the target's
    change against each beside) atomically."""
    stem = Path(stem)
    csv, md = stem.with_name(stem.name + ".csv"), stem.with_name(stem.name + ".md")
    with atomic_open(csv) as f:
        table.to_csv(f, index=False)
    target = str(table["target"].iloc[0])
    labels = list(dict.fromkeys(table["new_tokens"]))
    engines = list(dict.fromkeys(table["engine"]))
    wide = table.set_index(["new_tokens", "engine"])
    view = pd.DataFrame({"new tokens": labels,
                         "turns": [int(wide.loc[(b, target), "turns"]) for b in labels]})
    for e in engines:
        view[f"{e} TTFT (s)"] = [wide.loc[(b, e), "ttft_median_s"] for b in labels]
    for e in engines:
        if e != target:
            view[f"{target} vs {e}"] = [f"{c:+.1f}%" if pd.notna(c) else "–" for c in
                                        (wide.loc[(b, e), "change_pct"] for b in labels)]
    note = (f"\nMedian TTFT of the answered turns after a tool output, by their new tokens (the paper's Figure 7a), on "
            f"the {int(table['sessions'].iloc[0])} sessions every engine completed; `{target} vs X` = {target}'s median "
            f"over X's − 1.\n")
    with atomic_open(md) as f:
        f.write(to_markdown(view, floatfmt=".3f") + note)
    return [csv, md]
