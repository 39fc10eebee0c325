"""Resident expert pools on the CPU build: plan loading, split and upload paths against the stock engine.

On the CPU build the pool lives in a host buffer, so the same tables, zero slots, skipped routes and both
prefill paths run as on a GPU. Every comparison forces the same random routing on both engines.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from ostinato.server.launcher import LlamaServer, ServerConfig, ServerError
from ostinato.models.gguf_shape import MoeShape, moe_shape_from_gguf
from ostinato.residency.budget import single_gpu_plan
from ostinato.residency.planfile import write_plan
from ostinato.routing.trace import TraceShape, random_trace, write_trace
from ostinato.sweep.prefill import by_routes_delta

PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67] * 3  # 54 tokens
N_PREDICT = 10


def _server(bin_dir: Path, model: Path, tmp: Path, name: str, *args: str) -> LlamaServer:
    cfg = ServerConfig(binary=bin_dir / "llama-server", model=model, args=["-c", "1024", "-t", "2", "-lv", "4", *args],
                       log_path=tmp / f"server-{name}.log", startup_timeout_s=120, routing_dir=tmp)
    return LlamaServer(cfg)


def _complete(srv: LlamaServer, trace: Path, **body) -> dict:
    srv.client.post(f"{srv.base_url}/slots/0?action=erase").raise_for_status()
    req = {"prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "n_probs": 8,
           "cache_prompt": False, "routing": {"force": os.path.relpath(trace, srv.config.routing_dir)}, **body}
    r = srv.client.post(f"{srv.base_url}/completion", json=req)
    r.raise_for_status()
    return r.json()


def _probs(out: dict) -> np.ndarray:
    return np.array([[t["logprob"] for t in p["top_logprobs"]] for p in out["completion_probabilities"]])


def _random_plan(shape: MoeShape, seed: int) -> np.ndarray:
    """Resident mask: a random share per layer, with one layer fully resident and one with nothing resident."""
    rng = np.random.default_rng(seed)
    hot = np.zeros((shape.n_layer, shape.n_expert), dtype=bool)
    moe = shape.moe_layers()
    for i, l in enumerate(moe):
        share = 1.0 if i == 0 else 0.0 if i == 1 else rng.uniform(0.2, 0.8)
        hot[l, rng.permutation(shape.n_expert)[: int(round(share * shape.n_expert))]] = True
    return hot


@pytest.fixture(scope="module", params=["qwen3moe", "deepseek4"])
def model_case(request, engine_variants, tiny_model, tiny_v4_model, llama_tree, tmp_path_factory):
    """A tiny model, its forced random routing, and the stock engine's outputs under it."""
    model = tiny_model if request.param == "qwen3moe" else tiny_v4_model
    tmp = tmp_path_factory.mktemp(f"rsd-{request.param}")
    shape = moe_shape_from_gguf(model, llama_tree)
    trace = tmp / "forced.trace"
    write_trace(trace, random_trace(TraceShape(shape.n_layer, shape.n_expert, shape.n_expert_used),
                                    len(PROMPT) + N_PREDICT + 8, shape.moe_layers(), seed=7))
    with _server(engine_variants["stock"], model, tmp, "stock") as srv:
        ref = _complete(srv, trace)
    return model, shape, trace, ref, tmp


@pytest.mark.parametrize("upload_min,path", [(4096, "split"), (8, "upload"), (8, "native")])
@pytest.mark.parametrize("seed", [1, 2])
def test_pools_match_stock(engine_variants, model_case, upload_min, path, seed):
    model, shape, trace, ref, tmp = model_case
    plan = tmp / f"plan-{seed}.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, seed)))
    name = f"ost-{path}-{seed}"
    native = ("--residency-prefill", "native") if path == "native" else ()
    with _server(engine_variants["ostinato"], model, tmp, name, "--residency-plan", str(plan),
                 "--residency-upload-min", str(upload_min), *native) as srv:
        out = _complete(srv, trace)
    log = srv.log_tail(200000)  # after the server stopped: llama.cpp writes its log from a thread of its own
    assert "resident experts over" in log and "take the split path" in log
    # the prompt (54 tokens) takes the upload path only when Np is small; decode always splits. With native
    # prefill (the ablation) the prompt computes as stock, whatever Np, and never uploads
    assert ("upload pass of" in log) == (path == "upload")
    # (the server may prefill the prompt in more than one pass, e.g. before a context checkpoint)
    assert bool(re.search(r"native prefill graph of \d+ tokens", log)) == (path == "native")
    assert out["tokens"] == ref["tokens"]
    # CPU build: both engines compute every expert with the same CPU kernels. CUDA build: stock computes the
    # experts on the GPU, ostinato its cold routes on the CPU, so the arithmetic differs in order
    cpu = os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu") == "cpu"
    np.testing.assert_allclose(_probs(out), _probs(ref), rtol=1e-4 if cpu else 1e-3, atol=1e-6 if cpu else 1e-3)


_NODE = re.compile(r"node #\s*(\d+) \(\s*(\S+)\):\s*(\S+)")  # (after the log's timestamp)
_SPLIT = re.compile(r"## SPLIT #(\d+): (\S+) # (\d+) inputs")


def _graph(log: str):
    """The last graph the log prints (GGML_SCHED_DEBUG=2, -lv 5), in order: ("split", index, backend, inputs copied in
    at the split's start) and ("node", position, op, name, the whole line)."""
    graph = log.split("## SPLIT #0")[-1]
    yield ("split", 0, *re.match(r":\s*(\S+) # (\d+) inputs", graph).groups())
    for line in graph.splitlines()[1:]:
        h, m = _SPLIT.search(line), _NODE.search(line)
        if h:
            yield ("split", int(h[1]), h[2], h[3])
        elif m:
            yield ("node", int(m[1]), m[2], m[3], line)


