"""Benchmark helpers: cold routes per placement and the ratio summary (no engine needed)."""

from __future__ import annotations

import numpy as np
import pytest

from ostinato.sweep.cold import cold_per_token_layer, whole_layer_hot
from ostinato.sweep.prefill import BenchPlan, BenchRow, decode_step_breakdown, read_rows, summarize, write_rows
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
    p = BenchPlan(prefixes=(10, 16), sizes=(3, 5), n_decode=4, reps=2, vocab_hi=200, seed=3)
    assert p.tokens() == p.tokens()
    prefix, new, forced = p.tokens()
    assert (len(prefix), len(new[3]), len(new[5]), len(forced)) == (16, 3, 5, 4)  # the longest; 10 takes its head
    assert new[3][0] != new[5][0]  # only the prefix is shared between sizes
    assert not {new[3][0], new[5][0]} & set(prefix)  # a size's new tokens never continue a prefix
    assert p.n_pos == 16 + 5 + 4 + 1


def _rows(engine: str, scale: float, prefix: int = 64) -> list[BenchRow]:
    rows = [BenchRow(engine, -1, "prefix", prefix, prefix, 1, 9.0, 9.0, None, prefix, 1.0, None)]
    for rep in range(4):
        jitter = 1 + 0.01 * rep
        rows.append(BenchRow(engine, rep, "prefill", prefix, 128, 1, scale * jitter, scale * jitter, None, 128, 1.0,
                             None))
        rows.append(BenchRow(engine, rep, "decode", prefix, 2048, 16, 0.1, 1.0, scale * 0.01 * jitter, 1, 1.0, 10.0))
    return rows


def test_summary_ratio_and_interval():
    summ = summarize(_rows("base", 2.0) + _rows("fast", 1.0), "base", n_resamples=200)
    fast = {(r["kind"], r["n_new"]): r for r in summ if r["engine"] == "fast"}
    assert fast[("prefill", 128)]["ratio"] == pytest.approx(0.5)
    assert fast[("decode", "")]["ratio"] == pytest.approx(0.5)
    lo, hi = fast[("prefill", 128)]["ratio_ci_low"], fast[("prefill", 128)]["ratio_ci_high"]
    assert lo <= 0.5 + 1e-9 and hi >= 0.5 - 1e-9
    assert all("ratio" not in r for r in summ if r["engine"] == "base")
    assert {r["kind"] for r in summ} == {"prefill", "decode"}  # the prefix's own prefill is not a sweep size


def test_summary_keeps_prefixes_apart():
    """Each prefix is its own case: a ratio compares the engines after the same prefix only."""
    rows = _rows("base", 2.0, 64) + _rows("fast", 1.0, 64) + _rows("base", 2.0, 256) + _rows("fast", 1.5, 256)
    summ = summarize(rows, "base", n_resamples=200)
    fast = {(r["prefix"], r["kind"], r["n_new"]): r for r in summ if r["engine"] == "fast"}
    assert set(fast) == {(64, "prefill", 128), (64, "decode", ""), (256, "prefill", 128), (256, "decode", "")}
    assert fast[(64, "prefill", 128)]["ratio"] == pytest.approx(0.5)
    assert fast[(256, "prefill", 128)]["ratio"] == pytest.approx(0.75)
    assert fast[(256, "decode", "")]["reps"] == 4


def test_rows_read_back_as_written_and_summarize_against_another_engine(tmp_path):
    """`read_rows` gives back what `write_rows` wrote (None for empty cells, errors kept), so a run in reversed engine
    order can be summarized against the first run's baseline from its rows.csv."""
    rows = _rows("fast", 1.0) + _rows("base", 2.0)
    rows.append(BenchRow("fast", 9, "prefill", 64, 128, 0, None, None, None, None, None, None, error="HTTP 500"))
    write_rows(tmp_path / "rows.csv", rows)
    back = read_rows(tmp_path / "rows.csv")
    assert back == rows
    fast = {(r["kind"], r["n_new"]): r for r in summarize(back, "base", n_resamples=200) if r["engine"] == "fast"}
    assert fast[("prefill", 128)]["ratio"] == pytest.approx(0.5) and fast[("prefill", 128)]["ratio_to"] == "base"


