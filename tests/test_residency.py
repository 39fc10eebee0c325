"""Residency: routing profiles, llama.cpp's layer split, the capacity test, the planner (vs brute force), plan files."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import yaml

from ostinato.residency import cli as res_cli
from ostinato.residency.capacity import (Capacity, MemoryModel, capacity_test, longest_request_tokens,
                                         memory_model_from_dict, split_layers)
from ostinato.residency.planfile import PlanFile, fnv1a64, plan_checksum, read_plan, write_plan
from ostinato.residency.planner import brute_force_best, plan_frequency, plan_per_layer
from ostinato.residency.profile import count_routes, profile_from_traces, read_profile, write_profile
from ostinato.residency.summary import plan_summary
from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace

MB = 10**6


def _trace(ids: list, n_expert: int = 4) -> RoutingTrace:
    a = np.asarray(ids, dtype=np.uint8)
    return RoutingTrace(TraceShape(a.shape[1], n_expert, a.shape[2]), a)


def test_count_routes_ignores_none_and_sums_traces(tmp_path) -> None:
    n = 0xFF
    t1 = _trace([[[n, n], [0, 1], [2, 3]], [[n, n], [1, 2], [3, 0]]])
    t2 = _trace([[[n, n], [1, 3], [n, n]]])
    assert count_routes(t1).tolist() == [[0, 0, 0, 0], [1, 2, 1, 0], [1, 0, 1, 2]]
    write_trace(tmp_path / "a.route", t1)
    write_trace(tmp_path / "b.route", t2)
    prof = profile_from_traces([tmp_path / "a.route", tmp_path / "b.route"])
    assert prof.counts.tolist() == [[0, 0, 0, 0], [1, 3, 1, 1], [1, 0, 1, 2]]
    assert prof.n_pos == 3 and prof.moe_layers().tolist() == [1, 2] and prof.total_routes() == 10
    write_profile(tmp_path / "p.json", prof)
    back = read_profile(tmp_path / "p.json")
    assert np.array_equal(back.counts, prof.counts) and back.sha256() == prof.sha256()
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["counts"][1][1] = 9
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="sha256"):
        read_profile(tmp_path / "bad.json")
    write_trace(tmp_path / "c.route", _trace([[[0, 1]]], n_expert=8))
    with pytest.raises(ValueError, match="shape"):
        profile_from_traces([tmp_path / "a.route", tmp_path / "c.route"])


def test_split_layers_like_llama_cpp() -> None:
    dev = split_layers(43, [24e9] * 4)
    # act = 44 slots (43 layers + output); layer il goes to upper_bound([.25, .5, .75, 1], il / 44)
    assert dev.tolist() == [0] * 11 + [1] * 11 + [2] * 11 + [3] * 11
    assert split_layers(4, [2, 1, 1]).tolist() == [0, 0, 0, 1, 2]   # 5 slots: 0, .2, .4 < .5; .6 -> 1; .8 -> 2
    assert split_layers(4, [1, 1], n_gpu_layers=3).tolist() == [-1, -1, 0, 0, 1]  # x = 0, 1/3, 2/3
    assert split_layers(3, []).tolist() == [-1] * 4


def test_capacity_test_hand_case() -> None:
    m = MemoryModel(gpu_total_bytes=(1000 * MB, 1000 * MB), dense_bytes=(50 * MB,) * 4,
                    expert_bytes=(10 * MB, 10 * MB, 10 * MB, 0), kv_bytes_per_token=(1000,) * 4, kv_tokens=20000,
                    output_bytes=100 * MB, compute_fixed_bytes=(30 * MB, 40 * MB), compute_bytes_per_token=10000,
                    n_ubatch=2048, staging_experts=3, zero_slots=2, margin_bytes=100 * MB, reserved_bytes=50 * MB)
    cap = capacity_test(m)
    assert cap.layer_gpu == [0, 0, 0, 1, 1]
    # GPU 0: 1000 - 50 - 100 - 3*50 - 3*20 (kv) - (30 + 20.48) - 5*10 = 539.52 MB -> 53 slots
    assert cap.terms[0]["kv"] == 3 * 1000 * 20000 and cap.terms[0]["dense"] == 150 * MB
    assert cap.pool_bytes[0] == 1000 * MB - 50 * MB - 100 * MB - 150 * MB - 60 * MB - 30 * MB - 20_480_000 - 50 * MB
    assert cap.slots[0] == cap.pool_bytes[0] // (10 * MB) == 53
    # GPU 1 holds layer 3 (no routed experts) and the output head: no expert slots
    assert cap.terms[1]["dense"] == 150 * MB and cap.slots[1] == 0
    assert Capacity.from_json(cap.to_json()) == cap
    tight = memory_model_from_dict({"n_layer": 2, "gpu_total_bytes": [100 * MB], "dense_bytes": 60 * MB,
                                    "expert_bytes": 10 * MB, "kv_bytes_per_token": 0, "kv_tokens": 0})
    out = capacity_test(tight)
    assert out.pool_bytes == [0] and any("short" in n for n in out.notes)


def test_longest_request_tokens(tmp_path) -> None:
    lines = [{"session": "a", "requests": [{"kind": "first", "n_new": 100, "n_output": 10},
                                           {"kind": "tool", "n_new": 5, "n_output": 50}]},
             {"session": "b", "requests": [{"kind": "first", "n_new": 150, "n_output": 1}]}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert longest_request_tokens(tmp_path / "s.jsonl") == 165


def test_planner_shared_pool_no_per_layer_quota() -> None:
    counts = np.array([[50, 40, 30, 1], [5, 4, 3, 2], [9, 8, 7, 6]])
    layer_gpu = np.array([0, 0, 1])
    plan = plan_frequency(counts, layer_gpu, np.array([10, 10, 10]), [30, 20])
    # GPU 0 shares 3 slots between layers 0 and 1: all go to layer 0 (no per-layer quota)
    assert plan.hot[0].tolist() == [True, True, True, False] and not plan.hot[1].any()
    assert plan.hot[2].tolist() == [True, True, False, False]
    assert plan.gpu_slots[0].tolist() == [[0, 0], [0, 1], [0, 2]]
    assert plan.covered_routes == [120, 17] and plan.n_resident == 5
    assert plan.experts_per_layer().tolist() == [3, 0, 2]


def test_planner_two_size_classes_known_optimum() -> None:
    # one GPU, 24 bytes: a big-expert layer (size 12) and a small-expert layer (size 8)
    counts = np.array([[10, 9, 0], [7, 7, 7]])
    eb = np.array([12, 8])
    plan = plan_frequency(counts, np.array([0, 0]), eb, [24])
    # options: 2 big (19); 1 big + 1 small (17); 3 small (21) -> 3 small is optimal
    assert plan.class_split == [{8: 3, 12: 0}] and plan.covered_routes == [21]
    assert plan.covered_routes[0] == brute_force_best(counts, np.array([0, 0]), eb, [24])


def test_planner_matches_brute_force_on_random_cases() -> None:
    rng = np.random.default_rng(0)
    for case in range(30):
        n_layer, n_expert = 3, 4
        counts = rng.integers(0, 20, (n_layer, n_expert))
        eb = rng.choice([5, 7], n_layer) if case % 2 else np.full(n_layer, 5)
        layer_gpu = rng.integers(0, 2, n_layer)
        pools = [int(x) for x in rng.integers(0, 40, 2)]
        plan = plan_frequency(counts, layer_gpu, eb, pools)
        assert sum(plan.covered_routes) == brute_force_best(counts, layer_gpu, eb, pools)
        for j in range(2):
            used = sum(int(eb[l]) for l, _ in plan.gpu_slots[j])
            assert used <= pools[j]


def test_plan_per_layer_uniform() -> None:
    counts = np.array([[1, 5, 3], [0, 0, 0], [2, 2, 9]])
    hot = plan_per_layer(counts, 2)
    assert hot.tolist() == [[False, True, True], [False, False, False], [True, False, True]]


def test_plan_uniform_fills_each_gpu_evenly() -> None:
    from ostinato.residency.planner import plan_uniform

    counts = np.array([[1, 5, 3, 0], [0, 0, 0, 0], [2, 2, 9, 1], [4, 3, 2, 1]])
    eb = np.array([10, 0, 10, 10])
    # GPU 0: layers 0 and 2 (dense layer 1 has no experts), 45 bytes: 2 per layer (40); GPU 1: layer 3, 15 bytes: 1
    plan = plan_uniform(counts, np.array([0, 0, 0, 1]), eb, [45, 15])
    assert plan.hot.sum(axis=1).tolist() == [2, 0, 2, 1]
    assert plan.hot[0].tolist() == [False, True, True, False] and plan.hot[3].tolist() == [True, False, False, False]
    assert plan.class_split == [{10: 4}, {10: 1}] and plan.covered_routes == [5 + 3 + 9 + 2, 4]
    assert [s.tolist() for s in plan.gpu_slots] == [[[0, 1], [0, 2], [2, 0], [2, 2]], [[3, 0]]]


def _planfile(slots: list) -> PlanFile:
    return PlanFile("toy", 3, 4, 2, [10, 10, 10], [[0, 1], [2]], [30, 20],
                    [np.asarray(s, dtype=np.int64).reshape(-1, 2) for s in slots], "abc")


def test_plan_file_roundtrip_checksum_and_validation(tmp_path) -> None:
    p = _planfile([[[0, 0], [0, 1], [1, 3]], [[2, 2]]])
    cs = write_plan(tmp_path / "plan.json", p)
    assert cs == plan_checksum(p) and cs.startswith("fnv1a64:")
    back = read_plan(tmp_path / "plan.json")
    assert [s.tolist() for s in back.slots] == [[[0, 0], [0, 1], [1, 3]], [[2, 2]]]
    assert back.hot_mask().sum() == 4 and back.profile_sha256 == "abc"
    doc = json.loads((tmp_path / "plan.json").read_text())
    doc["gpus"][0]["slots"][1] = [0, 2]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="key 'checksum'"):
        read_plan(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="twice"):
        write_plan(tmp_path / "x.json", _planfile([[[0, 0], [0, 0]], []]))
    with pytest.raises(ValueError, match="layer 2 is not on this GPU"):
        write_plan(tmp_path / "x.json", _planfile([[[2, 0]], []]))
    with pytest.raises(ValueError, match="bytes"):
        write_plan(tmp_path / "x.json", _planfile([[[0, 0], [0, 1], [0, 2], [0, 3]], []]))
    # the checksum definition: FNV-1a 64 over uint32 words (known vector: FNV-1a of b"a")
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C


def test_summary_coverage() -> None:
    from ostinato.residency.profile import RouteCounts
    shape = TraceShape(2, 4, 2)
    dev = RouteCounts(shape, np.array([[6, 2, 1, 1], [0, 0, 0, 0]]))
    held = RouteCounts(shape, np.array([[1, 1, 1, 1], [0, 0, 0, 0]]))
    hot = np.array([[True, False, False, False], [False] * 4])
    s = plan_summary(hot, np.array([0, 0]), dev, held)
    assert s["dev_coverage"] == pytest.approx(0.6) and s["heldout_coverage"] == pytest.approx(0.25)
    assert s["experts_per_layer"] == {0: 1} and s["resident_share_of_experts"] == pytest.approx(0.25)


def test_cli_profile_capacity_plan(tmp_path) -> None:
    rng = np.random.default_rng(0)
    ids = np.stack([np.argsort(rng.random((200, 8)), axis=1)[:, :2] for _ in range(4)], axis=1)
    ids[:, 0, :] = 0xFF   # a dense layer
    write_trace(tmp_path / "dev.route", RoutingTrace(TraceShape(4, 8, 2), ids.astype(np.uint8)))
    parser = argparse.ArgumentParser()
    res_cli.register(parser.add_subparsers(dest="group"))

    def run(*argv: str) -> int:
        a = parser.parse_args(["residency", *argv])
        return a.func(a)

    assert run("profile", "--trace", str(tmp_path / "dev.route"), "--out", str(tmp_path / "p.json")) == 0
    mem = {"n_layer": 4, "gpu_total_bytes": [1000, 1000], "dense_bytes": 100, "expert_bytes": [0, 50, 50, 50],
           "kv_bytes_per_token": 0, "kv_tokens": 0, "margin_bytes": 100}
    (tmp_path / "mem.yaml").write_text(yaml.safe_dump(mem))
    assert run("capacity", "--memory", str(tmp_path / "mem.yaml"), "--out", str(tmp_path / "cap.json")) == 0
    cap = json.loads((tmp_path / "cap.json").read_text())
    assert cap["layer_gpu"] == [0, 0, 0, 1, 1] and cap["slots"] == [12, 16]
    assert run("plan", "--profile", str(tmp_path / "p.json"), "--capacity", str(tmp_path / "cap.json"),
               "--heldout", str(tmp_path / "p.json"), "--out", str(tmp_path / "plan.json"),
               "--summary", str(tmp_path / "sum.json")) == 0
    plan = read_plan(tmp_path / "plan.json")
    assert [len(s) for s in plan.slots] == [12, 8]   # GPU 1 holds one MoE layer of 8 experts
    s = json.loads((tmp_path / "sum.json").read_text())
    assert s["heldout_coverage"] == s["dev_coverage"] and s["n_resident"] == 20
    assert run("plan", "--profile", str(tmp_path / "p.json"), "--slots", "3,3", "--expert-bytes", "50",
               "--out", str(tmp_path / "plan2.json")) == 0
    assert read_plan(tmp_path / "plan2.json").hot_mask().sum() == 6


def test_plan_for_a_gguf_model_by_resident_share(tiny_v4_model, llama_tree, tmp_path):
    from ostinato.cli import main
    from ostinato.models.gguf_shape import moe_shape_from_gguf
    from ostinato.routing.trace import random_trace

    shape = moe_shape_from_gguf(tiny_v4_model, llama_tree)
    moe = shape.moe_layers()
    assert moe and all(shape.expert_bytes[l] > 0 for l in moe) and shape.n_vocab > 0
    write_trace(tmp_path / "a.route", random_trace(TraceShape(shape.n_layer, shape.n_expert, shape.n_expert_used),
                                                   200, moe, seed=1))
    assert main(["residency", "profile", "--trace", str(tmp_path / "a.route"), "--out", str(tmp_path / "p.json")]) == 0
    rc = main(["residency", "plan", "--profile", str(tmp_path / "p.json"), "--gguf", str(tiny_v4_model),
               "--llama-tree", str(llama_tree), "--resident-share", "0.5", "--out", str(tmp_path / "plan.json")])
    assert rc == 0
    plan = read_plan(tmp_path / "plan.json")
    assert plan.expert_bytes == list(shape.expert_bytes)
    assert len(plan.slots[0]) == round(0.5 * len(moe) * shape.n_expert)
    assert main(["residency", "plan", "--profile", str(tmp_path / "p.json"), "--resident-share", "0.5",
                 "--out", str(tmp_path / "x.json")]) == 2  # needs --gguf
