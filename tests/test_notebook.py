"""The replay summary notebook runs under papermill on a small CSV and writes its tables and figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "replay_summary.ipynb"

pytest.importorskip("papermill")


def small_summary(path: Path, one_failure: bool = True) -> Path:
    """Write a per-session CSV shaped like `ostinato replay summarize` output; with `one_failure`, as written before
    the replay sampled the load (no `load_flag`), else the stock engine's replay of tau2/a/001 under foreign load."""
    rows = []
    for engine, scale in (("stock", 1.0), ("ostinato", 0.6)):
        for i, session in enumerate(["tau2/a/000", "tau2/a/001", "swe-mini/x"]):
            rows.append({
                "engine": engine, "machine": "cpu-2c", "session": session, "n_requests": 3 + i, "n_ok": 3 + i,
                "session_ok": not (one_failure and engine == "ostinato" and i == 2), "error": "",
                "total_request_s": scale * (1 + i), "ttft_median_s": scale * 0.2, "ttft_median_first_s": 0.3,
                "ttft_median_tool_s": 0.1, "ttft_median_user_s": float("nan"), "tpot_median_s": scale * 0.01,
                "server_prefill_s": 0.5, "server_decode_s": 0.4, "client_server_ratio": 1.02,
                **({} if one_failure else {"load_flag": "foreign load" if (engine, i) == ("stock", 1) else "clean",
                                           "load_threshold": 0.1}),
            })
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def small_requests(path: Path) -> Path:
    """Per-request rows for `small_summary`'s sessions: a first turn, and tool-output turns of 100 and 700 new tokens
    that Ostinato answers in 0.6 of stock's time."""
    rows = []
    for engine, scale in (("stock", 1.0), ("ostinato", 0.6)):
        for session in ["tau2/a/000", "tau2/a/001", "swe-mini/x"]:
            for turn, (kind, n_new) in enumerate([("first", 2000), ("tool", 100), ("tool", 700)]):
                rows.append({"engine": engine, "session": session, "turn": turn, "kind": kind, "n_new": n_new,
                             "ok": True, "ttft_s": scale * n_new / 1000, "tpot_s": scale * 0.01})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_jupytext_twin_in_sync():
    py = REPO / "notebooks" / "replay_summary.py"
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    text = py.read_text()
    assert all(src in text for src in code), "run `jupytext --sync notebooks/replay_summary.ipynb`"


@pytest.mark.slow  # papermill starts a kernel
@pytest.mark.parametrize("one_failure", [True, False])
def test_notebook_runs_under_papermill(tmp_path: Path, one_failure: bool):
    csv = small_summary(tmp_path / "summary.csv", one_failure)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "summary_csv": str(csv), "figures_dir": str(tmp_path / "figures"), "tables_dir": str(tmp_path / "tables"),
        # the per-request CSV, as the pipeline passes it, in one of the two runs
        **({} if one_failure else {"requests_csv": str(small_requests(tmp_path / "requests.csv"))}),
    }))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(
        [sys.executable, "-m", "papermill", str(NOTEBOOK), str(tmp_path / "out.ipynb"), "-f", str(params),
         "--cwd", str(tmp_path), "-k", "python3"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("figures/replay_summary.pdf", "figures/replay_summary.png",
                 "tables/replay_summary.csv", "tables/replay_summary.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = pd.read_csv(tmp_path / "tables" / "replay_summary.csv")
    assert len(table) == 3 and (table["speedup_vs_stock"].dropna() - 1 / 0.6).abs().max() < 1e-9
    if one_failure:
        assert table["speedup_vs_stock"].isna().sum() == 1  # the session that one engine failed
        assert table.loc[table["session"] == "swe-mini/x", "failed_engines"].item() == "ostinato"
    else:
        assert table["speedup_vs_stock"].notna().all() and table["failed_engines"].isna().all()
    flags = table.set_index("session")["load_flag"]
    if one_failure:  # no load samples: unknown, never clean
        assert (flags == "unknown").all()
    else:
        assert flags.to_dict() == {"swe-mini/x": "clean", "tau2/a/000": "clean", "tau2/a/001": "foreign load"}
        assert table.set_index("session").loc["tau2/a/001", "stock_load"] == "foreign load"
    md = (tmp_path / "tables" / "replay_summary.md").read_text()
    assert md.startswith("| session | label |") and "measured" not in md
    assert "ostinato, measured (cpu-2c)" in (tmp_path / "out.ipynb").read_text()
    compare = pd.read_csv(tmp_path / "tables" / "replay_compare.csv")
    assert list(compare["workload"]) == ["swe-mini", "swe-mini", "tau2", "tau2", "all", "all"]
    assert list(compare["engine"]) == ["ostinato", "stock"] * 3 and (compare["series"] == "measured (cpu-2c)").all()
    every = compare[compare["workload"] == "all"]
    assert (every["sessions"] == (2 if one_failure else 3)).all() and (every["dropped"] == int(one_failure)).all()
    if one_failure:
        assert (every["load_unknown_sessions"] == 2).all() and (every["foreign_load_sessions"] == 0).all()
    else:
        assert list(every["foreign_load_sessions"]) == [0, 1] and (every["load_unknown_sessions"] == 0).all()
    assert "Foreign load" in (tmp_path / "tables" / "replay_compare.md").read_text()
    saved = every.set_index("engine").loc["stock"]
    assert saved["saved_pct"] == pytest.approx(40.0) and saved["won"] == saved["sessions"]
    assert saved["saved_ci_low_pct"] == pytest.approx(40.0) and saved["saved_ci_high_pct"] == pytest.approx(40.0)
    compare_md = (tmp_path / "tables" / "replay_compare.md").read_text()
    assert "measured (cpu-2c)" in compare_md and "40.0% [40.0–40.0]" in compare_md
    # Figure 7a's bins from the per-request CSV only: Ostinato 40% shorter in both bins with turns
    sizes = tmp_path / "tables" / "replay_by_new_tokens.csv"
    assert sizes.exists() != one_failure
    if not one_failure:
        by = pd.read_csv(sizes).set_index(["new_tokens", "engine"])["change_pct"]
        assert by[("<128", "stock")] == pytest.approx(-40.0) and by[("512-1023", "stock")] == pytest.approx(-40.0)
        assert by[("<512", "stock")] == pytest.approx(-40.0) and pd.isna(by[("128-255", "stock")])


def test_series_labels_and_markdown():
    from ostinato.figures import engine_label, series_label, to_markdown

    assert series_label("paper") == "paper"
    assert series_label("measured", "h200") == "measured (h200)"
    assert engine_label("stock", "simulated", "paper-testbed") == "stock, simulated (paper-testbed)"
    with pytest.raises(ValueError):
        series_label("measured")
    md = to_markdown(pd.DataFrame({"a": ["x|y"], "b": [1.23456]}))
    assert md.splitlines()[1] == "|---|---:|" and "x\\|y" in md and "1.23" in md
