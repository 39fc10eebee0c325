"""The patched llama-server as a local agent's server: no request makes it crash, hang, or reach files outside
--routing-dir (the CPU build; issue 17). Every case asserts the outcome: a clear 4xx error or a correct result, and a
server that still answers afterwards."""

from __future__ import annotations

import json
import os
import random
import struct
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from ostinato.routing.trace import TraceShape, random_trace, write_trace
from ostinato.server.launcher import LlamaServer, ServerConfig

PROMPT = [1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10] * 2


def _server(bin_dir: Path, model: Path, tmp: Path, routing_dir: Path | None, *args: str,
            env: dict[str, str] | None = None) -> LlamaServer:
    cfg = ServerConfig(binary=bin_dir / "llama-server", model=model, args=["-c", "1024", "-t", "2", *args],
                       env=env or {}, log_path=tmp / "server.log", startup_timeout_s=120, routing_dir=routing_dir)
    return LlamaServer(cfg)


def _post(srv: LlamaServer, body: object, timeout: float = 60.0) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{srv.base_url}/completion", content=data, headers={"Content-Type": "application/json"},
                      timeout=timeout)


def _alive(srv: LlamaServer) -> None:
    """The server still serves: /health ok and a small completion works."""
    assert srv.proc.poll() is None, "the server process died"
    assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
    r = _post(srv, {"prompt": PROMPT, "n_predict": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


@pytest.fixture(scope="module")
def confined(engine_variants, tiny_model, tmp_path_factory):
    """A stock server whose requests may name routing traces only under `traces/`, and the model's trace shape."""
    tmp = tmp_path_factory.mktemp("hardening")
    (tmp / "traces").mkdir()
    with _server(engine_variants["stock"], tiny_model, tmp, tmp / "traces") as srv:
        r = _post(srv, {"prompt": PROMPT, "n_predict": 2, "routing": {"record": "probe.route"}})
        assert r.status_code == 200, r.text
        from ostinato.routing.trace import read_trace

        probe = read_trace(tmp / "traces" / "probe.route")
        yield srv, tmp, probe.shape, probe.moe_layers()


def test_requests_cannot_name_traces_without_routing_dir(engine_variants, tiny_model, tmp_path):
    (tmp_path / "t.route").write_bytes(b"")
    with _server(engine_variants["stock"], tiny_model, tmp_path, None) as srv:
        for routing in ({"force": str(tmp_path / "t.route")}, {"record": str(tmp_path / "x.route")}):
            r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": routing})
            assert r.status_code == 400 and "--routing-dir" in r.text
        assert not (tmp_path / "x.route").exists()
        _alive(srv)


@pytest.mark.parametrize("path", ["/etc/hostname", "../escape.route", "sub/../../escape.route", "link/escape.route"])
def test_paths_outside_the_routing_dir_are_refused(confined, path):
    srv, tmp, _, _ = confined
    (tmp / "outside").mkdir(exist_ok=True)
    if not (tmp / "traces" / "link").exists():
        (tmp / "traces" / "link").symlink_to(tmp / "outside")
    for key in ("force", "record"):
        r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {key: path}})
        assert r.status_code == 400, (key, path, r.text)
    assert not (tmp / "escape.route").exists() and not (tmp / "outside" / "escape.route").exists()
    _alive(srv)


def test_record_never_overwrites_a_file_it_did_not_create(confined):
    srv, tmp, _, _ = confined
    theirs = tmp / "traces" / "theirs.route"
    theirs.write_text("precious")
    r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {"record": "theirs.route"}})
    assert r.status_code == 400 and theirs.read_text() == "precious"
    # its own file it may write again (a replay that resumes a session)
    for _ in range(2):
        r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {"record": "mine.route"}})
        assert r.status_code == 200
        _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {}})
    _alive(srv)


def test_a_fifo_is_refused_without_blocking(confined):
    srv, tmp, _, _ = confined
    fifo = tmp / "traces" / "fifo.route"
    if not fifo.exists():
        os.mkfifo(fifo)
    t0 = time.monotonic()
    r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {"force": "fifo.route"}}, timeout=30)
    assert r.status_code == 400 and time.monotonic() - t0 < 10
    assert srv.log_has("not a regular file")
    _alive(srv)


def _header(shape: TraceShape, n_pos: int) -> bytes:
    return (b"OSTROUTE" + struct.pack("<6I", 1, shape.n_layer, shape.n_expert, shape.n_expert_used,
                                      shape.id_dtype.itemsize, 0) + struct.pack("<Q", n_pos) + bytes(24))


