"""Faults during a replay, against tests/fixtures/fake_llama_server.py (no engine build): the server killed
mid-session, the replay process killed mid-session, the disk full while results are written, a truncated result
file, bad session lines and a request the server refuses. After the rerun, every request of every session is
recorded exactly once, with the prompt the conversation gives it: none lost, none duplicated."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import ostinato.atomic
import ostinato.cli
import ostinato.replay.store as store_mod
from ostinato.replay import ReplayConfig, ResultStore, run_replay
from ostinato.replay.runner import WARMUP_TOKEN_IDS
from ostinato.replay.store import ResultWriteError
from ostinato.server import LlamaServer
from ostinato.sessions.model import TokenizedRequest, TokenizedSession, write_sessions_jsonl
from test_replay import fake_config as server_config  # the fake llama-server's config (fixtures in conftest)

REPO = Path(__file__).resolve().parents[1]


def make_sessions(n: int = 4, turns: int = 3) -> list[TokenizedSession]:
    """Small byte-vocabulary sessions with distinct ids per session and turn."""
    return [TokenizedSession(f"fault/s{s}", "test", "byte", "chatml", tuple(
        TokenizedRequest(t, "first" if t == 0 else "tool", (10 + s, 20 + t, 30, 31), (97, 98 + t, 99, 100, 101))
        for t in range(turns))) for s in range(n)]


def logged_completions(tmp_path: Path) -> list[list[int]]:
    """The prompts of every /completion the fake servers received, in order."""
    path = tmp_path / "requests.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [r["body"]["prompt"] for r in lines if r["path"] == "/completion"]


def assert_every_request_once(root: Path, sessions: list[TokenizedSession], tmp_path: Path | None = None) -> None:
    """Each request of each session has one ok record with its session's counts, and (when `tmp_path` holds the
    server's request log) the server received its prompt: the whole conversation up to it."""
    recs = list(ResultStore(root).iter_records())
    got = sorted((r["session"], r["turn"]) for r in recs)
    want = sorted((s.session_id, t) for s in sessions for t in range(len(s.requests)))
    assert got == want, "a request was lost or recorded twice"
    by_id = {s.session_id: s for s in sessions}
    prompts = {tuple(p) for p in logged_completions(tmp_path)} if tmp_path is not None else None
    for r in recs:
        req = by_id[r["session"]].requests[r["turn"]]
        assert r["ok"] and r["forced_match"] and r["n_new"] == req.n_new and r["n_forced"] == req.n_output
        context = [t for q in by_id[r["session"]].requests[:r["turn"]] for t in q.new_token_ids + q.output_token_ids]
        assert r["n_prompt"] == len(context) + req.n_new
        if prompts is not None:
            assert tuple(context) + req.new_token_ids in prompts
    assert not list((root / "sessions").glob(".*.tmp"))


# --- the server killed mid-session ----------------------------------------------------------------------------------

def test_server_killed_mid_session_then_every_request_once(fake_bin, fake_model, tmp_path):
    """SIGKILL from outside (the OOM killer, an operator) during a session: the server is restarted and the session
    replayed again from its first request; no request is lost or recorded twice."""
    sessions = make_sessions()
    killed = []

    def kill_once(server, session, turn):
        if session.session_id == "fault/s1" and turn == 1 and not killed:
            killed.append(server.proc.pid)
            os.kill(server.proc.pid, signal.SIGKILL)

    cfg = ReplayConfig("stock", tmp_path / "out", progress=False, after_request=kill_once)
    with LlamaServer(server_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, cfg)
    assert killed and summary.restarts == 1 and summary.retried == {"fault/s1": 1} and not summary.failed
    assert_every_request_once(tmp_path / "out" / "stock", sessions, tmp_path)
    s1 = [r for r in ResultStore(tmp_path / "out" / "stock").iter_records() if r["session"] == "fault/s1"]
    assert {r["attempt"] for r in s1} == {2} and {r["server_start"] for r in s1} == {2}


# --- the replay process killed mid-session --------------------------------------------------------------------------

def _replay_argv(fake_bin: Path, fake_model: Path, sessions_file: Path, out: Path) -> list[str]:
    return [sys.executable, "-c",
            "import sys, ostinato.cli as c; c._GROUPS = ('ostinato.replay.cli',); sys.exit(c.main())",
            "replay", "run", "--engine-name", "stock", "--server-bin", str(fake_bin), "--model", str(fake_model),
            "--sessions", str(sessions_file), "--out", str(out), "--no-progress", "--machine-label", "test"]


