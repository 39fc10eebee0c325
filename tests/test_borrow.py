"""Borrowed memory's rules in plain Python (`ostinato.residency.borrow`) and `ostinato residency borrow-tune`.

The engine's counters are compared with the same class on the CPU build in tests/test_residency_engine.py; here the
rules themselves, by hand, and the tuning over development sessions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ostinato.residency.borrow import BorrowedSlots, BorrowParams, choose, plan_pools, replay_session, tune
from ostinato.sim.session import Request


def _one_layer(margin: float) -> BorrowedSlots:
    hot = np.array([[True, False, False, False]])
    return BorrowedSlots(hot, [0], BorrowParams(slots=1, decay=0.5, margin=margin, admit=1))


def test_copies_join_at_the_next_boundary_and_are_hit():
    s = _one_layer(margin=10.0)
    s.record(0, [1, 1, 2, 0], decode=False)   # a prefill: cold routes raise scores (expert 0 is resident)
    assert s.score[0].tolist() == [0.0, 2.0, 1.0, 0.0] and s.counts.cpu_routes == 3
    s.boundary()                               # scores 1, 0.5: expert 1 queued into the free slot
    s.record(0, [1], decode=True)              # not in the tables yet: the CPU computes it
    assert s.counts.hits == 0 and s.counts.cpu_routes == 4 and s.counts.active == 0
    s.boundary()                               # expert 1 joins
    s.record(0, [1], decode=True)
    s.record(0, [2], decode=True)
    assert (s.counts.admissions, s.counts.active, s.counts.hits, s.counts.steps_hit, s.counts.steps) == (1, 1, 1, 1, 2)
    assert s.counts.evictions == 0             # expert 2 (0.75 then 1.75) never scores 11 times expert 1's
    s.reclaim()                                # an upload pass
    assert (s.counts.reclaimed, s.counts.reclaim_passes, s.counts.active, s.active) == (1, 1, 0, {})
    s.record(0, [1], decode=True)
    assert s.counts.hits == 1                  # taken back: on the CPU again


def test_a_clearly_higher_newcomer_replaces_the_lowest_borrowed_expert():
    s = _one_layer(margin=0.25)
    s.record(0, [1, 1, 2], decode=False)
    s.boundary()                               # 1: 1.0, 2: 0.5 -> expert 1 queued
    s.record(0, [2], decode=True)              # 2: 1.5
    s.boundary()                               # expert 1 joins; 1: 0.5, 2: 0.75 > 1.25 * 0.5 -> 2 replaces 1
    assert (s.counts.admissions, s.counts.evictions, s.counts.active) == (1, 1, 0)
    assert s.slot_key[0] == [(0, 2)] and s.taken == {(0, 2): 0} and s.active == {}
    s.boundary()                               # expert 2 joins
    assert s.active == {(0, 2): 0} and s.counts.active == 1


def test_ties_go_to_the_lower_layer_and_expert_and_admit_bounds_the_copies():
    hot = np.zeros((2, 4), dtype=bool)
    s = BorrowedSlots(hot, [0, 0], BorrowParams(slots=4, decay=1.0, margin=0.0, admit=2))
    s.record(1, [0, 3], decode=False)
    s.record(0, [2, 3], decode=False)          # four experts, one route each
    s.boundary()
    assert [k for k in s.slot_key[0] if k] == [(0, 2), (0, 3)] and len(s.loading) == 2
    s.boundary()
    assert sorted(s.active) == [(0, 2), (0, 3)] and [k for k in s.slot_key[0] if k][2:] == [(1, 0), (1, 3)]


def test_borrow_params_are_checked():
    for bad in (dict(slots=-1), dict(slots=1, decay=0.0), dict(slots=1, margin=-0.1), dict(slots=1, admit=0)):
        with pytest.raises(ValueError, match="borrow parameters"):
            BorrowParams(**bad)


def test_replay_session_takes_slots_back_at_upload_passes():
    hot = np.zeros((1, 8), dtype=bool)
    ids = np.zeros((40, 1, 1), dtype=np.int64)    # expert 0 at every position
    s = BorrowedSlots(hot, [0], BorrowParams(slots=2, decay=0.9, margin=0.25, admit=1))
    # request 1: 8 new tokens (a split pass), 6 outputs (5 decode steps); request 2: 16 new tokens (an upload pass)
    cold = replay_session(s, [Request("first", 8, 6), Request("tool", 16, 4)], ids, [0], upload_min=16, ubatch=512)
    assert cold == 5 + 3                           # every decode route is plan-cold
    # request 1: queued at step 1, joined at step 2, hit in steps 2-5; the upload pass takes it back; request 2's
    # three steps: queued, then hit twice
    assert (s.counts.hits, s.counts.reclaimed, s.counts.admissions, s.counts.steps) == (4 + 2, 1, 2, 8)


def test_tune_grid_and_choice():
    rng = np.random.default_rng(0)
    hot = np.zeros((2, 16), dtype=bool)
    hot[:, :8] = True
    ids = rng.integers(0, 16, size=(300, 2, 2))
    sessions = [("s/a", [Request("first", 40, 60), Request("tool", 20, 80)])]
    grid = tune(sessions, {"s/a": ids}, hot, [0, 0], slots=4, decays=[0.5, 0.95], margins=[0.0, 1.0], admit=2,
                upload_min=512)
    assert [(r["decay"], r["margin"]) for r in grid] == [(0.5, 0.0), (0.5, 1.0), (0.95, 0.0), (0.95, 1.0)]
    assert all(0 < r["hit_share"] < 1 and r["decode_cold_routes"] == grid[0]["decode_cold_routes"] for r in grid)
    best = choose(grid)
    assert best["hit_share"] == max(r["hit_share"] for r in grid) and best["admission_cost"] == 0.0
    # a grid over copies per step too: with a cost per copy the choice trades borrowed routes for fewer copies
    grid = tune(sessions, {"s/a": ids}, hot, [0, 0], slots=4, decays=[0.95, 0.99], margins=[1.0], admit=[1, 4],
                upload_min=512)
    assert [(r["decay"], r["admit"]) for r in grid] == [(0.95, 1), (0.95, 4), (0.99, 1), (0.99, 4)]
    assert all(r["admissions"] <= r["steps"] for r in grid if r["admit"] == 1)
    # the grid's points in two processes: the same rows in the same order, and the progress of every session
    seen = []
    assert tune(sessions, {"s/a": ids}, hot, [0, 0], slots=4, decays=[0.95, 0.99], margins=[1.0], admit=[1, 4],
                upload_min=512, progress=seen.append, jobs=2) == grid
    assert sum(seen) == len(grid) * len(sessions)
    free, costly = choose(grid), choose(grid, admission_cost=1.0)
    assert free["hit_share"] == max(r["hit_share"] for r in grid)
    nets = [(r["hits"] - r["admissions"]) / r["decode_cold_routes"] for r in grid]
    assert costly["net_share"] == pytest.approx(max(nets)) and costly["admission_cost"] == 1.0
    assert costly["admissions_per_step"] < free["admissions_per_step"] and costly["hit_share"] < free["hit_share"]
    assert (costly["decay"], costly["margin"], costly["admit"]) != (free["decay"], free["margin"], free["admit"])


def test_borrow_tune_cli(tmp_path):
    import argparse

    from ostinato.residency import cli as rcli
    from ostinato.residency.planfile import PlanFile, write_plan
    from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace

    rng = np.random.default_rng(1)
    ids = np.full((200, 3, 2), 0xFF, dtype=np.uint8)
    ids[:, 1:, :] = np.argsort(rng.random((200, 2, 8)), axis=2)[:, :, :2]
    write_trace(tmp_path / "swe__a.route", RoutingTrace(TraceShape(3, 8, 2), ids))
    (tmp_path / "s.jsonl").write_text(json.dumps({"session": "swe/a", "requests": [
        {"kind": "first", "n_new": 60, "n_output": 40}, {"kind": "tool", "n_new": 20, "n_output": 60}]}) + "\n")
    write_plan(tmp_path / "plan.json", PlanFile("toy", 3, 8, 2, [0, 100, 100], [[0, 1, 2]], [0],
                                                [np.array([[1, 0], [1, 1], [2, 0], [2, 1]])]))
    assert plan_pools([[0, 1, 2]], [0, 100, 100]) == [-1, 0, 0]
    parser = argparse.ArgumentParser()
    rcli.register(parser.add_subparsers(dest="group"))
    base = ["residency", "borrow-tune", "--plan", str(tmp_path / "plan.json"), "--sessions", str(tmp_path / "s.jsonl"),
            "--routing", str(tmp_path), "--no-progress", "--out", str(tmp_path / "b.json")]
    a = parser.parse_args(base + ["--decay", "0.9,0.99", "--margin", "0.25", "--slots", "3", "--admit", "4"])
    assert a.func(a) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert len(doc["grid"]) == 2 and doc["chosen"]["slots"] == 3 and doc["chosen"]["decay"] in (0.9, 0.99)
    assert doc["grid"][0]["decode_cold_routes"] > 0 and doc["chosen"]["admit"] == 4
    # by default every combination of decay, margin and 1, 2 or 4 copies per step, each copy costing a route
    a = parser.parse_args(base + ["--decay", "0.9", "--margin", "0.25"])
    assert a.func(a) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [r["admit"] for r in doc["grid"]] == [1, 2, 4] and doc["admission_cost"] == 1.0
    best = max(doc["grid"], key=lambda r: r["net_share"])
    assert doc["chosen"]["admit"] == best["admit"] and doc["chosen"]["net_share"] == best["net_share"]
    a = parser.parse_args(base + ["--decay", "0.9", "--margin", "0.25", "--jobs", "3"])  # the same in three processes
    assert a.func(a) == 0 and json.loads((tmp_path / "b.json").read_text()) == doc
    for bad, msg in ((["--decay", "0"], "--decay"), (["--margin", "x"], "--margin"), (["--slots", "0"], "--slots"),
                     (["--admit", "0"], "--admit"), (["--admit", "1.5"], "--admit"),
                     (["--admission-cost", "-1"], "--admission-cost"), (["--jobs", "0"], "--jobs")):
        a = parser.parse_args(base + bad)
        with pytest.raises(ValueError, match=msg):
            a.func(a)
    # a recorded trace ends before the last output token, which the engine never computes; one more is missing data
    for n_output, ok in ((122, True), (123, False)):
        (tmp_path / "s.jsonl").write_text(json.dumps({"session": "swe/a", "requests": [
            {"kind": "first", "n_new": 79, "n_output": n_output}]}) + "\n")
        a = parser.parse_args(base)
        if ok:
            assert a.func(a) == 0
        else:
            with pytest.raises(ValueError, match=r"swe__a.route: 200 positions, session swe/a .* needs 201"):
                a.func(a)


def test_the_default_admission_cost_is_the_h200s_copy_over_its_cold_route():
    """`replay.residency.borrow.admission_cost` (config/README.md) stands for one expert's copy to the GPU in units of
    a cold route on the CPU: the H200's calibrated profile (pinned host memory) has the two about equal."""
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[1]
    schema = yaml.safe_load((repo / "workflow" / "schemas" / "config.schema.yaml").read_text())
    borrow = schema["properties"]["replay"]["properties"]["residency"]["properties"]["borrow"]["properties"]
    cost = borrow["admission_cost"]["default"]
    prof = yaml.safe_load((repo / "data/reference/h200/branches/calibrate/profile.yaml").read_text())
    model = prof["models"]["v4flash-slice-8-calibrated"]
    ratio = model["upload"]["expert_ms_idle"] / model["classes"][0]["beta_ms"]
    assert abs(cost - ratio) < 0.25, (cost, ratio)