def test_trace_headers_and_rows_are_checked_before_use(confined):
    srv, tmp, shape, layers = confined
    good = random_trace(shape, 64, layers, seed=3)
    write_trace(tmp / "traces" / "good.route", good)
    body = (tmp / "traces" / "good.route").read_bytes()[64:]
    row = shape.n_layer * shape.n_expert_used * shape.id_dtype.itemsize
    cases = {
        "huge.route": _header(shape, 2**62) + body,                 # more positions than the file holds
        "wraps.route": _header(shape, (2**64) // row + 1) + body,   # n_pos * row wraps around 2^64
        "short.route": _header(shape, 65) + body,                   # one position short
        "long.route": _header(shape, 63) + body,                    # bytes left over
        "magic.route": b"NOTROUTE" + _header(shape, 64)[8:] + body,
    }
    ids = good.ids.copy()
    il = layers[0]
    ids[5, il, 1] = shape.none_id                                   # first id valid, a later one "no expert"
    bad_rows = {"mixed.route": ids}
    ids = good.ids.copy()
    ids[7, il, 1] = ids[7, il, 0]                                   # an expert twice in one row
    bad_rows["dup.route"] = ids
    for name, data in cases.items():
        (tmp / "traces" / name).write_bytes(data)
    for name, arr in bad_rows.items():
        t = random_trace(shape, 64, layers, seed=3)
        t.ids[:] = arr
        (tmp / "traces" / name).write_bytes(_header(shape, 64) + t.ids.astype(shape.id_dtype).tobytes())
    for name in [*cases, *bad_rows]:
        r = _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {"force": name}})
        assert r.status_code == 400, (name, r.text)
    r = _post(srv, {"prompt": PROMPT, "n_predict": 2, "routing": {"force": "good.route"}})
    assert r.status_code == 200, r.text
    _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {}})
    _alive(srv)


def test_forced_end_of_generation_tokens_do_not_stop_the_output(confined):
    srv, _, _, _ = confined
    eos = httpx.post(f"{srv.base_url}/tokenize", json={"content": "</s>", "with_pieces": False, "add_special": False,
                                                      "parse_special": True}).json()["tokens"]
    props = httpx.get(f"{srv.base_url}/props").json()
    eog = int(props.get("eos_token_id", eos[0] if len(eos) == 1 else 2))
    forced = [72, eog, 101, 108, eog, 111]
    r = _post(srv, {"prompt": PROMPT, "n_predict": 16, "forced_tokens": forced, "return_tokens": True})
    assert r.status_code == 200 and r.json()["tokens"] == forced, r.text


def test_health_reports_a_stuck_server_loop(engine_variants, tiny_model, tmp_path):
    with _server(engine_variants["stock"], tiny_model, tmp_path, None, "--health-stuck-s", "1",
                 env={"OSTINATO_FAULT_STEP_DELAY_MS": "2500"}) as srv:
        # the launcher's warm-up request also went through the slow steps; now one more, watched from /health
        result = {}
        th = threading.Thread(target=lambda: result.update(r=_post(srv, {"prompt": PROMPT, "n_predict": 2})))
        th.start()
        seen = set()
        while th.is_alive():
            h = httpx.get(f"{srv.base_url}/health", timeout=10)
            seen.add(h.status_code)
            if h.status_code == 503:
                assert "--health-stuck-s" in h.text
            time.sleep(0.3)
        th.join()
        assert 503 in seen and result["r"].status_code == 200
        assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200


# --- a bounded fuzz of /completion bodies: every answer is a result or a 4xx naming the problem ------------------
def _fuzz_bodies(rng: random.Random, n: int) -> list[object]:
    weird = [None, True, -1, 0, 2**31, 2**63, -2**63, 1e308, float("nan"), "", "x" * 5000, [], {}, [None],
             [1.5], ["a"], {"a": 1}, [2**40], [-5], list(range(40000))]
    fields = ["prompt", "n_predict", "forced_tokens", "routing", "temperature", "n_probs", "id_slot", "cache_prompt",
              "stream", "return_tokens", "seed", "top_k", "samplers", "response_fields"]
    bodies: list[object] = [b"{", b"", b"[]", b"null", b'{"prompt": ', "\ud800".encode("utf-8", "surrogatepass"),
                            b'{"prompt": "\\u0000"}']
    while len(bodies) < n:
        body: dict = {"prompt": PROMPT[: rng.randint(0, len(PROMPT))] or "hi", "n_predict": 2}
        for f in rng.sample(fields, rng.randint(1, 4)):
            v = rng.choice(weird)
            if f == "routing" and rng.random() < 0.5:
                v = {rng.choice(["force", "record", "other"]): rng.choice(["../x", "/etc/passwd", "", 5, None, "a/b"])}
            body[f] = v
        bodies.append(body)
    return bodies


N_FUZZ = 120


def test_fuzzed_completion_requests_get_a_result_or_a_clear_error(confined):
    srv, _, _, _ = confined
    rng = random.Random(17)
    outcomes = {"ok": 0, "client_error": 0}
    for body in _fuzz_bodies(rng, N_FUZZ):
        try:
            data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
        except (TypeError, ValueError):
            continue
        r = _post(srv, data, timeout=60)
        assert r.status_code in (200, 400, 404, 413, 422), (body if not isinstance(body, dict) else list(body), r.status_code, r.text[:300])
        if r.status_code == 200:
            outcomes["ok"] += 1
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                assert r.text.startswith("data:") or "error" in r.text
            else:
                assert "content" in r.json()
        else:
            outcomes["client_error"] += 1
            assert "error" in r.json()
        assert srv.proc.poll() is None, f"the server died on {str(body)[:200]}"
    assert outcomes["ok"] > 0 and outcomes["client_error"] > 0
    _post(srv, {"prompt": PROMPT, "n_predict": 1, "routing": {}})
    _alive(srv)