def test_summary_leaves_out_prefills_the_server_found_cached():
    """With one size, each round after the first sends the prompt that the decode before it sent: the server prefills
    one token, so that round measured no prefill of its size and the summary keeps the rounds that did."""
    rows = _rows("base", 2.0)
    for r in rows:
        if r.kind == "prefill" and r.rep > 0:
            r.prompt_n, r.ttft_s = 1, 0.03
    pre = [r for r in summarize(rows, "base", n_resamples=200) if r["kind"] == "prefill"]
    assert len(pre) == 1 and pre[0]["reps"] == 1 and pre[0]["median_s"] == pytest.approx(2.0)


def test_decode_step_breakdown_sums_layers_and_keeps_only_one_token_passes():
    """A step's branches are summed over its layers; the per-layer larger branch bounds overlapped branches; a prompt
    pass (its last layer computes one row, the others more) is no decode step."""
    t = lambda p, layer, n, c, g, cpu: {"pass": p, "layer": layer, "n_tokens": n, "n_cold": c,  # noqa: E731
                                       "gpu_ms": g, "cpu_ms": cpu}
    got = decode_step_breakdown([t(7, 0, 4, 3, 0.2, 0.9), t(7, 1, 1, 1, 0.1, 0.3),          # prompt pass
                               t(8, 0, 1, 2, 0.1, 0.5), t(8, 1, 1, 0, 0.3, 0.1),          # step 1
                               t(9, 0, 1, 1, 0.1, 0.2), t(9, 1, 1, 1, 0.1, 0.4)])         # step 2
    assert got["timer_steps"] == 2
    assert got["gpu_ms_step"] == pytest.approx((0.4 + 0.2) / 2)
    assert got["cpu_ms_step"] == pytest.approx((0.6 + 0.6) / 2)
    assert got["branch_bound_ms_step"] == pytest.approx((0.5 + 0.3 + 0.2 + 0.4) / 2)
    assert got["cold_routes_step"] == pytest.approx(2.0)
    assert decode_step_breakdown([t(7, 0, 4, 3, 0.2, 0.9)]) is None


def test_summary_gives_the_timed_branches_and_the_borrow_costs_per_step():
    """Decode rows with the engine's timers and borrowed memory's counters: weighted by steps in the summary, and what
    else a step takes is its median time less both branches."""
    rows = _rows("base", 2.0)
    for r, (steps, gpu, cpu) in zip([r for r in rows if r.kind == "decode"], [(10, 1.0, 3.0), (30, 2.0, 3.0)] * 2):
        r.timer_steps, r.gpu_ms_step, r.cpu_ms_step, r.branch_bound_ms_step, r.cold_routes_step = (
            steps, gpu, cpu, cpu, 8.0)
        r.borrow_steps, r.borrow_steps_hit, r.borrow_hits = steps, steps, 2 * steps
        r.borrow_admissions, r.borrow_evictions, r.borrow_copy_ms, r.borrow_wait_ms = steps, 0, 0.5 * steps, 0.1 * steps
    dec = [r for r in summarize(rows, "base", n_resamples=200) if r["kind"] == "decode"][0]
    assert dec["timer_steps"] == 80 and dec["gpu_ms_per_step"] == pytest.approx(1.75)
    assert dec["cpu_ms_per_step"] == pytest.approx(3.0) and dec["branch_bound_ms_per_step"] == pytest.approx(3.0)
    assert dec["other_ms_per_step"] == pytest.approx(dec["median_s"] * 1e3 - 4.75)
    assert dec["borrow_admissions_per_step"] == pytest.approx(1.0)
    assert dec["borrow_copy_ms_per_step"] == pytest.approx(0.5) and dec["borrow_wait_ms_per_step"] == pytest.approx(0.1)


