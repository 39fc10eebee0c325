"""The result tables (ostinato.figures.runs and .results) and the notebooks that render each paper result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from ostinato.figures import results as R
from ostinato.figures.runs import combine, load_measured, load_series, load_simulated, paper_workload, split_correctness
from ostinato.figures.style import series_kind, series_palette

REPO = Path(__file__).resolve().parents[1]
H100_POOL = "measured (h100, reference, borrowed experts in the pool's computation)"
PAPER = REPO / "data" / "paper"
RESULT_NOTEBOOKS = ["table3", "fig1", "table7", "fig4", "fig5", "fig6", "table8", "table4", "calibrate", "predicted"]

# per engine: a scale of every time, so the target saves 1 - 0.6 = 40% of stock's time in each session
SCALE = {"stock": 1.0, "ostinato": 0.6}
SESSIONS = ["tau2/a/000", "tau2/a/001", "swe-mini/x", "swe-mini/y"]


def write_replay(tmp: Path, failed: tuple[str, str] | None = None, scale: dict[str, float] = SCALE,
                 stem: str = "", machine: str = "cpu-2c", extra: dict | None = None) -> tuple[Path, Path]:
    """Per-session and per-request CSVs shaped like `ostinato replay summarize` output (`extra`: more per-session
    columns, e.g. what the replay ran on; without them, a summary made before those columns were recorded)."""
    ses, req = [], []
    for engine, k in scale.items():
        for i, sid in enumerate(SESSIONS):
            kinds = ["first", "tool", "user", "tool"] if sid.startswith("tau2") else ["first", "tool", "tool", "tool"]
            lat = [k * (1 + i) * (t + 1) for t in range(len(kinds))]
            ok = (engine, sid) != failed
            ses.append({"engine": engine, "machine": machine, "session": sid, "n_requests": len(kinds),
                        "session_ok": ok, "total_request_s": sum(lat) if ok else float("nan"),
                        "server_prefill_s": 0.4 * sum(lat), "server_decode_s": 0.55 * sum(lat), **(extra or {})})
            for t, (kind, lt) in enumerate(zip(kinds, lat)):
                req.append({"engine": engine, "session": sid, "turn": t, "kind": kind, "ok": True, "n_new": 100 * (t + 1),
                            "n_prompt": 100 * (t + 1) * (t + 2) // 2, "n_output": 20, "ttft_s": 0.1 * lt,
                            "latency_s": lt, "tpot_s": k * 0.01 * (1 + t)})
    s, r = tmp / f"sessions{stem}.csv", tmp / f"requests{stem}.csv"
    pd.DataFrame(ses).to_csv(s, index=False)
    pd.DataFrame(req).to_csv(r, index=False)
    return s, r


def write_sim(tmp: Path) -> tuple[Path, Path]:
    """Simulator outputs (`ostinato sim run`) for two policies on one synthetic SWE session."""
    ses, req = [], []
    for pol, k in (("ostinato", 0.5), ("llama.cpp-layers", 1.0), ("ostinato-native-prefill-overlap", 0.8)):
        rows = [{"engine": pol, "session": "synthetic-swe/1-0", "turn": t, "kind": "first" if t == 0 else "tool",
                 "n_new": 200, "n_output": 10 if t < 2 else 1, "prefill_ms": 100 * k, "decode_ms": 50 * k,
                 "ttft_ms": 100 * k, "tpot_ms": 5 * k, "total_ms": 150 * k} for t in range(3)]
        req += rows
        ses.append({"engine": pol, "session": "synthetic-swe/1-0", "n_requests": 3, "total_s": 0.45 * k,
                    "prefill_s": 0.3 * k, "decode_s": 0.15 * k, "ttft_median_s": 0.1 * k, "tpot_median_ms": 5 * k})
    s, r = tmp / "sim_sessions.csv", tmp / "sim_requests.csv"
    pd.DataFrame(ses).to_csv(s, index=False)
    pd.DataFrame(req).to_csv(r, index=False)
    return s, r


def test_paper_workload():
    assert paper_workload("tau2/airline/3") == "tau2"
    assert paper_workload("swe-mini/django-1") == "SWE"
    assert paper_workload("synthetic-swe/2-0") == "SWE"
    assert paper_workload("plain") == "all"


def test_load_measured_and_missing_column(tmp_path):
    s, r = write_replay(tmp_path)
    runs = load_measured(s, r)
    assert runs.series == ["measured (cpu-2c)"]
    assert set(runs.sessions["workload"]) == {"tau2", "SWE"}
    assert runs.requests["tpot_ms"].max() == pytest.approx(40.0)  # 0.01 s x 4 -> ms
    pd.read_csv(s).drop(columns=["total_request_s"]).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(ValueError, match=r"bad\.csv lacks columns \['total_request_s'\]"):
        load_measured(tmp_path / "bad.csv", r)
    with pytest.raises(FileNotFoundError, match="nowhere.csv"):
        load_measured(tmp_path / "nowhere.csv", r)


def test_load_simulated_maps_policies_and_context(tmp_path):
    runs = load_simulated(*write_sim(tmp_path), profile="paper-4x4090d")
    assert runs.series == ["simulated (paper-4x4090d)"]
    assert set(runs.sessions["engine"]) == {"ostinato", "llama.cpp-layers", "ostinato-native-prefill-overlap"}
    ctx = runs.requests[runs.requests["engine"] == "ostinato"].sort_values("turn")["context"].tolist()
    assert ctx == [200, 200 + 10 + 200, 200 + 10 + 200 + 10 + 200]
    # one output token has no TPOT
    assert runs.requests[runs.requests["turn"] == 2]["tpot_ms"].isna().all()


def test_compare_saved_share_won_and_dropped(tmp_path):
    runs = load_measured(*write_replay(tmp_path, failed=("stock", "swe-mini/y")))
    t = R.compare(runs, R.CompareOptions(n_resamples=199))
    swe = t[(t["workload"] == "SWE")].set_index("engine")
    assert swe.loc["stock", "sessions"] == 1 and swe.loc["stock", "dropped"] == 1
    tau = t[(t["workload"] == "tau2")].set_index("engine")
    assert tau.loc["stock", "saved_pct"] == pytest.approx(40.0)
    assert tau.loc["stock", "won"] == 2
    assert pd.isna(tau.loc["ostinato", "saved_pct"])
    assert tau.loc["stock", "n_user"] == 2 and tau.loc["stock", "n_tool"] == 4
    assert tau.loc["ostinato", "ttft_tool_s"] == pytest.approx(0.6 * tau.loc["stock", "ttft_tool_s"])


# what a CPU-only replay's summary records: no GPU, a cpu engine build; every forced token matched, no foreign load
CPU_ONLY = {"machine_gpus": 0, "engine_backend": "cpu", "n_ok": 4, "n_forced_checked": 4, "n_forced_match": 4,
            "load_flag": "clean"}


def test_cpu_only_replays_are_a_correctness_run(tmp_path):
    """Set apart by what the summary records (backend, else the machine's GPUs), not by the series' name."""
    s, r = write_replay(tmp_path, machine="h200-named-cpu", extra=CPU_ONLY)
    ses = pd.read_csv(s)
    ses.loc[0, "load_flag"], ses.loc[1, "n_forced_match"] = "foreign load", 3
    ses.to_csv(s, index=False)
    gs, gr = write_replay(tmp_path, stem="gpu", machine="cpu-named-gpu",
                          extra={"machine_gpus": 1, "engine_backend": "cuda", "load_flag": "clean"})
    cpu, gpu = load_measured(s, r), load_measured(gs, gr)
    assert cpu.sessions["cpu_only"].all() and not gpu.sessions["cpu_only"].any()
    speed, checks = split_correctness(combine(cpu, gpu, load_simulated(*write_sim(tmp_path), profile="p")))
    assert speed.series == ["measured (cpu-named-gpu)", "simulated (p)"] and checks.series == ["measured (h200-named-cpu)"]
    t = R.correctness(checks).set_index(["workload", "engine"])
    assert t.loc[("tau2", "stock"), "completed"] == 2 and t.loc[("tau2", "stock"), "foreign_load_sessions"] == 1
    assert t.loc[("tau2", "stock"), "forced_match"] == 7 and t.loc[("tau2", "stock"), "forced_checked"] == 8
    assert t.loc[("SWE", "ostinato"), "forced_match_pct"] == 100 and t.loc[("SWE", "ostinato"), "load_unknown_sessions"] == 0
    # a machine without a GPU and no recorded backend (an engine reached by URL) is CPU-only too; nothing recorded
    # (the shipped reference runs) is not
    pd.read_csv(s).drop(columns=["engine_backend"]).to_csv(tmp_path / "url.csv", index=False)
    assert load_measured(tmp_path / "url.csv", r).sessions["cpu_only"].all()
    old = load_measured(*write_replay(tmp_path, stem="old"))
    assert not old.sessions["cpu_only"].any() and (old.sessions["load_flag"] == "unknown").all()
    assert split_correctness(old)[1].sessions.empty


def test_compare_counts_sessions_under_foreign_load(tmp_path):
    s, r = write_replay(tmp_path, extra={"load_flag": "clean"})
    ses = pd.read_csv(s)
    ses.loc[(ses["engine"] == "stock") & (ses["session"] == "tau2/a/000"), "load_flag"] = "foreign load"
    ses.to_csv(s, index=False)
    t = R.compare(combine(load_measured(s, r), load_simulated(*write_sim(tmp_path), profile="p")),
                  R.CompareOptions(n_resamples=199)).set_index(["series", "workload", "engine"]).sort_index()
    assert t.loc[("measured (cpu-2c)", "tau2", "stock"), "foreign_load_sessions"] == 1
    assert t.loc[("measured (cpu-2c)", "tau2", "ostinato"), "foreign_load_sessions"] == 0
    assert (t.loc["measured (cpu-2c)", "load_unknown_sessions"] == 0).all()
    assert t.loc["simulated (p)", "foreign_load_sessions"].isna().all()  # no load flag for the simulator


def test_repeated_runs_count_separately(tmp_path):
    a = write_replay(tmp_path, stem="1")
    b = write_replay(tmp_path, stem="2", scale={"stock": 1.0, "ostinato": 0.8})
    runs = load_series([], [], "", [], [], "p", reference_runs=[], reference_machine="")
    assert runs.sessions.empty
    for i, (s, r) in enumerate((a, b), 1):
        d = tmp_path / f"run{i}"
        d.mkdir()
        s.rename(d / "sessions.csv")
        r.rename(d / "requests.csv")
    runs = load_series([], [], "", [], [], "p", reference_runs=[tmp_path / "run1", tmp_path / "run2"],
                       reference_machine="h200")
    assert runs.series == ["measured (h200, reference)"]
    t = R.compare(runs, R.CompareOptions(n_resamples=199)).set_index(["workload", "engine"])
    assert t.loc[("tau2", "stock"), "sessions"] == 4  # two sessions in each of two runs
    assert t.loc[("tau2", "stock"), "saved_pct"] == pytest.approx(30.0)  # (0.6 + 0.8) / 2 of the same totals


def test_speedups_savings_phases_tpot_ablation(tmp_path):
    runs = combine(load_measured(*write_replay(tmp_path)), load_simulated(*write_sim(tmp_path), profile="p"))
    t = R.compare(runs, R.CompareOptions(n_resamples=199))
    sp = R.speedups(t, "total_s")
    m = sp[(sp["series"] == "measured (cpu-2c)") & (sp["workload"] == "SWE")].set_index("engine")["speedup"]
    assert m["stock"] == 1.0 and m["ostinato"] == pytest.approx(1 / 0.6)
    sv = R.session_savings(runs)
    assert sv[sv["series"] == "measured (cpu-2c)"]["saved_pct"].round(6).eq(40.0).all()
    summ = R.savings_summary(sv)
    assert set(summ.columns) >= {"min_saved_pct", "median_saved_pct", "max_saved_pct"}
    ph = R.phase_changes(t)
    sim = ph[(ph["series"] == "simulated (p)") & (ph["reference_engine"] == "llama.cpp-layers")].iloc[0]
    assert sim["prefill_change_pct"] == pytest.approx(-50.0) and sim["decode_change_pct"] == pytest.approx(-50.0)
    tp = R.tpot_by_context(runs)
    assert set(tp[tp["series"] == "measured (cpu-2c)"]["quartile"]) <= {1, 2, 3, 4}
    ab = R.ablation(t)
    s = ab[ab["series"] == "simulated (p)"].set_index("step")
    assert list(s.index) == [1, 4, 5]
    assert s.loc[1, "total_rel_step1"] == 1.0 and s.loc[5, "total_rel_step1"] == pytest.approx(0.5)
    k = R.ttft_by_kind(t)
    assert set(k["kind"]) == {"first", "tool", "user"}


def test_measured_ablation_steps_and_prefill_paths(tmp_path):
    # three replayed engines standing for Table 8's steps 1, 3 and 5; the paths halve the native prefill
    scale = {"llama.cpp-layers": 1.0, "ostinato-native-prefill": 0.9, "ostinato": 0.6}
    runs = combine(load_measured(*write_replay(tmp_path, scale=scale)), load_simulated(*write_sim(tmp_path), profile="p"))
    t = R.compare(runs, R.CompareOptions(n_resamples=199))
    ab = R.ablation(t)
    m = ab[(ab["series"] == "measured (cpu-2c)") & (ab["workload"] == "SWE")].set_index("step")
    assert list(m.index) == [1, 3, 5] and m.loc[3, "engine"] == "ostinato-native-prefill"
    assert m.loc[3, "total_rel_step1"] == pytest.approx(0.9) and m.loc[5, "prefill_rel_step1"] == pytest.approx(0.6)
    pp = R.prefill_paths(t, PAPER / "table8_ablation.csv")
    paper = pp[pp["series"] == "paper"].iloc[0]
    assert paper["prefill_change_pct"] == pytest.approx(100 * (150.8 / 284.8 - 1))
    assert paper["decode_change_pct"] == pytest.approx(100 * (295.8 / 295.2 - 1))
    meas = pp[pp["series"] == "measured (cpu-2c)"].set_index("workload")
    assert set(meas.index) == {"SWE", "tau2"} and (meas["native"] == "ostinato-native-prefill").all()
    assert meas.loc["SWE", "prefill_change_pct"] == pytest.approx(100 * (0.6 / 0.9 - 1))
    # ostinato saves 1 - 0.6 / 0.9 of the native-prefill engine's time in every session: the CI is that point
    assert meas.loc["SWE", "saved_pct"] == pytest.approx(100 / 3)
    assert meas.loc["SWE", "saved_ci_low_pct"] <= 100 / 3 + 1e-9 <= meas.loc["SWE", "saved_ci_high_pct"] + 1e-9
    sim = pp[pp["series"] == "simulated (p)"].iloc[0]
    assert sim["native"] == "ostinato-native-prefill-overlap" and sim["prefill_change_pct"] == pytest.approx(100 * (0.5 / 0.8 - 1))
    # a series without the native configuration has no row
    only = R.prefill_paths(R.compare(load_measured(*write_replay(tmp_path, stem="b")), R.CompareOptions(n_resamples=199)),
                           PAPER / "table8_ablation.csv")
    assert list(only["series"]) == ["paper"]


# a calibration fit and a sweep of the same made-up machine (2 MoE layers, top-4)
FIT = {"n_moe_layer": 2, "k": 4, "tpot_ms": {"0": 5.0, "1": 5.5}, "beta_ms": 0.2, "alpha_minus_gamma0_ms": 0.05,
       "decode_fit_residual_ms": 0.0, "prefill_pass_ms": 10.0, "prefill_token_ms": 0.1, "cpu_layer_ms": 1.0,
       "cpu_route_ms": 0.01, "upload_bytes_per_ms": 1e6, "upload_expert_ms": 0.5}
SWEEP = {"meta": {"upload_min": 512}, "rows": [
    {"engine": "ostinato", "kind": "prefill", "n_new": 100, "median_s": 0.03},
    {"engine": "ostinato", "kind": "prefill", "n_new": 1024, "median_s": 0.2},
    {"engine": "llama.cpp-layers", "kind": "prefill", "n_new": 100, "median_s": 0.05},
    {"engine": "ostinato", "kind": "decode", "n_new": None, "median_s": 0.0054}]}
COLD = {"k": 4, "placements": {"ostinato": {"prefill": 1.5, "decode": 0.8}}}


def test_predict_sweep_by_hand():
    p = R.predict_sweep(FIT, SWEEP, COLD).set_index(["kind", "n_new"], drop=False)
    # split path: 10 + 0.1 * 100 + 2 * (1 + 0.01 * 100 * 1.5) = 25 ms against 30 measured
    split = p[(p["kind"] == "prefill") & (p["n_new"] == 100)].iloc[0]
    assert split["predicted_ms"] == pytest.approx(25.0) and split["error_pct"] == pytest.approx(-100 / 6)
    assert pd.isna(p[(p["kind"] == "prefill") & (p["n_new"] == 1024)].iloc[0]["predicted_ms"])  # upload path
    dec = p[p["kind"] == "decode"].iloc[0]
    # 5 + 2 * (0.2 * 0.8 + 0.05 * q), q in [0.8 / 4, 0.8]
    assert dec["predicted_low_ms"] == pytest.approx(5.34) and dec["predicted_high_ms"] == pytest.approx(5.40)
    assert dec["within_interval"] == True  # noqa: E712 (5.4 measured)
    with pytest.raises(ValueError, match="buun"):
        R.predict_sweep(FIT, SWEEP, COLD, engine="buun")


def test_predict_sweep_takes_each_prefix_cold_routes():
    """A sweep after two prefixes: each row is predicted from the cold routes after its own prefix."""
    rows = [{**r, "prefix": 64} for r in SWEEP["rows"]] + [{**r, "prefix": 512} for r in SWEEP["rows"]]
    cold = {**COLD, "by_prefix": {"64": COLD["placements"], "512": {"ostinato": {"prefill": 3.0, "decode": 0.8}}}}
    p = R.predict_sweep(FIT, {**SWEEP, "rows": rows}, cold)
    split = p[(p["kind"] == "prefill") & (p["n_new"] == 100)].set_index("prefix")["predicted_ms"]
    # 10 + 0.1 * 100 + 2 * (1 + 0.01 * 100 * m), m = 1.5 after 64 tokens and 3.0 after 512
    assert split[64] == pytest.approx(25.0) and split[512] == pytest.approx(28.0)


def test_paper_tables_line_up():
    p3 = R.paper_table3(PAPER / "table3_heldout.csv", PAPER / "table7_ttft_by_kind.csv")
    assert len(p3) == 12 and set(p3["workload"]) == {"SWE", "tau2"}
    assert p3.set_index(["workload", "engine"]).loc[("tau2", "ostinato"), "ttft_user_s"] == 0.37
    # the paper's Figure 1 (b) is Table 3's totals over the slowest engine's
    f1 = R.paper_figure1(PAPER / "figure1.csv")
    ours = R.speedups(p3, "total_s").set_index(["workload", "engine"])["speedup"]
    for _, r in f1[f1["metric"] == "total_s"].iterrows():
        assert ours[(r["workload"], r["engine"])] == pytest.approx(r["speedup"], abs=0.006)
    ab = R.paper_ablation(PAPER / "table8_ablation.csv")
    assert ab.iloc[0]["total_rel_step1"] == 1.0 and set(ab["workload"]) == {"SWE"}
    assert len(R.paper_table7(PAPER / "table7_ttft_by_kind.csv")) == 30


def test_decode_steps_beside_the_paper():
    """Figure 8c: the paper's decode steps relative to its buun, and a sweep's presets relative to its baseline."""
    sweep = {"meta": {"prefix": 64}, "rows": [
        {"engine": "llama.cpp-layers", "kind": "decode", "n_new": "", "median_s": 0.010},
        {"engine": "ostinato", "kind": "decode", "n_new": "", "median_s": 0.008, "ratio_to": "llama.cpp-layers",
         "ratio": 0.8, "ratio_ci_low": 0.7, "ratio_ci_high": 0.9},
        {"engine": "ostinato-overlap", "kind": "decode", "prefix": 128, "n_new": "", "median_s": 0.007},
        {"engine": "ostinato-borrow", "kind": "decode", "n_new": "", "median_s": 0.006, "borrow_hits_per_step": 1.5},
        {"engine": "ostinato", "kind": "prefill", "n_new": 128, "median_s": 0.5},
        {"engine": "buun", "kind": "decode", "n_new": "", "median_s": 0.009}]}
    t = R.decode_steps({"measured (m)": sweep}, PAPER / "table8_ablation.csv")
    paper = t[(t["series"] == "paper") & (t["workload"] == "SWE held-out")].set_index("step")
    assert paper.loc[4, "decode_step_ms"] == 25.63 and paper.loc[4, "ratio"] == pytest.approx(25.63 / 28.65)
    m = t[t["series"] == "measured (m)"].set_index("engine")
    assert len(m) == 4  # no prefill row, no preset that stands for no step
    row = m.loc["ostinato: two branches in turn, per-segment graphs"]
    assert (row["step"], row["prefix"], row["decode_step_ms"], row["ratio"]) == (0, 64, 8.0, 0.8)
    b = m.loc["ostinato-borrow: borrowed memory, on per-segment graphs"]
    assert (b["step"], b["borrow_hits_per_step"]) == (4, 1.5) and np.isnan(row["borrow_hits_per_step"])
    assert m.loc["ostinato-overlap: two branches with per-segment graphs", "prefix"] == 128  # the row's own prefix


def test_series_palette():
    labels = ["paper", "measured (a)", "measured (b)", "simulated (p)"]
    pal = series_palette(labels)
    assert set(pal) == set(labels) and len(set(pal.values())) == 4
    assert series_kind("simulated (p)") == "simulated"
    with pytest.raises(ValueError, match="not `paper`"):
        series_kind("guess (x)")


def test_result_notebooks_twins_in_sync():
    for name in RESULT_NOTEBOOKS:
        nb = json.loads((REPO / "notebooks" / f"{name}.ipynb").read_text())
        assert nb["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
        assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]) == 1
        text = (REPO / "notebooks" / f"{name}.py").read_text()
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(src in text for src in code), f"run `jupytext --sync notebooks/{name}.ipynb`"


def _papermill(notebook: Path, out: Path, params: dict, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "papermill", str(notebook), str(out), "-f", str(cwd / "params.yaml"),
                           "--cwd", str(cwd), "-k", "python3"], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow  # papermill starts a kernel
def test_table4_shows_the_shipped_qwen_runs_against_layer_placement(tmp_path):
    """Table 4's notebook with its default reference runs (H200, Qwen3 slice): τ² only, totals summed by hand."""
    pytest.importorskip("papermill")
    runs = [REPO / "data" / "reference" / "h200" / "qwen" / f"run{i}" for i in (1, 2, 3)]
    params = {"params": {"paper_dir": str(PAPER), "n_resamples": 199, "reference_runs": [str(r) for r in runs],
                         "reference_machine": "h200", "figures_dir": str(tmp_path / "figures"),
                         "tables_dir": str(tmp_path / "tables")}}
    res = _papermill(REPO / "notebooks" / "table4.ipynb", tmp_path / "table4.out.ipynb", params, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    t4 = pd.read_csv(tmp_path / "tables" / "table4.csv")
    ref = t4[t4["series"] == "measured (h200, reference)"].set_index("metric")
    assert set(ref["workload"]) == {"tau2"} and set(ref["reference_engine"]) == {"llama.cpp-layers"}
    sessions = pd.concat([pd.read_csv(r / "sessions.csv").assign(run=i) for i, r in enumerate(runs)])
    tau2 = sessions[sessions["session"].str.startswith("tau2/")]
    total = tau2.groupby("engine")["total_request_s"].sum()
    assert ref.loc["total_s", "reference"] == pytest.approx(total["llama.cpp-layers"])
    assert ref.loc["total_s", "ostinato"] == pytest.approx(total["ostinato"])
    assert ref.loc["total_s", "change_pct"] == pytest.approx(100 * (total["ostinato"] / total["llama.cpp-layers"] - 1))
    per = tau2.pivot_table(index=["run", "session"], columns="engine", values="total_request_s")
    won = int((per["ostinato"] < per["llama.cpp-layers"]).sum())
    assert ref.loc["won", "note"] == f"{won} of {len(per)}"


def test_result_notebook_parameters_are_checked():
    from ostinato.figures.notebook import DEFAULT_REFERENCE_RUNS, ResultParams

    assert ResultParams.for_result("table8").reference_runs == DEFAULT_REFERENCE_RUNS["table8"]
    assert ResultParams.for_result("table4").measured_sessions == []  # Qwen3 series only
    assert ResultParams.for_result("table3", {"target": "x"}).target == "x"
    with pytest.raises(ValueError, match=r"table3: unknown parameters \['n_resample'\]"):
        ResultParams.for_result("table3", {"n_resample": 9})


def test_a_notebook_alone_shows_the_shipped_runs_the_default_config_names():
    """Run without the pipeline's parameters, a result notebook shows the same shipped H200 runs as the default config."""
    from ostinato.figures.notebook import DEFAULT_REFERENCE_RUNS, ResultParams

    figures = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["figures"]
    assert ResultParams().reference_runs == figures["reference_runs"]
    assert ResultParams().heldout_runs == figures["reference_heldout_runs"]
    assert DEFAULT_REFERENCE_RUNS["table4"] == figures["reference_qwen_runs"]
    assert DEFAULT_REFERENCE_RUNS["table8"] == figures["reference_ablation_runs"]


def test_heldout_runs_are_a_series_of_their_own():
    """The shipped whole held-out sessions (another model, other sessions) are not pooled with the reference runs."""
    from ostinato.figures.runs import load_series

    h200 = REPO / "data" / "reference" / "h200"
    heldout = [str(h200 / "heldout" / r) for r in ("run1", "run1-repeat")]
    runs = load_series([], [], "", [], [], "p", [str(h200 / "compare" / "run1")], "h200", heldout)
    whole = runs.sessions[runs.sessions["series"] == "measured (h200, reference, whole sessions)"]
    ref = runs.sessions[runs.sessions["series"] == "measured (h200, reference)"]
    shipped = [pd.read_csv(f"{d}/sessions.csv") for d in heldout]
    assert len(whole) == sum(len(s) for s in shipped)
    assert {s.split("#")[0] for s in whole["session"]} == set(shipped[0]["session"]) == set(shipped[1]["session"])
    # the two shipped runs of the same sessions stay apart, one session id per run
    assert {s.split("#")[1] for s in whole["session"]} == {"run1", "run2"}
    assert len(ref) == len(pd.read_csv(h200 / "compare" / "run1" / "sessions.csv"))
    assert set(runs.requests["series"]) == {"measured (h200, reference, whole sessions)", "measured (h200, reference)"}
    # a run of other engines (ostinato against buun) is a series of its own, named by its directory
    runs = load_series([], [], "", [], [], "p", [], "h200", heldout + [str(h200 / "heldout" / "run1-buun")])
    buun = runs.sessions[runs.sessions["series"] == "measured (h200, reference, whole sessions: run1-buun)"]
    assert set(buun["engine"]) == {"ostinato", "buun (policy, implemented here)"}
    assert len(runs.sessions) == len(whole) + len(buun)
    # runs of the same engines with another engine build name their series (series.txt): never pooled with run 1
    graph = h200 / "heldout" / "run1-graph-3"
    runs = load_series([], [], "", [], [], "p", [], "h200", heldout + [str(graph)])
    named = runs.sessions[runs.sessions["series"] == "measured (h200, reference, whole sessions: one graph per decode step)"]
    assert (graph / "series.txt").read_text().strip() == "one graph per decode step"
    assert len(named) == len(pd.read_csv(graph / "sessions.csv")) and set(named["engine"]) == {"ostinato", "llama.cpp-layers", "buun (policy, implemented here)"}
    assert len(runs.sessions[runs.sessions["series"] == "measured (h200, reference, whole sessions)"]) == len(whole)
    # the current engine's run 1 (every engine) is the series its series.txt names, all its engines' sessions
    design = h200 / "heldout" / "run1-borrow"
    runs = load_series([], [], "", [], [], "p", [], "h200", heldout + [str(design)])
    label = "measured (h200, reference, whole sessions: one graph per decode step with borrowed memory)"
    named = runs.sessions[runs.sessions["series"] == label]
    assert (design / "series.txt").read_text().strip() == "one graph per decode step with borrowed memory"
    assert len(named) == len(pd.read_csv(design / "sessions.csv")) == 50
    assert set(named["engine"]) == {"ostinato", "llama.cpp-layers", "buun (policy, implemented here)",
                                    "llama.cpp-expert-cache (policy, implemented here)",
                                    "ktransformers-placement (policy, implemented here)"}


def test_heldout_runs_of_another_gpu_are_a_series_labelled_with_it(tmp_path):
    """A shipped run of whole held-out sessions on an H100 is labelled h100 (as its sessions.csv records), never pooled
    with the H200's runs of the same engines nor labelled with `reference_machine`."""
    from ostinato.figures.runs import load_series

    h200 = REPO / "data" / "reference" / "h200" / "heldout"
    h100 = tmp_path / "h100" / "run1"
    h100.mkdir(parents=True)
    for f in ("sessions.csv", "requests.csv"):
        df = pd.read_csv(h200 / "run1" / f)
        if "machine" in df:
            df["machine"] = "h100"
        df.to_csv(h100 / f, index=False)
    runs = load_series([], [], "", [], [], "p", [], "h200", [str(h200 / "run1"), str(h100)])
    n = len(pd.read_csv(h200 / "run1" / "sessions.csv"))
    counts = runs.sessions["series"].value_counts().to_dict()
    assert counts == {"measured (h200, reference, whole sessions)": n, "measured (h100, reference, whole sessions)": n}
    # a directory mixing two machines' replays is refused, naming its file
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    a, b = pd.read_csv(h200 / "run1" / "sessions.csv"), pd.read_csv(h100 / "sessions.csv")
    pd.concat([a, b]).to_csv(mixed / "sessions.csv", index=False)
    (mixed / "requests.csv").write_text((h100 / "requests.csv").read_text())
    with pytest.raises(ValueError, match=r"mixed/sessions.csv: sessions of several machines \(h100, h200\)"):
        load_series([], [], "", [], [], "p", [], "h200", [str(mixed)])


def test_a_runs_other_session_set_keeps_its_run_number():
    """The H100's run 1 and its SWE set (run1/swe-heldout/, the same engines): one series, every session of run 1;
    a second run of the same sessions counts as run 2."""
    from ostinato.figures.runs import load_series

    h100 = REPO / "data" / "reference" / "h100" / "heldout" / "run1"
    runs = load_series([], [], "", [], [], "p", [], "h200", [str(h100), str(h100 / "swe-heldout")])
    n = len(pd.read_csv(h100 / "sessions.csv")) + len(pd.read_csv(h100 / "swe-heldout" / "sessions.csv"))
    assert runs.sessions["series"].value_counts().to_dict() == {"measured (h100, reference, whole sessions)": n}
    assert runs.sessions["session"].str.endswith("#run1").all()
    assert set(runs.sessions["workload"]) == {"tau2", "SWE"}
    assert runs.requests["session"].str.endswith("#run1").all()
    again = load_series([], [], "", [], [], "p", [], "h200", [str(h100), str(h100 / "swe-heldout"), str(h100)])
    assert {s.split("#")[1] for s in again.sessions["session"]} == {"run1", "run2"}
    assert again.sessions["session"].str.endswith("#run2").sum() == len(pd.read_csv(h100 / "sessions.csv"))


@pytest.mark.slow  # papermill starts a kernel
def test_result_notebooks_render_under_papermill(tmp_path):
    """Every result notebook renders from a replay, a simulated run and the shipped H200 reference replays."""
    pytest.importorskip("papermill")
    s, r = write_replay(tmp_path)
    ss, sr = write_sim(tmp_path)
    common = {"measured_sessions": [str(s)], "measured_requests": [str(r)], "sim_sessions": [str(ss)],
              "sim_requests": [str(sr)], "profile": "p", "paper_dir": str(PAPER), "n_resamples": 199,
              "reference_runs": [str(REPO / "data" / "reference" / "h200" / "compare" / f"run{i}") for i in (1, 2, 3)],
              # the shipped whole-session runs, the H100's SWE set among them (in its run's series), and the H200's
              # SWE set under way: a series with neither Ostinato nor whole-layer placement
              "heldout_runs": [str(REPO / "data" / "reference" / "h200" / "heldout" / r)
                               for r in ("run1", "run1-repeat", "run1-buun", "run1-borrow", "run1-borrow/swe-heldout")]
                              + [str(REPO / "data" / "reference" / "h100" / "heldout" / r)
                                 for r in ("run1", "run1/swe-heldout")],
              "reference_machine": "h200", "figures_dir": str(tmp_path / "figures"), "tables_dir": str(tmp_path / "tables"),
              "decode_sweeps": {"measured (h200, reference)": str(REPO / "data/reference/h200/branches/sweep/summary.json"),
                                "measured (h200, reference, borrowed memory)":
                                    str(REPO / "data/reference/h200/borrow/thread/sweep/summary.json"),
                                "measured (h200, reference, one graph per step)":
                                    str(REPO / "data/reference/h200/graph/sweep3/plain/summary.json"),
                                H100_POOL: str(REPO / "data/reference/h100/graph/sweep5/plain/summary.json")}}
    fit = {"n_moe_layer": 2, "k": 2, "tpot_ms": {"0": 5.0, "1": 5.6, "2": 6.0}, "beta_ms": 0.1,
           "alpha_minus_gamma0_ms": 0.2, "decode_fit_residual_ms": 0.0, "cpu_route_ms": 0.1,
           "upload_bytes_per_ms": 1e6, "upload_expert_ms": 0.5}
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "summary.json").write_text(json.dumps(SWEEP))
    (sweep / "cold.json").write_text(json.dumps(COLD))
    (tmp_path / "fit-full.json").write_text(json.dumps(FIT))
    dirs = {"figures_dir": str(tmp_path / "figures"), "tables_dir": str(tmp_path / "tables")}
    special = {
        "calibrate": {"fits": [str(tmp_path / "fit.json")], "series": ["test"],
                        "constants_csv": str(PAPER / "costmodel_constants.csv"), **dirs},
        "predicted": {"fits": [str(tmp_path / "fit-full.json")], "sweeps": [str(sweep)], "machines": ["test"],
                      "constants_csv": str(PAPER / "costmodel_constants.csv"), **dirs},
    }
    for name in RESULT_NOTEBOOKS:
        params = special.get(name, {"output_stem": name, "params": common})
        res = _papermill(REPO / "notebooks" / f"{name}.ipynb", tmp_path / f"{name}.out.ipynb", params, tmp_path)
        assert res.returncode == 0, f"{name}: {res.stderr[-2000:]}"
        for f in (f"figures/{name}.pdf", f"figures/{name}.png", f"tables/{name}.csv", f"tables/{name}.md"):
            assert (tmp_path / f).is_file(), f"{name}: {f} missing"
        table = pd.read_csv(tmp_path / "tables" / f"{name}.csv")
        assert "series" in table.columns
        kinds = {series_kind(x) for x in table["series"].dropna()}
        assert "paper" in kinds, name
        if name not in ("table4", "calibrate", "predicted"):
            assert {"measured", "simulated"} <= kinds, f"{name}: {kinds}"
    t3 = pd.read_csv(tmp_path / "tables" / "table3.csv")
    row = t3[(t3["series"] == "measured (cpu-2c)") & (t3["workload"] == "tau2") & (t3["engine"] == "stock")]
    assert row["saved_pct"].iloc[0] == pytest.approx(40.0) and (row["role"] == "speed").all()
    assert row["load_unknown_sessions"].iloc[0] == 2  # the replay above took no load samples
    ref = t3[t3["series"] == "measured (h200, reference)"]
    assert len(ref) and ref["saved_pct"].notna().any() and (ref["role"] == "speed").all()
    bu = t3[(t3["series"] == "measured (h200, reference, whole sessions: run1-buun)") & (t3["engine"] == "buun (policy, implemented here)")]
    assert len(bu) == 1 and bu["saved_pct"].notna().all() and bu["sessions"].iloc[0] > 0
    # a CPU-only replay: correctness rows in Table 3 (no saved share), and in no other result's speed series
    cs, cr = write_replay(tmp_path, stem="cpu", machine="vm", extra=CPU_ONLY)
    cpu = {**common, "measured_sessions": [str(cs)], "measured_requests": [str(cr)],
           "tables_dir": str(tmp_path / "cpu_tables"), "figures_dir": str(tmp_path / "cpu_figures")}
    for name in ("table3", "fig1"):
        res = _papermill(REPO / "notebooks" / f"{name}.ipynb", tmp_path / f"{name}.cpu.ipynb",
                         {"output_stem": name, "params": cpu}, tmp_path)
        assert res.returncode == 0, f"{name}: {res.stderr[-2000:]}"
    t3 = pd.read_csv(tmp_path / "cpu_tables" / "table3.csv")
    vm = t3[t3["series"] == "measured (vm)"]
    assert len(vm) == 4 and (vm["role"] == "correctness").all() and vm["saved_pct"].isna().all()
    assert (vm["completed"] == 2).all() and (vm["forced_match_pct"] == 100).all() and (vm["foreign_load_sessions"] == 0).all()
    assert (t3.loc[t3["role"] == "speed", "series"] != "measured (vm)").all() and (t3["series"] == "paper").any()
    assert "measured (vm)" not in set(pd.read_csv(tmp_path / "cpu_tables" / "fig1.csv")["series"])
    d8 = pd.read_csv(tmp_path / "tables" / "table8_decode_steps.csv")
    assert set(d8["series"]) == {"paper", "measured (h200, reference)", "measured (h200, reference, borrowed memory)",
                                 "measured (h200, reference, one graph per step)", H100_POOL}
    assert set(d8.loc[d8["series"] != "paper", "prefix"]) == {3072, 8192}
    borrowed = d8[d8["engine"].str.startswith("ostinato-borrow")]
    assert (borrowed["step"] == 4).all() and len(borrowed) == 2 and (borrowed["borrow_hits_per_step"] > 0).all()
    graph = d8[d8["series"] == "measured (h200, reference, one graph per step)"].set_index(["prefix", "engine"])["step"]
    assert len(graph) == 8 and all(graph[p, "ostinato-graph: one graph per GPU, CPU pool set up once"] == 3
                                   and graph[p, "ostinato-graph-borrow: borrowed memory, on one graph per GPU"] == 4
                                   for p in (3072, 8192)), graph
    # the H100's sweep of the borrowed experts inside the pool's computation: its own machine's label, both steps
    h100 = d8[d8["series"] == H100_POOL]
    assert sorted(h100["step"].unique()) == [0, 1, 3, 4] and (h100.loc[h100["step"] == 4, "borrow_hits_per_step"] > 0).all()
    assert (h100.loc[h100["step"] > 0, "ratio_to"] == "llama.cpp-layers").all()
    pred = pd.read_csv(tmp_path / "tables" / "predicted.csv")
    assert pred[pred["series"] == "simulated (test calibration)"]["predicted_ms"].notna().sum() == 2
    cal = pd.read_csv(tmp_path / "tables" / "calibrate.csv").set_index("series")
    assert cal.loc["measured (test)", "beta_ms"] == 0.1 and np.isfinite(cal.loc["paper", "beta_ms"])


def test_every_paper_result_is_traced_by_one_name():
    """docs/results.md follows each paper result to its notebook, rule, stage, command and engine flags: every name
    there exists, every notebook is listed, and each stage's rule file, command, module and results folder agree."""
    import re

    from ostinato.cli import build_parser

    doc = (REPO / "docs" / "results.md").read_text()
    table = doc[doc.index("| paper result |"):doc.index("| notebook | what it shows |")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:] if line.startswith("|")]
    rules = {m for f in (REPO / "workflow" / "rules").glob("*.smk") for m in re.findall(r"^rule (\w+):", f.read_text(), re.M)}
    groups = set(build_parser()._subparsers._group_actions[0].choices)
    engine_doc = (REPO / "engine" / "README.md").read_text()
    listed = set()
    for result, nb, render, stages, commands, flags in rows:
        name = nb.strip("`")
        listed.add(name)
        assert (REPO / "notebooks" / f"{name}.ipynb").is_file() and (REPO / "notebooks" / f"{name}.py").is_file(), name
        assert render.strip("`") in rules, render
        for part in stages.split(";"):
            stage, _, stage_rules = part.strip().partition(":")
            assert (REPO / "workflow" / "rules" / f"{stage}.smk").is_file() and stage in groups, stage
            assert (REPO / "src" / "ostinato" / stage).is_dir(), stage
            for r in re.findall(r"`(\w+)`", stage_rules):
                assert r in rules, r
                smk = (REPO / "workflow" / "rules" / f"{stage}.smk").read_text()
                assert f"rule {r}:" in smk, f"rule {r} is not in {stage}.smk"
        for c in re.findall(r"`ostinato (\w+)`", commands):
            assert c in groups, c
        for flag in re.findall(r"`(--[\w-]+)`", flags):
            assert f"`{flag}" in engine_doc, f"engine flag {flag} is not documented in engine/README.md"
    assert listed == {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}


