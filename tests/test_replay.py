"""Tests of the replay client, server lifecycle, runner (resume, crash) and summaries.

Fast tests use tests/fixtures/fake_llama_server.py; tests marked by the `llama_server` fixture
run the real llama-server (fixtures `engine_bin_dir` and `tiny_model` from conftest, or the
environment variables OSTINATO_ENGINE_BIN_DIR and OSTINATO_TINY_MODEL) and skip without one.
"""

from __future__ import annotations

import dataclasses

import importlib.util
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

import ostinato.cli
from ostinato.replay import ReplayConfig, ResultStore, load_requests, load_runs, run_replay, summarize_sessions
from ostinato.replay.load import LoadSample
from ostinato.server import (LlamaServer, RequestInput, RequestOutput, ServerConfig, ServerError, consume_stream,
                             send_completion)
from ostinato.sessions.model import TokenizedRequest, TokenizedSession, write_sessions_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


def _load_fake():
    spec = importlib.util.spec_from_file_location("fake_llama_server", FIXTURES / "fake_llama_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fake = _load_fake()


def make_sessions(n: int = 3, turns: int = 2, shared_prefix: int = 8) -> list[TokenizedSession]:
    """Small sessions; all start with the same tokens so an un-erased slot would reuse them."""
    out = []
    for s in range(n):
        reqs = []
        for t in range(turns):
            new = tuple(range(10, 10 + shared_prefix)) + (40 + s, 50 + t) if t == 0 else (60 + t, 70 + s, 80)
            reqs.append(TokenizedRequest(t, "first" if t == 0 else "tool", new, (97, 98 + t, 99, 100)))
        out.append(TokenizedSession(f"test/s{s}", "test", "byte", "chatml", tuple(reqs)))
    return out


# --- client: SSE parsing --------------------------------------------------------------------------

def test_consume_stream_timestamps_tokens_and_timings():
    ticks = iter([1.5, 2.0, 2.25, 2.75, 3.0, 3.1])
    lines = [
        'data: {"content":"","tokens":[],"stop":false}', "", ": ping", "",
        'data: {"content":"a","tokens":[97],"stop":false}', "",
        'data: {"content":"bc","tokens":[98,99],"stop":false}', "",
        'data: {"content":"d","tokens":[100],"stop":false}', "",
        'data: {"content":"","tokens":[],"stop":true,"stop_type":"limit","tokens_predicted":4,'
        '"tokens_cached":20,"timings":{"cache_n":12,"prompt_n":4,"prompt_ms":1.5,"predicted_n":4,"predicted_ms":3.0}}',
    ]
    out = RequestOutput(t_send=1.0)
    consume_stream(lines, out, clock=lambda: next(ticks))
    assert out.success, out.error
    assert out.token_ids == [97, 98, 99, 100] and out.n_chunks == 3 and out.n_output == 4
    assert out.ttft == pytest.approx(1.0)  # first chunk carrying a token (t=2.0), not the empty one
    assert out.itl == pytest.approx([0.25, 0.5])
    assert out.latency == pytest.approx(2.1)
    assert out.tpot == pytest.approx((2.1 - 1.0) / 3)
    assert out.timings["prompt_n"] == 4 and out.timings["cache_n"] == 12
    assert out.final["stop_type"] == "limit"


def test_consume_stream_errors():
    out = consume_stream(['data: {"error":{"code":400,"message":"context exceeded"}}'], RequestOutput())
    assert not out.success and "context exceeded" in out.error
    out = consume_stream(['data: {"content":"a","tokens":[97],"stop":false}'], RequestOutput())
    assert not out.success and "final chunk" in out.error


def test_consume_stream_keeps_top_probabilities():
    """With n_probs, each streamed token's top ids and log-probabilities are kept as sent; a malformed entry is the
    request's error, not a crash."""
    top = lambda *p: [{"id": i, "token": "x", "logprob": lp, "bytes": [120]} for i, lp in p]  # noqa: E731
    chunk = lambda t, p: json.dumps({"content": "a", "tokens": [t], "stop": False,  # noqa: E731
                                     "completion_probabilities": [{"id": t, "logprob": p[0][1], "top_logprobs": top(*p)}]})
    lines = ["data: " + chunk(97, [(97, -0.125), (3, -2.5)]), "data: " + chunk(98, [(98, -1e-07), (5, -17.000000000000004)]),
             'data: {"content":"","tokens":[],"stop":true,"tokens_predicted":2,"timings":{}}']
    out = consume_stream(lines, RequestOutput())
    assert out.success and out.top_ids == [[97, 3], [98, 5]]
    assert out.top_logprobs == [[-0.125, -2.5], [-1e-07, -17.000000000000004]]
    bad = consume_stream(['data: {"content":"a","tokens":[97],"stop":false,"completion_probabilities":[{"top_logprobs":[{"id":1}]}]}'],
                         RequestOutput())
    assert not bad.success and "completion_probabilities" in bad.error


def test_payload_carries_forced_tokens():
    body = RequestInput((1, 2, 3), 2, (7, 8)).payload()
    assert body["prompt"] == [1, 2, 3] and body["forced_tokens"] == [7, 8] and body["n_predict"] == 2
    assert body["stream"] and body["cache_prompt"] and body["return_tokens"] and body["id_slot"] == 0


def test_send_completion_streams_from_sse_server():
    srv = fake.make_server("127.0.0.1", 0, token_delay=0.005)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with httpx.Client() as client:
            url = f"http://127.0.0.1:{srv.server_address[1]}"
            out = send_completion(client, url, RequestInput(tuple(range(20)), 5, (65, 66, 67, 68, 69)))
    finally:
        srv.shutdown()
        srv.server_close()
    assert out.success, out.error
    assert out.token_ids == [65, 66, 67, 68, 69] and out.n_output == 5 and len(out.itl) == 4
    assert 0 < out.ttft <= out.latency and out.t_send < out.t_first_token <= out.t_last_token <= out.t_done
    assert out.timings["prompt_n"] == 20 and out.tpot > 0


def test_send_completion_connection_error_is_recorded():
    from ostinato.server import free_port

    with httpx.Client() as client:
        out = send_completion(client, f"http://127.0.0.1:{free_port()}", RequestInput((1,), 1))
    assert not out.success and out.connection_error and "connection error" in out.error


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Wait until a process no longer runs (absent or a zombie); return whether it is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# --- server lifecycle and runner against the fake server ------------------------------------------

def fake_config(fake_bin: Path, fake_model: Path, tmp_path: Path, **env: str) -> ServerConfig:
    env = {"FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl"), **env}
    return ServerConfig(binary=fake_bin, model=fake_model, env=env, log_path=tmp_path / "server.log",
                        startup_timeout_s=30)


