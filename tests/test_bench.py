"""Benchmark helpers: cold routes per placement and the ratio summary (no engine needed)."""

from __future__ import annotations

import numpy as np
import pytest

from ostinato.bench.cold import cold_per_token_layer, whole_layer_hot
from ostinato.bench.prefill import BenchPlan, BenchRow, summarize
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