def test_summary_gives_the_cpu_workers_time_per_decode_step():
    """Decode rows of one graph per decode step: the worker's time over the requests' decode steps (a request of n
    tokens computes n - 1 of them), and the share of its layers that had no cold route; rows without counters add
    nothing."""
    from ostinato.sweep.prefill import _graph_step, worker_bound

    rows = _rows("base", 2.0)
    dec = [r for r in rows if r.kind == "decode"]
    for r, (n, branches, skipped, ms) in zip(dec, [(5, 32, 8, 4.0), (9, 64, 8, 12.0), (5, None, None, None)]):
        r.n_output, r.worker_branches, r.worker_skipped, r.worker_ms = n, branches, skipped, ms
        r.worker_wait_ms = None if ms is None else ms / 2
    got = [r for r in summarize(rows, "base", n_resamples=200) if r["kind"] == "decode"][0]
    assert got["worker_ms_per_step"] == pytest.approx(16.0 / 12)
    assert got["worker_wait_ms_per_step"] == pytest.approx(8.0 / 12)
    assert got["worker_skipped_share"] == pytest.approx(16 / 96)
    assert "worker_routes_per_step" not in got  # rows of an engine without the breakdown
    assert "worker_bound_ms_per_step" not in got  # nor the device's own time (an engine before GET /residency's gpu_ms)
    for r, gpu in zip(dec, (1.0, 5.0, None)):
        r.worker_gpu_ms = gpu
    got = [r for r in summarize(rows, "base", n_resamples=200) if r["kind"] == "decode"][0]
    step = got["median_s"] * 1e3
    assert got["worker_gpu_ms_per_step"] == pytest.approx(0.5)
    # the rest of a step: less the device's own work and its waits; at best the larger branch (here the worker's)
    assert got["worker_rest_ms_per_step"] == pytest.approx(step - 0.5 - 8.0 / 12)
    assert got["worker_bound_ms_per_step"] == pytest.approx(step - 0.5 - 8.0 / 12 + 16.0 / 12)
    assert got["worker_bound_ratio"] == pytest.approx(step / got["worker_bound_ms_per_step"])
    # a GPU branch longer than the worker's: the bound takes it
    assert worker_bound(10.0, 4.0, 0.5, 3.0) == {"worker_gpu_ms_per_step": 4.0, "worker_rest_ms_per_step": 5.5,
                                                 "worker_bound_ms_per_step": 9.5,
                                                 "worker_bound_ratio": pytest.approx(10.0 / 9.5)}
    assert _graph_step(["-t", "4", "--residency-graph", "step"])
    assert not _graph_step(["--residency-graph", "step", "--residency-graph", "segments"])
    assert not _graph_step(["--residency-graph"]) and not _graph_step([])


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
    # a two-engine run after two prefixes (the second's times scaled), as `ostinato sweep --prefix 3072,8192` writes
    two = [r for r in mine["rows"] if r["engine"] != "llama.cpp-cpu-experts"]
    mine["rows"] = [{**r, "prefix": 3072} for r in two] + [
        {**r, "prefix": 8192, "median_s": 1.5 * r["median_s"]} for r in two]
    mine["meta"]["prefixes"] = [3072, 8192]
    # and the floor, every expert on the GPU beyond the sweep's budget (its times those of layers, halved)
    mine["rows"] += [{**r, "engine": "llama.cpp-gpu-experts", "median_s": r["median_s"] / 2} for r in mine["rows"]
                     if r["engine"] == "llama.cpp-layers"]
    mine["meta"]["beyond_budget"] = ["llama.cpp-gpu-experts"]
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
    ci = t[(t["series"] == "measured (ci)") & (t["engine"] == "ostinato")].set_index(["prefix", "n_new"])
    row = next(r for r in mine["rows"] if r["engine"] == "ostinato" and r["n_new"] == 256)
    assert ci.loc[(3072, 256), "ratio"] == pytest.approx(row["ratio"])
    assert ci.loc[(8192, 256), "median_s"] == pytest.approx(1.5 * row["median_s"])
    assert set(t[t["series"] == "measured (ci)"]["engine"]) == {"ostinato", "llama.cpp-layers", "llama.cpp-gpu-experts"}
    memory = t[t["series"] == "measured (ci)"].groupby("engine")["memory"].unique()
    assert list(memory["llama.cpp-gpu-experts"]) == ["every expert on the GPU"] and list(memory["ostinato"]) == ["equal"]
    ref_rows = t[t["series"] == "measured (h200, reference)"]
    assert set(ref_rows["prefix"]) == {3072}  # an older summary of one prefix names it in its meta
    assert (tmp_path / "figures/fig7b.png").stat().st_size > 0