def logged_requests(tmp_path: Path) -> list[dict]:
    path = tmp_path / "requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_server_lifecycle_and_early_exit(fake_bin, fake_model, tmp_path):
    cfg = fake_config(fake_bin, fake_model, tmp_path)
    with LlamaServer(cfg) as server:
        assert server.healthy()
        server.warmup([1, 2, 3])
        pid = server.proc.pid
    assert server.proc is None and _gone(pid)
    cmd = cfg.command(1234, tmp_path)
    assert cmd[cmd.index("-np") + 1] == "1" and cmd[cmd.index("--cache-ram") + 1] == "0" and "--slot-save-path" in cmd
    missing = ServerConfig(binary=fake_bin, model=tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        LlamaServer(missing).start()
    bad = fake_config(fake_bin, fake_model, tmp_path, FAKE_EXIT_AT_START="1")
    with pytest.raises(ServerError, match="exited with code 1.*server.log"):
        LlamaServer(bad).start()
    assert "failed to load model" in (tmp_path / "server.log").read_text()


def test_runner_sends_growing_prompts_from_an_erased_slot(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(2, 3)
    cfg = ReplayConfig("stock", tmp_path / "out", machine="test", progress=False)
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, cfg)
    assert summary.done == ["test/s0", "test/s1"] and not summary.failed
    log = [r for r in logged_requests(tmp_path)]
    completions = [r["body"] for r in log if r["path"] == "/completion"][1:]  # skip warm-up
    assert len(completions) == 6
    s0 = sessions[0].requests
    assert completions[1]["prompt"] == list(s0[0].new_token_ids + s0[0].output_token_ids + s0[1].new_token_ids)
    assert completions[1]["forced_tokens"] == list(s0[1].output_token_ids)
    # an erase before each session (and one after the warm-up)
    assert [r["path"] for r in log].count("/slots/0") == 3
    recs = list(ResultStore(tmp_path / "out" / "stock").iter_records())
    assert len(recs) == 6 and all(r["ok"] and r["forced_match"] for r in recs)
    first_turns = [r for r in recs if r["turn"] == 0]
    assert all(r["server"]["cache_n"] == 0 for r in first_turns)  # nothing shared across sessions
    later = [r for r in recs if r["turn"] > 0]
    assert all(r["server"]["prompt_n"] == r["n_prompt"] - r["server"]["cache_n"] for r in later)
    assert all(r["server"]["cache_n"] > 0 for r in later)


def test_resume_after_interrupted_runner(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(3, 2)
    out = tmp_path / "out"

    def interrupt(server, session, turn):
        if session.session_id == "test/s1" and turn == 0:
            raise KeyboardInterrupt

    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        with pytest.raises(KeyboardInterrupt):
            run_replay(sessions, server, ReplayConfig("stock", out, progress=False, after_request=interrupt))
    store = ResultStore(out / "stock")
    assert [store.status(s.session_id) for s in sessions] == ["ok", "missing", "missing"]
    (store.root / "sessions" / ".test__s1.jsonl.abc.tmp").write_text("partial")  # as if killed mid-write
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", out, progress=False))
    assert summary.skipped == ["test/s0"] and summary.done == ["test/s1", "test/s2"]
    assert not list((store.root / "sessions").glob(".*.tmp"))
    recs = list(store.iter_records())
    keys = [(r["session"], r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 6
    assert len(json.loads((store.root / "runs.json").read_text())) == 2
    # what each session's server had served before it: the resumed run's server started afresh at test/s1
    prior = {r["session"]: r["server_prior"]["sessions"] for r in recs}
    assert prior == {"test/s0": 0, "test/s1": 0, "test/s2": 1}
    from ostinato.replay.results import load_requests
    table = load_requests([out])
    assert dict(zip(table["session"], table["server_prior_sessions"])) == prior


def test_rerun_replays_sessions_whose_routing_trace_is_gone(fake_bin, fake_model, tmp_path):
    """A recorded session counts as done only with its trace, when traces are recorded (the pipeline clears the
    trace directory before it reruns a rule)."""
    sessions = make_sessions(2, 1)
    rec = tmp_path / "rec"
    cfg = ReplayConfig("stock", tmp_path / "out", progress=False, routing_record_dir=rec)
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        assert run_replay(sessions, server, cfg).done == ["test/s0", "test/s1"]
    (rec / "test__s0.route").write_text("trace")  # the fake server writes none: one trace present, one gone
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, cfg)
    assert summary.skipped == ["test/s0"] and summary.done == ["test/s1"]
    keys = [(r["session"], r["turn"]) for r in ResultStore(tmp_path / "out" / "stock").iter_records()]
    assert len(keys) == len(set(keys)) == 2


def test_killed_runner_process_resumes_via_cli(fake_bin, fake_model, tmp_path):
    sessions_file = tmp_path / "sessions.jsonl"
    write_sessions_jsonl(make_sessions(4, 2), sessions_file)
    out = tmp_path / "out"
    argv = [sys.executable, "-c", "import sys, ostinato.cli as c; c._GROUPS = ('ostinato.replay.cli',); sys.exit(c.main())",
            "replay", "run", "--engine-name", "stock", "--server-bin", str(fake_bin), "--model", str(fake_model),
            "--sessions", str(sessions_file), "--out", str(out), "--no-progress", "--machine-label", "test"]
    env = {**os.environ, "FAKE_TOKEN_DELAY": "0.15", "FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl"),
           "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = out / "stock" / "sessions" / "test__s0.jsonl"
    deadline = time.monotonic() + 60
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.exists(), proc.stdout.read().decode() if proc.poll() is not None else "no result file"
    time.sleep(0.3)  # into the next session
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    done_before = sorted(p.name for p in (out / "stock" / "sessions").glob("*.jsonl"))
    assert "test__s3.jsonl" not in done_before
    pids = {r["pid"] for r in logged_requests(tmp_path)}
    assert all(_gone(pid) for pid in pids)  # the orphaned server got SIGTERM via PR_SET_PDEATHSIG
    env["FAKE_TOKEN_DELAY"] = "0.001"
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{len(done_before)} already present" in res.stderr
    recs = list(ResultStore(out / "stock").iter_records())
    keys = [(r["session"], r["turn"]) for r in recs]
    assert len(keys) == len(set(keys)) == 8 and all(r["ok"] for r in recs)
    assert json.loads((out / "stock" / "machine.json").read_text())["label"] == "test"


def test_server_crash_fails_session_and_next_session_continues(fake_bin, fake_model, tmp_path):
    """Without retries (`max_retries=0`) a crash fails the session, and the next runs on the restarted server."""
    sessions = make_sessions(3, 2)
    # completion 1 is the warm-up, 2 and 3 are session 0: the server dies during session 0, turn 1
    cfg = fake_config(fake_bin, fake_model, tmp_path, FAKE_DIE_AT="3", FAKE_DIE_MARKER=str(tmp_path / "died"))
    with LlamaServer(cfg) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False, max_retries=0))
        assert server.n_starts == 2
    assert summary.restarts == 1 and summary.done == ["test/s1", "test/s2"] and not summary.retried
    assert "server exited with code 3" in summary.failed["test/s0"]
    store = ResultStore(tmp_path / "out" / "stock")
    assert store.status("test/s0") == "failed"
    recs = {(r["session"], r["turn"]): r for r in store.iter_records()}
    assert recs[("test/s0", 0)]["ok"] and not recs[("test/s0", 1)]["ok"]
    assert "exited with code 3" in recs[("test/s0", 1)]["error"]
    assert recs[("test/s1", 0)]["ok"] and recs[("test/s1", 0)]["server_start"] == 2
    # a rerun keeps the recorded failure unless asked to retry it
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        again = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False))
        assert again.skipped == ["test/s0", "test/s1", "test/s2"]
        retried = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False, retry_failed=True))
    assert retried.done == ["test/s0"] and store.status("test/s0") == "ok"


