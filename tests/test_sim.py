"""Simulator: pass splitting, hand-computed request times per policy, Eq. (1) in decode, sessions tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ostinato.costmodel.decode import LayerCosts, cold_routes, eq1_step_ms, mu_q
from ostinato.costmodel.params import BranchCosts, load_profile
from ostinato.sim.session import Request, pass_sizes, simulate_session
from ostinato.sim.params import SimParams, paper_illustrative
from ostinato.residency.borrow import BorrowParams
from ostinato.sim.policies import (buun, llama_expert_cache, llama_layers, ostinato, ostinato_borrow,
                                   resident_native, static_per_layer)
from ostinato.sim.run import read_sessions, simulate

C = LayerCosts.uniform(2, BranchCosts(0.12, 0.14, 0.184, 0.137))
P = SimParams(decode_other_ms=10.0, prefill_token_ms=1.0, prefill_pass_ms=5.0, cpu_route_ms=0.02,
              cpu_layer_ms=0.1, gpu_route_ms=0.001, upload_expert_ms=0.5, n_ubatch=8, upload_min=4,
              cache_max_pass=2)


def test_pass_sizes() -> None:
    p = SimParams(1, 1, 1, 1, 1, 1, 1, n_ubatch=2048, checkpoint_tail=4)
    assert pass_sizes(516, p) == [512, 4]
    assert pass_sizes(5000, p) == [2048, 2048, 900, 4]
    assert pass_sizes(1, p) == [1]
    assert pass_sizes(10, SimParams(1, 1, 1, 1, 1, 1, 1, n_ubatch=4)) == [4, 4, 2]


def _ids() -> np.ndarray:
    # 2 layers, 4 experts, k = 2; positions: 3 new tokens, then 3 outputs (2 decode steps)
    return np.array([[[0, 1], [0, 2]], [[0, 2], [1, 2]], [[1, 3], [0, 1]],
                     [[0, 1], [0, 1]], [[2, 3], [0, 3]], [[0, 1], [2, 3]]])


HOT = np.array([[True, True, False, False], [True, False, False, False]])


def test_ostinato_split_path_and_overlapped_decode_by_hand() -> None:
    rows = simulate_session([Request("first", 3, 3)], _ids(), 4, ostinato(HOT), C, P)
    r = rows[0]
    # prefill: 3 tokens < Np = 4 -> split path; cold routes: layer 0 -> (0,2),(1,3): 2 and 3 cold -> {2, 3 at pos1/2}
    cold = cold_routes(_ids()[:3], HOT).sum(axis=0)
    assert cold.tolist() == [2, 4]
    expect = 5 + 3 * 1 + sum(0.1 + 0.02 * x + 0.001 * (6 - x) for x in cold)
    assert r["prefill_ms"] == pytest.approx(expect) and r["ttft_ms"] == r["prefill_ms"]
    # decode: steps feed outputs 0 and 1 (positions 3, 4); per step 10 + sum max(C(r), G)
    rd = cold_routes(_ids()[3:5], HOT)
    mu, q = mu_q(rd)
    assert r["decode_ms"] == pytest.approx(2 * 10 + 2 * eq1_step_ms(mu, q, C))
    assert r["tpot_ms"] == pytest.approx(r["decode_ms"] / 2)


def test_upload_path_counts_distinct_cold_experts() -> None:
    ids = _ids()
    rows = simulate_session([Request("first", 4, 1)], ids, 4, ostinato(HOT), C, P)
    # 4 tokens >= Np: distinct cold experts of positions 0-3: layer 0 {2, 3}, layer 1 {2, 1} -> 4 uploads
    assert rows[0]["prefill_ms"] == pytest.approx(5 + 4 + 4 * 0.5 + 2 * 0.001 * 8)
    assert rows[0]["decode_ms"] == 0 and np.isnan(rows[0]["tpot_ms"])


def test_native_prefill_ignores_resident_experts_and_inturn_decode() -> None:
    rows = simulate_session([Request("first", 3, 3)], _ids(), 4, resident_native(HOT, overlap=False), C, P)
    assert rows[0]["prefill_ms"] == pytest.approx(5 + 3 + 2 * (0.1 + 0.02 * 6))
    rd = cold_routes(_ids()[3:5], HOT)
    assert rows[0]["decode_ms"] == pytest.approx(20 + (C.cpu(rd) + C.gpu).sum())


def test_layers_policy() -> None:
    rows = simulate_session([Request("first", 3, 3)], _ids(), 4, llama_layers(np.array([True, False])), C, P)
    # prefill: layer 0 on the GPU (no cold routes), layer 1 all 6 routes on the CPU
    assert rows[0]["prefill_ms"] == pytest.approx(5 + 3 + 0.001 * 6 + (0.1 + 0.02 * 6))
    assert rows[0]["decode_ms"] == pytest.approx(2 * (10 + 0.137 + 0.14 + 0.184 * 2))


def test_lru_cache_serves_small_passes_only() -> None:
    ids = _ids()
    rows = simulate_session([Request("first", 3, 3)], ids, 4, llama_expert_cache(HOT), C, P)
    # prefill of 3 tokens > cache_max_pass = 2: all routes on the CPU
    assert rows[0]["prefill_ms"] == pytest.approx(5 + 3 + 2 * (0.1 + 0.02 * 6))
    # the cache starts with HOT in plan order (L0:0, L0:1, L1:0), least recently used first.
    # decode step 1 (pos 3): L0:0, L0:1 hit; L1:0 hits, L1:1 misses and evicts L0:0 -> 1 miss;
    # step 2 (pos 4): L0:2, L0:3 miss (evict L0:1, L1:0), L1:0, L1:3 miss (evict L1:1, L0:2) -> 4 misses
    t1 = 10 + 1 * 0.5 + 2 * 0.137
    t2 = 10 + 2 * 0.5 + 2 * 0.5 + 2 * 0.137
    assert rows[0]["decode_ms"] == pytest.approx(t1 + t2)


def test_buun_admits_and_kv_reuse_positions() -> None:
    rng = np.random.default_rng(0)
    ids = np.stack([np.argsort(rng.random((300, 4)) * np.array([1, 1, 4, 8]), axis=1)[:, :2] for _ in range(2)], axis=1)
    warm = np.array([[False, False, True, True]] * 2)     # warmed with the wrong experts
    pol = buun(warm)
    reqs = [Request("first", 5, 100), Request("tool", 10, 150)]
    rows = simulate_session(reqs, ids, 4, pol, C, P)
    assert len(rows) == 2 and rows[1]["decode_ms"] > 0
    static = simulate_session(reqs, ids, 4, static_per_layer(warm), C, P)
    assert sum(r["decode_ms"] for r in rows) < sum(r["decode_ms"] for r in static)  # the cache adapts
    with pytest.raises(ValueError, match="positions"):
        simulate_session([Request("first", 400, 10)], ids, 4, pol, C, P)


def test_simulate_tables_and_read_sessions(tmp_path) -> None:
    lines = [{"session": "swe/a", "requests": [{"kind": "first", "n_new": 3, "n_output": 2},
                                               {"kind": "tool", "n_new": 1, "n_output": 0}]}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ses = read_sessions(tmp_path / "s.jsonl")
    assert ses[0][0] == "swe/a" and ses[0][1][1] == Request("tool", 1, 0)
    req, tot = simulate(ses, {"swe/a": _ids()}, 4, [ostinato(HOT), resident_native(HOT)], C, P)
    assert len(req) == 4 and set(tot["engine"]) == {"ostinato", "ostinato-native-prefill-overlap"}
    o = tot[tot.engine == "ostinato"].iloc[0]
    assert o["total_s"] * 1e3 == pytest.approx(req[req.engine == "ostinato"]["total_ms"].sum())


def test_paper_illustrative_params() -> None:
    m = load_profile("paper-4x4090d").model("deepseek-v4-flash")
    p = paper_illustrative(m)
    assert p.upload_min == 512 and p.checkpoint_tail == 4 and p.upload_expert_ms == 1.20
    # the split-path slope it encodes: 1.5 + 0.935 L cpu + (k - 0.935) L gpu = 3.2 ms per token
    L, k = 43, 6
    assert 1.5 + 0.935 * L * p.cpu_route_ms + (k - 0.935) * L * p.gpu_route_ms == pytest.approx(3.2)
    assert p.gpu_route_ms > 0


def _toy_inputs(tmp_path) -> list[str]:
    """A 3-layer trace, its sessions as JSONL and as a trace manifest, a plan and simulator constants."""
    from ostinato.residency.planfile import PlanFile, write_plan
    from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace

    rng = np.random.default_rng(0)
    n_pos = 120
    ids = np.full((n_pos, 3, 2), 0xFF, dtype=np.uint8)
    for il in (1, 2):
        ids[:, il, :] = np.argsort(rng.random((n_pos, 8)), axis=1)[:, :2]
    write_trace(tmp_path / "swe__a.route", RoutingTrace(TraceShape(3, 8, 2), ids))
    lines = [{"session": "swe/a", "requests": [{"kind": "first", "n_new": 60, "n_output": 20},
                                               {"kind": "tool", "n_new": 10, "n_output": 30}]}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "manifest.json").write_text(json.dumps({"synthetic": True, "sessions": lines}))
    slots = [np.array([[1, 0], [1, 1], [1, 2]]), np.array([[2, 0], [2, 5]])]
    write_plan(tmp_path / "plan.json", PlanFile("toy", 3, 8, 2, [0, 13400000, 13400000], [[0, 1], [2]],
                                                [0, 0], slots))
    (tmp_path / "p.yaml").write_text("decode_other_ms: 10\nprefill_token_ms: 1\nprefill_pass_ms: 5\n"
                                     "cpu_route_ms: 0.02\ncpu_layer_ms: 0.1\ngpu_route_ms: 0.001\n"
                                     "upload_expert_ms: 0.5\nupload_min: 32\n")
    return ["sim", "run", "--routing-dir", str(tmp_path), "--plan", str(tmp_path / "plan.json"),
            "--sim-params", str(tmp_path / "p.yaml"), "--per-layer", "2", "--no-progress",
            "--out-requests", str(tmp_path / "r.csv"), "--out-sessions", str(tmp_path / "s.csv")]


def _sim_cli(argv: list[str]) -> int:
    import argparse

    from ostinato.sim import cli as sim_cli

    parser = argparse.ArgumentParser()
    sim_cli.register(parser.add_subparsers(dest="group"))
    a = parser.parse_args(argv)
    return a.func(a)


def test_cli_run(tmp_path) -> None:
    import pandas as pd

    argv = _toy_inputs(tmp_path)
    assert _sim_cli(argv + ["--sessions", str(tmp_path / "s.jsonl"), "--borrowed-slots", "2"]) == 0
    s = pd.read_csv(tmp_path / "s.csv")
    assert len(s) == 7 and (s["total_s"] > 0).all()
    # without --sessions the routing directory's manifest lists them: the same tables
    (tmp_path / "s.csv").rename(tmp_path / "s-jsonl.csv")
    assert _sim_cli(argv + ["--borrowed-slots", "2"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "s.csv"), pd.read_csv(tmp_path / "s-jsonl.csv"))
    # the engine's borrowed memory, with borrow-tune's parameters
    with pytest.raises(ValueError, match="ostinato-borrow needs --borrow-params"):
        _sim_cli(argv + ["--policies", "ostinato,ostinato-borrow"])
    (tmp_path / "b.json").write_text(json.dumps({"chosen": {"slots": 2}}))
    with pytest.raises(ValueError, match="b.json: expected .* 'chosen' holds slots, decay, margin and admit"):
        _sim_cli(argv + ["--policies", "ostinato-borrow", "--borrow-params", str(tmp_path / "b.json")])
    (tmp_path / "b.json").write_text(json.dumps({"chosen": {"slots": 99, "decay": 0.9, "margin": 0.5, "admit": 2}}))
    assert _sim_cli(argv + ["--policies", "ostinato,ostinato-borrow", "--borrow-params", str(tmp_path / "b.json")]) == 0
    s = pd.read_csv(tmp_path / "s.csv")
    assert set(s["engine"]) == {"ostinato", "ostinato-borrow"} and (s["total_s"] > 0).all()


def test_read_sessions_names_missing_keys(tmp_path) -> None:
    (tmp_path / "s.jsonl").write_text(json.dumps({"session": "swe/a", "requests": [{"kind": "first", "n_new": 3}]}))
    with pytest.raises(ValueError, match=r"s\.jsonl:1: session swe/a: key 'requests\[0\]': expected the keys"):
        read_sessions(tmp_path / "s.jsonl")
    (tmp_path / "manifest.json").write_text(json.dumps({"synthetic": True}))
    with pytest.raises(ValueError, match="manifest.json: key 'sessions': expected a non-empty list"):
        read_sessions(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
        read_sessions(tmp_path / "nothing.jsonl")


@pytest.mark.slow  # papermill starts a kernel
def test_validation_notebook_runs_under_papermill(tmp_path) -> None:
    """The validation notebook on a toy simulation: paper beside simulated, every engine relative to Ostinato."""
    import os
    import subprocess
    import sys

    import pandas as pd
    import yaml

    pytest.importorskip("papermill")
    repo = Path(__file__).resolve().parents[1]
    assert _sim_cli(_toy_inputs(tmp_path) + ["--params-out", str(tmp_path / "params.json")]) == 0
    from ostinato.cli import main as ostinato_main
    assert ostinato_main(["limit", "--trace", str(tmp_path / "swe__a.route"), "--sessions", str(tmp_path / "manifest.json"),
                          "--decode-only", "--slots", "3", "--initial-plan", str(tmp_path / "plan.json"),
                          "--read-gbps", "20", "--other-ms-from", str(tmp_path / "params.json"),
                          "--out", str(tmp_path / "limit.json")]) == 0
    lim = json.loads((tmp_path / "limit.json").read_text())
    assert lim["positions"] == 19 + 29 and lim["other_ms"] == 10 and lim["traces"][0]["session"] == "swe/a"
    params = {"sim_sessions": [str(tmp_path / "s.csv")], "sim_requests": [str(tmp_path / "r.csv")],
              "limit_json": [str(tmp_path / "limit.json")],
              "sim_sets": ["toy"], "workloads": ["SWE"], "profile": "paper-4x4090d", "checks_json": "",
              "table3_csv": str(repo / "data/paper/table3_heldout.csv"),
              "table7_csv": str(repo / "data/paper/table7_ttft_by_kind.csv"),
              "table8_csv": str(repo / "data/paper/table8_ablation.csv"),
              "figure7_csv": str(repo / "data/paper/figure7.csv"),
              "figures_dir": str(tmp_path / "figures"), "tables_dir": str(tmp_path / "tables")}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "papermill", str(repo / "notebooks/sim_validation.ipynb"),
                          str(tmp_path / "out.ipynb"), "-f", str(tmp_path / "params.yaml"), "-k", "python3"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    t = pd.read_csv(tmp_path / "tables/sim_validation.csv")
    assert set(t["series"]) == {"paper", "simulated (paper-4x4090d)"}
    sim = t[t["series"] == "simulated (paper-4x4090d)"].set_index("engine")
    assert sim.loc["ostinato", "total_rel"] == 1.0 and len(sim) == 5
    s = pd.read_csv(tmp_path / "s.csv").set_index("engine")["total_s"]
    assert sim.loc["llama.cpp-layers", "total_rel"] == pytest.approx(s["llama.cpp-layers"] / s["ostinato"])
    paper = t[t["series"] == "paper"].set_index("engine")
    assert paper.loc["llama.cpp-layers", "total_rel"] == pytest.approx(11880.4 / 7119.0)
    abl = pd.read_csv(tmp_path / "tables/sim_validation_ablation.csv")
    assert list(abl["step"]) == [1, 2, 3, 4, 5] and abl["simulated_rel_step1"].iloc[0] == 1.0
    r = pd.read_csv(tmp_path / "r.csv")
    f7 = pd.read_csv(tmp_path / "tables/sim_validation_fig7a.csv")
    assert list(f7["new_tokens"].unique()) == ["<128", "128-255", "256-511", "512-1023", ">=1024"]
    lay = f7[(f7["simulated_reference"] == "llama.cpp-layers") & (f7["new_tokens"] == "<128")].iloc[0]
    assert (lay["paper_change_low_pct"], lay["paper_change_high_pct"]) == (-25.2, -22.0)
    big = f7[(f7["simulated_reference"] == "llama.cpp-layers") & (f7["new_tokens"] == ">=1024")].iloc[0]
    assert big["paper_change_low_pct"] == pytest.approx((3.87 / 3.78 - 1) * 100)
    tool = r[(r["kind"] == "tool") & (r["n_new"] < 128)].groupby("engine")["ttft_ms"].median()
    assert lay["simulated_change_pct"] == pytest.approx((tool["ostinato"] / tool["llama.cpp-layers"] - 1) * 100)
    lt = pd.read_csv(tmp_path / "tables/sim_validation_limit.csv").set_index("engine")
    r = pd.read_csv(tmp_path / "r.csv")
    o = r[r["engine"] == "ostinato"]
    assert lt.loc["ostinato", "decode_ms_per_token"] == pytest.approx(o["decode_ms"].sum() / (19 + 29))
    assert lt.loc["ostinato", "x_limit"] == pytest.approx(lt.loc["ostinato", "decode_ms_per_token"]
                                                         / lim["traces"][0]["limit_ms_per_token"])
    for f in ("figures/sim_validation.pdf", "figures/sim_validation.png", "tables/sim_validation.md"):
        assert (tmp_path / f).stat().st_size > 0


def test_validation_notebook_twin_in_sync() -> None:
    repo = Path(__file__).resolve().parents[1]
    nb = json.loads((repo / "notebooks/sim_validation.ipynb").read_text())
    assert nb["metadata"]["jupytext"]["formats"] == "ipynb,py:percent"
    assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]) == 1
    text = (repo / "notebooks/sim_validation.py").read_text()
    assert all("".join(c["source"]) in text for c in nb["cells"] if c["cell_type"] == "code")


def test_borrowed_slots_serve_next_steps_and_reset_before_prefill() -> None:
    c1 = LayerCosts.uniform(1, BranchCosts(0.12, 0.14, 0.184, 0.137))
    ids = np.zeros((10, 1, 1), dtype=np.int64)           # expert 0 every position
    hot = np.zeros((1, 4), dtype=bool)
    pol = ostinato(hot, borrowed_slots=1, decode_delta_ms=-1.0)
    rows = simulate_session([Request("first", 1, 4), Request("tool", 1, 4)], ids, 4, pol, c1, P)
    # each request: step 1 cold (C(1) = 0.324, admitted in the background), steps 2-3 hit (g = 0.137)
    per_request = 3 * (10 - 1.0) + 0.324 + 2 * 0.137
    assert [r["decode_ms"] for r in rows] == [pytest.approx(per_request)] * 2
    plain = simulate_session([Request("first", 1, 4)], ids, 4, ostinato(hot), c1, P)
    assert plain[0]["decode_ms"] == pytest.approx(3 * (10 + 0.324))


def test_engine_borrow_follows_the_engine_rules() -> None:
    """ostinato-borrow: a copy queued at one boundary serves from the next but one step (the engine's tables switch
    at the boundary after the copy), the slots stay across requests, and an upload pass takes them back."""
    c1 = LayerCosts.uniform(1, BranchCosts(0.12, 0.14, 0.184, 0.137))
    hot = np.zeros((1, 4), dtype=bool)
    ids = np.zeros((40, 1, 1), dtype=np.int64)           # expert 0 at every position
    pol = ostinato_borrow(hot, BorrowParams(slots=1, decay=0.5, margin=0.25, admit=1))
    # request 1 (1 new token: a token boundary that scores expert 0), 5 decode steps: the first queues the copy
    # (0.5 ms, covered by the step), the others compute expert 0 on the GPU (in the pool's own expert computation: G)
    reqs = [Request("first", 1, 6), Request("tool", 1, 4), Request("tool", 4, 3)]
    rows = simulate_session(reqs, ids, 4, pol, c1, P)
    cold, hit = 10 + max(0.324, 0.137), 10 + 0.137
    assert rows[0]["decode_ms"] == pytest.approx(cold + 4 * hit)
    # request 2: the slot is still lent (no upload pass between), every step hits
    assert rows[1]["decode_ms"] == pytest.approx(3 * hit)
    # request 3 prefills 4 tokens (>= upload_min: an upload pass takes the slot back): refilled as in request 1
    assert rows[2]["decode_ms"] == pytest.approx(cold + hit)
    # the same as the reference the engine's counters are checked against, over the same passes
    from ostinato.residency.borrow import BorrowedSlots, replay_session

    ref = BorrowedSlots(hot.copy(), [0], pol.borrow)
    replay_session(ref, reqs, ids, [0], P.upload_min, P.n_ubatch)
    from ostinato.sim import session as S

    st = S._State(pol, 1, 4, P)
    for q, a in zip(reqs, (0, 7, 12)):
        S._prefill_pass_ms(ids[a:a + q.n_new], pol, st, c1, P)
        S._decode_ms(ids[a + q.n_new:a + q.n_new + q.n_output - 1], pol, st, c1, P)
    assert st.slots.counts == ref.counts and ref.counts.hits == 9 and ref.counts.reclaim_passes == 1


def test_engine_borrow_waits_for_copies_the_step_did_not_cover() -> None:
    c1 = LayerCosts.uniform(1, BranchCosts(0.12, 0.14, 0.184, 0.137))
    slow = SimParams(decode_other_ms=1.0, prefill_token_ms=1.0, prefill_pass_ms=5.0, cpu_route_ms=0.02,
                     cpu_layer_ms=0.1, gpu_route_ms=0.001, upload_expert_ms=3.0, n_ubatch=8, upload_min=4)
    ids = np.zeros((10, 1, 1), dtype=np.int64)
    pol = ostinato_borrow(np.zeros((1, 4), dtype=bool), BorrowParams(slots=1, decay=0.5, margin=0.25, admit=1))
    rows = simulate_session([Request("first", 1, 4)], ids, 4, pol, c1, slow)
    step_cold, step_hit = 1 + 0.324, 1 + 0.137
    # step 1 queues a 3 ms copy, which its 1.324 ms cover in part: step 2's boundary waits for the rest
    assert rows[0]["decode_ms"] == pytest.approx(step_cold + (3.0 - step_cold) + 2 * step_hit)


def test_lru_one_cache_per_device() -> None:
    ids = np.zeros((4, 2, 1), dtype=np.int64)   # layers 0 and 1 both route expert 0
    empty = np.zeros((2, 2), dtype=bool)
    shared = simulate_session([Request("first", 1, 3)], ids, 2, llama_expert_cache(empty, slots=1), C, P)
    per_dev = simulate_session([Request("first", 1, 3)], ids, 2, llama_expert_cache(empty, np.array([0, 1]), 1), C, P)
    # prefill (1 token <= cache_max_pass) fills the caches; shared: the two layers evict each other every time
    assert shared[0]["decode_ms"] == pytest.approx(2 * (10 + 2 * 0.5 + 2 * 0.137))
    assert per_dev[0]["decode_ms"] == pytest.approx(2 * (10 + 2 * 0.137))


def _paper_frames():
    t3 = pd.DataFrame({"workload": ["SWE"] * 3, "gpus": [4] * 3, "engine": ["ostinato", "llama.cpp-layers", "buun"],
                       "sessions": [13] * 3, "total_s": [100.0, 150.0, 120.0], "tpot_ms": [26.0, 47.0, 27.0]})
    t7 = pd.DataFrame({"workload": ["SWE"] * 2, "kind": ["tool"] * 2, "engine": ["ostinato", "buun"],
                       "ttft_median_s": [1.0, 2.0]})
    return t3, t7


def test_validation_tables_relative_to_ostinato_by_hand():
    from ostinato.sim import validation as V

    t3, t7 = _paper_frames()
    ses = pd.DataFrame({"engine": ["ostinato", "llama.cpp-layers", "buun"], "session": ["s"] * 3,
                        "total_s": [10.0, 17.0, 11.0], "workload": ["SWE"] * 3})
    req = pd.DataFrame({"engine": ["ostinato", "ostinato", "buun", "buun"], "kind": ["tool", "first", "tool", "tool"],
                        "ttft_ms": [500.0, 9.0, 900.0, 1100.0], "tpot_ms": [20.0, 30.0, 25.0, 25.0],
                        "n_output": [5, 1, 5, 5], "workload": ["SWE"] * 4})
    t = V.relative_to_ostinato(ses, req, t3, t7, "p").set_index(["engine", "series"])
    assert t.loc[("llama.cpp-layers", "paper"), "total_rel"] == pytest.approx(1.5)
    assert t.loc[("llama.cpp-layers", "simulated (p)"), "total_rel"] == pytest.approx(1.7)
    assert t.loc[("llama.cpp-layers", "simulated (p)"), "total_rel_vs_paper"] == pytest.approx(1.7 / 1.5)
    assert t.loc[("buun", "simulated (p)"), "ttft_tool_s"] == pytest.approx(1.0)  # median of 0.9 and 1.1 s
    assert t.loc[("buun", "simulated (p)"), "ttft_tool_s_vs_paper"] == pytest.approx(0.5)
    assert t.loc[("ostinato", "simulated (p)"), "tpot_ms"] == pytest.approx(20.0)  # single-token outputs left out


def test_validation_ablation_fig7a_limit_and_intercepts_by_hand():
    from ostinato.sim import validation as V

    t8 = pd.DataFrame({"panel": ["b", "b", "b"], "step": [1, 2, 5], "config": ["a", "b", "c"],
                       "total_s": [100.0, 80.0, 60.0]})
    ses = pd.DataFrame({"engine": ["llama.cpp-layers", "ostinato"], "total_s": [10.0, 7.0], "workload": ["SWE"] * 2})
    abl = V.ablation_steps(ses, t8).set_index("step")
    assert abl.loc[5, "paper_rel_step1"] == pytest.approx(0.6) and abl.loc[5, "simulated_rel_step1"] == pytest.approx(0.7)
    assert np.isnan(abl.loc[2, "simulated_rel_step1"])  # no expert-cache policy simulated here
    f7 = pd.DataFrame({"panel": ["a", "b", "b", "b", "b"], "metric": ["ttft_median_change", "ttft", "ttft",
                                                                     "ttft_slope", "ttft_slope"],
                       "engine": ["ostinato", "buun", "ostinato", "ostinato", "buun"],
                       "reference_engine": ["llama.cpp-layers", "", "", "", ""], "new_tokens": ["<512", "128", "128",
                                                                                               "split path",
                                                                                               "split path"],
                       "value": [np.nan, 1.63, 0.92, 3.2, 6.0], "value_low": [-25.2, np.nan, np.nan, np.nan, np.nan],
                       "value_high": [-22.0, np.nan, np.nan, np.nan, np.nan]})
    req = pd.DataFrame({"engine": ["ostinato", "llama.cpp-layers"], "kind": ["tool", "tool"], "n_new": [200, 200],
                        "ttft_ms": [75.0, 100.0], "set": ["x", "x"], "session": ["s", "s"], "n_output": [11, 11],
                        "decode_ms": [50.0, 100.0]})
    f7a = V.fig7a_changes(req, f7)
    row = f7a[(f7a["new_tokens"] == "128-255") & (f7a["simulated_reference"] == "llama.cpp-layers")].iloc[0]
    assert row["simulated_change_pct"] == pytest.approx(-25.0) and row["paper_change_low_pct"] == -25.2
    lim = V.decode_against_limit({"x": {"traces": [{"session": "s", "limit_ms_per_token": 2.0,
                                                    "min_read_twice_ms_per_token": 4.0}]}}, req).set_index("engine")
    assert lim.loc["ostinato", "x_limit"] == pytest.approx(2.5) and lim.loc["llama.cpp-layers", "x_min_read_twice"] == 2.5
    icp = V.fig7b_intercepts(f7).set_index("engine")
    assert icp.loc["buun", "intercept_s"] == pytest.approx(1.63 - 0.768)
    assert icp.loc["ostinato", "intercept_s"] == pytest.approx(0.92 - 0.4096)


def test_upload_latency_is_paid_once_per_upload_pass():
    """An upload pass pays the link's latency once and each distinct cold expert's copy (calibrate separates them)."""
    n_layer, n_expert, k = 2, 8, 2
    hot = np.zeros((n_layer, n_expert), dtype=bool)
    costs = LayerCosts.from_branches([BranchCosts(0.5, 1.0, 0.2, 0.3)] * n_layer)
    base = SimParams(decode_other_ms=0.0, prefill_token_ms=0.0, prefill_pass_ms=0.0, cpu_route_ms=0.0,
                     cpu_layer_ms=0.0, gpu_route_ms=0.0, upload_expert_ms=0.25, n_ubatch=8, upload_min=4)
    ids = np.zeros((5, n_layer, k), dtype=np.int64)
    ids[:, :, 1] = 1  # 2 distinct experts per layer, 4 uploads in all (the fifth position is the output token)
    reqs = [Request("first", 4, 1)]
    t0 = simulate_session(reqs, ids, n_expert, ostinato(hot), costs, base)[0]["prefill_ms"]
    with_latency = SimParams(**{**base.__dict__, "upload_pass_ms": 0.18})
    t1 = simulate_session(reqs, ids, n_expert, ostinato(hot), costs, with_latency)[0]["prefill_ms"]
    assert t0 == pytest.approx(4 * 0.25) and t1 == pytest.approx(4 * 0.25 + 0.18)