def test_replay_killed_mid_session_then_rerun_records_every_request_once(fake_bin, fake_model, tmp_path):
    sessions = make_sessions()
    sessions_file = tmp_path / "sessions.jsonl"
    write_sessions_jsonl(sessions, sessions_file)
    out = tmp_path / "out"
    argv = _replay_argv(fake_bin, fake_model, sessions_file, out)
    env = {**os.environ, "FAKE_TOKEN_DELAY": "0.05", "FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl"),
           "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # kill it while session 1's second request streams: after a prompt of session 1 beyond its first request
    s1_turn1 = list(sessions[1].requests[0].new_token_ids + sessions[1].requests[0].output_token_ids)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p[:len(s1_turn1)] == s1_turn1 and len(p) > len(s1_turn1) for p in logged_completions(tmp_path)):
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stdout.read().decode()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    done_before = sorted(p.name for p in (out / "stock" / "sessions").glob("*.jsonl"))
    assert done_before == ["fault__s0.jsonl"]  # session 1 was cut: nothing of it kept
    env["FAKE_TOKEN_DELAY"] = "0.001"
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "1 already present" in res.stderr
    assert_every_request_once(out / "stock", sessions, tmp_path)


# --- the disk full while results are written ------------------------------------------------------------------------

def _full_at_write(real, victim: str):
    """An atomic_open whose writes to `victim` fail with ENOSPC after some bytes (the temp file is then removed)."""

    @contextmanager
    def opener(path, *args, **kwargs):
        with real(path, *args, **kwargs) as fh:
            if Path(path).name == victim:
                fh.write('{"engine":"stock","ses')
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            yield fh

    return opener


@pytest.mark.parametrize("where", ["write", "rename"])
def test_disk_full_while_writing_results_then_rerun_records_every_request_once(fake_bin, fake_model, tmp_path,
                                                                               monkeypatch, where):
    sessions = make_sessions()
    victim = "fault__s2.jsonl"
    if where == "write":
        monkeypatch.setattr(store_mod, "atomic_open", _full_at_write(store_mod.atomic_open, victim))
    else:
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if Path(dst).name == victim:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(ostinato.atomic.os, "replace", replace)
    out = tmp_path / "out"
    with LlamaServer(server_config(fake_bin, fake_model, tmp_path)) as server:
        with pytest.raises(ResultWriteError, match=f"cannot write .*{victim}: No space left on device.*fault/s2"):
            run_replay(sessions, server, ReplayConfig("stock", out, progress=False))
    kept = sorted(p.name for p in (out / "stock" / "sessions").iterdir())
    assert kept == ["fault__s0.jsonl", "fault__s1.jsonl"]  # no temp file, nothing of s2
    monkeypatch.undo()
    with LlamaServer(server_config(fake_bin, fake_model, tmp_path)) as server:
        again = run_replay(sessions, server, ReplayConfig("stock", out, progress=False))
    assert again.skipped == ["fault/s0", "fault/s1"] and again.done == ["fault/s2", "fault/s3"]
    assert_every_request_once(out / "stock", sessions, tmp_path)


def test_disk_full_is_a_clear_error_of_the_cli(fake_bin, fake_model, tmp_path, monkeypatch, capsys):
    sessions_file = tmp_path / "sessions.jsonl"
    write_sessions_jsonl(make_sessions(2, 1), sessions_file)
    monkeypatch.setattr(store_mod, "atomic_open", _full_at_write(store_mod.atomic_open, "fault__s1.jsonl"))
    rc = ostinato.cli.main(["replay", "run", "--engine-name", "stock", "--server-bin", str(fake_bin), "--model",
                            str(fake_model), "--sessions", str(sessions_file), "--out", str(tmp_path / "out"),
                            "--no-progress", "--machine-label", "test"])
    err = capsys.readouterr().err
    assert rc == 2 and "ostinato: error: cannot write" in err and "No space left on device" in err


# --- a truncated result file ----------------------------------------------------------------------------------------

