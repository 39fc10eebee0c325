"""Borrowed memory's rules over a sweep's passes (`ostinato residency borrow-sweep`): the model against the engine's
counters that the H200 sweeps measured, and the shipped table made again."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ostinato.residency import cli as rcli
from ostinato.residency.borrow import BorrowParams
from ostinato.sweep.borrow_model import ran_params, sweep_borrow_counts
from ostinato.sweep.prefill import BenchPlan

REPO = Path(__file__).resolve().parents[1]
SWEEP3 = REPO / "data" / "reference" / "h200" / "graph" / "sweep3"
SWEEP4 = REPO / "data" / "reference" / "h200" / "graph" / "sweep4"
CHURN = REPO / "data" / "reference" / "h200" / "borrow" / "breakdown" / "churn"
COLS = ["borrow_hits_per_step", "borrow_admissions_per_step", "cpu_routes_per_step"]


def _borrow_sweep(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    rcli.register(parser.add_subparsers(dest="group"))
    a = parser.parse_args(["residency", "borrow-sweep", *argv])
    return a.func(a)


def test_the_sweeps_passes_in_order_and_a_prompt_the_server_holds_computed_again_from_its_tail():
    """One layer whose experts are all cold and no slot: every route of a pass that runs is a CPU route. A sweep of one
    size sends the same prompt again from its second round on, which the server computes from its last tokens only;
    each decode request counts its n_decode - 1 steps and their routes."""
    hot = np.zeros((1, 4), dtype=bool)
    ids = np.zeros((40, 1, 1), dtype=np.int64)
    plan = BenchPlan((8,), (4,), 3, 2)
    counts = sweep_borrow_counts(plan, ids, hot, [0], BorrowParams(0), upload_min=512, decode_prompt_n=2)
    assert [(c.rep, c.steps, c.cpu_routes, c.hits, c.admissions) for c in counts] == [(0, 2, 2, 0, 0), (1, 2, 2, 0, 0)]
    with_tail = sweep_borrow_counts(plan, ids, hot, [0], BorrowParams(0), upload_min=512, decode_prompt_n=1)
    assert [c.cpu_routes for c in with_tail] == [3, 3]  # a single-token pass is a decode step: its route counts


def test_what_a_sweep_ran_comes_from_its_meta():
    assert ran_params({}) is None  # a summary from before its meta recorded the server's arguments
    assert ran_params({"server_args": []}) == (0.95, 0.25, 4)  # the engine's defaults
    assert ran_params({"server_args": ["--residency-borrow-admit", "1", "--residency-borrow-decay", "0.99"],
                       "borrow_params": {"decay": 0.9, "margin": 1.0, "admit": 2}}) == (0.99, 1.0, 1)


@pytest.mark.parametrize("summary, ran", [(SWEEP3 / "plain" / "summary.json", "0.95,0.25,4"),
                                          (SWEEP4 / "plain" / "summary.json", "0.95,0,1"),
                                          (CHURN / "admit1" / "summary.json", "0.95,0.25,1"),
                                          (CHURN / "stable" / "summary.json", "0.99,1,1")])
def test_the_model_follows_the_h200s_borrow_counters(tmp_path, summary, ran):
    """At the engine's defaults, with one copy per step, and with long-lived scores and a high margin, on the
    v4flash-slice-8 model of the H200 sweeps: within a tenth of a route or copy per decode step, and four hundredths of
    the share of steps with a borrowed route, of what the engine counted (GET /residency)."""
    decay, margin, admit = ran.split(",")
    out = tmp_path / "b.csv"
    assert _borrow_sweep("--summary", str(summary), "--spec", "v4flash-slice-8", "--ran", ran, "--decay", decay,
                         "--margin", margin, "--admit", admit, "--work-dir", str(tmp_path / "w"),
                         "--out", str(out)) == 0
    df = pd.read_csv(out)
    for p, rows in df.groupby("prefix"):
        sim, meas = rows[rows.series == "simulated"].iloc[0], rows[rows.series == "measured"].iloc[0]
        for c in COLS:
            if not np.isnan(meas[c]):  # the per-segment sweeps have no worker to count the CPU's routes
                assert abs(sim[c] - meas[c]) <= 0.1, (p, c, sim[c], meas[c])
        assert abs(sim["borrow_steps_hit_share"] - meas["borrow_steps_hit_share"]) <= 0.04, (p, sim, meas)


@pytest.mark.parametrize("sweep, grid", [
    (SWEEP3, ["--ran", "0.95,0.25,4", "--decay", "0.95,0.98,0.99", "--margin", "0.25,1,2", "--admit", "1,2,4"]),
    (SWEEP4, ["--ran", "0.95,0,1", "--decay", "0.95", "--margin", "0", "--admit", "1"])])
def test_the_shipped_table_is_what_the_command_gives(tmp_path, sweep, grid):
    """`sweep3/borrow-model.csv` and `sweep4/borrow-model.csv` (quoted by data/reference/h200/graph/README.md) made
    again by the commands its README gives."""
    out = tmp_path / "b.csv"
    assert _borrow_sweep("--summary", str(sweep / "plain" / "summary.json"), "--spec", "v4flash-slice-8", *grid,
                         "--out", str(out)) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(sweep / "borrow-model.csv"))


def test_borrow_sweep_errors_name_the_flag(tmp_path):
    summary = SWEEP3 / "plain" / "summary.json"
    base = ["--summary", str(summary), "--out", str(tmp_path / "b.csv")]
    for extra, msg in ((["--spec", "v4flash-slice-8", "--model", "x.gguf"], "either as --model"),
                       ([], "either as --model"),
                       (["--model", "x.gguf"], "--llama-tree"),
                       (["--spec", "v4flash-slice-8", "--ran", "0.95,0.25"], "--ran"),
                       (["--spec", "v4flash-slice-8", "--admit", "1.5"], "--admit"),
                       (["--spec", "v4flash-slice-8", "--expert-type", "q3"], "expert type")):
        with pytest.raises(ValueError, match=msg):
            _borrow_sweep(*base, *extra)
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "summary.json").write_text(summary.read_text())
    with pytest.raises(ValueError, match="--decode-prompt-n: not given and no .*rows.csv"):
        _borrow_sweep("--summary", str(lone / "summary.json"), "--spec", "v4flash-slice-8", "--out",
                      str(tmp_path / "b.csv"))
    (lone / "summary.json").write_text(json.dumps({"meta": {"prefixes": [1]}, "rows": []}))
    with pytest.raises(ValueError, match="expected the summary.json of `ostinato sweep`"):
        _borrow_sweep("--summary", str(lone / "summary.json"), "--spec", "v4flash-slice-8", "--out",
                      str(tmp_path / "b.csv"))
    # a shape other than the sweep's model is refused by its expert budget
    with pytest.raises(ValueError, match="not the sweep's model"):
        _borrow_sweep(*base, "--spec", "v4flash-slice-8", "--expert-type", "q8_0", "--decode-prompt-n", "4")
