"""Tests of the session readers (tau2, mini-swe-agent, SWE-rebench), tokenization, per-turn tables, synthesized ids,
splits, source resolution, `ostinato sessions` commands, the sessions rules and the Table 2 notebook."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from swe_mini_fixtures import write_swe_mini

import ostinato.cli
from ostinato.sessions import (
    CHATML,
    Caps,
    read_sessions_jsonl,
    read_swe_mini,
    resolve_tokenizer,
    tokenize_session,
)
from ostinato.sessions.readers import TraceError, iter_source, load_tau2_file, tau2_sessions
from ostinato.sessions.rebench import read_swe_rebench
from ostinato.sessions.splits import SplitSpec, make_splits, read_splits
from ostinato.sessions.synth import IDS_SYNTHESIZED, normal_token_ids, synthesize_session
from ostinato.sessions.tables import TurnRow, read_table

REPO = Path(__file__).resolve().parents[1]
# a mirror root like ../shared/traces: the committed tau2 and swe-rebench fixtures, plus the swe-mini trajectories
# written at test time (removed with the module's temporary directory)
_MIRROR_TMP = tempfile.TemporaryDirectory(prefix="ostinato-fixtures-")
FIXTURES = Path(shutil.copytree(Path(__file__).parent / "fixtures" / "sessions", Path(_MIRROR_TMP.name) / "sessions"))
SWE_MINI = write_swe_mini(FIXTURES / "swe-mini")
DATA = REPO / "data" / "sessions"
REBENCH = FIXTURES / "swe-rebench" / "rows.jsonl"


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
    s = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
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
    s = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
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
    s = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
    t = tokenize_session(s, byte_tok, CHATML, caps=Caps(max_requests=2, max_new_tokens=10, max_output_tokens=5))
    assert len(t.requests) == 2
    assert all(r.n_new <= 10 and r.n_output <= 5 for r in t.requests)
    full = tokenize_session(s, byte_tok, CHATML)
    limit = full.requests[0].n_new + full.requests[0].n_output
    t2 = tokenize_session(s, byte_tok, CHATML, caps=Caps(max_context_tokens=limit))
    assert len(t2.requests) == 1


def test_any_callable_tokenizer_and_named_ones():
    s = read_swe_mini(SWE_MINI / "alpha__alpha-7.traj.json")
    t = tokenize_session(s, lambda text: [len(w) for w in text.split()], CHATML)
    assert all(isinstance(i, int) for r in t.requests for i in r.new_token_ids)
    ids = resolve_tokenizer("byte")("héllo")
    assert len(ids) >= 5 and all(isinstance(i, int) for i in ids)
    with pytest.raises(ValueError, match="--tokenizer"):
        resolve_tokenizer("gpt2")


def test_cli_build_writes_jsonl(tmp_path: Path):
    out = tmp_path / "s.jsonl"
    rc = cli_main(["sessions", "build", "--source", "swe-mini", "--mirror", str(SWE_MINI),
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


# --- issue 3: SWE-rebench reader, recorded counts, tables, synthesized ids, splits, sources, Table 2 ---------



def write_json(path: Path, obj: object) -> Path:
    """Write a JSON fixture made by a test."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_swe_rebench_rows_kinds_tool_calls_and_shapes(tmp_path: Path):
    sessions = list(iter_source("swe-rebench", FIXTURES))
    assert [s.session_id for s in sessions] == ["swe-rebench/demo__app-7_run0", "swe-rebench/demo__lib-42_run0"]
    lib = sessions[1]
    assert [r.kind for r in lib.requests] == ["first", "tool", "user"]
    assert [m.role for m in lib.requests[0].new_messages] == ["system", "user"]
    assert lib.requests[0].new_messages[1].content.startswith("Fix the parser")  # list-of-parts content
    assert lib.requests[1].output.tool_calls == (
        {"name": "str_replace_editor", "arguments": {"command": "view", "path": "/workspace/parser.py"}},)
    assert [m.role for m in lib.requests[2].new_messages] == ["tool", "user"]
    assert lib.requests[0].recorded_output_tokens is None and lib.meta["resolved"] is True
    # the same rows as a JSON list, as {"rows": [...]}, and as datasets-server rows give the same sessions
    rows = [json.loads(line) for line in REBENCH.read_text().splitlines()]
    for shape in (rows, {"rows": rows}, {"rows": [{"row_idx": i, "row": r} for i, r in enumerate(rows)]}):
        got = read_swe_rebench(write_json(tmp_path / "rows.json", shape))
        assert {s.session_id: s.requests for s in got} == {s.session_id: s.requests for s in sessions}


