"""Readers of public agent traces (mini-swe-agent `.traj.json`, tau2-bench simulations) into sessions.

Each reader checks its format (tau2: `tau2.schema.json`; roles: each format's own) and refuses another agent
format by name (`ostinato.sessions.formats`); errors name the file and the session.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ostinato.errors import InputError
from ostinato.inputs import load_json
from ostinato.schemas import first_error
from ostinato.sessions import formats
from ostinato.sessions.model import Message, Request, RequestKind, Session

SOURCES: tuple[str, ...] = ("swe-mini", "tau2", "swe-rebench")
TAU2_DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")


def _text(value: object) -> str:
    """Return message content as text (None → "", non-strings as JSON)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def split_requests(messages: list[Message], kind_after: Callable[[Message], RequestKind]) -> tuple[Request, ...]:
    """Cut a conversation into agent requests: each assistant message answering new user/tool input.

    Assistant messages with no new user/tool input before them (a scripted greeting) stay in the
    context of the next request; messages after the last assistant message are not a request and are dropped.
    """
    requests: list[Request] = []
    pending: list[Message] = []
    for msg in messages:
        answers_input = any(m.role not in ("assistant", "system") for m in pending)
        if msg.role == "assistant" and answers_input:
            last_input = next(m for m in reversed(pending) if m.role != "assistant")
            kind: RequestKind = "first" if not requests else kind_after(last_input)
            requests.append(Request(kind=kind, new_messages=tuple(pending), output=msg))
            pending = []
        else:
            pending.append(msg)
    return tuple(requests)


# --- mini-swe-agent -------------------------------------------------------------------------------

class TraceError(InputError):
    """A trace file that does not have the expected shape; the message names the file and the session."""


def malformed(path: Path, session_id: str | None, what: str) -> TraceError:
    """Return the error of a malformed trace, naming the file and (when known) the session."""
    where = f"{path}: session {session_id}" if session_id else str(path)
    return TraceError(f"{where}: {what}")


def _int_or_none(value: object) -> int | None:
    """A recorded token count as int (None when absent or not a non-negative number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def check_messages(raw: object, path: Path, session_id: str, roles: tuple[str, ...]) -> list[dict]:
    """Return a trace's message list, or raise naming the file and session when it is not one, or when a role is
    not one of the format's `roles`."""
    if not isinstance(raw, list):
        raise malformed(path, session_id, "expected a list of messages")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise malformed(path, session_id, f"message {i} is not an object with a string 'role'")
        if m["role"] not in roles:
            raise malformed(path, session_id, f"message {i}: role {m['role']!r} is not one of {', '.join(roles)}")
    return raw


def load_trace(path: Path, session_id: str | None, what: str) -> object:
    """The JSON document of a trace file (a regular file, strict JSON), or a TraceError naming file and session."""
    try:
        return load_json(path, what)
    except InputError as exc:
        raise malformed(path, session_id, str(exc).removeprefix(f"{path}: ")) from None


