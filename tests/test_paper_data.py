"""data/paper/*.csv: headers and types, and the numbers the paper derives from one another agree within rounding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

PAPER = Path(__file__).resolve().parents[1] / "data" / "paper"
ENGINES = {"ostinato", "buun", "ktransformers", "llama.cpp-layers", "llama.cpp-expert-cache", "ik_llama.cpp",
           "freetoken", "expert caches"}
TEXT, NUM, INT = "text", "num", "int"

# Per file: column -> type, in order. `num` columns may be empty; `int` columns hold whole numbers where set.
SCHEMAS: dict[str, dict[str, str]] = {
    "table1_models.csv": {"model": TEXT, "date": TEXT, "params_total_b": NUM, "params_active_b": NUM,
                          "moe_layers": INT, "experts_per_layer": INT, "top_k": INT, "shared_experts_per_layer": INT,
                          "format": TEXT, "expert_size_mb": NUM, "routed_experts_gib": NUM, "note": TEXT},
    "table2.csv": {"set": TEXT, "workload": TEXT, "split": TEXT, "sessions": INT, "turns": INT, "output_tokens": INT,
                   "median_new_tokens": INT, "note": TEXT},
    "table3_heldout.csv": {"workload": TEXT, "gpus": INT, "engine": TEXT, "engine_label": TEXT, "total_s": NUM,
                           "saved_pct": NUM, "saved_ci_low_pct": NUM, "saved_ci_high_pct": NUM, "won": INT,
                           "sessions": INT, "ttft_tool_s": NUM, "tpot_ms": NUM, "note": TEXT},
    "table4_qwen.csv": {"metric": TEXT, "unit": TEXT, "turns": INT, "buun": NUM, "ostinato": NUM, "change_pct": NUM,
                        "note": TEXT},
    "table6_configs.csv": {"engine": TEXT, "engine_label": TEXT, "gpus": INT, "threads": INT, "resident_experts": INT,
                           "gpu_experts_per_layer": INT, "cache_mib": INT, "threshold_tokens": INT, "description": TEXT},
    "table7_ttft_by_kind.csv": {"workload": TEXT, "kind": TEXT, "turns": INT, "engine": TEXT, "engine_label": TEXT,
                                "ttft_median_s": NUM},
    "table8_ablation.csv": {"panel": TEXT, "workload": TEXT, "turns": INT, "step": INT, "config": TEXT,
                            "resident_experts": INT, "total_s": NUM, "prefill_s": NUM, "decode_s": NUM,
                            "decode_step_ms": NUM, "note": TEXT},
    "figure1.csv": {"panel": TEXT, "metric": TEXT, "workload": TEXT, "gpus": INT, "engine": TEXT,
                    "reference_engine": TEXT, "speedup": NUM},
    "figure2.csv": {"workload": TEXT, "new_tokens": INT, "engine": TEXT, "engine_label": TEXT, "ttft_s": NUM,
                    "change_pct": NUM, "note": TEXT},
    "figure4.csv": {"metric": TEXT, "workload": TEXT, "engine": TEXT, "value": NUM, "note": TEXT},
    "figure6.csv": {"panel": TEXT, "metric": TEXT, "workload": TEXT, "engine": TEXT, "reference_engine": TEXT,
                    "kind": TEXT, "value": NUM, "value_low": NUM, "value_high": NUM, "unit": TEXT, "note": TEXT},
    "figure7.csv": {"panel": TEXT, "metric": TEXT, "engine": TEXT, "reference_engine": TEXT, "new_tokens": TEXT,
                    "turns": INT, "value": NUM, "value_low": NUM, "value_high": NUM, "unit": TEXT, "note": TEXT},
    "costmodel_constants.csv": {"name": TEXT, "model": TEXT, "value": NUM, "value_low": NUM, "value_high": NUM,
                                "unit": TEXT, "source": TEXT, "note": TEXT},
}


def load(name: str) -> pd.DataFrame:
    """Read a paper CSV with text columns as strings (empty = NaN)."""
    types = SCHEMAS[name]
    return pd.read_csv(PAPER / name, dtype={c: "string" for c, t in types.items() if t == TEXT})


def ratio_bounds(num: float, den: float, half: float) -> tuple[float, float]:
    """Range of num/den when both were rounded to +-half."""
    return (num - half) / (den + half), (num + half) / (den - half)


def test_every_file_is_listed_in_the_readme():
    readme = (PAPER / "README.md").read_text()
    assert "REFERENCE.md" in readme and "2611.11533v1" in readme
    assert {p.name for p in PAPER.glob("*.csv")} == set(SCHEMAS)
    assert all(f"`{name}`" in readme for name in SCHEMAS)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_headers_and_types(name: str):
    df = load(name)
    assert list(df.columns) == list(SCHEMAS[name]), name
    assert len(df) > 0
    for col, kind in SCHEMAS[name].items():
        if kind in (NUM, INT):
            assert pd.api.types.is_numeric_dtype(df[col]), f"{name}:{col} is not numeric"
        if kind == INT:
            v = df[col].dropna()
            assert (v == v.round()).all(), f"{name}:{col} is not whole"
    for col in ("engine", "reference_engine"):
        if col in df:
            assert set(df[col].dropna()) <= ENGINES, f"{name}:{col} has unknown engines"
    if "value_low" in df:  # a row holds one value or a range, and a range is ordered
        has_range = df["value_low"].notna() | df["value_high"].notna()
        assert (df["value"].notna() ^ has_range).all(), name
        assert (df.loc[has_range, "value_low"] <= df.loc[has_range, "value_high"]).all(), name


def test_table3_saved_matches_totals_and_ci():
    t3 = load("table3_heldout.csv")
    assert set(t3["workload"]) == {"SWE", "tau2"}
    for (workload, gpus), g in t3.groupby(["workload", "gpus"]):
        target = g.loc[g["engine"] == "ostinato", "total_s"].item()
        base = g[g["engine"] != "ostinato"]
        derived = 100 * (1 - target / base["total_s"])
        assert (derived - base["saved_pct"]).abs().max() < 0.1, (workload, gpus)
        assert ((base["saved_ci_low_pct"] <= base["saved_pct"]) & (base["saved_pct"] <= base["saved_ci_high_pct"])).all()
        assert (base["won"] <= base["sessions"]).all() and g["sessions"].nunique() == 1
    t2 = load("table2.csv").set_index("set")
    sessions = t3.groupby("workload")["sessions"].first()
    assert sessions["SWE"] == t2.loc["swe-heldout", "sessions"] and sessions["tau2"] == t2.loc["tau2-heldout", "sessions"]


def test_figure1_speedups_follow_table3():
    t3 = load("table3_heldout.csv").set_index(["workload", "gpus", "engine"]).sort_index()
    f1 = load("figure1.csv")
    for r in f1.itertuples():
        col = "total_s" if r.panel == "b" else "ttft_tool_s"
        key = (r.workload, r.gpus)
        slowest = t3.loc[key][col].idxmax()
        assert slowest == r.reference_engine, r
        derived = t3.loc[key][col].max() / t3.loc[(*key, r.engine), col]
        assert abs(derived - r.speedup) < 0.01, r
    assert len(f1) == 2 * 12 + 2


def test_table7_agrees_with_table3_and_figure6():
    t7 = load("table7_ttft_by_kind.csv")
    t3 = load("table3_heldout.csv")
    tool = t7[t7["kind"] == "tool"].set_index(["workload", "engine"])["ttft_median_s"]
    t3_tool = t3[t3["gpus"] == 4].set_index(["workload", "engine"])["ttft_tool_s"]
    assert tool.sort_index().equals(t3_tool.sort_index())
    turns = t7.groupby(["workload", "kind"])["turns"].first()
    assert turns[("SWE", "first")] + turns[("SWE", "tool")] == load("table2.csv").set_index("set").loc["swe-heldout", "turns"]
    assert turns[("tau2", "first")] + turns[("tau2", "tool")] + turns[("tau2", "user")] == 916
    f6 = load("figure6.csv")
    c = f6[f6["panel"] == "c"].set_index(["workload", "kind"])["value"]
    ost = t7[t7["engine"] == "ostinato"].set_index(["workload", "kind"])["ttft_median_s"]
    assert all(c[k] == ost[k] for k in c.index)


def test_table4_changes_follow_the_medians():
    t4 = load("table4_qwen.csv").set_index("metric")
    for metric in ("ttft_tool_s", "ttft_user_s"):
        r = t4.loc[metric]
        lo, hi = ratio_bounds(r["ostinato"], r["buun"], 0.005)
        assert 100 * (lo - 1) - 0.05 <= r["change_pct"] <= 100 * (hi - 1) + 0.05, metric
    assert t4.loc["total_request_time", "turns"] == 916


def test_figure7_sweep_changes_follow_the_ttfts():
    f7 = load("figure7.csv")
    b = f7[(f7["panel"] == "b") & (f7["metric"] == "ttft")].set_index(["engine", "new_tokens"])["value"]
    lo, hi = ratio_bounds(b[("ostinato", "1024")], b[("buun", "1024")], 0.005)
    change = f7[(f7["metric"] == "ttft_change") & (f7["new_tokens"] == "1024")]["value"].item()
    assert 100 * (lo - 1) - 0.05 <= change <= 100 * (hi - 1) + 0.05
    band = f7[(f7["metric"] == "ttft_change") & (f7["new_tokens"] == "<=512")].iloc[0]
    for n in ("128", "512"):
        lo, hi = ratio_bounds(b[("ostinato", n)], b[("buun", n)], 0.005)
        assert band["value_low"] - 0.1 <= 100 * (hi - 1) and 100 * (lo - 1) <= band["value_high"] + 0.1, n


def test_table8_totals_and_final_row():
    t8 = load("table8_ablation.csv")
    ab = t8[t8["panel"].isin(["a", "b"]) & t8["prefill_s"].notna()]
    parts = ab["prefill_s"] + ab["decode_s"]
    assert ((parts - ab["total_s"]).abs() / ab["total_s"] < 0.01).all()  # the rest is client overhead
    final = t8[(t8["panel"] == "b")].sort_values("step").iloc[-1]
    t3 = load("table3_heldout.csv").set_index(["workload", "gpus", "engine"])
    assert final["total_s"] == t3.loc[("SWE", 4, "ostinato"), "total_s"]
    assert (t8.loc[t8["panel"] == "b", "turns"] == 893).all() and (t8.loc[t8["panel"] == "a", "turns"] == 60).all()
    c = t8[t8["panel"] == "c"]
    for _, g in c.groupby("workload"):
        steps = g[g["config"] != "buun"].sort_values("step")["decode_step_ms"].to_numpy()
        assert (np.diff(steps) < 0).all()  # every step of the decode path makes a step faster
        assert steps[-1] < g.loc[g["config"] == "buun", "decode_step_ms"].item()


def test_models_and_costmodel_constants():
    t1 = load("table1_models.csv").set_index("model")
    v4 = t1.loc["DeepSeek-V4-Flash"]
    gib = v4["moe_layers"] * v4["experts_per_layer"] * v4["expert_size_mb"] * 1e6 / 2**30
    assert abs(gib - v4["routed_experts_gib"]) < 1  # 137 GiB of routed experts
    k = load("costmodel_constants.csv")
    v = k.set_index(["name", "model"])
    dsv4 = lambda name: v.loc[(name, "DeepSeek-V4-Flash")]  # noqa: E731
    assert dsv4("overlap_before")["value"] - dsv4("overlap_after")["value"] == pytest.approx(dsv4("overlap_saving")["value"])
    share = 100 * dsv4("overlap_saving")["value"] / dsv4("overlap_bound_u")["value"]
    assert abs(share - dsv4("overlap_saving_share")["value"]) < 0.05
    alpha, g = dsv4("alpha")["value"], dsv4("gpu_branch")
    assert abs((alpha - g["value_high"]) - dsv4("delta")["value_low"]) < 0.001  # delta = alpha - g, g rounded
    assert round(dsv4("upload_idle")["value"] / dsv4("cpu_expert_token")["value"]) == dsv4("upload_breakeven_tokens")["value"]
    profile = yaml.safe_load((PAPER.parents[1] / "data" / "profiles" / "paper-4x4090d.yaml").read_text())["models"]
    cls = profile["deepseek-v4-flash"]["classes"][0]
    assert (cls["gamma0_ms"], cls["alpha_ms"], cls["beta_ms"]) == (dsv4("gamma0")["value"], alpha, dsv4("beta")["value"])
    for i, q in enumerate(profile["qwen3-235b-a22b"]["classes"], start=1):
        model = f"Qwen3-235B-A22B:class{i}"
        assert (q["gamma0_ms"], q["alpha_ms"], q["beta_ms"]) == tuple(v.loc[(n, model), "value"] for n in ("gamma0", "alpha", "beta"))
    t6 = load("table6_configs.csv")
    ost = t6[(t6["engine"] == "ostinato") & (t6["gpus"] == 4)].iloc[0]
    assert ost["resident_experts"] == profile["deepseek-v4-flash"]["pool_slots"]
    assert round(ost["resident_experts"] / v4["moe_layers"]) == 133  # experts kept per layer on average