def _listing(log: str) -> list[tuple]:
    """The last graph's splits and nodes (position, op, name), as `_graph` gives them, without the lines."""
    return [e[:4] for e in _graph(log)]


def _node_order(log: str, layer: int) -> dict[str, list]:
    """Positions, in the scheduler's node list of the last graph the log prints, of one layer's split-path CPU nodes
    (cold_in, hot_wait, cold_done) and of its MUL_MAT_IDs by branch (the experts they read); and, for each, its split as
    (index, backend, inputs copied in at the split's start)."""
    kinds = ("cold_in", "hot_wait", "cold_done", "hot", "cold")
    order: dict[str, list] = {k: [] for k in (*kinds, *(f"{k}_split" for k in kinds))}
    split = None
    for e in _graph(log):
        if e[0] == "split":
            split = (e[1], e[2], int(e[3]))
            continue
        _, pos, op, name, line = e
        # a branch's MUL_MAT_IDs by the experts they multiply: the layer's own host tensors (blk.<il>.ffn_*_exps) for
        # the cold routes, a pool's for the hot ones (the log cuts source names at 20 characters, and on a GPU build
        # names a copied-in source "<backend>#<name>", so the ids' names cannot tell the branches apart)
        ours = op == "MUL_MAT_ID" and re.fullmatch(rf"ffn_moe_\w+-{layer}", name)
        node = re.fullmatch(rf"ffn_moe_(cold_in|hot_wait|cold_done)-{layer}", name)
        kind = (node[1] if node else
                "cold" if ours and f"blk.{layer}.ffn_" in line else
                "hot" if ours and re.search(r"\spool\d+\.", line) else None)
        if kind:
            order[kind].append(pos)
            order[f"{kind}_split"].append(split)
    return order


@pytest.mark.parametrize("policy", ["static", "decay"])
def test_overlapped_branches_compute_bitwise_what_in_turn_computes(engine_variants, model_case, policy):
    """--residency-branches overlap changes only whether the CPU waits for the GPU branch before it computes the cold
    routes: the scheduler runs the same graph in both orders, node for node and split for split, ordered as the overlap
    needs (cold inputs to the CPU, GPU branch, the wait, cold routes). Same plan, routing and policy: the same tokens and
    bitwise the same probabilities."""
    model, shape, trace, _, tmp = model_case
    plan = tmp / "plan-overlap.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 5)))
    pol = ("--residency-policy", policy) if policy != "static" else ()
    outs, orders, listings = {}, {}, {}
    for branches in ("inturn", "overlap"):
        name = f"branches-{branches}-{policy}"
        cfg = ServerConfig(binary=engine_variants["ostinato"] / "llama-server", model=model,
                           args=["-c", "1024", "-t", "2", "-lv", "5", "--residency-plan", str(plan),
                                 "--residency-upload-min", "4096", "--residency-branches", branches, *pol],
                           log_path=tmp / f"server-{name}.log", startup_timeout_s=120, routing_dir=tmp,
                           env={"GGML_SCHED_DEBUG": "2"})
        with LlamaServer(cfg) as srv:
            outs[branches] = _complete(srv, trace)
        log = srv.log_tail(10**8)
        assert ("overlap their branches" in log) == (branches == "overlap")
        # a layer with some resident and some cold experts (the plan's first MoE layer is all resident, the second
        # has nothing resident)
        orders[branches] = _node_order(log, shape.moe_layers()[2])
        listings[branches] = _listing(log)
    assert outs["overlap"]["tokens"] == outs["inturn"]["tokens"]
    assert np.array_equal(_probs(outs["overlap"]), _probs(outs["inturn"]))
    assert listings["overlap"] == listings["inturn"] and len(listings["inturn"]) > 20
    for order in orders.values():
        _assert_branch_order(order)


def _assert_branch_order(o: dict[str, list], gpu: bool | None = None) -> None:
    """One layer's split path, from `_node_order`: [cold_in] [GPU branch] [hot_wait] [CPU branch] [cold_done]. On a GPU
    build (`gpu` None: the hot branch's split says) the GPU branch is a split of its own between the CPU split that copies
    the cold inputs in and the CPU split of hot_wait and the cold routes, which copies nothing in, so the scheduler does
    not wait for the GPU before it (only hot_wait does, in turn)."""
    for node in ("cold_in", "hot_wait", "cold_done"):
        assert len(o[node]) == 1, o
    assert o["hot"] and o["cold"], o
    assert o["cold_in"][0] < min(o["hot"]) and max(o["hot"]) < o["hot_wait"][0] < min(o["cold"]), o
    assert max(o["cold"]) < o["cold_done"][0], o
    if gpu is None:
        gpu = any(b != "CPU" for _, b, _ in o["hot_split"])
    if gpu:
        (ci, ci_b, ci_n), = set(o["cold_in_split"])
        (c, c_b, c_n), = set(o["cold_split"]) | set(o["hot_wait_split"])
        assert ci_b == c_b == "CPU" and ci_n >= 1 and c_n == 0, o
        assert all(ci < h < c and b != "CPU" for h, b, _ in o["hot_split"]), o


