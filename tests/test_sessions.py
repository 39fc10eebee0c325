"""Tests of the session readers, chat framing, tokenization and `ostinato sessions build`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ostinato.cli
from ostinato.sessions import (
    CHATML,
    Caps,
    read_sessions_jsonl,
    read_swe_mini,
    resolve_tokenizer,
    tokenize_session,
)
from ostinato.sessions.readers import iter_source, load_tau2_file, tau2_sessions

FIXTURES = Path(__file__).parent / "fixtures" / "sessions"


def cli_main(argv: list[str]) -> int:
    """Run the real `ostinato` entry point with only the sessions group registered."""
    saved = ostinato.cli._GROUPS
    ostinato.cli._GROUPS = ("ostinato.sessions.cli",)
    try:
        return ostinato.cli.main(argv)
    finally:
        ostinato.cli._GROUPS = saved


def byte_tok(text: str) -> list[int]:
    """Tokenizer used by the tests: UTF-8 bytes."""
    return list(text.encode("utf-8"))


def test_swe_mini_requests_kinds_and_texts():
    s = read_swe_mini(FIXTURES / "swe-mini" / "demo__demo-1.traj.json")
    assert s.session_id == "swe-mini/demo__demo-1"
    assert [r.kind for r in s.requests] == ["first", "tool", "tool"]  # trailing user message: no request
    first = s.requests[0]
    assert [m.role for m in first.new_messages] == ["system", "user"]
    assert first.output.content.startswith("THOUGHT: look around.")
    assert [m.role for m in s.requests[1].new_messages] == ["user"]
    assert "count.py" in s.requests[1].new_messages[0].content


def test_tau2_greeting_user_and_tool_kinds():
    tf = load_tau2_file(FIXTURES / "tau2" / "a_airline_with_info.json")
    assert tf.domain == "airline" and tf.policy.startswith("# Airline")
    s0, s1 = tau2_sessions(tf)
    assert s0.session_id == "tau2/a_airline_with_info/000"
    assert [r.kind for r in s0.requests] == ["first", "tool", "user", "tool"]
    first = s0.requests[0]
    # system policy + scripted greeting + first user message form the first request's input
    assert [m.role for m in first.new_messages] == ["system", "assistant", "user"]
    assert first.output.tool_calls == ({"name": "get_reservation_details", "arguments": {"reservation_id": "ABC123"}},)
    assert len(s1.requests) == 1


def test_tau2_list_shape_borrows_policy_and_drops_user_tools():
    sessions = list(iter_source("tau2", FIXTURES / "tau2"))
    ids = [s.session_id for s in sessions]
    assert ids == sorted(ids) and len(ids) == 3
    tel = sessions[-1]
    assert tel.requests[0].new_messages[0].content.startswith("# Airline")  # borrowed policy
    second = tel.requests[1]
    assert second.kind == "user"
    assert [m.role for m in second.new_messages] == ["user"]  # user's own tool call and result dropped
    assert "now it is off" in second.new_messages[0].content


def test_chat_framing_and_tokenization_round_trip():
    s = read_swe_mini(FIXTURES / "swe-mini" / "demo__demo-1.traj.json")
    t = tokenize_session(s, byte_tok, CHATML, tokenizer_name="byte")
    text = b"".join(bytes(r.new_token_ids) + bytes(r.output_token_ids) for r in t.requests).decode("utf-8")
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant")
    assert text.count("<|im_start|>assistant\n") == 3 and text.count("<|im_end|>\n") == 7
    assert bytes(t.requests[0].output_token_ids).decode().endswith("```<|im_end|>\n")
    assert "naïve −1" in text  # multi-byte characters survive
    assert t.n_context == sum(r.n_new + r.n_output for r in t.requests)


def test_tool_calls_rendered_in_output():
    tf = load_tau2_file(FIXTURES / "tau2" / "a_airline_with_info.json")
    t = tokenize_session(tau2_sessions(tf)[0], byte_tok, CHATML)
    out = bytes(t.requests[0].output_token_ids).decode()
    assert out.startswith("<tool_call>\n{") and '"name": "get_reservation_details"' in out


def test_caps_limit_requests_tokens_and_context():
    s = read_swe_mini(FIXTURES / "swe-mini" / "demo__demo-1.traj.json")
    t = tokenize_session(s, byte_tok, CHATML, caps=Caps(max_requests=2, max_new_tokens=10, max_output_tokens=5))
    assert len(t.requests) == 2
    assert all(r.n_new <= 10 and r.n_output <= 5 for r in t.requests)
    full = tokenize_session(s, byte_tok, CHATML)
    limit = full.requests[0].n_new + full.requests[0].n_output
    t2 = tokenize_session(s, byte_tok, CHATML, caps=Caps(max_context_tokens=limit))
    assert len(t2.requests) == 1


def test_any_callable_tokenizer_and_named_ones():
    s = read_swe_mini(FIXTURES / "swe-mini" / "alpha__alpha-7.traj.json")
    t = tokenize_session(s, lambda text: [len(w) for w in text.split()], CHATML)
    assert all(isinstance(i, int) for r in t.requests for i in r.new_token_ids)
    ids = resolve_tokenizer("byte")("héllo")
    assert len(ids) >= 5 and all(isinstance(i, int) for i in ids)
    with pytest.raises(ValueError, match="--tokenizer"):
        resolve_tokenizer("gpt2")


def test_cli_build_writes_jsonl(tmp_path: Path):
    out = tmp_path / "s.jsonl"
    rc = cli_main(["sessions", "build", "--source", "swe-mini", "--mirror", str(FIXTURES / "swe-mini"),
                   "--select", "1", "--tokenizer", "byte", "--max-requests", "1", "--out", str(out)])
    assert rc == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert obj["session"] == "swe-mini/alpha__alpha-7"  # first by name
    req = obj["requests"][0]
    assert req["kind"] == "first" and req["n_new"] == len(req["new_token_ids"]) and req["n_output"] > 0
    assert read_sessions_jsonl(out)[0].requests[0].n_new == req["n_new"]


def test_cli_missing_mirror_names_the_path(tmp_path: Path, capsys):
    missing = tmp_path / "nope"
    rc = cli_main(["sessions", "build", "--source", "tau2", "--mirror", str(missing), "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2
    assert str(missing) in capsys.readouterr().err


def test_mirror_root_or_source_folder_give_the_same_sessions():
    from ostinato.sessions.readers import iter_source

    for source in ("swe-mini", "tau2"):
        from_root = [s.session_id for s in iter_source(source, FIXTURES)]
        from_folder = [s.session_id for s in iter_source(source, FIXTURES / source)]
        assert from_root and from_root == from_folder
