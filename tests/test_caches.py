"""The baselines' expert caches: the Python reference (ostinato.residency.caches) and, on the CPU build, the engine's
decisions (`--residency-policy lru|decay --residency-cache-log`) against it, line by line, on forced skewed routing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ostinato.models.gguf_shape import moe_shape_from_gguf
from ostinato.residency.budget import single_gpu_plan
from ostinato.residency.caches import (CacheCounts, DecayCache, LruCache, PlanPools, read_cache_log, replay_log,
                                       served)
from ostinato.residency.planfile import write_plan
from ostinato.routing.trace import RoutingTrace, TraceShape, write_trace
from ostinato.server.launcher import LlamaServer, ServerConfig, ServerError

PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67] * 3  # 54 tokens
N_PREDICT = 24


# --- the reference alone ---------------------------------------------------------------------------------------

def test_lru_evicts_the_least_recently_used_of_the_pool():
    c = LruCache(3, warm=[(0, 1), (0, 2), (1, 1)])
    assert c.serve(0, [2, 5]) == CacheCounts(hits=1, misses=1, evictions=1, admissions=1)  # (0, 1) out
    assert c.resident(0) == {2, 5} and c.resident(1) == {1}
    assert c.serve(1, [3]) == CacheCounts(0, 1, 1, 1)  # (1, 1) was least recently used
    assert c.resident(1) == {3}
    # more distinct experts than slots: the early ones are evicted again within the pass
    assert c.serve(2, [0, 1, 2, 3]) == CacheCounts(0, 4, 4, 4)
    assert c.resident(2) == {1, 2, 3}
    assert LruCache(0).serve(0, [1, 2]) == CacheCounts(0, 2, 0, 0)
    with pytest.raises(ValueError, match="cannot start with"):
        LruCache(1, warm=[(0, 1), (0, 2)])


def test_decay_swaps_only_clearly_better_experts():
    res = np.zeros((2, 6), dtype=bool)
    res[0, [0, 1]] = True
    res[1, [0]] = True
    c = DecayCache(res, decay=0.5, hysteresis=0.25, admit=1)
    assert c.step({0: [0, 4], 1: [0, 5]}) == {0: CacheCounts(1, 1, 0, 0), 1: CacheCounts(1, 1, 0, 0)}
    # layer 0: expert 4 scores 1 against its worst cached expert's 0.5 (> 0.5 * 1.25): swapped in. Layer 1: 5 scores
    # 1 against 1.5, not enough
    out = c.step({0: [4, 2], 1: [0, 5]})
    assert out == {0: CacheCounts(hits=1, misses=1, evictions=1, admissions=1), 1: CacheCounts(1, 1, 0, 0)}
    assert set(np.flatnonzero(c.resident[0])) == {0, 4} and set(np.flatnonzero(c.resident[1])) == {0}
    with pytest.raises(ValueError, match="decay in"):
        DecayCache(res, decay=0.0)


def test_decay_admits_the_largest_gains_then_the_lower_layer():
    res = np.zeros((3, 4), dtype=bool)
    res[:, 0] = True
    c = DecayCache(res, decay=0.5, hysteresis=0.0, admit=1)
    c.step({0: [1], 1: [1], 2: [2]})
    c.score[2, 2] += 1.0  # layer 2's candidate gains most
    out = c.step({0: [1], 1: [1], 2: [2]})
    assert out[2] == CacheCounts(1, 0, 1, 1) and out[0] == CacheCounts(0, 1, 0, 0) == out[1]
    out = c.step({0: [1], 1: [1], 2: [2]})  # layers 0 and 1 tie: the lower one swaps
    assert out[0] == CacheCounts(1, 0, 1, 1) and out[1] == CacheCounts(0, 1, 0, 0)


def test_served_passes():
    assert served("lru", 32) and not served("lru", 33) and served("lru", 64, max_pass=64)
    assert served("decay", 1) and not served("decay", 2)
    with pytest.raises(ValueError, match="expected lru or decay"):
        served("static", 1)


def test_cache_log_errors_name_the_line(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text("pass\tpos0\n")
    with pytest.raises(ValueError, match="expected the header"):
        read_cache_log(p)
    head = "pass\tpos0\tn_tokens\trows\tlayer\tpool\tpath\thits\tmisses\tevictions\tadmissions\texperts\n"
    p.write_text(head + "0\t0\t1\t1\t1\t0\tcache\tx\t0\t0\t0\t1,2\n")
    with pytest.raises(ValueError, match=r"c.tsv:2"):
        read_cache_log(p)
    p.write_text(head + "0\t0\t1\t1\t1\t0\tfast\t0\t0\t0\t0\t\n")
    with pytest.raises(ValueError, match="column path"):
        read_cache_log(p)


def test_plan_pools_follow_the_engine():
    plan = {"model": {"expert_bytes": [0, 10, 10, 20]},
            "gpus": [{"gpu": 0, "layers": [0, 1, 2, 3], "slots": [[3, 1], [1, 0], [2, 5], [3, 0]]}]}
    pools = PlanPools.from_plan(plan)
    assert pools.layer_pool == {1: 0, 2: 0, 3: 1}
    assert pools.warm == [[(1, 0), (2, 5)], [(3, 1), (3, 0)]]


# --- the engine against the reference (CPU build) --------------------------------------------------------------

def _skewed_trace(shape, n_pos: int, seed: int) -> RoutingTrace:
    """Distinct experts per position and MoE layer, drawn without replacement with Zipf-like weights (Gumbel top-k),
    so that caches see repeated experts, misses and swaps."""
    ts = TraceShape(shape.n_layer, shape.n_expert, shape.n_expert_used)
    rng = np.random.default_rng(seed)
    ids = np.full((n_pos, shape.n_layer, shape.n_expert_used), ts.none_id, dtype=ts.id_dtype)
    for il in shape.moe_layers():
        logw = -1.2 * np.log1p(rng.permutation(shape.n_expert))
        keys = logw[None, :] + rng.gumbel(size=(n_pos, shape.n_expert))
        ids[:, il, :] = np.argsort(-keys, axis=1)[:, : shape.n_expert_used]
    return RoutingTrace(ts, ids)


def _server(bin_dir: Path, model: Path, tmp: Path, name: str, *args: str) -> LlamaServer:
    cfg = ServerConfig(binary=bin_dir / "llama-server", model=model,
                       args=["-c", "1024", "-t", "2", "--no-warmup", *args],
                       log_path=tmp / f"server-{name}.log", startup_timeout_s=120, routing_dir=tmp)
    return LlamaServer(cfg)


def _complete(srv: LlamaServer, trace: Path) -> dict:
    req = {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "cache_prompt": False,
           "routing": {"force": os.path.relpath(trace, srv.config.routing_dir)}}
    r = srv.client.post(f"{srv.base_url}/completion", json=req)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module", params=["qwen3moe", "deepseek4"])
def cache_case(request, engine_variants, tiny_model, tiny_v4_model, llama_tree, tmp_path_factory):
    """A tiny model, skewed forced routing, a small plan, and the stock engine's tokens under that routing."""
    model = tiny_model if request.param == "qwen3moe" else tiny_v4_model
    tmp = tmp_path_factory.mktemp(f"caches-{request.param}")
    shape = moe_shape_from_gguf(model, llama_tree)
    trace = tmp / "forced.trace"
    tr = _skewed_trace(shape, len(PROMPT) + N_PREDICT + 8, seed=11)
    write_trace(trace, tr)
    rng = np.random.default_rng(5)
    hot = np.zeros((shape.n_layer, shape.n_expert), dtype=bool)
    for l in shape.moe_layers():  # a quarter of each layer's experts, so that caches miss and evict
        hot[l, rng.permutation(shape.n_expert)[: max(1, shape.n_expert // 4)]] = True
    plan = tmp / "plan.json"
    write_plan(plan, single_gpu_plan(shape, hot))
    with _server(engine_variants["stock"], model, tmp, "stock") as srv:
        ref = _complete(srv, trace)
    return model, shape, trace, tr, plan, ref, tmp


def _distinct(rows: np.ndarray) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(x) for x in rows.reshape(-1)))


@pytest.mark.parametrize("policy,args", [
    ("lru", ()),                                       # the 54-token prompt computes as llama.cpp; decode is served
    ("lru", ("--residency-cache-max-pass", "64")),     # the prompt is served too: one pass of many misses
    ("decay", ()),
    ("decay", ("--residency-decay", "0.8", "--residency-hysteresis", "0.1", "--residency-admit", "2")),
])
def test_engine_cache_decisions_equal_the_reference(engine_variants, cache_case, policy, args):
    model, shape, trace, tr, plan, ref, tmp = cache_case
    name = f"{policy}-{len(args)}"
    log_path = tmp / f"{name}.cache.tsv"
    with _server(engine_variants["ostinato"], model, tmp, name, "--residency-plan", str(plan),
                 "--residency-policy", policy, "--residency-cache-log", str(log_path), *args) as srv:
        out = _complete(srv, trace)
    # the cache changes where experts are computed, not what the model computes
    assert out["tokens"] == ref["tokens"]

    lines = read_cache_log(log_path)
    opts = dict(zip(args[::2], args[1::2]))
    kw = {"max_pass": int(opts.get("--residency-cache-max-pass", 32)),
          "decay": float(opts.get("--residency-decay", 0.95)),
          "hysteresis": float(opts.get("--residency-hysteresis", 0.25)),
          "admit": int(opts.get("--residency-admit", 1))}
    pools = PlanPools.from_plan(json.loads(plan.read_text()))
    assert replay_log(lines, policy, pools, shape.n_layer, shape.n_expert, **kw) == lines

    cache = [ln for ln in lines if ln.path == "cache"]
    assert {ln.layer for ln in cache} == set(shape.moe_layers())
    # decode steps are served by both caches; larger passes by lru up to max_pass tokens only, by decay never
    assert len({ln.pass_ for ln in cache if ln.n_tokens == 1}) >= N_PREDICT - 2
    limit = kw["max_pass"] if policy == "lru" else 1
    assert all((ln.path == "cache") == (ln.n_tokens <= limit) for ln in lines)
    # (the server prefills the prompt in one pass, or in two before a context checkpoint: 50 + 4 tokens)
    assert any(ln.n_tokens > 32 and ln.path == "cache" for ln in lines) == (limit > 32)
    # the logged experts are those the forced trace routes at the pass's positions (the last layer computes the
    # output row only); passes before the request (the server's start-up pass) route by the model's own router
    first = min(ln.pass_ for ln in lines if ln.pos0 == 0 and ln.n_tokens > 2)
    for ln in (ln for ln in cache if ln.pass_ >= first):
        pos = slice(ln.pos0, ln.pos0 + ln.n_tokens) if ln.rows == ln.n_tokens else slice(ln.pos0 + ln.n_tokens - 1,
                                                                                           ln.pos0 + ln.n_tokens)
        assert ln.experts == _distinct(tr.ids[pos, ln.layer, :]), ln
    counts = [ln.counts for ln in cache]
    assert sum(c.hits for c in counts) > 0 and sum(c.misses for c in counts) > 0
    assert sum(c.admissions for c in counts) > 0


@pytest.mark.parametrize("args,message", [
    (("--residency-policy", "fifo"), "--residency-policy must be 'static', 'lru' or 'decay', got 'fifo'"),
    (("--residency-policy", "decay", "--residency-decay", "1.5"), "--residency-decay must be a number in (0, 1]"),
    (("--residency-policy", "lru", "--residency-cache-max-pass", "0"), "--residency-cache-max-pass must be at least 1"),
    (("--residency-cache-log", "x.tsv"), "--residency-cache-log needs --residency-policy lru or decay"),
    (("--residency-policy", "lru", "--residency-prefill", "native"), "cannot be combined"),
])
def test_policy_flags_are_checked(engine_variants, cache_case, args, message):
    model, shape, trace, tr, plan, ref, tmp = cache_case
    name = "bad-" + "-".join(a.strip("-") for a in args)[:40]
    srv = _server(engine_variants["ostinato"], model, tmp, name, "--residency-plan", str(plan), *args)
    with pytest.raises(ServerError):
        srv.start()
    assert message in (tmp / f"server-{name}.log").read_text(errors="replace")


def test_policy_needs_a_plan(engine_variants, tiny_model, tmp_path):
    srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "noplan", "--residency-policy", "lru")
    with pytest.raises(ServerError):
        srv.start()
    assert "--residency-policy lru needs --residency-plan" in (tmp_path / "server-noplan.log").read_text()