def test_node_order_of_the_shipped_cuda_logs():
    """The scheduler's listings on the H200 (data/reference/h200/branches/tests-cuda-logs/, qwen3moe, static plan): the
    same graph in turn and overlapped, and in it the GPU branch is a CUDA split between the CPU split that copies the
    cold inputs in and the CPU split of hot_wait and the cold routes, which copies nothing in."""
    import gzip

    logs = Path(__file__).resolve().parents[1] / "data/reference/h200/branches/tests-cuda-logs"
    text = {b: gzip.decompress((logs / f"server-branches-{b}-static.log.gz").read_bytes()).decode("utf-8", errors="replace")
            for b in ("inturn", "overlap")}
    assert _listing(text["inturn"]) == _listing(text["overlap"])
    for log in text.values():
        order = _node_order(log, 2)
        assert all(b.startswith("CUDA") for _, b, _ in order["hot_split"])
        _assert_branch_order(order, gpu=True)


def _timings(srv: LlamaServer, after_pass: int = 0) -> dict:
    r = srv.client.get(f"{srv.base_url}/residency", params={"after_pass": after_pass})
    r.raise_for_status()
    return r.json()


def test_timers_time_each_branch_and_count_every_layers_cold_routes(engine_variants, model_case):
    """--residency-timers: every split-path pass gives, per layer with a pool, the times of its two branches and its
    cold routes at GET /residency. The cold routes are exactly those of the forced routing outside the plan (prompt and
    decode steps, position by position), the outputs bitwise those of the untimed engine, and without the flag the
    server says it has no timers."""
    from ostinato.routing.trace import read_trace

    model, shape, trace, _, tmp = model_case
    hot = _random_plan(shape, 6)
    plan = tmp / "plan-timers.json"
    write_plan(plan, single_gpu_plan(shape, hot))
    ids = read_trace(trace).ids  # [position, layer, k]
    outs = {}
    for timed in (False, True):
        with _server(engine_variants["ostinato"], model, tmp, f"timers-{timed}", "--residency-plan", str(plan),
                     "--residency-upload-min", "4096", *(("--residency-timers",) if timed else ())) as srv:
            before = _timings(srv)
            assert before["timers"] == timed and before["n_resident"] == int(hot.sum())
            last = max([t["pass"] for t in before["timings"]], default=0)  # the start-up warm-up's passes
            outs[timed] = _complete(srv, trace)
            got = _timings(srv, last)  # (the server answers after the request's last pass)
        if not timed:
            assert got["timings"] == []
            continue
        passes = sorted({t["pass"] for t in got["timings"]})
        layers = [l for l in shape.moe_layers()]
        pos = 0
        for p in passes:
            rows = {t["layer"]: t for t in got["timings"] if t["pass"] == p}
            assert sum(t["pass"] == p for t in got["timings"]) == len(rows)  # one timing per layer and pass
            assert sorted(rows) == layers, (p, [(t['pass'], t['layer'], t['n_tokens']) for t in got['timings']])
            n = rows[layers[0]]["n_tokens"]
            for l, t in rows.items():
                # the last layer computes the output rows only: the pass's last position (llama.cpp's inp_out_ids)
                m = t["n_tokens"] if l == layers[-1] else n
                expect = int((~hot[l][ids[pos + n - m:pos + n, l].astype(np.int64)]).sum())
                assert (t["n_tokens"], t["n_cold"]) == (m, expect), (p, l, pos)
                assert t["gpu_ms"] >= 0 and t["cpu_ms"] >= 0
            pos += n
        # the prompt, then one pass per generated token but the last
        assert pos == len(PROMPT) + N_PREDICT - 1
    assert outs[True]["tokens"] == outs[False]["tokens"]
    assert np.array_equal(_probs(outs[True]), _probs(outs[False]))


def test_residency_endpoint_refuses_bad_queries_and_servers_without_a_plan(engine_variants, tiny_model, llama_tree,
                                                                          tmp_path):
    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    plan = tmp_path / "plan.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 1)))
    with _server(engine_variants["ostinato"], tiny_model, tmp_path, "endpoint", "--residency-plan", str(plan)) as srv:
        for bad in ("-1", "x", "1e3", "", "99999999999999999999999"):
            r = srv.client.get(f"{srv.base_url}/residency", params={"after_pass": bad})
            assert r.status_code == 400 and "after_pass" in r.json()["error"]["message"], (bad, r.text)
        assert srv.client.get(f"{srv.base_url}/health").status_code == 200
    with _server(engine_variants["ostinato"], tiny_model, tmp_path, "no-plan") as srv:
        r = srv.client.get(f"{srv.base_url}/residency")
        assert r.status_code == 501 and "--residency-plan" in r.json()["error"]["message"]
    srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "bad-timers", "--residency-timers")
    with pytest.raises(ServerError):
        srv.start()
    assert "--residency-timers needs --residency-plan" in (tmp_path / "server-bad-timers.log").read_text()


def test_branches_flag_is_checked(engine_variants, tiny_model, tmp_path):
    for args, message in [(("--residency-branches", "both"), "--residency-branches must be 'inturn' or 'overlap', got 'both'"),
                          (("--residency-branches", "overlap"), "--residency-branches overlap needs --residency-plan")]:
        srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "bad-branches", *args)
        with pytest.raises(ServerError):
            srv.start()
        assert message in (tmp_path / "server-bad-branches.log").read_text()


BORROW_PREDICT = 16  # decode steps enough for copies to join and be hit (the forced trace covers them)