def test_resume_survives_a_truncated_result_file(fake_bin, fake_model, tmp_path, capsys):
    sessions = make_sessions(3, 2)
    out = tmp_path / "out"
    with LlamaServer(server_config(fake_bin, fake_model, tmp_path)) as server:
        run_replay(sessions, server, ReplayConfig("stock", out, progress=False))
    damaged = out / "stock" / "sessions" / "fault__s1.jsonl"
    text = damaged.read_text()
    damaged.write_text(text[: len(text) - 40])  # the last line cut short
    with LlamaServer(server_config(fake_bin, fake_model, tmp_path)) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", out, progress=False))
    printed = capsys.readouterr().out
    assert f"{damaged}:2: not JSON" in printed and "session fault/s1 is replayed again" in printed
    assert summary.done == ["fault/s1"] and summary.skipped == ["fault/s0", "fault/s2"]
    assert_every_request_once(out / "stock", sessions)


def test_summaries_name_an_unreadable_result_file(tmp_path):
    from ostinato.replay.results import load_requests

    root = tmp_path / "out" / "stock" / "sessions"
    root.mkdir(parents=True)
    (root / "x.jsonl").write_text('{"engine": "stock", "session": "x", "turn": 0}\n{"engine": "sto')
    with pytest.raises(ValueError, match=r"x\.jsonl:2: not JSON"):
        load_requests([tmp_path / "out"])


# --- bad sessions: skipped and named, the others replayed -----------------------------------------------------------

def test_bad_session_lines_are_named_and_skipped_and_the_others_replayed(fake_bin, fake_model, tmp_path, capsys):
    """Invalid token ids in one session used to abort the whole replay at the warm-up (which sent the first
    session's ids) without naming it. Now each bad line is named and skipped, the others are replayed, the warm-up
    sends its own ids, and the run ends with exit status 2."""
    good = make_sessions(3, 2)
    bad_ids = good[0].to_json()
    bad_ids["session"] = "fault/negative"
    bad_ids["requests"][0]["new_token_ids"][1] = -5
    outside = good[0].to_json()
    outside["session"] = "fault/outside"
    outside["requests"][1]["output_token_ids"][0] = 300  # the byte vocabulary has 259 tokens
    lines = [json.dumps(bad_ids), json.dumps(good[0].to_json()), json.dumps(outside), json.dumps(good[1].to_json()),
             json.dumps(good[2].to_json())[:50]]
    sessions_file = tmp_path / "sessions.jsonl"
    sessions_file.write_text("\n".join(lines) + "\n")
    rc = ostinato.cli.main(["replay", "run", "--engine-name", "stock", "--server-bin", str(fake_bin), "--model",
                            str(fake_model), "--sessions", str(sessions_file), "--out", str(tmp_path / "out"),
                            "--no-progress", "--machine-label", "test", "--env",
                            f"FAKE_REQUEST_LOG={tmp_path / 'requests.jsonl'}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert (f"{sessions_file}:1: session fault/negative: key 'requests[0].new_token_ids[1]': -5 is less than the "
            f"minimum of 0") in err
    assert f"{sessions_file}:3: session fault/outside: key 'requests[1].output_token_ids[0]': token id 300" in err
    assert f"{sessions_file}:5: not JSON" in err
    assert "ostinato: error: --sessions" in err and "3 bad session line(s) skipped, the others replayed" in err
    assert_every_request_once(tmp_path / "out" / "stock", good[:2], tmp_path)
    assert logged_completions(tmp_path)[0] == list(WARMUP_TOKEN_IDS)


def test_a_session_the_server_refuses_fails_alone_even_first(fake_bin, fake_model, tmp_path):
    """Ids the reader cannot check (an unknown tokenizer) that the server refuses (400): that session fails with the
    server's reason, the warm-up (not that session's ids) and the other sessions go through."""
    good = make_sessions(3, 2)
    refused = TokenizedSession("fault/refused", "test", "custom", "chatml",
                               (TokenizedRequest(0, "first", (1, 2, 5000), (97, 98)),))
    sessions = [refused, *good]
    cfg = server_config(fake_bin, fake_model, tmp_path, FAKE_N_VOCAB="259")
    with LlamaServer(cfg) as server:
        summary = run_replay(sessions, server, ReplayConfig("stock", tmp_path / "out", progress=False))
    assert summary.restarts == 0 and summary.done == [s.session_id for s in good]
    assert "HTTP 400" in summary.failed["fault/refused"] and "token id 5000 out of range" in summary.failed["fault/refused"]
    store = ResultStore(tmp_path / "out" / "stock")
    assert store.status("fault/refused") == "failed"
    ok = [r for r in store.iter_records() if r["session"] != "fault/refused"]
    assert len(ok) == 6 and all(r["ok"] for r in ok)