@pytest.mark.parametrize("source,name,content,session", [
    ("swe-mini", "bad__one.traj.json", {"messages": [{"content": "no role"}]}, "swe-mini/bad__one"),
    ("swe-mini", "bad__two.traj.json", {"messages": "nope"}, "swe-mini/bad__two"),
    ("tau2", "x_airline.json", {"simulations": [{"task_id": "1", "messages": []},
                                                {"task_id": "2", "messages": {"role": "user"}}]},
     "tau2/x_airline/001"),
    ("tau2", "y_retail.json", {"simulations": [{"task_id": "1", "messages": [{"role": "assistant", "tool_calls": "call"}]}]},
     "tau2/y_retail/000"),
    ("swe-rebench", "rows.jsonl", [{"trajectory_id": "t1", "trajectory": "not json"}], "swe-rebench/t1"),
    ("swe-rebench", "rows.jsonl", [{"instance_id": "i9", "trajectory": [{"role": "assistant", "tool_calls": [{}]}]}],
     "swe-rebench/i9/00000"),
])
def test_malformed_files_name_file_and_session(tmp_path: Path, source, name, content, session):
    path = tmp_path / source / name
    if name.endswith(".jsonl"):
        path.parent.mkdir(parents=True)
        path.write_text("\n".join(json.dumps(r) for r in content) + "\n")
    else:
        write_json(path, content)
    with pytest.raises(TraceError) as err:
        list(iter_source(source, tmp_path))
    assert str(path) in str(err.value) and f"session {session}" in str(err.value)


def test_not_json_is_rejected_naming_the_file(tmp_path: Path):
    path = tmp_path / "swe-mini" / "broken__x.traj.json"
    path.parent.mkdir()
    path.write_text("{not json")
    rc = cli_main(["sessions", "build", "--source", "swe-mini", "--mirror", str(tmp_path), "--out", str(tmp_path / "o")])
    assert rc == 2


def test_recorded_completion_tokens_are_read_and_preferred(tmp_path: Path):
    demo = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
    assert [r.recorded_output_tokens for r in demo.requests] == [12, None, None]
    tau2 = json.loads((FIXTURES / "tau2" / "a_airline_with_info.json").read_text())
    replies = [m for m in tau2["simulations"][0]["messages"] if m["role"] == "assistant" and m.get("tool_calls")]
    replies[0]["usage"] = {"prompt_tokens": 900, "completion_tokens": 41}
    tf = load_tau2_file(write_json(tmp_path / "a_airline_with_info.json", tau2))
    assert tau2_sessions(tf)[0].requests[0].recorded_output_tokens == 41
    text = tokenize_session(demo, byte_tok, CHATML, tokenizer_name="byte")
    rec = tokenize_session(demo, byte_tok, CHATML, tokenizer_name="byte", prefer_recorded=True)
    assert rec.requests[0].n_output == 12 and rec.requests[0].n_output_recorded == 12
    assert rec.requests[0].output_token_ids == text.requests[0].output_token_ids[:12]  # head of the text
    assert rec.requests[1].n_output == text.requests[1].n_output  # no recorded count: the text's
    assert rec.meta["ids"] == "tokenized" and rec.meta["output_count"] == "recorded"
    # a recorded count above the text's: synthesized ids (seeded) precede the reply's own ids
    data = json.loads((SWE_MINI / "demo__demo-1.traj.json").read_text())
    data["messages"][2]["extra"]["response"]["usage"]["completion_tokens"] = 200
    long = read_swe_mini(write_json(tmp_path / "demo__demo-1.traj.json", data))
    a = tokenize_session(long, byte_tok, CHATML, tokenizer_name="byte", prefer_recorded=True, seed=3)
    b = tokenize_session(long, byte_tok, CHATML, tokenizer_name="byte", prefer_recorded=True, seed=3)
    n_text = text.requests[0].n_output
    assert a.requests[0].n_output == 200 and a.meta["n_output_synthesized"] == 200 - n_text
    assert a.requests[0].output_token_ids[-n_text:] == text.requests[0].output_token_ids
    assert a == b and all(0 <= i < 256 for i in a.requests[0].output_token_ids)


def test_model_tokenizers_frame_with_special_tokens():
    from ostinato.sessions import get_template

    s = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
    ds = tokenize_session(s, resolve_tokenizer("deepseek"), get_template("deepseek"), tokenizer_name="deepseek")
    qw = tokenize_session(s, resolve_tokenizer("qwen"), CHATML, tokenizer_name="qwen")
    assert ds.requests[0].output_token_ids[-1] == 1  # <｜end▁of▁sentence｜> is one token
    assert qw.requests[0].new_token_ids[0] == 151644 and qw.requests[0].output_token_ids[-2] == 151645  # <|im_start|>, <|im_end|>
    assert all(r.n_new > 0 and r.n_output > 0 for r in ds.requests + qw.requests)
    assert ds.requests[0].n_new < len(b"".join(m.content.encode() for m in s.requests[0].new_messages))