def test_borrowed_memory_lends_decode_the_staging_area(engine_variants, model_case):
    """--residency-borrow: decode steps compute the cold experts the CPU used most from borrowed staging slots (copied
    while a step computes, joining at the next token boundary), and an upload pass takes every slot back. Same plan and
    routing: the same tokens, and bitwise the same probabilities with the branches in turn and overlapped (the tables
    follow the routing alone, whatever the copies' timing); on the CPU build, where one kernel computes both branches,
    also bitwise those of the engine without borrowing. GET /residency counts the steps that hit a borrowed expert."""
    model, shape, trace, _, tmp = model_case
    plan = tmp / "plan-borrow.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 9)))
    cpu = os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu") == "cpu"

    def run(name: str, upload_min: int, requests: int, *args: str) -> tuple[list[dict], dict]:
        with _server(engine_variants["ostinato"], model, tmp, name, "--residency-plan", str(plan),
                     "--residency-upload-min", str(upload_min), *args) as srv:
            before = _timings(srv)["borrow"]  # (the start-up warm-up's passes)
            outs = [_complete(srv, trace, n_predict=BORROW_PREDICT) for _ in range(requests)]
            after = _timings(srv)["borrow"]
        return outs, {k: after[k] - before[k] if k not in ("slots", "active") else after[k] for k in after}

    # split path only (Np beyond the prompt): nothing is taken back
    (off,), st_off = run("borrow-off", 4096, 1)
    assert st_off["slots"] == 0 and st_off["hits"] == 0
    outs, stats = {}, {}
    for branches in ("inturn", "overlap"):
        (outs[branches],), stats[branches] = run(f"borrow-{branches}", 4096, 1, "--residency-borrow", "all",
                                                 "--residency-branches", branches)
    st = stats["inturn"]
    assert stats["overlap"] == {**st, "ms": stats["overlap"]["ms"], "wait_ms": stats["overlap"]["wait_ms"]}
    assert st["slots"] == shape.n_expert  # one pool, its staging area's experts
    assert st["steps"] == BORROW_PREDICT - 1  # one token boundary per decode step (the last token is not computed)
    assert st["admissions"] > 0 and st["active"] == st["admissions"] - st["evictions"] > 0
    assert 0 < st["steps_hit"] <= st["steps"] and st["hits"] >= st["steps_hit"]
    assert st["reclaimed"] == 0 and st["bytes"] > 0
    assert outs["overlap"]["tokens"] == outs["inturn"]["tokens"] == off["tokens"]
    assert np.array_equal(_probs(outs["overlap"]), _probs(outs["inturn"]))
    if cpu:
        assert np.array_equal(_probs(outs["inturn"]), _probs(off))
    else:
        np.testing.assert_allclose(_probs(outs["inturn"]), _probs(off), rtol=1e-3, atol=1e-3)

    # a prompt that takes the upload path takes back what the last request's decode borrowed
    ref, _ = run("borrow-upload-off", 32, 2)
    got, st = run("borrow-upload", 32, 2, "--residency-borrow", "all")
    assert st["reclaim_passes"] >= 1 and st["reclaimed"] > 0 and st["hits"] > 0
    for g, r in zip(got, ref):
        assert g["tokens"] == r["tokens"]
        if cpu:
            assert np.array_equal(_probs(g), _probs(r))
        else:
            np.testing.assert_allclose(_probs(g), _probs(r), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("borrow", [False, True])
def test_one_graph_per_decode_step_computes_bitwise_what_per_segment_graphs_compute(engine_variants, model_case, borrow):
    """--residency-graph step: a decode step's cold routes leave the scheduler's graph for the resident CPU worker (a
    SEND and a RECV node per MoE layer with a pool, none of the cold routes' nodes), the worker answers every layer of
    every decode step, a layer whose routes are all resident costs it nothing, and the outputs are the same tokens and
    bitwise the same probabilities as per-segment graphs' (with borrowed memory too, with the same borrow counters).
    The GPU branch is one expert computation, borrowed experts included (they sit in the same tensors as the pool's)."""
    model, shape, trace, _, tmp = model_case
    plan = tmp / "plan-graph.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 5)))
    moe = shape.moe_layers()
    # the worker's threads: by default -t minus one (here 1); with borrowed memory set explicitly
    extra = ("--residency-borrow", "all", "--residency-worker-threads", "2") if borrow else ()
    outs, stats, logs = {}, {}, {}
    for graph in ("segments", "step"):
        name = f"graph-{graph}-{borrow}"
        cfg = ServerConfig(binary=engine_variants["ostinato"] / "llama-server", model=model,
                           args=["-c", "1024", "-t", "2", "-lv", "5", "--residency-plan", str(plan),
                                 "--residency-upload-min", "4096", "--residency-branches", "overlap",
                                 "--residency-graph", graph, *extra],
                           log_path=tmp / f"server-{name}.log", startup_timeout_s=120, routing_dir=tmp,
                           env={"GGML_SCHED_DEBUG": "2"})
        with LlamaServer(cfg) as srv:
            before = _timings(srv)
            outs[graph] = _complete(srv, trace, n_predict=BORROW_PREDICT)
            after = _timings(srv)
        logs[graph] = srv.log_tail(10**8)
        stats[graph] = {k: {c: by_routes_delta(before[k][c], after[k][c]) if c == "by_routes"
                            else after[k][c] - before[k][c] if not isinstance(after[k][c], bool) and c not in ("slots", "active", "threads")
                            else after[k][c] for c in after[k]} for k in ("graph", "borrow")}
    assert outs["step"]["tokens"] == outs["segments"]["tokens"]
    assert np.array_equal(_probs(outs["step"]), _probs(outs["segments"]))
    g = stats["step"]["graph"]
    assert g["step"] and not stats["segments"]["graph"]["step"] and stats["segments"]["graph"]["branches"] == 0
    assert g["threads"] == (2 if borrow else 1) and stats["segments"]["graph"]["threads"] == 0, g
    assert f"1 resident CPU worker(s) of {g['threads']} threads take the cold routes" in logs["step"]
    # one answer per MoE layer and decode step (the last token is not computed); the plan's first MoE layer is all
    # resident: its answers cost nothing
    assert g["branches"] == (BORROW_PREDICT - 1) * len(moe), g
    assert BORROW_PREDICT - 1 <= g["skipped"] < g["branches"], g
    # the breakdown by cold routes: every answered layer once, the skipped ones at r = 0 with no compute time, the
    # routes of the others between one and k each, their compute time within the worker's
    by = {r: (n, ms) for r, n, ms in g["by_routes"]}
    assert sum(n for n, _ in by.values()) == g["branches"] and by[0] == (g["skipped"], 0.0), g
    assert g["routes"] == sum(r * n for r, (n, _) in by.items()) and max(by) <= shape.n_expert_used, g
    assert g["branches"] - g["skipped"] <= g["routes"], g
    assert 0 < g["compute_ms"] <= g["cpu_ms"] and sum(ms for _, ms in by.values()) == pytest.approx(g["compute_ms"], abs=1e-3)
    assert stats["segments"]["graph"]["routes"] == 0 and stats["segments"]["graph"]["by_routes"] == []
    if borrow:
        assert stats["step"]["borrow"]["steps_hit"] > 0
        drop = ("ms", "wait_ms")
        assert {k: v for k, v in stats["step"]["borrow"].items() if k not in drop} == \
            {k: v for k, v in stats["segments"]["borrow"].items() if k not in drop}
    assert "decode steps compute as one graph per device" in logs["step"] and "asleep between steps" in logs["step"]
    # the last graph the log lists is a decode step's
    names = [e[3] for e in _graph(logs["step"]) if e[0] == "node"]
    for l in moe:
        assert f"ffn_moe_host_send-{l}" in names and f"ffn_moe_host_recv-{l}" in names, l
        order = _node_order(logs["step"], l)
        assert order["hot"] and not order["cold"] and not order["cold_in"] and not order["hot_wait"], (l, order)
        send, recv = names.index(f"ffn_moe_host_send-{l}"), names.index(f"ffn_moe_host_recv-{l}")
        hot = [names.index(n) for n in names if re.fullmatch(rf"ffn_moe_(up|gate|down|gate_up)-{l}", n)]
        assert hot and send < min(hot) and max(hot) < recv, (l, send, hot, recv)  # the GPU branch between the two
        # one expert computation on the GPU, borrowed experts included: every MUL_MAT_ID of the layer reads the pool's
        # tensors (with borrowed memory the pool's slots and its staging area's in one), one per expert matrix
        mmid = [e for e in _graph(logs["step"]) if e[0] == "node" and e[2] == "MUL_MAT_ID"
                and re.fullmatch(rf"ffn_moe_\w+-{l}", e[3])]
        assert mmid and len(mmid) == len(order["hot"]) <= 3, (l, [e[4] for e in mmid])
        assert all((" pool0.all." in e[4]) == borrow for e in mmid), (l, [e[4] for e in mmid])


def test_a_cpu_worker_that_answers_late_fails_the_step_with_an_error_naming_the_layer(engine_variants, model_case):
    """A worker that does not answer within --residency-worker-timeout (here made late on purpose,
    OSTINATO_TEST_WORKER_STALL_MS) fails the decode step: the request gets an error, the log names the layer and the
    step, the server keeps serving, and later requests compute on per-segment graphs (the same tokens as without)."""
    model, shape, trace, ref, tmp = model_case
    plan = tmp / "plan-stall.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 5)))
    base = ["-c", "1024", "-t", "2", "-lv", "4", "--residency-plan", str(plan), "--residency-upload-min", "4096"]
    cfg = ServerConfig(binary=engine_variants["ostinato"] / "llama-server", model=model,
                       args=[*base, "--no-warmup", "--residency-graph", "step", "--residency-worker-timeout", "20"],
                       log_path=tmp / "server-stall.log", startup_timeout_s=120, routing_dir=tmp,
                       env={"OSTINATO_TEST_WORKER_STALL_MS": "200"})
    with LlamaServer(cfg) as srv:
        srv.client.post(f"{srv.base_url}/slots/0?action=erase").raise_for_status()
        r = srv.client.post(f"{srv.base_url}/completion", json={
            "prompt": PROMPT, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True, "cache_prompt": False,
            "routing": {"force": os.path.relpath(trace, srv.config.routing_dir)}})
        assert r.status_code >= 400 or "error" in r.text, r.text[:300]
        assert srv.client.get(f"{srv.base_url}/health").status_code == 200
        again = _complete(srv, trace)
    log = srv.log_tail(10**7)
    m = re.search(r"the CPU worker did not answer layer (\d+) of decode step (\d+) within 20\.000 ms", log)
    assert m and int(m[1]) in shape.moe_layers(), log[-3000:]
    assert again["tokens"] == ref["tokens"]


def test_the_device_counts_its_waits_for_a_slow_worker(engine_variants, model_case):
    """A worker slowed to 3 ms per answer (OSTINATO_TEST_WORKER_STALL_MS) within the timeout: the step succeeds, its
    tokens are those of per-segment graphs, and GET /residency's `graph` counts the worker's time and the device's waits
    for its answers, each at least half the stall for every layer answered (the device's own work between a SEND and
    its RECV takes a small part of that), and that own work (`gpu_ms`, the GPU branch), which with the waits fits in
    the request's time."""
    model, shape, trace, ref, tmp = model_case
    plan = tmp / "plan-wait.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 5)))
    cfg = ServerConfig(binary=engine_variants["ostinato"] / "llama-server", model=model,
                       args=["-c", "1024", "-t", "2", "--residency-plan", str(plan), "--residency-upload-min", "4096",
                             "--no-warmup", "--residency-graph", "step"],
                       log_path=tmp / "server-wait.log", startup_timeout_s=120, routing_dir=tmp,
                       env={"OSTINATO_TEST_WORKER_STALL_MS": "3"})
    with LlamaServer(cfg) as srv:
        before = _timings(srv)["graph"]
        t0 = time.perf_counter()
        out = _complete(srv, trace)
        wall_ms = (time.perf_counter() - t0) * 1e3
        after = _timings(srv)["graph"]
    n = after["branches"] - before["branches"]
    gpu, wait = after["gpu_ms"] - before["gpu_ms"], after["wait_ms"] - before["wait_ms"]
    assert 0 < gpu and gpu + wait <= wall_ms, (before, after, wall_ms)
    assert out["tokens"] == ref["tokens"] and n > 0, (n, out["tokens"], ref["tokens"])
    assert after["cpu_ms"] - before["cpu_ms"] >= 0.95 * 3 * n, (before, after)
    # (no upper bound: a receive notices the answer when its thread runs, which on a loaded machine comes later)
    assert after["wait_ms"] - before["wait_ms"] >= 0.5 * 3 * n, (before, after)


def test_graph_flags_are_checked(engine_variants, tiny_model, llama_tree, tmp_path):
    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    plan = tmp_path / "plan.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 1)))
    with_plan = ("--residency-plan", str(plan))
    for args, message in [
            (("--residency-graph", "one"), "--residency-graph must be 'segments' or 'step', got 'one'"),
            (("--residency-graph", "step"), "--residency-graph step needs --residency-plan"),
            ((*with_plan, "--residency-graph", "step", "--residency-timers"),
             "--residency-graph step and --residency-timers cannot be combined"),
            ((*with_plan, "--residency-graph", "step", "--residency-policy", "decay"),
             "--residency-graph step works with --residency-policy static only"),
            ((*with_plan, "--residency-worker-timeout", "0"),
             "--residency-worker-timeout must be a number of milliseconds > 0, got '0'"),
            ((*with_plan, "--residency-graph", "step", "--residency-worker-threads", "0"),
             "--residency-worker-threads must be a whole number from 1 to 512, got '0'")]:
        srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "bad-graph", *args)
        with pytest.raises(ServerError):
            srv.start()
        assert message in (tmp_path / "server-bad-graph.log").read_text(), args


