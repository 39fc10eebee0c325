"""Belady MIN with bypass (seed 004's limit) against exhaustive search on short traces."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from ostinato.limit import LimitResult, belady_min_bypass, limit_for_trace, lru_reads, next_use, request_keys
from ostinato.limit import cli as limit_cli
from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace


def brute_min_misses(keys: list[int], capacity: int, initial: frozenset = frozenset()) -> int:
    """Fewest misses of any policy (admit or bypass on a miss, evict anything) by search over cache states."""
    states = {initial: 0}
    for k in keys:
        nxt: dict[frozenset, int] = {}

        def put(s: frozenset, c: int) -> None:
            if c < nxt.get(s, 1 << 30):
                nxt[s] = c
        for s, c in states.items():
            if k in s:
                put(s, c)
                continue
            put(s, c + 1)                          # bypass
            if len(s) < capacity:
                put(s | {k}, c + 1)
            for v in s:                            # admit, evicting v
                if capacity:
                    put((s - {v}) | {k}, c + 1)
        states = nxt
    return min(states.values())


def test_next_use() -> None:
    assert next_use(np.array([3, 1, 3, 3, 1])).tolist() == [2, 4, 3, 5, 5]


def test_min_with_bypass_equals_brute_force() -> None:
    rng = np.random.default_rng(0)
    for case in range(120):
        n_keys = int(rng.integers(2, 6))
        p = rng.dirichlet(np.ones(n_keys) * 0.7)
        keys = rng.choice(n_keys, size=int(rng.integers(1, 15)), p=p).tolist()
        cap = int(rng.integers(0, 4))
        r = belady_min_bypass(np.array(keys), cap)
        assert r.misses == brute_min_misses(keys, cap), (keys, cap)
        assert r.hits + r.misses == len(keys) and r.admissions + r.bypasses == r.misses
        assert r.admissions <= r.misses


def test_min_with_initial_content_equals_brute_force() -> None:
    rng = np.random.default_rng(1)
    for _ in range(60):
        keys = rng.integers(0, 5, int(rng.integers(1, 13))).tolist()
        cap = int(rng.integers(1, 4))
        init = rng.choice(5, size=cap, replace=False)
        r = belady_min_bypass(np.array(keys), cap, initial=init)
        assert r.misses == brute_min_misses(keys, cap, frozenset(init.tolist()))


def test_hand_case_and_read_variants() -> None:
    # cache of 1: a b a b a -> keep a: misses a, b, b = 3; b is bypassed twice
    r = belady_min_bypass(np.array([0, 1, 0, 1, 0]), 1)
    assert (r.misses, r.admissions, r.bypasses) == (3, 1, 2)
    assert r.reads_once == 3 and r.reads_twice == 4
    lr = LimitResult(n_positions=10, requests=60, hits=40, misses=20, admissions=5, bypasses=15)
    # 2 reads per token of 13.4 MB at 20 GB/s = 1.34 ms per token
    assert lr.decode_ms_per_token(13.4e6, 20e9 / 1e3) == pytest.approx(1.34)
    assert lr.decode_ms_per_token(13.4e6, 20e9 / 1e3, twice=True, other_ms_per_token=1.0) == pytest.approx(2.675)


def test_trace_shared_vs_per_layer_and_lru() -> None:
    rng = np.random.default_rng(2)
    ids = np.stack([np.argsort(rng.random((50, 8)) ** 3 * rng.random(8), axis=1)[:, :2] for _ in range(3)], axis=1)
    keys = request_keys(ids, 8)
    assert keys.size == 50 * 3 * 2
    shared = limit_for_trace(ids, 8, 6)
    per_layer = limit_for_trace(ids, 8, 2, per_layer=True)
    assert per_layer.requests == shared.requests == 300
    assert shared.misses <= per_layer.misses      # a shared cache of the same total size is at least as good
    assert shared.misses <= lru_reads(keys, 6).misses
    # a cache holding everything misses each key once (compulsory)
    assert limit_for_trace(ids, 8, 24).misses == np.unique(keys).size
    # "none" ids are dropped
    ids2 = ids.copy().astype(np.uint8)
    ids2[:, 0, :] = 0xFF
    assert limit_for_trace(ids2, 8, 6, none_id=0xFF).requests == 200


def test_cli(tmp_path, capsys) -> None:
    rng = np.random.default_rng(3)
    ids = np.stack([np.argsort(rng.random((40, 8)), axis=1)[:, :2] for _ in range(2)], axis=1).astype(np.uint8)
    write_trace(tmp_path / "t.route", RoutingTrace(TraceShape(2, 8, 2), ids))
    parser = argparse.ArgumentParser()
    limit_cli.register(parser.add_subparsers(dest="group"))
    a = parser.parse_args(["limit", "--trace", str(tmp_path / "t.route"), "--slots", "4", "--expert-bytes", "13.4e6",
                           "--read-gbps", "20", "--out", str(tmp_path / "l.json")])
    assert a.func(a) == 0
    out = json.loads((tmp_path / "l.json").read_text())
    assert out["reads_once"] <= out["reads_twice"] and out["positions"] == 40
    assert out["limit_ms_per_token"] == pytest.approx(out["reads_once"] / 40 * 13.4e6 / 20e6)


def test_decode_positions_by_hand() -> None:
    from ostinato.limit.cli import decode_positions
    from ostinato.sim.session import Request

    # request 0: new 0-2, outputs 3-5 (steps feed 3, 4); request 1: new 6, outputs 7 (no step); request 2: new 8-9,
    # outputs 10-11 (step feeds 10)
    reqs = [Request("first", 3, 3), Request("tool", 1, 1), Request("tool", 2, 2)]
    assert decode_positions(reqs).tolist() == [3, 4, 10]
    assert decode_positions([]).size == 0
