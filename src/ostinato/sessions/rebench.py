"""Reader of the chat schema of `nebius/SWE-rebench-openhands-trajectories` (the paper's SWE sessions).

Rows (HF dataset rows) each hold a `trajectory`: messages with `role` (system | user | assistant | tool),
`content` (text, or a list of `{type: text, text}` parts), `name`, `tool_call_id` and, on assistant
messages, OpenAI-style `tool_calls` (`{id, type, function: {name, arguments}}`). Files: `.jsonl` (one row
per line), `.json` (a list of rows, `{"rows": [...]}`, or the datasets-server shape `{"rows": [{"row": …}]}`).
Parquet needs pyarrow, which the artifact does not pin: convert with `datasets` elsewhere (`to_json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from ostinato.errors import InputError
from ostinato.inputs import parse_json, read_text
from ostinato.sessions import formats
from ostinato.sessions.model import Message, Session
from ostinato.sessions.readers import TraceError, _text, check_messages, malformed, split_requests

SOURCE = "swe-rebench"
SUFFIXES: tuple[str, ...] = (".jsonl", ".json")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


def _content_text(value: object) -> str:
    """Message content as text: strings as is, lists of text parts joined, anything else as JSON."""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text", "")) for p in value if p.get("type", "text") == "text")
    return _text(value)


def _tool_call(call: object, path: Path, sid: str, index: int) -> dict:
    """One OpenAI tool call as {name, arguments} (arguments parsed from their JSON string when possible)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise malformed(path, sid, f"message {index}: tool call without function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            pass  # keep the recorded string
    return {"name": fn["name"], "arguments": args}


def _messages(raw: list[dict], path: Path, sid: str) -> list[Message]:
    """Turn trajectory entries into messages (assistant tool calls as {name, arguments})."""
    out = []
    for i, m in enumerate(raw):
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise malformed(path, sid, f"message {i}: 'tool_calls' is not a list")
        role = m["role"]
        tool_calls = tuple(_tool_call(c, path, sid, i) for c in calls) if role == "assistant" else ()
        out.append(Message(role=role, content=_content_text(m.get("content")), tool_calls=tool_calls))
    return out


def _row_id(row: dict, index: int) -> str:
    """A stable session id of a row: its trajectory id, else instance id plus row index."""
    for key in ("trajectory_id", "id"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    if row.get("instance_id") not in (None, ""):
        return f"{row['instance_id']}/{index:05d}"
    return f"row{index:05d}"


def rebench_session(row: object, path: Path, index: int) -> Session:
    """Return the session of one dataset row; malformed rows raise naming file and session."""
    if isinstance(row, dict) and isinstance(row.get("row"), dict):  # datasets-server rows
        row = row["row"]
    if not isinstance(row, dict):
        raise malformed(path, f"{SOURCE}/row{index:05d}", "row is not an object")
    other = formats.other_format(f"{path}: row {index}", row, formats.SWE_REBENCH)
    if other is not None:
        raise TraceError(other)
    sid = f"{SOURCE}/{_row_id(row, index)}"
    raw = row.get("trajectory")
    if isinstance(raw, str):  # some exports keep the list as a JSON string
        try:
            raw = parse_json(raw, "'trajectory'", "a JSON list of messages")
        except InputError as exc:
            raise malformed(path, sid, f"a string but not JSON: {exc}") from None
    raw = check_messages(raw, path, sid, ROLES)
    requests = split_requests(_messages(raw, path, sid),
                              kind_after=lambda m: "user" if m.role == "user" else "tool")
    meta = {"file": path.name, "instance_id": str(row.get("instance_id", ""))}
    if "resolved" in row:
        meta["resolved"] = row["resolved"]
    return Session(session_id=sid, source=SOURCE, requests=requests, meta=meta)


def _rows(path: Path) -> list[object]:
    """The rows of one file (JSON lines, or a JSON list / {rows: [...]})."""
    if path.suffix == ".parquet":
        raise malformed(path, None, "parquet is not read here (no pyarrow); export the rows as JSON lines")
    try:
        text = read_text(path, "SWE-rebench rows")
        if path.suffix == ".jsonl":
            return [parse_json(line, f"{path}:{i}", "one row per line")
                    for i, line in enumerate(text.splitlines(), 1) if line.strip()]
        data = parse_json(text, str(path), "SWE-rebench rows")
    except InputError as exc:
        raise TraceError(str(exc)) from None
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return data["rows"]
    if isinstance(data, dict) and "trajectory" in data:
        return [data]
    if not isinstance(data, list):
        other = formats.other_format(path, data, formats.SWE_REBENCH)
        if other is not None:
            raise TraceError(other)
        raise malformed(path, None, f"expected a list of rows with 'trajectory' (or {{'rows': [...]}}); {formats.READ}")
    return data


def read_swe_rebench(path: Path) -> list[Session]:
    """Return the sessions of one SWE-rebench rows file, in row order."""
    path = Path(path)
    return [rebench_session(row, path, i) for i, row in enumerate(_rows(path))]


def iter_swe_rebench(mirror: Path) -> Iterator[Session]:
    """Yield the sessions of a file or a directory of SWE-rebench rows files, sorted by session id."""
    mirror = Path(mirror)
    files = [mirror] if mirror.is_file() else sorted(
        p for p in mirror.rglob("*") if p.suffix in SUFFIXES + (".parquet",) and p.is_file())
    if not files:
        raise FileNotFoundError(f"no *.jsonl / *.json rows under {mirror} (expected a {SOURCE} mirror)")
    sessions = [s for f in files for s in read_swe_rebench(f)]
    seen: set[str] = set()
    for s in sessions:
        if s.session_id in seen:
            raise malformed(Path(s.meta["file"]), s.session_id, "duplicate session id")
        seen.add(s.session_id)
    yield from sorted(sessions, key=lambda s: s.session_id)