def test_borrowed_memory_follows_the_python_reference(engine_variants, model_case):
    """The engine's borrow counters equal those of `ostinato.residency.borrow.BorrowedSlots` run over the same passes
    (as the timers report them: the prompt's, each layer's rows, then one pass per decode step) and the same forced
    routes, with few slots and a small margin so that the slots fill up and experts are evicted."""
    from dataclasses import asdict

    from ostinato.residency.borrow import BorrowedSlots, BorrowParams
    from ostinato.routing.trace import read_trace

    model, shape, trace, _, tmp = model_case
    hot = _random_plan(shape, 10)
    plan = tmp / "plan-borrow-ref.json"
    write_plan(plan, single_gpu_plan(shape, hot))
    params = BorrowParams(slots=3, decay=0.9, margin=0.1, admit=2)
    # no warm-up (its routing is the model's own); the server's start-up check of the context (two tokens from position
    # 0, after the routing flags) is forced, as the request's prompt
    with _server(engine_variants["ostinato"], model, tmp, "borrow-ref", "--residency-plan", str(plan), "--no-warmup",
                 "--routing-force", str(trace), "--residency-upload-min", "4096", "--residency-timers",
                 "--residency-borrow", str(params.slots), "--residency-borrow-decay", str(params.decay),
                 "--residency-borrow-margin", str(params.margin), "--residency-borrow-admit", str(params.admit)) as srv:
        first = max([t["pass"] for t in _timings(srv)["timings"]], default=0) + 1  # the request's first pass
        _complete(srv, trace, n_predict=BORROW_PREDICT)
        got = _timings(srv)
    assert "in 1 pool(s)" in srv.log_tail(10**7)  # a single-GPU plan of equal-sized layers
    moe = shape.moe_layers()
    ref = BorrowedSlots(hot, [0 if l in moe else -1 for l in range(shape.n_layer)], params)
    ids = read_trace(trace).ids
    pos = 0
    for p in sorted({t["pass"] for t in got["timings"]}):
        rows = {t["layer"]: t["n_tokens"] for t in got["timings"] if t["pass"] == p}
        n = rows[moe[0]]
        if p == first:
            pos = 0
        if n == 1:
            ref.boundary()
        for l in moe:
            ref.record(l, ids[pos + n - rows[l]:pos + n, l], decode=n == 1)
        pos += n
    assert pos == len(PROMPT) + BORROW_PREDICT - 1, [(t["pass"], t["layer"], t["n_tokens"]) for t in got["timings"]]
    assert {k: got["borrow"][k] for k in asdict(ref.counts)} == asdict(ref.counts)
    assert ref.counts.evictions > 0 and ref.counts.steps_hit > 0


