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
    assert best["hit_share"] == max(r["hit_share"] for r in grid)


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
    a = parser.parse_args(base + ["--decay", "0.9,0.99", "--margin", "0.25", "--slots", "3"])
    assert a.func(a) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert len(doc["grid"]) == 2 and doc["chosen"]["slots"] == 3 and doc["chosen"]["decay"] in (0.9, 0.99)
    assert doc["grid"][0]["decode_cold_routes"] > 0
    for bad, msg in ((["--decay", "0"], "--decay"), (["--margin", "x"], "--margin"), (["--slots", "0"], "--slots"),
                     (["--admit", "0"], "--admit")):
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
