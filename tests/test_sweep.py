"""Benchmark helpers: cold routes per placement and the ratio summary (no engine needed)."""

from __future__ import annotations

import numpy as np
import pytest

from ostinato.sweep.cold import cold_per_token_layer, whole_layer_hot
from ostinato.sweep.prefill import BenchPlan, BenchRow, summarize
from ostinato.routing.trace import RoutingTrace, TraceShape


def _trace() -> RoutingTrace:
    shape = TraceShape(3, 4, 2)
    ids = np.full((2, 3, 2), shape.none_id, dtype=shape.id_dtype)
    ids[0, 1] = [0, 1]
    ids[1, 1] = [2, 3]
    ids[0, 2] = [0, 3]
    ids[1, 2] = [1, 2]
    return RoutingTrace(shape, ids)


def test_cold_routes_by_hand():
    t = _trace()  # MoE layers 1 and 2
    hot = np.zeros((3, 4), dtype=bool)
    hot[1, [0, 1]] = True  # layer 1: position 0 all hot, position 1 both cold
    hot[2, [0]] = True     # layer 2: position 0 one cold, position 1 two cold
    assert cold_per_token_layer(t, hot, 0, 2) == pytest.approx((0 + 2 + 1 + 2) / 4)
    assert cold_per_token_layer(t, hot, 0, 1) == pytest.approx((0 + 1) / 2)
    assert cold_per_token_layer(t, whole_layer_hot(3, 4, [2]), 0, 2) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no positions"):
        cold_per_token_layer(t, hot, 2, 2)


def test_plan_tokens_are_the_same_for_every_engine():
    p = BenchPlan(prefix=10, sizes=(3, 5), n_decode=4, reps=2, vocab_hi=200, seed=3)
    assert p.tokens() == p.tokens()
    prefix, new, forced = p.tokens()
    assert (len(prefix), len(new[3]), len(new[5]), len(forced)) == (10, 3, 5, 4)
    assert new[3][0] != new[5][0]  # only the prefix is shared between sizes
    assert p.n_pos == 10 + 5 + 4 + 1


def _rows(engine: str, scale: float) -> list[BenchRow]:
    rows = []
    for rep in range(4):
        jitter = 1 + 0.01 * rep
        rows.append(BenchRow(engine, rep, "prefill", 128, 1, scale * jitter, scale * jitter, None, 128, 1.0, None))
        rows.append(BenchRow(engine, rep, "decode", 2048, 16, 0.1, 1.0, scale * 0.01 * jitter, 1, 1.0, 10.0))
    return rows


def test_summary_ratio_and_interval():
    summ = summarize(_rows("base", 2.0) + _rows("fast", 1.0), "base", n_resamples=200)
    fast = {(r["kind"], r["n_new"]): r for r in summ if r["engine"] == "fast"}
    assert fast[("prefill", 128)]["ratio"] == pytest.approx(0.5)
    assert fast[("decode", "")]["ratio"] == pytest.approx(0.5)
    lo, hi = fast[("prefill", 128)]["ratio_ci_low"], fast[("prefill", 128)]["ratio_ci_high"]
    assert lo <= 0.5 + 1e-9 and hi >= 0.5 - 1e-9
    assert all("ratio" not in r for r in summ if r["engine"] == "base")


@pytest.mark.slow  # papermill starts a kernel
def test_fig7b_notebook_runs_under_papermill(tmp_path):
    """Figure 7b on a measured summary (the committed H200 run) beside the paper: ratios to each series' baseline."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd
    import yaml

    pytest.importorskip("papermill")
    repo = Path(__file__).resolve().parents[1]
    ref = repo / "data/reference/h200/residency/bench/summary.json"
    mine = json.loads(ref.read_text())
    mine["rows"] = [r for r in mine["rows"] if r["engine"] != "llama.cpp-cpu-experts"]  # a two-engine run
    (tmp_path / "summary.json").write_text(json.dumps(mine))
    params = {"summary_json": str(tmp_path / "summary.json"), "machine": "ci", "reference_json": str(ref),
              "reference_machine": "h200",
              "figure7_csv": str(repo / "data/paper/figure7.csv"), "figures_dir": str(tmp_path / "figures"),
              "tables_dir": str(tmp_path / "tables")}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "papermill", str(repo / "notebooks/fig7b.ipynb"), str(tmp_path / "o.ipynb"),
                          "-f", str(tmp_path / "p.yaml"), "-k", "python3"], capture_output=True, text=True, timeout=300,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    t = pd.read_csv(tmp_path / "tables/fig7b.csv")
    # the shipped sweep is labelled as a reference, so a run on that machine stays a line of its own
    assert set(t["series"]) == {"measured (ci)", "measured (h200, reference)", "paper"}
    paper = t[(t["series"] == "paper") & (t["engine"] == "ostinato")].set_index("n_new")["ratio"]
    assert paper[128] == pytest.approx(0.92 / 1.63) and paper[1024] == pytest.approx(3.33 / 5.12)
    ci = t[(t["series"] == "measured (ci)") & (t["engine"] == "ostinato")].set_index("n_new")
    row = next(r for r in mine["rows"] if r["engine"] == "ostinato" and r["n_new"] == 256)
    assert ci.loc[256, "ratio"] == pytest.approx(row["ratio"]) and set(t[t["series"] == "measured (ci)"]["engine"]) == {
        "ostinato", "llama.cpp-layers"}
    assert (tmp_path / "figures/fig7b.png").stat().st_size > 0


def test_fig7b_notebook_twin_in_sync():
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    nb = json.loads((repo / "notebooks/fig7b.ipynb").read_text())
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]) == 1
    text = (repo / "notebooks/fig7b.py").read_text()
    assert all("".join(c["source"]) in text for c in nb["cells"] if c["cell_type"] == "code")