def test_borrow_flags_are_checked(engine_variants, tiny_model, llama_tree, tmp_path):
    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    plan = tmp_path / "plan.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 1)))
    with_plan = ("--residency-plan", str(plan))
    for args, message in [
            (("--residency-borrow", "some"), "--residency-borrow must be 'off', 'all' or a number of slots >= 0, got 'some'"),
            (("--residency-borrow", "4"), "--residency-borrow needs --residency-plan"),
            ((*with_plan, "--residency-borrow", "4", "--residency-policy", "lru"),
             "--residency-borrow and --residency-policy lru cannot be combined"),
            ((*with_plan, "--residency-borrow", "all", "--residency-prefill", "native"),
             "--residency-borrow and --residency-prefill native cannot be combined"),
            ((*with_plan, "--residency-borrow-decay", "0"), "--residency-borrow-decay must be a number in (0, 1], got '0'"),
            ((*with_plan, "--residency-borrow-margin", "-1"), "--residency-borrow-margin must be a number >= 0, got '-1'"),
            ((*with_plan, "--residency-borrow-admit", "0"), "--residency-borrow-admit must be at least 1")]:
        srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "bad-borrow", *args)
        with pytest.raises(ServerError):
            srv.start()
        assert message in (tmp_path / "server-bad-borrow.log").read_text(), args