def test_rules_write_under_their_stage():
    """Every rule of workflow/rules/<stage>.smk logs under results/<stage>/ (one stage name everywhere)."""
    import re

    for f in (REPO / "workflow" / "rules").glob("*.smk"):
        if f.stem == "common":
            continue
        for rule, body in re.findall(r"^rule (\w+):\n((?:    .*\n|\n)*)", f.read_text(), re.M):
            log = re.search(r"log:\n\s+\"([^\"]+)\"", body)
            assert log, f"{f.name}: rule {rule} has no log"
            assert log.group(1).startswith(f"results/{f.stem}/"), f"{f.name}: rule {rule} logs to {log.group(1)}"


def test_result_figures_carry_the_load_note(tmp_path):
    """Each result figure says, per measured series, how many sessions ran under foreign load or unsampled, and names
    the correctness runs it leaves out; the simulator gets no line."""
    from ostinato.figures.notebook import ResultNotebook, ResultParams

    s, r = write_replay(tmp_path, extra={"load_flag": "clean"})
    ses = pd.read_csv(s)
    ses.loc[0, "load_flag"], ses.loc[1, "load_flag"] = "foreign load", "unknown"
    ses.to_csv(s, index=False)
    ref = load_measured(*write_replay(tmp_path, stem="ref"), machine="h200, reference")
    cs, cr = write_replay(tmp_path, stem="cpu", machine="vm", extra=CPU_ONLY)
    speed, checks = split_correctness(combine(load_measured(s, r), ref, load_measured(cs, cr),
                                              load_simulated(*write_sim(tmp_path), profile="p")))
    nb = ResultNotebook("table3", ResultParams(figures_dir=str(tmp_path / "figures")), speed, checks)
    assert nb.load_note().splitlines() == [
        "measured (cpu-2c): 1 of 8 sessions under foreign load, 1 of 8 sessions without load samples (foreign load unknown)",
        "measured (h200, reference): all sessions without load samples (foreign load unknown)",
        "measured (vm): CPU-only replay, a correctness run: not among the speed series (Table 3 shows it in a panel of its own)"]
    import matplotlib.pyplot as plt
    fig, _ = plt.subplots()
    nb.save_figure(fig)
    assert any(t.get_text() == nb.load_note() for t in fig.texts) and (tmp_path / "figures" / "table3.png").is_file()
    plt.close(fig)