def _swe_mini_completion_tokens(msg: dict) -> int | None:
    """mini-swe-agent's recorded completion tokens: `extra.response.usage.completion_tokens`."""
    extra = msg.get("extra")
    response = extra.get("response") if isinstance(extra, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    return _int_or_none(usage.get("completion_tokens")) if isinstance(usage, dict) else None


SWE_MINI_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


def read_swe_mini(path: Path) -> Session:
    """Read one mini-swe-agent `.traj.json`; every user message after the task is a tool observation."""
    path = Path(path)
    name = path.name.removesuffix(".traj.json")
    sid = f"swe-mini/{name}"
    data = load_trace(path, sid, "a mini-swe-agent trajectory")
    other = formats.other_format(path, data, formats.MINI_SWE_AGENT)
    if other is not None:
        raise TraceError(other)
    if not isinstance(data, dict) or "messages" not in data:
        raise malformed(path, sid, f"not a mini-swe-agent trajectory (no 'messages'); {formats.READ}")
    raw = check_messages(data["messages"], path, sid, SWE_MINI_ROLES)
    messages = [
        Message(role=m["role"], content=_text(m.get("content")),
                completion_tokens=_swe_mini_completion_tokens(m) if m["role"] == "assistant" else None)
        for m in raw
    ]
    requests = split_requests(messages, kind_after=lambda m: "tool" if m.role in ("user", "tool") else "user")
    return Session(session_id=sid, source="swe-mini", requests=requests, meta={"file": path.name})


def iter_swe_mini(mirror: Path) -> Iterator[Session]:
    """Yield the sessions of a swe-mini mirror directory, sorted by file name."""
    files = sorted(Path(mirror).rglob("*.traj.json"), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no *.traj.json files under {mirror} (expected a swe-mini mirror)")
    for f in files:
        yield read_swe_mini(f)


# --- tau2-bench -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tau2File:
    """The simulations of one tau2-bench results file, with its domain and agent policy if known."""

    path: Path
    domain: str | None
    policy: str | None
    simulations: list[dict]


def _get(d: object, *keys: str) -> object:
    """d[k0][k1]... through objects only (None where a level is missing or not an object)."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def _tau2_domain(path: Path, data: object) -> str | None:
    """Return the tau2 domain of a results file from its info, its fields or its file name."""
    for value in (_get(data, "info", "environment_info", "domain_name"), _get(data, "domain"),
                  _get(data, "task", "user_scenario", "instructions", "domain")):
        if isinstance(value, str) and value:
            return value
    found = [d for d in TAU2_DOMAINS if d in path.name.lower()]
    return found[0] if len(found) == 1 else None


TAU2_SCHEMA = "tau2.schema.json"


def load_tau2_file(path: Path) -> Tau2File:
    """Load a tau2 results file of any of the three shapes (dict with simulations, list, single run); every
    simulation must be one (`tau2.schema.json`), and another agent format is refused by name."""
    path = Path(path)
    data = load_trace(path, None, "tau2-bench simulations")
    other = formats.other_format(path, data, formats.TAU2)
    if other is not None:
        raise TraceError(other)
    if isinstance(data, list):
        sims = data
    elif isinstance(data, dict) and "simulations" in data:
        sims = data["simulations"]
    elif isinstance(data, dict) and "simulation_run" in data:
        sims = [data["simulation_run"]]
    else:
        raise malformed(path, None, f"expected tau2 'simulations', a list of simulations or 'simulation_run'; "
                                    f"{formats.READ}")
    if not isinstance(sims, list):
        raise malformed(path, None, "tau2 'simulations' is not a list")
    for idx, sim in enumerate(sims):
        err = first_error("ostinato.sessions", TAU2_SCHEMA, sim)
        if err is not None:
            raise malformed(path, f"tau2/{path.stem}/{idx:03d}", f"not a tau2-bench simulation ({err})")
    policy = None
    if isinstance(data, dict):
        info = data.get("info")
        env = info.get("environment_info") if isinstance(info, dict) else None
        policy = env.get("policy") if isinstance(env, dict) and isinstance(env.get("policy"), str) else None
    return Tau2File(path=path, domain=_tau2_domain(path, data), policy=policy, simulations=list(sims))


def _tau2_agent_messages(raw: list[dict]) -> list[Message]:
    """Keep what the agent sees: drop the user simulator's own tool calls and their results."""
    out = []
    for m in raw:
        role = str(m.get("role"))
        if role == "tool" and m.get("requestor") == "user":
            continue
        if role == "user" and m.get("tool_calls") and not m.get("content"):
            continue
        calls = tuple(
            {"name": c.get("name"), "arguments": c.get("arguments")} for c in (m.get("tool_calls") or [])
        ) if role == "assistant" else ()
        usage = m.get("usage") if role == "assistant" else None
        recorded = _int_or_none(usage.get("completion_tokens")) if isinstance(usage, dict) else None
        out.append(Message(role=role, content=_text(m.get("content")), tool_calls=calls, completion_tokens=recorded))
    return out


def tau2_sessions(tf: Tau2File, policy: str | None = None) -> list[Session]:
    """Return the sessions of one tau2 file (`load_tau2_file`); the agent policy (system prompt) opens each."""
    system = tf.policy or policy
    sessions = []
    for idx, sim in enumerate(tf.simulations):
        sid = f"tau2/{tf.path.stem}/{idx:03d}"
        raw = sim["messages"]  # checked by load_tau2_file
        messages = _tau2_agent_messages(raw)
        if system:
            messages = [Message(role="system", content=system), *messages]
        requests = split_requests(messages, kind_after=lambda m: "tool" if m.role == "tool" else "user")
        meta = {"file": tf.path.name, "domain": tf.domain or "", "task_id": str(sim.get("task_id", ""))}
        sessions.append(Session(session_id=sid, source="tau2", requests=requests, meta=meta))
    return sessions


def iter_tau2(mirror: Path) -> Iterator[Session]:
    """Yield the sessions of a tau2 mirror directory, sorted by file name then simulation index.

    Files without the agent policy borrow it from another file of the same domain in the mirror.
    """
    files = sorted(Path(mirror).glob("*.json"), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no *.json files under {mirror} (expected a tau2 mirror)")
    policies: dict[str, str] | None = None
    for f in files:
        tf = load_tau2_file(f)
        borrowed = None
        if tf.policy is None and tf.domain is not None:
            if policies is None:
                policies = _domain_policies(files)
            borrowed = policies.get(tf.domain)
        yield from tau2_sessions(tf, policy=borrowed)


def _domain_policies(files: list[Path]) -> dict[str, str]:
    """Return the first agent policy found per domain among the given tau2 files."""
    out: dict[str, str] = {}
    for f in files:
        tf = load_tau2_file(f)
        if tf.domain and tf.policy and tf.domain not in out:
            out[tf.domain] = tf.policy
    return out


# --- dispatch -------------------------------------------------------------------------------------

def iter_source(source: str, mirror: Path) -> Iterator[Session]:
    """Yield the sessions of a named source from its mirror directory, sorted by session id."""
    mirror = Path(mirror)
    if source not in SOURCES:
        raise ValueError(f"--source {source!r} is not one of {SOURCES}")
    if not mirror.exists():
        raise FileNotFoundError(f"trace mirror directory {mirror} does not exist (expected the {source} traces)")
    # a mirror root holds one folder per source (tau2/, swe-mini/, swe-rebench/); a source's own folder works too
    if (mirror / source).is_dir():
        mirror = mirror / source
    if source == "swe-rebench":
        from ostinato.sessions.rebench import iter_swe_rebench  # one module per format

        return iter_swe_rebench(mirror)
    if not mirror.is_dir():
        raise FileNotFoundError(f"trace mirror {mirror} is not a directory (expected the {source} traces)")
    return iter_swe_mini(mirror) if source == "swe-mini" else iter_tau2(mirror)


def safe_name(session_id: str) -> str:
    """Return a file-name-safe form of a session id (used for per-session result files)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "__", session_id)