def test_forced_tokens_come_back_with_a_plan(engine_variants, model_case):
    model, shape, trace, _, tmp = model_case
    plan = tmp / "plan-tokens.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 3)))
    forced = [int(t) for t in np.random.default_rng(4).integers(32, 127, size=N_PREDICT)]
    for upload_min in (4096, 8):
        with _server(engine_variants["ostinato"], model, tmp, f"tokens-{upload_min}", "--residency-plan", str(plan),
                     "--residency-upload-min", str(upload_min)) as srv:
            out = _complete(srv, trace, forced_tokens=forced)
        assert out["tokens"] == forced


def test_native_prefill_flag_is_checked(engine_variants, tiny_model, tmp_path):
    srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, "bad-prefill", "--residency-prefill", "fast")
    with pytest.raises(ServerError):
        srv.start()
    assert "--residency-prefill must be 'paths' or 'native', got 'fast'" in (tmp_path / "server-bad-prefill.log").read_text()


def _bad_start(engine_variants, model: Path, tmp: Path, plan: Path, name: str) -> str:
    srv = _server(engine_variants["ostinato"], model, tmp, name, "--residency-plan", str(plan))
    with pytest.raises(ServerError):
        srv.start()
    return (tmp / f"server-{name}.log").read_text(errors="replace")


def test_bad_plans_are_clear_errors(engine_variants, tiny_model, llama_tree, tmp_path):
    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    good = single_gpu_plan(shape, {l: [0, 1] for l in shape.moe_layers()})
    write_plan(tmp_path / "good.json", good)
    doc = json.loads((tmp_path / "good.json").read_text())

    bad = dict(doc, checksum="fnv1a64:0000000000000000")
    (tmp_path / "cs.json").write_text(json.dumps(bad))
    assert "key 'checksum'" in _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "cs.json", "cs")

    bad = json.loads(json.dumps(doc))
    bad["model"]["n_expert"] = shape.n_expert * 2
    (tmp_path / "shape.json").write_text(json.dumps(bad))
    assert "key 'model'" in _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "shape.json", "shape")

    bad = json.loads(json.dumps(doc))
    bad["model"]["expert_bytes"][shape.moe_layers()[0]] += 1
    (tmp_path / "bytes.json").write_text(json.dumps(bad))
    assert "expert_bytes" in _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "bytes.json", "bytes")

    assert "cannot open" in _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "missing.json", "missing")


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(version=1.0), "key 'format'/'version'"),
    (lambda d: d.update(gpus={"0": d["gpus"][0]}), "key 'gpus': expected a non-empty array"),
    (lambda d: d.update(gpus=[]), "key 'gpus': expected a non-empty array"),
    (lambda d: d["gpus"][0].update(pool_bytes=-1), "key 'gpus[0].pool_bytes': expected an integer >= 0"),
    (lambda d: d["model"].update(n_expert=3.0), "key 'model.n_expert': expected an integer >= 1"),
    (lambda d: d["gpus"][0]["slots"][0].append(0), "key 'gpus[0].slots': expected [layer, expert] pairs"),
    (lambda d: d["gpus"][0]["slots"].reverse(), "slots are sorted by layer, then expert"),
])
def test_plan_types_are_checked_as_the_schema_states(engine_variants, tiny_model, llama_tree, tmp_path, edit, message):
    """The engine reads a plan by the rules of src/ostinato/residency/plan.schema.json, as the Python reader does."""
    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    write_plan(tmp_path / "good.json", single_gpu_plan(shape, {l: [0, 1] for l in shape.moe_layers()}))
    doc = json.loads((tmp_path / "good.json").read_text())
    edit(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    assert message in _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "bad.json", "bad")


def test_plan_of_the_wrong_model_is_refused(engine_variants, tiny_model, tiny_v4_model, llama_tree, tmp_path):
    v4 = moe_shape_from_gguf(tiny_v4_model, llama_tree)
    write_plan(tmp_path / "v4.json", single_gpu_plan(v4, {l: [0] for l in v4.moe_layers()}))
    log = _bad_start(engine_variants, tiny_model, tmp_path, tmp_path / "v4.json", "wrong")
    assert "residency plan" in log and "key 'model" in log


def test_engine_and_python_accept_the_same_plans(engine_variants, tiny_model, llama_tree, tmp_path):
    """Mutated plans of the tiny model: the engine loads one exactly when the Python reader accepts it and its model
    section matches the model (the engine also checks the plan against the model it serves)."""
    from test_fuzz import _with_checksum, mutate_doc

    from ostinato.residency.planfile import read_plan

    shape = moe_shape_from_gguf(tiny_model, llama_tree)
    write_plan(tmp_path / "good.json", single_gpu_plan(shape, {l: [0, 1, 3] for l in shape.moe_layers()}))
    base = json.loads((tmp_path / "good.json").read_text())
    rng = np.random.default_rng(17)
    outcomes = {"both accept": 0, "both refuse": 0}
    for i in range(24):
        doc = mutate_doc(json.loads(json.dumps(base)), rng, 1)
        if i % 2 == 0 and isinstance(doc, dict):  # a consistent checksum, so the rules behind it show
            doc = _with_checksum(doc)
        path = tmp_path / f"case{i}.json"
        path.write_text(json.dumps(doc))
        try:
            p = read_plan(path)
            py_ok = ((p.n_layer, p.n_expert, p.n_expert_used) == (shape.n_layer, shape.n_expert, shape.n_expert_used)
                     and list(p.expert_bytes) == list(shape.expert_bytes))
        except ValueError:
            py_ok = False
        srv = _server(engine_variants["ostinato"], tiny_model, tmp_path, f"plan{i}", "--residency-plan", str(path))
        try:
            srv.start()
            engine_ok = True
        except ServerError:
            engine_ok = False
        finally:
            srv.stop()
        assert engine_ok == py_ok, f"case {i}: engine {'accepts' if engine_ok else 'refuses'} {json.dumps(doc)[:400]}"
        outcomes["both accept" if py_ok else "both refuse"] += 1
    assert outcomes["both accept"] > 0 and outcomes["both refuse"] > 0, outcomes