def test_tables_hold_counts_only_and_match_tokenization(tmp_path: Path):
    out, prov = tmp_path / "swe-mini.turns.csv", tmp_path / "provenance.json"
    rc = cli_main(["sessions", "tables", "--source", "swe-mini", "--mirror", str(FIXTURES), "--tokenizers", "byte",
                   "--provenance", str(prov), "--no-progress", "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    assert "THOUGHT" not in text and "count.py" not in text  # numbers, never text
    header = text.splitlines()[0].split(",")
    assert header == ["session", "turn", "kind", "domain", "task", "new_byte", "output_byte", "output_recorded"]
    table = read_table(out)
    demo = table["swe-mini/demo__demo-1"]
    ref = tokenize_session(read_swe_mini(SWE_MINI / "demo__demo-1.traj.json"), byte_tok, CHATML)
    assert [(r.kind, r.new["byte"], r.output["byte"]) for r in demo] == [(q.kind, q.n_new, q.n_output) for q in ref.requests]
    assert [r.output_recorded for r in demo] == [12, None, None]
    entry = json.loads(prov.read_text())["tables"]["swe-mini"]
    assert entry["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert entry["source"]["commit"] == "d12a71affd95403b036b2bdbd827349b77bfffb9" and entry["sessions"] == 2
    assert entry["command"].startswith("ostinato sessions tables")


def test_table_counts_are_hf_tokenizers_counts(tmp_path: Path):
    """`sessions tables` counts deepseek and qwen tokens with HF tokenizers (deepseek: the package's tokenizer.json
    as it is) and records the tokenizers version."""
    import tokenizers

    from ostinato.models.vocab import deepseek_tokenizer_json, get_tokenizer
    from ostinato.sessions import get_template

    out, prov = tmp_path / "swe-mini.turns.csv", tmp_path / "provenance.json"
    assert cli_main(["sessions", "tables", "--source", "swe-mini", "--mirror", str(FIXTURES), "--tokenizers", "deepseek",
                     "qwen", "--provenance", str(prov), "--no-progress", "--out", str(out)]) == 0
    hf = {"deepseek": tokenizers.Tokenizer.from_file(str(deepseek_tokenizer_json())), "qwen": get_tokenizer("qwen").hf}
    assert isinstance(hf["qwen"], tokenizers.Tokenizer)
    session = read_swe_mini(SWE_MINI / "demo__demo-1.traj.json")
    rows = read_table(out)["swe-mini/demo__demo-1"]
    for name, template in (("deepseek", get_template("deepseek")), ("qwen", CHATML)):
        def count(text: str) -> int:
            return len(hf[name].encode(text, add_special_tokens=False).ids)

        want = [(count(template.render_prompt(r.new_messages)), count(template.render_output(r.output)))
                for r in session.requests]
        assert [(r.new[name], r.output[name]) for r in rows] == want, name
    versions = json.loads(prov.read_text())["tables"]["swe-mini"]["tokenizers"]
    assert versions["deepseek"] == {"package": "deepseek-tokenizer", "version": "0.3.0",
                                    "tokenizers": tokenizers.__version__}


def test_committed_tables_have_provenance_and_no_text():
    prov = json.loads((DATA / "provenance.json").read_text())
    for source in ("swe-mini", "tau2"):
        entry = prov["tables"][source]
        path = DATA / entry["table"]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), f"{path} changed; rerun the command"
        with path.open() as fh:
            header = next(csv.reader(fh))
        assert all(c in ("session", "turn", "kind", "domain", "task", "output_recorded")
                   or c.split("_")[0] in ("new", "output") for c in header)
        assert "ids" not in " ".join(header)


def _rows(sid: str, n: int, domain: str = "", task: str = "", new: int = 5, out: int = 3,
          recorded: int | None = None) -> list[TurnRow]:
    """Hand-made per-turn rows of one session."""
    return [TurnRow(sid, t, "first" if t == 0 else "tool", domain, task, {"byte": new + t, "qwen": new},
                    {"byte": out, "qwen": out}, recorded) for t in range(n)]


def test_synthesized_sessions_from_counts():
    rows = _rows("swe-mini/x", 4, recorded=7)
    a = synthesize_session(rows, "byte", seed=1, source="swe-mini")
    assert a.meta["ids"] == IDS_SYNTHESIZED == "synthesized-from-counts" and a.meta["seed"] == 1
    assert [r.n_new for r in a.requests] == [5, 6, 7, 8] and [r.n_output for r in a.requests] == [7] * 4
    assert [r.n_output for r in synthesize_session(rows, "byte", 1, "swe-mini", prefer_recorded=False).requests] == [3] * 4
    assert a == synthesize_session(rows, "byte", seed=1, source="swe-mini")  # seeded
    assert a.requests[0].new_token_ids != synthesize_session(rows, "byte", 2, "swe-mini").requests[0].new_token_ids
    assert all(0 <= i < 256 for r in a.requests for i in r.new_token_ids + r.output_token_ids)
    capped = synthesize_session(rows, "byte", 1, "swe-mini", caps=Caps(max_requests=3, max_new_tokens=6,
                                                                        max_context_tokens=30))
    assert [r.n_new for r in capped.requests] == [5, 6] and capped.n_context <= 30
    q = synthesize_session(rows, "qwen", 0, "swe-mini")
    assert max(i for r in q.requests for i in r.new_token_ids) < 151643  # normal tokens only
    ds = normal_token_ids("deepseek")
    assert 0 not in set(ds[:10].tolist()) and 1 not in set(ds[:10].tolist()) and len(ds) > 127000
    with pytest.raises(ValueError, match="no 'deepseek' counts"):
        synthesize_session(rows, "deepseek", 0, "swe-mini")


def test_build_from_table_and_split_set(tmp_path: Path):
    table = tmp_path / "swe-mini.turns.csv"
    assert cli_main(["sessions", "tables", "--source", "swe-mini", "--mirror", str(FIXTURES), "--tokenizers", "byte",
                     "--no-progress", "--out", str(table)]) == 0
    split = write_json(tmp_path / "splits.json", {"seed": 0, "sets": {
        "swe-dev": {"source": "swe-mini", "sessions": ["swe-mini/demo__demo-1"], "max_requests": 2, "domains": {}}}})
    out = tmp_path / "s.jsonl"
    assert cli_main(["sessions", "build", "--source", "swe-mini", "--table", str(table), "--split", str(split),
                     "--split-set", "swe-dev", "--tokenizer", "byte", "--seed", "5", "--out", str(out)]) == 0
    (s,) = read_sessions_jsonl(out)
    assert s.session_id == "swe-mini/demo__demo-1" and len(s.requests) == 2
    assert s.meta["ids"] == "synthesized-from-counts" and s.requests[0].n_output == 12  # recorded count preferred
    mirror = tmp_path / "m.jsonl"
    assert cli_main(["sessions", "build", "--source", "swe-mini", "--mirror", str(FIXTURES), "--split", str(split),
                     "--split-set", "swe-dev", "--tokenizer", "byte", "--out", str(mirror)]) == 0
    (m,) = read_sessions_jsonl(mirror)
    assert m.meta["ids"] == "tokenized"
    assert [(r.kind, r.n_new, r.n_output) for r in m.requests] == [(r.kind, r.n_new, r.n_output) for r in s.requests]
    assert cli_main(["sessions", "build", "--source", "tau2", "--table", str(table), "--split", str(split),
                     "--split-set", "swe-dev", "--out", str(mirror)]) == 2  # set of another source


def _split_tables(n_swe: int = 60, n_tau2: int = 40) -> tuple[dict, dict]:
    """Synthetic per-turn tables big enough for Table 2 splits (lengths inside and outside the ranges)."""
    swe = {f"swe-mini/s{i:03d}": _rows(f"swe-mini/s{i:03d}", 20 + 2 * i) for i in range(n_swe)}
    tau2 = {}
    for d, n in (("airline", n_tau2), ("retail", n_tau2), ("telecom", 20)):
        for i in range(n):
            sid = f"tau2/{d}/{i:03d}"
            tau2[sid] = _rows(sid, 5 + i % 12, domain=d, task=f"{d}{i % (n - 5) if d == 'airline' else i}")
    return swe, tau2


def test_splits_sizes_seeded_and_reproducible():
    swe, tau2 = _split_tables()
    spec = SplitSpec(seed=7)
    sets = make_splits(swe, tau2, spec)
    assert {k: len(v.sessions) for k, v in sets.items()} == {
        "swe-dev": 6, "swe-screening": 2, "swe-heldout": 13, "tau2-dev": 24, "tau2-heldout": 60}
    assert sets["swe-screening"].max_requests == 30 and sets["swe-screening"].sessions == sets["swe-dev"].sessions[:2]
    assert not set(sets["swe-dev"].sessions) & set(sets["swe-heldout"].sessions)
    assert all(42 <= len(swe[s]) <= 100 for k in ("swe-dev", "swe-heldout") for s in sets[k].sessions)
    assert sets["tau2-heldout"].domains == {"airline": 20, "retail": 20, "telecom": 20}
    tasks = [tau2[s][0].task for k in ("tau2-dev", "tau2-heldout") for s in sets[k].sessions]
    assert len(tasks) == len(set(tasks))  # one session per task
    assert make_splits(swe, tau2, spec) == sets  # same seed, same sets
    assert make_splits(swe, tau2, SplitSpec(seed=8))["swe-heldout"].sessions != sets["swe-heldout"].sessions
    with pytest.raises(ValueError, match="needed"):
        make_splits(dict(list(swe.items())[:20]), tau2, spec)


def test_committed_split_file_is_reproduced(tmp_path: Path):
    out = tmp_path / "splits.json"
    committed = json.loads((DATA / "splits.json").read_text())
    assert cli_main(["sessions", "split", "--swe-table", str(DATA / "swe-mini.turns.csv"), "--tau2-table",
                     str(DATA / "tau2.turns.csv"), "--seed", str(committed["seed"]), "--out", str(out)]) == 0
    made = json.loads(out.read_text())
    assert made["sets"] == committed["sets"] and made["tables"] == committed["tables"]
    assert committed["rule"] and committed["command"].startswith("ostinato sessions split")
    sets = read_splits(DATA / "splits.json")
    held = read_table(DATA / "swe-mini.turns.csv")
    assert all(42 <= len(held[s]) <= 100 for s in sets["swe-heldout"].sessions)


def test_get_traces_mirror_tables_or_a_clear_error(tmp_path: Path, capsys):
    out = tmp_path / "m.json"
    assert cli_main(["sessions", "get", "--source", "tau2", "--mirror", str(FIXTURES), "--no-probe",
                     "--out", str(out)]) == 0
    assert json.loads(out.read_text())["mode"] == "mirror"
    table = tmp_path / "tau2.turns.csv"
    table.write_text("session,turn,kind,domain,task,new_byte,output_byte,output_recorded\n")
    assert cli_main(["sessions", "get", "--source", "tau2", "--mirror", str(tmp_path / "none"), "--table", str(table),
                     "--no-probe", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["mode"] == "tables" and got["path"] == str(table) and got["url"].startswith("https://github.com/")
    assert cli_main(["sessions", "get", "--source", "swe-rebench", "--mirror", str(tmp_path / "none"), "--no-probe",
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "source swe-rebench" in err and "sessions.mirror" in err and "huggingface.co" in err


def test_probe_failure_is_reported(monkeypatch, tmp_path: Path):
    from ostinato.sessions import sources

    monkeypatch.setattr(sources, "probe_url", lambda url, timeout_s=5.0: "ConnectError: no network")
    with pytest.raises(FileNotFoundError, match="unreachable \\(ConnectError: no network\\)"):
        sources.resolve_source("swe-mini", tmp_path, None, None)
    monkeypatch.setattr(sources, "probe_url", lambda url, timeout_s=5.0: None)
    with pytest.raises(FileNotFoundError, match="reachable but this artifact does not download it"):
        sources.resolve_source("swe-mini", tmp_path, None, None)


def test_jsonl_stays_compatible(tmp_path: Path):
    old = {"session": "a", "source": "tau2", "tokenizer": "byte", "template": "chatml", "requests": [
        {"turn": 0, "kind": "first", "n_new": 2, "n_output": 1, "new_token_ids": [1, 2], "output_token_ids": [3]}]}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (s,) = read_sessions_jsonl(path)
    assert s.requests[0].n_output_recorded is None and s.meta == {}
    assert s.requests[0].to_json()["n_output_recorded"] is None


@pytest.mark.slow  # papermill starts a kernel
def test_table2_notebook_runs_under_papermill(tmp_path: Path):
    pytest.importorskip("papermill")
    nb = REPO / "notebooks" / "table2.ipynb"
    code = ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    assert all(src in (REPO / "notebooks" / "table2.py").read_text() for src in code), "jupytext --sync"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    params = [f"{k}={v}" for k, v in {
        "swe_table": DATA / "swe-mini.turns.csv", "tau2_table": DATA / "tau2.turns.csv", "splits": DATA / "splits.json",
        "paper_csv": REPO / "data" / "paper" / "table2.csv", "figures_dir": tmp_path / "figures",
        "tables_dir": tmp_path / "tables"}.items()]
    res = subprocess.run([sys.executable, "-m", "papermill", str(nb), str(tmp_path / "out.ipynb"), "-k", "python3",
                          *[a for p in params for a in ("-p", *p.split("=", 1))]],
                         capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("figures/table2.pdf", "figures/table2.png", "tables/table2.csv", "tables/table2.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    import pandas as pd

    t = pd.read_csv(tmp_path / "tables" / "table2.csv")
    assert list(t["series"].unique()) == ["paper", "derived (swe-mini, tau2; deepseek)"]
    paper = t[t["series"] == "paper"].set_index("set")
    assert paper.loc["swe-heldout", "turns"] == 893 and paper.loc["tau2-dev", "output_tokens"] == 32931
    derived = t[t["series"] != "paper"].set_index("set")
    assert derived.loc["swe-screening", "turns"] == 60 and derived.loc["tau2-heldout", "sessions"] == 60


def test_sessions_rules_in_the_dag():
    exe = Path(sys.executable).parent / "snakemake"
    env = {**os.environ, "PATH": f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(exe), "-n", "--quiet", "rules", "--cores", "1", "--forceall", "figures/table2.pdf",
                           "results/sessions/tau2-few.jsonl"], cwd=REPO, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rule in ("get_traces", "split_sessions", "build_sessions", "render_table2"):
        assert rule in proc.stdout, rule


# --- `sessions get`: download into a cache (GitHub archive or a rows file), file:// and a local http server ----

SWE_COMMIT = "d12a71affd95403b036b2bdbd827349b77bfffb9"
TAU2_COMMIT = "a2c024725189473d2d7cea3a5cfdbcc67478e41f"
SWE_TRAJS = "swebench_results/20251118_gemini-3-pro-74pct/trajs"


def github_tar(path: Path, top: str, files: dict[str, bytes]) -> str:
    """Write a `.tar.gz` in the GitHub archive layout (`<top>/<path>`); return its sha256."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        dirs = {str(Path(top, rel).parent) for rel in files} | {top}
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def swe_archive(tmp_path: Path) -> tuple[Path, str]:
    """The two swe-mini fixtures at their upstream paths, plus files the download must not extract."""
    files = {f"{SWE_TRAJS}/{p.name.removesuffix('.traj.json')}/{p.name}": p.read_bytes()
             for p in sorted((SWE_MINI).glob("*.traj.json"))}
    files["README.md"] = b"# mini-swe-agent\n"
    files["swebench_results/other-run/trajs/x/x.traj.json"] = b"{}"
    files[f"{SWE_TRAJS}/demo__demo-1/demo__demo-1.log"] = b"log"
    path = tmp_path / "serve" / f"{SWE_COMMIT}.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path, github_tar(path, f"mini-swe-agent-{SWE_COMMIT}", files)


def get_args(tmp_path: Path, source: str, *extra: str) -> list[str]:
    """`sessions get` of a source with no mirror, the cache under tmp_path, and no progress bar."""
    return ["sessions", "get", "--source", source, "--mirror", str(tmp_path / "none"), "--cache",
            str(tmp_path / "cache"), "--no-progress", "--out", str(tmp_path / f"{source}.json"), *extra]


def cache_entries(tmp_path: Path) -> list[str]:
    """Everything in the cache root (temp files included), sorted."""
    root = tmp_path / "cache"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.fixture
def http_dir(tmp_path: Path, monkeypatch):
    """Serve tmp_path/serve on 127.0.0.1 from a thread; yields the base URL. `/truncated.tar.gz` is cut short."""
    import functools
    import http.server
    import threading

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            if self.path.endswith("/truncated.tar.gz"):
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(b"\x1f\x8b" + b"x" * 98)
                self.wfile.flush()
                self.close_connection = True
                return
            super().do_GET()

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    (tmp_path / "serve").mkdir(exist_ok=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path / "serve")))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_glob_members_and_cache_names():
    from ostinato.sessions.download import flat_name, glob_match

    assert glob_match(f"{SWE_TRAJS}/a/a.traj.json", f"{SWE_TRAJS}/*/*.traj.json")
    assert not glob_match(f"{SWE_TRAJS}/a/b/a.traj.json", f"{SWE_TRAJS}/*/*.traj.json")  # `*` stays in a folder
    assert glob_match("data/simulations/x/y.json", "data/**/*.json") and glob_match("data/y.json", "data/**/*.json")
    sub = "web/leaderboard/public/submissions/*/trajectories/*.json"
    assert flat_name("web/leaderboard/public/submissions/s1/trajectories/t.json", sub) == "s1__t.json"
    assert flat_name("data/simulations/x.json", "data/simulations/*.json") == "data__simulations__x.json"


def test_download_github_archive_by_file_url_extracts_trace_paths_and_builds(tmp_path: Path, capsys):
    archive, sha = swe_archive(tmp_path)
    assert cli_main(get_args(tmp_path, "swe-mini", "--download-url", archive.as_uri(), "--sha256", sha)) == 0
    got = json.loads((tmp_path / "swe-mini.json").read_text())
    folder = tmp_path / "cache" / "swe-mini"
    assert got["mode"] == "download" and got["url"] == archive.as_uri() and got["sha256"] == sha
    assert got["path"] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["alpha__alpha-7.traj.json", "demo__demo-1.traj.json"]
    assert cache_entries(tmp_path) == ["swe-mini", "swe-mini.download.json"]  # no temp file left
    err = capsys.readouterr().err
    assert f"url {archive.as_uri()} sha256 {sha} cache {folder}" in err
    out, ref = tmp_path / "d.jsonl", tmp_path / "m.jsonl"
    assert cli_main(["sessions", "build", "--source", "swe-mini", "--traces", str(tmp_path / "swe-mini.json"),
                     "--no-progress", "--out", str(out)]) == 0
    assert cli_main(["sessions", "build", "--source", "swe-mini", "--mirror", str(FIXTURES), "--no-progress",
                     "--out", str(ref)]) == 0
    assert out.read_text() == ref.read_text()


def test_download_over_http_then_reuse_the_cache(tmp_path: Path, http_dir: str, capsys):
    tau2 = sorted((FIXTURES / "tau2").glob("*.json"))
    files = {f"web/leaderboard/public/submissions/sub1/trajectories/{tau2[0].name}": tau2[0].read_bytes(),
             f"data/simulations/{tau2[1].name}": tau2[1].read_bytes(), "data/tasks.json": b"[]"}
    sha = github_tar(tmp_path / "serve" / "tau2.tar.gz", f"tau2-bench-{TAU2_COMMIT}", files)
    url = f"{http_dir}/tau2.tar.gz"
    assert cli_main(get_args(tmp_path, "tau2", "--download-url", url)) == 0
    got = json.loads((tmp_path / "tau2.json").read_text())
    assert got["mode"] == "download" and got["sha256"] == sha and got["note"].startswith("downloaded")
    assert sorted(p.name for p in (tmp_path / "cache" / "tau2").iterdir()) == [
        f"data__simulations__{tau2[1].name}", f"sub1__{tau2[0].name}"]
    assert len(list(iter_source("tau2", tmp_path / "cache"))) == len(list(iter_source("tau2", FIXTURES)))
    (tmp_path / "serve" / "tau2.tar.gz").unlink()  # a rerun must not download again
    assert cli_main(get_args(tmp_path, "tau2", "--download-url", url, "--sha256", sha)) == 0
    again = json.loads((tmp_path / "tau2.json").read_text())
    assert again["note"].startswith("reused") and again["path"] == got["path"]
    assert cli_main(get_args(tmp_path, "tau2", "--download-url", url, "--no-probe")) == 0  # offline: cache still used
    assert json.loads((tmp_path / "tau2.json").read_text())["mode"] == "download"


def test_bad_sha256_fails_and_leaves_nothing(tmp_path: Path, capsys):
    archive, _ = swe_archive(tmp_path)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / ".swe-mini.killed.tmp").mkdir()  # left by a killed run: removed
    table = tmp_path / "swe-mini.turns.csv"
    table.write_text("session,turn,kind,domain,task,new_byte,output_byte,output_recorded\n")
    rc = cli_main(get_args(tmp_path, "swe-mini", "--download-url", archive.as_uri(), "--sha256", "0" * 64,
                           "--table", str(table)))
    assert rc == 2  # a wrong checksum stops the run, even with a table at hand
    err = capsys.readouterr().err
    assert "source swe-mini" in err and "sha256" in err and "0" * 64 in err
    assert cache_entries(tmp_path) == [] and not (tmp_path / "swe-mini.json").exists()
    assert cli_main(get_args(tmp_path, "swe-mini", "--sha256", "abc")) == 2  # not 64 hex digits


def test_cut_download_leaves_nothing_then_tables_or_a_clear_error(tmp_path: Path, http_dir: str, capsys):
    url = f"{http_dir}/truncated.tar.gz"
    table = tmp_path / "swe-mini.turns.csv"
    table.write_text("session,turn,kind,domain,task,new_byte,output_byte,output_recorded\n")
    assert cli_main(get_args(tmp_path, "swe-mini", "--download-url", url, "--table", str(table))) == 0
    got = json.loads((tmp_path / "swe-mini.json").read_text())
    assert got["mode"] == "tables" and "download failed" in got["note"] and url in got["note"]
    assert cache_entries(tmp_path) == []
    assert cli_main(get_args(tmp_path, "swe-mini", "--download-url", f"{http_dir}/missing.tar.gz")) == 2
    err = capsys.readouterr().err
    assert "source swe-mini" in err and "HTTP 404" in err and f"{http_dir}/missing.tar.gz" in err
    assert "sessions.mirror" in err and cache_entries(tmp_path) == []


def test_archive_without_trace_paths_is_a_failed_download(tmp_path: Path, capsys):
    path = tmp_path / "serve" / "x.tar.gz"
    path.parent.mkdir()
    github_tar(path, f"mini-swe-agent-{SWE_COMMIT}", {"README.md": b"x"})
    assert cli_main(get_args(tmp_path, "swe-mini", "--download-url", path.as_uri())) == 2
    err = capsys.readouterr().err
    assert "no file matches swebench_results/" in err and "sessions.mirror" in err
    path.write_bytes(b"not a tar")
    assert cli_main(get_args(tmp_path, "swe-mini", "--download-url", path.as_uri())) == 2
    assert "not a readable .tar.gz" in capsys.readouterr().err and cache_entries(tmp_path) == []


def test_swe_rebench_rows_file_download(tmp_path: Path):
    sha = hashlib.sha256(REBENCH.read_bytes()).hexdigest()
    assert cli_main(get_args(tmp_path, "swe-rebench", "--download-url", REBENCH.as_uri(), "--sha256", sha)) == 0
    got = json.loads((tmp_path / "swe-rebench.json").read_text())
    assert got["mode"] == "download" and got["sha256"] == sha
    assert (tmp_path / "cache" / "swe-rebench" / "rows.jsonl").read_bytes() == REBENCH.read_bytes()
    ids = [s.session_id for s in iter_source("swe-rebench", Path(got["path"]))]
    assert ids == [s.session_id for s in iter_source("swe-rebench", FIXTURES)]


def test_fallback_order_mirror_cache_download_tables(tmp_path: Path, monkeypatch):
    from ostinato.sessions import sources

    archive, sha = swe_archive(tmp_path)
    table = tmp_path / "t.csv"
    table.write_text("session,turn,kind,domain,task,new_byte,output_byte,output_recorded\n")
    on = sources.Download(allowed=True, cache=tmp_path / "cache", url=archive.as_uri(), progress=False)
    # a mirror wins over everything (the download is never tried)
    assert sources.resolve_source("swe-mini", FIXTURES, None, table, download=on).mode == "mirror"
    assert cache_entries(tmp_path) == []
    # no network at all: the table, the download untried
    assert sources.resolve_source("swe-mini", tmp_path / "none", None, table, probe=False, download=on).mode == "tables"
    # downloads off: probed only, then the table, with the probe's answer in the note
    monkeypatch.setattr(sources, "probe_url", lambda url, timeout_s=5.0: None)
    off = sources.Download(allowed=False, cache=tmp_path / "cache", url=archive.as_uri(), progress=False)
    got = sources.resolve_source("swe-mini", tmp_path / "none", None, table, download=off)
    assert got.mode == "tables" and "downloads are off" in got.note
    # allowed: the download beats the table; later, the complete cache is used even offline and with downloads off
    assert sources.resolve_source("swe-mini", None, None, table, download=on).mode == "download"
    reused = sources.resolve_source("swe-mini", None, None, table, probe=False, download=off)
    assert reused.mode == "download" and reused.sha256 == sha and "reused" in reused.note
    # another URL is another download: not the cache of the first
    other = sources.Download(allowed=False, cache=tmp_path / "cache", url="file:///nowhere.tar.gz", progress=False)
    assert sources.resolve_source("swe-mini", None, None, table, probe=False, download=other).mode == "tables"


def test_no_download_url_and_unreachable_source_error(tmp_path: Path, monkeypatch):
    from ostinato.sessions import sources

    monkeypatch.setattr(sources, "probe_url", lambda url, timeout_s=5.0: "ConnectError: no network")
    on = sources.Download(allowed=True, cache=tmp_path / "cache", progress=False)
    with pytest.raises(FileNotFoundError) as err:
        sources.resolve_source("swe-rebench", tmp_path / "none", None, None, download=on)
    msg = str(err.value)
    assert msg.startswith("source swe-rebench:") and "ConnectError: no network" in msg
    assert "sessions.download_urls.swe-rebench" in msg and "sessions.mirror" in msg
    info = sources.source_info("swe-mini")
    assert info.download_url() == f"https://codeload.github.com/gruckion/mini-swe-agent/tar.gz/{SWE_COMMIT}"
    assert sources.source_info("tau2").download_url().endswith(f"/sierra-research/tau2-bench/tar.gz/{TAU2_COMMIT}")