def test_server_crash_replays_the_session_on_the_restarted_server(fake_bin, fake_model, tmp_path):
    """With retries (the default, 2) the crashed session is replayed again from its first request on the restarted
    server: every record of it comes from that attempt and that start, once each."""
    sessions = make_sessions(3, 2)
    cfg = fake_config(fake_bin, fake_model, tmp_path, FAKE_DIE_AT="3", FAKE_DIE_MARKER=str(tmp_path / "died"))
    with LlamaServer(cfg) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False))
    assert summary.done == ["test/s0", "test/s1", "test/s2"] and not summary.failed
    assert summary.restarts == 1 and summary.retried == {"test/s0": 1}
    recs = list(ResultStore(tmp_path / "out" / "stock").iter_records())
    assert sorted((r["session"], r["turn"]) for r in recs) == [(s.session_id, t) for s in sessions for t in range(2)]
    s0 = [r for r in recs if r["session"] == "test/s0"]
    assert all(r["ok"] and r["attempt"] == 2 and r["server_start"] == 2 for r in s0)
    # the restarted server had served nothing before test/s0, then test/s0 before test/s1, and so on
    prior = {r["session"]: r["server_prior"] for r in recs}
    assert [prior[s.session_id]["sessions"] for s in sessions] == [0, 1, 2]
    assert len({p["sha256"] for p in prior.values()}) == 3
    assert s0[0]["server"]["cache_n"] == 0  # replayed from an erased slot, as the first time
    runs = json.loads((tmp_path / "out" / "stock" / "runs.json").read_text())
    assert runs[-1]["retried"] == {"test/s0": 1} and runs[-1]["restarts"] == 1


def test_a_session_that_crashes_the_server_every_time_fails_after_its_retries(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(3, 2)
    poison = TokenizedRequest(1, "tool", (4242,), (97, 98, 99))  # the fake server dies on any prompt holding 4242
    sessions[1] = TokenizedSession("test/s1", "test", "byte", "chatml", (sessions[1].requests[0], poison))
    cfg = fake_config(fake_bin, fake_model, tmp_path, FAKE_DIE_ON_TOKEN="4242")
    with LlamaServer(cfg) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False, max_retries=2))
        assert server.n_starts == 4
    assert summary.done == ["test/s0", "test/s2"] and summary.restarts == 3 and summary.retried == {"test/s1": 2}
    assert "3 attempts, the server restarted after each" in summary.failed["test/s1"]
    recs = {(r["session"], r["turn"]): r for r in ResultStore(tmp_path / "out" / "stock").iter_records()}
    assert len(recs) == 6 and recs[("test/s1", 0)]["ok"] and not recs[("test/s1", 1)]["ok"]
    assert recs[("test/s1", 1)]["attempt"] == 3 and recs[("test/s2", 0)]["server_start"] == 4


def test_request_error_with_live_server_fails_only_that_session(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(2, 2)
    big = TokenizedRequest(1, "tool", tuple([5] * 100_001), (97,))
    sessions[0] = TokenizedSession("test/s0", "test", "byte", "chatml", (sessions[0].requests[0], big))
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False))
    assert summary.restarts == 0 and "context size" in summary.failed["test/s0"] and summary.done == ["test/s1"]


class StepProbe:
    """A load probe whose every sample is 1 s after the last, with `foreign` CPU seconds of other processes and
    `own` of the replay's in between (2 logical CPUs)."""

    cores = 2

    def __init__(self, foreign: float, own: float = 0.5):
        self.foreign, self.own, self.n = foreign, own, 0

    def sample(self) -> LoadSample:
        self.n += 1
        return LoadSample(t=float(self.n), busy_cpu_s=self.n * (self.foreign + self.own), own_cpu_s=self.n * self.own,
                          loadavg_1m=0.25 * self.n)