@pytest.mark.parametrize("policy", ["static", "decay", "borrow"])
def test_whole_sessions_overlapped_replay_bitwise_the_in_turn_replay(engine_variants, model_case, policy):
    """The Appendix A check over whole sessions: multi-turn sessions replayed through llama-server (growing prompts,
    the prompt cache, forced outputs and forced routing), once with the split path's branches in turn, once
    overlapped and (static plan, borrowed memory) once with one graph per decode step, return the same tokens and
    bitwise the same top log-probabilities in every request
    (`replay run --record-probs`, `replay bitwise`). With borrowed memory (static plan), both replays also count the
    same decode steps on borrowed experts, some of them in every session; on the CPU build, where one kernel computes
    both branches, they are also bitwise the replay without borrowed memory."""
    import dataclasses

    from ostinato.replay.bitwise import compare
    from ostinato.replay.runner import ReplayConfig, run_replay
    from ostinato.sessions.model import TokenizedRequest, TokenizedSession

    model, shape, _, _, tmp = model_case
    rng = np.random.default_rng(11)
    sessions = [TokenizedSession(f"bw/s{s}", "test", "byte", "chatml", tuple(
        TokenizedRequest(t, "first" if t == 0 else "tool", tuple(int(x) for x in rng.integers(32, 120, 40 if t == 0 else 12)),
                         tuple(int(x) for x in rng.integers(32, 120, 6)))
        for t in range(3))) for s in range(2)]
    force = tmp / f"bw-force-{policy}"
    for i, s in enumerate(sessions):
        n_pos = sum(len(r.new_token_ids) + len(r.output_token_ids) for r in s.requests)
        write_trace(force / (s.session_id.replace("/", "__") + ".route"),
                    random_trace(TraceShape(shape.n_layer, shape.n_expert, shape.n_expert_used), n_pos,
                                 shape.moe_layers(), seed=20 + i))
    plan = tmp / f"plan-bw-{policy}.json"
    write_plan(plan, single_gpu_plan(shape, _random_plan(shape, 9)))
    pol = {"static": (), "decay": ("--residency-policy", "decay"), "borrow": ("--residency-borrow", "all")}[policy]
    outs = {}
    cpu = os.environ.get("OSTINATO_ENGINE_BACKEND", "cpu") == "cpu"
    steps = ("inturn", "overlap") + (("step",) if policy != "decay" else ()) + (("none",) if policy == "borrow" and cpu else ())
    for branches in steps:
        out = tmp / f"bw-{policy}-{branches}"
        cfg = ReplayConfig("ostinato", out, machine="test", progress=False, record_probs=4, routing_force_dir=force,
                           borrow_counters=policy == "borrow" and branches != "none")
        flags = (("--residency-branches", "inturn") if branches == "none" else
                 ("--residency-branches", "overlap", "--residency-graph", "step", *pol) if branches == "step" else
                 ("--residency-branches", branches, *pol))
        srv = _server(engine_variants["ostinato"], model, tmp, f"bw-{policy}-{branches}", "--residency-plan", str(plan),
                      "--residency-upload-min", "4096", *flags)
        srv = LlamaServer(dataclasses.replace(srv.config, routing_dir=cfg.routing_dir()))
        with srv:
            summary = run_replay(sessions, srv, cfg)
        assert summary.done == [s.session_id for s in sessions] and not summary.failed
        outs[branches] = out / "ostinato"
    report = compare(outs["inturn"], outs["overlap"])
    assert report.equal, report.differences[:3]
    assert (report.sessions, report.requests) == (2, 6)
    assert report.tokens == sum(len(r.output_token_ids) for s in sessions for r in s.requests)
    if "step" in outs:
        # one graph per decode step: the same tokens and probabilities (and borrow counters) as in turn
        graph = compare(outs["inturn"], outs["step"])
        assert graph.equal and graph.tokens == report.tokens and graph.borrow_b == report.borrow_a, graph.differences[:3]
    if policy == "borrow":
        # shown with pytest -rA, so a GPU run's log says how many decode steps hit a borrowed expert
        print(f"bitwise {policy}: {report.requests} requests, {report.tokens} tokens; borrow counters {report.borrow_a}")
        assert report.borrow_a == report.borrow_b and report.borrow_a["steps"] == 2 * 3 * (6 - 1)
        assert 0 < report.borrow_a["steps_hit"] <= report.borrow_a["hits"]
        from ostinato.replay.bitwise import _sessions
        for sid, turns in _sessions(outs["overlap"]).items():
            assert sum(t["borrow"]["steps_hit"] for t in turns.values()) > 0, sid
        if cpu:
            plain = compare(outs["none"], outs["overlap"])
            assert plain.equal and plain.tokens == report.tokens, plain.differences[:3]
            assert plain.borrow_a is None and plain.borrow_b == report.borrow_b
    else:
        assert report.borrow_a is None and report.borrow_b is None