def test_fig7b_notebook_twin_in_sync():
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    nb = json.loads((repo / "notebooks/fig7b.ipynb").read_text())
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]) == 1
    text = (repo / "notebooks/fig7b.py").read_text()
    assert all("".join(c["source"]) in text for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.slow  # three servers on the CPU build
def test_sweep_cli_after_two_prefixes_on_the_cpu_build(engine_variants, tiny_v4_model, llama_tree, tmp_path):
    """`ostinato sweep --prefix A,B`: every engine measures every size after each prefix in one server, and each
    request prefills exactly its new tokens (the server reuses the prefix; a longer prefix extends a shorter one)."""
    import argparse
    import json

    import pandas as pd

    from ostinato.sweep import cli as sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.register(parser.add_subparsers(dest="group"))
    out = tmp_path / "sweep"
    engines = "llama.cpp-layers,ostinato,ostinato-overlap,ostinato-borrow"
    a = parser.parse_args(["sweep", "--model", str(tiny_v4_model), "--llama-tree", str(llama_tree),
                           "--variants-dir", str(engine_variants["ostinato"].parents[1]), "--engines", engines,
                           "--prefix", "64,160", "--sizes", "8,24", "--decode", "6", "--reps", "1", "--threads", "2",
                           "--ctx", "512", "--dev-sessions", "2", "--dev-tokens", "256", "--no-progress",
                           "--out", str(out)])
    assert a.func(a) == 0
    rows = pd.read_csv(out / "rows.csv")
    assert rows["error"].isna().all(), rows["error"].dropna().tolist()
    pre = rows[rows["kind"] == "prefill"]
    assert sorted(set(zip(pre["engine"], pre["prefix"], pre["n_new"]))) == sorted(
        (e, p, n) for e in engines.split(",") for p in (64, 160) for n in (8, 24))
    assert (pre["prompt_n"] == pre["n_new"]).all()  # only the new tokens are prefilled after the cached prefix
    primes = rows[rows["kind"] == "prefix"].set_index(["engine", "prefix"])["prompt_n"]
    assert (primes.xs(64, level="prefix") == 64).all() and (primes.xs(160, level="prefix") <= 160 - 64 + 1).all()
    summ = json.loads((out / "summary.json").read_text())
    assert summ["meta"]["prefixes"] == [64, 160]
    dec = [r for r in summ["rows"] if r["kind"] == "decode"]
    assert sorted((r["engine"], r["prefix"]) for r in dec) == sorted(
        (e, p) for e in engines.split(",") for p in (64, 160))
    # borrowed memory: the server's counters over each decode request (its decode steps; the others count none)
    drows = rows[rows["kind"] == "decode"]
    bor = drows[drows["engine"] == "ostinato-borrow"]
    assert len(bor) == 2 and bor["borrow_steps"].isin([5, 6]).all(), bor
    assert (bor["borrow_hits"] >= bor["borrow_steps_hit"]).all() and (bor["borrow_steps_hit"] <= bor["borrow_steps"]).all()
    assert drows[drows["engine"] != "ostinato-borrow"]["borrow_steps"].isna().all()
    assert all(("borrow_hits_per_step" in r) == (r["engine"] == "ostinato-borrow") for r in dec)
    cold = json.loads((out / "cold.json").read_text())
    assert set(cold["by_prefix"]) == {"64", "160"} and cold["placements"] == cold["by_prefix"]["64"]
    with pytest.raises(ValueError, match="--prefix"):
        b = parser.parse_args(["sweep", "--model", str(tiny_v4_model), "--llama-tree", str(llama_tree),
                               "--variants-dir", ".", "--prefix", "64,64", "--out", str(tmp_path / "x")])
        b.func(b)


def _run_sweep_cli(engine_variants, model, llama_tree, out, engines: str, *extra: str):
    """`ostinato sweep` on a tiny model, short and two rounds, `engines` against the first; its rows (all without
    error)."""
    import argparse

    import pandas as pd

    from ostinato.sweep import cli as sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.register(parser.add_subparsers(dest="group"))
    a = parser.parse_args(["sweep", "--model", str(model), "--llama-tree", str(llama_tree),
                           "--variants-dir", str(engine_variants["ostinato"].parents[1]),
                           "--engines", engines, "--baseline", engines.split(",")[0],
                           "--prefix", "64", "--sizes", "8", "--decode", "6", "--reps", "2", "--threads", "2",
                           "--ctx", "512", "--dev-sessions", "2", "--dev-tokens", "256", "--no-progress",
                           *extra, "--out", str(out)])
    assert a.func(a) == 0
    rows = pd.read_csv(out / "rows.csv")
    assert rows["error"].isna().all(), rows["error"].dropna().tolist()
    return rows


@pytest.mark.slow  # two servers on the CPU build
def test_sweep_cli_with_the_engine_timers_breaks_decode_steps_down(engine_variants, tiny_v4_model, llama_tree, tmp_path):
    """`ostinato sweep --server-arg --residency-timers`: each decode row has the engine's timings of its decode steps
    (one per generated token after the first pass) and, with borrowed memory, its copies and waits; the summary gives
    them per step."""
    import json

    out = tmp_path / "sweep"
    rows = _run_sweep_cli(engine_variants, tiny_v4_model, llama_tree, out, "ostinato-overlap,ostinato-borrow",
                          "--server-arg=--residency-timers")
    dec = rows[rows["kind"] == "decode"]
    assert len(dec) == 4 and dec["timer_steps"].isin([5, 6]).all(), dec
    assert (dec["cpu_ms_step"] > 0).all() and (dec["gpu_ms_step"] > 0).all()
    assert (dec["branch_bound_ms_step"] <= dec["gpu_ms_step"] + dec["cpu_ms_step"] + 1e-9).all()
    assert (dec["branch_bound_ms_step"] >= dec[["gpu_ms_step", "cpu_ms_step"]].max(axis=1) - 1e-9).all()
    bor = dec[dec["engine"] == "ostinato-borrow"]
    assert bor["borrow_admissions"].sum() >= 1 and (bor["borrow_admissions"] >= 0).all()
    assert (bor["borrow_copy_ms"] >= 0).all() and (bor["borrow_wait_ms"] >= 0).all()
    assert dec[dec["engine"] == "ostinato-overlap"]["borrow_admissions"].isna().all()
    # borrowed experts take cold routes off the CPU branch: fewer timed cold routes per step than without
    by = dec.groupby("engine")["cold_routes_step"].mean()
    assert by["ostinato-borrow"] < by["ostinato-overlap"], by
    summ = {r["engine"]: r for r in json.loads((out / "summary.json").read_text())["rows"] if r["kind"] == "decode"}
    assert summ["ostinato-borrow"]["timer_steps"] == bor["timer_steps"].sum()
    assert {"borrow_copy_ms_per_step", "borrow_wait_ms_per_step", "other_ms_per_step"} <= set(summ["ostinato-borrow"])


@pytest.mark.slow  # two servers on the CPU build
def test_sweep_cli_runs_the_borrow_parameters_chosen_on_development_sessions(engine_variants, tiny_v4_model, llama_tree,
                                                                           tmp_path):
    """`ostinato sweep --borrow-params`: both presets with borrowed memory start with the slots, decay, margin and
    copies per step that `ostinato residency borrow-tune` chose (not the engine's defaults), and the summary says which."""
    import gzip
    import json

    chosen = {"slots": 3, "decay": 0.99, "margin": 1.0, "admit": 1, "hit_share": 0.5, "steps_hit_share": 0.5}
    tuned = tmp_path / "borrow.json"
    tuned.write_text(json.dumps({"chosen": chosen, "grid": []}))
    out = tmp_path / "sweep"
    rows = _run_sweep_cli(engine_variants, tiny_v4_model, llama_tree, out, "ostinato-borrow,ostinato-graph-borrow",
                          "--borrow-params", str(tuned))
    for name in ("ostinato-borrow", "ostinato-graph-borrow"):
        log = out / f"server-{name}.log"
        text = gzip.decompress(log.read_bytes()).decode() if log.suffix == ".gz" else log.read_text()
        assert "borrow 3 staging slots" in text and "(decay 0.99, margin 1, 1 copies per pool and step)" in text, name
    dec = rows[rows["kind"] == "decode"]
    assert len(dec) == 4 and (dec["borrow_admissions"] <= dec["borrow_steps"]).all(), dec  # one copy per step at most
    assert json.loads((out / "summary.json").read_text())["meta"]["borrow_params"] == chosen


def test_the_workers_cost_per_cold_route_is_fitted_over_its_layers():
    """The worker's breakdown by cold routes: a request's counters less those before it, and alpha + beta * r fitted
    over the layers with cold routes (r = 0 layers compute nothing and stay out), from the rows' JSON in the summary."""
    import json

    from ostinato.sweep.prefill import by_routes_delta, fit_worker_cost

    assert by_routes_delta([[0, 4, 0.0], [1, 2, 1.0]], [[0, 4, 0.0], [1, 5, 2.5], [2, 1, 0.9]]) == [[1, 3, 1.5], [2, 1, 0.9]]
    # layers at r = 1 take 0.5 ms, at r = 3 take 0.9 ms: alpha 0.3, beta 0.2 (exact), whatever the layers per r
    fit = fit_worker_cost([[0, 7, 0.0], [1, 4, 2.0], [3, 2, 1.8]])
    assert fit["worker_alpha_ms"] == pytest.approx(0.3) and fit["worker_beta_ms"] == pytest.approx(0.2)
    assert fit["worker_fit_layers"] == 6
    assert fit_worker_cost([[2, 3, 1.2]]) == {"worker_alpha_ms": 0.0, "worker_beta_ms": pytest.approx(0.2),
                                              "worker_fit_layers": 3}
    assert fit_worker_cost([[0, 3, 0.0]]) == {}
    rows = _rows("base", 2.0)
    dec = [r for r in rows if r.kind == "decode"]
    for r, by in zip(dec, ([[0, 2, 0.0], [1, 4, 2.0]], [[3, 2, 1.8]], [[1, 1, 9.0]])):
        r.n_output, r.worker_branches, r.worker_skipped, r.worker_ms, r.worker_wait_ms = 5, 6, 2, 4.0, 3.0
        r.worker_routes, r.worker_compute_ms = sum(k * n for k, n, _ in by), sum(ms for *_, ms in by)
        r.worker_by_routes = json.dumps(by)
    dec[2].worker_branches = None  # a row without counters adds nothing
    got = [r for r in summarize(rows, "base", n_resamples=200) if r["kind"] == "decode"][0]
    assert got["worker_routes_per_step"] == pytest.approx(10 / 8) and got["worker_compute_ms_per_step"] == pytest.approx(3.8 / 8)
    assert got["worker_alpha_ms"] == pytest.approx(0.3) and got["worker_beta_ms"] == pytest.approx(0.2)


def test_sweep_cli_gives_the_cpu_workers_time_with_one_graph_per_decode_step(engine_variants, tiny_v4_model, llama_tree,
                                                                             tmp_path):
    """`ostinato sweep --engines ...,ostinato-graph`: the decode rows of one graph per decode step carry the worker's
    counters (one answer per MoE layer and decode step), the other engine's none; the summary gives its time per step."""
    import json

    out = tmp_path / "sweep"
    rows = _run_sweep_cli(engine_variants, tiny_v4_model, llama_tree, out, "ostinato-overlap,ostinato-graph")
    dec = rows[rows["kind"] == "decode"]
    step = dec[dec["engine"] == "ostinato-graph"]
    assert len(step) == 2 and (step["worker_branches"] > 0).all(), step
    assert (step["worker_branches"] % (step["n_output"] - 1) == 0).all(), step  # every MoE layer of every step
    assert (step["worker_skipped"] <= step["worker_branches"]).all() and (step["worker_ms"] > 0).all()
    assert (step["worker_wait_ms"] >= 0).all(), step
    # the device's own work between each hand-over and its receive, by its clock: within the request's decode
    assert ((step["worker_gpu_ms"] > 0) & (step["worker_gpu_ms"] + step["worker_wait_ms"] <= step["latency_s"] * 1e3)).all(), step
    assert (step["worker_routes"] >= step["worker_branches"] - step["worker_skipped"]).all(), step
    assert ((step["worker_compute_ms"] > 0) & (step["worker_compute_ms"] <= step["worker_ms"])).all(), step
    for by, branches in zip(step["worker_by_routes"], step["worker_branches"]):
        assert sum(n for _, n, _ in json.loads(by)) == branches, by
    assert dec[dec["engine"] == "ostinato-overlap"]["worker_branches"].isna().all()
    summ = {r["engine"]: r for r in json.loads((out / "summary.json").read_text())["rows"] if r["kind"] == "decode"}
    assert summ["ostinato-graph"]["worker_ms_per_step"] > 0 and "worker_ms_per_step" not in summ["ostinato-overlap"]
    assert summ["ostinato-graph"]["worker_beta_ms"] > 0 and summ["ostinato-graph"]["worker_fit_layers"] > 0
    assert summ["ostinato-graph"]["worker_bound_ms_per_step"] > 0 and summ["ostinato-graph"]["worker_bound_ratio"] > 0


def test_the_floor_keeps_every_expert_on_the_gpu():
    """llama.cpp-gpu-experts in a sweep: no cold route, every expert resident (whatever the sweep's budget)."""
    from types import SimpleNamespace

    from ostinato.sweep.cold import cold_routes_of

    t = _trace()  # 3 layers, MoE layers 1 and 2, 4 experts
    shape = SimpleNamespace(n_layer=3, n_expert=4, moe_layers=lambda: [1, 2])
    floor = cold_routes_of("llama.cpp-gpu-experts", t, shape, 0, {}, (0, 1), (1, 2))
    assert floor == {"prefill": 0.0, "decode": 0.0, "resident_experts": 8}
    layers = cold_routes_of("llama.cpp-layers", t, shape, 1, {}, (0, 1), (1, 2))
    assert layers["resident_experts"] == 4 and layers["decode"] == 1.0


@pytest.mark.slow  # two servers on the CPU build
def test_sweep_cli_runs_the_floor_beyond_the_budget(engine_variants, tiny_v4_model, llama_tree, tmp_path):
    """`ostinato sweep --engines llama.cpp-layers,llama.cpp-gpu-experts`: the floor runs with every expert on the GPU
    although the sweep's budget holds half of them, and the summary's meta says it ran beyond the budget."""
    import json

    out = tmp_path / "sweep"
    rows = _run_sweep_cli(engine_variants, tiny_v4_model, llama_tree, out, "llama.cpp-layers,llama.cpp-gpu-experts")
    assert set(rows["engine"]) == {"llama.cpp-layers", "llama.cpp-gpu-experts"}
    summ = json.loads((out / "summary.json").read_text())
    assert summ["meta"]["beyond_budget"] == ["llama.cpp-gpu-experts"]
    cold = json.loads((out / "cold.json").read_text())["placements"]
    assert cold["llama.cpp-gpu-experts"]["decode"] == 0 and cold["llama.cpp-layers"]["decode"] > 0
    assert cold["llama.cpp-gpu-experts"]["resident_experts"] == 2 * cold["llama.cpp-layers"]["resident_experts"]
    assert any(r["engine"] == "llama.cpp-gpu-experts" and r["kind"] == "decode" and "ratio" in r for r in summ["rows"])