def test_summarize_cli(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(2, 3)
    # the stock engine's sessions ran beside other work (0.5 of 2 CPUs: share 0.25), the ostinato engine's alone
    for engine, foreign in (("stock", 0.5), ("ostinato", 0.0)):
        with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
            run_replay(sessions, server, ReplayConfig(engine, tmp_path / "out", machine="test", progress=False,
                                                      load_probe=StepProbe(foreign)),
                       {"engine_backend": "cpu"} if engine == "stock" else None)
    (tmp_path / "out" / "stock" / "machine.json").write_text(json.dumps({"label": "test", "gpus": []}))
    rec = next(ResultStore(tmp_path / "out" / "stock").iter_records())
    assert rec["load"] == pytest.approx({"wall_s": 1.0, "foreign_cpu_s": 0.5, "own_cpu_s": 0.5, "cores": 2,
                                         "loadavg_1m": 0.5})
    requests = load_requests([tmp_path / "out"])
    assert len(requests) == 12 and set(requests["engine"]) == {"stock", "ostinato"}
    assert (requests["load_wall_s"] == 1.0).all()
    setup = requests.groupby("engine")[["machine_gpus", "engine_backend"]].first()  # from machine.json and runs.json
    assert setup.loc["stock"].tolist() == [0, "cpu"] and setup.loc["ostinato"].isna().all()
    summary = summarize_sessions(requests)
    assert len(summary) == 4 and summary["session_ok"].all()
    by = summary.set_index("engine")
    assert list(by.loc["stock", "foreign_cpu_share"]) == pytest.approx([0.25, 0.25])
    assert list(by.loc["stock", "load_flag"]) == ["foreign load"] * 2
    assert list(by.loc["ostinato", "load_flag"]) == ["clean"] * 2
    # one probe per engine: session 1 takes samples 1-6, session 2 samples 7-12 (the larger load average of each)
    assert sorted(by.loc["stock", "loadavg_1m_max"]) == [1.5, 3.0] and (by["load_wall_s"] == 3.0).all()
    assert (summary["n_forced_match"] == summary["n_forced_checked"]).all() and (summary["n_forced_checked"] == 3).all()
    assert (summary["total_request_s"] > 0).all() and (summary["server_decode_s"] > 0).all()
    assert summary["ttft_median_tool_s"].notna().all() and summary["ttft_median_user_s"].isna().all()
    ostinato.cli._GROUPS, saved = ("ostinato.replay.cli",), ostinato.cli._GROUPS
    try:
        rc = ostinato.cli.main(["replay", "summarize", "--in", str(tmp_path / "out" / "stock"), str(tmp_path / "out" / "ostinato"),
                                "--out", str(tmp_path / "s.csv"), "--requests-out", str(tmp_path / "r.csv")])
        assert rc == 0
        assert ostinato.cli.main(["replay", "summarize", "--in", str(tmp_path / "none"), "--out", str(tmp_path / "x.csv")]) == 2
    finally:
        ostinato.cli._GROUPS = saved
    csv = pd.read_csv(tmp_path / "s.csv")
    assert list(csv["engine"].unique()) == ["ostinato", "stock"] and "client_server_ratio" in csv.columns
    assert set(csv["load_flag"]) == {"clean", "foreign load"} and (csv["load_threshold"] == 0.1).all()
    req = pd.read_csv(tmp_path / "r.csv")
    assert len(req) == 12 and {"load_foreign_cpu_s", "load_loadavg_1m", "machine_gpus", "engine_backend"} <= set(req)
    # a threshold above the stock engine's share leaves every session clean
    ostinato.cli._GROUPS, saved = ("ostinato.replay.cli",), ostinato.cli._GROUPS
    try:
        assert ostinato.cli.main(["replay", "summarize", "--in", str(tmp_path / "out"), "--out",
                                  str(tmp_path / "s3.csv"), "--foreign-load-threshold", "0.3"]) == 0
    finally:
        ostinato.cli._GROUPS = saved
    assert set(pd.read_csv(tmp_path / "s3.csv")["load_flag"]) == {"clean"}


def test_summarize_tags_repeated_runs(fake_bin, fake_model, tmp_path):
    """`--runs 2`: the directories split run by run, each run's sessions suffixed #run<i>; unequal runs refused."""
    sessions = make_sessions(2, 2)
    dirs = []
    for run in ("a", "b"):
        for engine in ("stock", "ostinato"):
            with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
                run_replay(sessions, server, ReplayConfig(engine, tmp_path / run, machine="test", progress=False))
            dirs.append(str(tmp_path / run / engine))
    ostinato.cli._GROUPS, saved = ("ostinato.replay.cli",), ostinato.cli._GROUPS
    try:
        assert ostinato.cli.main(["replay", "summarize", "--in", *dirs, "--runs", "2", "--out",
                                  str(tmp_path / "s.csv"), "--requests-out", str(tmp_path / "r.csv")]) == 0
        assert ostinato.cli.main(["replay", "summarize", "--in", *dirs[:3], "--runs", "2", "--out",
                                  str(tmp_path / "x.csv")]) == 2
    finally:
        ostinato.cli._GROUPS = saved
    csv = pd.read_csv(tmp_path / "s.csv")
    assert sorted(csv["session"].unique()) == ["test/s0#run1", "test/s0#run2", "test/s1#run1", "test/s1#run2"]
    assert len(csv) == 8 and csv["session_ok"].all()
    req = pd.read_csv(tmp_path / "r.csv")
    assert len(req) == 16 and req["session"].str.endswith(("#run1", "#run2")).all()
    with pytest.raises(ValueError, match="do not split into 2 runs"):
        load_runs([tmp_path / "a" / "stock", tmp_path / "a" / "ostinato", tmp_path / "b" / "stock"], 2)


# --- the real llama-server ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_server_paths(request) -> tuple[Path, Path]:
    """(llama-server binary, tiny GGUF) from conftest fixtures or environment variables; else skip."""
    try:
        bin_dir = Path(request.getfixturevalue("engine_bin_dir"))
    except pytest.FixtureLookupError:
        bin_dir = Path(os.environ.get("OSTINATO_ENGINE_BIN_DIR", "/nonexistent"))
    try:
        model = Path(request.getfixturevalue("tiny_model"))
    except pytest.FixtureLookupError:
        model = Path(os.environ.get("OSTINATO_TINY_MODEL", "/nonexistent"))
    binary = bin_dir / "llama-server"
    if not binary.is_file() or not model.is_file():
        pytest.skip(f"no llama-server ({binary}) or tiny model ({model})")
    return binary, model


def real_config(paths: tuple[Path, Path], tmp_path: Path) -> ServerConfig:
    binary, model = paths
    return ServerConfig(binary=binary, model=model, args=["-c", "1024", "-t", "2", "--no-webui"],
                        log_path=tmp_path / "server.log", startup_timeout_s=120)


def test_real_server_streaming_and_timings(llama_server_paths, tmp_path):
    with LlamaServer(real_config(llama_server_paths, tmp_path)) as server:
        server.warmup(list(range(20, 40)))
        prompt = tuple(range(20, 80))
        out = send_completion(server.client, server.base_url, RequestInput(prompt, 8, tuple(range(97, 105))))
        assert out.success, out.error
        assert out.n_output == 8 and out.timings["predicted_n"] == 8
        assert out.timings["prompt_n"] == len(prompt) and out.timings["cache_n"] == 0
        assert 0 < out.ttft <= out.latency and out.tpot > 0 and out.n_chunks >= 1
        assert out.final["stop_type"] == "limit"
        again = send_completion(server.client, server.base_url, RequestInput(prompt + (81, 82), 4))
        assert again.success and again.timings["cache_n"] >= len(prompt) - 1  # prefix reused


def test_real_server_replay_kill_restart(llama_server_paths, tmp_path):
    """A server killed inside a session is restarted and the session replayed whole (replay.max_retries)."""
    sessions = make_sessions(3, 2)
    killed = []

    def kill_during_s1(server, session, turn):
        if session.session_id == "test/s1" and turn == 0 and not killed:
            killed.append(turn)
            server.proc.send_signal(signal.SIGKILL)

    cfg = ReplayConfig("stock", tmp_path / "out", machine="test", progress=False, after_request=kill_during_s1)
    with LlamaServer(real_config(llama_server_paths, tmp_path)) as server:
        summary = run_replay(sessions, server, cfg)
    assert summary.done == ["test/s0", "test/s1", "test/s2"] and summary.restarts == 1 and not summary.failed
    recs = {(r["session"], r["turn"]): r for r in ResultStore(tmp_path / "out" / "stock").iter_records()}
    assert len(recs) == 6 and all(r["ok"] for r in recs.values())
    assert recs[("test/s1", 0)]["attempt"] == 2 and recs[("test/s0", 0)]["attempt"] == 1
    for s in ("test/s0", "test/s1", "test/s2"):
        assert recs[(s, 0)]["server"]["cache_n"] == 0  # erased slot: no prefix shared between sessions
        assert recs[(s, 1)]["server"]["cache_n"] >= recs[(s, 0)]["n_prompt"] - 1  # own prefix reused
        assert recs[(s, 1)]["n_output"] == 4


def test_machine_description_is_kept_with_results():
    from ostinato.machine import default_label, describe_machine

    m = describe_machine()
    d = m.to_json()
    assert m.logical_cores >= 1 and d["cpu_model"] and d["os"] and isinstance(d["gpus"], list)
    assert describe_machine("h200-box").label == "h200-box"
    assert default_label("x", 2, ()) == "cpu-2c"


def test_machine_description_names_the_boot_and_the_physical_gpu(tmp_path, monkeypatch):
    """Machines lent one after another share a hostname and often a kernel: the boot id and the GPU's uuid tell
    whether two replays ran on one machine and one card."""
    from ostinato.machine import describe_machine

    uuid = "GPU-0e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' 'NVIDIA H100 80GB HBM3, 580.159.04, 81559, 5, 16, {uuid}'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    d = describe_machine().to_json()
    assert d["label"] == "h100" and d["gpus"][0]["uuid"] == uuid and d["gpus"][0]["memory_total_mib"] == 81559
    boot = Path("/proc/sys/kernel/random/boot_id")
    assert d["boot_id"] == (boot.read_text().strip() if boot.exists() else "")


def test_changed_setup_is_refused_or_restarts_with_old_results_kept(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(2, 2)
    out = tmp_path / "out"
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        run_replay(sessions, server, ReplayConfig("stock", out, progress=False), run_info={"sessions_sha256": "a"})
        with pytest.raises(ValueError, match="different setup"):
            run_replay(sessions, server, ReplayConfig("stock", out, progress=False), run_info={"sessions_sha256": "b"})
        summary = run_replay(sessions, server, ReplayConfig("stock", out, progress=False, on_setup_change="restart"),
                             run_info={"sessions_sha256": "b"})
    assert summary.done == ["test/s0", "test/s1"] and not summary.skipped
    aside = list(out.glob("stock.superseded-*"))
    assert len(aside) == 1 and len(list((aside[0] / "sessions").glob("*.jsonl"))) == 2
    assert json.loads((out / "stock" / "runs.json").read_text())[-1]["sessions_sha256"] == "b"


def test_replay_rates_estimate_a_session_from_recorded_requests():
    from ostinato.replay.deadline import SAFETY_FACTOR, SAFETY_S, ReplayRates, fits

    rates = ReplayRates()
    assert rates.session_s(make_sessions(1, 2)[0]) is None  # nothing recorded yet
    # 100 new tokens in 0.5 s, 10 generated in 0.1 s, 0.2 s beyond the server's time
    rates.add({"ok": True, "latency_s": 0.8, "server": {"prompt_ms": 500, "prompt_n": 100, "predicted_ms": 100,
                                                         "predicted_n": 10}})
    rates.add({"ok": False, "latency_s": 9.0, "server": {"prompt_ms": 1, "prompt_n": 1, "predicted_ms": 1,
                                                          "predicted_n": 1}})  # a failed request counts for nothing
    rates.add({"ok": True, "latency_s": 1.0})  # nor one without server timings
    session = make_sessions(1, 2)[0]  # requests of 10 and 3 new tokens, 4 outputs each
    assert rates.session_s(session) == pytest.approx((10 + 3) * 0.005 + 8 * 0.01 + 2 * 0.2)
    assert fits(None, 1.0) and not fits(None, 0.0) and not fits(1.0, -5.0)
    # an engine with nothing recorded: the longest of the siblings' estimates, else of other session sets' replays
    from ostinato.replay.deadline import estimate

    slow = ReplayRates()
    slow.add({"ok": True, "latency_s": 2.0, "server": {"prompt_ms": 1000, "prompt_n": 100, "predicted_ms": 1000,
                                                        "predicted_n": 10}})
    none = ReplayRates()
    assert estimate(session, none, [], []) is None
    assert estimate(session, none, [], [rates, slow]) == pytest.approx(slow.session_s(session))
    assert estimate(session, none, [rates], [slow]) == pytest.approx(rates.session_s(session))  # same sessions first
    assert estimate(session, slow, [rates], [rates]) == pytest.approx(slow.session_s(session))  # its own first
    assert fits(10.0, 10.0 * SAFETY_FACTOR + SAFETY_S) and not fits(10.0, 10.0 * SAFETY_FACTOR + SAFETY_S - 0.1)


def test_a_deadline_leaves_the_sessions_that_would_not_end_before_it(fake_bin, fake_model, tmp_path, capsys):
    """With --deadline a session starts only if the engine's recorded requests say it ends in time: the others are
    left for a later run (exit 3), which replays them."""
    from ostinato.cli import main

    sessions = make_sessions(3, 2)
    out = tmp_path / "out"
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        # nothing recorded yet: the first session starts while any time is left, then the rates rule
        summary = run_replay(sessions, server, ReplayConfig("stock", out, progress=False, deadline=time.time() + 3600))
        assert summary.done == ["test/s0", "test/s1", "test/s2"] and not summary.deferred
        shutil.rmtree(out / "stock" / "sessions")
        (out / "stock" / "sessions").mkdir()
        run_replay(sessions[:1], server, ReplayConfig("stock", out, progress=False))
        late = run_replay(sessions, server, ReplayConfig("stock", out, progress=False, deadline=time.time() + 1.0))
    assert late.skipped == ["test/s0"] and late.deferred == ["test/s1", "test/s2"] and not late.done
    runs = json.loads((out / "stock" / "runs.json").read_text())
    assert runs[-1]["n_deferred"] == 2
    # an engine that has recorded nothing takes the longest estimate of other engines' replays, and a session that
    # would not end in time leaves the server unstarted
    from ostinato.replay.deadline import rates_under

    siblings = rates_under([out, tmp_path / "not-made-yet"])
    assert len(siblings) == 1 and siblings[0].requests == 2
    assert len(rates_under([out, out])) == 1  # a directory named twice (run 1's own run prefix) is read once
    fresh = LlamaServer(fake_config(fake_bin, fake_model, tmp_path))
    try:
        waiting = run_replay(sessions, fresh, ReplayConfig("other", out, progress=False, deadline=time.time() + 1.0,
                                                           deadline_siblings=siblings))
        assert waiting.deferred == ["test/s0", "test/s1", "test/s2"] and fresh.n_starts == 0
    finally:
        fresh.close()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--deadline-rates-from .*file: not a directory"):
        rates_under([tmp_path / "file"])
    # before any engine has replayed these sessions, other session sets' replays estimate them (here: the same
    # directory standing for another set), and the run waits as with siblings
    fresh = LlamaServer(fake_config(fake_bin, fake_model, tmp_path))
    try:
        waiting = run_replay(sessions, fresh, ReplayConfig("other", out, progress=False, deadline=time.time() + 1.0,
                                                           deadline_elsewhere=rates_under([out])))
        assert waiting.deferred == ["test/s0", "test/s1", "test/s2"] and fresh.n_starts == 0
    finally:
        fresh.close()
    with pytest.raises(ValueError, match="--deadline-rates-elsewhere .*file: not a directory"):
        rates_under([tmp_path / "file"], "--deadline-rates-elsewhere")
    # the CLI: the deadline from the environment, exit 3, and a run without one finishes them
    sfile = tmp_path / "s.jsonl"
    write_sessions_jsonl(sessions, sfile)
    cli_out = tmp_path / "cli"
    argv = ["replay", "run", "--engine-name", "stock", "--server-bin", str(fake_bin), "--model", str(fake_model),
            "--sessions", str(sfile), "--out", str(cli_out), "--no-progress"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_REQUEST_LOG", str(tmp_path / "requests.jsonl"))
        mp.setenv("OSTINATO_REPLAY_DEADLINE", "soon")
        assert main(argv) == 2
        assert "$OSTINATO_REPLAY_DEADLINE: expected a Unix time in seconds, got 'soon'" in capsys.readouterr().err
        mp.setenv("OSTINATO_REPLAY_DEADLINE", str(time.time() + 3600))
        assert main(argv + ["--deadline-rates-elsewhere", str(tmp_path / "file")]) == 2
        assert f"--deadline-rates-elsewhere {tmp_path / 'file'}: not a directory" in capsys.readouterr().err
        # a second to go: at most the first session starts (nothing recorded to estimate it), the others wait
        mp.setenv("OSTINATO_REPLAY_DEADLINE", str(time.time() + 1.0))
        assert main(argv) == 3
        assert "left for a later run (--deadline)" in capsys.readouterr().err
        assert ResultStore(cli_out / "stock").status("test/s2") == "missing"
        mp.delenv("OSTINATO_REPLAY_DEADLINE")
        assert main(argv) == 0
    assert ResultStore(cli_out / "stock").status("test/s2") == "ok"


def test_a_replay_resumed_on_another_gpu_model_is_another_setup(fake_bin, fake_model, tmp_path):
    """A replay interrupted on one kind of GPU is not resumed on another: its sessions all run on one kind."""
    sessions = make_sessions(3, 1)
    out = tmp_path / "out"

    def info(gpu: str, host: str) -> dict:
        return {"sessions_sha256": "a", "machine_info": {"hostname": host, "gpus": [{"name": gpu, "driver": host}]}}

    def interrupt(server, session, turn):
        if session.session_id == "test/s1":
            raise KeyboardInterrupt

    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        for host in ("vm1", "vm2"):  # another machine of the same GPU model resumes it (s0 is kept)
            with pytest.raises(KeyboardInterrupt):
                run_replay(sessions, server, ReplayConfig("stock", out, progress=False, after_request=interrupt),
                           run_info=info("NVIDIA H200", host))
        with pytest.raises(ValueError, match=r"machine_info\.gpus changed"):
            run_replay(sessions, server, ReplayConfig("stock", out, progress=False),
                       run_info=info("NVIDIA H100 80GB HBM3", "vm3"))
        summary = run_replay(sessions, server, ReplayConfig("stock", out, progress=False, on_setup_change="restart"),
                             run_info=info("NVIDIA H100 80GB HBM3", "vm3"))
    assert summary.done == ["test/s0", "test/s1", "test/s2"] and not summary.skipped
    aside = list(out.glob("stock.superseded-*"))
    assert len(aside) == 1 and [f.name for f in (aside[0] / "sessions").glob("*.jsonl")] == ["test__s0.jsonl"]


def test_real_server_teacher_forced_routing(llama_server_paths, tmp_path):
    """Every request of a session follows its forced trace; what the engine records equals it."""
    from ostinato.routing.trace import TraceShape, random_trace, read_trace, write_trace

    sessions = make_sessions(2, 3)
    shape = TraceShape(4, 16, 4)  # tiny-qwen3moe: 4 MoE layers of 16 experts, top-4
    for s in sessions:
        n_pos = sum(len(r.new_token_ids) + len(r.output_token_ids) for r in s.requests)
        write_trace(tmp_path / "force" / (s.session_id.replace("/", "__") + ".route"),
                    random_trace(shape, n_pos, [0, 1, 2, 3], seed=int(s.session_id[-1])))
    cfg = ReplayConfig("stock", tmp_path / "out", machine="test", progress=False,
                       routing_force_dir=tmp_path / "force", routing_record_dir=tmp_path / "rec")
    server_cfg = dataclasses.replace(real_config(llama_server_paths, tmp_path), routing_dir=cfg.routing_dir())
    with LlamaServer(server_cfg) as server:
        summary = run_replay(sessions, server, cfg)
    assert summary.done == ["test/s0", "test/s1"], summary.failed
    for s in sessions:
        name = s.session_id.replace("/", "__") + ".route"
        forced, rec = read_trace(tmp_path / "force" / name), read_trace(tmp_path / "rec" / name)
        computed = rec.ids != shape.none_id
        assert computed[:, :3, :].sum() >= (rec.n_pos - 1) * 3 * 4  # every position of layers 0-2
        assert np.array_equal(rec.ids[computed], forced.ids[: rec.n_pos][computed])
    assert all(r["forced_match"] for r in ResultStore(tmp_path / "out" / "stock").iter_records())


def test_missing_forced_trace_is_named_before_any_request(fake_bin, fake_model, tmp_path):
    cfg = ReplayConfig("stock", tmp_path / "out", progress=False, routing_force_dir=tmp_path / "none")
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        with pytest.raises(FileNotFoundError, match="test__s0.route"):
            run_replay(make_sessions(1, 1), server, cfg)


def test_turning_forced_routing_on_is_a_setup_change(fake_bin, fake_model, tmp_path):
    sessions = make_sessions(1, 1)
    out = tmp_path / "out"
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        run_replay(sessions, server, ReplayConfig("stock", out, progress=False), run_info={"sessions_sha256": "a"})
        with pytest.raises(ValueError, match="routing_force_dir"):
            run_replay(sessions, server, ReplayConfig("stock", out, progress=False),
                       run_info={"sessions_sha256": "a", "routing_force_dir": "traces/"})


def test_forced_tokens_match_allows_only_unstreamed_gaps():
    from ostinato.replay.runner import forced_tokens_match

    forced = [5, 6, 7, 8]
    assert forced_tokens_match([5, 6, 7, 8], forced, 4)
    assert forced_tokens_match([5, 7, 8], forced, 4)      # 6 ended inside a UTF-8 character: no chunk
    assert not forced_tokens_match([5, 9, 8], forced, 4)  # a token that was not forced
    assert not forced_tokens_match([6, 5], forced, 4)     # out of order
    assert not forced_tokens_match([5, 6, 7], forced, 3)  # the server stopped early


# --- external engines by URL (OpenAI-compatible /v1/completions or llama-server's /completion) ---------

def test_consume_openai_stream_counts_text_chunks_and_usage():
    from ostinato.server.client import consume_openai_stream

    ticks = iter([1.0, 1.5, 1.8, 2.1, 2.2, 2.3, 2.4])
    lines = ['data: {"choices": [{"text": "", "index": 0}]}',
             'data: {"choices": [{"text": "He", "index": 0}]}',
             ": ping",
             'data: {"choices": [{"text": "llo", "index": 0}]}',
             'data: {"choices": [{"text": "!", "index": 0, "finish_reason": "length"}], "timings": {"predicted_n": 4}}',
             'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}',
             "data: [DONE]"]
    out = consume_openai_stream(lines, RequestOutput(t_send=0.5), clock=lambda: next(ticks))
    assert out.success, out.error
    assert out.ttft == pytest.approx(1.0) and out.n_chunks == 3 and out.itl == pytest.approx([0.3, 0.3])
    assert out.n_output == 4 and out.final["finish_reason"] == "length" and out.timings == {"predicted_n": 4}
    assert out.tpot == pytest.approx((out.latency - out.ttft) / 3) and out.token_ids == []
    bad = consume_openai_stream(['data: {"choices": [{"text": "x"}]}'], RequestOutput(), clock=lambda: 1.0)
    assert not bad.success and "finish_reason" in bad.error
    err = consume_openai_stream(['data: {"error": {"message": "no such model"}}'], RequestOutput(), clock=lambda: 1.0)
    assert err.error == "server error: no such model"


def test_openai_payload_has_no_forced_tokens():
    body = RequestInput((1, 2, 3), 5, (7, 8)).openai_payload("m")
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 5 and body["model"] == "m" and body["stream"]
    assert "forced_tokens" not in body and body["ignore_eos"] is True


@pytest.mark.parametrize("argv, message", [
    ([], "needs --server-bin and --model"),
    (["--server-url", "http://127.0.0.1:9", "--server-bin", "x"], "--server-bin would not reach it"),
    (["--server-bin", "x", "--model", "m", "--api", "openai"], "--api openai needs --server-url"),
    (["--server-url", "http://127.0.0.1:9", "--api", "openai", "--routing-force-dir", "d"], "routing traces"),
])
def test_replay_run_names_the_conflicting_flags(tmp_path, capsys, argv, message):
    from ostinato.cli import main

    write_sessions_jsonl(make_sessions(1, 1), tmp_path / "s.jsonl")
    rc = main(["replay", "run", "--engine-name", "e", "--sessions", str(tmp_path / "s.jsonl"), "--out",
               str(tmp_path / "out"), "--no-progress", *argv])
    assert rc == 2 and message in capsys.readouterr().err


def test_external_server_that_never_answers_is_named(tmp_path):
    from ostinato.server import free_port
    from ostinato.server.launcher import ExternalServer, ServerError

    srv = ExternalServer(f"http://127.0.0.1:{free_port()}", startup_timeout_s=1.0)
    with pytest.raises(ServerError, match="no answer from /v1/models"):
        srv.start()
    with pytest.raises(ValueError, match="expected an http"):
        ExternalServer("localhost:8000")


@pytest.mark.parametrize("api", ["openai", "llama"])
def test_replay_of_a_running_engine_by_url(llama_server_paths, tmp_path, api):
    """A llama-server started outside the replay, reached by URL: through its OpenAI-compatible endpoint the
    engine generates outputs of the recorded length; through /completion the recorded outputs are forced."""
    from ostinato.cli import main

    sessions = make_sessions(2, 2)
    write_sessions_jsonl(sessions, tmp_path / "s.jsonl")
    with LlamaServer(real_config(llama_server_paths, tmp_path)) as server:
        rc = main(["replay", "run", "--engine-name", f"url-{api}", "--server-url", server.base_url, "--api", api,
                   "--model-name", "tiny", "--sessions", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "out"),
                   "--no-progress", "--machine-label", "test", "--strict"])
    assert rc == 0
    recs = [json.loads(line) for p in sorted((tmp_path / "out" / f"url-{api}" / "sessions").glob("*.jsonl"))
            for line in p.read_text().splitlines()]
    assert len(recs) == 4 and all(r["ok"] for r in recs)
    assert all(r["n_output"] == 4 and r["ttft_s"] > 0 for r in recs)  # the recorded length (ignore_eos)
    if api == "openai":
        assert all(r["forced_match"] is None and r["n_forced"] == 0 for r in recs)
    else:
        assert all(r["forced_match"] is True and r["server"]["predicted_n"] == 4 for r in recs)
    # the second request of a session sends the recorded conversation: first request + its recorded output + new
    s0 = sessions[0].requests
    assert recs[1]["n_prompt"] == len(s0[0].new_token_ids) + len(s0[0].output_token_ids) + len(s0[1].new_token_ids)


# --- replay bitwise --------------------------------------------------------------------------------

def _write_probs(root: Path, engine: str, sessions: dict[str, list[list[float]]], probs: bool = True) -> Path:
    """An engine directory of hand-made records: per session one request whose tokens carry these log-probabilities."""
    d = root / engine / "sessions"
    d.mkdir(parents=True)
    for sid, lps in sessions.items():
        rec = {"engine": engine, "session": sid, "turn": 0, "ok": True, "attempt": 1,
               "streamed_token_ids": [97 + i for i in range(len(lps))]}
        if probs:
            rec.update({"top_ids": [[97 + i, 3] for i in range(len(lps))], "top_logprobs": lps})
        (d / (sid.replace("/", "__") + ".jsonl")).write_text(json.dumps(rec) + "\n")
    return root / engine


def test_bitwise_compare_finds_the_first_differing_bit(tmp_path):
    from ostinato.replay.bitwise import compare

    lps = {"t/a": [[-0.5, -1.25], [-0.1, -3.0]], "t/b": [[-2.0, -2.5]]}
    a = _write_probs(tmp_path / "x", "inturn", lps)
    same = compare(a, _write_probs(tmp_path / "y", "overlap", lps))
    assert same.equal and (same.sessions, same.requests, same.tokens) == (2, 2, 3)
    # one ulp apart in the last token of one session
    import math
    off = {"t/a": [[-0.5, -1.25], [-0.1, math.nextafter(-3.0, 0.0)]], "t/b": lps["t/b"]}
    diff = compare(a, _write_probs(tmp_path / "z", "overlap", off))
    assert not diff.equal and len(diff.differences) == 1
    d = diff.differences[0]
    assert (d.session, d.turn, d.what, d.position) == ("t/a", 0, "top_logprobs", 1)
    # a session only one side holds, and a replay without probabilities, are differences too
    assert [x.what for x in compare(a, _write_probs(tmp_path / "w", "overlap", {"t/a": lps["t/a"]})).differences] == ["missing"]
    noprobs = compare(a, _write_probs(tmp_path / "v", "overlap", lps, probs=False))
    assert not noprobs.equal and {x.what for x in noprobs.differences} == {"no_probs"} and noprobs.tokens == 0


def test_bitwise_compares_a_session_only_after_the_same_served_sessions(tmp_path, capsys):
    """A server keeps state from one session to the next (borrowed memory): a session whose server had served other
    sessions before it on one side (a replay resumed on a new server start) is a `history` difference, not compared."""
    from ostinato.cli import main
    from ostinato.replay.bitwise import compare
    from ostinato.replay.runner import ServedSessions

    lps = {"t/a": [[-0.5, -1.25]], "t/b": [[-2.0, -2.5]], "t/c": [[-1.0, -1.5]]}

    def with_history(root: Path, restart_before: str | None) -> Path:
        d = _write_probs(root, "e", lps)
        served, start = ServedSessions(), 1
        for sid in sorted(lps):
            start += sid == restart_before
            f = d / "sessions" / (sid.replace("/", "__") + ".jsonl")
            rec = json.loads(f.read_text())
            rec["server_prior"] = served.prior(start)
            served.add(start, sid)
            f.write_text(json.dumps(rec) + "\n")
        return d

    a = with_history(tmp_path / "x", None)
    assert compare(a, with_history(tmp_path / "y", None)).equal
    resumed = compare(a, with_history(tmp_path / "z", "t/b"))  # b's server started again before t/b
    assert not resumed.equal and (resumed.sessions, resumed.tokens) == (1, 1)
    assert [(d.session, d.what) for d in resumed.differences] == [("t/b", "history"), ("t/c", "history")]
    assert "served 1 session(s) before it, b's 0" in resumed.differences[0].detail
    # records made before the history was recorded are compared as before
    assert compare(a, _write_probs(tmp_path / "w", "e", lps)).equal
    assert main(["replay", "bitwise", "--in", str(a), str(tmp_path / "z" / "e"), "--out", str(tmp_path / "h.json")]) == 1
    assert "2 of them sessions not compared" in capsys.readouterr().err


def test_bitwise_cli_exit_status_and_report(tmp_path, capsys):
    from ostinato.cli import main

    lps = {"t/a": [[-0.5, -1.25]]}
    a = _write_probs(tmp_path / "x", "e", lps)
    assert main(["replay", "bitwise", "--in", str(a), str(_write_probs(tmp_path / "y", "e", lps)),
                 "--out", str(tmp_path / "eq.json")]) == 0
    assert json.loads((tmp_path / "eq.json").read_text())["equal"] is True
    assert main(["replay", "bitwise", "--in", str(a), str(_write_probs(tmp_path / "z", "e", {"t/a": [[-0.5, -1.0]]})),
                 "--out", str(tmp_path / "ne.json")]) == 1
    rep = json.loads((tmp_path / "ne.json").read_text())
    assert rep["equal"] is False and rep["differences"][0]["what"] == "top_logprobs"
    assert "NOT bitwise equal" in capsys.readouterr().err


def _fake_build(root: Path, variant: str, fingerprint: str, sources: str | None) -> Path:
    """A llama-server binary under root/<variant>/bin with the manifest `ostinato engine build` writes beside it."""
    (root / variant / "bin").mkdir(parents=True)
    binary = root / variant / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\n")
    manifest = {"variant": variant, "backend": "cuda", "fingerprint": fingerprint}
    if sources is not None:
        manifest["sources"] = sources
    (root / variant / "manifest.json").write_text(json.dumps(manifest))
    return binary


def _replay_dir(path: Path, binary: Path | str, build: dict | None, sessions: Path | None = None,
                gpus: tuple[str, ...] = (), preset: str | None = None) -> Path:
    path.mkdir(parents=True)
    entry = {"server_command": [str(binary), "-m", "m.gguf"], **({"engine_build": build} if build else {}),
             "engine_preset": {"name": preset, "description": "d"} if preset else None}
    if sessions is not None:
        from ostinato.atomic import sha256_file

        entry.update(sessions_file=str(sessions), sessions_sha256=sha256_file(sessions),
                     machine_info={"label": "m", "gpus": [{"name": g} for g in gpus]})
    (path / "runs.json").write_text(json.dumps([{"server_command": ["old"]}, entry]))
    return path


def test_a_replay_records_its_engine_build_and_a_change_is_a_setup_change(fake_bin, fake_model, tmp_path):
    from ostinato.replay.provenance import engine_build

    binary = _fake_build(tmp_path / "eng", "ostinato", "f" * 64, "a" * 64)
    build = engine_build(binary)
    assert build == {"variant": "ostinato", "backend": "cuda", "fingerprint": "f" * 64, "sources": "a" * 64}
    assert engine_build(fake_bin) is None and engine_build(None) is None  # no manifest beside it
    sessions = make_sessions(1, 1)
    out = tmp_path / "out"
    with LlamaServer(fake_config(fake_bin, fake_model, tmp_path)) as server:
        run_replay(sessions, server, ReplayConfig("ostinato", out, progress=False), run_info={"engine_build": build})
        rebuilt = {**build, "fingerprint": "e" * 64}
        with pytest.raises(ValueError, match="engine_build"):
            run_replay(sessions, server, ReplayConfig("ostinato", out, progress=False),
                       run_info={"engine_build": rebuilt})


def test_same_engine_keeps_only_replays_of_the_build_their_binary_is_now(tmp_path, capsys):
    from ostinato.replay.cli import same_engine_cmd
    from ostinato.replay.provenance import parse_legacy_sources, same_engine

    binary = _fake_build(tmp_path / "eng", "ostinato", "f" * 64, "a" * 64)
    now = {"variant": "ostinato", "backend": "cuda", "fingerprint": "f" * 64, "sources": "a" * 64}
    same = _replay_dir(tmp_path / "r" / "same", binary, now)
    other = _replay_dir(tmp_path / "r" / "other", binary, {**now, "fingerprint": "b" * 64, "sources": "c" * 64})
    options = _replay_dir(tmp_path / "r" / "options", binary, {**now, "fingerprint": "b" * 64})
    legacy = _replay_dir(tmp_path / "r" / "legacy", binary, None)
    by_url = _replay_dir(tmp_path / "r" / "url", "http://127.0.0.1:8080", None)
    assert same_engine(same).same
    assert not same_engine(other).same and "other engine code" in same_engine(other).why
    assert not same_engine(options).same and "other options" in same_engine(options).why
    # a replay from before the build was recorded: kept only when told which code it ran, and the binary has it
    assert not same_engine(legacy).same and "no --legacy-sources for ostinato" in same_engine(legacy).why
    assert same_engine(legacy, {"ostinato": "a" * 64}).same
    assert not same_engine(legacy, {"ostinato": "d" * 64}).same
    assert not same_engine(by_url).same and "reached by URL" in same_engine(by_url).why
    (tmp_path / "eng" / "ostinato" / "manifest.json").write_text(json.dumps({"variant": "ostinato"}))
    assert not same_engine(legacy, {"ostinato": "a" * 64}).same  # a manifest without sources proves nothing
    with pytest.raises(ValueError, match="--legacy-sources 'ostinato=xyz': expected VARIANT=SHA256"):
        parse_legacy_sources(["ostinato=xyz"])
    # the CLI: one line per replay, 1 unless every one is the same build on the session file there now
    sessions = tmp_path / "tau2.jsonl"
    sessions.write_text('{"session": "a"}\n')
    same = _replay_dir(tmp_path / "r" / "cli-same", binary, now, sessions)
    other = _replay_dir(tmp_path / "r" / "cli-other", binary, {**now, "fingerprint": "b" * 64}, sessions)
    ns = argparse.Namespace(replays=[same, other], legacy_sources=[], presets=[])
    (tmp_path / "eng" / "ostinato" / "manifest.json").write_text(json.dumps({**now}))
    assert same_engine_cmd(ns) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("same: ") and lines[1].startswith("DIFFERENT: ")
    assert same_engine_cmd(argparse.Namespace(replays=[same], legacy_sources=[], presets=[])) == 0
    # the same build and sessions on another GPU model (an H200 replay carried to a session lent an H100); this
    # test machine has no GPU
    h200 = _replay_dir(tmp_path / "r" / "cli-h200", binary, now, sessions, gpus=("NVIDIA H200",))
    assert same_engine_cmd(argparse.Namespace(replays=[h200], legacy_sources=[], presets=[])) == 1
    assert "ran on NVIDIA H200, this machine has no GPU" in capsys.readouterr().out
    # the same build and sessions, another preset under the engine's name (a config that changed it)
    graph = _replay_dir(tmp_path / "r" / "ostinato", binary, now, sessions, preset="ostinato-graph")
    ns = argparse.Namespace(replays=[graph], legacy_sources=[], presets=["ostinato=ostinato-graph-borrow"])
    assert same_engine_cmd(ns) == 1
    assert "ran preset ostinato-graph, ostinato is now preset ostinato-graph-borrow" in capsys.readouterr().out
    assert same_engine_cmd(argparse.Namespace(replays=[graph], legacy_sources=[],
                                              presets=["ostinato=ostinato-graph", "buun=buun"])) == 0
    assert same_engine_cmd(argparse.Namespace(replays=[graph], legacy_sources=[], presets=["buun=buun"])) == 0
    capsys.readouterr()
    with pytest.raises(ValueError, match="--presets 'ostinato': expected ENGINE=PRESET"):
        same_engine_cmd(argparse.Namespace(replays=[graph], legacy_sources=[], presets=["ostinato"]))
    sessions.write_text('{"session": "b"}\n')  # the same build, other sessions (a set built from other traces)
    assert same_engine_cmd(argparse.Namespace(replays=[same], legacy_sources=[], presets=[])) == 1
    assert "(other sessions)" in capsys.readouterr().out


def test_same_gpus_compares_the_recorded_gpu_models(tmp_path):
    from ostinato.replay.provenance import gpu_names, same_gpus

    sessions = tmp_path / "s.jsonl"
    sessions.write_text("{}\n")
    r = _replay_dir(tmp_path / "r", "bin", None, sessions, gpus=("NVIDIA H200",))
    assert same_gpus(r, ["NVIDIA H200"]).same
    assert not same_gpus(r, ["NVIDIA H100 80GB HBM3"]).same
    assert gpu_names([{"name": "A"}, "junk", {"name": "B"}]) == ["A", "B"] and gpu_names(None) == []
    bare = _replay_dir(tmp_path / "bare", "bin", None)
    assert "recorded no machine description" in same_gpus(bare, []).why


def test_same_sessions_keeps_only_replays_of_the_session_file_there_now(tmp_path):
    """A finished replay carried to another machine counts only on the session file it replayed: a GPU machine
    without the trace mirror builds sets of other token ids from the committed tables (2026-12-05)."""
    from ostinato.replay.provenance import same_sessions

    sessions = tmp_path / "sessions.jsonl"
    sessions.write_text('{"session": "a"}\n')
    kept = _replay_dir(tmp_path / "kept", "llama-server", None, sessions)
    assert same_sessions(kept).same
    sessions.write_text('{"session": "a", "requests": []}\n')
    m = same_sessions(kept)
    assert not m.same and "other sessions" in m.why and str(sessions) in m.why
    sessions.unlink()
    assert not same_sessions(kept).same and "which is not here" in same_sessions(kept).why
    assert not same_sessions(_replay_dir(tmp_path / "old", "llama-server", None)).same  # nothing recorded
